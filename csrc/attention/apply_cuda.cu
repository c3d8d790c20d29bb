// The apply kernels of the CUDA op core (core_cuda.cuh): per-row products of prepared rows with
// a (rows, cols) matrix held in shared memory, with the row maps applied on the fly. The forward
// of q_apply (optionally normalised per block, optionally plus Q̂), the G' of its backward, and the backward of a
// row map from the gradient w.r.t. its prepared rows (both gradients of kv_reduce's backward,
// q's of q_apply's). Sums are in float (double for double inputs) on the FMA units.
//
// Block (bh, ·) walks tiles of kTileRows rows. Each warp stages its own 8 rows, transposed, into
// its columns of the tile (column i of a row at i · kTileStride) and computes their products:
// lane l holds columns l + 32 c of the 8 result rows. A warp only touches its own tile columns,
// so a tile needs warp barriers only.
#include "attention/rows_cuda.cuh"

#include <algorithm>
#include <type_traits>

namespace galerkin_ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int64_t kTargetBlocks = 1056;  // as reduce_cuda.cu: the grid depends on the shape only

constexpr int kRowsPerWarp = 8;
constexpr int kTileRows = kRowsPerWarp * kWarps;
constexpr int kTileStride = kTileRows + 4;  // keeps 16-byte alignment and spreads the banks

enum class Epilogue { kProduct, kNormalized, kNormalizerGrad };

// The matrix of (b, h) into ms (rows, 32 C), zero past cols.
template <typename A, int C>
__device__ void load_matrix(const MatrixArgs& m, int64_t bh, A* ms) {
  const A* base = static_cast<const A*>(m.data) + bh * (m.transpose ? m.cols : m.rows) * m.ld;
  for (int64_t i = threadIdx.x; i < m.rows * 32 * C; i += blockDim.x) {
    const int64_t row = i / (32 * C), col = i % (32 * C);
    ms[i] = col >= m.cols ? A(0) : m.transpose ? base[col * m.ld + row] : base[row * m.ld + col];
  }
}

// The 8 entries of a tile column that belong to one warp (16-byte aligned).
template <typename A>
__device__ __forceinline__ void load_column(const A* p, A (&v)[kRowsPerWarp]) {
  if constexpr (std::is_same_v<A, float>) {
    const float4 lo = reinterpret_cast<const float4*>(p)[0];
    const float4 hi = reinterpret_cast<const float4*>(p)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
  } else {
#pragma unroll
    for (int a = 0; a < kRowsPerWarp; ++a) v[a] = p[a];
  }
}

// The warp's rows [n0, n0 + 8) of an operand, loaded where they exist.
template <int C, typename T, typename A>
__device__ __forceinline__ void load_rows(const Rows<T, A>& r, int64_t b, int64_t h, int64_t n0,
                                          int lane, RowData<C, T, A> (&rows)[kRowsPerWarp]) {
#pragma unroll
  for (int a = 0; a < kRowsPerWarp; ++a) {
    if (n0 + a < r.a.N) rows[a].load(r, b, h, n0 + a, lane);
  }
}

// Stages the warp's loaded rows [n0, n0 + 8), prepared, into its tile columns.
template <int C, typename T, typename A>
__device__ __forceinline__ void stage_rows(const Rows<T, A>& r, const HeadNorm<C, T, A>& hn,
                                           const RowData<C, T, A> (&rows)[kRowsPerWarp],
                                           int64_t n0, int lane, double eps, A* tile) {
#pragma unroll
  for (int a = 0; a < kRowsPerWarp; ++a) {
    stage_row(r, hn, rows[a], n0 + a < r.a.N, lane, eps, tile + a, kTileStride,
              static_cast<int>(r.a.width()));
  }
  __syncwarp();
}

// y (row a, column lane + 32 c) = the warp's staged tile rows (`rows` columns) times ms.
template <typename A, int C>
__device__ __forceinline__ void tile_product(const A* ms, const A* tile, int64_t rows, int lane,
                                             A (&y)[kRowsPerWarp][C]) {
#pragma unroll
  for (int a = 0; a < kRowsPerWarp; ++a) {
#pragma unroll
    for (int c = 0; c < C; ++c) y[a][c] = 0;
  }
  for (int64_t i = 0; i < rows; ++i) {
    A col[kRowsPerWarp], m[C];
    load_column(tile + i * kTileStride, col);
#pragma unroll
    for (int c = 0; c < C; ++c) m[c] = ms[i * 32 * C + lane + 32 * c];
#pragma unroll
    for (int a = 0; a < kRowsPerWarp; ++a) {
#pragma unroll
      for (int c = 0; c < C; ++c) y[a][c] += col[a] * m[c];
    }
  }
  __syncwarp();
}

// The warp's staged tile rows' first `cols` columns, laid out as y (Q̂ for the skip term).
template <typename A, int C>
__device__ __forceinline__ void read_tile(const A* tile, int64_t cols, int lane,
                                          A (&rows)[kRowsPerWarp][C]) {
#pragma unroll
  for (int a = 0; a < kRowsPerWarp; ++a) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      rows[a][c] = lane + 32 * c < cols ? tile[(lane + 32 * c) * kTileStride + a] : A(0);
    }
  }
}

// Puts y's first `cols` columns back into the warp's tile columns (rows of the tile = y's
// columns), for a row-wise epilogue that needs other lanes' columns.
template <typename A, int C>
__device__ __forceinline__ void store_tile(const A (&y)[kRowsPerWarp][C], int64_t cols, int lane,
                                           A* tile) {
#pragma unroll
  for (int a = 0; a < kRowsPerWarp; ++a) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (lane + 32 * c < cols) tile[(lane + 32 * c) * kTileStride + a] = y[a][c];
    }
  }
  __syncwarp();
}

// Shared memory of an apply block: the matrix (rows, 32 C) and the tile (tile_rows, stride);
// at least the (kWarps, 2, D) norm sums of the backward.
template <typename A, int C>
size_t shared_bytes(int64_t rows, int64_t tile_rows, int64_t D) {
  return std::max<int64_t>(rows * 32 * C + tile_rows * kTileStride, kWarps * 2 * D) * sizeof(A);
}

// Forward: Y = Q̂ · matrix, then the epilogue (plus Q̂ with skip). The block walks tiles t = blockIdx.y,
// blockIdx.y + gridDim.y, ...; the next tile's rows are loaded while the current one computes.
template <typename T, int C>
__global__ void __launch_bounds__(kThreads)
    apply_kernel(Rows<T, typename Acc<T>::type> q, double eps, MatrixArgs m, Epilogue epilogue,
                 int64_t blocks, bool skip, const T* __restrict__ grad, void* __restrict__ out) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t H = q.a.H, N = q.a.N, cols = m.cols;
  const int64_t w = epilogue == Epilogue::kProduct ? cols : cols / blocks - 1;  // output width
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  A* ms = reinterpret_cast<A*>(shared);
  A* tile = ms + m.rows * 32 * C + warp * kRowsPerWarp;  // this warp's columns
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kTileRows;
  RowData<C, T, A> rows[kRowsPerWarp];
  const int64_t first = blockIdx.y * kTileRows + warp * kRowsPerWarp;
  load_rows(q, b, h, first, lane, rows);
  load_matrix<A, C>(m, bh, ms);
  const HeadNorm<C, T, A> norm(q, h, lane);
  __syncthreads();
  for (int64_t n0 = first; n0 - warp * kRowsPerWarp < N; n0 += stride) {
    stage_rows(q, norm, rows, n0, lane, eps, tile);
    load_rows(q, b, h, n0 + stride, lane, rows);
    A y[kRowsPerWarp][C], q_rows[kRowsPerWarp][C] = {};
    tile_product(ms, tile, m.rows, lane, y);
    if (skip) read_tile(tile, w, lane, q_rows);
    if (epilogue == Epilogue::kProduct) {
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) {
        if (n0 + a >= N) break;
        T* o = static_cast<T*>(out) + (bh * N + n0 + a) * w;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (lane + 32 * c < w) o[lane + 32 * c] = from_acc<T>(y[a][c] + q_rows[a][c]);
        }
      }
      continue;
    }
    store_tile(y, cols, lane, tile);
#pragma unroll
    for (int a = 0; a < kRowsPerWarp; ++a) {
      if (n0 + a >= N) break;
      const int64_t row = bh * N + n0 + a;
      const A* ya = tile + a;  // column col of Y at ya[col · kTileStride]
      if (epilogue == Epilogue::kNormalized) {
        A o[C];
#pragma unroll
        for (int c = 0; c < C; ++c) o[c] = q_rows[a][c];
        for (int64_t l = 0; l < blocks; ++l) {
          const A den = ya[(l * (w + 1) + w) * kTileStride];
          if (den == A(0)) continue;  // a sample without keys: 0/0 := 0
          // divided, not times 1 / δ, which overflows for a subnormal δ (q_apply_cpu.cpp)
#pragma unroll
          for (int c = 0; c < C; ++c) {
            if (lane + 32 * c < w) o[c] += ya[(l * (w + 1) + lane + 32 * c) * kTileStride] / den;
          }
        }
        T* dst = static_cast<T*>(out) + row * w;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (lane + 32 * c < w) dst[lane + 32 * c] = from_acc<T>(o[c]);
        }
      } else {  // G' = [g / δ | -⟨g, n⟩ / δ²] per block
        A g[C];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          g[c] = lane + 32 * c < w ? to_acc<A>(grad[row * w + lane + 32 * c]) : A(0);
        }
        A* dst = static_cast<A*>(out) + row * cols;
        for (int64_t l = 0; l < blocks; ++l) {
          const A den = ya[(l * (w + 1) + w) * kTileStride];
          A dot = 0;
#pragma unroll
          for (int c = 0; c < C; ++c) {
            if (lane + 32 * c < w) dot += g[c] * ya[(l * (w + 1) + lane + 32 * c) * kTileStride];
          }
          dot = warp_sum(dot);
          const bool empty = den == A(0);  // 0/0 := 0, zero gradients
#pragma unroll
          for (int c = 0; c < C; ++c) {
            if (lane + 32 * c < w) dst[l * (w + 1) + lane + 32 * c] = empty ? A(0) : g[c] / den;
          }
          if (lane == 0) dst[l * (w + 1) + w] = empty ? A(0) : -(dot / den) / den;
        }
      }
    }
    __syncwarp();
  }
}

// Backward of the target's row map: Y = sourcê · matrix is the gradient w.r.t. the target's
// prepared rows; it is put back into the warp's tile columns and each row is turned into the
// target row's gradients (row_backward). The target rows load while the product computes, the
// next source rows during the row backward.
template <typename TS, typename T, int C>
__global__ void __launch_bounds__(kThreads)
    apply_backward_kernel(Rows<TS, typename Acc<T>::type> source,
                          Rows<T, typename Acc<T>::type> target, double eps, MatrixArgs m,
                          const T* __restrict__ skip_grad, T* __restrict__ grad_x, typename Acc<T>::type* __restrict__ pos_rows,
                          typename Acc<T>::type* __restrict__ weight_rows,
                          typename Acc<T>::type* __restrict__ norm_partial) {
  using A = typename Acc<T>::type;
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t H = target.a.H, N = target.a.N, D = target.a.D, P = target.a.P;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const bool norm = target.a.map == RowMapKind::LayerNorm;
  A* ms = reinterpret_cast<A*>(shared);
  A* tile = ms + m.rows * 32 * C + warp * kRowsPerWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kTileRows;
  RowData<C, TS, A> rows[kRowsPerWarp];
  RowData<C, T, A> x[kRowsPerWarp];
  const int64_t first = blockIdx.y * kTileRows + warp * kRowsPerWarp;
  load_rows(source, b, h, first, lane, rows);
  load_matrix<A, C>(m, bh, ms);
  const HeadNorm<C, TS, A> source_norm(source, h, lane);
  const HeadNorm<C, T, A> target_norm(target, h, lane);
  __syncthreads();
  A dgamma[C] = {}, dbeta[C] = {};
  for (int64_t n0 = first; n0 - warp * kRowsPerWarp < N; n0 += stride) {
    stage_rows(source, source_norm, rows, n0, lane, eps, tile);
    load_rows(target, b, h, n0, lane, x);
    A y[kRowsPerWarp][C];
    tile_product(ms, tile, m.rows, lane, y);
    load_rows(source, b, h, n0 + stride, lane, rows);
    if (skip_grad != nullptr) {
#pragma unroll
      for (int a = 0; a < kRowsPerWarp; ++a) {
        if (n0 + a >= N) break;
        const T* g = skip_grad + (bh * N + n0 + a) * (P + D);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (lane + 32 * c < P + D) y[a][c] += to_acc<A>(g[lane + 32 * c]);
        }
      }
    }
    store_tile(y, P + D, lane, tile);
#pragma unroll
    for (int a = 0; a < kRowsPerWarp; ++a) {
      const int64_t n = n0 + a, row = bh * N + n;
      if (n >= N) break;
      row_backward(target, target_norm, x[a], lane, eps, tile + a, kTileStride, grad_x + row * D,
                   pos_rows ? pos_rows + row * P : nullptr,
                   weight_rows ? weight_rows + row : nullptr, dgamma, dbeta);
    }
    __syncwarp();
  }
  if (!norm) return;
  // The warps' norm-parameter sums, added in warp order through shared memory.
  __syncthreads();
  A* sums = reinterpret_cast<A*>(shared);  // (kWarps, 2, D), over the matrix: it is spent
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

dim3 grid_of(const RowsArgs& r) {
  return dim3(static_cast<unsigned>(r.B * r.H),
              static_cast<unsigned>(apply_row_blocks(r.B, r.H, r.N)));
}

// Calls run(C) with the columns per lane C that hold every row and matrix side of the launch;
// double, used for checking rather than speed, gets the widest only, to keep the build small.
template <typename T, typename Run>
cudaError_t with_lane_columns(int64_t widest, Run&& run) {
  if constexpr (std::is_same_v<T, double>) {
    return run(std::integral_constant<int, 4>{});
  } else {
    switch (ceil_div(widest, 32)) {
      case 1: return run(std::integral_constant<int, 1>{});
      case 2: return run(std::integral_constant<int, 2>{});
      case 3: return run(std::integral_constant<int, 3>{});
      default: return run(std::integral_constant<int, 4>{});
    }
  }
}

template <typename T>
cudaError_t apply_typed(const RowsArgs& q, double eps, const MatrixArgs& m, Epilogue epilogue,
                        int64_t blocks, bool skip, const void* grad, void* out,
                        cudaStream_t stream) {
  using A = typename Acc<T>::type;
  auto run = [&](auto columns) {
    constexpr int C = decltype(columns)::value;
    const auto kernel = apply_kernel<T, C>;
    const size_t shared = shared_bytes<A, C>(m.rows, std::max(m.rows, m.cols), 0);
    const cudaError_t fits = allow_shared_memory(kernel, shared);
    if (fits != cudaSuccess) return fits;
    kernel<<<grid_of(q), kThreads, shared, stream>>>(Rows<T, A>{q}, eps, m, epilogue, blocks,
                                                     skip, static_cast<const T*>(grad), out);
    return cudaGetLastError();
  };
  return with_lane_columns<T>(std::max(m.rows, m.cols), run);
}

template <typename TS, typename T>
cudaError_t backward_typed(const RowsArgs& source, const RowsArgs& target, double eps,
                           const MatrixArgs& m, const void* skip_grad, const TargetGrads& g,
                           cudaStream_t stream) {
  using A = typename Acc<T>::type;
  auto run = [&](auto columns) {
    constexpr int C = decltype(columns)::value;
    const auto kernel = apply_backward_kernel<TS, T, C>;
    const size_t shared = shared_bytes<A, C>(m.rows, std::max(m.rows, m.cols), target.D);
    const cudaError_t fits = allow_shared_memory(kernel, shared);
    if (fits != cudaSuccess) return fits;
    kernel<<<grid_of(target), kThreads, shared, stream>>>(
        Rows<TS, A>{source}, Rows<T, A>{target}, eps, m, static_cast<const T*>(skip_grad),
        static_cast<T*>(g.grad_x),
        static_cast<A*>(g.pos_rows), static_cast<A*>(g.weight_rows),
        static_cast<A*>(g.norm_partial));
    return cudaGetLastError();
  };
  return with_lane_columns<T>(std::max(m.rows, m.cols), run);
}

// The matrix matches the rows it multiplies and fits the kernels; its columns make up
// `normalizers` blocks of at least 2 where there are any.
bool matrix_fits(const MatrixArgs& m, int64_t rows, int64_t normalizers) {
  return m.rows == rows && m.cols >= 1 && m.cols <= kMaxWidth &&
         m.ld >= (m.transpose ? m.rows : m.cols) && normalizers >= 0 &&
         (normalizers == 0 || (m.cols % normalizers == 0 && m.cols / normalizers >= 2));
}

}  // namespace

int64_t apply_row_blocks(int64_t B, int64_t H, int64_t N) {
  const int64_t wanted = std::max<int64_t>(1, ceil_div(kTargetBlocks, std::max<int64_t>(B * H, 1)));
  return std::max<int64_t>(1, std::min(wanted, ceil_div(N, kTileRows)));
}

cudaError_t apply_rows(const RowsArgs& q, double eps, const MatrixArgs& matrix,
                       int64_t normalizers, bool skip, void* out, cudaStream_t stream) {
  if (!rows_fit(q) || !matrix_fits(matrix, q.width(), normalizers)) return cudaErrorInvalidValue;
  const int64_t out_width = normalizers == 0 ? matrix.cols : matrix.cols / normalizers - 1;
  if (skip && out_width != q.width()) return cudaErrorInvalidValue;
  if (q.B * q.H * q.N == 0) return cudaSuccess;
  return dispatch_kind(q.kind, [&](auto tag) {
    using T = decltype(tag);
    const Epilogue epilogue = normalizers == 0 ? Epilogue::kProduct : Epilogue::kNormalized;
    return apply_typed<T>(q, eps, matrix, epilogue, std::max<int64_t>(normalizers, 1), skip,
                          nullptr, out, stream);
  });
}

cudaError_t normalizer_grad(const RowsArgs& q, double eps, const MatrixArgs& matrix,
                            int64_t normalizers, const void* grad, void* grad_y,
                            cudaStream_t stream) {
  if (!rows_fit(q) || normalizers < 1 || !matrix_fits(matrix, q.width(), normalizers)) {
    return cudaErrorInvalidValue;
  }
  if (q.B * q.H * q.N == 0) return cudaSuccess;
  return dispatch_kind(q.kind, [&](auto tag) {
    return apply_typed<decltype(tag)>(q, eps, matrix, Epilogue::kNormalizerGrad, normalizers,
                                      false, grad, grad_y, stream);
  });
}

cudaError_t apply_rows_backward(const RowsArgs& source, const RowsArgs& target, double eps,
                                const MatrixArgs& matrix, const void* skip_grad,
                                const TargetGrads& grads, cudaStream_t stream) {
  if (!rows_fit(source) || !rows_fit(target) || !matrix_fits(matrix, source.width(), 0) ||
      matrix.cols != target.P + target.D || source.B != target.B || source.H != target.H ||
      source.N != target.N) {
    return cudaErrorInvalidValue;
  }
  if (target.B * target.H * target.N == 0) return cudaSuccess;
  return dispatch_pair(target.kind, source.kind, [&](auto target_tag, auto source_tag) {
    return backward_typed<decltype(source_tag), decltype(target_tag)>(
        source, target, eps, matrix, skip_grad, grads, stream);
  });
}

}  // namespace galerkin_ext::cuda
