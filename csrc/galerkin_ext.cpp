// The galerkin_ext op library (schemas) and the Python module that loads it.
// Implementations are registered per device next to their kernels (attention/attention.cpp).
#include "attention/limits.h"

#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(galerkin_ext, m) {
  // The op core (attention/core.h). Row maps by name: 'identity', 'layer_norm', 'softmax'.
  // S = K̂ᵀ W V̂ (B, H, P + D_k, P + D_v [+ 1 with ones_column]) in float32, float64 for float64.
  m.def(
      "kv_reduce(Tensor k, Tensor v, Tensor? kv_pos, Tensor? weight, str k_map, "
      "Tensor? k_norm_weight, Tensor? k_norm_bias, str v_map, Tensor? v_norm_weight, "
      "Tensor? v_norm_bias, float eps, bool ones_column) -> Tensor");
  // Gradients for (k, v, kv_pos, weight, k_norm_weight, k_norm_bias, v_norm_weight,
  // v_norm_bias); an empty tensor where the input is absent or its gradient was not asked for.
  m.def(
      "kv_reduce_backward(Tensor grad_s, Tensor k, Tensor v, Tensor? kv_pos, Tensor? weight, "
      "str k_map, Tensor? k_norm_weight, Tensor? k_norm_bias, str v_map, Tensor? v_norm_weight, "
      "Tensor? v_norm_bias, float eps, bool ones_column, bool kv_pos_grad, bool weight_grad) "
      "-> Tensor[]");
  // out = Q̂ S (normalizers = 0), or Σ_l (Q̂ S_l) / (Q̂ s_l) over L = normalizers blocks
  // [S_l | s_l] of S's columns.
  m.def(
      "q_apply(Tensor q, Tensor? pos, str q_map, Tensor? q_norm_weight, Tensor? q_norm_bias, "
      "Tensor s, float eps, int normalizers) -> Tensor");
  // Gradients for (q, pos, q_norm_weight, q_norm_bias, s), as kv_reduce_backward's.
  m.def(
      "q_apply_backward(Tensor grad_out, Tensor q, Tensor? pos, str q_map, "
      "Tensor? q_norm_weight, Tensor? q_norm_bias, Tensor s, float eps, int normalizers, "
      "bool pos_grad) -> Tensor[]");
  // Returns (out, attn). The backward recomputes the prepared operands from the inputs.
  m.def(
      "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? pos, Tensor? weight, "
      "Tensor? q_norm_weight, Tensor? q_norm_bias, Tensor? k_norm_weight, Tensor? k_norm_bias, "
      "Tensor? v_norm_weight, Tensor? v_norm_bias, Tensor? dropout_mask, float eps, float scale, "
      "bool quadratic) -> (Tensor, Tensor)");
  // Returns gradients for (q, k, v, pos, weight, q/k/v norm weight and bias); an empty tensor
  // where no gradient was asked for or the input is absent.
  m.def(
      "attention_backward(Tensor grad_out, Tensor? grad_attn, Tensor q, Tensor k, Tensor v, "
      "Tensor? pos, Tensor? weight, Tensor? q_norm_weight, Tensor? q_norm_bias, "
      "Tensor? k_norm_weight, Tensor? k_norm_bias, Tensor? v_norm_weight, Tensor? v_norm_bias, "
      "Tensor? dropout_mask, Tensor attn, float eps, float scale, bool quadratic, bool pos_grad, "
      "bool weight_grad) -> Tensor[]");
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "Compiled attention ops of galerkin_ext; importing registers torch.ops.galerkin_ext";
  m.def("cuda_built", [] {
#ifdef GALERKIN_EXT_WITH_CUDA
    return true;
#else
    return false;
#endif
  }, "Whether the CUDA kernels were compiled in.");
  m.def("linear_cuda_fits", &galerkin_ext::linear_cuda_fits,
        "Whether rows of width d with P coordinates take the fused CUDA linear path.");
}
