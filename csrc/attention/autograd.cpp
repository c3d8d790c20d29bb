// Reverse-mode autograd of the op core (core.h), registered for every device: the backward ops
// give the gradients. In C++ because the call costs matter at the papers' small shapes, where the
// ops themselves take microseconds: a Python autograd wrapper (torch.library.register_autograd)
// added ~90 us to each op's forward and ~140 us to its backward on one CPU core.
//
// Under create_graph=True the gradients must themselves be differentiable, which the compiled
// backwards are not: the backward then calls the *_backward_formula ops, which differentiate the
// plain formulas (functional.py) and are registered from Python by ops.py. Forward-mode and
// torch.func autodiff never reach these ops: ops.py hands them to the formulas.
#include "core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>

namespace galerkin_ext {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

OptTensor optional(const Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); }

// Whether each tensor argument (saved in argument order, absent optional ones undefined) needs
// its gradient: the context numbers only the tensors that were given.
std::vector<bool> needs_grad(const AutogradContext* ctx, const variable_list& saved) {
  std::vector<bool> needs;
  size_t edge = 0;
  for (const Tensor& t : saved) needs.push_back(t.defined() && ctx->needs_input_grad(edge++));
  return needs;
}

// The gradients a backward op returned, undefined where not needed (its empty placeholders).
variable_list keep_needed(std::vector<Tensor> grads, const std::vector<bool>& needs) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!needs[i]) grads[i] = Tensor();
  }
  return grads;
}

using KvReduceBackward = std::vector<Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
    c10::string_view, const OptTensor&, const OptTensor&, c10::string_view, const OptTensor&,
    const OptTensor&, double, bool, bool, bool);
using QApplyBackward = std::vector<Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, c10::string_view, const OptTensor&,
    const OptTensor&, const Tensor&, double, int64_t, bool, bool);

// The backward op `name` on args, below autograd; under create_graph=True its formula twin,
// through autograd.
template <typename Signature, typename... Args>
std::vector<Tensor> call_backward(const char* name, Args&&... args) {
  static const auto compiled =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
  if (!at::GradMode::is_enabled()) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return compiled.call(std::forward<Args>(args)...);
  }
  const std::string formula = std::string(name) + "_formula";
  const auto handle = c10::Dispatcher::singleton().findOp({formula.c_str(), ""});
  TORCH_CHECK(handle.has_value() &&
                  handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd),
              "second-order gradients of ", name, " need ", formula,
              ", which importing galerkin_ext.ops registers");
  return handle->typed<Signature>().call(std::forward<Args>(args)...);
}

class KvReduce : public torch::autograd::Function<KvReduce> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& k, const Tensor& v,
                        const OptTensor& kv_pos, const OptTensor& weight,
                        c10::string_view k_map, const OptTensor& k_norm_weight,
                        const OptTensor& k_norm_bias, c10::string_view v_map,
                        const OptTensor& v_norm_weight, const OptTensor& v_norm_bias,
                        double eps, bool ones_column) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("galerkin_ext::kv_reduce", "")
                               .typed<Tensor(const Tensor&, const Tensor&, const OptTensor&,
                                             const OptTensor&, c10::string_view,
                                             const OptTensor&, const OptTensor&,
                                             c10::string_view, const OptTensor&,
                                             const OptTensor&, double, bool)>();
    Tensor s;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      s = op.call(k, v, kv_pos, weight, k_map, k_norm_weight, k_norm_bias, v_map, v_norm_weight,
                  v_norm_bias, eps, ones_column);
    }
    // The inputs only: the backward recomputes the prepared operands.
    ctx->save_for_backward({k, v, kv_pos.value_or(Tensor()), weight.value_or(Tensor()),
                            k_norm_weight.value_or(Tensor()), k_norm_bias.value_or(Tensor()),
                            v_norm_weight.value_or(Tensor()), v_norm_bias.value_or(Tensor())});
    ctx->saved_data["k_map"] = std::string(k_map);
    ctx->saved_data["v_map"] = std::string(v_map);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["ones_column"] = ones_column;
    return s;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<bool> needs = needs_grad(ctx, saved);
    const std::string k_map = ctx->saved_data["k_map"].toStringRef();
    const std::string v_map = ctx->saved_data["v_map"].toStringRef();
    variable_list g = keep_needed(
        call_backward<KvReduceBackward>(
            "galerkin_ext::kv_reduce_backward", grad_outputs[0], saved[0], saved[1],
            optional(saved[2]), optional(saved[3]), c10::string_view(k_map), optional(saved[4]),
            optional(saved[5]), c10::string_view(v_map), optional(saved[6]), optional(saved[7]),
            ctx->saved_data["eps"].toDouble(), ctx->saved_data["ones_column"].toBool(),
            bool(needs[2]), bool(needs[3])),
        needs);
    // One entry per forward argument: (k, v, kv_pos, weight, k_map, k_norm_weight,
    // k_norm_bias, v_map, v_norm_weight, v_norm_bias, eps, ones_column).
    return {g[0], g[1], g[2], g[3], Tensor(), g[4], g[5], Tensor(), g[6], g[7], Tensor(),
            Tensor()};
  }
};

class QApply : public torch::autograd::Function<QApply> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const OptTensor& pos,
                        c10::string_view q_map, const OptTensor& q_norm_weight,
                        const OptTensor& q_norm_bias, const Tensor& s, double eps,
                        int64_t normalizers, bool skip) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("galerkin_ext::q_apply", "")
                               .typed<Tensor(const Tensor&, const OptTensor&, c10::string_view,
                                             const OptTensor&, const OptTensor&, const Tensor&,
                                             double, int64_t, bool)>();
    Tensor out;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      out = op.call(q, pos, q_map, q_norm_weight, q_norm_bias, s, eps, normalizers, skip);
    }
    ctx->save_for_backward({q, pos.value_or(Tensor()), q_norm_weight.value_or(Tensor()),
                            q_norm_bias.value_or(Tensor()), s});
    ctx->saved_data["q_map"] = std::string(q_map);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["normalizers"] = normalizers;
    ctx->saved_data["skip"] = skip;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<bool> needs = needs_grad(ctx, saved);
    const std::string q_map = ctx->saved_data["q_map"].toStringRef();
    variable_list g = keep_needed(
        call_backward<QApplyBackward>(
            "galerkin_ext::q_apply_backward", grad_outputs[0].contiguous(), saved[0],
            optional(saved[1]), c10::string_view(q_map), optional(saved[2]), optional(saved[3]),
            saved[4], ctx->saved_data["eps"].toDouble(), ctx->saved_data["normalizers"].toInt(),
            ctx->saved_data["skip"].toBool(), bool(needs[1])),
        needs);
    // (q, pos, q_map, q_norm_weight, q_norm_bias, s, eps, normalizers, skip).
    return {g[0], g[1], Tensor(), g[2], g[3], g[4], Tensor(), Tensor(), Tensor()};
  }
};

Tensor kv_reduce_autograd(const Tensor& k, const Tensor& v, const OptTensor& kv_pos,
                          const OptTensor& weight, c10::string_view k_map,
                          const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
                          c10::string_view v_map, const OptTensor& v_norm_weight,
                          const OptTensor& v_norm_bias, double eps, bool ones_column) {
  return KvReduce::apply(k, v, kv_pos, weight, k_map, k_norm_weight, k_norm_bias, v_map,
                         v_norm_weight, v_norm_bias, eps, ones_column);
}

Tensor q_apply_autograd(const Tensor& q, const OptTensor& pos, c10::string_view q_map,
                        const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
                        const Tensor& s, double eps, int64_t normalizers, bool skip) {
  return QApply::apply(q, pos, q_map, q_norm_weight, q_norm_bias, s, eps, normalizers, skip);
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, Autograd, m) {
  m.impl("kv_reduce", &kv_reduce_autograd);
  m.impl("q_apply", &q_apply_autograd);
}

}  // namespace galerkin_ext
