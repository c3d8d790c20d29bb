// Softmax attention with a key bias and dropout, fused (the CPU kernels of
// galerkin_ext::softmax_attention and its backward): per (batch, head)
//
//   out = (P ∘ D) V,  P = softmax(scale Q Kᵀ + b) over the keys,
//
// b a bias per key (continuum attention's log quadrature weights; -inf removes a key) and D as
// in pairwise_cpu.h, so the result is `dropout(softmax(scale q @ k.mT + b)) @ v` with the
// dropout op's mask, up to rounding. As in quadratic_cpu.cpp a block of query rows forms its
// rows of the N × M matrix in a buffer that stays in cache; the block holds whole rows, so each
// row's softmax is exact (maximum and sum over all M keys). The forward keeps
// lse = max + log(sum) per row, from which the backward forms the probabilities again,
// P = exp(scale Q Kᵀ + b - lse). Its formulas, with dP = (dO Vᵀ) ∘ D:
//
//   dV = (P ∘ D)ᵀ dO,  dS = P ∘ (dP - δ) with δ_i = Σ_j P_ij dP_ij = dO_i · out_i,
//   dQ = scale dS K,   dK = scale dSᵀ Q,   db = Σ over heads and queries of dS.
//
// PyTorch's CPU attention with dropout forms the whole matrix and draws torch's mask element
// by element; its fused kernel has no dropout. The exponential is this file's own (vectorised,
// the same bits on every instruction set). Each output element is a sum in a fixed order (the
// backward's key-side ones over chunks of query blocks fixed by the sizes, pairwise_cpu.h), so
// results do not depend on the thread count.
#include "cpu_clones.h"
#include "pairwise_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#if GALERKIN_EXT_X86_CLONES
#define GALERKIN_EXT_ROW_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define GALERKIN_EXT_ROW_KERNEL __attribute__((flatten))
#endif

// The vector helpers below take and return 32-byte vectors, which GCC warns changes the calling
// convention without AVX; they are inlined into the kernels, so no call passes one.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace galerkin_ext::cpu {
namespace {

// 32-byte vectors of T (GCC's vector extension, which clang shares) and the constants of exp:
// x = n ln 2 + r with n = round(x / ln 2), |r| <= ln 2 / 2, ln 2 split in two so that n ln2_hi
// is exact; exp(r) by its Taylor polynomial of a degree whose remainder is below half an ulp;
// 2^n assembled in the exponent bits.
template <typename T>
struct Simd;

template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
  static constexpr int kLanes = 8;
  static constexpr float kRound = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693145751953125f;
  static constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  static constexpr float kLowest = -87.3365447505531f;  // ln 2^-126, the least normal's log
  static constexpr uint32_t kExponentBias = 127, kMantissaBits = 23;
  static constexpr int kDegree = 7;  // |r|^8 / 8! < 5.3e-9
};

template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(32)));
  typedef uint64_t U __attribute__((vector_size(32)));
  static constexpr int kLanes = 4;
  static constexpr double kRound = 6755399441055744.0;  // 1.5 · 2^52
  static constexpr double kLog2e = 1.4426950408889634074;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kLowest = -708.39641853226410622;  // ln 2^-1022
  static constexpr uint64_t kExponentBias = 1023, kMantissaBits = 52;
  static constexpr int kDegree = 13;  // |r|^14 / 14! < 4.2e-18
};

template <typename T>
using Vec = typename Simd<T>::V;

template <typename T>
inline Vec<T> load(const T* x) {
  Vec<T> v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

template <typename T>
inline void store(T* x, Vec<T> v) {
  std::memcpy(x, &v, sizeof v);
}

// Lanes [0, len) of x, the others `fill` (a row's last, partial vector).
template <typename T>
inline Vec<T> load_partial(const T* x, int64_t len, T fill) {
  T buf[Simd<T>::kLanes];
  for (int l = 0; l < Simd<T>::kLanes; ++l) buf[l] = l < len ? x[l] : fill;
  return load(buf);
}

template <typename T>
inline void store_partial(T* x, int64_t len, Vec<T> v) {
  T buf[Simd<T>::kLanes];
  store(buf, v);
  std::copy(buf, buf + len, x);
}

// Where mask (a comparison's all-ones lanes), a; elsewhere b.
template <typename T>
inline Vec<T> select(Vec<T> mask, Vec<T> a, Vec<T> b) {
  using U = typename Simd<T>::U;
  return (Vec<T>)(((U)mask & (U)a) | (~(U)mask & (U)b));
}

template <typename T>
inline T lane_sum(Vec<T> v) {
  T sum = v[0];
  for (int l = 1; l < Simd<T>::kLanes; ++l) sum += v[l];
  return sum;
}

// 1 / j!, rounded once (j! is exact in double up to 18!).
template <typename T>
constexpr T inverse_factorial(int j) {
  double factorial = 1;
  for (int i = 2; i <= j; ++i) factorial *= i;
  return static_cast<T>(1.0 / factorial);
}

// exp(x) for x <= 0 (NaN stays NaN; below the least normal's log, 0, which is within that
// value of the true one: in a softmax, nothing against the row's largest term, 1).
template <typename T>
inline Vec<T> exp_nonpositive(Vec<T> x) {
  using S = Simd<T>;
  using U = typename S::U;
  const Vec<T> t = x * S::kLog2e + S::kRound;  // kRound + n, exactly, n = round(x log2 e)
  const Vec<T> n = t - S::kRound;
  const Vec<T> r = (x - n * S::kLn2Hi) - n * S::kLn2Lo;
  Vec<T> poly = Vec<T>{} + inverse_factorial<T>(S::kDegree);
  for (int j = S::kDegree - 1; j >= 0; --j) poly = poly * r + inverse_factorial<T>(j);
  // t's bits are kRound's plus n: n + bias in the exponent field is 2^n
  const U exponent = ((U)t - (U)(Vec<T>{} + S::kRound) + S::kExponentBias) << S::kMantissaBits;
  const Vec<T> y = poly * (Vec<T>)exponent;
  return (Vec<T>)((U)y & ~(U)(x < S::kLowest));
}

// x[j] = scale x[j] + bias[j] (no bias where bias is null) for j < m; returns their maximum,
// NaN aside (which then reaches the row through its exponential), if kTop (the backward has
// the forward's log-sum-exp instead).
template <typename T, bool kTop = true>
GALERKIN_EXT_ROW_KERNEL T logits_row(T* x, const T* bias, T scale, int64_t m) {
  constexpr int L = Simd<T>::kLanes;
  const T lowest = -std::numeric_limits<T>::infinity();
  Vec<T> top = Vec<T>{} + lowest;
  int64_t j = 0;
  for (; j + L <= m; j += L) {
    Vec<T> v = load(x + j) * scale;
    if (bias != nullptr) v += load(bias + j);
    store(x + j, v);
    if constexpr (kTop) top = select<T>((Vec<T>)(v > top), v, top);
  }
  if (j < m) {
    Vec<T> v = load_partial(x + j, m - j, lowest) * scale;
    if (bias != nullptr) v += load_partial(bias + j, m - j, T(0));
    store_partial(x + j, m - j, v);
    if constexpr (kTop) top = select<T>((Vec<T>)(v > top), v, top);
  }
  if constexpr (!kTop) return T(0);
  T result = top[0];
  for (int l = 1; l < L; ++l) result = top[l] > result ? top[l] : result;
  return result;
}

// x[j] = exp(x[j] - shift) for j < m (x[j] <= shift); returns their sum.
template <typename T>
GALERKIN_EXT_ROW_KERNEL T exp_row(T* x, T shift, int64_t m) {
  constexpr int L = Simd<T>::kLanes;
  Vec<T> sum = Vec<T>{};
  int64_t j = 0;
  for (; j + L <= m; j += L) {
    const Vec<T> e = exp_nonpositive<T>(load(x + j) - shift);
    store(x + j, e);
    sum += e;
  }
  if (j < m) {
    const T lowest = -std::numeric_limits<T>::infinity();
    const Vec<T> e = exp_nonpositive<T>(load_partial(x + j, m - j, lowest) - shift);
    store_partial(x + j, m - j, e);
    sum += e;  // (0 in the lanes past m)
  }
  return lane_sum<T>(sum);
}

// Checks q, k, v, p and seed (pairwise_cpu.h), bias: undefined, or (B, M) in q's dtype, and
// the logits' scale: finite.
PairwiseSizes check_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& bias, double scale, double p,
                             const at::Tensor& seed) {
  const PairwiseSizes z = check_pairwise_operands(q, k, v, p, seed);
  TORCH_CHECK(std::isfinite(scale), "scale: expected a finite float, got ", scale);
  if (bias.has_value()) {
    TORCH_CHECK(bias->sizes() == at::IntArrayRef({q.size(0), z.m}) &&
                    bias->scalar_type() == q.scalar_type() && bias->device().is_cpu(),
                "bias: expected ", q.scalar_type(), " of shape (", q.size(0), ", ", z.m,
                ") on the CPU, got ", bias->scalar_type(), " ", bias->sizes(), " on ",
                bias->device());
  }
  return z;
}

std::tuple<at::Tensor, at::Tensor> softmax_attention_cpu(const at::Tensor& q,
                                                         const at::Tensor& k,
                                                         const at::Tensor& v,
                                                         const std::optional<at::Tensor>& bias,
                                                         double scale, double p,
                                                         const at::Tensor& seed) {
  const PairwiseSizes z = check_operands(q, k, v, bias, scale, p, seed);
  const int64_t heads = q.size(1);
  at::Tensor out = at::empty({q.size(0), heads, z.n, z.dv}, q.options());
  at::Tensor lse = at::empty({q.size(0), heads, z.n}, q.options());
  if (lse.numel() == 0) return {out, lse};
  if (z.m == 0) return {out.zero_(), lse.fill_(-std::numeric_limits<double>::infinity())};
  const threefry::Mask mask = pairwise_mask(seed, p);
  const at::Tensor qc = q.contiguous(), vc = v.contiguous();
  const at::Tensor kt = k.transpose(2, 3).contiguous();  // (B, H, d, M): Q Kᵀ's right factor
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "galerkin_ext_softmax_attention", [&] {
    using T = scalar_t;
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
    const T logit_scale = static_cast<T>(scale);
    const int64_t rows_per_block = block_rows<T>(z.m);
    const int64_t blocks = (z.n + rows_per_block - 1) / rows_per_block;
    const T* qp = qc.const_data_ptr<T>();
    const T* ktp = kt.const_data_ptr<T>();
    const T* vp = vc.const_data_ptr<T>();
    const T* bp = bc.defined() ? bc.const_data_ptr<T>() : nullptr;
    T* op = out.mutable_data_ptr<T>();
    T* lp = lse.mutable_data_ptr<T>();
    at::parallel_for(0, z.batch_heads * blocks, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> s(rows_per_block * z.m), inverse_sum(rows_per_block);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t bh = task / blocks, i0 = task % blocks * rows_per_block;
        const int64_t rows = std::min(rows_per_block, z.n - i0);
        const int64_t row = bh * z.n + i0;  // the block's first row of the (B H N) rows
        const T* b = bp == nullptr ? nullptr : bp + bh / heads * z.m;
        rows_times_matrix<T>(qp + row * z.d, z.d, ktp + bh * z.d * z.m, z.m, rows, z.d, z.m,
                             s.data(), z.m);
        // exp(logit - max) per row; the division by the row's sum waits for the d_v outputs
        for (int64_t r = 0; r < rows; ++r) {
          T* x = s.data() + r * z.m;
          const T top = logits_row<T>(x, b, logit_scale, z.m);
          const T sum = exp_row<T>(x, top, z.m);
          inverse_sum[r] = T(1) / sum;
          lp[row + r] = top + std::log(sum);
        }
        if (p > 0.0) drop<T>(mask, keep_scale, row * z.m, rows * z.m, s.data(), nullptr);
        T* o = op + row * z.dv;
        rows_times_matrix<T>(s.data(), z.m, vp + bh * z.m * z.dv, z.dv, rows, z.m, z.dv, o,
                             z.dv);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < z.dv; ++c) o[r * z.dv + c] *= inverse_sum[r];
        }
      }
    });
  });
  return {out, lse};
}

// ds[j] = P[j] (ds[j] - delta) for j < m, and grad_bias[j] += ds[j] where grad_bias is given.
template <typename T>
GALERKIN_EXT_ROW_KERNEL void logit_grad_row(const T* probs, T* ds, T delta, T* grad_bias,
                                            int64_t m) {
  for (int64_t j = 0; j < m; ++j) ds[j] = probs[j] * (ds[j] - delta);
  if (grad_bias != nullptr) {
    for (int64_t j = 0; j < m; ++j) grad_bias[j] += ds[j];
  }
}

std::vector<at::Tensor> softmax_attention_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& bias, const at::Tensor& out, const at::Tensor& lse,
    double scale, double p, const at::Tensor& seed) {
  const PairwiseSizes z = check_operands(q, k, v, bias, scale, p, seed);
  check_grad_out(grad_out, q, z);
  TORCH_CHECK(out.sizes() == grad_out.sizes() && out.scalar_type() == q.scalar_type(),
              "out: expected the forward's output, ", q.scalar_type(), " of shape ",
              grad_out.sizes(), ", got ", out.scalar_type(), " ", out.sizes());
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({q.size(0), q.size(1), z.n}) &&
                  lse.scalar_type() == q.scalar_type(),
              "lse: expected the forward's, ", q.scalar_type(), " of shape (", q.size(0), ", ",
              q.size(1), ", ", z.n, "), got ", lse.scalar_type(), " ", lse.sizes());
  const int64_t heads = q.size(1);
  at::Tensor grad_q = at::zeros_like(q, at::MemoryFormat::Contiguous);
  at::Tensor grad_k = at::zeros_like(k, at::MemoryFormat::Contiguous);
  at::Tensor grad_v = at::zeros_like(v, at::MemoryFormat::Contiguous);
  // the bias gradient per (batch, head), summed over the heads at the end in order
  at::Tensor grad_bias_heads = bias.has_value()
                                   ? at::zeros({q.size(0), heads, z.m}, q.options())
                                   : at::empty({0}, q.options());
  auto result = [&] {
    return std::vector<at::Tensor>{grad_q, grad_k, grad_v,
                                   bias.has_value() ? grad_bias_heads.sum(1) : grad_bias_heads};
  };
  if (z.batch_heads * z.n * z.m == 0) return result();
  const threefry::Mask mask = pairwise_mask(seed, p);
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), gc = grad_out.contiguous();
  const at::Tensor oc = out.contiguous(), lc = lse.contiguous();
  const at::Tensor kt = k.transpose(2, 3).contiguous(), vt = v.transpose(2, 3).contiguous();
  const at::Tensor bc = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "galerkin_ext_softmax_attention_backward", [&] {
    using T = scalar_t;
    const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
    const T logit_scale = static_cast<T>(scale);
    const int64_t rows_per_block = block_rows<T>(z.m);
    const T* qp = qc.const_data_ptr<T>();
    const T* kp = kc.const_data_ptr<T>();
    const T* ktp = kt.const_data_ptr<T>();
    const T* vtp = vt.const_data_ptr<T>();
    const T* gp = gc.const_data_ptr<T>();
    const T* outp = oc.const_data_ptr<T>();
    const T* lp = lc.const_data_ptr<T>();
    const T* bp = bc.defined() ? bc.const_data_ptr<T>() : nullptr;
    T* dqp = grad_q.mutable_data_ptr<T>();
    T* dkp = grad_k.mutable_data_ptr<T>();
    T* dvp = grad_v.mutable_data_ptr<T>();
    T* dbp = bp == nullptr ? nullptr : grad_bias_heads.mutable_data_ptr<T>();
    const int64_t blocks = (z.n + rows_per_block - 1) / rows_per_block;
    auto for_chunk = [&](int64_t bh, int64_t first_block, int64_t end_block, T* const* sums) {
      std::vector<T> s(rows_per_block * z.m), ds(rows_per_block * z.m);
      std::vector<T> dropped(p > 0.0 ? rows_per_block * z.m : 0);
      KeySideSum<T> sum_k(rows_per_block, z.m, z.d), sum_v(rows_per_block, z.m, z.dv);
      const T* b = bp == nullptr ? nullptr : bp + bh / heads * z.m;
      T* db = bp == nullptr ? nullptr : sums[2];
      for (int64_t block = first_block; block < end_block; ++block) {
        const int64_t i0 = block * rows_per_block, rows = std::min(rows_per_block, z.n - i0);
        const int64_t row = bh * z.n + i0;
        // P on the block's rows, from the forward's lse; dO Vᵀ
        rows_times_matrix<T>(qp + row * z.d, z.d, ktp + bh * z.d * z.m, z.m, rows, z.d, z.m,
                             s.data(), z.m);
        for (int64_t r = 0; r < rows; ++r) {
          logits_row<T, false>(s.data() + r * z.m, b, logit_scale, z.m);
          exp_row<T>(s.data() + r * z.m, lp[row + r], z.m);
        }
        rows_times_matrix<T>(gp + row * z.dv, z.dv, vtp + bh * z.dv * z.m, z.m, rows, z.dv, z.m,
                             ds.data(), z.m);
        // P ∘ D (for dV) and dP = dO Vᵀ ∘ D
        const T* kept = s.data();
        if (p > 0.0) {
          std::copy(s.begin(), s.begin() + rows * z.m, dropped.begin());
          drop<T>(mask, keep_scale, row * z.m, rows * z.m, dropped.data(), ds.data());
          kept = dropped.data();
        }
        sum_v.add(kept, gp + row * z.dv, z.dv, rows, block == first_block, sums[1]);
        // dS = P ∘ (dP - δ), δ_i = dO_i · out_i; the bias gradient sums it over the rows
        for (int64_t r = 0; r < rows; ++r) {
          const T* g = gp + (row + r) * z.dv;
          const T* o = outp + (row + r) * z.dv;
          T delta = 0;
          for (int64_t c = 0; c < z.dv; ++c) delta += g[c] * o[c];
          logit_grad_row<T>(s.data() + r * z.m, ds.data() + r * z.m, delta, db, z.m);
        }
        // dQ = scale dS K; dK += dSᵀ Q over the chunk's blocks in order (times scale below)
        T* dq = dqp + row * z.d;
        rows_times_matrix<T>(ds.data(), z.m, kp + bh * z.m * z.d, z.d, rows, z.m, z.d, dq, z.d);
        for (int64_t e = 0; e < rows * z.d; ++e) dq[e] *= logit_scale;
        sum_k.add(ds.data(), qp + row * z.d, z.d, rows, block == first_block, sums[0]);
      }
    };
    std::vector<T*> gradients{dkp, dvp};
    std::vector<int64_t> sizes{z.m * z.d, z.m * z.dv};
    if (dbp != nullptr) {
      gradients.push_back(dbp);
      sizes.push_back(z.m);
    }
    run_backward_chunks<T>(z.batch_heads, blocks, gradients, sizes, for_chunk);
    at::parallel_for(0, z.batch_heads * z.m * z.d, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) dkp[e] *= logit_scale;
    });
  });
  return result();
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) {
  m.impl("softmax_attention", &softmax_attention_cpu);
  m.impl("softmax_attention_backward", &softmax_attention_backward_cpu);
}

}  // namespace galerkin_ext::cpu
