// The op core of the attention family: every softmax-free member is a reduction over the key
// points followed by a per-query apply (SPEC §2b).
//
//   kv_reduce:  S = K̂ᵀ W V̂                         (B, H, d_k, d_v [+1]) in the opmath dtype
//   q_apply:    out = Q̂ S, or with L normalisers    Σ_l (Q̂ S_l) / (Q̂ s_l);  + Q̂ with skip
//
// Each prepared operand is a row map of its input: [pos | x] (identity), [pos | LN_h(x)] (head
// h's affine layer norm) or softmax([pos | x]) (over the head's features), times the quadrature
// weight for K̂. "[+1]" is a column of ones appended to V̂, so that the last column of S is the
// normaliser s = Σ_j w_j k̂_j; S_l and s_l are the l-th block of L such (d_v + 1)-column blocks.
// Galerkin = layer norms on k, v; Fourier (factored) = layer norms on q, k and a scale on S;
// GNOT = softmax on q, k with a normaliser per input function. Cross-attention is M != N.
//
// The prepared operands never exist as whole tensors: the CPU twins (kv_reduce_cpu.cpp,
// q_apply_cpu.cpp) form them chunk by chunk in cache, the CUDA twins (kv_reduce_cuda.cpp,
// q_apply_cuda.cpp on the kernels of core_cuda.cuh) row by row in registers and shared memory.
// Reductions over points are partials (per run of chunks on the CPU, chunks_cpu.h; per split
// on the GPU) summed in a fixed order, so results are bit-for-bit reproducible. The backward
// ops recompute the row maps from the inputs; no operand is saved.
#pragma once

#include "attention.h"

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <vector>

namespace galerkin_ext {

enum class RowMap { kIdentity, kLayerNorm, kSoftmax };

// "identity", "layer_norm" or "softmax" (the op schemas take the map by name).
RowMap parse_row_map(c10::string_view name, const char* arg);

// The key side, validated; pos, weight and the norm parameters contiguous, k and v any strides.
struct KvReduceInputs {
  at::Tensor k, v;                                     // (B, H, M, D_k), (B, H, M, D_v)
  std::optional<at::Tensor> kv_pos, weight;            // (B|·, M, P), (B|·, M)
  RowMap k_map, v_map;
  std::optional<at::Tensor> k_norm_weight, k_norm_bias, v_norm_weight, v_norm_bias;  // (H, D)
  bool ones_column;
  int64_t B, H, M, Dk, Dv, P;

  int64_t key_width() const { return P + Dk; }
  int64_t value_width() const { return P + Dv + (ones_column ? 1 : 0); }
  OperandSpec key() const {
    return {k, kv_pos, weight, true, k_norm_weight, k_norm_bias, k_map == RowMap::kSoftmax};
  }
  OperandSpec value() const {
    return {v, kv_pos, weight, false, v_norm_weight, v_norm_bias, v_map == RowMap::kSoftmax};
  }
};

// The query side and S, validated; pos, the norm parameters and s contiguous.
struct QApplyInputs {
  at::Tensor q;                                        // (B, H, N, D)
  std::optional<at::Tensor> pos;                       // (B|·, N, P)
  RowMap q_map;
  std::optional<at::Tensor> q_norm_weight, q_norm_bias;
  at::Tensor s;                                        // (B, H, P + D, W), opmath dtype
  int64_t normalizers;                                 // 0: out = Q̂ S; L: W = L (d_v + 1)
  bool skip;                                           // out += Q̂ (out_width() == P + D)
  int64_t B, H, N, D, P, W;

  int64_t query_width() const { return P + D; }
  int64_t out_width() const { return normalizers == 0 ? W : W / normalizers - 1; }
  OperandSpec query() const {
    static const std::optional<at::Tensor> uniform;
    return {q, pos, uniform, false, q_norm_weight, q_norm_bias, q_map == RowMap::kSoftmax};
  }
};

// Gradients by name; undefined where an input is absent or its gradient was not asked for.
struct KvReduceGrads {
  at::Tensor k, v, kv_pos, weight, k_norm_weight, k_norm_bias, v_norm_weight, v_norm_bias;
  std::vector<at::Tensor> list() const {  // the order of the backward op's schema
    return {k, v, kv_pos, weight, k_norm_weight, k_norm_bias, v_norm_weight, v_norm_bias};
  }
};

struct QApplyGrads {
  at::Tensor q, pos, q_norm_weight, q_norm_bias, s;
  std::vector<at::Tensor> list() const { return {q, pos, q_norm_weight, q_norm_bias, s}; }
};

// The device twins: kv_reduce_cpu.cpp / kv_reduce_cuda.cpp, q_apply_cpu.cpp / q_apply_cuda.cpp.
// grad_s may have any floating dtype; grad_out has q's.
at::Tensor kv_reduce_cpu(const KvReduceInputs& in, double eps);
KvReduceGrads kv_reduce_backward_cpu(const KvReduceInputs& in, const at::Tensor& grad_s,
                                     double eps, bool kv_pos_grad, bool weight_grad);
at::Tensor q_apply_cpu(const QApplyInputs& in, double eps);
QApplyGrads q_apply_backward_cpu(const QApplyInputs& in, const at::Tensor& grad_out, double eps,
                                 bool pos_grad);
#ifdef GALERKIN_EXT_WITH_CUDA
at::Tensor kv_reduce_cuda(const KvReduceInputs& in, double eps);
KvReduceGrads kv_reduce_backward_cuda(const KvReduceInputs& in, const at::Tensor& grad_s,
                                      double eps, bool kv_pos_grad, bool weight_grad);
at::Tensor q_apply_cuda(const QApplyInputs& in, double eps);
QApplyGrads q_apply_backward_cuda(const QApplyInputs& in, const at::Tensor& grad_out, double eps,
                                  bool pos_grad);
#endif

}  // namespace galerkin_ext
