// The op core's schemas' implementations (core.h): validation of direct callers (ops.py gives
// friendlier messages first), then the device's twin, registered per device below.
#include "core.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <cmath>
#include <initializer_list>

namespace galerkin_ext {

RowMap parse_row_map(c10::string_view name, const char* arg) {
  if (name == "identity") return RowMap::kIdentity;
  if (name == "layer_norm") return RowMap::kLayerNorm;
  if (name == "softmax") return RowMap::kSoftmax;
  TORCH_CHECK(false, arg, ": expected 'identity', 'layer_norm' or 'softmax', got '", name, "'");
}

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

void check_operand(const Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4, name, ": expected shape (B, H, points, D), got ", x.sizes());
  TORCH_CHECK(x.size(3) > 0, name, ": expected D >= 1, got ", x.sizes());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), name, ": expected a floating dtype, got ",
              x.scalar_type());
}

// The eps of the layer norms among the maps (the other maps take none): a NaN or negative one
// gave NaN rows, an infinite one zero rows.
void check_eps(double eps, std::initializer_list<RowMap> maps) {
  for (const RowMap map : maps) {
    TORCH_CHECK(map != RowMap::kLayerNorm || (std::isfinite(eps) && eps > 0),
                "eps: expected a finite float > 0 for layer_norm, got ", eps);
  }
}

// A parameter (quadrature weight, norm parameters) of x: x's dtype, or float32 for half and
// bfloat16 x, which keeps small weights (1/N < 2^-14 is subnormal in half) and the norm
// parameters of an autocast model in full precision.
void check_param(const Tensor& t, const Tensor& x, const char* name) {
  const bool reduced = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  if (reduced && t.scalar_type() == at::kFloat) {
    TORCH_CHECK(t.device() == x.device(), name, ": expected device ", x.device(), ", got ",
                t.device());
    return;
  }
  check_same(t, x, name);
}

// pos (B, n, P) or (n, P), or weight (B, n) or (n,) (a parameter: check_param), of the rows of
// x (B, H, n, D).
OptTensor rows_tensor(const OptTensor& t, const Tensor& x, int64_t trailing, const char* name) {
  if (!t) return std::nullopt;
  if (trailing == 0) {
    check_param(*t, x, name);
  } else {
    check_same(*t, x, name);
  }
  const int64_t B = x.size(0), n = x.size(2), dim = t->dim() - trailing;
  TORCH_CHECK((dim == 2 && t->size(0) == B && t->size(1) == n) || (dim == 1 && t->size(0) == n),
              name, ": expected leading shape (B, n) or (n,) with B = ", B, ", n = ", n,
              ", got ", t->sizes());
  return t->contiguous();
}

// The norm pair of an operand with the given map: present exactly for layer_norm, (H, D).
std::pair<OptTensor, OptTensor> norm_pair(RowMap map, const OptTensor& w, const OptTensor& b,
                                          const Tensor& x, const char* name) {
  const bool norm = map == RowMap::kLayerNorm;
  TORCH_CHECK(w.has_value() == norm && b.has_value() == norm, name,
              norm ? ": layer_norm needs its weight and bias" : ": given without layer_norm");
  if (!norm) return {};
  TORCH_CHECK(w->scalar_type() == b->scalar_type(), name, ": weight and bias dtypes differ: ",
              w->scalar_type(), " and ", b->scalar_type());
  for (const Tensor* t : {&*w, &*b}) {
    check_param(*t, x, name);
    TORCH_CHECK(t->dim() == 2 && t->size(0) == x.size(1) && t->size(1) == x.size(3), name,
                ": expected shape (H, D) = (", x.size(1), ", ", x.size(3), "), got ",
                t->sizes());
  }
  return {w->contiguous(), b->contiguous()};
}

KvReduceInputs kv_inputs(const Tensor& k, const Tensor& v, const OptTensor& kv_pos,
                         const OptTensor& weight, c10::string_view k_map,
                         const OptTensor& k_norm_weight, const OptTensor& k_norm_bias,
                         c10::string_view v_map, const OptTensor& v_norm_weight,
                         const OptTensor& v_norm_bias, bool ones_column) {
  check_operand(k, "k");
  check_operand(v, "v");
  check_same(v, k, "v");
  TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
              "v: expected shape (B, H, M, D_v) with (B, H, M) of k ", k.sizes(), ", got ",
              v.sizes());
  KvReduceInputs in;
  in.k = k;
  in.v = v;
  in.kv_pos = rows_tensor(kv_pos, k, 1, "kv_pos");
  in.weight = rows_tensor(weight, k, 0, "weight");
  in.k_map = parse_row_map(k_map, "k_map");
  in.v_map = parse_row_map(v_map, "v_map");
  std::tie(in.k_norm_weight, in.k_norm_bias) =
      norm_pair(in.k_map, k_norm_weight, k_norm_bias, k, "k_norm");
  std::tie(in.v_norm_weight, in.v_norm_bias) =
      norm_pair(in.v_map, v_norm_weight, v_norm_bias, v, "v_norm");
  in.ones_column = ones_column;
  in.B = k.size(0);
  in.H = k.size(1);
  in.M = k.size(2);
  in.Dk = k.size(3);
  in.Dv = v.size(3);
  in.P = in.kv_pos ? in.kv_pos->size(-1) : 0;
  return in;
}

QApplyInputs q_inputs(const Tensor& q, const OptTensor& pos, c10::string_view q_map,
                      const OptTensor& q_norm_weight, const OptTensor& q_norm_bias,
                      const Tensor& s, int64_t normalizers, bool skip) {
  check_operand(q, "q");
  QApplyInputs in;
  in.q = q;
  in.pos = rows_tensor(pos, q, 1, "pos");
  in.q_map = parse_row_map(q_map, "q_map");
  std::tie(in.q_norm_weight, in.q_norm_bias) =
      norm_pair(in.q_map, q_norm_weight, q_norm_bias, q, "q_norm");
  in.B = q.size(0);
  in.H = q.size(1);
  in.N = q.size(2);
  in.D = q.size(3);
  in.P = in.pos ? in.pos->size(-1) : 0;
  const auto opmath = opmath_dtype(q);
  TORCH_CHECK(s.device() == q.device() && s.scalar_type() == opmath, "s: expected ", opmath,
              " on ", q.device(), ", got ", s.scalar_type(), " on ", s.device());
  TORCH_CHECK(s.dim() == 4 && s.size(0) == in.B && s.size(1) == in.H &&
                  s.size(2) == in.P + in.D,
              "s: expected shape (B, H, P + D, W) = (", in.B, ", ", in.H, ", ", in.P + in.D,
              ", W), got ", s.sizes());
  in.s = s.contiguous();
  in.W = s.size(3);
  TORCH_CHECK(normalizers >= 0, "normalizers: expected >= 0, got ", normalizers);
  TORCH_CHECK(normalizers == 0 || (in.W % normalizers == 0 && in.W / normalizers >= 2),
              "normalizers: ", normalizers, " blocks of (d_v + 1) >= 2 columns do not make up ",
              "W = ", in.W);
  in.normalizers = normalizers;
  TORCH_CHECK(!skip || in.out_width() == in.query_width(), "skip: needs the output width ",
              in.out_width(), " to equal Q̂'s width P + D = ", in.query_width());
  in.skip = skip;
  return in;
}

// The kernels' own ATen calls run below autograd (their inputs may require grad: the op's
// autograd is registered in ops.py) and outside autocast (the ops pick their own precision).
struct KernelGuard {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

// A gradient of zeros for an optional input where it is present (and wanted).
Tensor zeros_for(const OptTensor& t, bool wanted = true) {
  return t.has_value() && wanted ? at::zeros_like(*t) : Tensor();
}

// The schemas' functions, one instantiation per device twin. Without points (M = 0 keys, N = 0
// queries: a padded batch, a shard of a split domain) the results are sums over nothing, taken
// here for every device: the twins' chunking and launch sizes need points.
template <Tensor (*Twin)(const KvReduceInputs&, double)>
Tensor kv_reduce(const Tensor& k, const Tensor& v, const OptTensor& kv_pos,
                 const OptTensor& weight, c10::string_view k_map, const OptTensor& k_norm_weight,
                 const OptTensor& k_norm_bias, c10::string_view v_map,
                 const OptTensor& v_norm_weight, const OptTensor& v_norm_bias, double eps,
                 bool ones_column) {
  const KernelGuard guard;
  const KvReduceInputs in = kv_inputs(k, v, kv_pos, weight, k_map, k_norm_weight, k_norm_bias,
                                      v_map, v_norm_weight, v_norm_bias, ones_column);
  check_eps(eps, {in.k_map, in.v_map});
  if (in.M == 0) {
    return at::zeros({in.B, in.H, in.key_width(), in.value_width()},
                     k.options().dtype(at::toOpMathType(k.scalar_type())));
  }
  return Twin(in, eps);
}

std::vector<Tensor> empty_for_undefined(std::vector<Tensor> grads, const Tensor& like) {
  for (Tensor& t : grads) {
    if (!t.defined()) t = at::empty({0}, like.options());
  }
  return grads;
}

template <KvReduceGrads (*Twin)(const KvReduceInputs&, const Tensor&, double, bool, bool)>
std::vector<Tensor> kv_reduce_backward(
    const Tensor& grad_s, const Tensor& k, const Tensor& v, const OptTensor& kv_pos,
    const OptTensor& weight, c10::string_view k_map, const OptTensor& k_norm_weight,
    const OptTensor& k_norm_bias, c10::string_view v_map, const OptTensor& v_norm_weight,
    const OptTensor& v_norm_bias, double eps, bool ones_column, bool kv_pos_grad,
    bool weight_grad) {
  const KernelGuard guard;
  const KvReduceInputs in = kv_inputs(k, v, kv_pos, weight, k_map, k_norm_weight, k_norm_bias,
                                      v_map, v_norm_weight, v_norm_bias, ones_column);
  check_eps(eps, {in.k_map, in.v_map});
  TORCH_CHECK(grad_s.sizes() == at::IntArrayRef({in.B, in.H, in.key_width(), in.value_width()}),
              "grad_s: expected shape (B, H, d_k, d_v) = (", in.B, ", ", in.H, ", ",
              in.key_width(), ", ", in.value_width(), "), got ", grad_s.sizes());
  TORCH_CHECK(grad_s.device() == k.device() && at::isFloatingType(grad_s.scalar_type()),
              "grad_s: expected a floating tensor on ", k.device(), ", got ",
              grad_s.scalar_type(), " on ", grad_s.device());
  TORCH_CHECK(!kv_pos_grad || in.kv_pos, "kv_pos_grad: requested without kv_pos");
  TORCH_CHECK(!weight_grad || in.weight, "weight_grad: requested without weight");
  if (in.M == 0) {
    const KvReduceGrads none{at::empty_like(k),
                             at::empty_like(v),
                             zeros_for(kv_pos, kv_pos_grad),
                             zeros_for(weight, weight_grad),
                             zeros_for(k_norm_weight),
                             zeros_for(k_norm_bias),
                             zeros_for(v_norm_weight),
                             zeros_for(v_norm_bias)};
    return empty_for_undefined(none.list(), k);
  }
  return empty_for_undefined(Twin(in, grad_s, eps, kv_pos_grad, weight_grad).list(), k);
}

template <Tensor (*Twin)(const QApplyInputs&, double)>
Tensor q_apply(const Tensor& q, const OptTensor& pos, c10::string_view q_map,
               const OptTensor& q_norm_weight, const OptTensor& q_norm_bias, const Tensor& s,
               double eps, int64_t normalizers, bool skip) {
  const KernelGuard guard;
  const QApplyInputs in = q_inputs(q, pos, q_map, q_norm_weight, q_norm_bias, s, normalizers,
                                   skip);
  check_eps(eps, {in.q_map});
  if (in.N == 0) return at::empty({in.B, in.H, 0, in.out_width()}, q.options());
  return Twin(in, eps);
}

template <QApplyGrads (*Twin)(const QApplyInputs&, const Tensor&, double, bool)>
std::vector<Tensor> q_apply_backward(const Tensor& grad_out, const Tensor& q,
                                     const OptTensor& pos, c10::string_view q_map,
                                     const OptTensor& q_norm_weight,
                                     const OptTensor& q_norm_bias, const Tensor& s, double eps,
                                     int64_t normalizers, bool skip, bool pos_grad) {
  const KernelGuard guard;
  const QApplyInputs in =
      q_inputs(q, pos, q_map, q_norm_weight, q_norm_bias, s, normalizers, skip);
  check_eps(eps, {in.q_map});
  TORCH_CHECK(grad_out.sizes() == at::IntArrayRef({in.B, in.H, in.N, in.out_width()}),
              "grad_out: expected shape (B, H, N, ", in.out_width(), "), got ",
              grad_out.sizes());
  check_same(grad_out, q, "grad_out");
  TORCH_CHECK(!pos_grad || in.pos, "pos_grad: requested without pos");
  if (in.N == 0) {
    const QApplyGrads none{at::empty_like(q), zeros_for(pos, pos_grad), zeros_for(q_norm_weight),
                           zeros_for(q_norm_bias), at::zeros_like(s)};
    return empty_for_undefined(none.list(), q);
  }
  return empty_for_undefined(Twin(in, grad_out, eps, pos_grad).list(), q);
}

}  // namespace

TORCH_LIBRARY_IMPL(galerkin_ext, CPU, m) {
  m.impl("kv_reduce", &kv_reduce<kv_reduce_cpu>);
  m.impl("kv_reduce_backward", &kv_reduce_backward<kv_reduce_backward_cpu>);
  m.impl("q_apply", &q_apply<q_apply_cpu>);
  m.impl("q_apply_backward", &q_apply_backward<q_apply_backward_cpu>);
}

#ifdef GALERKIN_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(galerkin_ext, CUDA, m) {
  m.impl("kv_reduce", &kv_reduce<kv_reduce_cuda>);
  m.impl("kv_reduce_backward", &kv_reduce_backward<kv_reduce_backward_cuda>);
  m.impl("q_apply", &q_apply<q_apply_cuda>);
  m.impl("q_apply_backward", &q_apply_backward<q_apply_backward_cuda>);
}
#endif

}  // namespace galerkin_ext
