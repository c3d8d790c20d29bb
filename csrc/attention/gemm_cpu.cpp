// The kernels of gemm_cpu.h: output tiles of R = 3 rows × 4 vectors of columns held in registers
// (12 accumulators, with 3 broadcasts and one loaded vector: the 16 AVX2 registers); columns
// that fill no whole vector are computed as one and stored in part.
#include "gemm_cpu.h"

#include "prepare_cpu.h"  // GALERKIN_EXT_CPU_KERNEL

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace galerkin_ext::cpu {
namespace {

// 32-byte vectors of T (GCC ignores vector_size on an alias template of a dependent type, hence
// the specialisations).
template <typename T>
struct VectorOf;
template <>
struct VectorOf<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VectorOf<double> {
  typedef double type __attribute__((vector_size(32)));
};
template <typename T>
using Vec = typename VectorOf<T>::type;
template <typename T>
constexpr int64_t kLanes = 32 / sizeof(T);
static_assert(sizeof(Vec<float>) == 32 && sizeof(Vec<double>) == 32);
static_assert(8 % kLanes<float> == 0 && 8 % kLanes<double> == 0, "vector_width covers vectors");

// x as the left factor of a tile: element (r, k) at p[r * row + k * inner].
template <typename T>
struct Left {
  const T* p;
  int64_t row, inner;
};

// Output rows [0, R) × vectors [0, NV) at column 0 of a and out: Σ_k x(r, k) a[k, :], written
// (or added, Add) to out; the last vector stores its first `last` columns only. a's rows are
// readable to the last vector's end.
template <typename T, int R, int NV, bool Add>
__attribute__((always_inline)) inline void tile(Left<T> x, const T* a, int64_t lda, int64_t K,
                                                T* out, int64_t ldo, int64_t last) {
  Vec<T> acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec<T>{};
  }
  for (int64_t k = 0; k < K; ++k) {
    const T* ak = a + k * lda;
    const T* xk = x.p + k * x.inner;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      Vec<T> column;
      std::memcpy(&column, ak + v * kLanes<T>, sizeof column);  // unaligned load
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][v] += xk[r * x.row] * column;
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int64_t cols = v + 1 < NV ? kLanes<T> : last;
      T* o = out + r * ldo + v * kLanes<T>;
      if (Add) {
        Vec<T> before{};
        std::memcpy(&before, o, cols * sizeof(T));
        acc[r][v] += before;
      }
      std::memcpy(o, &acc[r][v], cols * sizeof(T));
    }
  }
}

// Output rows [0, rows) × the 1-4 vectors of columns at column 0 of a and out: bands of 3 rows,
// then single rows; row r of the left factor at x.p + r * x.row.
template <typename T, int NV, bool Add>
__attribute__((always_inline)) inline void column_block(Left<T> x, int64_t rows, const T* a,
                                                        int64_t lda, int64_t K, T* out,
                                                        int64_t ldo, int64_t last) {
  int64_t r = 0;
  for (; r + 3 <= rows; r += 3) {
    tile<T, 3, NV, Add>({x.p + r * x.row, x.row, x.inner}, a, lda, K, out + r * ldo, ldo, last);
  }
  for (; r < rows; ++r) {
    tile<T, 1, NV, Add>({x.p + r * x.row, x.row, x.inner}, a, lda, K, out + r * ldo, ldo, last);
  }
}

// Every output row, one block of 4 vectors of columns at a time (so that the block's panel of
// a, K × 4 vectors, stays in L1 while all rows pass: at d ≈ 100 the whole of a does not fit);
// the last block has 1-4 vectors, its last possibly partial.
template <typename T, bool Add>
__attribute__((always_inline)) inline void column_blocks(Left<T> x, int64_t rows, const T* a,
                                                         int64_t lda, int64_t K, int64_t W,
                                                         T* out, int64_t ldo) {
  constexpr int64_t L = kLanes<T>;
  // The W / L vectors of a row split into blocks of as equal sizes as can be (13 vectors: 4, 3,
  // 3, 3 rather than 4, 4, 4, 1, whose last block would be load-bound).
  const int64_t total = (W + L - 1) / L, count = (total + 3) / 4;
  for (int64_t b = 0, j = 0; b < count; ++b) {
    const int64_t vectors = total / count + (b < total % count ? 1 : 0);
    const int64_t cols = std::min(vectors * L, W - j), last = cols - (vectors - 1) * L;
    switch (vectors) {
      case 4: column_block<T, 4, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      case 3: column_block<T, 3, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      case 2: column_block<T, 2, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      default: column_block<T, 1, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
    }
    j += cols;
  }
}

}  // namespace

template <typename T>
GALERKIN_EXT_CPU_KERNEL void rows_times_matrix(const T* x, int64_t ldx, const T* a, int64_t lda,
                                               int64_t m, int64_t K, int64_t W, T* out,
                                               int64_t ldo) {
  // a copied with its rows padded to whole vectors (zeros), so that every load is in bounds.
  const int64_t ldp = vector_width(W);
  std::vector<T> padded(K * ldp, T(0));
  for (int64_t k = 0; k < K; ++k) std::copy(a + k * lda, a + k * lda + W, &padded[k * ldp]);
  column_blocks<T, false>({x, ldx, 1}, m, padded.data(), ldp, K, W, out, ldo);
}

template <typename T>
GALERKIN_EXT_CPU_KERNEL void rows_transposed_times_rows(const T* x, int64_t ldx, const T* y,
                                                        int64_t ldy, int64_t m, int64_t K,
                                                        int64_t W, T* out, int64_t ldo) {
  // Blocks of 64 rows: a block's panel of y under one column block (64 × 4 vectors, 8 KiB)
  // stays in L1 while every band of output rows passes over it, and each block's sum is added
  // to out in order (single threaded on this EPYC, 32 and 97 wide: 64 rows beat 128 and 256).
  constexpr int64_t block = 64;
  if (m == 0) {
    for (int64_t k = 0; k < K; ++k) std::fill(out + k * ldo, out + k * ldo + W, T(0));
    return;
  }
  for (int64_t i = 0; i < m; i += block) {
    const int64_t rows = std::min(block, m - i);
    const Left<T> xt{x + i * ldx, 1, ldx};  // xᵀ: output row k is column k of x
    if (i == 0) {
      column_blocks<T, false>(xt, K, y + i * ldy, ldy, rows, W, out, ldo);
    } else {
      column_blocks<T, true>(xt, K, y + i * ldy, ldy, rows, W, out, ldo);
    }
  }
}

#define GALERKIN_EXT_INSTANTIATE(T)                                                               \
  template void rows_times_matrix<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,    \
                                     int64_t, T*, int64_t);                                     \
  template void rows_transposed_times_rows<T>(const T*, int64_t, const T*, int64_t, int64_t,    \
                                              int64_t, int64_t, T*, int64_t);
GALERKIN_EXT_INSTANTIATE(float)
GALERKIN_EXT_INSTANTIATE(double)
#undef GALERKIN_EXT_INSTANTIATE

void rows_times_matrix(at::Tensor& out, const at::Tensor& x, const at::Tensor& a) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && a.dim() == 2 && out.dim() == 2);
  TORCH_INTERNAL_ASSERT(x.size(1) == a.size(0) && out.size(0) == x.size(0) &&
                        out.size(1) == a.size(1));
  TORCH_INTERNAL_ASSERT(x.stride(1) == 1 && a.stride(1) == 1 && out.stride(1) == 1);
  TORCH_INTERNAL_ASSERT(a.scalar_type() == x.scalar_type() &&
                        out.scalar_type() == x.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "galerkin_ext_rows_times_matrix", [&] {
    rows_times_matrix<scalar_t>(x.const_data_ptr<scalar_t>(), x.stride(0),
                                a.const_data_ptr<scalar_t>(), a.stride(0), x.size(0), x.size(1),
                                a.size(1), out.mutable_data_ptr<scalar_t>(), out.stride(0));
  });
}

void rows_transposed_times_rows(at::Tensor& out, const at::Tensor& x, const at::Tensor& y) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && y.dim() == 2 && out.dim() == 2);
  TORCH_INTERNAL_ASSERT(x.size(0) == y.size(0) && out.size(0) == x.size(1) &&
                        out.size(1) == y.size(1));
  TORCH_INTERNAL_ASSERT(x.stride(1) == 1 && y.stride(1) == 1 && out.stride(1) == 1);
  TORCH_INTERNAL_ASSERT(y.stride(0) >= vector_width(y.size(1)));
  TORCH_INTERNAL_ASSERT(y.scalar_type() == x.scalar_type() &&
                        out.scalar_type() == x.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "galerkin_ext_rows_transposed_times_rows", [&] {
    rows_transposed_times_rows<scalar_t>(
        x.const_data_ptr<scalar_t>(), x.stride(0), y.const_data_ptr<scalar_t>(), y.stride(0),
        x.size(0), x.size(1), y.size(1), out.mutable_data_ptr<scalar_t>(), out.stride(0));
  });
}

}  // namespace galerkin_ext::cpu
