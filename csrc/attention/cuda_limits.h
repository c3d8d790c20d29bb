// Shapes the CUDA kernels of the op core take (core_cuda.cuh); ops.py runs larger ones on the
// formulas. Plain constants: also read by the Python module (galerkin_ext.cpp), built without
// CUDA headers.
#pragma once

#include <cstdint>

namespace galerkin_ext::cuda {

// Widest prepared row or matrix side (a row lives in registers, 4 columns per lane) and most
// coordinates (one per lane).
constexpr int64_t kMaxWidth = 128;
constexpr int64_t kMaxCoordinates = 32;
// Most B·H: the (b, h) pairs are a grid dimension of the launches.
constexpr int64_t kMaxGridY = 65535;

}  // namespace galerkin_ext::cuda
