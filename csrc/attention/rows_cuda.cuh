// Device-side rows of the CUDA op core (core_cuda.cuh), shared by reduce_cuda.cu and
// apply_cuda.cu: element conversions, warp sums, one operand's rows as a warp holds them, the
// row maps (layer norm, softmax, coordinates, quadrature weight, ones column) and their
// backward. Includes only CUDA headers.
//
// A warp holds one row: lane l has the features x[l + 32 c] (c < LC, zero past D), the
// coordinate pos[l] (zero past P <= 32) and the row scale. The prepared row has the coordinates
// in columns [0, P), the features in [P, P + D) and the ones column at P + D.
#pragma once

#include "attention/core_cuda.cuh"
#include "attention/norm_stats.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace galerkin_ext::cuda {

constexpr int kWarp = 32;

// Accumulation type: float for every dtype but double.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

template <typename A> __device__ __forceinline__ A to_acc(float v) { return v; }
template <typename A> __device__ __forceinline__ A to_acc(double v) { return A(v); }
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

__device__ __forceinline__ float acc_exp(float v) { return expf(v); }
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }

// Element i of a parameter array (weight, norm parameters) of the given kind.
template <typename A>
__device__ __forceinline__ A load_param(const void* p, ScalarKind kind, int64_t i) {
  switch (kind) {
    case ScalarKind::Float: return A(static_cast<const float*>(p)[i]);
    case ScalarKind::Double: return A(static_cast<const double*>(p)[i]);
    case ScalarKind::Half: return A(__half2float(static_cast<const __half*>(p)[i]));
    default: return A(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
}

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

// Typed view of RowsArgs; A is the accumulation type of the kernel (T's, or T itself for G').
template <typename T, typename A>
struct Rows {
  RowsArgs a;

  __device__ const T* row(int64_t b, int64_t h, int64_t n) const {
    return static_cast<const T*>(a.x) + b * a.stride_b + h * a.stride_h + n * a.stride_n;
  }
  __device__ A load(const T* r, int64_t j) const { return to_acc<A>(r[j * a.stride_d]); }
  __device__ const T* pos_row(int64_t b, int64_t n) const {
    return static_cast<const T*>(a.pos) + b * a.pos_stride_b + n * a.P;
  }
  __device__ A scale(int64_t b, int64_t n) const {
    if (!a.weighted) return A(1);
    if (!a.weight) return A(1) / A(a.N);
    return load_param<A>(a.weight, a.weight_kind, b * a.weight_stride_b + n);
  }
  __device__ A gamma(int64_t h, int64_t j) const {
    return load_param<A>(a.gamma, a.norm_kind, h * a.D + j);
  }
  __device__ A beta(int64_t h, int64_t j) const {
    return load_param<A>(a.beta, a.norm_kind, h * a.D + j);
  }
};

// Head h's norm parameters at the lane's feature columns (1 and 0 without a layer norm).
template <int LC, typename T, typename A>
struct HeadNorm {
  A gamma[LC], beta[LC];

  __device__ HeadNorm(const Rows<T, A>& r, int64_t h, int lane) {
    const bool norm = r.a.map == RowMapKind::LayerNorm;
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      const int64_t j = lane + kWarp * c;
      const bool on = norm && j < r.a.D;
      gamma[c] = on ? r.gamma(h, j) : A(1);
      beta[c] = on ? r.beta(h, j) : A(0);
    }
  }
};

// One row as a warp holds it. Loading is apart from use, so that a kernel can have the next
// rows' loads in flight while it computes.
template <int LC, typename T, typename A>
struct RowData {
  A x[LC], p, s;

  __device__ __forceinline__ void load(const Rows<T, A>& r, int64_t b, int64_t h, int64_t n,
                                       int lane) {
    const T* xr = r.row(b, h, n);
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      const int64_t j = lane + kWarp * c;
      x[c] = j < r.a.D ? r.load(xr, j) : A(0);
    }
    p = lane < r.a.P ? to_acc<A>(r.pos_row(b, n)[lane]) : A(0);
    s = r.scale(b, n);
  }
};

// A row map's statistics: the layer norm's (mean, rstd), the softmax's (max, 1 / Σ exp(z -
// max)), (0, 1) for the identity. Every lane gets them.
template <typename A>
struct Stats {
  A first, second;
};

template <int LC, typename T, typename A>
__device__ __forceinline__ Stats<A> row_stats(const Rows<T, A>& r, int lane, double eps,
                                              const RowData<LC, T, A>& row) {
  const int64_t D = r.a.D, P = r.a.P;
  if (r.a.map == RowMapKind::Softmax) {  // over z = [pos | x]
    A top = lane < P ? row.p : -A(INFINITY);
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      if (lane + kWarp * c < D) top = max(top, row.x[c]);
    }
    top = warp_max(top);
    A sum = lane < P ? acc_exp(row.p - top) : A(0);
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      if (lane + kWarp * c < D) sum += acc_exp(row.x[c] - top);
    }
    return {top, A(1) / warp_sum(sum)};
  }
  if (r.a.map != RowMapKind::LayerNorm) return {A(0), A(1)};
  // Corrected two-pass statistics of the registers, scaled to stay finite (norm_stats.h).
  A max_abs = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) max_abs = max(max_abs, fabs(row.x[c]));  // zero past D
  const A sc = galerkin_ext::norm_scale(warp_max(max_abs));
  const A inv = A(1) / sc;
  const A inv_d = A(1) / A(D);
  A sum = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) sum += row.x[c] * inv;
  A mean = warp_sum(sum) / A(D) * sc;
  A lin = 0, sq = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    const A centred = lane + kWarp * c < D ? (row.x[c] - mean) * inv : A(0);
    lin += centred;
    sq += centred * centred;
  }
  // the centred sums also correct the mean (norm_stats.h)
  const A centred_sq = galerkin_ext::norm_recentre(warp_sum(lin), warp_sum(sq), sc, inv_d, mean);
  return {mean, galerkin_ext::norm_rstd(centred_sq, inv, inv_d, A(eps))};
}

// The unscaled prepared feature value of lane column c (LN(x), x or softmax(z)[P + j]).
template <int LC, typename T, typename A>
__device__ __forceinline__ A feature(const Rows<T, A>& r, const HeadNorm<LC, T, A>& hn,
                                     const RowData<LC, T, A>& row, Stats<A> st, int c) {
  switch (r.a.map) {
    case RowMapKind::LayerNorm:
      return (row.x[c] - st.first) * st.second * hn.gamma[c] + hn.beta[c];
    case RowMapKind::Softmax: return acc_exp(row.x[c] - st.first) * st.second;
    default: return row.x[c];
  }
}

// The unscaled prepared coordinate of this lane (lane < P).
template <typename A>
__device__ __forceinline__ A coordinate(RowMapKind map, A p, Stats<A> st) {
  return map == RowMapKind::Softmax ? acc_exp(p - st.first) * st.second : p;
}

// Writes the prepared row to column col at base[col · stride] for col < width(), zeros in
// [width(), pad); an invalid row (past the end) is all zeros.
template <int LC, typename T, typename A>
__device__ __forceinline__ void stage_row(const Rows<T, A>& r, const HeadNorm<LC, T, A>& hn,
                                          const RowData<LC, T, A>& row, bool valid, int lane,
                                          double eps, A* base, int stride, int pad) {
  const int64_t P = r.a.P, D = r.a.D, width = r.a.width();
  if (!valid) {
    for (int col = lane; col < pad; col += kWarp) base[col * stride] = 0;
    return;
  }
  const Stats<A> st = row_stats(r, lane, eps, row);
  if (lane < P) base[lane * stride] = coordinate(r.a.map, row.p, st) * row.s;
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    const int64_t j = lane + kWarp * c;
    if (j < D) base[(P + j) * stride] = feature(r, hn, row, st, c) * row.s;
  }
  if (r.a.ones_column && lane == 0) base[(P + D) * stride] = A(1);
  for (int64_t col = width + lane; col < pad; col += kWarp) base[col * stride] = 0;
}

// Backward of one row's map. y is the gradient w.r.t. the prepared row, column col at
// y[col · stride] (the ones column has none). Writes grad_x (D elements) and, where asked, the
// row's coordinate gradient (P elements) and weight gradient; adds the layer norm's parameter
// gradients to the lane's dgamma, dbeta.
template <int LC, typename T, typename A>
__device__ __forceinline__ void row_backward(const Rows<T, A>& r, const HeadNorm<LC, T, A>& hn,
                                             const RowData<LC, T, A>& row, int lane, double eps,
                                             const A* y, int stride, T* grad_x, A* pos_grad,
                                             A* weight_grad, A (&dgamma)[LC], A (&dbeta)[LC]) {
  const int64_t P = r.a.P, D = r.a.D;
  const Stats<A> st = row_stats(r, lane, eps, row);
  const A s = row.s;
  A g[LC];
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    g[c] = lane + kWarp * c < D ? y[(P + lane + kWarp * c) * stride] : A(0);
  }
  const A g_pos = lane < P ? y[lane * stride] : A(0);
  A dx[LC];
  if (r.a.map == RowMapKind::Softmax) {
    // prepared = s · u, u = softmax(z): d/ds = ⟨g, u⟩, dz = u ∘ s (g − ⟨g, u⟩).
    const A u_pos = lane < P ? coordinate(r.a.map, row.p, st) : A(0);
    A u[LC];
    A dot = g_pos * u_pos;
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      u[c] = lane + kWarp * c < D ? feature(r, hn, row, st, c) : A(0);
      dot += g[c] * u[c];
    }
    dot = warp_sum(dot);
    if (weight_grad && lane == 0) *weight_grad = dot;
    if (pos_grad && lane < P) pos_grad[lane] = u_pos * s * (g_pos - dot);
#pragma unroll
    for (int c = 0; c < LC; ++c) dx[c] = u[c] * s * (g[c] - dot);
  } else {
    if (pos_grad && lane < P) pos_grad[lane] = s * g_pos;
    if (weight_grad) {  // d/dw of w · row, the unscaled row rebuilt (w may be zero)
      A dot = row.p * g_pos;
#pragma unroll
      for (int c = 0; c < LC; ++c) {
        if (lane + kWarp * c < D) dot += feature(r, hn, row, st, c) * g[c];
      }
      dot = warp_sum(dot);
      if (lane == 0) *weight_grad = dot;
    }
    if (r.a.map == RowMapKind::LayerNorm) {
      // dx = rstd (γ∘dy − mean(γ∘dy) − x̂ mean(γ∘dy∘x̂)), dy = s g
      A xhat[LC], c1 = 0, c2 = 0;
#pragma unroll
      for (int c = 0; c < LC; ++c) {
        const bool on = lane + kWarp * c < D;
        xhat[c] = on ? (row.x[c] - st.first) * st.second : A(0);
        const A dy = s * g[c];
        const A gdy = dy * hn.gamma[c];
        c1 += gdy;
        c2 += gdy * xhat[c];
        dgamma[c] += dy * xhat[c];
        dbeta[c] += dy;
      }
      c1 = warp_sum(c1) / A(D);
      c2 = warp_sum(c2) / A(D);
#pragma unroll
      for (int c = 0; c < LC; ++c) {
        dx[c] = st.second * (s * g[c] * hn.gamma[c] - c1 - xhat[c] * c2);
      }
    } else {
#pragma unroll
      for (int c = 0; c < LC; ++c) dx[c] = s * g[c];
    }
  }
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    if (lane + kWarp * c < D) grad_x[lane + kWarp * c] = from_acc<T>(dx[c]);
  }
}

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

// Calls f(T{}, S{}) with the element type T that `kind` names and the type S of rows it is
// paired with: T itself, or T's accumulation type (the G' rows of q_apply's backward).
template <typename F>
cudaError_t dispatch_pair(ScalarKind kind, ScalarKind other, F&& f) {
  return dispatch_kind(kind, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    using A = typename Acc<T>::type;
    if (other == kind) return f(T{}, T{});
    if constexpr (!std::is_same_v<T, A>) {
      if (other == ScalarKind::Float) return f(T{}, A{});
    }
    return cudaErrorInvalidValue;
  });
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace galerkin_ext::cuda
