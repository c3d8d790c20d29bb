// Raw-pointer interface of the CUDA twins of the op core (core.h): the two kernel families every
// forward and backward is made of, over operands given as "rows" whose prepared form is built
// in registers and shared memory and never written to device memory.
//   reduce (reduce_cuda.cu):  partial[slice] = Σ_{n in slice} left̂_n ⊗ right̂_n, then
//                             sum_partials adds the slices in order (fixed order: bitwise
//                             reproducible).
//   apply (apply_cuda.cu):    row n of the output = sourcê_n · matrix, optionally normalised
//                             per block (q_apply), or turned into the gradients of a target's
//                             inputs (the backward of a row map).
//   kv_reduce:  S = reduce(K̂w, V̂ [| 1]);  backward: dK̂w = V̂ dSᵀ, dV̂ = K̂w dS   (apply)
//   q_apply:    out = apply(Q̂, S);         backward: G' from grad_out (apply), dS = reduce(Q̂,
//               G'), dQ̂ = G' Sᵀ (apply)
// Includes only the CUDA runtime: the kernels compile with plain nvcc; the ATen glue that fills
// these structs from tensors is kv_reduce_cuda.cpp / q_apply_cuda.cpp.
#pragma once

#include "attention/cuda_limits.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace galerkin_ext::cuda {

// Element type of a tensor. Statistics and sums are double for Double, float otherwise.
enum class ScalarKind { Float, Double, Half, BFloat16 };

enum class RowMapKind { Identity, LayerNorm, Softmax };

// One operand: row (b, h, n) is prepared as s · [pos | LN_h(x)] (layer norm), s · [pos | x]
// (identity) or s · softmax([pos | x]), then a 1 appended when ones_column; s is the
// quadrature weight when weighted (1/N where none is given), else 1.
struct RowsArgs {
  ScalarKind kind;                                 // of x and pos
  int64_t B, H, N, D, P;
  int64_t stride_b, stride_h, stride_n, stride_d;  // of x, in elements
  const void* x;
  const void* pos;          // (B, N, P) or (N, P) contiguous, or null
  int64_t pos_stride_b;     // N * P, or 0 when shared over the batch
  const void* weight;       // (B, N) or (N,) contiguous, or null for uniform 1/N
  ScalarKind weight_kind;   // x's kind, or Float for half/bfloat16 x
  int64_t weight_stride_b;  // N, or 0 when shared over the batch
  bool weighted;
  RowMapKind map;
  const void* gamma;        // (H, D) contiguous, with LayerNorm
  const void* beta;
  ScalarKind norm_kind;     // x's kind, or Float for half/bfloat16 x
  bool ones_column;

  __host__ __device__ int64_t width() const { return P + D + (ones_column ? 1 : 0); }
};

// Whether the kernels take an operand (within cuda_limits.h).
inline bool rows_fit(const RowsArgs& r) {
  return r.width() <= kMaxWidth && r.P <= kMaxCoordinates && r.B * r.H <= kMaxGridY;
}

// ---- reduce ----------------------------------------------------------------------------------

// Partial sums reduce writes per (b, h) for n points of widths (left, right).
int64_t reduce_slices(int64_t B, int64_t H, int64_t n, int64_t left_width, int64_t right_width);

// partial (slices, B·H, left.width(), right.width()) in the accumulation type. left and right
// have the same B, H, N; right's kind is left's, or its accumulation type (G' of q_apply).
cudaError_t reduce_rows(const RowsArgs& left, const RowsArgs& right, double eps, void* partial,
                        cudaStream_t stream);

// sum (count) = Σ_s partial[s] (slices, count), in slice order; accumulation type of `kind`.
cudaError_t sum_partials(ScalarKind kind, const void* partial, int64_t slices, int64_t count,
                         void* sum, cudaStream_t stream);

// ---- apply -----------------------------------------------------------------------------------

// The matrix rows of the source are multiplied with: (B·H, rows, ld) contiguous in the
// accumulation type, read as its first `cols` columns, or transposed (B·H, cols, ld) read as its
// first `rows` columns.
struct MatrixArgs {
  const void* data;
  int64_t rows, cols, ld;
  bool transpose;
};

// out (B, H, N, cols) contiguous, element type = Y = Q̂ · matrix; with normalizers = L > 0,
// cols = L (w + 1) and out (B, H, N, w) = Σ_l Y_l[:w] / Y_l[w] (0/0 := 0). With skip, Q̂ is
// added to out (whose width must then be q.width()).
cudaError_t apply_rows(const RowsArgs& q, double eps, const MatrixArgs& matrix,
                       int64_t normalizers, bool skip, void* out, cudaStream_t stream);

// G' (B, H, N, cols) in the accumulation type: the gradient w.r.t. Y of apply_rows with
// normalizers = L > 0, from grad (B, H, N, w) contiguous in the element type: per block
// [g / δ | -⟨g, n⟩ / δ²] with Y_l = [n | δ] (0 where δ = 0).
cudaError_t normalizer_grad(const RowsArgs& q, double eps, const MatrixArgs& matrix,
                            int64_t normalizers, const void* grad, void* grad_y,
                            cudaStream_t stream);

// Blocks of rows per (b, h) in apply_rows_backward: the leading size of its norm partials.
int64_t apply_row_blocks(int64_t B, int64_t H, int64_t N);

struct TargetGrads {
  void* grad_x;        // (B, H, N, D) contiguous, element type: written
  void* pos_rows;      // (B, H, N, P) accumulation type: each row's coordinate gradient, or null
  void* weight_rows;   // (B, H, N) accumulation type: each row's weight gradient, or null
  void* norm_partial;  // (apply_row_blocks, B, H, 2, D) accumulation type: per-block sums of
                       // the norm parameters' gradients; null without a layer norm
};

// The gradient w.r.t. the target's prepared rows (its ones column excluded) is
// Y = sourcê · matrix (matrix.rows = source.width(), matrix.cols = target.P + target.D), plus
// skip_grad (B, H, N, P + D) contiguous in the target's element type where not null (the
// gradient of apply_rows' skip term); it is turned into the gradients of the target's x, pos,
// weight and norm parameters. The source's kind is the target's, or its accumulation type (G').
cudaError_t apply_rows_backward(const RowsArgs& source, const RowsArgs& target, double eps,
                                const MatrixArgs& matrix, const void* skip_grad,
                                const TargetGrads& grads, cudaStream_t stream);

}  // namespace galerkin_ext::cuda
