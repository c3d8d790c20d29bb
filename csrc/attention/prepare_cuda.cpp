// ATen glue of the CUDA operand preparation: tensors to raw pointers, the device guard, the
// current stream, and workspace from the caching allocator (no host syncs: CUDA-graph safe).
#include "attention/attention.h"
#include "attention/prepare_cuda.cuh"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace galerkin_ext {
namespace {

cuda::ScalarKind kind_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::ScalarKind::Float;
    case at::kDouble: return cuda::ScalarKind::Double;
    case at::kHalf: return cuda::ScalarKind::Half;
    case at::kBFloat16: return cuda::ScalarKind::BFloat16;
    default: TORCH_CHECK(false, "q: expected float16, bfloat16, float32 or float64 on CUDA, got ",
                         t.scalar_type());
  }
}

const void* data_or_null(const std::optional<at::Tensor>& t) {
  return t ? t->const_data_ptr() : nullptr;
}

cuda::PrepareArgs make_args(const OperandSpec& s, const at::Tensor& hat) {
  const at::Tensor& x = s.x;
  const int64_t N = x.size(2), P = s.pos ? s.pos->size(-1) : 0;
  return cuda::PrepareArgs{
      kind_of(x), x.size(0), x.size(1), N, x.size(3), P,
      x.stride(0), x.stride(1), x.stride(2), x.stride(3), x.const_data_ptr(),
      data_or_null(s.pos), s.pos && s.pos->dim() == 3 ? N * P : 0,
      s.weighted ? data_or_null(s.weight) : nullptr, s.weight && s.weight->dim() == 2 ? N : 0,
      s.weighted, data_or_null(s.norm_weight), data_or_null(s.norm_bias), hat.size(-1)};
}

}  // namespace

void prepare_forward_cuda(const OperandSpec& spec, double eps, at::Tensor& hat,
                          at::Tensor& stats) {
  const c10::cuda::CUDAGuard guard(spec.x.device());
  C10_CUDA_CHECK(cuda::prepare_forward(make_args(spec, hat), eps, hat.mutable_data_ptr(),
                                       stats.mutable_data_ptr(),
                                       c10::cuda::getCurrentCUDAStream()));
}

void prepare_backward_cuda(const OperandSpec& spec, at::Tensor& grad_hat,
                           const at::Tensor& stats, OperandGrads& grads) {
  const c10::cuda::CUDAGuard guard(spec.x.device());
  const int64_t B = spec.x.size(0), H = spec.x.size(1), N = spec.x.size(2), D = spec.x.size(3);
  at::Tensor partial;  // per-block sums of the norm-parameter gradients: (blocks, H, 2, D)
  if (spec.norm_weight) {
    partial = at::empty({cuda::backward_blocks(B, N), H, 2, D}, stats.options());
  }
  const cuda::PrepareGrads raw{
      grads.grad_pos_acc ? grads.grad_pos_acc->mutable_data_ptr() : nullptr,
      grads.grad_weight_acc ? grads.grad_weight_acc->mutable_data_ptr() : nullptr,
      partial.defined() ? partial.mutable_data_ptr() : nullptr};
  C10_CUDA_CHECK(cuda::prepare_backward(make_args(spec, grad_hat), grad_hat.mutable_data_ptr(),
                                        stats.const_data_ptr(), raw,
                                        c10::cuda::getCurrentCUDAStream()));
  if (spec.norm_weight) {
    const at::Tensor total = partial.sum(0);  // (H, 2, D), a deterministic reduction
    grads.grad_norm_weight->copy_(total.select(1, 0));
    grads.grad_norm_bias->copy_(total.select(1, 1));
  }
}

}  // namespace galerkin_ext
