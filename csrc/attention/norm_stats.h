// Layer-norm statistics that stay right across the whole floating-point range, shared by the
// CPU rows (prepare_cpu.h) and the CUDA rows (prepare_cuda.cu, linear_cuda.cu).
//
// A float32 row of magnitude 1e20 has squares of 1e40, past float32's range: the variance
// overflowed, rstd became 0 and the output silently the bias. Rows with max |x| > 1 are
// therefore summed as x / scale with scale = max |x|, so no partial sum can overflow, and
// rstd = 1 / sqrt(var + eps) is assembled without forming scale². Smaller rows keep scale 1
// (exact, and their squares cannot overflow). Non-finite input still gives non-finite output.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define GALERKIN_HD __host__ __device__ __forceinline__
#else
#define GALERKIN_HD inline
#endif

namespace galerkin_ext {

// The factor rows are divided by before summing: max |x| above 1, else 1.
template <typename A>
GALERKIN_HD A norm_scale(A max_abs) {
  return max_abs > A(1) ? max_abs : A(1);
}

// 1 / sqrt(var + eps) for var = sq_scaled / d · scale², with sq_scaled = Σ ((x - mean) / scale)².
template <typename A>
GALERKIN_HD A norm_rstd(A sq_scaled, A scale, A d, A eps) {
  const A var = sq_scaled / d;  // the variance of x / scale
#if defined(__CUDA_ARCH__)
  if (var == A(0)) return A(1) / sqrt(eps);  // a constant row, whatever its magnitude
  return (A(1) / scale) / sqrt(var + eps / scale / scale);
#else
  if (var == A(0)) return A(1) / std::sqrt(eps);
  return (A(1) / scale) / std::sqrt(var + eps / scale / scale);
#endif
}

}  // namespace galerkin_ext
