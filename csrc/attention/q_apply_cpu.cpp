// q_apply on the CPU (core.h), fused: Q̂ exists only as cache-sized chunks of rows.
//   forward:  out_c = Q̂_c S, then with L normalisers out = Σ_l num_l / den_l per row
//   backward: G' = ∂out/∂(Q̂ S) applied to grad_out (row-local); dS = Σ_chunks Q̂_cᵀ G'_c;
//             dQ̂_c = G'_c Sᵀ, then the row map's backward
// For a normalised block y = n / δ (n = Q̂ S_l, δ = Q̂ s_l): ∂/∂n = g / δ and
// ∂/∂δ = -⟨g, y⟩ / δ, so G' is [g / δ | -⟨g, n⟩ / δ²] per block and both products keep the
// forward's shapes.
// δ = 0 (a sample whose keys all have weight 0) gives 0 and zero gradients: 0/0 := 0.
// The identity map without coordinates or normalisers (Galerkin's queries on a mesh given no
// coordinates) has nothing to prepare: Q̂ = q, and the products run on q as it is
// (direct_forward, direct_backward). At GNOT's shape that took Galerkin cross-attention from
// 1.32x to 1.48x eager (fwd+bwd, one run each of benchmarks/attention.py); with coordinates,
// adding pos S_pos costs a pass over the output that the chunks avoid (Burgers' shape: 1.27x
// against 1.42x), so those keep the chunks.
#include "chunks_cpu.h"
#include "core.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cstring>

namespace galerkin_ext {
namespace {

using at::Tensor;
using cpu::block;
using cpu::Chunking;
using cpu::Rows;

// Rows i < m of the products y = Q̂_c S (row stride ld, W = L·(width + 1) columns) reduced to
// out (row stride `width`): Σ_l y[l-th block, :width] / y[l-th block, width].
template <typename scalar_t>
void normalize_rows(const scalar_t* y, int64_t ld, int64_t m, int64_t blocks, int64_t width,
                    scalar_t* out) {
  for (int64_t i = 0; i < m; ++i) {
    scalar_t* o = out + i * width;
    std::fill(o, o + width, scalar_t(0));
    for (int64_t l = 0; l < blocks; ++l) {
      const scalar_t* yl = y + i * ld + l * (width + 1);
      const scalar_t den = yl[width];
      if (den == scalar_t(0)) continue;
      const scalar_t inv = scalar_t(1) / den;
      for (int64_t j = 0; j < width; ++j) o[j] += yl[j] * inv;
    }
  }
}

// G' of the header comment into gp (row stride ld), from grad rows g (stride `width`) and the
// recomputed products y (stride ld).
template <typename scalar_t>
void normalize_rows_backward(const scalar_t* g, const scalar_t* y, int64_t ld, int64_t m,
                             int64_t blocks, int64_t width, scalar_t* gp) {
  for (int64_t i = 0; i < m; ++i) {
    const scalar_t* gi = g + i * width;
    for (int64_t l = 0; l < blocks; ++l) {
      const scalar_t* yl = y + i * ld + l * (width + 1);
      scalar_t* gl = gp + i * ld + l * (width + 1);
      const scalar_t den = yl[width];
      if (den == scalar_t(0)) {
        std::fill(gl, gl + width + 1, scalar_t(0));
        continue;
      }
      const scalar_t inv = scalar_t(1) / den;
      scalar_t dot = 0;
      for (int64_t j = 0; j < width; ++j) {
        gl[j] = gi[j] * inv;
        dot += gi[j] * yl[j];
      }
      gl[width] = -dot * inv * inv;
    }
  }
}

// S zero-padded to (B·H, ldq, ldw): the products write aligned output rows (padded_width) and
// Q̂'s zero padding meets zero rows.
Tensor padded_s(const QApplyInputs& in, int64_t ldq, int64_t ldw) {
  const int64_t dq = in.query_width();
  Tensor s = at::zeros({in.B * in.H, ldq, ldw}, in.s.options());
  s.narrow(1, 0, dq).narrow(2, 0, in.W).copy_(in.s.view({in.B * in.H, dq, in.W}));
  return s;
}

// Whether Q̂ S is the plain product q S.
bool direct(const QApplyInputs& in) {
  return in.q_map == RowMap::kIdentity && in.P == 0 && in.normalizers == 0;
}

Tensor direct_forward(const QApplyInputs& in) { return at::matmul(in.q, in.s); }

QApplyGrads direct_backward(const QApplyInputs& in, const Tensor& g) {
  QApplyGrads grads;
  grads.q = at::matmul(g, in.s.transpose(2, 3));
  grads.s = at::matmul(in.q.transpose(2, 3), g);
  return grads;
}

template <typename scalar_t>
Tensor forward_impl(const QApplyInputs& in, double eps_in) {
  const scalar_t eps = scalar_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, W = in.W, L = in.normalizers;
  const int64_t dq = in.query_width(), width = in.out_width();
  const int64_t ldq = padded_width(dq), ldw = padded_width(W);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.query());
  const Chunking ch(N, std::max(ldq, ldw), sizeof(scalar_t));
  const Tensor s = padded_s(in, ldq, ldw);

  Tensor out = at::empty({B, H, N, width}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = at::empty({ch.rows, ldq}, opts), yc = at::empty({ch.rows, ldw}, opts);
    cpu::AlignedBuffer<scalar_t> scratch(dq), stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = ch.first(c), m = ch.size(c, N);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        cpu::build_chunk(qr, bh / H, bh % H, n0, m, eps, scratch.data(), qc, stats.data());
        Tensor y = block(yc, m, ldw);
        at::mm_out(y, block(qc, m, ldq), s[bh]);
        scalar_t* dst = out.mutable_data_ptr<scalar_t>() + (bh * N + n0) * width;
        const scalar_t* src = yc.const_data_ptr<scalar_t>();
        if (L > 0) {
          normalize_rows(src, ldw, m, L, width, dst);
        } else {
          for (int64_t i = 0; i < m; ++i) {
            std::memcpy(dst + i * W, src + i * ldw, W * sizeof(scalar_t));
          }
        }
      }
    }
  });
  return out;
}

template <typename scalar_t>
QApplyGrads backward_impl(const QApplyInputs& in, const Tensor& grad_out, double eps_in,
                          bool pos_grad) {
  const scalar_t eps = scalar_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, W = in.W, L = in.normalizers;
  const int64_t dq = in.query_width(), width = in.out_width();
  const int64_t ldq = padded_width(dq), ldw = padded_width(W);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.query());
  const Chunking ch(N, std::max(ldq, ldw), sizeof(scalar_t));
  const Tensor s = padded_s(in, ldq, ldw);
  const Tensor g = grad_out.contiguous();

  QApplyGrads grads;
  grads.q = at::empty({B, H, N, in.D}, opts);
  if (pos_grad) grads.pos = at::zeros(in.pos->sizes(), opts);
  const bool norm = in.q_norm_weight.has_value();
  const Tensor norm_partial = norm ? at::zeros({ch.count, 2, H, in.D}, opts) : Tensor();
  Tensor partial = at::empty({ch.count, B * H, dq, ldw}, opts);

  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    // gc's columns [W, ldw) stay zero: the products run over the aligned width ldw.
    Tensor qc = at::empty({ch.rows, ldq}, opts), gc = at::zeros({ch.rows, ldw}, opts);
    Tensor yc = L > 0 ? at::empty({ch.rows, ldw}, opts) : Tensor();
    cpu::AlignedBuffer<scalar_t> scratch(dq), dy(dq), stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = ch.first(c), m = ch.size(c, N);
      scalar_t* gamma = norm ? norm_partial[c].mutable_data_ptr<scalar_t>() : nullptr;
      const cpu::RowGradSums<scalar_t> sums{
          pos_grad ? grads.pos.mutable_data_ptr<scalar_t>() : nullptr, nullptr, gamma,
          norm ? gamma + H * in.D : nullptr};
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        cpu::build_chunk(qr, b, h, n0, m, eps, scratch.data(), qc, stats.data());
        const scalar_t* gsrc = g.const_data_ptr<scalar_t>() + (bh * N + n0) * width;
        scalar_t* gdst = gc.mutable_data_ptr<scalar_t>();
        if (L > 0) {
          Tensor y = block(yc, m, ldw);
          at::mm_out(y, block(qc, m, ldq), s[bh]);
          normalize_rows_backward(gsrc, yc.const_data_ptr<scalar_t>(), ldw, m, L, width, gdst);
        } else {
          for (int64_t i = 0; i < m; ++i) {
            std::memcpy(gdst + i * ldw, gsrc + i * W, W * sizeof(scalar_t));
          }
        }
        Tensor slot = partial[c][bh];
        at::mm_out(slot, block(qc, m, dq).t(), block(gc, m, ldw));
        Tensor dq_block = block(qc, m, ldq);  // Q̂_c is spent: it now takes dQ̂_c = G'_c Sᵀ
        at::mm_out(dq_block, block(gc, m, ldw), s[bh].t());
        cpu::chunk_backward(qr, b, h, n0, m, qc, stats.data(), grads.q, scratch.data(),
                            dy.data(), sums);
      }
    }
  });
  grads.s = partial.sum(0).narrow(-1, 0, W).contiguous().view({B, H, dq, W});
  if (norm) {
    grads.q_norm_weight = norm_partial.select(1, 0).sum(0);  // in chunk order
    grads.q_norm_bias = norm_partial.select(1, 1).sum(0);
  }
  return grads;
}

}  // namespace

Tensor q_apply_cpu(const QApplyInputs& in, double eps) {
  if (direct(in)) return direct_forward(in);
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_q_apply_cpu", [&] {
    return forward_impl<scalar_t>(in, eps);
  });
}

QApplyGrads q_apply_backward_cpu(const QApplyInputs& in, const Tensor& grad_out, double eps,
                                 bool pos_grad) {
  if (direct(in)) return direct_backward(in, grad_out);
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_q_apply_backward_cpu", [&] {
    return backward_impl<scalar_t>(in, grad_out, eps, pos_grad);
  });
}

}  // namespace galerkin_ext
