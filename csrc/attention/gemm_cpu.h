// The skinny products of the CPU twins, with x a chunk of rows (m × K) and K, W head widths:
// register-tiled kernels that stream the rows once. MKL's sgemm, tuned for squarer shapes, ran
// x · a at 39 GFLOP/s on one thread of a 2-core AMD EPYC with x streamed from memory (131072 ×
// 32 · 32 × 32) against 61 here; on a 2-core Intel Xeon MKL stays ahead (180 against 134;
// benchmarks/cpu_products.py). Each output element is a sum in a fixed order
// (over k, or over blocks of rows in order), so results do not depend on the chunking or the
// vector width, and a rerun gives the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace galerkin_ext::cpu {

// Columns a row buffer needs for whole-vector loads of its first d columns: d rounded up to 8.
inline int64_t vector_width(int64_t d) { return (d + 7) / 8 * 8; }

// out (m × W) = x (m × K) · a (K × W), row strides ldx, lda, ldo.
template <typename T>
void rows_times_matrix(const T* x, int64_t ldx, const T* a, int64_t lda, int64_t m, int64_t K,
                       int64_t W, T* out, int64_t ldo);

// out (K × W) = xᵀ (K × m) · y (m × W), or out += xᵀ y with accumulate, summed over blocks of
// rows in order. y's rows must be readable to vector_width(W) columns (ldy >= vector_width(W);
// the extra columns may hold anything).
template <typename T>
void rows_transposed_times_rows(const T* x, int64_t ldx, const T* y, int64_t ldy, int64_t m,
                                int64_t K, int64_t W, T* out, int64_t ldo, bool accumulate);

// The same on 2-D tensors with contiguous rows: out = x · a, out = xᵀ · y.
void rows_times_matrix(at::Tensor& out, const at::Tensor& x, const at::Tensor& a);
void rows_transposed_times_rows(at::Tensor& out, const at::Tensor& x, const at::Tensor& y);

}  // namespace galerkin_ext::cpu
