// The kernels of gemm_cpu.h: output tiles of R rows × up to 4 vectors of columns held in
// registers. With 32-byte vectors (AVX2, baseline x86-64, other CPUs) R = 3: 12 accumulators, 3
// broadcasts and one loaded vector fill the 16 AVX2 registers. AVX-512 machines run 64-byte
// vectors in bands of 6-8 rows (up to 24 accumulators of their 32 registers): on one thread
// of a 2-core Intel Xeon the 32-byte kernels ran at 56-111 GF/s, the 64-byte ones at 75-181,
// MKL at 106-186 (benchmarks/results/cpu_products_xeon*.json). Columns that fill no whole
// vector are computed as one and stored in part.
#include "gemm_cpu.h"

#include "cpu_clones.h"

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace galerkin_ext::cpu {
namespace {

// VB-byte vectors of T (a member typedef: GCC ignores vector_size on an alias template of a
// dependent type).
template <typename T, int VB>
struct VectorOf {
  typedef T type __attribute__((vector_size(VB)));
};
template <typename T, int VB>
using Vec = typename VectorOf<T, VB>::type;
static_assert(sizeof(Vec<float, 32>) == 32 && sizeof(Vec<double, 64>) == 64,
              "the compiler applies vector_size to the member typedef");
template <typename T, int VB>
constexpr int64_t kLanes = VB / sizeof(T);
// Rows of a tile band of NV vectors: with 64-byte vectors 24 accumulators where there are 3 or
// 4 vectors, 8 rows at most (measured on the Xeon: 12 rows of 2 vectors ran slower); with
// 32-byte vectors 3 rows, 12 accumulators.
template <int VB, int NV>
constexpr int kBand = VB == 32 ? 3 : (NV >= 4 ? 6 : 8);
static_assert(8 % kLanes<float, 32> == 0 && 8 % kLanes<double, 32> == 0,
              "vector_width covers the 32-byte vectors");

// Columns a buffer's rows need for whole-vector loads of their first d columns.
template <typename T, int VB>
int64_t padded_width(int64_t d) {
  return (d + kLanes<T, VB> - 1) / kLanes<T, VB> * kLanes<T, VB>;
}

// x as the left factor of a tile: element (r, k) at p[r * row + k * inner].
template <typename T>
struct Left {
  const T* p;
  int64_t row, inner;
};

// Output rows [0, R) × vectors [0, NV) at column 0 of a and out: Σ_k x(r, k) a[k, :], written
// (or added, Add) to out; the last vector stores its first `last` columns only. a's rows are
// readable to the last vector's end.
template <typename T, int VB, int R, int NV, bool Add>
__attribute__((always_inline)) inline void tile(Left<T> x, const T* a, int64_t lda, int64_t K,
                                                T* out, int64_t ldo, int64_t last) {
  constexpr int64_t L = kLanes<T, VB>;
  Vec<T, VB> acc[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec<T, VB>{};
  }
  for (int64_t k = 0; k < K; ++k) {
    const T* ak = a + k * lda;
    const T* xk = x.p + k * x.inner;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      Vec<T, VB> column;
      std::memcpy(&column, ak + v * L, sizeof column);  // unaligned load
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) acc[r][v] += xk[r * x.row] * column;
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int64_t cols = v + 1 < NV ? L : last;
      T* o = out + r * ldo + v * L;
      if (Add) {
        Vec<T, VB> before{};
        std::memcpy(&before, o, cols * sizeof(T));
        acc[r][v] += before;
      }
      std::memcpy(o, &acc[r][v], cols * sizeof(T));
    }
  }
}

// Output rows [0, rows) × the 1-4 vectors of columns at column 0 of a and out: bands of R rows,
// the rest in bands of halving sizes (R = 6: 6, 3, 2, 1); row r of the left factor at
// x.p + r * x.row.
template <typename T, int VB, int R, int NV, bool Add>
__attribute__((always_inline)) inline void bands(Left<T> x, int64_t rows, const T* a,
                                                 int64_t lda, int64_t K, T* out, int64_t ldo,
                                                 int64_t last) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) {
    tile<T, VB, R, NV, Add>({x.p + r * x.row, x.row, x.inner}, a, lda, K, out + r * ldo, ldo,
                            last);
  }
  if constexpr (R > 1) {
    if (r < rows) {
      bands<T, VB, (R + 1) / 2, NV, Add>({x.p + r * x.row, x.row, x.inner}, rows - r, a, lda, K,
                                         out + r * ldo, ldo, last);
    }
  }
}

template <typename T, int VB, int NV, bool Add>
__attribute__((always_inline)) inline void column_block(Left<T> x, int64_t rows, const T* a,
                                                        int64_t lda, int64_t K, T* out,
                                                        int64_t ldo, int64_t last) {
  bands<T, VB, kBand<VB, NV>, NV, Add>(x, rows, a, lda, K, out, ldo, last);
}

// Every output row, one block of 4 vectors of columns at a time (so that the block's panel of
// a, K × 4 vectors, stays in L1 while all rows pass: at d ≈ 100 the whole of a does not fit);
// the last block has 1-4 vectors, its last possibly partial.
template <typename T, int VB, bool Add>
__attribute__((always_inline)) inline void column_blocks(Left<T> x, int64_t rows, const T* a,
                                                         int64_t lda, int64_t K, int64_t W,
                                                         T* out, int64_t ldo) {
  constexpr int64_t L = kLanes<T, VB>;
  // The W / L vectors of a row split into blocks of as equal sizes as can be (13 vectors: 4, 3,
  // 3, 3 rather than 4, 4, 4, 1, whose last block would be load-bound).
  const int64_t total = (W + L - 1) / L, count = (total + 3) / 4;
  for (int64_t b = 0, j = 0; b < count; ++b) {
    const int64_t vectors = total / count + (b < total % count ? 1 : 0);
    const int64_t cols = std::min(vectors * L, W - j), last = cols - (vectors - 1) * L;
    switch (vectors) {
      case 4: column_block<T, VB, 4, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      case 3: column_block<T, VB, 3, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      case 2: column_block<T, VB, 2, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
      default: column_block<T, VB, 1, Add>(x, rows, a + j, lda, K, out + j, ldo, last); break;
    }
    j += cols;
  }
}

template <typename T, int VB>
__attribute__((always_inline)) inline void rows_times_matrix_with(
    const T* x, int64_t ldx, const T* a, int64_t lda, int64_t m, int64_t K, int64_t W, T* out,
    int64_t ldo) {
  // a copied with its rows padded to whole vectors (zeros), so that every load is in bounds.
  const int64_t ldp = padded_width<T, VB>(W);
  std::vector<T> padded(K * ldp, T(0));
  for (int64_t k = 0; k < K; ++k) std::copy(a + k * lda, a + k * lda + W, &padded[k * ldp]);
  column_blocks<T, VB, false>({x, ldx, 1}, m, padded.data(), ldp, K, W, out, ldo);
}

template <typename T, int VB>
__attribute__((always_inline)) inline void rows_transposed_times_rows_with(
    const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t m, int64_t K, int64_t W, T* out,
    int64_t ldo, bool accumulate) {
  // Blocks of 64 rows: a block's panel of y under one column block (64 × 4 vectors, 8 KiB with
  // 32-byte vectors) stays in L1 while every band of output rows passes over it, and each
  // block's sum is added to out in order (single threaded on a 2-core AMD EPYC, 32 and 97 wide:
  // 64 rows beat 128 and 256; on a 2-core Intel Xeon with 64-byte vectors 128 rows ran 5-10 %
  // faster at m 512-2048, so this is tuned for the EPYC).
  constexpr int64_t block = 64;
  if (m == 0) {
    if (!accumulate) {
      for (int64_t k = 0; k < K; ++k) std::fill(out + k * ldo, out + k * ldo + W, T(0));
    }
    return;
  }
  // y's rows are readable to vector_width(W) columns: where a wider vector would load past
  // them, each block of rows is first copied to rows of whole vectors.
  const int64_t ldp = padded_width<T, VB>(W);
  const bool copy = ldp > vector_width(W);
  std::vector<T> panel(copy ? block * ldp : 0, T(0));
  for (int64_t i = 0; i < m; i += block) {
    const int64_t rows = std::min(block, m - i);
    const T* yb = y + i * ldy;
    int64_t ldb = ldy;
    if (copy) {
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(yb + r * ldy, yb + r * ldy + W, &panel[r * ldp]);
      }
      yb = panel.data();
      ldb = ldp;
    }
    const Left<T> xt{x + i * ldx, 1, ldx};  // xᵀ: output row k is column k of x
    if (i == 0 && !accumulate) {
      column_blocks<T, VB, false>(xt, K, yb, ldb, rows, W, out, ldo);
    } else {
      column_blocks<T, VB, true>(xt, K, yb, ldb, rows, W, out, ldo);
    }
  }
}

// The kernels for 32-byte vectors, cloned for AVX2 and baseline x86-64, and for 64-byte vectors
// on AVX-512 machines, picked at run time.
#if GALERKIN_EXT_X86_CLONES
#define GALERKIN_EXT_GEMM_KERNEL \
  __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#else
#define GALERKIN_EXT_GEMM_KERNEL __attribute__((flatten))
#endif

template <typename T>
GALERKIN_EXT_GEMM_KERNEL void rows_times_matrix_32(const T* x, int64_t ldx, const T* a,
                                                   int64_t lda, int64_t m, int64_t K, int64_t W,
                                                   T* out, int64_t ldo) {
  rows_times_matrix_with<T, 32>(x, ldx, a, lda, m, K, W, out, ldo);
}

template <typename T>
GALERKIN_EXT_GEMM_KERNEL void rows_transposed_times_rows_32(const T* x, int64_t ldx, const T* y,
                                                            int64_t ldy, int64_t m, int64_t K,
                                                            int64_t W, T* out, int64_t ldo,
                                                            bool accumulate) {
  rows_transposed_times_rows_with<T, 32>(x, ldx, y, ldy, m, K, W, out, ldo, accumulate);
}

#if GALERKIN_EXT_X86_CLONES
template <typename T>
__attribute__((target("arch=x86-64-v4"), flatten)) void rows_times_matrix_64(
    const T* x, int64_t ldx, const T* a, int64_t lda, int64_t m, int64_t K, int64_t W, T* out,
    int64_t ldo) {
  rows_times_matrix_with<T, 64>(x, ldx, a, lda, m, K, W, out, ldo);
}

template <typename T>
__attribute__((target("arch=x86-64-v4"), flatten)) void rows_transposed_times_rows_64(
    const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t m, int64_t K, int64_t W, T* out,
    int64_t ldo, bool accumulate) {
  rows_transposed_times_rows_with<T, 64>(x, ldx, y, ldy, m, K, W, out, ldo, accumulate);
}

// PyTorch's ATEN_CPU_CAPABILITY caps these kernels too: "default" or "avx2" keeps them at
// 32-byte vectors (the tests compare the two, which give the same bits); like PyTorch, other
// values leave the machine's best.
bool wide_vectors() {
  static const bool wide = [] {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    const bool capped =
        cap != nullptr && (std::strcmp(cap, "default") == 0 || std::strcmp(cap, "avx2") == 0);
    return __builtin_cpu_supports("x86-64-v4") && !capped;
  }();
  return wide;
}
#endif

}  // namespace

template <typename T>
void rows_times_matrix(const T* x, int64_t ldx, const T* a, int64_t lda, int64_t m, int64_t K,
                       int64_t W, T* out, int64_t ldo) {
#if GALERKIN_EXT_X86_CLONES
  if (wide_vectors()) return rows_times_matrix_64<T>(x, ldx, a, lda, m, K, W, out, ldo);
#endif
  rows_times_matrix_32<T>(x, ldx, a, lda, m, K, W, out, ldo);
}

template <typename T>
void rows_transposed_times_rows(const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t m,
                                int64_t K, int64_t W, T* out, int64_t ldo, bool accumulate) {
#if GALERKIN_EXT_X86_CLONES
  if (wide_vectors()) {
    return rows_transposed_times_rows_64<T>(x, ldx, y, ldy, m, K, W, out, ldo, accumulate);
  }
#endif
  rows_transposed_times_rows_32<T>(x, ldx, y, ldy, m, K, W, out, ldo, accumulate);
}

#define GALERKIN_EXT_INSTANTIATE(T)                                                               \
  template void rows_times_matrix<T>(const T*, int64_t, const T*, int64_t, int64_t, int64_t,    \
                                     int64_t, T*, int64_t);                                     \
  template void rows_transposed_times_rows<T>(const T*, int64_t, const T*, int64_t, int64_t,    \
                                              int64_t, int64_t, T*, int64_t, bool);
GALERKIN_EXT_INSTANTIATE(float)
GALERKIN_EXT_INSTANTIATE(double)
#undef GALERKIN_EXT_INSTANTIATE

namespace {
// Unit stride along the columns; a single column may have any stride (the stride of a size-1
// dimension is arbitrary, and contiguous() leaves it so).
bool unit_columns(const at::Tensor& t) { return t.size(1) <= 1 || t.stride(1) == 1; }
}  // namespace

void rows_times_matrix(at::Tensor& out, const at::Tensor& x, const at::Tensor& a) {
  TORCH_INTERNAL_ASSERT(x.dim() == 2 && a.dim() == 2 && out.dim() == 2);
  TORCH_INTERNAL_ASSERT(x.size(1) == a.size(0) && out.size(0) == x.size(0) &&
                        out.size(1) == a.size(1));
  TORCH_INTERNAL_ASSERT(unit_columns(x) && unit_columns(a) && unit_columns(out));
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
  TORCH_INTERNAL_ASSERT(unit_columns(x) && unit_columns(y) && unit_columns(out));
  TORCH_INTERNAL_ASSERT(y.stride(0) >= vector_width(y.size(1)));
  TORCH_INTERNAL_ASSERT(y.scalar_type() == x.scalar_type() &&
                        out.scalar_type() == x.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "galerkin_ext_rows_transposed_times_rows", [&] {
    rows_transposed_times_rows<scalar_t>(
        x.const_data_ptr<scalar_t>(), x.stride(0), y.const_data_ptr<scalar_t>(), y.stride(0),
        x.size(0), x.size(1), y.size(1), out.mutable_data_ptr<scalar_t>(), out.stride(0),
        /*accumulate=*/false);
  });
}

}  // namespace galerkin_ext::cpu
