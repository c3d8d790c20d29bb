// The galerkin_ext op library (schemas) and the Python module that loads it.
// Implementations are registered per device next to their kernels (attention/attention.cpp).
#include "attention/limits.h"

#include <pybind11/pybind11.h>
#include <torch/library.h>

TORCH_LIBRARY(galerkin_ext, m) {
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
