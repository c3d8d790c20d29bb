// Inverted dropout with a counter-based mask (the CPU kernel of galerkin_ext::dropout).
//
// Each element of x is kept with probability 1 - p and then scaled by 1 / (1 - p). The decision
// is a pure function of (seed, i), i the element's place in memory in the output's layout,
// torch.empty_like(x)'s (x's own when x is dense: any permutation of a contiguous one), by the
// Threefry mask of threefry.h. So the backward regenerates the forward's mask from the seed
// instead of storing it (given the gradient in the output's layout), and results do not depend
// on the thread count.
//
// Why not torch's dropout: its CPU mask draws one Bernoulli per element from a sequential
// generator, ~6 ns per element on this machine's cores.
#include "threefry.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

namespace galerkin_ext::cpu {
namespace {

using threefry::kBlock;

// out[i] = x[i] · (kept ? scale : 0) for the blocks [begin, end) of n elements (a product, not a
// select, so that a dropped NaN stays NaN, as in torch's dropout).
template <typename T>
GALERKIN_EXT_THREEFRY_KERNEL void dropout_blocks(const T* x, T* out, int64_t n, int64_t begin,
                                                 int64_t end, threefry::Mask mask, T scale) {
  const uint32_t threshold = mask.threshold;
  uint32_t u[kBlock];
  for (int64_t b = begin; b < end; ++b) {
    mask.block(b, u);
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
  threefry::check_seed(seed);
  const threefry::Mask mask(seed.item<int64_t>(), p);
  // out is dense (x's layout if x is dense, else the one torch suggests for x), so it spans
  // numel() consecutive elements from its data pointer; the input is read in that layout.
  at::Tensor out = at::empty_like(x);
  const at::Tensor input = x.strides() == out.strides() ? x : at::empty_like(out).copy_(x);
  const int64_t n = input.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "galerkin_ext_dropout", [&] {
    const scalar_t scale = static_cast<scalar_t>(1.0 / (1.0 - p));
    const scalar_t* xp = input.const_data_ptr<scalar_t>();
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    // ~32 KiB of float32 per task: below that, OpenMP's wake-up costs more than it saves
    at::parallel_for(0, blocks, 128, [&](int64_t begin, int64_t end) {
      dropout_blocks<scalar_t>(xp, op, n, begin, end, mask, scale);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) { m.impl("dropout", &dropout_cpu); }

}  // namespace galerkin_ext::cpu
