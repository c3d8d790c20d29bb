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
// result depends only on the chunk size (set by N, d and the thread count), never on which thread
// ran what.
//
// Output widths: MKL runs a GEMM whose output width is not a multiple of 8 about 15% slower (97
// against 96 columns at the Burgers shape; the inner dimension may be anything). So where D is a
// multiple of 8 and d is not, BLAS computes output columns [P, d) and a small loop the P
// coordinate columns; elsewhere BLAS computes all ld columns, zero-padded.
#include "chunks_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

namespace galerkin_ext {
namespace {

using at::Tensor;
using cpu::build_chunk;
using cpu::chunk_backward;
using cpu::Chunking;
using cpu::RowGradSums;
using cpu::Rows;

// The first m rows of a (rows, ld) chunk buffer.
Tensor head(const Tensor& chunk, int64_t m) { return chunk.narrow(0, 0, m); }

// y[i, c] = Σ_j l[i, j] · cols[c, j] for the first `p` columns of y (rows i < m, j < k).
template <typename scalar_t>
GALERKIN_EXT_CPU_KERNEL void coordinate_product(const scalar_t* l, const scalar_t* cols,
                                                int64_t m, int64_t k, int64_t p, int64_t ld,
                                                scalar_t* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < p; ++c) {
      scalar_t sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += l[i * ld + j] * cols[c * k + j];
      y[i * ld + c] = sum;
    }
  }
}

// r[j, c] = Σ_i l[i, j] · rhs[i, c] for the first `p` columns of r (i < m, j < k); `sum` holds k.
template <typename scalar_t>
GALERKIN_EXT_CPU_KERNEL void coordinate_reduce(const scalar_t* l, const scalar_t* rhs, int64_t m,
                                               int64_t k, int64_t p, int64_t ld, scalar_t* sum,
                                               scalar_t* r) {
  for (int64_t c = 0; c < p; ++c) {
    std::fill(sum, sum + k, scalar_t(0));
    for (int64_t i = 0; i < m; ++i) {
      const scalar_t w = rhs[i * ld + c];
      for (int64_t j = 0; j < k; ++j) sum[j] += l[i * ld + j] * w;
    }
    for (int64_t j = 0; j < k; ++j) r[j * ld + c] = sum[j];
  }
}

// The GEMMs on (rows, ld) chunks; see "Output widths" above. Inner dimensions run over d.
template <typename scalar_t>
struct ChunkGemms {
  int64_t d, P, ld;
  bool split;  // BLAS for columns [P, d), coordinate_* for [0, P)

  ChunkGemms(const AttentionInputs& in, int64_t ld)
      : d(in.d), P(in.P), ld(ld), split(in.P > 0 && in.D % 8 == 0 && in.d % 8 != 0) {}

  // The first P columns of each matrix (B·H, d, ld), transposed to (B·H, P, d): what `product`
  // takes as `cols`. Empty unless split.
  Tensor coordinate_columns(const Tensor& mats) const {
    return split ? mats.narrow(1, 0, d).narrow(2, 0, P).transpose(1, 2).contiguous() : Tensor();
  }

  // y = l · mat for chunks y, l (m, ld) and mat (≥ d, ld). Columns [0, P) only `if coordinates`.
  void product(Tensor& y, const Tensor& l, const Tensor& mat, const Tensor& cols, int64_t bh,
               bool coordinates) const {
    const Tensor lhs = l.narrow(1, 0, d), rhs = mat.narrow(0, 0, d);
    if (!split) {
      at::mm_out(y, lhs, rhs);
      return;
    }
    Tensor y_main = y.narrow(1, P, d - P);
    at::mm_out(y_main, lhs, rhs.narrow(1, P, d - P));
    if (coordinates) {
      coordinate_product(l.const_data_ptr<scalar_t>(), cols.const_data_ptr<scalar_t>() +
                         bh * P * d, l.size(0), d, P, ld, y.mutable_data_ptr<scalar_t>());
    }
  }

  // r[:d, :d] = lᵀ · rhs for chunks l, rhs (m, ld) and r (ld, ld); `sum` holds d elements.
  void reduce(Tensor& r, const Tensor& l, const Tensor& rhs, scalar_t* sum) const {
    const Tensor lhs = l.narrow(1, 0, d).t();
    if (!split) {
      Tensor r_rows = r.narrow(0, 0, d);
      at::mm_out(r_rows, lhs, rhs);
      return;
    }
    Tensor r_main = r.narrow(0, 0, d).narrow(1, P, d - P);
    at::mm_out(r_main, lhs, rhs.narrow(1, P, d - P));
    coordinate_reduce(l.const_data_ptr<scalar_t>(), rhs.const_data_ptr<scalar_t>(), l.size(0), d,
                      P, ld, sum, r.mutable_data_ptr<scalar_t>());
  }
};

template <typename scalar_t>
std::tuple<Tensor, Tensor> forward_impl(const AttentionInputs& in, double eps_in, double scale) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t eps = acc_t(eps_in);
  const int64_t B = in.B, H = in.H, N = in.N, D = in.D, d = in.d, ld = padded_width(d);
  const auto opts = in.q.options();
  const Rows<scalar_t> qr(in.operand(0)), kr(in.operand(1)), vr(in.operand(2));
  const Chunking ch(N, ld, sizeof(scalar_t));
  const ChunkGemms<scalar_t> gemm(in, ld);

  Tensor partial = at::empty({ch.count, B * H, ld, ld}, opts);  // [:d, :d] used
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = at::empty({ch.rows, ld}, opts), vc = at::empty({ch.rows, ld}, opts);
    cpu::AlignedBuffer<acc_t> scratch(std::max(D, d)), stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        build_chunk(kr, bh / H, bh % H, n0, m, eps, scratch.data(), kc, stats.data());
        build_chunk(vr, bh / H, bh % H, n0, m, eps, scratch.data(), vc, stats.data());
        Tensor slot = partial[c][bh];
        gemm.reduce(slot, head(kc, m), head(vc, m), scratch.data());
      }
    }
  });
  // A, zero-padded to (ld, ld).
  Tensor a_pad = at::zeros({B * H, ld, ld}, opts);
  Tensor attn = a_pad.narrow(1, 0, d).narrow(2, 0, d);
  attn.copy_(partial.narrow(2, 0, d).narrow(3, 0, d).sum(0)).mul_(scale);
  if (in.dropout_mask) attn.mul_(in.dropout_mask->reshape({B * H, d, d}));
  const Tensor a_cols = gemm.coordinate_columns(a_pad);

  Tensor out = at::empty({B, H, N, d}, opts);
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = at::empty({ch.rows, ld}, opts), oc = at::empty({ch.rows, ld}, opts);
    cpu::AlignedBuffer<acc_t> scratch(D), stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        build_chunk(qr, bh / H, bh % H, n0, m, eps, scratch.data(), qc, stats.data());
        Tensor oc_head = head(oc, m);
        gemm.product(oc_head, head(qc, m), a_pad[bh], a_cols, bh, /*coordinates=*/true);
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
  const Rows<scalar_t> operands[3] = {Rows<scalar_t>(in.operand(0)),
                                      Rows<scalar_t>(in.operand(1)),
                                      Rows<scalar_t>(in.operand(2))};
  const Chunking ch(N, ld, sizeof(scalar_t));
  const ChunkGemms<scalar_t> gemm(in, ld);
  // The coordinate columns of an operand's gradient feed only the pos and weight gradients.
  const bool coordinates[3] = {pos_grad, pos_grad || weight_grad, pos_grad};

  Tensor a_pad = at::zeros({B * H, ld, ld}, opts);
  a_pad.narrow(1, 0, d).narrow(2, 0, d).copy_(attn.reshape({B * H, d, d}));
  const Tensor a_t = a_pad.transpose(1, 2), a_t_cols = gemm.coordinate_columns(a_t);
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
  Tensor d_attn_partial = at::empty({ch.count, B * H, ld, ld}, opts);  // [:d, :d] used
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor qc = at::empty({ch.rows, ld}, opts), gc = at::zeros({ch.rows, ld}, opts);
    cpu::AlignedBuffer<acc_t> scratch(std::max(D, d)), dy(D), stats(2 * ch.rows);
    scalar_t* gc_data = gc.mutable_data_ptr<scalar_t>();  // columns [d, ld) stay zero
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      const RowGradSums<acc_t> q_sums = sums(0, c);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        build_chunk(operands[0], b, h, n0, m, eps, scratch.data(), qc, stats.data());
        const scalar_t* src = g_data + (bh * N + n0) * d;
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(gc_data + i * ld, src + i * d, d * sizeof(scalar_t));
        }
        Tensor slot = d_attn_partial[c][bh];
        gemm.reduce(slot, head(qc, m), head(gc, m), scratch.data());
        Tensor qc_head = head(qc, m);  // Q̂_c is spent: it now takes dQ̂_c = G_c Aᵀ
        gemm.product(qc_head, head(gc, m), a_t[bh], a_t_cols, bh, coordinates[0]);
        chunk_backward(operands[0], b, h, n0, m, qc, stats.data(), result[0], scratch.data(),
                       dy.data(), q_sums);
      }
    }
  });
  Tensor d_s = at::zeros({B * H, ld, ld}, opts);  // dS, zero-padded
  Tensor d_s_core = d_s.narrow(1, 0, d).narrow(2, 0, d);
  d_s_core.copy_(d_attn_partial.narrow(2, 0, d).narrow(3, 0, d).sum(0));
  if (grad_attn) d_s_core.add_(grad_attn->reshape({B * H, d, d}));
  if (in.dropout_mask) d_s_core.mul_(in.dropout_mask->reshape({B * H, d, d}));
  if (scale != 1.0) d_s_core.mul_(scale);
  const Tensor d_s_t = d_s.transpose(1, 2);
  const Tensor d_s_cols = gemm.coordinate_columns(d_s);
  const Tensor d_s_t_cols = gemm.coordinate_columns(d_s_t);

  // Pass 2: k's and v's gradients.
  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = at::empty({ch.rows, ld}, opts), vc = at::empty({ch.rows, ld}, opts);
    Tensor dkc = at::empty({ch.rows, ld}, opts), dvc = at::empty({ch.rows, ld}, opts);
    cpu::AlignedBuffer<acc_t> scratch(D), dy(D), k_stats(2 * ch.rows), v_stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t n0 = c * ch.rows, m = std::min(ch.rows, N - n0);
      const RowGradSums<acc_t> k_sums = sums(1, c), v_sums = sums(2, c);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        build_chunk(operands[1], b, h, n0, m, eps, scratch.data(), kc, k_stats.data());
        build_chunk(operands[2], b, h, n0, m, eps, scratch.data(), vc, v_stats.data());
        Tensor dkc_head = head(dkc, m), dvc_head = head(dvc, m);
        gemm.product(dkc_head, head(vc, m), d_s_t[bh], d_s_t_cols, bh, coordinates[1]);
        gemm.product(dvc_head, head(kc, m), d_s[bh], d_s_cols, bh, coordinates[2]);
        chunk_backward(operands[1], b, h, n0, m, dkc, k_stats.data(), result[1], scratch.data(),
                       dy.data(), k_sums);
        chunk_backward(operands[2], b, h, n0, m, dvc, v_stats.data(), result[2], scratch.data(),
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
