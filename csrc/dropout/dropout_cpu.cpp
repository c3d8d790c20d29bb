// Inverted dropout with a counter-based mask (the CPU kernel of galerkin_ext::dropout).
//
// Each element of x is kept with probability 1 - p and then scaled by 1 / (1 - p). The decision
// is a pure function of (seed, i), i the element's place in memory in the output's layout,
// torch.empty_like(x)'s (x's own when x is dense: any permutation of a contiguous one): word w of
// Threefry-2x32-20 (Salmon et al. 2011, the generator JAX uses) at counter c with key = the
// seed's two 32-bit halves (low first), for i = 64 b + 32 w + l, c = 32 b + l (0 <= l < 32),
// kept iff the word < floor((1 - p) 2^32). So the backward regenerates the forward's mask from
// the seed instead of storing it (given the gradient in the output's layout), and results do
// not depend on the thread count.
//
// Why not torch's dropout: its CPU mask draws one Bernoulli per element from a sequential
// generator, ~6 ns per element on this machine's cores; Threefry's rounds are adds, rotations and
// xors, which vectorise on every instruction set (32 counters at a time here).
#include "../attention/cpu_clones.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if GALERKIN_EXT_X86_CLONES
#define GALERKIN_EXT_DROPOUT_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define GALERKIN_EXT_DROPOUT_KERNEL __attribute__((flatten))
#endif

namespace galerkin_ext::cpu {
namespace {

// Counters per block: 4 vectors of 8 words; a block covers 2 kCounters elements.
constexpr int kLanes = 8;
constexpr int kVectors = 4;
constexpr int kCounters = kLanes * kVectors;
constexpr int64_t kBlock = 2 * kCounters;

typedef uint32_t Words __attribute__((vector_size(4 * kLanes)));

template <int R>
inline Words rotate_left(Words x) {
  return (x << R) | (x >> (32 - R));
}

// One Threefry-2x32 round on every vector.
template <int R>
inline void threefry_round(Words* x0, Words* x1) {
  for (int v = 0; v < kVectors; ++v) {
    x0[v] += x1[v];
    x1[v] = rotate_left<R>(x1[v]) ^ x0[v];
  }
}

// Four rounds, rotating by R0 .. R3.
template <int R0, int R1, int R2, int R3>
inline void four_rounds(Words* x0, Words* x1) {
  threefry_round<R0>(x0, x1);
  threefry_round<R1>(x0, x1);
  threefry_round<R2>(x0, x1);
  threefry_round<R3>(x0, x1);
}

// Key injection s after rounds 4 s: k[s mod 3] onto word 0, k[(s + 1) mod 3] + s onto word 1.
inline void inject(Words* x0, Words* x1, uint32_t a, uint32_t b) {
  for (int v = 0; v < kVectors; ++v) {
    x0[v] += a;
    x1[v] += b;
  }
}

// Threefry-2x32-20 at counters first .. first + kCounters - 1 (64-bit, low word first): word 0
// into x0, word 1 into x1.
inline void threefry(uint64_t first, uint32_t k0, uint32_t k1, Words* x0, Words* x1) {
  const uint32_t k2 = 0x1BD11BDAu ^ k0 ^ k1;
  for (int v = 0; v < kVectors; ++v) {
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t c = first + static_cast<uint64_t>(v * kLanes + l);
      x0[v][l] = static_cast<uint32_t>(c) + k0;
      x1[v][l] = static_cast<uint32_t>(c >> 32) + k1;
    }
  }
  four_rounds<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k1, k2 + 1);
  four_rounds<17, 29, 16, 24>(x0, x1);
  inject(x0, x1, k2, k0 + 2);
  four_rounds<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k0, k1 + 3);
  four_rounds<17, 29, 16, 24>(x0, x1);
  inject(x0, x1, k1, k2 + 4);
  four_rounds<13, 15, 26, 6>(x0, x1);
  inject(x0, x1, k2, k0 + 5);
}

// out[i] = x[i] · (kept ? scale : 0) for the blocks [begin, end) of n elements (a product, not a
// select, so that a dropped NaN stays NaN, as in torch's dropout).
template <typename T>
GALERKIN_EXT_DROPOUT_KERNEL void dropout_blocks(const T* x, T* out, int64_t n, int64_t begin,
                                                int64_t end, uint32_t k0, uint32_t k1,
                                                uint32_t threshold, T scale) {
  Words words[2][kVectors];
  uint32_t u[kBlock];
  for (int64_t b = begin; b < end; ++b) {
    threefry(static_cast<uint64_t>(b) * kCounters, k0, k1, words[0], words[1]);
    std::memcpy(u, words, sizeof u);  // element 64 b + 32 w + l takes words[w] lane l
    const int64_t first = b * kBlock;
    const int64_t count = std::min<int64_t>(kBlock, n - first);
    const T* xb = x + first;
    T* ob = out + first;
    if (count == kBlock) {
      for (int e = 0; e < kBlock; ++e) ob[e] = xb[e] * (u[e] < threshold ? scale : T(0));
    } else {
      for (int e = 0; e < count; ++e) ob[e] = xb[e] * (u[e] < threshold ? scale : T(0));
    }
  }
}

at::Tensor dropout_cpu(const at::Tensor& x, double p, const at::Tensor& seed) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "x: expected float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(p > 0.0 && p < 1.0, "p: expected 0 < p < 1, got ", p);
  TORCH_CHECK(seed.dim() == 0 && seed.scalar_type() == at::kLong && seed.device().is_cpu(),
              "seed: expected a 0-dim int64 CPU tensor, got ", seed.scalar_type(), " ",
              seed.sizes(), " on ", seed.device());
  const uint64_t key = static_cast<uint64_t>(seed.item<int64_t>());
  const uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const double keep = 1.0 - p;
  // P(kept) = floor(keep 2^32) / 2^32, within 2^-32 of keep; < 2^32 as keep < 1.
  const uint32_t threshold = static_cast<uint32_t>(std::floor(std::ldexp(keep, 32)));
  // out is dense (x's layout if x is dense, else the one torch suggests for x), so it spans
  // numel() consecutive elements from its data pointer; the input is read in that layout.
  at::Tensor out = at::empty_like(x);
  const at::Tensor input = x.strides() == out.strides() ? x : at::empty_like(out).copy_(x);
  const int64_t n = input.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "galerkin_ext_dropout", [&] {
    const scalar_t scale = static_cast<scalar_t>(1.0 / keep);
    const scalar_t* xp = input.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    // ~32 KiB of float32 per task: below that, OpenMP's wake-up costs more than it saves
    at::parallel_for(0, blocks, 128, [&](int64_t begin, int64_t end) {
      dropout_blocks<scalar_t>(xp, op, n, begin, end, k0, k1, threshold, scale);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) { m.impl("dropout", &dropout_cpu); }

}  // namespace galerkin_ext::cpu
