// Declarations shared by the op core's twins (core.h): one operand's inputs and row map, the
// direct callers' dtype checks, the accumulation dtype and the CPU GEMMs' aligned row length.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

namespace galerkin_ext {

// One input of the attention and how it becomes its prepared operand: row (b, h, n) is
// s · [pos | LN_h(x)], s · [pos | x] or s · softmax([pos | x]), s the quadrature weight of a
// weighted operand (1/N where none is given), else 1.
struct OperandSpec {
  const at::Tensor& x;                         // (B, H, N, D), any strides
  const std::optional<at::Tensor>& pos;        // (B, N, P) or (N, P), contiguous
  const std::optional<at::Tensor>& weight;     // (B, N) or (N,), contiguous; None = uniform 1/N
  bool weighted;                               // scale rows by the quadrature weight
  const std::optional<at::Tensor>& norm_weight;  // (H, D) contiguous, or None for no norm
  const std::optional<at::Tensor>& norm_bias;    // (H, D) contiguous, present with norm_weight
  bool softmax = false;  // the row map is a softmax over [pos | x] instead of [pos | LN(x)]
};

// For direct callers of the ops (memory safety; ops.py gives friendlier messages first): t on
// like's device with like's dtype.
inline void check_same(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.device() == like.device(), name, ": expected device ", like.device(), ", got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, ": expected dtype ",
              like.scalar_type(), ", got ", t.scalar_type());
}

// Dtype of statistics and accumulators: double for double inputs, float for the rest.
inline at::ScalarType opmath_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Row length of the CPU twins' chunk buffers: d rounded up to a multiple of 8 elements when that
// wastes at most d/8, so the GEMMs get aligned rows (with MKL on 2 cores the N×d·d×d products
// took 6.7 ms at d = 97 against 5.0 ms at d = 104). The zero padding changes no result.
inline int64_t padded_width(int64_t d) {
  const int64_t up = (d + 7) / 8 * 8;
  return (up - d) * 8 <= d ? up : d;
}

}  // namespace galerkin_ext
