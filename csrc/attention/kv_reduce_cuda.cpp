// kv_reduce on CUDA (core.h), the twin of kv_reduce_cpu.cpp: ATen glue around the kernels of
// core_cuda.cuh. K̂ and V̂ exist only in registers and shared memory.
//   forward:  S = reduce(K̂w, V̂ [| 1])
//   backward: dK̂w = V̂ dSᵀ and dV̂ = K̂w dS (apply_rows_backward), each turned into the
//             gradients of its inputs row by row; per-row and per-block gradients are summed
//             here in a fixed order.
#include "attention/cuda_args.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace galerkin_ext {

at::Tensor kv_reduce_cuda(const KvReduceInputs& in, double eps) {
  const c10::cuda::CUDAGuard guard(in.k.device());
  return reduce_sum(rows_args(in.key(), false, "k"), rows_args(in.value(), in.ones_column, "v"),
                    in.k, eps, c10::cuda::getCurrentCUDAStream());
}

KvReduceGrads kv_reduce_backward_cuda(const KvReduceInputs& in, const at::Tensor& grad_s,
                                      double eps, bool kv_pos_grad, bool weight_grad) {
  const c10::cuda::CUDAGuard guard(in.k.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const cuda::RowsArgs k = rows_args(in.key(), false, "k");
  const cuda::RowsArgs v = rows_args(in.value(), in.ones_column, "v");
  const int64_t B = in.B, H = in.H, M = in.M, P = in.P;
  const int64_t dk = in.key_width(), dv = in.value_width();
  const auto acc = in.k.options().dtype(opmath_dtype(in.k));
  const at::Tensor ds = grad_s.to(acc).contiguous();

  KvReduceGrads grads;
  grads.k = at::empty({B, H, M, in.Dk}, in.k.options());
  grads.v = at::empty({B, H, M, in.Dv}, in.v.options());
  // Every row and block writes its entry of these (the norm partials are zeroed for M = 0).
  at::Tensor pos_rows = kv_pos_grad ? at::empty({2, B, H, M, P}, acc) : at::Tensor();
  at::Tensor weight_rows = weight_grad ? at::empty({B, H, M}, acc) : at::Tensor();
  const int64_t blocks = cuda::apply_row_blocks(B, H, M);
  at::Tensor k_partial, v_partial;
  if (in.k_norm_weight) k_partial = at::zeros({blocks, B, H, 2, in.Dk}, acc);
  if (in.v_norm_weight) v_partial = at::zeros({blocks, B, H, 2, in.Dv}, acc);

  at::Tensor k_pos = kv_pos_grad ? pos_rows[0] : at::Tensor();
  at::Tensor v_pos = kv_pos_grad ? pos_rows[1] : at::Tensor();
  const cuda::MatrixArgs ds_t{ds.const_data_ptr(), dv, dk, dv, /*transpose=*/true};
  C10_CUDA_CHECK(cuda::apply_rows_backward(
      v, k, eps, ds_t, /*skip_grad=*/nullptr,
      {grads.k.mutable_data_ptr(), mutable_data_or_null(k_pos),
       mutable_data_or_null(weight_rows), mutable_data_or_null(k_partial)},
      stream));
  const cuda::MatrixArgs ds_m{ds.const_data_ptr(), dk, P + in.Dv, dv, /*transpose=*/false};
  C10_CUDA_CHECK(cuda::apply_rows_backward(
      k, v, eps, ds_m, /*skip_grad=*/nullptr,
      {grads.v.mutable_data_ptr(), mutable_data_or_null(v_pos), nullptr,
       mutable_data_or_null(v_partial)},
      stream));

  if (kv_pos_grad) grads.kv_pos = sum_rows_to(pos_rows.sum(0), *in.kv_pos);
  if (weight_grad) grads.weight = sum_rows_to(weight_rows, *in.weight);
  if (in.k_norm_weight) {
    std::tie(grads.k_norm_weight, grads.k_norm_bias) = norm_grads(k_partial, *in.k_norm_weight);
  }
  if (in.v_norm_weight) {
    std::tie(grads.v_norm_weight, grads.v_norm_bias) = norm_grads(v_partial, *in.v_norm_weight);
  }
  return grads;
}

}  // namespace galerkin_ext
