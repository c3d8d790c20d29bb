// Raw-pointer interface of the CUDA operand-preparation kernels (prepare_cuda.cu). It includes
// only the CUDA runtime, so the kernels compile with plain nvcc; the ATen glue that fills these
// structs from tensors is prepare_cuda.cpp. See attention.h for what "prepare" computes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace galerkin_ext::cuda {

// Element type of x, pos, weight, the norm parameters, the prepared operand and grad_x.
// Statistics and gradient accumulators are double for Double, float otherwise.
enum class ScalarKind { Float, Double, Half, BFloat16 };

struct PrepareArgs {
  ScalarKind kind;
  int64_t B, H, N, D, P;
  int64_t stride_b, stride_h, stride_n, stride_d;  // of x, in elements
  const void* x;
  const void* pos;        // (B, N, P) or (N, P) contiguous, or null
  int64_t pos_stride_b;   // N * P, or 0 when shared over the batch
  const void* weight;     // (B, N) or (N,) contiguous, or null for uniform 1/N
  int64_t weight_stride_b;
  bool weighted;          // scale rows by the quadrature weight
  const void* gamma;      // (H, D) contiguous, or null for no norm
  const void* beta;       // (H, D) contiguous, present with gamma
  int64_t ld;             // row stride of the prepared operand, >= P + D (zero padding after)
};

// hat: (B, H, N, ld) contiguous, columns [P + D, ld) zeroed; stats: (B, H, N, 2) = (mean, rstd),
// written with a norm.
cudaError_t prepare_forward(const PrepareArgs& args, double eps, void* hat, void* stats,
                            cudaStream_t stream);

// Rows of (b, n) handled by one block of the backward; the norm-parameter gradients are summed
// per block into norm_partial, then over blocks by the caller.
constexpr int64_t kBackwardRowsPerBlock = 128;

inline int64_t backward_blocks(int64_t B, int64_t N) {
  return (B * N + kBackwardRowsPerBlock - 1) / kBackwardRowsPerBlock;
}

// Per-row and per-block gradients, written (never accumulated, so that the caller sums them in a
// fixed order and the results are bitwise reproducible).
struct PrepareGrads {
  void* pos_rows;      // (B, H, N, P): the gradient w.r.t. pos of each row, or null
  void* weight_rows;   // (B, H, N): the gradient w.r.t. the weight of each row, or null
  void* norm_partial;  // (backward_blocks(B, N), H, 2, D) sums; null without a norm
};

// grad_hat: (B, H, N, ld) contiguous, the gradient w.r.t. the prepared operand; turned into
// the gradient w.r.t. x in place, in its last D columns.
cudaError_t prepare_backward(const PrepareArgs& args, void* grad_hat, const void* stats,
                             const PrepareGrads& grads, cudaStream_t stream);

}  // namespace galerkin_ext::cuda
