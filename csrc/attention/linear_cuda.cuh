// Raw-pointer interface of the fused CUDA linear path (linear_cuda.cu); the ATen glue is
// linear_cuda.cpp. With S = K̂wᵀ V̂ and A = scale · S ∘ M (attention.h):
//   forward:  reduce (K̂w, V̂) -> partials;  finalize -> A;  apply: out = Q̂ A
//   backward: reduce (Q̂, G) -> partials;  finalize -> dS = scale · (dA + grad_attn) ∘ M;
//             apply_backward three times: q from G Aᵀ, k from V̂ dSᵀ, v from K̂w dS.
// The prepared operands are formed row by row in registers and shared memory and never written
// to device memory. Every sum has a fixed order (split partials summed by finalize, per-row and
// per-block gradients summed by the caller), so results are bitwise reproducible.
// A matrix operand is always (B·H, d, d) contiguous in the accumulation type.
#pragma once

#include "attention/limits.h"
#include "attention/prepare_cuda.cuh"

namespace galerkin_ext::cuda {

// Number of (d, d) partial products reduce_outer writes per (b, h): split points × thread groups.
int64_t reduce_slices(int64_t B, int64_t H, int64_t N, int64_t d);

// partial (reduce_slices, B·H, d, d) = per-slice Σ_n left_n ⊗ right_n over the prepared rows of
// the two operands (same B, H, N; the same P + D = d).
cudaError_t reduce_outer(const PrepareArgs& left, const PrepareArgs& right, double eps,
                         void* partial, cudaStream_t stream);

// matrix (B·H·d·d) = scale · (Σ_slices partial + add) ∘ mask, also written in the element type
// to matrix_t when given. add and mask (element type, (B, H, d, d) contiguous) may be null.
cudaError_t finalize(ScalarKind kind, const void* partial, int64_t slices, int64_t count,
                     const void* add, const void* mask, double scale, void* matrix,
                     void* matrix_t, cudaStream_t stream);

// out (B, H, N, d) contiguous = the prepared rows of q times matrix (or its transpose).
cudaError_t apply_forward(const PrepareArgs& q, double eps, const void* matrix, bool transpose,
                          void* out, cudaStream_t stream);

// Blocks of rows per (b, h) in apply_backward: the leading size of its norm partials.
int64_t apply_row_blocks(int64_t B, int64_t H, int64_t N);

struct ApplyGrads {
  void* grad_x;        // (B, H, N, D) contiguous, element type: written
  void* pos_rows;      // (B, H, N, P): the coordinate gradient of each row, or null
  void* weight_rows;   // (B, H, N): the weight gradient of each row (target weighted), or null
  void* norm_partial;  // (apply_row_blocks, B, H, 2, D): per-block sums; null without a norm
};

// The gradient w.r.t. target's prepared rows is Y = (prepared rows of source) · matrix (or its
// transpose); it is turned into the gradients of target's x, pos, weight and norm parameters.
cudaError_t apply_backward(const PrepareArgs& source, const PrepareArgs& target, double eps,
                           const void* matrix, bool transpose, const ApplyGrads& grads,
                           cudaStream_t stream);

}  // namespace galerkin_ext::cuda
