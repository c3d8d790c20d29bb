// The galerkin_ext op library (schemas) and the Python module that loads it.
// Implementations are registered per device in attention/core.cpp, attention/quadratic_cpu.cpp,
// attention/softmax_cpu.cpp and dropout/dropout_cpu.cpp, every op's autograd in
// attention/autograd.cpp.
#include "attention/cuda_limits.h"

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
  // [S_l | s_l] of S's columns; plus Q̂ itself with skip (GNOT's skip term; out's width must
  // then be Q̂'s).
  m.def(
      "q_apply(Tensor q, Tensor? pos, str q_map, Tensor? q_norm_weight, Tensor? q_norm_bias, "
      "Tensor s, float eps, int normalizers, bool skip) -> Tensor");
  // Gradients for (q, pos, q_norm_weight, q_norm_bias, s), as kv_reduce_backward's.
  m.def(
      "q_apply_backward(Tensor grad_out, Tensor q, Tensor? pos, str q_map, "
      "Tensor? q_norm_weight, Tensor? q_norm_bias, Tensor s, float eps, int normalizers, "
      "bool skip, bool pos_grad) -> Tensor[]");
  // The backwards' gradients again, by differentiating the plain formulas, so that they are
  // differentiable and batchable: the backward under create_graph=True or a torch.func
  // transform (attention/autograd.cpp). Their CompositeImplicitAutograd kernels are Python
  // (ops.py registers them).
  m.def(
      "kv_reduce_backward_formula(Tensor grad_s, Tensor k, Tensor v, Tensor? kv_pos, "
      "Tensor? weight, str k_map, Tensor? k_norm_weight, Tensor? k_norm_bias, str v_map, "
      "Tensor? v_norm_weight, Tensor? v_norm_bias, float eps, bool ones_column, "
      "bool kv_pos_grad, bool weight_grad) -> Tensor[]");
  m.def(
      "q_apply_backward_formula(Tensor grad_out, Tensor q, Tensor? pos, str q_map, "
      "Tensor? q_norm_weight, Tensor? q_norm_bias, Tensor s, float eps, int normalizers, "
      "bool skip, bool pos_grad) -> Tensor[]");
  // Inverted dropout (0 < p < 1) whose mask is a function of seed (a 0-dim int64 tensor) and
  // of each element's place in memory in the output's layout, empty_like(x)'s
  // (dropout/dropout_cpu.cpp): the backward is the same op on the gradient in that layout.
  // CPU only: on CUDA, torch's own dropout is fused.
  m.def("dropout(Tensor x, float p, Tensor seed) -> Tensor");
  // out = (Q Kᵀ ∘ D) V (B, H, N, d_v) for q (B, H, N, d), k (B, H, M, d), v (B, H, M, d_v),
  // float32 or float64, with D the dropout op's multipliers of the (B, H, N, M) matrix Q Kᵀ
  // stored contiguously (none at p = 0), fused so that the matrix is never stored
  // (attention/quadratic_cpu.cpp); its backward gives (grad_q, grad_k, grad_v). CPU only.
  m.def("quadratic_attention(Tensor q, Tensor k, Tensor v, float p, Tensor seed) -> Tensor");
  m.def(
      "quadratic_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, float p, "
      "Tensor seed) -> Tensor[]");
  // (out, lse) = (softmax(scale Q Kᵀ + b) ∘ D) V (B, H, N, d_v) and each row's log-sum-exp
  // (B, H, N) for q, k, v as above, bias b None or (B, M) in their dtype (the same for every
  // head and query; -inf removes a key), D as above on the probabilities: fused, the matrix never
  // stored (attention/softmax_cpu.cpp). Its backward takes the forward's out and lse and gives
  // (grad_q, grad_k, grad_v, grad_bias), grad_bias empty without a bias. CPU only.
  m.def(
      "softmax_attention(Tensor q, Tensor k, Tensor v, Tensor? bias, float scale, float p, "
      "Tensor seed) -> (Tensor, Tensor)");
  m.def(
      "softmax_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? bias, "
      "Tensor out, Tensor lse, float scale, float p, Tensor seed) -> Tensor[]");
  // Their backwards' formula twins, as the op core's above.
  m.def(
      "quadratic_attention_backward_formula(Tensor grad_out, Tensor q, Tensor k, Tensor v, "
      "float p, Tensor seed) -> Tensor[]");
  m.def(
      "softmax_attention_backward_formula(Tensor grad_out, Tensor q, Tensor k, Tensor v, "
      "Tensor? bias, Tensor out, Tensor lse, float scale, float p, Tensor seed) -> Tensor[]");
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
  // Read once at import by ops.py, which routes larger shapes to the formulas.
  m.attr("cuda_max_width") = galerkin_ext::cuda::kMaxWidth;
  m.attr("cuda_max_coordinates") = galerkin_ext::cuda::kMaxCoordinates;
  m.attr("cuda_max_batch_heads") = galerkin_ext::cuda::kMaxGridY;
}
