// What the two fused pairwise CPU ops share (quadratic_cpu.cpp: Fourier attention's (Q Kᵀ ∘ D) V;
// softmax_cpu.cpp: (softmax(s Q Kᵀ + b) ∘ D) V): their operands' checks, the size of the blocks
// of query rows in which they form the N × M matrix, its dropout, D the dropout op's
// multipliers (kept ? 1 / (1 - p) : 0) of the (B, H, N, M) matrix as if it were stored
// contiguously (../dropout/threefry.h), and the backward's sums over the query blocks.
#pragma once

#include "../dropout/threefry.h"
#include "gemm_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace galerkin_ext::cpu {

// Query rows per block: the block's rows of Q Kᵀ (and, in the backward, of dO Vᵀ) fill about
// 128 KiB, which stays in L2; at least 8 rows, so that the key-side products of the backward
// are not dominated by adding their M × d results up.
template <typename T>
int64_t block_rows(int64_t m) {
  return std::clamp<int64_t>(131072 / (std::max<int64_t>(m, 1) * sizeof(T)), 8, 64);
}

// Multiplies elements [first, first + count) of the contiguous matrix, held at a[e - first]
// (and b[e - first] when b is given), by their dropout multipliers: a product, not a select,
// so that a dropped NaN stays NaN, as in the dropout op.
template <typename T>
GALERKIN_EXT_THREEFRY_KERNEL void drop(threefry::Mask mask, T scale, int64_t first,
                                       int64_t count, T* a, T* b) {
  using threefry::kBlock;
  const uint32_t threshold = mask.threshold;
  const int64_t end = first + count;
  uint32_t u[kBlock];
  for (int64_t block = first / kBlock; block * kBlock < end; ++block) {
    mask.block(block, u);
    const int64_t lo = std::max(first, block * kBlock);
    const int64_t len = std::min(end, (block + 1) * kBlock) - lo;
    const uint32_t* ub = u + (lo - block * kBlock);
    T* ab = a + (lo - first);
    if (b == nullptr) {
      for (int64_t e = 0; e < len; ++e) ab[e] *= ub[e] < threshold ? scale : T(0);
    } else {
      T* bb = b + (lo - first);
      for (int64_t e = 0; e < len; ++e) {
        const T multiplier = ub[e] < threshold ? scale : T(0);
        ab[e] *= multiplier;
        bb[e] *= multiplier;
      }
    }
  }
}

// A key-side gradient of the backward, out (M × W) = Σ over the query blocks, in order, of
// xᵀ y, x the block's rows × M (a row buffer, stride M) and y its rows × W: the first block
// writes out, each later one adds its product, formed apart. (y's rows are copied to rows of
// vector_width(W), rows_transposed_times_rows's right factor, whose loads run to whole vectors.)
template <typename T>
class KeySideSum {
 public:
  KeySideSum(int64_t rows_per_block, int64_t m, int64_t w)
      : m_(m), w_(w), y_rows_(rows_per_block * vector_width(w)), part_(m * w) {}

  // Adds the block of `rows` rows at x and y (row stride ldy) to out.
  void add(const T* x, const T* y, int64_t ldy, int64_t rows, bool first_block, T* out) {
    const int64_t width = vector_width(w_);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(y + r * ldy, y + r * ldy + w_, &y_rows_[r * width]);
    }
    rows_transposed_times_rows<T>(x, m_, y_rows_.data(), width, rows, m_, w_,
                                  first_block ? out : part_.data(), w_, /*accumulate=*/false);
    if (!first_block) {
      for (int64_t e = 0; e < m_ * w_; ++e) out[e] += part_[e];
    }
  }

 private:
  int64_t m_, w_;
  std::vector<T> y_rows_, part_;
};

// The backward's tasks: each (batch, head)'s query blocks in runs of consecutive blocks
// ("chunks"), so that a small B·H still gives every thread work; about kBackwardTasks tasks in
// all (at most one per block), a function of the sizes alone, so that results do not depend on
// the thread count. for_chunk(bh, first_block, end_block, targets) runs one: it sums its blocks'
// parts of each key-side gradient g (sizes[g] elements per (batch, head)) into targets[g], in
// order. A head's first chunk sums into the gradients themselves, the others into buffers of
// their own (zero on entry, as the gradients must be), added to the gradients in order after.
// Those buffers hold (chunks - 1) copies of the key-side gradients: at most
// kBufferCopies of them, or more while they fit in kBufferBytes (at B·H = 1 and M = 200 000,
// sixteen chunks' 15 copies had raised the backward's peak above the N × M matrix it avoids).
constexpr int64_t kBackwardTasks = 16;
constexpr int64_t kBufferCopies = 3;
constexpr int64_t kBufferBytes = int64_t{64} << 20;

template <typename T, typename ForChunk>
void run_backward_chunks(int64_t batch_heads, int64_t blocks, const std::vector<T*>& gradients,
                         const std::vector<int64_t>& sizes, const ForChunk& for_chunk) {
  int64_t copy_bytes = 0;  // one copy of the key-side gradients of every (batch, head)
  for (const int64_t size : sizes) copy_bytes += batch_heads * size * int64_t{sizeof(T)};
  const int64_t copies = std::max(kBufferCopies, kBufferBytes / std::max<int64_t>(copy_bytes, 1));
  const int64_t most = std::max<int64_t>(std::min(blocks, copies + 1), 1);
  const int64_t wanted =
      std::clamp<int64_t>((kBackwardTasks + batch_heads - 1) / batch_heads, 1, most);
  const int64_t per_chunk = (blocks + wanted - 1) / wanted;
  const int64_t chunks = (blocks + per_chunk - 1) / per_chunk;
  const size_t count = gradients.size();
  std::vector<std::vector<T>> partial(count);
  for (size_t g = 0; g < count; ++g) {
    partial[g].assign(batch_heads * (chunks - 1) * sizes[g], T(0));
  }
  auto part = [&](size_t g, int64_t bh, int64_t c) {  // chunk c >= 1's sum of gradient g
    return partial[g].data() + (bh * (chunks - 1) + c - 1) * sizes[g];
  };
  at::parallel_for(0, batch_heads * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<T*> targets(count);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / chunks, c = task % chunks;
      for (size_t g = 0; g < count; ++g) {
        targets[g] = c == 0 ? gradients[g] + bh * sizes[g] : part(g, bh, c);
      }
      for_chunk(bh, c * per_chunk, std::min(blocks, (c + 1) * per_chunk), targets.data());
    }
  });
  if (chunks == 1) return;
  at::parallel_for(0, batch_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      for (size_t g = 0; g < count; ++g) {
        T* out = gradients[g] + bh * sizes[g];
        for (int64_t c = 1; c < chunks; ++c) {
          const T* add = part(g, bh, c);
          for (int64_t e = 0; e < sizes[g]; ++e) out[e] += add[e];
        }
      }
    }
  });
}

struct PairwiseSizes {
  int64_t batch_heads, n, m, d, dv;
};

// q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v) of one floating dtype, a drop probability
// p in [0, 1) and its seed, a 0-dim int64 CPU tensor.
inline PairwiseSizes check_pairwise_operands(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, double p,
                                             const at::Tensor& seed) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "q, k, v: expected (B, H, N, d), (B, H, M, d), (B, H, M, d_v), got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && k.size(0) == v.size(0) &&
                  k.size(1) == v.size(1) && q.size(3) == k.size(3) && k.size(2) == v.size(2),
              "q, k, v: expected (B, H, N, d), (B, H, M, d), (B, H, M, d_v), got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "q: expected float32 or float64, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "k, v: expected q's dtype ", q.scalar_type(), ", got ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(p >= 0.0 && p < 1.0, "p: expected 0 <= p < 1, got ", p);
  threefry::check_seed(seed);
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

// The mask of the seed and p (any at p = 0, where nothing is dropped).
inline threefry::Mask pairwise_mask(const at::Tensor& seed, double p) {
  return threefry::Mask(seed.item<int64_t>(), p > 0.0 ? p : 0.5);
}

// grad_out: out's (B, H, N, d_v) in q's dtype.
inline void check_grad_out(const at::Tensor& grad_out, const at::Tensor& q,
                           const PairwiseSizes& z) {
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef({q.size(0), q.size(1), z.n, z.dv}) &&
                  grad_out.scalar_type() == q.scalar_type(),
              "grad_out: expected ", q.scalar_type(), " of shape (", q.size(0), ", ", q.size(1),
              ", ", z.n, ", ", z.dv, "), got ", grad_out.scalar_type(), " ", grad_out.sizes());
}

}  // namespace galerkin_ext::cpu
