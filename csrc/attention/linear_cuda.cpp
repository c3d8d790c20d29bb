// ATen glue of the fused CUDA linear path (linear_cuda.cuh): workspace from the caching
// allocator, the current stream, and the fixed-order sums of the per-row and per-block
// gradients. No host syncs: CUDA-graph safe.
#include "attention/cuda_args.h"
#include "attention/linear_cuda.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace galerkin_ext {
namespace {

using at::Tensor;

// scale · (Σ_n left_n ⊗ right_n + add) ∘ mask over the prepared rows, (B·H, d, d) in the
// accumulation type; also in the element type as matrix_t when that is defined.
Tensor outer_sum(const cuda::PrepareArgs& left, const cuda::PrepareArgs& right,
                 const AttentionInputs& in, double eps, const std::optional<Tensor>& add,
                 double scale, Tensor matrix_t, cudaStream_t stream) {
  const int64_t B = in.B, H = in.H, N = in.N, d = in.d;
  const auto acc = in.q.options().dtype(opmath_dtype(in.q));
  const int64_t slices = cuda::reduce_slices(B, H, N, d);
  const Tensor partial = at::empty({slices, B * H, d, d}, acc);
  C10_CUDA_CHECK(cuda::reduce_outer(left, right, eps, partial.mutable_data_ptr(), stream));
  Tensor matrix = at::empty({B * H, d, d}, acc);
  const std::optional<Tensor> add_c = add ? std::optional<Tensor>(add->contiguous()) : add;
  const std::optional<Tensor> mask_c =
      in.dropout_mask ? std::optional<Tensor>(in.dropout_mask->contiguous()) : std::nullopt;
  C10_CUDA_CHECK(cuda::finalize(kind_of(in.q), partial.const_data_ptr(), slices, B * H * d * d,
                                data_or_null(add_c), data_or_null(mask_c), scale,
                                matrix.mutable_data_ptr(), mutable_data_or_null(matrix_t),
                                stream));
  return matrix;
}

}  // namespace

bool linear_cuda_supported(const AttentionInputs& in) {
  return linear_cuda_fits(in.d, in.P);
}

std::tuple<Tensor, Tensor> linear_forward_cuda(const AttentionInputs& in, double eps,
                                               double scale) {
  const c10::cuda::CUDAGuard guard(in.q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t B = in.B, H = in.H, N = in.N, d = in.d;
  Tensor out = at::empty({B, H, N, d}, in.q.options());
  Tensor attn = at::empty({B, H, d, d}, in.q.options());
  const Tensor matrix = outer_sum(operand_args(in.operand(1)), operand_args(in.operand(2)), in,
                                  eps, std::nullopt, scale, attn, stream);
  C10_CUDA_CHECK(cuda::apply_forward(operand_args(in.operand(0)), eps, matrix.const_data_ptr(),
                                     /*transpose=*/false, out.mutable_data_ptr(), stream));
  return {out, attn};
}

std::vector<Tensor> linear_backward_cuda(const AttentionInputs& in, const Tensor& grad_out,
                                         const std::optional<Tensor>& grad_attn,
                                         const Tensor& attn, double eps, double scale,
                                         bool pos_grad, bool weight_grad) {
  const c10::cuda::CUDAGuard guard(in.q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t B = in.B, H = in.H, N = in.N, D = in.D, P = in.P;
  const auto opts = in.q.options();
  const auto acc = opts.dtype(opmath_dtype(in.q));
  std::vector<Tensor> result(11);
  for (int slot = 0; slot < 3; ++slot) result[slot] = at::empty({B, H, N, D}, opts);
  // Every row and block writes its entry of these, so they need no zeroing.
  Tensor pos_rows = pos_grad ? at::empty({3, B, H, N, P}, acc) : Tensor();
  Tensor weight_rows = weight_grad ? at::empty({B, H, N}, acc) : Tensor();
  const int64_t row_blocks = cuda::apply_row_blocks(B, H, N);
  Tensor norm_partial[3];
  for (int slot = 0; slot < 3; ++slot) {
    if (in.norm_weight[slot]) norm_partial[slot] = at::empty({row_blocks, B, H, 2, D}, acc);
  }

  const cuda::PrepareArgs q = operand_args(in.operand(0)), k = operand_args(in.operand(1)),
                          v = operand_args(in.operand(2)), g = plain_args(grad_out);
  // dS = scale · (Q̂ᵀ G + grad_attn) ∘ M: the gradient of the unscaled, undropped K̂wᵀ V̂.
  const Tensor d_s = outer_sum(q, g, in, eps, grad_attn, scale, Tensor(), stream);
  const Tensor a = attn.to(opmath_dtype(in.q)).contiguous();
  auto backward = [&](int slot, const cuda::PrepareArgs& source, const cuda::PrepareArgs& target,
                      const Tensor& matrix, bool transpose, bool with_weight) {
    Tensor pos_slot = pos_grad ? pos_rows[slot] : Tensor();
    Tensor no_weight;
    const cuda::ApplyGrads grads{result[slot].mutable_data_ptr(), mutable_data_or_null(pos_slot),
                                 mutable_data_or_null(with_weight ? weight_rows : no_weight),
                                 mutable_data_or_null(norm_partial[slot])};
    C10_CUDA_CHECK(cuda::apply_backward(source, target, eps, matrix.const_data_ptr(), transpose,
                                        grads, stream));
  };
  backward(0, g, q, a, /*transpose=*/true, false);             // dQ̂ = G Aᵀ
  backward(1, v, k, d_s, /*transpose=*/true, weight_grad);     // dK̂w = V̂ dSᵀ
  backward(2, k, v, d_s, /*transpose=*/false, false);          // dV̂ = K̂w dS

  if (pos_grad) result[3] = sum_rows_to(pos_rows.sum(0), *in.pos).to(in.q.scalar_type());
  if (weight_grad) result[4] = sum_rows_to(weight_rows, *in.weight).to(in.q.scalar_type());
  for (int slot = 0; slot < 3; ++slot) {
    if (!in.norm_weight[slot]) continue;
    const Tensor total = norm_partial[slot].sum(at::IntArrayRef{0, 1});  // (H, 2, D)
    result[5 + 2 * slot] = total.select(1, 0).to(in.q.scalar_type());
    result[6 + 2 * slot] = total.select(1, 1).to(in.q.scalar_type());
  }
  return result;
}

}  // namespace galerkin_ext
