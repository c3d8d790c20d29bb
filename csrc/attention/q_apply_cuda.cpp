// q_apply on CUDA (core.h), the twin of q_apply_cpu.cpp: ATen glue around the kernels of
// core_cuda.cuh. Q̂ exists only in registers and shared memory.
//   forward:  out = apply(Q̂, S), normalised per block and plus Q̂ with skip in the kernel's
//             epilogue
//   backward: G' = ∂out/∂(Q̂ S) applied to grad_out (normalizer_grad; grad_out itself without
//             normalisers), dS = reduce(Q̂, G'), dQ̂ = G' Sᵀ (+ grad_out with skip) turned into
//             q's gradients row by row
#include "attention/cuda_args.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace galerkin_ext {
namespace {

cuda::MatrixArgs s_matrix(const QApplyInputs& in) {
  TORCH_CHECK(in.W <= cuda::kMaxWidth, "s: the CUDA kernels take at most ", cuda::kMaxWidth,
              " columns, got ", in.W, " (ops.py runs larger shapes on the formulas)");
  return {in.s.const_data_ptr(), in.query_width(), in.W, in.W, /*transpose=*/false};
}

}  // namespace

at::Tensor q_apply_cuda(const QApplyInputs& in, double eps) {
  const c10::cuda::CUDAGuard guard(in.q.device());
  const cuda::RowsArgs q = rows_args(in.query(), false, "q");
  at::Tensor out = at::empty({in.B, in.H, in.N, in.out_width()}, in.q.options());
  C10_CUDA_CHECK(cuda::apply_rows(q, eps, s_matrix(in), in.normalizers, in.skip,
                                  out.mutable_data_ptr(), c10::cuda::getCurrentCUDAStream()));
  return out;
}

QApplyGrads q_apply_backward_cuda(const QApplyInputs& in, const at::Tensor& grad_out, double eps,
                                  bool pos_grad) {
  const c10::cuda::CUDAGuard guard(in.q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cuda::RowsArgs q = rows_args(in.query(), false, "q");
  const cuda::MatrixArgs s = s_matrix(in);
  const int64_t B = in.B, H = in.H, N = in.N;
  const auto acc = in.q.options().dtype(opmath_dtype(in.q));
  const at::Tensor g = grad_out.contiguous();
  at::Tensor g_prime = g;
  if (in.normalizers > 0) {
    g_prime = at::empty({B, H, N, in.W}, acc);
    C10_CUDA_CHECK(cuda::normalizer_grad(q, eps, s, in.normalizers, g.const_data_ptr(),
                                         g_prime.mutable_data_ptr(), stream));
  }
  const cuda::RowsArgs source = plain_args(g_prime);

  QApplyGrads grads;
  grads.s = reduce_sum(q, source, in.q, eps, stream);
  grads.q = at::empty({B, H, N, in.D}, in.q.options());
  at::Tensor pos_rows = pos_grad ? at::empty({B, H, N, in.P}, acc) : at::Tensor();
  at::Tensor partial;  // zeroed for N = 0, when no block writes it
  if (in.q_norm_weight) {
    partial = at::zeros({cuda::apply_row_blocks(B, H, N), B, H, 2, in.D}, acc);
  }
  const cuda::MatrixArgs s_t{s.data, in.W, in.query_width(), in.W, /*transpose=*/true};
  C10_CUDA_CHECK(cuda::apply_rows_backward(
      source, q, eps, s_t, in.skip ? g.const_data_ptr() : nullptr,
      {grads.q.mutable_data_ptr(), mutable_data_or_null(pos_rows), nullptr,
       mutable_data_or_null(partial)},
      stream));
  if (pos_grad) grads.pos = sum_rows_to(pos_rows, *in.pos);
  if (in.q_norm_weight) {
    std::tie(grads.q_norm_weight, grads.q_norm_bias) = norm_grads(partial, *in.q_norm_weight);
  }
  return grads;
}

}  // namespace galerkin_ext
