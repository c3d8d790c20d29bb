// Device-side helpers shared by the CUDA kernels of the attention (prepare_cuda.cu,
// linear_cuda.cu): element conversions, warp sums, a typed view of one operand's rows and the
// dispatch from ScalarKind to an element type. Includes only CUDA headers.
#pragma once

#include "attention/norm_stats.h"
#include "attention/prepare_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace galerkin_ext::cuda {

constexpr int kWarp = 32;

// Accumulation type: float for every dtype but double.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

template <typename A> __device__ __forceinline__ A to_acc(float v) { return v; }
template <typename A> __device__ __forceinline__ A to_acc(double v) { return v; }
template <typename A> __device__ __forceinline__ A to_acc(__half v) { return __half2float(v); }
template <typename A> __device__ __forceinline__ A to_acc(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T> __device__ __forceinline__ T from_acc(double v) { return v; }

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Typed view of PrepareArgs: where row (b, h, n) of x, its coordinates, its quadrature weight
// and head h's norm parameters live.
template <typename T>
struct Rows {
  using A = typename Acc<T>::type;
  PrepareArgs a;

  __device__ const T* row(int64_t b, int64_t h, int64_t n) const {
    return static_cast<const T*>(a.x) + b * a.stride_b + h * a.stride_h + n * a.stride_n;
  }
  __device__ A load(const T* r, int64_t j) const { return to_acc<A>(r[j * a.stride_d]); }
  __device__ const T* pos_row(int64_t b, int64_t n) const {
    return static_cast<const T*>(a.pos) + b * a.pos_stride_b + n * a.P;
  }
  // The row scale: the quadrature weight for a weighted operand (1/N when none is given), else 1.
  __device__ A scale(int64_t b, int64_t n) const {
    if (!a.weighted) return A(1);
    if (!a.weight) return A(1) / A(a.N);
    return to_acc<A>(static_cast<const T*>(a.weight)[b * a.weight_stride_b + n]);
  }
  __device__ A gamma(int64_t h, int64_t j) const {
    return to_acc<A>(static_cast<const T*>(a.gamma)[h * a.D + j]);
  }
  __device__ A beta(int64_t h, int64_t j) const {
    return to_acc<A>(static_cast<const T*>(a.beta)[h * a.D + j]);
  }
};

// Lets `kernel` take `bytes` of dynamic shared memory: above 48 KiB it must opt in.
template <typename Kernel>
cudaError_t allow_shared_memory(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0, limit = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (err != cudaSuccess) return err;
  if (bytes > static_cast<size_t>(limit)) return cudaErrorInvalidConfiguration;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

// Calls f(T{}) with the element type that `kind` names.
template <typename F>
cudaError_t dispatch_kind(ScalarKind kind, F&& f) {
  switch (kind) {
    case ScalarKind::Float: return f(float{});
    case ScalarKind::Double: return f(double{});
    case ScalarKind::Half: return f(__half{});
    case ScalarKind::BFloat16: return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace galerkin_ext::cuda
