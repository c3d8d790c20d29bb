// Shapes the fused CUDA linear path takes (linear_cuda.cu); other shapes run on whole operands.
// Plain constants, included by the CUDA kernels and by the Python module (ops.py's fake kernels
// mirror where the paths differ in their output layout).
#pragma once

#include <cstdint>

namespace galerkin_ext {

// Widest prepared row d = P + D (a row lives in registers, 4 columns per lane) and most
// coordinates P (one per lane).
constexpr int64_t kLinearCudaMaxWidth = 128;
constexpr int64_t kLinearCudaMaxCoordinates = 32;

constexpr bool linear_cuda_fits(int64_t d, int64_t P) {
  return d <= kLinearCudaMaxWidth && P <= kLinearCudaMaxCoordinates;
}

}  // namespace galerkin_ext
