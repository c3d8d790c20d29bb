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

#if defined(__CUDACC__)
#define GALERKIN_HD __host__ __device__ __forceinline__
#else
#define GALERKIN_HD inline
#endif

namespace galerkin_ext {

// The factor rows are divided by before summing: 2^floor(log2 max |x|) above 1, else 1.
template <typename A>
GALERKIN_HD A norm_scale(A max_abs) {
  using std::ilogb;
  using std::ldexp;
  return max_abs > A(1) ? ldexp(A(1), ilogb(max_abs)) : A(1);
}

// 1 / sqrt(var + eps) for var = sq_scaled / d · scale², with sq_scaled = Σ ((x - mean) / scale)².
template <typename A>
GALERKIN_HD A norm_rstd(A sq_scaled, A scale, A d, A eps) {
  using std::sqrt;
  const A var = sq_scaled / d;  // the variance of x / scale
  if (var == A(0)) return A(1) / sqrt(eps);  // a constant row, whatever its magnitude
  return (A(1) / scale) / sqrt(var + eps / scale / scale);
}

}  // namespace galerkin_ext
