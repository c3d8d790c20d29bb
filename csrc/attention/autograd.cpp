// Reverse-mode autograd of every op (the op core of core.h, dropout, the fused quadratic and
// softmax attention), registered for every device: the backward ops give the gradients. In C++
// because the call costs matter at the papers' small shapes, where the ops themselves take
// microseconds: a Python autograd wrapper (torch.library.register_autograd) added ~90 us to each
// op's forward and ~140 us to its backward on one CPU core. (It also dropped forward-mode
// tangents without a word.)
//
// Under create_graph=True the gradients must themselves be differentiable, which the compiled
// backwards are not; under a torch.func transform of the backward (vmap: is_grads_batched,
// jacobian(vectorize=True)) they would need batching rules, which they lack. The backward then
// calls the *_backward_formula ops, composite kernels of plain PyTorch registered from Python by
// ops.py. Forward-mode AD has no formula here: galerkin_ext.ops hands it, and torch.func
// transforms of the forward, to the formulas before any op is called, and a raw op call that
// carries a tangent is refused.
#include "core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <string>
#include <tuple>

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

using KvReduceOp = Tensor(const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                          c10::string_view, const OptTensor&, const OptTensor&, c10::string_view,
                          const OptTensor&, const OptTensor&, double, bool);
using QApplyOp = Tensor(const Tensor&, const OptTensor&, c10::string_view, const OptTensor&,
                        const OptTensor&, const Tensor&, double, int64_t, bool);
using DropoutOp = Tensor(const Tensor&, double, const Tensor&);
using QuadraticOp = Tensor(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&);
using SoftmaxOp = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                             const OptTensor&, double, double, const Tensor&);

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The forward ops, looked up once (their schemas exist from the library's load on).
struct ForwardOps {
  c10::TypedOperatorHandle<KvReduceOp> kv_reduce = find_op<KvReduceOp>("galerkin_ext::kv_reduce");
  c10::TypedOperatorHandle<QApplyOp> q_apply = find_op<QApplyOp>("galerkin_ext::q_apply");
  c10::TypedOperatorHandle<DropoutOp> dropout = find_op<DropoutOp>("galerkin_ext::dropout");
  c10::TypedOperatorHandle<QuadraticOp> quadratic =
      find_op<QuadraticOp>("galerkin_ext::quadratic_attention");
  c10::TypedOperatorHandle<SoftmaxOp> softmax =
      find_op<SoftmaxOp>("galerkin_ext::softmax_attention");
};

const ForwardOps& forward_ops() {
  static const ForwardOps handles;
  return handles;
}

// op on args below autograd (under a vmap, its batching still applies).
template <typename Signature, typename... Args>
auto below_autograd(const c10::TypedOperatorHandle<Signature>& op, Args&&... args) {
  const at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(std::forward<Args>(args)...);
}

using KvReduceBackward = std::vector<Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
    c10::string_view, const OptTensor&, const OptTensor&, c10::string_view, const OptTensor&,
    const OptTensor&, double, bool, bool, bool);
using QApplyBackward = std::vector<Tensor>(
    const Tensor&, const Tensor&, const OptTensor&, c10::string_view, const OptTensor&,
    const OptTensor&, const Tensor&, double, int64_t, bool, bool);

// A torch.func transform is active (as torch._C._are_functorch_transforms_active), or the
// legacy vmap that batches a backward over several gradients (is_grads_batched).
bool transforms_active() {
  const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
  return included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode) ||
         included.has(c10::DispatchKey::VmapMode);
}

// Refuse a call whose inputs carry forward-mode tangents (level 0, where torch's own kernels read
// them, under torch.func.jvp too): the compiled op would return a result without one.
void refuse_forward_ad(const char* op, std::initializer_list<OptTensor> inputs) {
  for (const OptTensor& t : inputs) {
    TORCH_CHECK(!t.has_value() || !t->defined() || !t->_fw_grad(0).defined(), op,
                " has no forward-mode derivative: call it through galerkin_ext.ops, which hands "
                "forward mode (dual tensors, torch.func.jvp) to plain-PyTorch formulas");
  }
}

// A backward op and its formula twin, looked up once by each backward.
template <typename Signature>
struct BackwardOps {
  const char* name;
  c10::TypedOperatorHandle<Signature> compiled;
  c10::TypedOperatorHandle<Signature> formula;
};

template <typename Signature>
BackwardOps<Signature> backward_ops(const char* name) {
  return {name, find_op<Signature>(name),
          find_op<Signature>((std::string(name) + "_formula").c_str())};
}

// The backward op on args, below autograd; under create_graph=True or a torch.func transform its
// formula twin, through autograd.
template <typename Signature, typename... Args>
std::vector<Tensor> call_backward(const BackwardOps<Signature>& ops, const Tensor& grad,
                                  Args&&... args) {
  const bool batched = transforms_active();
  if (!at::GradMode::is_enabled() && !batched) {
    return below_autograd(ops.compiled, grad, std::forward<Args>(args)...);
  }
  TORCH_CHECK(ops.formula.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd),
              "second-order and batched gradients of ", ops.name, " need ", ops.name,
              "_formula, which importing galerkin_ext.ops registers");
  if (!batched) return ops.formula.call(grad, std::forward<Args>(args)...);
  // The batching key would take the call and find no rule (a list of tensors defeats its
  // per-sample fallback): the composite kernel itself runs, from the device's slot, on the
  // batched tensors, whose plain ops batch.
  const c10::DispatchKeySet device(
      c10::computeDispatchKey(std::nullopt, std::nullopt, grad.device()));
  return ops.formula.redispatch(device, grad, std::forward<Args>(args)...);
}

class KvReduce : public torch::autograd::Function<KvReduce> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& k, const Tensor& v,
                        const OptTensor& kv_pos, const OptTensor& weight,
                        c10::string_view k_map, const OptTensor& k_norm_weight,
                        const OptTensor& k_norm_bias, c10::string_view v_map,
                        const OptTensor& v_norm_weight, const OptTensor& v_norm_bias,
                        double eps, bool ones_column) {
    Tensor s = below_autograd(forward_ops().kv_reduce, k, v, kv_pos, weight, k_map,
                              k_norm_weight, k_norm_bias, v_map, v_norm_weight, v_norm_bias, eps,
                              ones_column);
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
    static const auto ops = backward_ops<KvReduceBackward>("galerkin_ext::kv_reduce_backward");
    variable_list g = keep_needed(
        call_backward(
            ops, grad_outputs[0], saved[0], saved[1],
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
    Tensor out = below_autograd(forward_ops().q_apply, q, pos, q_map, q_norm_weight,
                                q_norm_bias, s, eps, normalizers, skip);
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
    static const auto ops = backward_ops<QApplyBackward>("galerkin_ext::q_apply_backward");
    variable_list g = keep_needed(
        call_backward(
            ops, grad_outputs[0].contiguous(), saved[0],
            optional(saved[1]), c10::string_view(q_map), optional(saved[2]), optional(saved[3]),
            saved[4], ctx->saved_data["eps"].toDouble(), ctx->saved_data["normalizers"].toInt(),
            ctx->saved_data["skip"].toBool(), bool(needs[1])),
        needs);
    // (q, pos, q_map, q_norm_weight, q_norm_bias, s, eps, normalizers, skip).
    return {g[0], g[1], Tensor(), g[2], g[3], g[4], Tensor(), Tensor(), Tensor()};
  }
};

// Linear in x: the backward is the same op on the gradient, the mask regenerated from the seed
// (differentiable in turn). The mask follows memory order, so the gradient is laid out as the
// output was.
class Dropout : public torch::autograd::Function<Dropout> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double p, const Tensor& seed) {
    Tensor out = below_autograd(forward_ops().dropout, x, p, seed);
    ctx->save_for_backward({seed});
    ctx->saved_data["p"] = p;
    ctx->saved_data["strides"] = out.strides().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const std::vector<int64_t> strides = ctx->saved_data["strides"].toIntVector();
    const double p = ctx->saved_data["p"].toDouble();
    const Tensor seed = ctx->get_saved_variables()[0];
    Tensor grad = grad_outputs[0];
    // (through autograd: differentiable in turn under create_graph=True)
    if (grad.strides() == c10::IntArrayRef(strides)) {
      return {forward_ops().dropout.call(grad, p, seed), Tensor(), Tensor()};
    }
    if (transforms_active()) {
      // a batched gradient cannot be copied into a plain tensor: the mask, laid out as the
      // output was, times the gradient
      const Tensor ones = at::empty_strided(grad.sizes(), strides, grad.options()).fill_(1);
      return {grad.mul(forward_ops().dropout.call(ones, p, seed)), Tensor(), Tensor()};
    }
    grad = at::empty_strided(grad.sizes(), strides, grad.options()).copy_(grad);
    return {forward_ops().dropout.call(grad, p, seed), Tensor(), Tensor()};
  }
};

using QuadraticBackward = std::vector<Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                              const Tensor&, double, const Tensor&);

class QuadraticAttention : public torch::autograd::Function<QuadraticAttention> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        double p, const Tensor& seed) {
    Tensor out = below_autograd(forward_ops().quadratic, q, k, v, p, seed);
    ctx->save_for_backward({q, k, v, seed});
    ctx->saved_data["p"] = p;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    static const auto ops =
        backward_ops<QuadraticBackward>("galerkin_ext::quadratic_attention_backward");
    const std::vector<Tensor> g = call_backward(
        ops, grad_outputs[0], saved[0], saved[1],
        saved[2], ctx->saved_data["p"].toDouble(), saved[3]);
    // (q, k, v, p, seed)
    return {ctx->needs_input_grad(0) ? g[0] : Tensor(), ctx->needs_input_grad(1) ? g[1] : Tensor(),
            ctx->needs_input_grad(2) ? g[2] : Tensor(), Tensor(), Tensor()};
  }
};

using SoftmaxBackward = std::vector<Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, const OptTensor&, const Tensor&,
                                            const Tensor&, double, double, const Tensor&);

class SoftmaxAttention : public torch::autograd::Function<SoftmaxAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k,
                               const Tensor& v, const OptTensor& bias, double scale, double p,
                               const Tensor& seed) {
    auto [out, lse] = below_autograd(forward_ops().softmax, q, k, v, bias, scale, p, seed);
    ctx->mark_non_differentiable({lse});
    ctx->save_for_backward({q, k, v, bias.value_or(Tensor()), out, lse, seed});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["p"] = p;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const bool has_bias = saved[3].defined();
    static const auto ops =
        backward_ops<SoftmaxBackward>("galerkin_ext::softmax_attention_backward");
    const std::vector<Tensor> g = call_backward(
        ops, grad_outputs[0], saved[0], saved[1],
        saved[2], optional(saved[3]), saved[4], saved[5], ctx->saved_data["scale"].toDouble(),
        ctx->saved_data["p"].toDouble(), saved[6]);
    // (q, k, v, bias, scale, p, seed); the context numbers only the tensors given
    return {ctx->needs_input_grad(0) ? g[0] : Tensor(), ctx->needs_input_grad(1) ? g[1] : Tensor(),
            ctx->needs_input_grad(2) ? g[2] : Tensor(),
            has_bias && ctx->needs_input_grad(3) ? g[3] : Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The autograd kernels: a call that needs no gradient goes below autograd directly (a C++
// autograd function refuses every torch.func transform, vmap included, where the compiled op
// itself is batched by torch's per-sample fallback).
bool records(std::initializer_list<OptTensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const OptTensor& t : inputs) {
    if (t.has_value() && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

Tensor dropout_autograd(const Tensor& x, double p, const Tensor& seed) {
  refuse_forward_ad("galerkin_ext::dropout", {x});
  if (records({x})) return Dropout::apply(x, p, seed);
  return below_autograd(forward_ops().dropout, x, p, seed);
}

Tensor quadratic_attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, double p,
                                    const Tensor& seed) {
  refuse_forward_ad("galerkin_ext::quadratic_attention", {q, k, v});
  if (records({q, k, v})) return QuadraticAttention::apply(q, k, v, p, seed);
  return below_autograd(forward_ops().quadratic, q, k, v, p, seed);
}

std::tuple<Tensor, Tensor> softmax_attention_autograd(const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const OptTensor& bias,
                                                      double scale, double p,
                                                      const Tensor& seed) {
  refuse_forward_ad("galerkin_ext::softmax_attention", {q, k, v, bias});
  if (records({q, k, v, bias})) {
    const variable_list outs = SoftmaxAttention::apply(q, k, v, bias, scale, p, seed);
    return {outs[0], outs[1]};
  }
  return below_autograd(forward_ops().softmax, q, k, v, bias, scale, p, seed);
}

Tensor kv_reduce_autograd(const Tensor& k, const Tensor& v, const OptTensor& kv_pos,
                          const OptTensor& weight, c10::string_view k_map,
                          const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
                          c10::string_view v_map, const OptTensor& v_norm_weight,
                          const OptTensor& v_norm_bias, double eps, bool ones_column) {
  refuse_forward_ad("galerkin_ext::kv_reduce", {k, v, kv_pos, weight, k_norm_weight,
                                                k_norm_bias, v_norm_weight, v_norm_bias});
  return KvReduce::apply(k, v, kv_pos, weight, k_map, k_norm_weight, k_norm_bias, v_map,
                         v_norm_weight, v_norm_bias, eps, ones_column);
}

Tensor q_apply_autograd(const Tensor& q, const OptTensor& pos, c10::string_view q_map,
                        const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
                        const Tensor& s, double eps, int64_t normalizers, bool skip) {
  refuse_forward_ad("galerkin_ext::q_apply", {q, pos, q_norm_weight, q_norm_bias, s});
  return QApply::apply(q, pos, q_map, q_norm_weight, q_norm_bias, s, eps, normalizers, skip);
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, Autograd, m) {
  m.impl("kv_reduce", &kv_reduce_autograd);
  m.impl("q_apply", &q_apply_autograd);
  m.impl("dropout", &dropout_autograd);
  m.impl("quadratic_attention", &quadratic_attention_autograd);
  m.impl("softmax_attention", &softmax_attention_autograd);
}

}  // namespace galerkin_ext
