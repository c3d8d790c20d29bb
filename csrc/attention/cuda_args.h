// Tensors to the raw-pointer arguments of the CUDA op core (core_cuda.cuh), and the reductions
// its ATen glue (kv_reduce_cuda.cpp, q_apply_cuda.cpp) shares. No host syncs: CUDA-graph safe.
#pragma once

#include "attention/core.h"
#include "attention/core_cuda.cuh"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

namespace galerkin_ext {

inline cuda::ScalarKind kind_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::ScalarKind::Float;
    case at::kDouble: return cuda::ScalarKind::Double;
    case at::kHalf: return cuda::ScalarKind::Half;
    case at::kBFloat16: return cuda::ScalarKind::BFloat16;
    default: TORCH_CHECK(false, name, ": expected float16, bfloat16, float32 or float64 on CUDA, "
                         "got ", t.scalar_type());
  }
}

inline const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t ? t->const_data_ptr() : nullptr;
}

inline void* mutable_data_or_null(at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr() : nullptr;
}

// One operand of the core; its name for messages. The kernels' limits are checked here.
inline cuda::RowsArgs rows_args(const OperandSpec& s, bool ones_column, const char* name) {
  const at::Tensor& x = s.x;
  const int64_t N = x.size(2), P = s.pos ? s.pos->size(-1) : 0;
  const cuda::ScalarKind kind = kind_of(x, name);
  const cuda::RowMapKind map = s.softmax       ? cuda::RowMapKind::Softmax
                               : s.norm_weight ? cuda::RowMapKind::LayerNorm
                                               : cuda::RowMapKind::Identity;
  const cuda::RowsArgs args{
      kind, x.size(0), x.size(1), N, x.size(3), P,
      x.stride(0), x.stride(1), x.stride(2), x.stride(3), x.const_data_ptr(),
      data_or_null(s.pos), s.pos && s.pos->dim() == 3 ? N * P : 0,
      s.weighted ? data_or_null(s.weight) : nullptr,
      s.weight ? kind_of(*s.weight, "weight") : kind,
      s.weight && s.weight->dim() == 2 ? N : 0, s.weighted, map,
      data_or_null(s.norm_weight), data_or_null(s.norm_bias),
      s.norm_weight ? kind_of(*s.norm_weight, "norm weight") : kind, ones_column};
  TORCH_CHECK(cuda::rows_fit(args), name, ": the CUDA kernels take rows of width P + D",
              ones_column ? " + 1" : "", " <= ", cuda::kMaxWidth, " with P <= ",
              cuda::kMaxCoordinates, " coordinates and B·H <= ", cuda::kMaxGridY, ", got width ",
              args.width(), ", P = ", P, ", B·H = ", x.size(0) * x.size(1),
              " (ops.py runs larger shapes on the formulas)");
  return args;
}

// A plain (B, H, N, D) tensor of rows: no coordinates, weight or map (gradients, G').
inline cuda::RowsArgs plain_args(const at::Tensor& x) {
  const cuda::ScalarKind kind = kind_of(x, "grad");
  return cuda::RowsArgs{kind, x.size(0), x.size(1), x.size(2), x.size(3), 0,
                        x.stride(0), x.stride(1), x.stride(2), x.stride(3), x.const_data_ptr(),
                        nullptr, 0, nullptr, kind, 0, false, cuda::RowMapKind::Identity,
                        nullptr, nullptr, kind, false};
}

// Σ_n left̂_n ⊗ right̂_n, (B, H, left width, right width) in like's opmath dtype: per-split
// partials, then summed in split order.
inline at::Tensor reduce_sum(const cuda::RowsArgs& left, const cuda::RowsArgs& right,
                             const at::Tensor& like, double eps, cudaStream_t stream) {
  const auto acc = like.options().dtype(opmath_dtype(like));
  const int64_t B = left.B, H = left.H, dl = left.width(), dr = right.width();
  const int64_t slices = cuda::reduce_slices(B, H, left.N, dl, dr);
  const at::Tensor partial = at::empty({slices, B * H, dl, dr}, acc);
  C10_CUDA_CHECK(cuda::reduce_rows(left, right, eps, partial.mutable_data_ptr(), stream));
  at::Tensor sum = at::empty({B, H, dl, dr}, acc);
  C10_CUDA_CHECK(cuda::sum_partials(kind_of(sum, "sum"), partial.const_data_ptr(), slices,
                                    sum.numel(), sum.mutable_data_ptr(), stream));
  return sum;
}

// Per-row gradients (B, H, n, ...) summed to the shape of the input they belong to (over the
// heads, and over the batch too when that input is shared by the batch), in its dtype.
inline at::Tensor sum_rows_to(const at::Tensor& rows, const at::Tensor& like) {
  const at::Tensor per_batch = rows.sum(1);
  return (like.dim() < per_batch.dim() ? per_batch.sum(0) : per_batch).to(like.scalar_type());
}

// The norm parameters' gradients from the per-block partials (blocks, B, H, 2, D), summed in
// block order, in the parameters' dtype.
inline std::pair<at::Tensor, at::Tensor> norm_grads(const at::Tensor& partial,
                                                    const at::Tensor& like) {
  const at::Tensor total = partial.sum(at::IntArrayRef{0, 1});  // (H, 2, D)
  return {total.select(1, 0).to(like.scalar_type()), total.select(1, 1).to(like.scalar_type())};
}

}  // namespace galerkin_ext
