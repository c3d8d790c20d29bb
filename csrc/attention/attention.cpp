// Forward and backward of the softmax-free attention (attention.h): validation, then either the
// fused CPU linear path (linear_cpu.cpp) or the device-agnostic one here: whole prepared operands
// (CPU or CUDA preparation kernels) around ATen batched GEMMs.
#include "attention.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace galerkin_ext {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// Memory-safety checks for direct callers of the op; ops.py gives friendlier messages first.
void check_norm(const OptTensor& w, const OptTensor& b, const Tensor& q, const char* name) {
  TORCH_CHECK(w.has_value() == b.has_value(), name,
              ": norm weight and bias must be given together");
  if (!w) return;
  for (const Tensor* t : {&*w, &*b}) {
    check_same(*t, q, name);
    TORCH_CHECK(t->dim() == 2 && t->size(0) == q.size(1) && t->size(1) == q.size(3), name,
                ": expected shape (H, D) = (", q.size(1), ", ", q.size(3), "), got ", t->sizes());
  }
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& pos,
                  const OptTensor& weight) {
  TORCH_CHECK(q.dim() == 4, "q: expected shape (B, H, N, D), got ", q.sizes());
  TORCH_CHECK(q.size(2) > 0 && q.size(3) > 0, "q: expected N >= 1 and D >= 1, got ", q.sizes());
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "q: expected a floating dtype, got ",
              q.scalar_type());
  for (auto [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_same(*t, q, name);
    TORCH_CHECK(t->sizes() == q.sizes(), name, ": expected shape ", q.sizes(), " like q, got ",
                t->sizes());
  }
  const int64_t B = q.size(0), N = q.size(2);
  if (pos) {
    check_same(*pos, q, "pos");
    TORCH_CHECK((pos->dim() == 3 && pos->size(0) == B && pos->size(1) == N) ||
                    (pos->dim() == 2 && pos->size(0) == N),
                "pos: expected shape (B, N, P) or (N, P) with B = ", B, ", N = ", N, ", got ",
                pos->sizes());
  }
  if (weight) {
    check_same(*weight, q, "weight");
    TORCH_CHECK((weight->dim() == 2 && weight->size(0) == B && weight->size(1) == N) ||
                    (weight->dim() == 1 && weight->size(0) == N),
                "weight: expected shape (B, N) or (N,) with B = ", B, ", N = ", N, ", got ",
                weight->sizes());
  }
}

OptTensor contiguous(const OptTensor& t) {
  return t ? OptTensor(t->contiguous()) : std::nullopt;
}

AttentionInputs make_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                            const OptTensor& pos, const OptTensor& weight,
                            const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
                            const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
                            const OptTensor& v_norm_weight, const OptTensor& v_norm_bias,
                            const OptTensor& dropout_mask, bool quadratic) {
  check_inputs(q, k, v, pos, weight);
  check_norm(q_norm_weight, q_norm_bias, q, "q_norm");
  check_norm(k_norm_weight, k_norm_bias, q, "k_norm");
  check_norm(v_norm_weight, v_norm_bias, q, "v_norm");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const int64_t P = pos ? pos->size(-1) : 0, d = D + P, side = quadratic ? N : d;
  if (dropout_mask) {
    check_same(*dropout_mask, q, "dropout_mask");
    TORCH_CHECK(dropout_mask->sizes() == at::IntArrayRef({B, H, side, side}),
                "dropout_mask: expected shape (B, H, ", side, ", ", side, "), got ",
                dropout_mask->sizes());
  }
  return AttentionInputs{q, k, v, contiguous(pos), contiguous(weight), dropout_mask,
                         {contiguous(q_norm_weight), contiguous(k_norm_weight),
                          contiguous(v_norm_weight)},
                         {contiguous(q_norm_bias), contiguous(k_norm_bias),
                          contiguous(v_norm_bias)},
                         B, H, N, D, P, d};
}

// The fused kernels take the linear path; everything else runs here on whole operands.
bool fused_linear(const AttentionInputs& in, bool quadratic) {
  if (quadratic) return false;
#ifdef GALERKIN_EXT_WITH_CUDA
  if (in.q.is_cuda()) return linear_cuda_supported(in);
#endif
  return in.q.is_cpu();
}

std::tuple<Tensor, Tensor> linear_forward(const AttentionInputs& in, double eps, double scale) {
#ifdef GALERKIN_EXT_WITH_CUDA
  if (in.q.is_cuda()) return linear_forward_cuda(in, eps, scale);
#endif
  return linear_forward_cpu(in, eps, scale);
}

std::vector<Tensor> linear_backward(const AttentionInputs& in, const Tensor& grad_out,
                                    const OptTensor& grad_attn, const Tensor& attn, double eps,
                                    double scale, bool pos_grad, bool weight_grad) {
#ifdef GALERKIN_EXT_WITH_CUDA
  if (in.q.is_cuda()) {
    return linear_backward_cuda(in, grad_out, grad_attn, attn, eps, scale, pos_grad, weight_grad);
  }
#endif
  return linear_backward_cpu(in, grad_out, grad_attn, attn, eps, scale, pos_grad, weight_grad);
}

// x (BH, r, c) zero-padded to (BH, r2, c2).
Tensor pad_to(const Tensor& x, int64_t rows, int64_t cols) {
  if (x.size(1) == rows && x.size(2) == cols) return x;
  return at::constant_pad_nd(x, {0, cols - x.size(2), 0, rows - x.size(1)}, 0);
}

// scale · a @ b for batched a (BH, m, k), b (BH, k, n), written in place into an uninitialised
// result: with beta = 0 its contents are never read, and no second (m, n) buffer is allocated
// (an out-of-place baddbmm held two N×N matrices at once on the quadratic path).
Tensor scaled_bmm(const Tensor& a, const Tensor& b, double scale) {
  return at::empty({a.size(0), a.size(1), b.size(2)}, a.options())
      .baddbmm_(a, b, /*beta=*/0, /*alpha=*/scale);
}

// The three prepared operands (B·H, N, ld) and their norm statistics (3, B, H, N, 2).
struct Prepared {
  Tensor hat[3], stats;
};

Prepared prepare_all(const AttentionInputs& in, double eps) {
  const int64_t ld = padded_width(in.d);
  Prepared p;
  p.stats = at::empty({3, in.B, in.H, in.N, 2}, in.q.options().dtype(opmath_dtype(in.q)));
  for (int slot = 0; slot < 3; ++slot) {
    p.hat[slot] = at::empty({in.B, in.H, in.N, ld}, in.q.options());
    Tensor stats = p.stats.select(0, slot);
    prepare_forward(in.operand(slot), eps, p.hat[slot], stats);
    p.hat[slot] = p.hat[slot].view({in.B * in.H, in.N, ld});
  }
  return p;
}

std::tuple<Tensor, Tensor> attention_forward(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& pos,
    const OptTensor& weight, const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
    const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
    const OptTensor& v_norm_weight, const OptTensor& v_norm_bias, const OptTensor& dropout_mask,
    double eps, double scale, bool quadratic) {
  // The op picks its own precision: the GEMMs inside must not be re-cast by autocast.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const AttentionInputs in =
      make_inputs(q, k, v, pos, weight, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias,
                  v_norm_weight, v_norm_bias, dropout_mask, quadratic);
  if (fused_linear(in, quadratic)) return linear_forward(in, eps, scale);

  const int64_t B = in.B, H = in.H, N = in.N, d = in.d;
  const Prepared p = prepare_all(in, eps);
  const Tensor &qh = p.hat[0], &kh = p.hat[1], &vh = p.hat[2];
  Tensor attn, out;
  if (quadratic) {  // (BH, N, N); the zero padding adds nothing to Q̂ K̂wᵀ
    attn = scaled_bmm(qh, kh.transpose(1, 2), scale);
    if (dropout_mask) attn.mul_(dropout_mask->reshape({B * H, N, N}));
    out = at::bmm(attn, vh.narrow(2, 0, d));
  } else {  // (BH, ld, ld), zero outside [:d, :d]
    Tensor s = scaled_bmm(kh.transpose(1, 2), vh, scale);
    attn = s.narrow(1, 0, d).narrow(2, 0, d);
    if (dropout_mask) attn.mul_(dropout_mask->reshape({B * H, d, d}));
    out = at::bmm(qh, s.narrow(2, 0, d));
    attn = attn.contiguous();
  }
  const int64_t side = quadratic ? N : d;
  return {out.view({B, H, N, d}), attn.view({B, H, side, side})};
}

// The backward on whole operands, recomputed from the inputs.
std::vector<Tensor> generic_backward(const AttentionInputs& in, const Tensor& grad_out,
                                     const OptTensor& grad_attn, const Tensor& attn, double eps,
                                     double scale, bool quadratic, bool pos_grad,
                                     bool weight_grad) {
  const int64_t B = in.B, H = in.H, N = in.N, D = in.D, d = in.d, ld = padded_width(d);
  const int64_t side = quadratic ? N : d;
  const Prepared p = prepare_all(in, eps);
  const Tensor &qh = p.hat[0], &kh = p.hat[1], &vh = p.hat[2];
  // The GEMMs run on the padded operands; grad_out gets the same zero padding.
  const Tensor g = pad_to(grad_out.reshape({B * H, N, d}), N, ld).contiguous();
  const Tensor a = quadratic ? attn.view({B * H, N, N})
                             : pad_to(attn.reshape({B * H, d, d}), ld, ld);
  const int64_t r = quadratic ? N : ld;  // side of the padded attention matrix
  Tensor d_attn = quadratic ? at::bmm(g, vh.transpose(1, 2)) : at::bmm(qh.transpose(1, 2), g);
  if (grad_attn) d_attn.add_(pad_to(grad_attn->reshape({B * H, side, side}), r, r));
  if (in.dropout_mask) d_attn.mul_(pad_to(in.dropout_mask->reshape({B * H, side, side}), r, r));
  if (scale != 1.0) d_attn.mul_(scale);
  const auto acc = in.q.options().dtype(opmath_dtype(in.q));
  Tensor grad_pos_acc = pos_grad ? at::zeros(in.pos->sizes(), acc) : Tensor();
  Tensor grad_weight_acc = weight_grad ? at::zeros(in.weight->sizes(), acc) : Tensor();
  std::vector<Tensor> result(11);
  auto back = [&](int slot, Tensor d_hat) {
    Tensor& gnw = result[5 + 2 * slot];
    Tensor& gnb = result[6 + 2 * slot];
    const bool norm = in.norm_weight[slot].has_value();
    if (norm) {
      gnw = at::empty({H, D}, in.q.options());
      gnb = at::empty({H, D}, in.q.options());
    }
    OperandGrads grads{pos_grad ? &grad_pos_acc : nullptr,
                       slot == 1 && weight_grad ? &grad_weight_acc : nullptr,
                       norm ? &gnw : nullptr, norm ? &gnb : nullptr};
    d_hat = d_hat.view({B, H, N, ld});
    prepare_backward(in.operand(slot), d_hat, p.stats.select(0, slot), grads);
    result[slot] = d_hat.narrow(-1, in.P, D);  // the backward left grad_x there, in place
  };
  // d_attn is now the gradient of the unscaled, undropped product. Each operand's gradient
  // becomes its input's gradient in place, so no further operand-sized buffers are needed.
  const Tensor d_attn_t = d_attn.transpose(1, 2);
  if (quadratic) {  // attn = Q̂ K̂wᵀ: the N×N matrix is read, never rebuilt
    back(0, at::bmm(d_attn, kh));
    back(1, at::bmm(d_attn_t, qh));
    back(2, at::bmm(a.transpose(1, 2), g));
  } else {  // attn = K̂wᵀ V̂
    back(0, at::bmm(g, a.transpose(1, 2)));
    back(1, at::bmm(vh, d_attn_t));
    back(2, at::bmm(kh, d_attn));
  }
  if (pos_grad) result[3] = grad_pos_acc.to(in.q.scalar_type());
  if (weight_grad) result[4] = grad_weight_acc.to(in.q.scalar_type());
  return result;
}

std::vector<Tensor> attention_backward(
    const Tensor& grad_out, const OptTensor& grad_attn, const Tensor& q, const Tensor& k,
    const Tensor& v, const OptTensor& pos, const OptTensor& weight,
    const OptTensor& q_norm_weight, const OptTensor& q_norm_bias, const OptTensor& k_norm_weight,
    const OptTensor& k_norm_bias, const OptTensor& v_norm_weight, const OptTensor& v_norm_bias,
    const OptTensor& dropout_mask, const Tensor& attn, double eps, double scale, bool quadratic,
    bool pos_grad, bool weight_grad) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const AttentionInputs in =
      make_inputs(q, k, v, pos, weight, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias,
                  v_norm_weight, v_norm_bias, dropout_mask, quadratic);
  const int64_t B = in.B, H = in.H, N = in.N, d = in.d, side = quadratic ? N : d;
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef({B, H, N, d}),
              "grad_out: expected shape (B, H, N, d), got ", grad_out.sizes());
  check_same(grad_out, q, "grad_out");
  TORCH_CHECK(attn.sizes() == at::IntArrayRef({B, H, side, side}),
              "attn: expected shape (B, H, ", side, ", ", side, "), got ", attn.sizes());
  check_same(attn, q, "attn");
  if (grad_attn) {
    TORCH_CHECK(grad_attn->sizes() == attn.sizes(), "grad_attn: expected shape ", attn.sizes(),
                " like attn, got ", grad_attn->sizes());
    check_same(*grad_attn, q, "grad_attn");
  }
  TORCH_CHECK(!pos_grad || pos, "pos_grad: requested without pos");
  TORCH_CHECK(!weight_grad || weight, "weight_grad: requested without weight");

  std::vector<Tensor> result;
  if (fused_linear(in, quadratic)) {
    result = linear_backward(in, grad_out, grad_attn, attn, eps, scale, pos_grad, weight_grad);
  } else {
    result = generic_backward(in, grad_out, grad_attn, attn, eps, scale, quadratic, pos_grad,
                              weight_grad);
  }
  for (Tensor& t : result) {
    if (!t.defined()) t = at::empty({0}, q.options());
  }
  return result;
}
}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}

#ifdef GALERKIN_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(galerkin_ext, CUDA, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}
#endif

}  // namespace galerkin_ext
