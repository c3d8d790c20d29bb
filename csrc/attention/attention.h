// Declarations shared by the op core's twins (core.h): one operand's inputs and row map, the
// direct callers' dtype checks and the accumulation dtype.
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

}  // namespace galerkin_ext
