// The linear path on the CPU, fused (attention.h). The prepared operands exist only as chunks of
// rows small enough to stay in L2: the row kernels (prepare_cpu.h) build a chunk, single-threaded
// BLAS GEMMs consume it while it is still in cache, and no operand-sized buffer is ever written.
// With S = K̂wᵀ V̂ and A = scale · S ∘ M:
//   forward:  S = Σ_chunks K̂w_cᵀ V̂_c;  out_c = Q̂_c A
//   backward: dA = Σ_chunks Q̂_cᵀ G_c (+ grad_attn);  dQ̂_c = G_c Aᵀ, then q's row backward;
//             dS = scale · dA ∘ M;  dK̂w_c = V̂_c dSᵀ, dV̂_c = K̂w_c dS, then k's and v's.
// Against materialising the operands this removes most of the memory traffic, and the GEMMs run
// faster on cache-resident chunks (MKL, 2 cores: ~92 GF/s per thread against ~70 on whole
// operands). Reductions over points are per-chunk partial products summed in chunk order, so a
// result depends only on the chunk size, never on which thread ran what.
#include "prepare_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

namespace galerkin_ext {
namespace {

using at::Tensor;
using cpu::RowGradSums;
using cpu::Rows;
using cpu::RowStats;

// Points per chunk: a chunk operand takes at most 128 KiB, so the two to four a task holds stay
// in L2, and every thread gets at least two chunks to balance.
int64_t chunk_rows(int64_t n, int64_t ld, int64_t element_size) {
  const int64_t cache_rows = std::max<int64_t>(8, 128 * 1024 / element_size / ld / 8 * 8);
  const int64_t tasks = 2 * at::get_num_threads();
  const int64_t balanced = ((n + tasks - 1) / tasks + 7) / 8 * 8;
  return std::min(cache_rows, balanced);
}

struct Chunking {
  int64_t rows, count;
  Chunking(int64_t n, int64_t ld, int64_t element_size)
      : rows(chunk_rows(n, ld, element_size)), count((n + rows - 1) / rows) {}
};

// The first m rows of a (rows, ld) chunk buffer.
Tensor head(const Tensor& chunk, int64_t m) { return chunk.narrow(0, 0, m); }

// Builds rows [n0, n0 + m) of operand (b, h) into chunk (rows, ld), keeping their statistics.
template <typename scalar_t, typename acc_t>
void build_chunk(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                 acc_t eps, acc_t* scratch, Tensor& chunk, RowStats<acc_t>* stats) {
  const int64_t ld = chunk.size(1);
  scalar_t* out = chunk.mutable_data_ptr<scalar_t>();
  for (int64_t i = 0; i < m; ++i) {
    stats[i] = cpu::prepare_row(r, b, h, n0 + i, eps, scratch, out + i * ld, ld);
  }
}

// Row backward of rows [n0, n0 + m) of operand (b, h): the gradients w.r.t. the prepared rows
// are in chunk (rows, ld); grad_x rows go to grad_x (B, H, N, D) contiguous.
template <typename scalar_t, typename acc_t>
void chunk_backward(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                    const Tensor& chunk, const RowStats<acc_t>* stats, Tensor& grad_x,
                    acc_t* xhat, acc_t* dy, const RowGradSums<acc_t>& sums) {
  const int64_t ld = chunk.size(1);
  const scalar_t* g = chunk.const_data_ptr<scalar_t>();
  scalar_t* dx = grad_x.mutable_data_ptr<scalar_t>() + ((b * r.H + h) * r.N + n0) * r.D;
  for (int64_t i = 0; i < m; ++i) {
    cpu::prepare_row_backward(r, b, h, n0 + i, stats[i], g + i * ld, dx + i * r.D, xhat, dy,
                              sums);
  }
}

template <typename scalar_t>
std::tuple<Tensor, Tensor> forward_impl(const AttentionInputs& in, double eps_in, double scale) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t eps = acc_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, d = in.d, ld = padded_width(d);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.operand(0)), kr(in.operand(1)), vr(in.operand(2));
  const Chunking ch(N, ld, sizeof(scalar_t));

  Tensor partial = at::empty({ch.count, B * H, ld, ld}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = at::empty({ch.rows, ld}, opts), vc = at::empty({ch.rows, ld}, opts);
    std::vector<acc_t> scratch(in.D);
    std::vector<RowStats<acc_t>> stats(ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        build_chunk(kr, bh / H, bh % H, n0, m, eps, scratch.data(), kc, stats.data());
        build_chunk(vr, bh / H, bh % H, n0, m, eps, scratch.data(), vc, stats.data());
        Tensor slot = partial[c][bh];
        at::mm_out(slot, head(kc, m).t(), head(vc, m));
      }
    }
  });
  // A, zero-padded to (ld, ld): the padding columns of the operands made S zero there.
  Tensor a_pad = partial.sum(0).mul_(scale);
  Tensor attn = a_pad.narrow(1, 0, d).narrow(2, 0, d);
  if (in.dropout_mask) attn.mul_(in.dropout_mask->reshape({B * H, d, d}));

  Tensor out = at::empty({B, H, N, d}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = at::empty({ch.rows, ld}, opts), oc = at::empty({ch.rows, ld}, opts);
    std::vector<acc_t> scratch(in.D);
    std::vector<RowStats<acc_t>> stats(ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        build_chunk(qr, bh / H, bh % H, n0, m, eps, scratch.data(), qc, stats.data());
        Tensor oc_head = head(oc, m);
        at::mm_out(oc_head, head(qc, m), a_pad[bh]);
        const scalar_t* src = oc.const_data_ptr<scalar_t>();
        scalar_t* dst = out.mutable_data_ptr<scalar_t>() + (bh * N + n0) * d;
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(dst + i * d, src + i * ld, d * sizeof(scalar_t));
        }
      }
    }
  });
  return {out, attn.contiguous().view({B, H, d, d})};
}

template <typename scalar_t>
std::vector<Tensor> backward_impl(const AttentionInputs& in, const Tensor& grad_out,
                                  const std::optional<Tensor>& grad_attn, const Tensor& attn,
                                  double eps_in, double scale, bool pos_grad, bool weight_grad) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t eps = acc_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, D = in.D, d = in.d, ld = padded_width(d);
  const auto opts = in.q.options();
  const auto acc_opts = opts.dtype(c10::CppTypeToScalarType<acc_t>::value);
  const Rows<scalar_t> rows[3] = {Rows<scalar_t>(in.operand(0)), Rows<scalar_t>(in.operand(1)),
                                  Rows<scalar_t>(in.operand(2))};
  const Chunking ch(N, ld, sizeof(scalar_t));

  Tensor a_pad = at::zeros({B * H, ld, ld}, opts);
  a_pad.narrow(1, 0, d).narrow(2, 0, d).copy_(attn.reshape({B * H, d, d}));
  const Tensor g = grad_out.contiguous();
  const scalar_t* g_data = g.const_data_ptr<scalar_t>();

  std::vector<Tensor> result(11);
  for (int slot = 0; slot < 3; ++slot) result[slot] = at::empty({B, H, N, D}, opts);
  Tensor grad_pos = pos_grad ? at::zeros(in.pos->sizes(), acc_opts) : Tensor();
  Tensor grad_weight = weight_grad ? at::zeros(in.weight->sizes(), acc_opts) : Tensor();
  // Norm-parameter gradients per chunk, summed over chunks at the end: (3, chunks, 2, H, D).
  Tensor norm_partial = at::zeros({3, ch.count, 2, H, D}, acc_opts);
  // A task owns its chunks' points for every batch and head, so it alone adds to their rows
  // of grad_pos and grad_weight.
  auto sums = [&](int slot, int64_t c) {
    const bool norm = in.norm_weight[slot].has_value();
    acc_t* gamma = norm ? norm_partial[slot][c].mutable_data_ptr<acc_t>() : nullptr;
    return RowGradSums<acc_t>{pos_grad ? grad_pos.mutable_data_ptr<acc_t>() : nullptr,
                              slot == 1 && weight_grad ? grad_weight.mutable_data_ptr<acc_t>()
                                                       : nullptr,
                              gamma, norm ? gamma + H * D : nullptr};
  };

  // Pass 1: dA partials and q's gradient.
  Tensor d_attn_partial = at::empty({ch.count, B * H, ld, ld}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = at::empty({ch.rows, ld}, opts), gc = at::zeros({ch.rows, ld}, opts);
    std::vector<acc_t> scratch(D), dy(D);
    std::vector<RowStats<acc_t>> stats(ch.rows);
    scalar_t* gc_data = gc.mutable_data_ptr<scalar_t>();  // columns [d, ld) stay zero
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      const RowGradSums<acc_t> q_sums = sums(0, c);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        build_chunk(rows[0], b, h, n0, m, eps, scratch.data(), qc, stats.data());
        const scalar_t* src = g_data + (bh * N + n0) * d;
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(gc_data + i * ld, src + i * d, d * sizeof(scalar_t));
        }
        Tensor slot = d_attn_partial[c][bh];
        at::mm_out(slot, head(qc, m).t(), head(gc, m));
        Tensor qc_head = head(qc, m);  // Q̂_c is spent: it now takes dQ̂_c = G_c Aᵀ
        at::mm_out(qc_head, head(gc, m), a_pad[bh].t());
        chunk_backward(rows[0], b, h, n0, m, qc, stats.data(), result[0], scratch.data(),
                       dy.data(), q_sums);
      }
    }
  });
  Tensor d_s = d_attn_partial.sum(0);  // (B·H, ld, ld), zero outside [:d, :d]
  Tensor d_s_core = d_s.narrow(1, 0, d).narrow(2, 0, d);
  if (grad_attn) d_s_core.add_(grad_attn->reshape({B * H, d, d}));
  if (in.dropout_mask) d_s_core.mul_(in.dropout_mask->reshape({B * H, d, d}));
  if (scale != 1.0) d_s_core.mul_(scale);

  // Pass 2: k's and v's gradients.
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = at::empty({ch.rows, ld}, opts), vc = at::empty({ch.rows, ld}, opts);
    Tensor dkc = at::empty({ch.rows, ld}, opts), dvc = at::empty({ch.rows, ld}, opts);
    std::vector<acc_t> scratch(D), dy(D);
    std::vector<RowStats<acc_t>> k_stats(ch.rows), v_stats(ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      const RowGradSums<acc_t> k_sums = sums(1, c), v_sums = sums(2, c);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        build_chunk(rows[1], b, h, n0, m, eps, scratch.data(), kc, k_stats.data());
        build_chunk(rows[2], b, h, n0, m, eps, scratch.data(), vc, v_stats.data());
        Tensor dkc_head = head(dkc, m), dvc_head = head(dvc, m);
        at::mm_out(dkc_head, head(vc, m), d_s[bh].t());
        at::mm_out(dvc_head, head(kc, m), d_s[bh]);
        chunk_backward(rows[1], b, h, n0, m, dkc, k_stats.data(), result[1], scratch.data(),
                       dy.data(), k_sums);
        chunk_backward(rows[2], b, h, n0, m, dvc, v_stats.data(), result[2], scratch.data(),
                       dy.data(), v_sums);
      }
    }
  });

  if (pos_grad) result[3] = grad_pos.to(in.q.scalar_type());
  if (weight_grad) result[4] = grad_weight.to(in.q.scalar_type());
  for (int slot = 0; slot < 3; ++slot) {
    if (!in.norm_weight[slot]) continue;
    const Tensor per_chunk = norm_partial[slot];  // (chunks, 2, H, D)
    result[5 + 2 * slot] = per_chunk.select(1, 0).sum(0).to(in.q.scalar_type());
    result[6 + 2 * slot] = per_chunk.select(1, 1).sum(0).to(in.q.scalar_type());
  }
  return result;
}

}  // namespace

std::tuple<Tensor, Tensor> linear_forward_cpu(const AttentionInputs& in, double eps,
                                              double scale) {
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_linear_forward_cpu", [&] {
    return forward_impl<scalar_t>(in, eps, scale);
  });
}

std::vector<Tensor> linear_backward_cpu(const AttentionInputs& in, const Tensor& grad_out,
                                        const std::optional<Tensor>& grad_attn,
                                        const Tensor& attn, double eps, double scale,
                                        bool pos_grad, bool weight_grad) {
  return AT_DISPATCH_FLOATING_TYPES(in.q.scalar_type(), "galerkin_ext_linear_backward_cpu", [&] {
    return backward_impl<scalar_t>(in, grad_out, grad_attn, attn, eps, scale, pos_grad,
                                   weight_grad);
  });
}

}  // namespace galerkin_ext
