// Tensors to the raw-pointer arguments of the CUDA kernels (prepare_cuda.cuh, linear_cuda.cuh):
// shared by their ATen glue.
#pragma once

#include "attention/attention.h"
#include "attention/prepare_cuda.cuh"

#include <ATen/ATen.h>

namespace galerkin_ext {

inline cuda::ScalarKind kind_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::ScalarKind::Float;
    case at::kDouble: return cuda::ScalarKind::Double;
    case at::kHalf: return cuda::ScalarKind::Half;
    case at::kBFloat16: return cuda::ScalarKind::BFloat16;
    default: TORCH_CHECK(false, "q: expected float16, bfloat16, float32 or float64 on CUDA, got ",
                         t.scalar_type());
  }
}

inline const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t ? t->const_data_ptr() : nullptr;
}

inline void* mutable_data_or_null(at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr() : nullptr;
}

// One operand of the attention; ld is the row stride of its prepared form where one is written.
inline cuda::PrepareArgs operand_args(const OperandSpec& s, int64_t ld = 0) {
  const at::Tensor& x = s.x;
  const int64_t N = x.size(2), P = s.pos ? s.pos->size(-1) : 0;
  return cuda::PrepareArgs{
      kind_of(x), x.size(0), x.size(1), N, x.size(3), P,
      x.stride(0), x.stride(1), x.stride(2), x.stride(3), x.const_data_ptr(),
      data_or_null(s.pos), s.pos && s.pos->dim() == 3 ? N * P : 0,
      s.weighted ? data_or_null(s.weight) : nullptr, s.weight && s.weight->dim() == 2 ? N : 0,
      s.weighted, data_or_null(s.norm_weight), data_or_null(s.norm_bias), ld};
}

// A plain (B, H, N, d) tensor as an operand: no coordinates, weight or norm.
inline cuda::PrepareArgs plain_args(const at::Tensor& x) {
  return cuda::PrepareArgs{kind_of(x), x.size(0), x.size(1), x.size(2), x.size(3), 0,
                           x.stride(0), x.stride(1), x.stride(2), x.stride(3), x.const_data_ptr(),
                           nullptr, 0, nullptr, 0, false, nullptr, nullptr, 0};
}

// Per-row gradients (B, H, N, ...) summed to the shape of the input they belong to: over the
// heads, and over the batch too when that input is shared by the batch.
inline at::Tensor sum_rows_to(const at::Tensor& rows, const at::Tensor& like) {
  const at::Tensor per_batch = rows.sum(1);
  return like.dim() < per_batch.dim() ? per_batch.sum(0) : per_batch;
}

}  // namespace galerkin_ext
