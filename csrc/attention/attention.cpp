// Forward and backward of the softmax-free attention: fused operand preparation (attention.h)
// around ATen batched GEMMs. Device-agnostic: only the preparation kernels have CPU/CUDA twins.
#include "attention.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace galerkin_ext {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

at::ScalarType opmath_dtype(const Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Memory-safety checks for direct callers of the op; ops.py gives friendlier messages first.
void check_same(const Tensor& t, const Tensor& q, const char* name) {
  TORCH_CHECK(t.device() == q.device(), name, ": expected device ", q.device(), ", got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, ": expected dtype ", q.scalar_type(),
              ", got ", t.scalar_type());
}

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

// Row length of the prepared operands: d rounded up to a multiple of 8 elements when that wastes
// at most d/8, so the GEMMs get aligned rows (d = 97 ran the N×d·d×d products at about half
// the speed of d = 104 with MKL on 2 cores). The zero padding changes no result. ops.py's fake
// kernels mirror this rule.
int64_t padded_width(int64_t d) {
  const int64_t up = (d + 7) / 8 * 8;
  return (up - d) * 8 <= d ? up : d;
}

// x (BH, r, c) zero-padded to (BH, r2, c2).
Tensor pad_to(const Tensor& x, int64_t rows, int64_t cols) {
  if (x.size(1) == rows && x.size(2) == cols) return x;
  return at::constant_pad_nd(x, {0, cols - x.size(2), 0, rows - x.size(1)}, 0);
}

// scale · a @ b for batched a (BH, m, k), b (BH, k, n); beta = 0 so the empty input is ignored.
Tensor scaled_bmm(const Tensor& a, const Tensor& b, double scale) {
  return at::baddbmm(at::empty({a.size(0), a.size(1), b.size(2)}, a.options()), a, b,
                     /*beta=*/0, /*alpha=*/scale);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> attention_forward(
    const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& pos_in,
    const OptTensor& weight_in, const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
    const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
    const OptTensor& v_norm_weight, const OptTensor& v_norm_bias, const OptTensor& dropout_mask,
    double eps, double scale, bool quadratic) {
  // The op picks its own precision: the GEMMs inside must not be re-cast by autocast.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  check_inputs(q, k, v, pos_in, weight_in);
  check_norm(q_norm_weight, q_norm_bias, q, "q_norm");
  check_norm(k_norm_weight, k_norm_bias, q, "k_norm");
  check_norm(v_norm_weight, v_norm_bias, q, "v_norm");
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const OptTensor pos = contiguous(pos_in), weight = contiguous(weight_in);
  const int64_t d = D + (pos ? pos->size(-1) : 0);
  const int64_t side = quadratic ? N : d;
  if (dropout_mask) {
    check_same(*dropout_mask, q, "dropout_mask");
    TORCH_CHECK(dropout_mask->sizes() == at::IntArrayRef({B, H, side, side}),
                "dropout_mask: expected shape (B, H, ", side, ", ", side, "), got ",
                dropout_mask->sizes());
  }

  const int64_t ld = padded_width(d);
  Tensor q_hat = at::empty({B, H, N, ld}, q.options());
  Tensor k_hat_w = at::empty({B, H, N, ld}, q.options());
  Tensor v_hat = at::empty({B, H, N, ld}, q.options());
  Tensor stats = at::zeros({3, B, H, N, 2}, q.options().dtype(opmath_dtype(q)));
  auto prep = [&](const Tensor& x, bool weighted, const OptTensor& nw, const OptTensor& nb,
                  Tensor& hat, int64_t slot) {
    Tensor st = stats.select(0, slot);
    prepare_forward({x, pos, weight, weighted, contiguous(nw), contiguous(nb)}, eps, hat, st);
  };
  prep(q, false, q_norm_weight, q_norm_bias, q_hat, 0);
  prep(k, true, k_norm_weight, k_norm_bias, k_hat_w, 1);
  prep(v, false, v_norm_weight, v_norm_bias, v_hat, 2);

  const Tensor qh = q_hat.view({B * H, N, ld}), kh = k_hat_w.view({B * H, N, ld}),
               vh = v_hat.view({B * H, N, ld});
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
  return {out.view({B, H, N, d}), attn.view({B, H, side, side}), q_hat, k_hat_w, v_hat, stats};
}

std::vector<Tensor> attention_backward(
    const Tensor& grad_out, const OptTensor& grad_attn, const Tensor& q, const Tensor& k,
    const Tensor& v, const OptTensor& pos_in, const OptTensor& weight_in,
    const OptTensor& q_norm_weight, const OptTensor& q_norm_bias, const OptTensor& k_norm_weight,
    const OptTensor& k_norm_bias, const OptTensor& v_norm_weight, const OptTensor& v_norm_bias,
    const OptTensor& dropout_mask, const Tensor& attn, const Tensor& q_hat, const Tensor& k_hat_w,
    const Tensor& v_hat, const Tensor& stats, double scale, bool quadratic, bool pos_grad,
    bool weight_grad) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  check_inputs(q, k, v, pos_in, weight_in);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const OptTensor pos = contiguous(pos_in), weight = contiguous(weight_in);
  const int64_t d = D + (pos ? pos->size(-1) : 0), side = quadratic ? N : d;
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef({B, H, N, d}),
              "grad_out: expected shape (B, H, N, d), got ", grad_out.sizes());
  TORCH_CHECK(!pos_grad || pos, "pos_grad: requested without pos");
  TORCH_CHECK(!weight_grad || weight, "weight_grad: requested without weight");

  // The GEMMs run on the padded operands; grad_out gets the same zero padding.
  const int64_t ld = q_hat.size(-1);
  const Tensor g = pad_to(grad_out.reshape({B * H, N, d}), N, ld).contiguous();
  const Tensor qh = q_hat.view({B * H, N, ld}), kh = k_hat_w.view({B * H, N, ld}),
               vh = v_hat.view({B * H, N, ld});
  const Tensor a = quadratic ? attn.view({B * H, N, N})
                             : pad_to(attn.reshape({B * H, d, d}), ld, ld);
  const int64_t r = quadratic ? N : ld;  // side of the padded attention matrix
  Tensor d_attn = quadratic ? at::bmm(g, vh.transpose(1, 2)) : at::bmm(qh.transpose(1, 2), g);
  if (grad_attn) d_attn.add_(pad_to(grad_attn->reshape({B * H, side, side}), r, r));
  if (dropout_mask) d_attn.mul_(pad_to(dropout_mask->reshape({B * H, side, side}), r, r));
  if (scale != 1.0) d_attn.mul_(scale);
  const auto acc = q.options().dtype(opmath_dtype(q));
  Tensor grad_pos_acc = pos_grad ? at::zeros(pos->sizes(), acc) : Tensor();
  Tensor grad_weight_acc = weight_grad ? at::zeros(weight->sizes(), acc) : Tensor();
  std::vector<Tensor> result(11);
  const int64_t P = d - D;
  auto back = [&](const Tensor& x, bool weighted, const OptTensor& nw, const OptTensor& nb,
                  Tensor d_hat, int64_t slot) {
    Tensor& gnw = result[5 + 2 * slot];
    Tensor& gnb = result[6 + 2 * slot];
    if (nw) {
      gnw = at::empty({H, D}, q.options());
      gnb = at::empty({H, D}, q.options());
    }
    OperandGrads grads{pos_grad ? &grad_pos_acc : nullptr,
                       weighted && weight_grad ? &grad_weight_acc : nullptr,
                       nw ? &gnw : nullptr, nw ? &gnb : nullptr};
    d_hat = d_hat.view({B, H, N, ld});
    prepare_backward({x, pos, weight, weighted, contiguous(nw), contiguous(nb)}, d_hat,
                     stats.select(0, slot), grads);
    result[slot] = d_hat.narrow(-1, P, D);  // the backward left grad_x there, in place
  };
  // d_attn is now the gradient of the unscaled, undropped product. Each operand's gradient
  // becomes its input's gradient in place, so the backward allocates no further buffers.
  const Tensor d_attn_t = d_attn.transpose(1, 2);
  if (quadratic) {  // attn = Q̂ K̂wᵀ: the N×N matrix is read, never rebuilt
    back(q, false, q_norm_weight, q_norm_bias, at::bmm(d_attn, kh), 0);
    back(k, true, k_norm_weight, k_norm_bias, at::bmm(d_attn_t, qh), 1);
    back(v, false, v_norm_weight, v_norm_bias, at::bmm(a.transpose(1, 2), g), 2);
  } else {  // attn = K̂wᵀ V̂
    back(q, false, q_norm_weight, q_norm_bias, at::bmm(g, a.transpose(1, 2)), 0);
    back(k, true, k_norm_weight, k_norm_bias, at::bmm(vh, d_attn_t), 1);
    back(v, false, v_norm_weight, v_norm_bias, at::bmm(kh, d_attn), 2);
  }
  result[3] = pos_grad ? grad_pos_acc.to(q.scalar_type()) : at::empty({0}, q.options());
  result[4] = weight_grad ? grad_weight_acc.to(q.scalar_type()) : at::empty({0}, q.options());
  for (int64_t i = 5; i < 11; ++i) {
    if (!result[i].defined()) result[i] = at::empty({0}, q.options());
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
