// Softmax-free attention for operator learning: shared declarations and the device dispatch.
//
// Both attention types are one computation on three "prepared operands" of shape (B, H, N, d),
// d = P + D, each one row-wise function of its input:
//     hat(x)[b, h, n, :] = s[b, n] * [ pos[b, n, :] | LN_h(x[b, h, n, :]) ]
// where LN_h is head h's affine layer norm (or the identity when the tensor has no norm) and the
// row scale s is the quadrature weight for the key operand (1 for query and value). Then
//     linear:    out = Q̂ (scale · K̂wᵀ V̂ ∘ M)
//     quadratic: out = (scale · Q̂ K̂wᵀ ∘ M) V̂
// with M the optional dropout mask. Galerkin is "linear" with norms on k, v and scale 1; Fourier
// is either path with norms on q, k and scale 1/sqrt(d).
//
// The products are ATen GEMMs (BLAS on CPU, cuBLAS on CUDA); the operands are never saved for the
// backward, which recomputes them from the inputs. The row-wise preparation and its backward are
// the fused kernels: a CPU twin (prepare_cpu.h/.cpp) and a CUDA twin (prepare_cuda.cu). On the CPU
// the linear path is fused further (linear_cpu.cpp): operands exist only as cache-sized chunks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <tuple>
#include <vector>

namespace galerkin_ext {

// One input of the attention and how it becomes its GEMM operand.
struct OperandSpec {
  const at::Tensor& x;                         // (B, H, N, D), any strides
  const std::optional<at::Tensor>& pos;        // (B, N, P) or (N, P), contiguous
  const std::optional<at::Tensor>& weight;     // (B, N) or (N,), contiguous; None = uniform 1/N
  bool weighted;                               // scale rows by the quadrature weight
  const std::optional<at::Tensor>& norm_weight;  // (H, D) contiguous, or None for no norm
  const std::optional<at::Tensor>& norm_bias;    // (H, D) contiguous, present with norm_weight
  bool softmax = false;  // the row map is a softmax over [pos | x] instead of [pos | LN(x)]
};

// The inputs of one attention call after validation; pos, weight and the norm parameters are
// contiguous, q, k and v keep their strides.
struct AttentionInputs {
  at::Tensor q, k, v;
  std::optional<at::Tensor> pos, weight, dropout_mask;
  std::optional<at::Tensor> norm_weight[3], norm_bias[3];  // of q, k and v
  int64_t B, H, N, D, P, d;                                 // d = P + D

  // Slot 0, 1, 2: the query, the (weighted) key, the value.
  OperandSpec operand(int slot) const {
    return {slot == 0 ? q : slot == 1 ? k : v, pos, weight, slot == 1, norm_weight[slot],
            norm_bias[slot]};
  }
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

// Row length of the prepared operands: d rounded up to a multiple of 8 elements when that wastes
// at most d/8, so the GEMMs get aligned rows (with MKL on 2 cores the N×d·d×d products took
// 6.7 ms at d = 97 against 5.0 ms at d = 104). The zero padding changes no result; ops.py's fake
// kernels mirror this rule.
inline int64_t padded_width(int64_t d) {
  const int64_t up = (d + 7) / 8 * 8;
  return (up - d) * 8 <= d ? up : d;
}

// Gradients produced by the backward of one operand's preparation, besides grad_x.
struct OperandGrads {
  at::Tensor* grad_pos_acc;                  // pos-shaped, opmath dtype, accumulated; or null
  at::Tensor* grad_weight_acc;               // weight-shaped, opmath dtype, accumulated; or null
  at::Tensor* grad_norm_weight;              // (H, D), written when the operand has a norm
  at::Tensor* grad_norm_bias;                // (H, D), written when the operand has a norm
};

// hat (B, H, N, ld) contiguous, ld >= d = P + D, and stats (B, H, N, 2) = (mean, rstd) in the
// opmath dtype are written: columns [d, ld) of hat are zero padding (aligned GEMM operands);
// stats rows mean nothing when the operand has no norm.
void prepare_forward_cpu(const OperandSpec& spec, double eps, at::Tensor& hat, at::Tensor& stats);
// grad_hat (B, H, N, ld) contiguous is the gradient w.r.t. the prepared operand. It is turned into
// grad_x in place: afterwards grad_hat[..., P:] holds the gradient w.r.t. x, so no second
// operand-sized buffer is needed (its first P columns are left as they were).
void prepare_backward_cpu(const OperandSpec& spec, at::Tensor& grad_hat,
                          const at::Tensor& stats, OperandGrads& grads);

#ifdef GALERKIN_EXT_WITH_CUDA
void prepare_forward_cuda(const OperandSpec& spec, double eps, at::Tensor& hat, at::Tensor& stats);
void prepare_backward_cuda(const OperandSpec& spec, at::Tensor& grad_hat,
                           const at::Tensor& stats, OperandGrads& grads);
#endif

// The fused linear path: (out (B, H, N, d), attn (B, H, d, d)), and the gradients in the order
// attention_backward returns them (undefined where absent or not asked for). The CPU twin is
// linear_cpu.cpp; the CUDA twin (linear_cuda.cu, .cpp) takes rows up to a width of 128.
std::tuple<at::Tensor, at::Tensor> linear_forward_cpu(const AttentionInputs& in, double eps,
                                                      double scale);
std::vector<at::Tensor> linear_backward_cpu(const AttentionInputs& in, const at::Tensor& grad_out,
                                            const std::optional<at::Tensor>& grad_attn,
                                            const at::Tensor& attn, double eps, double scale,
                                            bool pos_grad, bool weight_grad);
#ifdef GALERKIN_EXT_WITH_CUDA
bool linear_cuda_supported(const AttentionInputs& in);
std::tuple<at::Tensor, at::Tensor> linear_forward_cuda(const AttentionInputs& in, double eps,
                                                       double scale);
std::vector<at::Tensor> linear_backward_cuda(const AttentionInputs& in,
                                             const at::Tensor& grad_out,
                                             const std::optional<at::Tensor>& grad_attn,
                                             const at::Tensor& attn, double eps, double scale,
                                             bool pos_grad, bool weight_grad);
#endif

inline void prepare_forward(const OperandSpec& spec, double eps, at::Tensor& hat,
                            at::Tensor& stats) {
#ifdef GALERKIN_EXT_WITH_CUDA
  if (spec.x.is_cuda()) return prepare_forward_cuda(spec, eps, hat, stats);
#endif
  prepare_forward_cpu(spec, eps, hat, stats);
}

inline void prepare_backward(const OperandSpec& spec, at::Tensor& grad_hat,
                             const at::Tensor& stats, OperandGrads& grads) {
#ifdef GALERKIN_EXT_WITH_CUDA
  if (spec.x.is_cuda()) return prepare_backward_cuda(spec, grad_hat, stats, grads);
#endif
  prepare_backward_cpu(spec, grad_hat, stats, grads);
}

}  // namespace galerkin_ext
