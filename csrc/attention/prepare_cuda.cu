// CUDA twin of prepare_cpu.cpp: per-head layer norm, coordinates in front and the quadrature
// row scale, fused into one pass per row (forward), and its backward. One warp per row; the
// statistics and all sums are in float (double for double inputs).
#include "attention/prepare_cuda.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace galerkin_ext::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

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
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Typed view of PrepareArgs.
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

// Mean and rstd of one row; every lane gets them. Two passes: the second re-reads the row from
// L1, which keeps the variance exact without holding a row of unknown length in registers.
template <typename T, typename A>
__device__ void row_stats(const Rows<T>& r, const T* xr, int lane, double eps, A& mean, A& rstd) {
  A sum = 0;
  for (int64_t j = lane; j < r.a.D; j += kWarp) sum += r.load(xr, j);
  mean = warp_sum(sum) / A(r.a.D);
  A sq = 0;
  for (int64_t j = lane; j < r.a.D; j += kWarp) {
    const A c = r.load(xr, j) - mean;
    sq += c * c;
  }
  rstd = A(1) / sqrt(warp_sum(sq) / A(r.a.D) + A(eps));
}

template <typename T>
__global__ void prepare_forward_kernel(Rows<T> r, double eps, T* __restrict__ hat,
                                       typename Acc<T>::type* __restrict__ stats) {
  using A = typename Acc<T>::type;
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = r.a.B * r.a.H * r.a.N;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (i >= rows) return;
  const int64_t n = i % r.a.N, h = (i / r.a.N) % r.a.H, b = i / (r.a.N * r.a.H);
  const int64_t d = r.a.P + r.a.D;
  const T* xr = r.row(b, h, n);
  T* o = hat + i * r.a.ld;
  for (int64_t j = d + lane; j < r.a.ld; j += kWarp) o[j] = from_acc<T>(A(0));
  const A s = r.scale(b, n);
  if (r.a.pos) {
    const T* p = r.pos_row(b, n);
    for (int64_t j = lane; j < r.a.P; j += kWarp) o[j] = from_acc<T>(to_acc<A>(p[j]) * s);
  }
  o += r.a.P;
  if (!r.a.gamma) {
    for (int64_t j = lane; j < r.a.D; j += kWarp) o[j] = from_acc<T>(r.load(xr, j) * s);
    return;
  }
  A mean, rstd;
  row_stats(r, xr, lane, eps, mean, rstd);
  if (lane == 0) {
    stats[2 * i] = mean;
    stats[2 * i + 1] = rstd;
  }
  for (int64_t j = lane; j < r.a.D; j += kWarp) {
    const A xhat = (r.load(xr, j) - mean) * rstd;
    o[j] = from_acc<T>((xhat * r.gamma(h, j) + r.beta(h, j)) * s);
  }
}

// Block (blockIdx.x, h) handles kBackwardRowsPerBlock consecutive (b, n) rows of head h, one
// warp per row; norm-parameter gradients are summed in shared memory, then written per block.
// grad_x overwrites the row's last D entries in place: each lane reads an entry before it writes
// it, and the row sums are complete (warp reductions) before the first write.
template <typename T>
__global__ void prepare_backward_kernel(Rows<T> r, T* __restrict__ grad_hat,
                                        const typename Acc<T>::type* __restrict__ stats,
                                        typename Acc<T>::type* __restrict__ grad_pos,
                                        typename Acc<T>::type* __restrict__ grad_weight,
                                        typename Acc<T>::type* __restrict__ norm_partial) {
  using A = typename Acc<T>::type;
  extern __shared__ unsigned char shared_bytes[];
  A* dgamma = reinterpret_cast<A*>(shared_bytes);  // (D) then dbeta (D), only with a norm
  A* dbeta = dgamma + r.a.D;
  const bool norm = r.a.gamma != nullptr;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t h = blockIdx.y, D = r.a.D, P = r.a.P;
  if (norm) {
    for (int64_t j = threadIdx.x; j < 2 * D; j += blockDim.x) dgamma[j] = 0;
    __syncthreads();
  }
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBackwardRowsPerBlock;
  const int64_t last = min(first + kBackwardRowsPerBlock, r.a.B * r.a.N);
  for (int64_t bn = first + warp; bn < last; bn += kWarpsPerBlock) {
    const int64_t b = bn / r.a.N, n = bn % r.a.N;
    const int64_t i = (b * r.a.H + h) * r.a.N + n;
    T* g = grad_hat + i * r.a.ld;
    const T* xr = r.row(b, h, n);
    const A s = r.scale(b, n);
    const A mean = norm ? stats[2 * i] : A(0), rstd = norm ? stats[2 * i + 1] : A(1);
    if (grad_pos) {
      A* gp = grad_pos + b * r.a.pos_stride_b + n * P;
      for (int64_t j = lane; j < P; j += kWarp) atomicAdd(gp + j, s * to_acc<A>(g[j]));
    }
    if (grad_weight) {  // d/dw of w · row, with the unscaled row rebuilt (w may be zero)
      A dot = 0;
      if (r.a.pos) {
        const T* p = r.pos_row(b, n);
        for (int64_t j = lane; j < P; j += kWarp) dot += to_acc<A>(g[j]) * to_acc<A>(p[j]);
      }
      for (int64_t j = lane; j < D; j += kWarp) {
        A y = r.load(xr, j);
        if (norm) y = (y - mean) * rstd * r.gamma(h, j) + r.beta(h, j);
        dot += to_acc<A>(g[P + j]) * y;
      }
      dot = warp_sum(dot);
      if (lane == 0) atomicAdd(grad_weight + b * r.a.weight_stride_b + n, dot);
    }
    T* dx = g + P;
    if (!norm) {
      for (int64_t j = lane; j < D; j += kWarp) dx[j] = from_acc<T>(s * to_acc<A>(g[P + j]));
      continue;
    }
    // dx = rstd (γ∘dy − mean(γ∘dy) − x̂ mean(γ∘dy∘x̂)) with dy = s · grad of the row.
    A c1 = 0, c2 = 0;
    for (int64_t j = lane; j < D; j += kWarp) {
      const A dy = s * to_acc<A>(g[P + j]);
      const A xhat = (r.load(xr, j) - mean) * rstd;
      const A gdy = dy * r.gamma(h, j);
      c1 += gdy;
      c2 += gdy * xhat;
      atomicAdd(dgamma + j, dy * xhat);
      atomicAdd(dbeta + j, dy);
    }
    c1 = warp_sum(c1) / A(D);
    c2 = warp_sum(c2) / A(D);
    for (int64_t j = lane; j < D; j += kWarp) {
      const A dy = s * to_acc<A>(g[P + j]);
      const A xhat = (r.load(xr, j) - mean) * rstd;
      dx[j] = from_acc<T>(rstd * (dy * r.gamma(h, j) - c1 - xhat * c2));
    }
  }
  if (norm) {
    __syncthreads();
    A* out = norm_partial + (static_cast<int64_t>(blockIdx.x) * r.a.H + h) * 2 * D;
    for (int64_t j = threadIdx.x; j < 2 * D; j += blockDim.x) out[j] = dgamma[j];
  }
}

template <typename T>
cudaError_t forward_typed(const PrepareArgs& args, double eps, void* hat, void* stats,
                          cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t rows = args.B * args.H * args.N;
  if (rows == 0) return cudaSuccess;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  prepare_forward_kernel<T><<<static_cast<unsigned>(blocks), kWarpsPerBlock * kWarp, 0, stream>>>(
      Rows<T>{args}, eps, static_cast<T*>(hat), static_cast<A*>(stats));
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward_typed(const PrepareArgs& args, void* grad_hat, const void* stats,
                           const PrepareGrads& grads, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t blocks = backward_blocks(args.B, args.N);
  if (blocks == 0 || args.H == 0) return cudaSuccess;
  // Without norm, weight or pos gradient, grad_x already stands in grad_hat[..., P:].
  if (!args.gamma && !args.weighted && !grads.grad_pos) return cudaSuccess;
  const size_t shared = args.gamma ? 2 * args.D * sizeof(A) : 0;
  if (shared > 48 * 1024) return cudaErrorInvalidConfiguration;  // D > 6144 (3072 in double)
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(args.H));
  prepare_backward_kernel<T><<<grid, kWarpsPerBlock * kWarp, shared, stream>>>(
      Rows<T>{args}, static_cast<T*>(grad_hat), static_cast<const A*>(stats),
      static_cast<A*>(grads.grad_pos),
      static_cast<A*>(grads.grad_weight), static_cast<A*>(grads.norm_partial));
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_forward(const PrepareArgs& args, double eps, void* hat, void* stats,
                            cudaStream_t stream) {
  switch (args.kind) {
    case ScalarKind::Float: return forward_typed<float>(args, eps, hat, stats, stream);
    case ScalarKind::Double: return forward_typed<double>(args, eps, hat, stats, stream);
    case ScalarKind::Half: return forward_typed<__half>(args, eps, hat, stats, stream);
    case ScalarKind::BFloat16: return forward_typed<__nv_bfloat16>(args, eps, hat, stats, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t prepare_backward(const PrepareArgs& args, void* grad_hat, const void* stats,
                             const PrepareGrads& grads, cudaStream_t stream) {
  switch (args.kind) {
    case ScalarKind::Float: return backward_typed<float>(args, grad_hat, stats, grads, stream);
    case ScalarKind::Double: return backward_typed<double>(args, grad_hat, stats, grads, stream);
    case ScalarKind::Half: return backward_typed<__half>(args, grad_hat, stats, grads, stream);
    case ScalarKind::BFloat16:
      return backward_typed<__nv_bfloat16>(args, grad_hat, stats, grads, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace galerkin_ext::cuda
