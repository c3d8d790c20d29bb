// The fused CUDA linear path (linear_cuda.cuh): a split reduction over the points that forms the
// (d, d) products from prepared rows staged in shared memory, and per-row products with a (d, d)
// matrix held in shared memory, each with the row maps (coordinates in front, per-head layer
// norm, quadrature weight) applied on the fly, forward and backward. Sums are in float (double
// for double inputs) on the FMA units.
#include "attention/linear_cuda.cuh"
#include "attention/rows_cuda.cuh"

#include <algorithm>
#include <type_traits>

namespace galerkin_ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

// Blocks the launches aim for: several waves of a large GPU, so that the last wave's tail is
// short and many rows are in flight. A constant rather than the device's multiprocessor count:
// the partition of the sums, and so every bit of the results, depends on the shape alone.
constexpr int64_t kTargetBlocks = 1056;

// reduce: rows staged per step, and the rows per split: at least 128 so that a block's (d, d)
// partial is small next to the rows it reads, at most 1024 so that large problems get many
// blocks.
constexpr int kReduceRows = 32;
constexpr int kReduceRowsPerWarp = kReduceRows / kWarps;
constexpr int64_t kMinSplitRows = 128, kMaxSplitRows = 1024;

// apply: rows per tile (8 per warp), staged transposed, column i of the tile at i ·
// kTileStride; the 4 extra elements keep 16-byte alignment and spread the banks.
constexpr int kApplyRowsPerWarp = 8;
constexpr int kApplyRows = kApplyRowsPerWarp * kWarps;
constexpr int kTileStride = kApplyRows + 4;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// Row maps, per warp: lane l holds the columns l + 32 c (c < LC) of a row's features; LC is the
// kernel's compile-time bound on ceil(D / 32), which keeps the row in registers.

// One operand's norm parameters at the lane's columns, for head h (identity without a norm).
template <typename T, int LC>
struct HeadNorm {
  using A = typename Acc<T>::type;
  A gamma[LC], beta[LC];

  __device__ HeadNorm(const Rows<T>& r, int64_t h, int lane) {
#pragma unroll
    for (int c = 0; c < LC; ++c) {
      const int64_t j = lane + kWarp * c;
      const bool on = r.a.gamma && j < r.a.D;
      gamma[c] = on ? r.gamma(h, j) : A(1);
      beta[c] = on ? r.beta(h, j) : A(0);
    }
  }
};

// One row as a warp holds it: features x at the lane's columns (0 past D), the coordinate at
// column `lane` (0 past P <= kLinearCudaMaxCoordinates = 32) and the row scale. Loading is apart
// from use, so that a kernel can have the next rows' loads in flight while it computes.
template <typename T, int LC>
struct RowData {
  using A = typename Acc<T>::type;
  A x[LC], p, s;

  __device__ __forceinline__ void load(const Rows<T>& r, int64_t b, int64_t h, int64_t n,
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

// Layer-norm statistics of a row held in registers (mean 0, rstd 1 without a norm). Two passes
// over the registers: the variance is exact.
template <typename T, int LC>
__device__ __forceinline__ void row_stats(const Rows<T>& r, int lane, double eps,
                                          const RowData<T, LC>& row,
                                          typename Acc<T>::type& mean,
                                          typename Acc<T>::type& rstd) {
  using A = typename Acc<T>::type;
  mean = 0;
  rstd = 1;
  if (!r.a.gamma) return;
  A max_abs = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) max_abs = max(max_abs, fabs(row.x[c]));  // zero past D
  const A sc = galerkin_ext::norm_scale(warp_max(max_abs));  // norm_stats.h
  const A inv = A(1) / sc;
  A sum = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) sum += row.x[c] * inv;
  mean = warp_sum(sum) / A(r.a.D) * sc;
  A sq = 0;
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    const A centred = lane + kWarp * c < r.a.D ? (row.x[c] - mean) * inv : A(0);
    sq += centred * centred;
  }
  rstd = galerkin_ext::norm_rstd(warp_sum(sq), sc, A(r.a.D), A(eps));
}

// Writes the prepared row s · [pos | LN(x)] to column col at base[col · stride] for col < d,
// zeros in [d, width); an invalid row (past the end) is all zeros.
template <typename T, int LC>
__device__ __forceinline__ void stage_row(const Rows<T>& r, const HeadNorm<T, LC>& hn,
                                          const RowData<T, LC>& row, bool valid, int lane,
                                          double eps, typename Acc<T>::type* base, int stride,
                                          int width) {
  using A = typename Acc<T>::type;
  const int64_t P = r.a.P, d = P + r.a.D;
  if (!valid) {
    for (int col = lane; col < width; col += kWarp) base[col * stride] = 0;
    return;
  }
  A mean, rstd;
  row_stats(r, lane, eps, row, mean, rstd);
  if (lane < P) base[lane * stride] = row.p * row.s;
#pragma unroll
  for (int c = 0; c < LC; ++c) {
    const int64_t j = lane + kWarp * c;
    if (j < r.a.D) {
      base[(P + j) * stride] = ((row.x[c] - mean) * rstd * hn.gamma[c] + hn.beta[c]) * row.s;
    }
  }
  for (int64_t col = d + lane; col < width; col += kWarp) base[col * stride] = 0;
}

// ---------------------------------------------------------------------------------------------
// reduce: block (bh, split) sums left_n ⊗ right_n over its split's rows. Its TH × TH threads per
// group hold an R × R tile of the (TH R)² product each (row ty + TH i, column tx + TH j: the
// shared-memory reads are broadcasts or consecutive); the kThreads / TH² groups take alternate
// staged rows and write their partials separately.

template <typename T, int TH, int R>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(Rows<T> left, Rows<T> right, double eps, int64_t rows_per_split,
                  typename Acc<T>::type* __restrict__ partial) {
  using A = typename Acc<T>::type;
  constexpr int DP = TH * R;
  constexpr int kGroups = kThreads / (TH * TH);
  constexpr int LC = (DP + kWarp - 1) / kWarp;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* left_rows = reinterpret_cast<A*>(shared_bytes);  // (kReduceRows, DP)
  A* right_rows = left_rows + kReduceRows * DP;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int group = threadIdx.x / (TH * TH), ty = threadIdx.x % (TH * TH) / TH,
            tx = threadIdx.x % TH;
  const int64_t H = left.a.H, N = left.a.N, d = left.a.P + left.a.D;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const HeadNorm<T, LC> left_norm(left, h, lane), right_norm(right, h, lane);

  A acc[R][R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < R; ++j) acc[i][j] = 0;
  }
  const int64_t first = blockIdx.y * rows_per_split, end = min(N, first + rows_per_split);
  // The warp's rows of the next step are loaded while the current step computes.
  RowData<T, LC> lrow[kReduceRowsPerWarp], rrow[kReduceRowsPerWarp];
  auto load_step = [&](int64_t n0) {
#pragma unroll
    for (int k = 0; k < kReduceRowsPerWarp; ++k) {
      const int64_t n = n0 + warp * kReduceRowsPerWarp + k;
      if (n < end) {
        lrow[k].load(left, b, h, n, lane);
        rrow[k].load(right, b, h, n, lane);
      }
    }
  };
  load_step(first);
  for (int64_t n0 = first; n0 < end; n0 += kReduceRows) {
#pragma unroll
    for (int k = 0; k < kReduceRowsPerWarp; ++k) {
      const int row = warp * kReduceRowsPerWarp + k;
      const bool valid = n0 + row < end;
      stage_row(left, left_norm, lrow[k], valid, lane, eps, left_rows + row * DP, 1, DP);
      stage_row(right, right_norm, rrow[k], valid, lane, eps, right_rows + row * DP, 1, DP);
    }
    __syncthreads();
    load_step(n0 + kReduceRows);
    for (int t = group; t < kReduceRows; t += kGroups) {
      A a[R], c[R];
#pragma unroll
      for (int i = 0; i < R; ++i) a[i] = left_rows[t * DP + ty + TH * i];
#pragma unroll
      for (int j = 0; j < R; ++j) c[j] = right_rows[t * DP + tx + TH * j];
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int j = 0; j < R; ++j) acc[i][j] += a[i] * c[j];
      }
    }
    __syncthreads();
  }
  const int64_t slice = static_cast<int64_t>(blockIdx.y) * kGroups + group;
  A* out = partial + (slice * gridDim.x + bh) * d * d;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = ty + TH * i, col = tx + TH * j;
      if (row < d && col < d) out[row * d + col] = acc[i][j];
    }
  }
}

struct ReducePlan {
  int64_t splits, rows_per_split;
};

ReducePlan reduce_plan(int64_t BH, int64_t N) {
  const int64_t wanted = ceil_div(ceil_div(BH * N, kTargetBlocks), kReduceRows) * kReduceRows;
  const int64_t rows = std::min(std::clamp(wanted, kMinSplitRows, kMaxSplitRows),
                                ceil_div(N, kReduceRows) * kReduceRows);
  return {ceil_div(N, rows), rows};
}

// Threads per side of a group's tile: 8 (4 groups) up to d = 64, 16 (one group) above.
int64_t reduce_side(int64_t d) { return d <= 64 ? 8 : 16; }

template <typename T, int TH, int R>
cudaError_t launch_reduce(const PrepareArgs& left, const PrepareArgs& right, double eps,
                          void* partial, cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const size_t shared = 2 * kReduceRows * TH * R * sizeof(A);
  const cudaError_t fits = allow_shared_memory(reduce_kernel<T, TH, R>, shared);
  if (fits != cudaSuccess) return fits;
  const ReducePlan plan = reduce_plan(left.B * left.H, left.N);
  const dim3 grid(static_cast<unsigned>(left.B * left.H), static_cast<unsigned>(plan.splits));
  reduce_kernel<T, TH, R><<<grid, kThreads, shared, stream>>>(
      Rows<T>{left}, Rows<T>{right}, eps, plan.rows_per_split, static_cast<A*>(partial));
  return cudaGetLastError();
}

// The tile just large enough for d (double, used for checking rather than speed, gets one size
// per side to keep the build small).
template <typename T>
cudaError_t reduce_typed(const PrepareArgs& left, const PrepareArgs& right, double eps,
                         void* partial, cudaStream_t stream) {
  const int64_t d = left.P + left.D;
  if constexpr (std::is_same_v<T, double>) {
    if (d <= 64) return launch_reduce<T, 8, 8>(left, right, eps, partial, stream);
    return launch_reduce<T, 16, 8>(left, right, eps, partial, stream);
  } else {
    if (d <= 64) {
      switch (ceil_div(d, 8)) {
        case 1: return launch_reduce<T, 8, 1>(left, right, eps, partial, stream);
        case 2: return launch_reduce<T, 8, 2>(left, right, eps, partial, stream);
        case 3: return launch_reduce<T, 8, 3>(left, right, eps, partial, stream);
        case 4: return launch_reduce<T, 8, 4>(left, right, eps, partial, stream);
        case 5: return launch_reduce<T, 8, 5>(left, right, eps, partial, stream);
        case 6: return launch_reduce<T, 8, 6>(left, right, eps, partial, stream);
        case 7: return launch_reduce<T, 8, 7>(left, right, eps, partial, stream);
        default: return launch_reduce<T, 8, 8>(left, right, eps, partial, stream);
      }
    }
    switch (ceil_div(d, 16)) {
      case 5: return launch_reduce<T, 16, 5>(left, right, eps, partial, stream);
      case 6: return launch_reduce<T, 16, 6>(left, right, eps, partial, stream);
      case 7: return launch_reduce<T, 16, 7>(left, right, eps, partial, stream);
      default: return launch_reduce<T, 16, 8>(left, right, eps, partial, stream);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// finalize: one thread per matrix entry sums the partials in slice order.

template <typename T>
__global__ void finalize_kernel(const typename Acc<T>::type* __restrict__ partial,
                                int64_t slices, int64_t count, const T* __restrict__ add,
                                const T* __restrict__ mask, typename Acc<T>::type scale,
                                typename Acc<T>::type* __restrict__ matrix,
                                T* __restrict__ matrix_t) {
  using A = typename Acc<T>::type;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A sum = 0;
    for (int64_t s = 0; s < slices; ++s) sum += partial[s * count + i];
    if (add) sum += to_acc<A>(add[i]);
    sum *= scale;
    if (mask) sum *= to_acc<A>(mask[i]);
    matrix[i] = sum;
    if (matrix_t) matrix_t[i] = from_acc<T>(sum);
  }
}

// ---------------------------------------------------------------------------------------------
// apply: block (bh, ·) holds matrix (d, d) of its (b, h) in shared memory, zero-padded to 32 C
// columns, and walks tiles of kApplyRows rows. Each warp stages its own 8 rows, transposed, and
// computes their products: lane l holds columns l + 32 c of the 8 result rows. A warp only
// touches its own tile columns, so a tile needs warp barriers only.

template <typename A, int C>
__device__ void load_matrix(const A* __restrict__ matrix, int64_t d, bool transpose, A* ms) {
  for (int64_t i = threadIdx.x; i < d * 32 * C; i += blockDim.x) {
    const int64_t row = i / (32 * C), col = i % (32 * C);
    ms[i] = col >= d ? A(0) : transpose ? matrix[col * d + row] : matrix[row * d + col];
  }
}

// The 8 entries of a tile column that belong to one warp (16-byte aligned).
template <typename A>
__device__ __forceinline__ void load_column(const A* p, A (&v)[kApplyRowsPerWarp]) {
  if constexpr (std::is_same_v<A, float>) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
  } else {
#pragma unroll
    for (int a = 0; a < kApplyRowsPerWarp; ++a) v[a] = p[a];
  }
}

// The warp's rows [n0, n0 + 8) of an operand, loaded (where they exist).
template <typename T, int C>
__device__ __forceinline__ void load_warp_rows(const Rows<T>& r, int64_t b, int64_t h, int64_t n0,
                                               int lane, RowData<T, C> (&rows)[kApplyRowsPerWarp]) {
#pragma unroll
  for (int a = 0; a < kApplyRowsPerWarp; ++a) {
    if (n0 + a < r.a.N) rows[a].load(r, b, h, n0 + a, lane);
  }
}

// Stages the warp's loaded rows [n0, n0 + 8) of r, prepared, into its tile columns.
template <typename T, int C>
__device__ __forceinline__ void stage_warp_rows(const Rows<T>& r, const HeadNorm<T, C>& hn,
                                                const RowData<T, C> (&rows)[kApplyRowsPerWarp],
                                                int64_t n0, int lane, double eps,
                                                typename Acc<T>::type* tile) {
#pragma unroll
  for (int a = 0; a < kApplyRowsPerWarp; ++a) {
    stage_row(r, hn, rows[a], n0 + a < r.a.N, lane, eps, tile + a, kTileStride,
              static_cast<int>(r.a.P + r.a.D));
  }
  __syncwarp();
}

// y (row a, column lane + 32 c) = the warp's staged tile rows times the matrix.
template <typename A, int C>
__device__ __forceinline__ void tile_product(const A* ms, const A* tile, int64_t d, int lane,
                                             A (&y)[kApplyRowsPerWarp][C]) {
#pragma unroll
  for (int a = 0; a < kApplyRowsPerWarp; ++a) {
#pragma unroll
    for (int c = 0; c < C; ++c) y[a][c] = 0;
  }
  for (int64_t i = 0; i < d; ++i) {
    A col[kApplyRowsPerWarp], m[C];
    load_column(tile + i * kTileStride, col);
#pragma unroll
    for (int c = 0; c < C; ++c) m[c] = ms[i * 32 * C + lane + 32 * c];
#pragma unroll
    for (int a = 0; a < kApplyRowsPerWarp; ++a) {
#pragma unroll
      for (int c = 0; c < C; ++c) y[a][c] += col[a] * m[c];
    }
  }
  __syncwarp();
}

// The block walks tiles t = blockIdx.y, blockIdx.y + gridDim.y, ...; the next tile's rows are
// loaded while the current one computes.
template <typename T, int C>
__global__ void __launch_bounds__(kThreads)
    apply_forward_kernel(Rows<T> q, double eps, const typename Acc<T>::type* __restrict__ matrix,
                         bool transpose, T* __restrict__ out) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t H = q.a.H, N = q.a.N, d = q.a.P + q.a.D;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  A* ms = reinterpret_cast<A*>(shared_bytes);     // (d, 32 C)
  A* tile = ms + d * 32 * C + warp * kApplyRowsPerWarp;  // this warp's columns of (d, stride)
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kApplyRows;
  RowData<T, C> rows[kApplyRowsPerWarp];
  const int64_t first = blockIdx.y * kApplyRows + warp * kApplyRowsPerWarp;
  load_warp_rows(q, b, h, first, lane, rows);
  load_matrix<A, C>(matrix + bh * d * d, d, transpose, ms);
  const HeadNorm<T, C> norm(q, h, lane);
  __syncthreads();
  for (int64_t n0 = first; n0 - warp * kApplyRowsPerWarp < N; n0 += stride) {
    stage_warp_rows(q, norm, rows, n0, lane, eps, tile);
    load_warp_rows(q, b, h, n0 + stride, lane, rows);
    A y[kApplyRowsPerWarp][C];
    tile_product(ms, tile, d, lane, y);
#pragma unroll
    for (int a = 0; a < kApplyRowsPerWarp; ++a) {
      if (n0 + a >= N) break;
      T* o = out + (bh * N + n0 + a) * d;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (lane + 32 * c < d) o[lane + 32 * c] = from_acc<T>(y[a][c]);
      }
    }
  }
}

// Rows of y, the gradient w.r.t. the target's prepared rows, are put back into the warp's tile
// columns; each is then turned into the target row's gradients (layer-norm backward in registers).
// The target rows load while the product computes, the next source rows during the row backward.
template <typename T, int C>
__global__ void __launch_bounds__(kThreads)
    apply_backward_kernel(Rows<T> source, Rows<T> target, double eps,
                          const typename Acc<T>::type* __restrict__ matrix, bool transpose,
                          T* __restrict__ grad_x, typename Acc<T>::type* __restrict__ pos_rows,
                          typename Acc<T>::type* __restrict__ weight_rows,
                          typename Acc<T>::type* __restrict__ norm_partial) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t H = target.a.H, N = target.a.N, D = target.a.D, P = target.a.P, d = P + D;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bool norm = target.a.gamma != nullptr;
  A* ms = reinterpret_cast<A*>(shared_bytes);
  A* tile = ms + d * 32 * C + warp * kApplyRowsPerWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kApplyRows;
  RowData<T, C> rows[kApplyRowsPerWarp], x[kApplyRowsPerWarp];
  const int64_t first = blockIdx.y * kApplyRows + warp * kApplyRowsPerWarp;
  load_warp_rows(source, b, h, first, lane, rows);
  load_matrix<A, C>(matrix + bh * d * d, d, transpose, ms);
  const HeadNorm<T, C> source_norm(source, h, lane), target_norm(target, h, lane);
  __syncthreads();
  A dgamma[C] = {}, dbeta[C] = {};
  for (int64_t n0 = first; n0 - warp * kApplyRowsPerWarp < N; n0 += stride) {
    stage_warp_rows(source, source_norm, rows, n0, lane, eps, tile);
    load_warp_rows(target, b, h, n0, lane, x);
    A y[kApplyRowsPerWarp][C];
    tile_product(ms, tile, d, lane, y);
    load_warp_rows(source, b, h, n0 + stride, lane, rows);
#pragma unroll
    for (int a = 0; a < kApplyRowsPerWarp; ++a) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (lane + 32 * c < d) tile[(lane + 32 * c) * kTileStride + a] = y[a][c];
      }
    }
    __syncwarp();
#pragma unroll
    for (int a = 0; a < kApplyRowsPerWarp; ++a) {
      const int64_t n = n0 + a, row = bh * N + n;
      if (n >= N) break;
      const A* yc = tile + a;  // column col of y at yc[col * kTileStride]
      const A s = x[a].s;
      A mean, rstd;
      row_stats(target, lane, eps, x[a], mean, rstd);
      A xhat[C], dy[C];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const bool on = lane + kWarp * c < D;
        xhat[c] = on ? (x[a].x[c] - mean) * rstd : A(0);
        dy[c] = on ? s * yc[(P + lane + kWarp * c) * kTileStride] : A(0);
      }
      const A y_pos = lane < P ? yc[lane * kTileStride] : A(0);
      if (pos_rows && lane < P) pos_rows[row * P + lane] = s * y_pos;
      if (weight_rows) {  // d/dw of w · row, with the unscaled row rebuilt (w may be zero)
        A dot = x[a].p * y_pos;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (lane + kWarp * c < D) {
            const A prepared = xhat[c] * target_norm.gamma[c] + target_norm.beta[c];
            dot += prepared * yc[(P + lane + kWarp * c) * kTileStride];
          }
        }
        dot = warp_sum(dot);
        if (lane == 0) weight_rows[row] = dot;
      }
      A dx[C];
      if (norm) {  // dx = rstd (γ∘dy − mean(γ∘dy) − x̂ mean(γ∘dy∘x̂))
        A c1 = 0, c2 = 0;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const A gdy = dy[c] * target_norm.gamma[c];
          c1 += gdy;
          c2 += gdy * xhat[c];
          dgamma[c] += dy[c] * xhat[c];
          dbeta[c] += dy[c];
        }
        c1 = warp_sum(c1) / A(D);
        c2 = warp_sum(c2) / A(D);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          dx[c] = rstd * (dy[c] * target_norm.gamma[c] - c1 - xhat[c] * c2);
        }
      } else {
#pragma unroll
        for (int c = 0; c < C; ++c) dx[c] = dy[c];
      }
      T* gx = grad_x + row * D;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (lane + kWarp * c < D) gx[lane + kWarp * c] = from_acc<T>(dx[c]);
      }
    }
    __syncwarp();
  }
  if (!norm) return;
  // The warps' norm-parameter sums, added in warp order through shared memory.
  __syncthreads();
  A* sums = reinterpret_cast<A*>(shared_bytes);  // (kWarps, 2, D), over the matrix: it is spent
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int64_t j = lane + kWarp * c;
    if (j < D) {
      sums[warp * 2 * D + j] = dgamma[c];
      sums[warp * 2 * D + D + j] = dbeta[c];
    }
  }
  __syncthreads();
  A* out = norm_partial + (static_cast<int64_t>(blockIdx.y) * gridDim.x + bh) * 2 * D;
  for (int64_t j = threadIdx.x; j < 2 * D; j += blockDim.x) {
    A sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += sums[w * 2 * D + j];
    out[j] = sum;
  }
}

// Shared memory of an apply block: the matrix (d, 32 C) and the tile (d, kTileStride); at least
// the (kWarps, 2, D) norm sums of the backward.
template <typename A, int C>
size_t apply_shared_bytes(int64_t d) {
  return std::max<int64_t>(d * 32 * C + d * kTileStride, kWarps * 2 * d) * sizeof(A);
}

template <typename T, int C>
cudaError_t launch_apply(const PrepareArgs& source, const PrepareArgs* target, double eps,
                         const void* matrix, bool transpose, void* out, const ApplyGrads* grads,
                         cudaStream_t stream) {
  using A = typename Acc<T>::type;
  const int64_t d = source.P + source.D;
  const size_t shared = apply_shared_bytes<A, C>(d);
  const dim3 grid(static_cast<unsigned>(source.B * source.H),
                  static_cast<unsigned>(apply_row_blocks(source.B, source.H, source.N)));
  const A* m = static_cast<const A*>(matrix);
  if (!target) {
    const cudaError_t fits = allow_shared_memory(apply_forward_kernel<T, C>, shared);
    if (fits != cudaSuccess) return fits;
    apply_forward_kernel<T, C><<<grid, kThreads, shared, stream>>>(Rows<T>{source}, eps, m,
                                                                   transpose, static_cast<T*>(out));
  } else {
    const cudaError_t fits = allow_shared_memory(apply_backward_kernel<T, C>, shared);
    if (fits != cudaSuccess) return fits;
    apply_backward_kernel<T, C><<<grid, kThreads, shared, stream>>>(
        Rows<T>{source}, Rows<T>{*target}, eps, m, transpose, static_cast<T*>(grads->grad_x),
        static_cast<A*>(grads->pos_rows), static_cast<A*>(grads->weight_rows),
        static_cast<A*>(grads->norm_partial));
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t apply_typed(const PrepareArgs& source, const PrepareArgs* target, double eps,
                        const void* matrix, bool transpose, void* out, const ApplyGrads* grads,
                        cudaStream_t stream) {
  switch (ceil_div(source.P + source.D, 32)) {
    case 1: return launch_apply<T, 1>(source, target, eps, matrix, transpose, out, grads, stream);
    case 2: return launch_apply<T, 2>(source, target, eps, matrix, transpose, out, grads, stream);
    case 3: return launch_apply<T, 3>(source, target, eps, matrix, transpose, out, grads, stream);
    default:
      return launch_apply<T, 4>(source, target, eps, matrix, transpose, out, grads, stream);
  }
}

bool fits(const PrepareArgs& a) { return linear_cuda_fits(a.P + a.D, a.P); }

}  // namespace

int64_t reduce_slices(int64_t B, int64_t H, int64_t N, int64_t d) {
  const int64_t side = reduce_side(d);
  return reduce_plan(B * H, N).splits * (kThreads / (side * side));
}

cudaError_t reduce_outer(const PrepareArgs& left, const PrepareArgs& right, double eps,
                         void* partial, cudaStream_t stream) {
  if (!fits(left) || left.P + left.D != right.P + right.D || left.kind != right.kind) {
    return cudaErrorInvalidValue;
  }
  if (left.B * left.H == 0) return cudaSuccess;
  return dispatch_kind(left.kind, [&](auto tag) {
    return reduce_typed<decltype(tag)>(left, right, eps, partial, stream);
  });
}

cudaError_t finalize(ScalarKind kind, const void* partial, int64_t slices, int64_t count,
                     const void* add, const void* mask, double scale, void* matrix,
                     void* matrix_t, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return dispatch_kind(kind, [&](auto tag) {
    using T = decltype(tag);
    using A = typename Acc<T>::type;
    const int64_t blocks = std::min<int64_t>(ceil_div(count, kThreads), 4096);
    finalize_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const A*>(partial), slices, count, static_cast<const T*>(add),
        static_cast<const T*>(mask), static_cast<A>(scale), static_cast<A*>(matrix),
        static_cast<T*>(matrix_t));
    return cudaGetLastError();
  });
}

int64_t apply_row_blocks(int64_t B, int64_t H, int64_t N) {
  const int64_t wanted = std::max<int64_t>(1, ceil_div(kTargetBlocks, std::max<int64_t>(B * H, 1)));
  return std::min(wanted, ceil_div(N, kApplyRows));
}

cudaError_t apply_forward(const PrepareArgs& q, double eps, const void* matrix, bool transpose,
                          void* out, cudaStream_t stream) {
  if (!fits(q)) return cudaErrorInvalidValue;
  if (q.B * q.H == 0) return cudaSuccess;
  return dispatch_kind(q.kind, [&](auto tag) {
    return apply_typed<decltype(tag)>(q, nullptr, eps, matrix, transpose, out, nullptr, stream);
  });
}

cudaError_t apply_backward(const PrepareArgs& source, const PrepareArgs& target, double eps,
                           const void* matrix, bool transpose, const ApplyGrads& grads,
                           cudaStream_t stream) {
  if (!fits(source) || !fits(target) || source.P + source.D != target.P + target.D ||
      source.kind != target.kind) {
    return cudaErrorInvalidValue;
  }
  if (target.B * target.H == 0) return cudaSuccess;
  return dispatch_kind(target.kind, [&](auto tag) {
    return apply_typed<decltype(tag)>(source, &target, eps, matrix, transpose, nullptr, &grads,
                                      stream);
  });
}

}  // namespace galerkin_ext::cuda
