// Quadratic-order attention with dropout, fused (the CPU kernels of
// galerkin_ext::quadratic_attention and its backward): per (batch, head)
// out = (Q Kᵀ ∘ D) V, with D the dropout op's multipliers (kept ? 1 / (1 - p) : 0) of the
// (B, H, N, M) matrix Q Kᵀ as if it were stored contiguously (../dropout/threefry.h), so that the
// result is the unfused path's, `dropout(q @ k.mT) @ v`, up to rounding. The matrix is never
// stored: a block of query rows forms its rows of Q Kᵀ in a buffer that stays in cache, drops
// them and multiplies them by V; the backward forms them again, with the same rows of dO Vᵀ,
// and regenerates the mask. The unfused path writes and reads the N × M matrix several times
// and keeps it, and its mask, for the backward.
//
// Each output element is a sum in a fixed order (gemm_cpu.h; the key-side gradients over the
// query blocks in chunks fixed by the sizes, pairwise_cpu.h), so results do not depend on the
// thread count.
#include "pairwise_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace galerkin_ext::cpu {
namespace {

at::Tensor quadratic_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   double p, const at::Tensor& seed) {
  const PairwiseSizes z = check_pairwise_operands(q, k, v, p, seed);
  at::Tensor out = at::empty({q.size(0), q.size(1), z.n, z.dv}, q.options());
  if (out.numel() == 0) return out;
  if (z.m == 0) return out.zero_();
  const threefry::Mask mask = pairwise_mask(seed, p);
  const at::Tensor qc = q.contiguous(), vc = v.contiguous();
  const at::Tensor kt = k.transpose(2, 3).contiguous();  // (B, H, d, M): Q Kᵀ's right factor
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "galerkin_ext_quadratic_attention", [&] {
    using T = scalar_t;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const int64_t rows_per_block = block_rows<T>(z.m);
    const int64_t blocks = (z.n + rows_per_block - 1) / rows_per_block;
    const T* qp = qc.const_data_ptr<T>();
    const T* ktp = kt.const_data_ptr<T>();
    const T* vp = vc.const_data_ptr<T>();
    T* op = out.mutable_data_ptr<T>();
    at::parallel_for(0, z.batch_heads * blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> s(rows_per_block * z.m);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t bh = task / blocks, i0 = task % blocks * rows_per_block;
        const int64_t rows = std::min(rows_per_block, z.n - i0);
        const int64_t row = bh * z.n + i0;  // the block's first row of the (B H N) rows
        rows_times_matrix<T>(qp + row * z.d, z.d, ktp + bh * z.d * z.m, z.m, rows, z.d, z.m,
                             s.data(), z.m);
        if (p > 0.0) drop<T>(mask, scale, row * z.m, rows * z.m, s.data(), nullptr);
        rows_times_matrix<T>(s.data(), z.m, vp + bh * z.m * z.dv, z.dv, rows, z.m, z.dv,
                             op + row * z.dv, z.dv);
      }
    });
  });
  return out;
}

std::vector<at::Tensor> quadratic_attention_backward_cpu(const at::Tensor& grad_out,
                                                         const at::Tensor& q,
                                                         const at::Tensor& k,
                                                         const at::Tensor& v, double p,
                                                         const at::Tensor& seed) {
  const PairwiseSizes z = check_pairwise_operands(q, k, v, p, seed);
  check_grad_out(grad_out, q, z);
  at::Tensor grad_q = at::zeros_like(q, at::MemoryFormat::Contiguous);
  at::Tensor grad_k = at::zeros_like(k, at::MemoryFormat::Contiguous);
  at::Tensor grad_v = at::zeros_like(v, at::MemoryFormat::Contiguous);
  if (z.batch_heads * z.n * z.m == 0) return {grad_q, grad_k, grad_v};
  const threefry::Mask mask = pairwise_mask(seed, p);
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), gc = grad_out.contiguous();
  const at::Tensor kt = k.transpose(2, 3).contiguous(), vt = v.transpose(2, 3).contiguous();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "galerkin_ext_quadratic_attention_backward", [&] {
    using T = scalar_t;
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const int64_t rows_per_block = block_rows<T>(z.m);
    const T* qp = qc.const_data_ptr<T>();
    const T* kp = kc.const_data_ptr<T>();
    const T* ktp = kt.const_data_ptr<T>();
    const T* vtp = vt.const_data_ptr<T>();
    const T* gp = gc.const_data_ptr<T>();
    T* dqp = grad_q.mutable_data_ptr<T>();
    T* dkp = grad_k.mutable_data_ptr<T>();
    T* dvp = grad_v.mutable_data_ptr<T>();
    const int64_t blocks = (z.n + rows_per_block - 1) / rows_per_block;
    auto for_chunk = [&](int64_t bh, int64_t first_block, int64_t end_block, T* const* sums) {
      std::vector<T> s(rows_per_block * z.m), ds(rows_per_block * z.m);
      KeySideSum<T> sum_k(rows_per_block, z.m, z.d), sum_v(rows_per_block, z.m, z.dv);
      for (int64_t block = first_block; block < end_block; ++block) {
        const int64_t i0 = block * rows_per_block, rows = std::min(rows_per_block, z.n - i0);
        const int64_t row = bh * z.n + i0;
        // P = Q Kᵀ ∘ D and dS = dO Vᵀ ∘ D on the block's rows
        rows_times_matrix<T>(qp + row * z.d, z.d, ktp + bh * z.d * z.m, z.m, rows, z.d, z.m,
                             s.data(), z.m);
        rows_times_matrix<T>(gp + row * z.dv, z.dv, vtp + bh * z.dv * z.m, z.m, rows, z.dv, z.m,
                             ds.data(), z.m);
        if (p > 0.0) drop<T>(mask, scale, row * z.m, rows * z.m, s.data(), ds.data());
        // dQ = dS K; dK += dSᵀ Q and dV += Pᵀ dO, over the chunk's blocks in order
        rows_times_matrix<T>(ds.data(), z.m, kp + bh * z.m * z.d, z.d, rows, z.m, z.d,
                             dqp + row * z.d, z.d);
        sum_k.add(ds.data(), qp + row * z.d, z.d, rows, block == first_block, sums[0]);
        sum_v.add(s.data(), gp + row * z.dv, z.dv, rows, block == first_block, sums[1]);
      }
    };
    run_backward_chunks<T>(z.batch_heads, blocks, {dkp, dvp}, {z.m * z.d, z.m * z.dv},
                           for_chunk);
  });
  return {grad_q, grad_k, grad_v};
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) {
  m.impl("quadratic_attention", &quadratic_attention_cpu);
  m.impl("quadratic_attention_backward", &quadratic_attention_backward_cpu);
}

}  // namespace galerkin_ext::cpu
