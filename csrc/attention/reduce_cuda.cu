// The reduce kernels of the CUDA op core (core_cuda.cuh): a split reduction over the points
// that forms the (left width, right width) sums of outer products from prepared rows staged in
// shared memory, and the fixed-order sum of the splits' partials. The forward of kv_reduce and
// the dS of q_apply's backward. Sums are in float (double for double inputs) on the FMA units.
#include "attention/rows_cuda.cuh"

#include <algorithm>
#include <type_traits>

namespace galerkin_ext::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

// Blocks the launches aim for: several waves of a large GPU, so that the last wave's tail is
// short. A constant rather than the device's multiprocessor count: the partition of the sums,
// and so every bit of the results, depends on the shape alone.
constexpr int64_t kTargetBlocks = 1056;

// Rows staged per step, and rows per split: at least 128 so that a block's partial is small
// next to the rows it reads, at most 1024 so that large problems get many blocks.
constexpr int kStepRows = 32;
constexpr int kStepRowsPerWarp = kStepRows / kWarps;
constexpr int64_t kMinSplitRows = 128, kMaxSplitRows = 1024;

// Block (split, bh) sums left̂_n ⊗ right̂_n over its split's rows. Its TH × TH threads per group
// hold an R × R tile of the (TH R)² product each (row ty + TH i, column tx + TH j: the
// shared-memory reads are broadcasts or consecutive); the kThreads / TH² groups take alternate
// staged rows and write their partials separately.
template <typename TL, typename TR, int TH, int R>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(Rows<TL, typename Acc<TL>::type> left, Rows<TR, typename Acc<TL>::type> right,
                  double eps, int64_t rows_per_split, typename Acc<TL>::type* __restrict__ partial) {
  using A = typename Acc<TL>::type;
  constexpr int DP = TH * R;
  constexpr int kGroups = kThreads / (TH * TH);
  constexpr int LC = (DP + kWarp - 1) / kWarp;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  A* left_rows = reinterpret_cast<A*>(shared_bytes);  // (kStepRows, DP)
  A* right_rows = left_rows + kStepRows * DP;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int group = threadIdx.x / (TH * TH), ty = threadIdx.x % (TH * TH) / TH,
            tx = threadIdx.x % TH;
  const int64_t H = left.a.H, N = left.a.N;
  const int64_t dl = left.a.width(), dr = right.a.width();
  const int64_t bh = blockIdx.y, b = bh / H, h = bh % H;
  const HeadNorm<LC, TL, A> left_norm(left, h, lane);
  const HeadNorm<LC, TR, A> right_norm(right, h, lane);

  A acc[R][R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < R; ++j) acc[i][j] = 0;
  }
  const int64_t first = blockIdx.x * rows_per_split, end = min(N, first + rows_per_split);
  // The warp's rows of the next step are loaded while the current step computes.
  RowData<LC, TL, A> lrow[kStepRowsPerWarp];
  RowData<LC, TR, A> rrow[kStepRowsPerWarp];
  auto load_step = [&](int64_t n0) {
#pragma unroll
    for (int k = 0; k < kStepRowsPerWarp; ++k) {
      const int64_t n = n0 + warp * kStepRowsPerWarp + k;
      if (n < end) {
        lrow[k].load(left, b, h, n, lane);
        rrow[k].load(right, b, h, n, lane);
      }
    }
  };
  load_step(first);
  for (int64_t n0 = first; n0 < end; n0 += kStepRows) {
#pragma unroll
    for (int k = 0; k < kStepRowsPerWarp; ++k) {
      const int row = warp * kStepRowsPerWarp + k;
      const bool valid = n0 + row < end;
      stage_row(left, left_norm, lrow[k], valid, lane, eps, left_rows + row * DP, 1, DP);
      stage_row(right, right_norm, rrow[k], valid, lane, eps, right_rows + row * DP, 1, DP);
    }
    __syncthreads();
    load_step(n0 + kStepRows);
    for (int t = group; t < kStepRows; t += kGroups) {
      A l[R], r[R];
#pragma unroll
      for (int i = 0; i < R; ++i) l[i] = left_rows[t * DP + ty + TH * i];
#pragma unroll
      for (int j = 0; j < R; ++j) r[j] = right_rows[t * DP + tx + TH * j];
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int j = 0; j < R; ++j) acc[i][j] += l[i] * r[j];
      }
    }
    __syncthreads();
  }
  const int64_t slice = static_cast<int64_t>(blockIdx.x) * kGroups + group;
  A* out = partial + (slice * gridDim.y + bh) * dl * dr;
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = ty + TH * i, col = tx + TH * j;
      if (row < dl && col < dr) out[row * dr + col] = acc[i][j];
    }
  }
}

struct Plan {
  int64_t splits, rows_per_split;
};

Plan plan(int64_t BH, int64_t N) {
  const int64_t wanted = ceil_div(ceil_div(BH * N, kTargetBlocks), kStepRows) * kStepRows;
  const int64_t rows = std::min(std::clamp(wanted, kMinSplitRows, kMaxSplitRows),
                                ceil_div(std::max<int64_t>(N, 1), kStepRows) * kStepRows);
  return {ceil_div(N, rows), rows};
}

// Threads per side of a group's tile: 8 (4 groups) up to a width of 64, 16 (one group) above.
int64_t side(int64_t width) { return width <= 64 ? 8 : 16; }

template <typename TL, typename TR, int TH, int R>
cudaError_t launch(const RowsArgs& left, const RowsArgs& right, double eps, void* partial,
                   cudaStream_t stream) {
  using A = typename Acc<TL>::type;
  const size_t shared = 2 * kStepRows * TH * R * sizeof(A);
  const cudaError_t fits = allow_shared_memory(reduce_kernel<TL, TR, TH, R>, shared);
  if (fits != cudaSuccess) return fits;
  const Plan p = plan(left.B * left.H, left.N);
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(left.B * left.H));
  reduce_kernel<TL, TR, TH, R><<<grid, kThreads, shared, stream>>>(
      Rows<TL, A>{left}, Rows<TR, A>{right}, eps, p.rows_per_split, static_cast<A*>(partial));
  return cudaGetLastError();
}

// The tile just large enough for the wider operand (double, used for checking rather than
// speed, gets one size per side to keep the build small).
template <typename TL, typename TR>
cudaError_t reduce_typed(const RowsArgs& left, const RowsArgs& right, double eps, void* partial,
                         cudaStream_t stream) {
  const int64_t width = std::max(left.width(), right.width());
  if constexpr (std::is_same_v<TL, double>) {
    if (width <= 64) return launch<TL, TR, 8, 8>(left, right, eps, partial, stream);
    return launch<TL, TR, 16, 8>(left, right, eps, partial, stream);
  } else {
    if (width <= 64) {
      switch (ceil_div(width, 8)) {
        case 1: return launch<TL, TR, 8, 1>(left, right, eps, partial, stream);
        case 2: return launch<TL, TR, 8, 2>(left, right, eps, partial, stream);
        case 3: return launch<TL, TR, 8, 3>(left, right, eps, partial, stream);
        case 4: return launch<TL, TR, 8, 4>(left, right, eps, partial, stream);
        case 5: return launch<TL, TR, 8, 5>(left, right, eps, partial, stream);
        case 6: return launch<TL, TR, 8, 6>(left, right, eps, partial, stream);
        case 7: return launch<TL, TR, 8, 7>(left, right, eps, partial, stream);
        default: return launch<TL, TR, 8, 8>(left, right, eps, partial, stream);
      }
    }
    switch (ceil_div(width, 16)) {
      case 5: return launch<TL, TR, 16, 5>(left, right, eps, partial, stream);
      case 6: return launch<TL, TR, 16, 6>(left, right, eps, partial, stream);
      case 7: return launch<TL, TR, 16, 7>(left, right, eps, partial, stream);
      default: return launch<TL, TR, 16, 8>(left, right, eps, partial, stream);
    }
  }
}

template <typename A>
__global__ void sum_kernel(const A* __restrict__ partial, int64_t slices, int64_t count,
                           A* __restrict__ sum) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    A total = 0;
    for (int64_t s = 0; s < slices; ++s) total += partial[s * count + i];
    sum[i] = total;
  }
}

}  // namespace

int64_t reduce_slices(int64_t B, int64_t H, int64_t n, int64_t left_width, int64_t right_width) {
  const int64_t s = side(std::max(left_width, right_width));
  return plan(B * H, n).splits * (kThreads / (s * s));
}

cudaError_t reduce_rows(const RowsArgs& left, const RowsArgs& right, double eps, void* partial,
                        cudaStream_t stream) {
  if (!rows_fit(left) || !rows_fit(right) || left.B != right.B || left.H != right.H ||
      left.N != right.N) {
    return cudaErrorInvalidValue;
  }
  if (left.B * left.H * left.N == 0) return cudaSuccess;
  return dispatch_pair(left.kind, right.kind, [&](auto left_tag, auto right_tag) {
    return reduce_typed<decltype(left_tag), decltype(right_tag)>(left, right, eps, partial,
                                                                 stream);
  });
}

cudaError_t sum_partials(ScalarKind kind, const void* partial, int64_t slices, int64_t count,
                         void* sum, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(ceil_div(count, kThreads), 4096);
  if (kind == ScalarKind::Double) {
    sum_kernel<double><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const double*>(partial), slices, count, static_cast<double*>(sum));
  } else {
    sum_kernel<float><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const float*>(partial), slices, count, static_cast<float*>(sum));
  }
  return cudaGetLastError();
}

}  // namespace galerkin_ext::cuda
