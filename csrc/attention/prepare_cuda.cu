// CUDA twin of prepare_cpu.cpp: per-head layer norm, coordinates in front and the quadrature
// row scale, fused into one pass per row (forward), and its backward. One warp per row; the
// statistics and all sums are in float (double for double inputs).
#include "attention/rows_cuda.cuh"

namespace galerkin_ext::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Mean and rstd of one row; every lane gets them. Two passes: the second re-reads the row from
// L1, which keeps the variance exact without holding a row of unknown length in registers.
template <typename T, typename A>
__device__ void row_stats(const Rows<T>& r, const T* xr, int lane, double eps, A& mean, A& rstd) {
  A max_abs = 0;
  for (int64_t j = lane; j < r.a.D; j += kWarp) max_abs = max(max_abs, fabs(r.load(xr, j)));
  const A sc = galerkin_ext::norm_scale(warp_max(max_abs));  // norm_stats.h
  const A inv = A(1) / sc;
  A sum = 0;
  for (int64_t j = lane; j < r.a.D; j += kWarp) sum += r.load(xr, j) * inv;
  mean = warp_sum(sum) / A(r.a.D) * sc;
  A sq = 0;
  for (int64_t j = lane; j < r.a.D; j += kWarp) {
    const A c = (r.load(xr, j) - mean) * inv;
    sq += c * c;
  }
  rstd = galerkin_ext::norm_rstd(warp_sum(sq), sc, A(r.a.D), A(eps));
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
// warp per row. Every sum has a fixed order, so the results are bitwise reproducible: the
// coordinate and weight gradients are written per row and summed by the caller; a warp sums
// its rows' norm-parameter gradients in its own slice of shared memory (each lane owns its
// columns), then the block adds the warp slices in order and writes one partial per block.
// grad_x overwrites the row's last D entries in place: each lane reads an entry before it writes
// it, and the row sums are complete (warp reductions) before the first write.
template <typename T>
__global__ void prepare_backward_kernel(Rows<T> r, T* __restrict__ grad_hat,
                                        const typename Acc<T>::type* __restrict__ stats,
                                        typename Acc<T>::type* __restrict__ pos_rows,
                                        typename Acc<T>::type* __restrict__ weight_rows,
                                        typename Acc<T>::type* __restrict__ norm_partial) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const bool norm = r.a.gamma != nullptr;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t h = blockIdx.y, D = r.a.D, P = r.a.P;
  // This warp's (dgamma (D), dbeta (D)) slice; only with a norm.
  A* dgamma = reinterpret_cast<A*>(shared_bytes) + warp * 2 * D;
  A* dbeta = dgamma + D;
  if (norm) {
    for (int64_t j = lane; j < 2 * D; j += kWarp) dgamma[j] = 0;
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
    if (pos_rows) {
      for (int64_t j = lane; j < P; j += kWarp) pos_rows[i * P + j] = s * to_acc<A>(g[j]);
    }
    if (weight_rows) {  // d/dw of w · row, with the unscaled row rebuilt (w may be zero)
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
      if (lane == 0) weight_rows[i] = dot;
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
      dgamma[j] += dy * xhat;
      dbeta[j] += dy;
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
    const A* slices = reinterpret_cast<const A*>(shared_bytes);
    A* out = norm_partial + (static_cast<int64_t>(blockIdx.x) * r.a.H + h) * 2 * D;
    for (int64_t j = threadIdx.x; j < 2 * D; j += blockDim.x) {
      A sum = 0;
      for (int w = 0; w < kWarpsPerBlock; ++w) sum += slices[w * 2 * D + j];
      out[j] = sum;
    }
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
  if (!args.gamma && !args.weighted && !grads.pos_rows) return cudaSuccess;
  const size_t shared = args.gamma ? kWarpsPerBlock * 2 * args.D * sizeof(A) : 0;
  const cudaError_t fits = allow_shared_memory(prepare_backward_kernel<T>, shared);
  if (fits != cudaSuccess) return fits;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(args.H));
  prepare_backward_kernel<T><<<grid, kWarpsPerBlock * kWarp, shared, stream>>>(
      Rows<T>{args}, static_cast<T*>(grad_hat), static_cast<const A*>(stats),
      static_cast<A*>(grads.pos_rows), static_cast<A*>(grads.weight_rows),
      static_cast<A*>(grads.norm_partial));
  return cudaGetLastError();
}

}  // namespace

cudaError_t prepare_forward(const PrepareArgs& args, double eps, void* hat, void* stats,
                            cudaStream_t stream) {
  return dispatch_kind(args.kind, [&](auto tag) {
    return forward_typed<decltype(tag)>(args, eps, hat, stats, stream);
  });
}

cudaError_t prepare_backward(const PrepareArgs& args, void* grad_hat, const void* stats,
                             const PrepareGrads& grads, cudaStream_t stream) {
  return dispatch_kind(args.kind, [&](auto tag) {
    return backward_typed<decltype(tag)>(args, grad_hat, stats, grads, stream);
  });
}

}  // namespace galerkin_ext::cuda
