// q_apply on the CPU (core.h), fused: Q̂ exists only as cache-sized chunks of rows.
//   forward:  out_c = Q̂_c S, then with L normalisers out = Σ_l num_l / den_l per row; with
//             skip out_c += Q̂_c
//   backward: G' = ∂out/∂(Q̂ S) applied to grad_out (row-local); dS = Σ_chunks Q̂_cᵀ G'_c;
//             dQ̂_c = G'_c Sᵀ (with normalisers from g S_lᵀ, normalized_rows_backward, so
//             that Q̂ S is not recomputed), + g_c with skip, then the row map's backward
// For a normalised block y = n / δ (n = Q̂ S_l, δ = Q̂ s_l): ∂/∂n = g / δ and
// ∂/∂δ = -⟨g, y⟩ / δ, so G' is [g / δ | -⟨g, n⟩ / δ²] per block and both products keep the
// forward's shapes.
// δ = 0 (a sample whose keys all have weight 0) gives 0 and zero gradients: 0/0 := 0.
// Both divide by δ rather than multiply by 1 / δ: the quotient n / δ is a convex combination of
// v where 1 / δ overflows (a float32 δ below 2.9e-39), and the reassociation this file is
// compiled with (CMakeLists.txt) may form 1 / δ² (inf below δ = 5.4e-20): both gave inf.
// The identity map without coordinates, normalisers or skip (Galerkin's queries on a mesh given
// no coordinates) has nothing to prepare: Q̂ = q, so nothing is left to fuse, and the three
// products are ATen's batched matmuls (MKL), the minimum of work. Our chunked path ran them
// 1.5-7x slower on one thread of an Intel Xeon, most at head widths below 8 or not multiples of
// 8, whose rows it pads (benchmarks/attention.py, op galerkin_no_norm).
#include "chunks_cpu.h"
#include "core.h"
#include "gemm_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cstring>

namespace galerkin_ext {
namespace {

using at::Tensor;
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
      for (int64_t j = 0; j < width; ++j) o[j] += yl[j] / den;
    }
  }
}

// The normalised rows' backward without recomputing Q̂ S. With u_l = g S_lᵀ (S_l: block l's
// numerator columns; one product for all blocks, done by the caller), δ_l = ⟨Q̂, s_l⟩ and
// c_l = -⟨g, n_l⟩ / δ_l² = -⟨u_l, Q̂⟩ / δ_l², row by row:
//   G' = [g / δ_l | c_l] per block (into gp, row stride ldg),
//   dQ̂ = G' Sᵀ = Σ_l u_l / δ_l + c_l s_l (into dq_rows, row stride ldq; not aliasing q_rows).
// u rows (stride ldu) hold the blocks' dq columns side by side; s_cols the L vectors s_l.
template <typename scalar_t>
void normalized_rows_backward(const scalar_t* g, int64_t width, const scalar_t* q_rows,
                              int64_t ldq, const scalar_t* u, int64_t ldu,
                              const scalar_t* s_cols, int64_t m, int64_t blocks, int64_t dq,
                              scalar_t* gp, int64_t ldg, scalar_t* dq_rows) {
  for (int64_t i = 0; i < m; ++i) {
    const scalar_t* qi = q_rows + i * ldq;
    const scalar_t* gi = g + i * width;
    scalar_t* di = dq_rows + i * ldq;
    std::fill(di, di + dq, scalar_t(0));
    for (int64_t l = 0; l < blocks; ++l) {
      const scalar_t* sl = s_cols + l * dq;
      const scalar_t* ul = u + i * ldu + l * dq;
      scalar_t* gl = gp + i * ldg + l * (width + 1);
      scalar_t den = 0, dot = 0;
      for (int64_t j = 0; j < dq; ++j) {
        den += qi[j] * sl[j];
        dot += ul[j] * qi[j];
      }
      if (den == scalar_t(0)) {  // a sample without keys: 0/0 := 0, zero gradients
        std::fill(gl, gl + width + 1, scalar_t(0));
        continue;
      }
      const scalar_t cl = -(dot / den) / den;
      for (int64_t j = 0; j < width; ++j) gl[j] = gi[j] / den;
      gl[width] = cl;
      for (int64_t j = 0; j < dq; ++j) di[j] += ul[j] / den + cl * sl[j];
    }
  }
}

// dst[i, :cols] += src[i, :cols] for rows i < m (row strides ldd, lds): the skip term.
template <typename scalar_t>
void add_rows(const scalar_t* src, int64_t lds, int64_t m, int64_t cols, scalar_t* dst,
              int64_t ldd) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[i * ldd + j] += src[i * lds + j];
  }
}

// Whether Q̂ S is the plain product q S.
bool direct(const QApplyInputs& in) {
  return in.q_map == RowMap::kIdentity && in.P == 0 && in.normalizers == 0 && !in.skip;
}

// grad_q = g Sᵀ and grad_S = qᵀ g.
QApplyGrads direct_backward(const QApplyInputs& in, const Tensor& grad_out) {
  QApplyGrads grads;
  grads.q = at::matmul(grad_out, in.s.transpose(2, 3));
  grads.s = at::matmul(in.q.transpose(2, 3), grad_out);
  return grads;
}

template <typename scalar_t>
Tensor forward_impl(const QApplyInputs& in, double eps_in) {
  const scalar_t eps = scalar_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, W = in.W, L = in.normalizers;
  const int64_t dq = in.query_width(), width = in.out_width();
  const int64_t ldq = cpu::vector_width(dq), ldw = cpu::vector_width(W);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.query());
  const Chunking ch(N, std::max(ldq, ldw), sizeof(scalar_t));

  Tensor out = at::empty({B, H, N, width}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = cpu::chunk_buffer(ch.rows, ldq, opts);
    Tensor yc = L > 0 ? cpu::chunk_buffer(ch.rows, ldw, opts) : Tensor();
    cpu::AlignedBuffer<scalar_t> scratch(dq), stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = ch.first(c), m = ch.size(c, N);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        cpu::build_chunk(qr, bh / H, bh % H, n0, m, eps, scratch.data(), qc, stats.data());
        const scalar_t* q_rows = qc.const_data_ptr<scalar_t>();
        const scalar_t* s_bh = in.s.const_data_ptr<scalar_t>() + bh * dq * W;
        scalar_t* dst = out.mutable_data_ptr<scalar_t>() + (bh * N + n0) * width;
        if (L > 0) {
          scalar_t* y = yc.mutable_data_ptr<scalar_t>();
          cpu::rows_times_matrix(q_rows, ldq, s_bh, W, m, dq, W, y, ldw);
          normalize_rows(y, ldw, m, L, width, dst);
        } else {
          cpu::rows_times_matrix(q_rows, ldq, s_bh, W, m, dq, W, dst, W);
        }
        if (in.skip) add_rows(q_rows, ldq, m, dq, dst, width);
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
  const int64_t ldq = cpu::vector_width(dq), ldw = cpu::vector_width(W);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.query());
  const Chunking ch(N, std::max(ldq, ldw), sizeof(scalar_t));
  const Tensor g = grad_out.contiguous();
  // Without normalisers dQ̂ = G' Sᵀ with G' = g; with them, the blocks' numerator columns
  // transposed side by side, (B·H, width, L·dq), and their normaliser columns s_l, (B·H, L, dq)
  // (normalized_rows_backward).
  Tensor s_t, s_cols;
  if (L == 0) {
    s_t = in.s.view({B * H, dq, W}).transpose(1, 2).contiguous();
  } else {
    const Tensor blocks = in.s.view({B * H, dq, L, width + 1});
    s_t = blocks.narrow(3, 0, width).permute({0, 3, 2, 1}).contiguous().view(
        {B * H, width, L * dq});
    s_cols = blocks.select(3, width).transpose(1, 2).contiguous();
  }

  QApplyGrads grads;
  grads.q = at::empty({B, H, N, in.D}, opts);
  if (pos_grad) grads.pos = at::zeros(in.pos->sizes(), opts);
  const bool norm = in.q_norm_weight.has_value();
  const Tensor norm_partial = norm ? at::zeros({ch.count, 2, H, in.D}, opts) : Tensor();
  Tensor partial = at::empty({ch.slots, B * H, dq, W}, opts);
  scalar_t* const partial_data = partial.mutable_data_ptr<scalar_t>();

  at::parallel_for(0, ch.slots, 1, [&](int64_t begin, int64_t end) {
    // G'_c, rows padded to whole vectors (rows_transposed_times_rows); with normalisers u_c
    // and dQ̂_c get buffers of their own.
    Tensor qc = cpu::chunk_buffer(ch.rows, ldq, opts), gc = cpu::chunk_buffer(ch.rows, ldw, opts);
    const int64_t ldu = cpu::vector_width(L * dq);
    Tensor uc = L > 0 ? cpu::chunk_buffer(ch.rows, ldu, opts) : Tensor();
    Tensor dc = L > 0 ? cpu::chunk_buffer(ch.rows, ldq, opts) : qc;
    cpu::AlignedBuffer<scalar_t> scratch(dq), dy(dq), stats(2 * ch.rows);
    for (int64_t slot = begin; slot < end; ++slot) {
      for (int64_t c = ch.slot_first(slot); c < ch.slot_first(slot + 1); ++c) {
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
          const scalar_t* q_rows = qc.const_data_ptr<scalar_t>();
          if (L > 0) {
            scalar_t* u = uc.mutable_data_ptr<scalar_t>();
            cpu::rows_times_matrix(gsrc, width,
                                   s_t.const_data_ptr<scalar_t>() + bh * width * L * dq, L * dq,
                                   m, width, L * dq, u, ldu);
            normalized_rows_backward(gsrc, width, q_rows, ldq, u, ldu,
                                     s_cols.const_data_ptr<scalar_t>() + bh * L * dq, m, L, dq,
                                     gdst, ldw, dc.mutable_data_ptr<scalar_t>());
          } else {
            for (int64_t i = 0; i < m; ++i) {
              std::memcpy(gdst + i * ldw, gsrc + i * W, W * sizeof(scalar_t));
            }
          }
          cpu::rows_transposed_times_rows(q_rows, ldq, gdst, ldw, m, dq, W,
                                          partial_data + (slot * B * H + bh) * dq * W, W,
                                          /*accumulate=*/c > ch.slot_first(slot));
          if (L == 0) {  // Q̂_c is spent: it now takes dQ̂_c = G'_c Sᵀ
            cpu::rows_times_matrix(gdst, ldw, s_t.const_data_ptr<scalar_t>() + bh * W * dq, dq, m,
                                   W, dq, qc.mutable_data_ptr<scalar_t>(), ldq);
          }
          if (in.skip) add_rows(gsrc, width, m, dq, dc.mutable_data_ptr<scalar_t>(), ldq);
          cpu::chunk_backward(qr, b, h, n0, m, dc, stats.data(), grads.q, scratch.data(),
                              dy.data(), sums);
        }
      }
    }
  });
  grads.s = cpu::sum_slots(partial).view({B, H, dq, W});
  if (norm) {
    grads.q_norm_weight = norm_partial.select(1, 0).sum(0);  // in chunk order
    grads.q_norm_bias = norm_partial.select(1, 1).sum(0);
  }
  return grads;
}

}  // namespace

// (The direct products inside the dispatch too: one rule for the dtypes the CPU ops take.)
Tensor q_apply_cpu(const QApplyInputs& in, double eps) {
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_q_apply_cpu", [&] {
    return direct(in) ? at::matmul(in.q, in.s) : forward_impl<scalar_t>(in, eps);
  });
}

QApplyGrads q_apply_backward_cpu(const QApplyInputs& in, const Tensor& grad_out, double eps,
                                 bool pos_grad) {
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_q_apply_backward_cpu", [&] {
    return direct(in) ? direct_backward(in, grad_out)
                      : backward_impl<scalar_t>(in, grad_out, eps, pos_grad);
  });
}

}  // namespace galerkin_ext
