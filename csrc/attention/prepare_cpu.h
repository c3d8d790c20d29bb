// The CPU row maps (attention.h's OperandSpec): one prepared row and its backward (inline), and
// the same over a range of rows (prepare_rows, prepare_rows_backward), compiled for several
// instruction sets in prepare_cpu.cpp. Used by the CPU twins of the op core through
// chunks_cpu.h.
#pragma once

#include "attention.h"
#include "cpu_clones.h"
#include "norm_stats.h"

#include <ATen/OpMathType.h>

#include <ATen/ops/empty.h>
#include <c10/core/alignment.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

// The CPU kernels are cloned for AVX-512 and AVX2 machines, picked at load time (the build itself
// targets the baseline x86-64), so their loops vectorise at the machine's width: compiled for
// x86-64-v4, building the chunks at the Burgers shape on this 2-core AMD EPYC took 1.7-1.9 ms per
// thread against 2.8-3.2 ms for baseline x86-64. `flatten` inlines the row functions into every
// clone.
#if GALERKIN_EXT_X86_CLONES
#define GALERKIN_EXT_CPU_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define GALERKIN_EXT_CPU_KERNEL __attribute__((flatten))
#endif

namespace galerkin_ext::cpu {

// Scratch for the kernels. The vectorised row sums group their terms by the alignment of the
// buffer they run over (with the AVX-512 clones), so scratch that moved from call to call, as a
// std::vector does, would change results in the last bits. c10's CPU allocator aligns every
// buffer to gAlignment.
static_assert(c10::gAlignment >= 64, "galerkin_ext: scratch must be 64-byte aligned");

template <typename T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(int64_t n)
      : storage_(at::empty({std::max<int64_t>(n, 1)},
                           at::dtype(c10::CppTypeToScalarType<T>::value))) {}
  T* data() const { return storage_.template mutable_data_ptr<T>(); }

 private:
  at::Tensor storage_;
};

// Raw pointers and strides of one OperandSpec, resolved once per call.
template <typename scalar_t>
struct Rows {
  int64_t B, H, N, D, P;
  int64_t sb, sh, sn, sd;  // strides of x
  const scalar_t* x;
  const scalar_t* pos;     // null when there are no coordinates
  int64_t pos_sb;          // 0 when pos is shared over the batch
  const scalar_t* weight;  // null when uniform
  int64_t weight_sb;       // 0 when the weight is shared over the batch
  bool weighted;
  const scalar_t* gamma;   // null when the operand has no norm
  const scalar_t* beta;
  bool softmax;            // rows are softmax([pos | x]) (then gamma is null)

  explicit Rows(const OperandSpec& s)
      : B(s.x.size(0)), H(s.x.size(1)), N(s.x.size(2)), D(s.x.size(3)),
        P(s.pos ? s.pos->size(-1) : 0),
        sb(s.x.stride(0)), sh(s.x.stride(1)), sn(s.x.stride(2)), sd(s.x.stride(3)),
        x(s.x.const_data_ptr<scalar_t>()),
        pos(s.pos ? s.pos->const_data_ptr<scalar_t>() : nullptr),
        pos_sb(s.pos && s.pos->dim() == 3 ? N * P : 0),
        weight(s.weighted && s.weight ? s.weight->const_data_ptr<scalar_t>() : nullptr),
        weight_sb(s.weight && s.weight->dim() == 2 ? N : 0),
        weighted(s.weighted),
        gamma(s.norm_weight ? s.norm_weight->const_data_ptr<scalar_t>() : nullptr),
        beta(s.norm_bias ? s.norm_bias->const_data_ptr<scalar_t>() : nullptr),
        softmax(s.softmax) {}

  // Copies row (b, h, n) of x into dst, converted to the accumulation type.
  template <typename acc_t>
  void load(int64_t b, int64_t h, int64_t n, acc_t* dst) const {
    const scalar_t* src = x + b * sb + h * sh + n * sn;
    if (sd == 1) {
      for (int64_t j = 0; j < D; ++j) dst[j] = acc_t(src[j]);
    } else {
      for (int64_t j = 0; j < D; ++j) dst[j] = acc_t(src[j * sd]);
    }
  }
  template <typename acc_t>
  acc_t scale(int64_t b, int64_t n) const {
    if (!weighted) return acc_t(1);
    return weight ? acc_t(weight[b * weight_sb + n]) : acc_t(1) / acc_t(N);
  }
};

// exp(x) for x <= 0 (as in a softmax, x = z - max z), written so that the row loops vectorise.
// glibc's scalar exp does not: with it, normalised attention at the Burgers shape ran at 0.71x
// the eager formula's speed (fwd+bwd), with this one at 1.56x (benchmarks/attention.py, runs of
// 3 repetitions before and after). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, the
// Taylor polynomial of e^r in Horner form, one multiply-add a degree (degree 7 for float, 13 for
// double: truncation below half an ulp), and 2^n from its exponent bits. Results below the
// smallest normal number become 0; NaN stays NaN, without converting a NaN n to an integer
// (undefined behaviour, found by UBSan).
template <typename T>
inline T exp_nonpositive(T x) {
  constexpr bool is_float = sizeof(T) == 4;
  using Bits = std::conditional_t<is_float, int32_t, int64_t>;
  constexpr T kLowest = is_float ? T(-87.3) : T(-708.3);  // e^kLowest > smallest normal
  constexpr T kLog2e = T(1.4426950408889634074);
  constexpr T kLn2Hi = is_float ? T(0.693359375) : T(6.93145751953125E-1);
  constexpr T kLn2Lo = is_float ? T(-2.12194440e-4) : T(1.42860682030941723212E-6);
  constexpr int kDegree = is_float ? 7 : 13;
  constexpr int kMantissa = is_float ? 23 : 52;
  constexpr Bits kBias = is_float ? 127 : 1023;
  // 1 / i!
  constexpr T kCoefficient[14] = {
      T(1.0), T(1.0), T(0.5), T(1.0 / 6), T(1.0 / 24), T(1.0 / 120), T(1.0 / 720),
      T(1.0 / 5040), T(1.0 / 40320), T(1.0 / 362880), T(1.0 / 3628800), T(1.0 / 39916800),
      T(1.0 / 479001600), T(1.0 / 6227020800.0)};
  const T clamped = x < kLowest ? kLowest : x;  // NaN passes through (the comparison is false)
  const T n = std::floor(clamped * kLog2e + T(0.5));
  const T r = clamped - n * kLn2Hi - n * kLn2Lo;
  T p = kCoefficient[kDegree];
  for (int i = kDegree - 1; i >= 0; --i) p = p * r + kCoefficient[i];
  // n is outside the exponent range only for NaN (or x = +inf, outside x <= 0), which this
  // max/min (in the order that vectorises to maxps/minps) maps into it; p carries the NaN
  const T in_range = std::min(std::max(T(1 - kBias), n), T(kBias));
  const Bits bits = (static_cast<Bits>(in_range) + kBias) << kMantissa;
  T scale;
  std::memcpy(&scale, &bits, sizeof(T));
  return x < kLowest ? T(0) : p * scale;
}

// max |row[j]|, found on the bit patterns: an unsigned max vectorises where a float max (with
// its NaN rules) does not. Magnitudes order like their bit patterns; a NaN, above infinity,
// comes out as NaN.
template <typename acc_t>
acc_t max_magnitude(const acc_t* row, int64_t n) {
  using Bits = std::conditional_t<sizeof(acc_t) == 4, uint32_t, uint64_t>;
  constexpr Bits kMagnitude = ~(Bits(1) << (8 * sizeof(Bits) - 1));
  Bits top = 0;
  for (int64_t j = 0; j < n; ++j) {
    Bits bits;
    std::memcpy(&bits, row + j, sizeof bits);
    top = std::max(top, Bits(bits & kMagnitude));
  }
  acc_t max_abs;
  std::memcpy(&max_abs, &top, sizeof max_abs);
  return max_abs;
}

// max row[j] (n >= 1), found on integer keys that order like the values (a negative value's
// magnitude bits flipped): an integer max vectorises where a float max, with its NaN rules, does
// not (a scalar max chain was a quarter of building softmax rows 97 wide). A NaN may or may not
// come out; a softmax row holding one is NaN either way, through exp(NaN - max).
template <typename acc_t>
acc_t row_max(const acc_t* row, int64_t n) {
  using Key = std::conditional_t<sizeof(acc_t) == 4, int32_t, int64_t>;
  constexpr int kSignShift = 8 * sizeof(Key) - 1;
  constexpr Key kMagnitude = std::numeric_limits<Key>::max();
  Key top = std::numeric_limits<Key>::min();
  for (int64_t j = 0; j < n; ++j) {
    Key key;
    std::memcpy(&key, row + j, sizeof key);
    top = std::max(top, Key(key ^ ((key >> kSignShift) & kMagnitude)));
  }
  top ^= (top >> kSignShift) & kMagnitude;  // the key's own inverse
  acc_t max;
  std::memcpy(&max, &top, sizeof max);
  return max;
}

template <typename acc_t>
struct RowStats {
  // The norm's (mean, rstd); (0, 1) for an operand without a norm; the softmax's
  // (max, 1 / Σ exp(z - max)).
  acc_t mean, rstd;
};

// z = [pos | x] of row (b, h, n) into z (P + D elements).
template <typename scalar_t, typename acc_t>
void load_softmax_input(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n, acc_t* z) {
  if (r.pos) {
    const scalar_t* p = r.pos + b * r.pos_sb + n * r.P;
    for (int64_t j = 0; j < r.P; ++j) z[j] = acc_t(p[j]);
  }
  r.load(b, h, n, z + r.P);
}

// Writes the prepared row (b, h, n) to out[0, P + D): [s·pos | s·LN_h(x)], or
// [s·softmax([pos | x])] for a softmax operand, s the row scale. `row` is P + D elements of
// scratch. Returns the row map's statistics.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
RowStats<acc_t> prepare_row(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n,
                            acc_t eps, acc_t* row, scalar_t* out) {
  const acc_t s = r.template scale<acc_t>(b, n);
  if (r.softmax) {
    const int64_t width = r.P + r.D;
    load_softmax_input(r, b, h, n, row);
    const acc_t top = row_max(row, width);
    acc_t sum = 0;
    for (int64_t j = 0; j < width; ++j) {
      row[j] = exp_nonpositive(row[j] - top);
      sum += row[j];
    }
    const acc_t inv = acc_t(1) / sum, factor = inv * s;
    for (int64_t j = 0; j < width; ++j) out[j] = static_cast<scalar_t>(row[j] * factor);
    return {top, inv};
  }
  r.load(b, h, n, row);
  if (r.pos) {
    const scalar_t* p = r.pos + b * r.pos_sb + n * r.P;
    for (int64_t j = 0; j < r.P; ++j) out[j] = static_cast<scalar_t>(acc_t(p[j]) * s);
  }
  out += r.P;
  if (!r.gamma) {
    for (int64_t j = 0; j < r.D; ++j) out[j] = static_cast<scalar_t>(row[j] * s);
    return {acc_t(0), acc_t(1)};
  }
  // Passes over a row that stays in cache: its scale, the mean, then the centred sums, which
  // also correct the mean (norm_stats.h).
  const acc_t sc = galerkin_ext::norm_scale(max_magnitude(row, r.D));
  const acc_t inv = acc_t(1) / sc;
  const acc_t inv_d = acc_t(1) / acc_t(r.D);
  acc_t sum = 0;
  for (int64_t j = 0; j < r.D; ++j) sum += row[j] * inv;
  acc_t mean = sum / acc_t(r.D) * sc;
  acc_t lin = 0, sq = 0;
  for (int64_t j = 0; j < r.D; ++j) {
    const acc_t d = (row[j] - mean) * inv;  // one value for both sums
    lin += d;
    sq += d * d;
  }
  sq = galerkin_ext::norm_recentre(lin, sq, sc, inv_d, mean);
  const acc_t rstd = galerkin_ext::norm_rstd(sq, inv, inv_d, eps);
  const scalar_t* g = r.gamma + h * r.D;
  const scalar_t* bt = r.beta + h * r.D;
  for (int64_t j = 0; j < r.D; ++j) {
    out[j] = static_cast<scalar_t>(((row[j] - mean) * rstd * acc_t(g[j]) + acc_t(bt[j])) * s);
  }
  return {mean, rstd};
}

// Where the backward of a row adds its parameter gradients; null where not wanted.
template <typename acc_t>
struct RowGradSums {
  acc_t* grad_pos;     // pos-shaped
  acc_t* grad_weight;  // weight-shaped
  acc_t* grad_gamma;   // (H, D), present exactly when the operand has a norm
  acc_t* grad_beta;    // (H, D)
};

// Backward of a softmax row (prepare_row): y = softmax(z), z = [pos | x], prepared row s·y.
template <typename scalar_t, typename acc_t>
void softmax_row_backward(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n,
                          RowStats<acc_t> st, const scalar_t* grad, scalar_t* dx, acc_t* y,
                          acc_t* dz, const RowGradSums<acc_t>& sums) {
  const int64_t width = r.P + r.D;
  load_softmax_input(r, b, h, n, y);
  acc_t dot = 0;  // Σ grad_j y_j
  for (int64_t j = 0; j < width; ++j) {
    y[j] = exp_nonpositive(y[j] - st.mean) * st.rstd;
    dot += acc_t(grad[j]) * y[j];
  }
  const acc_t s = r.template scale<acc_t>(b, n);
  if (sums.grad_weight) sums.grad_weight[b * r.weight_sb + n] += dot;
  // dz = y ∘ (s·grad − s·⟨grad, y⟩)
  for (int64_t j = 0; j < width; ++j) dz[j] = y[j] * s * (acc_t(grad[j]) - dot);
  if (sums.grad_pos) {
    acc_t* gp = sums.grad_pos + b * r.pos_sb + n * r.P;
    for (int64_t j = 0; j < r.P; ++j) gp[j] += dz[j];
  }
  for (int64_t j = 0; j < r.D; ++j) dx[j] = static_cast<scalar_t>(dz[r.P + j]);
}

// Backward of prepare_row. `grad` (ld elements) is the gradient w.r.t. the prepared row; the
// gradient w.r.t. x is written to dx (D elements), which may alias grad + P: grad is read whole
// first. `xhat` and `dy` are P + D elements of scratch each.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
void prepare_row_backward(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n,
                          RowStats<acc_t> st, const scalar_t* grad, scalar_t* dx, acc_t* xhat,
                          acc_t* dy, const RowGradSums<acc_t>& sums) {
  if (r.softmax) return softmax_row_backward(r, b, h, n, st, grad, dx, xhat, dy, sums);
  const bool norm = r.gamma != nullptr;
  const scalar_t* gam = norm ? r.gamma + h * r.D : nullptr;
  const scalar_t* bet = norm ? r.beta + h * r.D : nullptr;
  const acc_t s = r.template scale<acc_t>(b, n);
  // x̂ (the normalised row, or the row itself without a norm; read only where needed: an
  // identity row without a weight gradient is a scaled copy) and dy = s · grad.
  if (norm || sums.grad_weight) {
    r.load(b, h, n, xhat);
    if (norm) {
      for (int64_t j = 0; j < r.D; ++j) xhat[j] = (xhat[j] - st.mean) * st.rstd;
    }
  }
  for (int64_t j = 0; j < r.D; ++j) dy[j] = s * acc_t(grad[r.P + j]);
  if (sums.grad_pos) {
    acc_t* gp = sums.grad_pos + b * r.pos_sb + n * r.P;
    for (int64_t j = 0; j < r.P; ++j) gp[j] += s * acc_t(grad[j]);
  }
  if (sums.grad_weight) {
    // d/dw of w · row: the unscaled row is rebuilt, as w may be zero.
    acc_t dot = 0;
    if (r.pos) {
      const scalar_t* p = r.pos + b * r.pos_sb + n * r.P;
      for (int64_t j = 0; j < r.P; ++j) dot += acc_t(grad[j]) * acc_t(p[j]);
    }
    for (int64_t j = 0; j < r.D; ++j) {
      const acc_t y = norm ? xhat[j] * acc_t(gam[j]) + acc_t(bet[j]) : xhat[j];
      dot += acc_t(grad[r.P + j]) * y;
    }
    sums.grad_weight[b * r.weight_sb + n] += dot;
  }
  if (!norm) {
    for (int64_t j = 0; j < r.D; ++j) dx[j] = static_cast<scalar_t>(dy[j]);
    return;
  }
  // dx = rstd (γ∘dy − mean(γ∘dy) − x̂ mean(γ∘dy∘x̂))
  acc_t* dgamma = sums.grad_gamma + h * r.D;
  acc_t* dbeta = sums.grad_beta + h * r.D;
  acc_t c1 = 0, c2 = 0;
  for (int64_t j = 0; j < r.D; ++j) {
    const acc_t gdy = dy[j] * acc_t(gam[j]);
    c1 += gdy;
    c2 += gdy * xhat[j];
    dgamma[j] += dy[j] * xhat[j];
    dbeta[j] += dy[j];
  }
  const acc_t inv_d = acc_t(1) / acc_t(r.D);
  c1 *= inv_d;
  c2 *= inv_d;
  for (int64_t j = 0; j < r.D; ++j) {
    dx[j] = static_cast<scalar_t>(st.rstd * (dy[j] * acc_t(gam[j]) - c1 - xhat[j] * c2));
  }
}

// Rows [n0, n0 + m) of operand (b, h), prepared into columns [0, P + D) of out (row stride ld;
// the columns beyond are left as they are), and their statistics into stats as (mean, rstd)
// pairs. `scratch`: P + D elements.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
void prepare_rows(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                  acc_t eps, acc_t* scratch, scalar_t* out, int64_t ld, acc_t* stats);

// Backward of prepare_rows: grad (row stride ld) holds the gradients w.r.t. the prepared rows,
// stats their (mean, rstd) pairs; grad_x rows go to dx (row stride ldx; dx = grad + P with
// ldx = ld works in place). `xhat`, `dy`: P + D elements each.
template <typename scalar_t, typename acc_t = at::opmath_type<scalar_t>>
void prepare_rows_backward(const Rows<scalar_t>& r, int64_t b, int64_t h, int64_t n0, int64_t m,
                           const acc_t* stats, const scalar_t* grad, int64_t ld, scalar_t* dx,
                           int64_t ldx, acc_t* xhat, acc_t* dy, const RowGradSums<acc_t>& sums);

}  // namespace galerkin_ext::cpu
