// kv_reduce on the CPU (core.h), fused: K̂ and V̂ exist only as cache-sized chunks of rows.
//   forward:  S = Σ_chunks K̂w_cᵀ V̂_c
//   backward: dK̂w_c = V̂_c dSᵀ, dV̂_c = K̂w_c dS, then the row maps' backward
// The chunk owning points [m0, m1) owns their rows of the kv_pos and weight gradients for every
// batch element and head, so no two threads add to one element; norm-parameter gradients are
// summed per chunk, then over chunks in order.
// Identity maps with no coordinates, no weights given and no ones column have nothing to
// prepare: K̂ = k, V̂ = v, W = I / M, and the products are ATen's batched matmuls (MKL), as in
// q_apply_cpu.cpp.
#include "chunks_cpu.h"
#include "core.h"
#include "gemm_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

namespace galerkin_ext {
namespace {

using at::Tensor;
using cpu::Chunking;
using cpu::Rows;

// Column `col` of the first m rows of a (rows, ld) chunk set to 1 (the normaliser's column).
template <typename scalar_t>
void set_ones(Tensor& chunk, int64_t m, int64_t col) {
  scalar_t* data = chunk.mutable_data_ptr<scalar_t>();
  const int64_t ld = chunk.size(1);
  for (int64_t i = 0; i < m; ++i) data[i * ld + col] = scalar_t(1);
}

// Whether S is the plain product kᵀ v / M.
bool direct(const KvReduceInputs& in) {
  return in.k_map == RowMap::kIdentity && in.v_map == RowMap::kIdentity && in.P == 0 &&
         !in.weight.has_value() && !in.ones_column;
}

// dk = v dSᵀ / M and dv = k dS / M.
KvReduceGrads direct_backward(const KvReduceInputs& in, const Tensor& grad_s) {
  const Tensor ds = grad_s.to(in.k.scalar_type()) / in.M;
  KvReduceGrads grads;
  grads.k = at::matmul(in.v, ds.transpose(2, 3));
  grads.v = at::matmul(in.k, ds);
  return grads;
}

template <typename scalar_t>
Tensor forward_impl(const KvReduceInputs& in, double eps_in) {
  const scalar_t eps = scalar_t(eps_in);
  const int64_t B = in.B, H = in.H, M = in.M;
  const int64_t dk = in.key_width(), dv = in.value_width();
  const int64_t ldk = cpu::vector_width(dk), ldv = cpu::vector_width(dv);
  const auto opts = in.k.options();
  const Rows<scalar_t> kr(in.key()), vr(in.value());
  const Chunking ch(M, std::max(ldk, ldv), sizeof(scalar_t));

  Tensor partial = at::empty({ch.slots, B * H, dk, dv}, opts);
  scalar_t* const partial_data = partial.mutable_data_ptr<scalar_t>();
  at::parallel_for(0, ch.slots, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = cpu::chunk_buffer(ch.rows, ldk, opts), vc = cpu::chunk_buffer(ch.rows, ldv, opts);
    cpu::AlignedBuffer<scalar_t> scratch(std::max(dk, dv)), stats(2 * ch.rows);
    for (int64_t slot = begin; slot < end; ++slot) {
      for (int64_t c = ch.slot_first(slot); c < ch.slot_first(slot + 1); ++c) {
        const int64_t m0 = ch.first(c), m = ch.size(c, M);
        for (int64_t bh = 0; bh < B * H; ++bh) {
          cpu::build_chunk(kr, bh / H, bh % H, m0, m, eps, scratch.data(), kc, stats.data());
          cpu::build_chunk(vr, bh / H, bh % H, m0, m, eps, scratch.data(), vc, stats.data());
          if (in.ones_column) set_ones<scalar_t>(vc, m, dv - 1);
          cpu::rows_transposed_times_rows(kc.const_data_ptr<scalar_t>(), ldk,
                                          vc.const_data_ptr<scalar_t>(), ldv, m, dk, dv,
                                          partial_data + (slot * B * H + bh) * dk * dv, dv,
                                          /*accumulate=*/c > ch.slot_first(slot));
        }
      }
    }
  });
  return cpu::sum_slots(partial).view({B, H, dk, dv});
}

template <typename scalar_t>
KvReduceGrads backward_impl(const KvReduceInputs& in, const Tensor& grad_s, double eps_in,
                            bool kv_pos_grad, bool weight_grad) {
  const scalar_t eps = scalar_t(eps_in);
  const int64_t B = in.B, H = in.H, M = in.M;
  const int64_t dk = in.key_width(), dv = in.value_width();
  const int64_t ldk = cpu::vector_width(dk), ldv = cpu::vector_width(dv);
  const auto opts = in.k.options();
  const Rows<scalar_t> kr(in.key()), vr(in.value());
  const Chunking ch(M, std::max(ldk, ldv), sizeof(scalar_t));
  // dS and dSᵀ per (b, h), contiguous in k's dtype.
  const Tensor ds = grad_s.to(opts.dtype()).reshape({B * H, dk, dv}).contiguous();
  const Tensor ds_t = ds.transpose(1, 2).contiguous();

  KvReduceGrads grads;
  grads.k = at::empty({B, H, M, in.Dk}, opts);
  grads.v = at::empty({B, H, M, in.Dv}, opts);
  if (kv_pos_grad) grads.kv_pos = at::zeros(in.kv_pos->sizes(), opts);
  if (weight_grad) grads.weight = at::zeros(in.weight->sizes(), opts);
  // Norm-parameter gradients per chunk, (chunks, 2 parameters, H, D) for each operand.
  const bool k_norm = in.k_norm_weight.has_value(), v_norm = in.v_norm_weight.has_value();
  const Tensor k_norm_partial = k_norm ? at::zeros({ch.count, 2, H, in.Dk}, opts) : Tensor();
  const Tensor v_norm_partial = v_norm ? at::zeros({ch.count, 2, H, in.Dv}, opts) : Tensor();
  auto sums = [&](const Tensor& norm_partial, int64_t c, bool weighted) {
    scalar_t* gamma =
        norm_partial.defined() ? norm_partial[c].mutable_data_ptr<scalar_t>() : nullptr;
    const int64_t D = norm_partial.defined() ? norm_partial.size(3) : 0;
    return cpu::RowGradSums<scalar_t>{
        kv_pos_grad ? grads.kv_pos.mutable_data_ptr<scalar_t>() : nullptr,
        weighted && weight_grad ? grads.weight.mutable_data_ptr<scalar_t>() : nullptr, gamma,
        gamma ? gamma + H * D : nullptr};
  };

  at::parallel_for(0, ch.count, 1, [&](int64_t begin, int64_t end) {
    Tensor kc = cpu::chunk_buffer(ch.rows, ldk, opts), vc = cpu::chunk_buffer(ch.rows, ldv, opts);
    Tensor dkc = cpu::chunk_buffer(ch.rows, ldk, opts);
    Tensor dvc = cpu::chunk_buffer(ch.rows, ldv, opts);
    const int64_t width = std::max(dk, dv);
    cpu::AlignedBuffer<scalar_t> scratch(width), dy(width), k_stats(2 * ch.rows),
        v_stats(2 * ch.rows);
    for (int64_t c = begin; c < end; ++c) {
      const int64_t m0 = ch.first(c), m = ch.size(c, M);
      const cpu::RowGradSums<scalar_t> k_sums = sums(k_norm_partial, c, true);
      const cpu::RowGradSums<scalar_t> v_sums = sums(v_norm_partial, c, false);
      for (int64_t bh = 0; bh < B * H; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        cpu::build_chunk(kr, b, h, m0, m, eps, scratch.data(), kc, k_stats.data());
        cpu::build_chunk(vr, b, h, m0, m, eps, scratch.data(), vc, v_stats.data());
        if (in.ones_column) set_ones<scalar_t>(vc, m, dv - 1);
        cpu::rows_times_matrix(vc.const_data_ptr<scalar_t>(), ldv,
                               ds_t.const_data_ptr<scalar_t>() + bh * dv * dk, dk, m, dv, dk,
                               dkc.mutable_data_ptr<scalar_t>(), ldk);
        cpu::rows_times_matrix(kc.const_data_ptr<scalar_t>(), ldk,
                               ds.const_data_ptr<scalar_t>() + bh * dk * dv, dv, m, dk, dv,
                               dvc.mutable_data_ptr<scalar_t>(), ldv);
        cpu::chunk_backward(kr, b, h, m0, m, dkc, k_stats.data(), grads.k, scratch.data(),
                            dy.data(), k_sums);
        cpu::chunk_backward(vr, b, h, m0, m, dvc, v_stats.data(), grads.v, scratch.data(),
                            dy.data(), v_sums);
      }
    }
  });

  if (k_norm) {
    grads.k_norm_weight = k_norm_partial.select(1, 0).sum(0);  // in chunk order
    grads.k_norm_bias = k_norm_partial.select(1, 1).sum(0);
  }
  if (v_norm) {
    grads.v_norm_weight = v_norm_partial.select(1, 0).sum(0);  // in chunk order
    grads.v_norm_bias = v_norm_partial.select(1, 1).sum(0);
  }
  return grads;
}

}  // namespace

// (The direct products inside the dispatch too: one rule for the dtypes the CPU ops take.)
Tensor kv_reduce_cpu(const KvReduceInputs& in, double eps) {
  return AT_DISPATCH_FLOATING_TYPES(in.k.scalar_type(), "galerkin_ext_kv_reduce_cpu", [&] {
    return direct(in) ? at::matmul(in.k.transpose(2, 3), in.v).div_(in.M)
                      : forward_impl<scalar_t>(in, eps);
  });
}

KvReduceGrads kv_reduce_backward_cpu(const KvReduceInputs& in, const Tensor& grad_s, double eps,
                                     bool kv_pos_grad, bool weight_grad) {
  return AT_DISPATCH_FLOATING_TYPES(in.k.scalar_type(), "galerkin_ext_kv_reduce_backward_cpu",
                                    [&] {
    return direct(in) ? direct_backward(in, grad_s)
                      : backward_impl<scalar_t>(in, grad_s, eps, kv_pos_grad, weight_grad);
  });
}

}  // namespace galerkin_ext
