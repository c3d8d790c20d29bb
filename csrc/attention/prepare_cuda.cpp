// ATen glue of the CUDA operand preparation: tensors to raw pointers, the device guard, the
// current stream, and workspace from the caching allocator (no host syncs: CUDA-graph safe).
#include "attention/cuda_args.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace galerkin_ext {

void prepare_forward_cuda(const OperandSpec& spec, double eps, at::Tensor& hat,
                          at::Tensor& stats) {
  const c10::cuda::CUDAGuard guard(spec.x.device());
  C10_CUDA_CHECK(cuda::prepare_forward(operand_args(spec, hat.size(-1)), eps,
                                       hat.mutable_data_ptr(), stats.mutable_data_ptr(),
                                       c10::cuda::getCurrentCUDAStream()));
}

void prepare_backward_cuda(const OperandSpec& spec, at::Tensor& grad_hat,
                           const at::Tensor& stats, OperandGrads& grads) {
  const c10::cuda::CUDAGuard guard(spec.x.device());
  const int64_t B = spec.x.size(0), H = spec.x.size(1), N = spec.x.size(2), D = spec.x.size(3);
  const auto acc = stats.options();
  at::Tensor partial;  // per-block sums of the norm-parameter gradients: (blocks, H, 2, D)
  if (spec.norm_weight) partial = at::empty({cuda::backward_blocks(B, N), H, 2, D}, acc);
  const int64_t P = spec.pos ? spec.pos->size(-1) : 0;
  at::Tensor pos_rows, weight_rows;  // per-row gradients, summed below in a fixed order
  if (grads.grad_pos_acc) pos_rows = at::empty({B, H, N, P}, acc);
  if (grads.grad_weight_acc) weight_rows = at::empty({B, H, N}, acc);
  const cuda::PrepareGrads raw{mutable_data_or_null(pos_rows), mutable_data_or_null(weight_rows),
                               mutable_data_or_null(partial)};
  C10_CUDA_CHECK(cuda::prepare_backward(operand_args(spec, grad_hat.size(-1)),
                                        grad_hat.mutable_data_ptr(), stats.const_data_ptr(), raw,
                                        c10::cuda::getCurrentCUDAStream()));
  if (spec.norm_weight) {
    const at::Tensor total = partial.sum(0);  // (H, 2, D)
    grads.grad_norm_weight->copy_(total.select(1, 0));
    grads.grad_norm_bias->copy_(total.select(1, 1));
  }
  if (pos_rows.defined()) grads.grad_pos_acc->add_(sum_rows_to(pos_rows, *spec.pos));
  if (weight_rows.defined()) grads.grad_weight_acc->add_(sum_rows_to(weight_rows, *spec.weight));
}

}  // namespace galerkin_ext
