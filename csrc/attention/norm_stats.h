// Layer-norm statistics that stay right across the whole floating-point range, shared by the
// CPU rows (prepare_cpu.h) and the CUDA rows (rows_cuda.cuh).
//
// A float32 row of magnitude 1e20 has squares of 1e40, past float32's range: the variance
// overflowed, rstd became 0 and the output silently the bias. Rows with max |x| > 1 are
// therefore summed as x / scale, scale the power of two at or below max |x|, so no partial sum
// can overflow, the scaling itself is exact, and rstd = 1 / sqrt(var + eps) is assembled without
// forming scale². Smaller rows keep scale 1 (their squares cannot overflow). Non-finite input
// still gives non-finite output.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define GALERKIN_HD __host__ __device__ __forceinline__
#else
#define GALERKIN_HD inline
#endif

namespace galerkin_ext {

// The factor rows are divided by before summing: 2^floor(log2 max |x|) above 1, else 1. The
// power of two is max |x| with its mantissa bits cleared (max |x| > 1 is a normal number), which
// saves the CPU rows two library calls (ilogb, ldexp) per row.
template <typename A>
GALERKIN_HD A norm_scale(A max_abs) {
  if (!(max_abs > A(1))) return A(1);
  using Bits = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
  constexpr Bits kExponent = sizeof(A) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  Bits bits;
  std::memcpy(&bits, &max_abs, sizeof bits);
  bits &= kExponent;
  A scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return scale;
}

// The second pass's correction of the first pass's mean (the corrected two-pass algorithm of
// Chan, Golub and LeVeque): given lin = Σ d and sq = Σ d², d = (x - mean) / scale, moves mean
// by scale · lin / D and returns Σ (d - lin / D)², the squares about the moved mean. The first
// pass's mean is off by its rounding: D copies of a constant c do not sum exactly unless D is a
// power of two, every d of a constant row was that error, and the row normalised to up to
// ±0.93 (D = 33; ±0.998 at D = 100; constants 1e3 … 2e5) instead of its bias. Moved, the mean
// of a constant row is c exactly (its d are exact, and the move's own error is far below half
// an ulp of c). The returned sum is clamped at 0, which rounding may cross for such a row.
template <typename A>
GALERKIN_HD A norm_recentre(A lin, A sq, A scale, A inv_d, A& mean) {
  const A shift = lin * inv_d;
  mean += shift * scale;
  const A centred = sq - lin * shift;
  return centred > A(0) ? centred : A(0);
}

// 1 / sqrt(var + eps) for var = sq_scaled · inv_d · scale², with
// sq_scaled = Σ ((x - mean) / scale)², inv_scale = 1 / scale and inv_d = 1 / d. scale is a power
// of two, so multiplying by inv_scale is exact, and the only division left on the row's
// dependency chain is the last one.
template <typename A>
GALERKIN_HD A norm_rstd(A sq_scaled, A inv_scale, A inv_d, A eps) {
  using std::sqrt;
  const A var = sq_scaled * inv_d;  // the variance of x / scale
  if (var == A(0)) return A(1) / sqrt(eps);  // a constant row, whatever its magnitude
  return inv_scale / sqrt(var + eps * inv_scale * inv_scale);
}

}  // namespace galerkin_ext
