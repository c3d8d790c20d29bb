// The counter-based mask of galerkin_ext's CPU dropout, shared by the dropout op
// (dropout_cpu.cpp) and the fused pairwise attention ops (attention/pairwise_cpu.h), which
// drop the entries of their N × M matrix exactly as the dropout op drops that matrix stored
// contiguously.
//
// Element i of a dense tensor, in memory order, is kept iff word w of Threefry-2x32-20
// (Salmon et al. 2011, the generator JAX uses) at counter c, with key = the seed's two 32-bit
// halves (low first), is below floor((1 - p) 2^32), for i = 64 b + 32 w + l, c = 32 b + l
// (0 <= l < 32). Its rounds are adds, rotations and xors, which vectorise on every instruction
// set (32 counters at a time here).
#pragma once

#include "../attention/cpu_clones.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if GALERKIN_EXT_X86_CLONES
#define GALERKIN_EXT_THREEFRY_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define GALERKIN_EXT_THREEFRY_KERNEL __attribute__((flatten))
#endif

namespace galerkin_ext::cpu::threefry {

// Counters per block: 4 vectors of 8 words; a block covers kBlock = 2 kCounters elements.
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
inline void one_round(Words* x0, Words* x1) {
  for (int v = 0; v < kVectors; ++v) {
    x0[v] += x1[v];
    x1[v] = rotate_left<R>(x1[v]) ^ x0[v];
  }
}

// Four rounds, rotating by R0 .. R3.
template <int R0, int R1, int R2, int R3>
inline void four_rounds(Words* x0, Words* x1) {
  one_round<R0>(x0, x1);
  one_round<R1>(x0, x1);
  one_round<R2>(x0, x1);
  one_round<R3>(x0, x1);
}

// Key injection s after rounds 4 s: k[s mod 3] onto word 0, k[(s + 1) mod 3] + s onto word 1.
inline void inject(Words* x0, Words* x1, uint32_t a, uint32_t b) {
  for (int v = 0; v < kVectors; ++v) {
    x0[v] += a;
    x1[v] += b;
  }
}

// The key and the keep threshold of a seed and a drop probability p in (0, 1).
struct Mask {
  uint32_t k0, k1, threshold;

  Mask(int64_t seed, double p)
      : k0(static_cast<uint32_t>(static_cast<uint64_t>(seed))),
        k1(static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32)),
        // P(kept) = min(floor(keep 2^32), 2^32 - 1) / 2^32, within 2^-32 of keep. (keep = 1 - p
        // rounds to 1 for p <= 2^-54, and 2^32 as a uint32_t, undefined, dropped everything.)
        threshold(static_cast<uint32_t>(
            std::min(std::floor(std::ldexp(1.0 - p, 32)), 4294967295.0))) {}

  // The kBlock words of block b: element kBlock b + e takes words[e].
  inline void block(int64_t b, uint32_t* words) const {
    // Counters kCounters b + i, i < kCounters, share one high word, as kCounters divides 2^32;
    // the low words are formed as vectors (set lane by lane, GCC left them scalar).
    const uint64_t first = static_cast<uint64_t>(b) * kCounters;
    const uint32_t low = static_cast<uint32_t>(first), high = static_cast<uint32_t>(first >> 32);
    const uint32_t k2 = 0x1BD11BDAu ^ k0 ^ k1;
    const Words lanes = {0, 1, 2, 3, 4, 5, 6, 7};
    static_assert(kLanes == 8, "lanes lists kLanes counters");
    Words x0[kVectors], x1[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      x0[v] = lanes + (low + static_cast<uint32_t>(v * kLanes) + k0);
      x1[v] = Words{} + (high + k1);
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
    std::memcpy(words, x0, sizeof x0);
    std::memcpy(words + kCounters, x1, sizeof x1);
  }
};

// The seed argument of the ops that draw these masks: a 0-dim int64 CPU tensor.
inline void check_seed(const at::Tensor& seed) {
  TORCH_CHECK(seed.dim() == 0 && seed.scalar_type() == at::kLong && seed.device().is_cpu(),
              "seed: expected a 0-dim int64 CPU tensor, got ", seed.scalar_type(), " ",
              seed.sizes(), " on ", seed.device());
}

}  // namespace galerkin_ext::cpu::threefry
