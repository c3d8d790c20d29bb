"""The compiled attention ops against the float64 reference, their gradients, and their errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from attention_cases import (
    CASES,
    F64,
    Case,
    fourier,
    galerkin,
    grad_inputs,
    make_inputs,
    map_inputs,
)
from conftest import TORCH_BEFORE_2_6

from galerkin_ext import ops, reference

# ----------------------------------------------------------------------------------------------
# Forward against the reference


@pytest.mark.parametrize("case", CASES, ids=str)
def test_galerkin_matches_reference(case, gen):
    x = make_inputs(case, gen)
    out = galerkin(x)
    assert out.shape == (case.B, case.H, case.N, case.D + case.P)
    torch.testing.assert_close(out, galerkin(x, reference), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["auto", "factored", "quadratic"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fourier_matches_reference(case, path, gen):
    x = make_inputs(case, gen)
    out = fourier(x, path=path)
    assert out.shape == (case.B, case.H, case.N, case.D + case.P)
    torch.testing.assert_close(out, fourier(x, reference), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES[2:6], ids=str)
def test_float32_close_to_float64_reference(case, gen):
    x64 = make_inputs(case, gen)
    x32 = map_inputs(x64, lambda t: t.to(torch.float32))
    for fn in (galerkin, fourier):
        out = fn(x32)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), fn(x64, reference), rtol=1e-4, atol=1e-5)


def test_fourier_paths_agree_at_scale(gen):
    x = make_inputs(Case(2, 4, 1000, 32, P=2, weight="batched"), gen, dtype=torch.float32)
    factored, quadratic = fourier(x, path="factored"), fourier(x, path="quadratic")
    torch.testing.assert_close(factored, quadratic, rtol=1e-4, atol=1e-5)


def test_custom_scale_and_eps(gen):
    x = make_inputs(Case(2, 2, 11, 6, P=1), gen)
    for scale in (1.0, 0.25):
        out = fourier(x, scale=scale)
        torch.testing.assert_close(out, fourier(x, reference, scale=scale), rtol=1e-12, atol=1e-12)
    x["q"] = x["q"] * 1e-4  # eps matters when the row variance is comparable
    kw = dict(pos=x["pos"], k_norm=x["n1"], v_norm=x["n2"], eps=1e-7)
    torch.testing.assert_close(
        ops.galerkin_attention(x["k"], x["q"], x["v"], **kw),
        reference.galerkin_attention(x["k"], x["q"], x["v"], **kw), rtol=1e-10, atol=1e-12)


def test_zero_weight_masks_points_out(gen):
    """Points with w = 0 change nothing: padding a batch with junk is exact."""
    case = Case(1, 2, 10, 4, P=1)
    x = make_inputs(case, gen)
    weight = torch.full((10,), 1 / 6, dtype=F64)
    weight[6:] = 0
    full = ops.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"], weight=weight,
                                  k_norm=x["n1"], v_norm=x["n2"])
    junk = {key: x[key].clone() for key in ("k", "v")}
    for t in junk.values():
        t[:, :, 6:] = 1e6
    padded = ops.galerkin_attention(x["q"], junk["k"], junk["v"], pos=x["pos"], weight=weight,
                                    k_norm=x["n1"], v_norm=x["n2"])
    torch.testing.assert_close(full, padded, rtol=1e-12, atol=1e-12)
    short = ops.galerkin_attention(x["q"][:, :, :6], x["k"][:, :, :6], x["v"][:, :, :6],
                                   pos=x["pos"][:, :6], k_norm=x["n1"], v_norm=x["n2"])
    torch.testing.assert_close(full[:, :, :6], short, rtol=1e-12, atol=1e-12)


def test_attention_matrix(gen):
    x = make_inputs(Case(2, 2, 9, 3, P=2), gen)
    args = (x["q"], x["k"], x["v"])
    out, attn = ops.kernel_attention(*args, pos=x["pos"], k_norm=x["n1"], v_norm=x["n2"],
                                           scale=1.0)
    assert attn.shape == (2, 2, 5, 5)
    k_hat = reference.concat_pos(reference.per_head_layer_norm(x["k"], x["n1"], 1e-5), x["pos"])
    v_hat = reference.concat_pos(reference.per_head_layer_norm(x["v"], x["n2"], 1e-5), x["pos"])
    torch.testing.assert_close(attn, k_hat.transpose(-2, -1) @ v_hat / 9, rtol=1e-12, atol=1e-12)
    out, attn = ops.kernel_attention(*args, pos=x["pos"], q_norm=x["n1"], k_norm=x["n2"],
                                     path="quadratic")
    assert attn.shape == (2, 2, 9, 9)
    torch.testing.assert_close(attn @ reference.concat_pos(x["v"], x["pos"]), out)


# ----------------------------------------------------------------------------------------------
# Dropout on the attention matrix


def _with_dropout(x, quadratic, **kw):
    """ops.kernel_attention as Fourier (norms on q, k) for the quadratic path, as Galerkin
    (norms on k, v) for the factored one, with dropout on its attention matrix."""
    norms = (dict(q_norm=x["n1"], k_norm=x["n2"]) if quadratic
             else dict(k_norm=x["n1"], v_norm=x["n2"]))
    return ops.kernel_attention(x["q"], x["k"], x["v"], pos=x["pos"], weight=x["weight"],
                                path="quadratic" if quadratic else "factored", **norms, **kw)


@pytest.mark.parametrize("quadratic, torch_masks", [(False, False), (True, False), (True, True)])
def test_dropout_mask_matches_reference(quadratic, torch_masks, gen):
    """The op draws its inverted-dropout mask from torch's default generator and applies it as
    the reference does: on S a torch Bernoulli mask; on the N × M matrix ops.dropout's (the
    compiled op's Threefry mask over the contiguous matrix, test_dropout.py), or torch's with
    torch_masks=True."""
    case = Case(2, 2, 13, 5, P=1, weight="batched")
    x = make_inputs(case, gen)
    side = case.N if quadratic else case.D + case.P
    scale = 1 / math.sqrt(case.D + case.P) if quadratic else 1.0
    torch.manual_seed(3)
    got, _ = _with_dropout(x, quadratic, scale=scale, dropout_p=0.4, torch_masks=torch_masks)
    torch.manual_seed(3)
    shape = (2, 2, side, side)
    if quadratic and not torch_masks:
        mask = ops.dropout(torch.ones(shape, dtype=F64), 0.4)
    elif quadratic:  # (torch 2.5's dropout draws another mask than its bernoulli from one seed)
        mask = torch.nn.functional.dropout(torch.ones(shape, dtype=F64), 0.4)
    else:
        mask = torch.bernoulli(torch.full(shape, 0.6, dtype=F64)).div_(0.6)
    expected = (fourier if quadratic else galerkin)(x, reference, dropout_mask=mask)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_galerkin_dropout_with_values_wider_than_keys_matches_reference(gen):
    """The mask of S = K̂ᵀ W V̂ is (P + D) × (P + D_v): with D_v ≠ D (every other dropout case
    has D_v = D) a square mask failed to broadcast."""
    q, k = (torch.randn(2, 3, 7, 4, generator=gen, dtype=F64) for _ in range(2))
    v, pos = torch.randn(2, 3, 7, 6, generator=gen, dtype=F64), torch.rand(7, 2, dtype=F64)
    torch.manual_seed(3)
    got = ops.galerkin_attention(q, k, v, pos=pos, dropout_p=0.3)
    torch.manual_seed(3)
    mask = torch.bernoulli(torch.full((2, 3, 6, 8), 0.7, dtype=F64)).div_(0.7)
    expected = reference.galerkin_attention(q, k, v, pos=pos, dropout_mask=mask)
    assert got.shape == (2, 3, 7, 8)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("p", [0.0, 0.4])
@pytest.mark.parametrize("op", ["fourier_attention", "continuum_attention"])
def test_fused_gradients_under_create_graph_equal_the_plain_backward(op, p, gen):
    """create_graph=True takes the fused quadratic and softmax ops' gradients from Python
    formulas (differentiable in turn), the plain backward from the compiled kernels: with the
    same dropout mask they agree for every input. gradgradcheck could not see a formula that
    dropped the mask on one operand: it differentiates the formula against itself."""
    q, k, v = (torch.randn(2, 2, 6, 4, generator=gen, dtype=F64) for _ in range(3))
    fn = getattr(ops, op)

    def grads(create_graph: bool) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(3)
        out = fn(*leaves, dropout_p=p)
        return torch.autograd.grad(out.square().sum(), leaves, create_graph=create_graph)

    for plain, formula in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(formula, plain, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [galerkin, fourier], ids=["galerkin", "fourier"])
def test_dropout_whenever_asked_and_unbiased(fn, gen):
    """dropout_p > 0 drops on every call, as in F.scaled_dot_product_attention (which has no
    training flag either); a training flag is refused, not ignored."""
    x = make_inputs(Case(1, 1, 16, 4, P=1), gen)
    clean = fn(x)
    torch.testing.assert_close(fn(x, dropout_p=0.0), clean, rtol=0, atol=0)
    torch.manual_seed(1)
    a = fn(x, dropout_p=0.3)
    torch.manual_seed(1)
    b = fn(x, dropout_p=0.3)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # reproducible under a seed
    assert not torch.allclose(a, clean)
    with pytest.raises(TypeError, match="training"):
        fn(x, dropout_p=0.3, training=False)
    mean = torch.stack([fn(x, dropout_p=0.3) for _ in range(3000)]).mean(0)
    assert (mean - clean).norm() < 0.05 * clean.norm()  # inverted dropout keeps the mean


# ----------------------------------------------------------------------------------------------
# Gradients


GRAD_CASES = [
    Case(2, 2, 5, 3, P=2, weight="batched", layout="projected"),
    Case(1, 3, 4, 2, P=1, shared_pos=True, weight="shared"),
    Case(2, 1, 1, 3, P=1),
    Case(1, 2, 6, 4, norms=False, layout="sliced"),
    Case(1, 1, 3, 57, P=1, weight="batched"),  # d = 58, padded to 64 inside the op
]


def _as_fn(fn, x, names, **kw):
    def call(*tensors):
        y = dict(x)
        y.update(zip(names, tensors[: len(names)], strict=True))
        rest = list(tensors[len(names):])
        if x["n1"] is not None:
            y["n1"] = (rest.pop(0), rest.pop(0))
        if x["n2"] is not None:
            y["n2"] = (rest.pop(0), rest.pop(0))
        return fn(y, **kw)
    return call


@pytest.mark.parametrize("variant", ["galerkin", "fourier-factored", "fourier-quadratic"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradcheck(case, variant, gen):
    x = make_inputs(case, gen, requires_grad=True)
    names, tensors = grad_inputs(x)
    if variant == "galerkin":
        call = _as_fn(galerkin, x, names)
    else:
        call = _as_fn(fourier, x, names, path=variant.split("-")[1])
    assert torch.autograd.gradcheck(call, tensors, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ["galerkin", "fourier-factored", "fourier-quadratic"])
@pytest.mark.parametrize("case", GRAD_CASES[:3], ids=str)
def test_every_autodiff_mode(case, variant, gen):
    """Second-order gradients, forward mode (dual tensors, torch.func.jvp) and torch.func.grad
    are all correct: the op hands them to its plain-PyTorch formula."""
    x = make_inputs(case, gen, requires_grad=True)
    names, tensors = grad_inputs(x)
    fn = galerkin if variant == "galerkin" else fourier
    call = _as_fn(fn, x, names, **({} if variant == "galerkin" else
                                   {"path": variant.split("-")[1]}))
    assert torch.autograd.gradgradcheck(call, tensors, eps=1e-6, atol=1e-5, rtol=1e-4)
    assert torch.autograd.gradcheck(call, tensors, eps=1e-6, atol=1e-6, rtol=1e-5,
                                    check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_grad=False)
    plain = [t.detach() for t in tensors]
    tangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in plain]
    _, jvp = torch.func.jvp(call, tuple(plain), tuple(tangents))
    h = 1e-6
    up = call(*(t + h * d for t, d in zip(plain, tangents, strict=True)))
    down = call(*(t - h * d for t, d in zip(plain, tangents, strict=True)))
    torch.testing.assert_close(jvp, (up - down) / (2 * h), rtol=1e-5, atol=1e-6)
    grads = torch.func.grad(lambda *t: call(*t).square().sum(), argnums=0)(*plain)
    expected, = torch.autograd.grad(call(*tensors).square().sum(), tensors[0])
    torch.testing.assert_close(grads, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["galerkin_attention", "fourier_attention",
                                "normalized_attention", "continuum_attention"])
def test_vmap_over_quadrature_weights(op, gen):
    """An ensemble of quadrature rules through torch.func.vmap: the weights' value checks
    branched on batched tensors, which vmap refuses; under torch.func they are skipped."""
    q, k, v = (torch.randn(2, 2, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    weights = torch.rand(3, 7, generator=gen, dtype=torch.float64)
    fn = getattr(ops, op)
    out = torch.func.vmap(lambda w: fn(q, k, v, weight=w))(weights)
    torch.testing.assert_close(out, torch.stack([fn(q, k, v, weight=w) for w in weights]))


@pytest.mark.parametrize("op", ["galerkin_attention", "fourier_attention"])
def test_vmap_of_a_dropout_ensemble(op, gen):
    """torch.func.vmap over ensemble members with dropout: randomness="different" draws each
    member its own mask (the in-place draw was refused: "Cannot ask for different inplace
    randomness on an unbatched tensor"), "same" one mask for all."""
    q, k, v = (torch.randn(2, 2, 9, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    members = torch.stack([q, q, q])
    fn = getattr(ops, op)
    for randomness in ("different", "same"):
        out = torch.func.vmap(lambda m: fn(m, k, v, dropout_p=0.5),
                              randomness=randomness)(members)
        assert torch.equal(out[0], out[1]) == (randomness == "same")
        assert not torch.allclose(out[0], fn(q, k, v))


@pytest.mark.parametrize("quadratic", [False, True])
def test_gradcheck_through_attention_matrix_and_dropout(quadratic, gen):
    case = Case(2, 2, 5, 3, P=1, weight="batched")
    x = make_inputs(case, gen, requires_grad=True)

    def call(q, k, v, pos, w):
        torch.manual_seed(5)  # the same mask in every evaluation
        out, attn = _with_dropout({**x, "q": q, "k": k, "v": v, "pos": pos, "weight": w},
                                  quadratic, scale=0.7, dropout_p=0.5)
        return out.sin().sum() + (attn * attn).sum()

    assert torch.autograd.gradcheck(call, [x[key] for key in ("q", "k", "v", "pos", "weight")])


def test_gradients_match_reference_float32(gen):
    """Also covers the weight gradient at w = 0, where finite differences cannot go."""
    case = Case(2, 4, 300, 16, P=2, weight="batched", layout="projected")
    x32 = make_inputs(case, gen, dtype=torch.float32)
    assert (x32["weight"] == 0).any()
    _, leaves = grad_inputs(x32)
    for t in leaves:
        t.requires_grad_()
    x64 = map_inputs(x32, lambda t: t.detach().double().requires_grad_())
    for fn in (galerkin, fourier):
        names, t32 = grad_inputs(x32)
        _, t64 = grad_inputs(x64)
        upstream = torch.randn(case.B, case.H, case.N, case.D + case.P, generator=gen)
        g32 = torch.autograd.grad(fn(x32), t32, upstream)
        g64 = torch.autograd.grad(fn(x64, reference), t64, upstream.double())
        for a, b in zip(g32, g64, strict=True):
            torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-4 * b.abs().max())


@pytest.mark.parametrize("path", ["factored", "quadratic"])
def test_repeated_calls_are_bitwise_equal(path, gen):
    """Same inputs, same bits, forward and backward: the vectorised row sums must not depend on
    where a scratch buffer happens to start (they once did, in the last bit, for D = 8 and 9)."""
    for dim in (4, 8, 9, 33):
        x = make_inputs(Case(2, 2, 40, dim, P=1, weight="batched"), gen, dtype=torch.float32,
                        requires_grad=True)
        _, tensors = grad_inputs(x)
        upstream = torch.randn(2, 2, 40, dim + 1, generator=gen)
        runs = []
        for _ in range(6):
            out = fourier(x, path=path)
            runs.append((out, *torch.autograd.grad(out, tensors, upstream)))
        for run in runs[1:]:
            for a, b in zip(run, runs[0], strict=True):
                assert torch.equal(a, b), f"D = {dim}: a repeated call changed the result"


@pytest.mark.parametrize("coordinate_grads", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_core_chunking(threads, coordinate_grads, gen):
    """The CPU twins split the points into chunks by cache size and thread count (here 4 or 6
    chunks with a short last one, added up in 1 or 3 slots of consecutive chunks); every split
    must give the reference's values and gradients, including the sums over chunks of the pos,
    weight and norm gradients, with and without the coordinate and weight gradients asked
    for."""
    case = Case(2, 2, 1100, 96, P=1, shared_pos=True, weight="shared", layout="projected")
    x = make_inputs(case, gen, requires_grad=True)
    names, tensors = grad_inputs(x)
    if not coordinate_grads:
        x["pos"].requires_grad_(False)
        x["weight"].requires_grad_(False)
        names, tensors = names[:3], tensors[:3] + tensors[5:]
    labels = [*names, *["norm parameter"] * (len(tensors) - len(names))]
    upstream = torch.randn(case.B, case.H, case.N, case.D + case.P, generator=gen, dtype=F64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for fn in (galerkin, fourier):
            out, want_out = fn(x), fn(x, reference)
            torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
            got = torch.autograd.grad(out, tensors, upstream)
            want = torch.autograd.grad(want_out, tensors, upstream)
            for label, a, b in zip(labels, got, want, strict=True):
                # Absolute error ~ rounding of the largest terms: the weight gradients reach 1e4.
                scale = max(1.0, b.abs().max().item())
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * scale, msg=label)
    finally:
        torch.set_num_threads(before)


def test_no_grad_where_not_required(gen):
    x = make_inputs(Case(1, 2, 6, 3, P=1, weight="shared"), gen)
    x["q"].requires_grad_()
    out = galerkin(x)
    (gq,) = torch.autograd.grad(out.sum(), [x["q"]])
    assert gq.shape == x["q"].shape and x["pos"].grad is None and x["weight"].grad is None


# ----------------------------------------------------------------------------------------------
# torch.compile (opcheck of the compiled ops: test_op_core.py)


def test_torch_compile_fullgraph(gen):
    case = Case(2, 2, 24, 8, P=2, weight="batched")
    x = make_inputs(case, gen, dtype=torch.float32, requires_grad=True)

    def both(x):
        g = galerkin(x)
        f = fourier(x)
        return (g * f).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(both, fullgraph=True)
    expected, got = both(x), compiled(x)
    torch.testing.assert_close(got, expected)
    names, tensors = grad_inputs(x)
    for a, b in zip(torch.autograd.grad(got.sum(), tensors),
                    torch.autograd.grad(expected.sum(), tensors), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("op", ["galerkin", "fourier-dropout", "continuum-dropout", "dropout"])
def test_torch_func_transforms_inside_torch_compile(op, gen):
    """torch.compile of torch.func.jvp / grad through the ops equals eager: the formulas serve
    the transforms in the compiled region too (the compiled ops ran there, and gave zero
    tangents, or failed on the C++ autograd function)."""
    q, k, v, tangent = (torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64)
                        for _ in range(4))
    call = {"galerkin": lambda q: ops.galerkin_attention(q, k, v),
            "fourier-dropout": lambda q: ops.fourier_attention(q, k, v, dropout_p=0.3),
            "continuum-dropout": lambda q: ops.continuum_attention(q, k, v, dropout_p=0.3),
            "dropout": lambda q: ops.dropout(q, 0.3)}[op]

    def both(q, tangent):
        return (torch.func.jvp(call, (q,), (tangent,))[1],
                torch.func.grad(lambda q: call(q).square().sum())(q))

    torch._dynamo.reset()
    # (torch 2.5's dynamo cannot trace sdpa_kernel, which picks the math kernel: a graph break)
    fullgraph = not (op == "continuum-dropout" and TORCH_BEFORE_2_6)
    compiled = torch.compile(both, backend="aot_eager", fullgraph=fullgraph)
    for want, got in zip(_seeded(both, q, tangent), _seeded(compiled, q, tangent), strict=True):
        assert want.abs().max() > 0.1
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("op", ["galerkin", "fourier", "fourier-dropout", "normalized",
                                "continuum-weighted", "continuum-dropout", "dropout",
                                "dropout-transposed"])
def test_batched_backward_equals_one_backward_per_row(op, gen):
    """A backward batched over several gradients (jacobian(vectorize=True), is_grads_batched,
    which vmap the backward) equals one backward per gradient: the compiled backwards, which
    have no batching rules, hand it to their formulas (it failed: 'Batching rule not
    implemented for galerkin_ext::q_apply_backward')."""
    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    weight = torch.rand(1, 5, generator=gen, dtype=torch.float64) + 0.1
    call = {"galerkin": lambda q: ops.galerkin_attention(q, k, v),
            "fourier": lambda q: ops.fourier_attention(q, k, v),
            "fourier-dropout": lambda q: ops.fourier_attention(q, k, v, dropout_p=0.3),
            "normalized": lambda q: ops.normalized_attention(q, k, v),
            "continuum-weighted": lambda q: _on_sdpa_math(ops.continuum_attention, q, k, v,
                                                          weight=weight),
            "continuum-dropout": lambda q: ops.continuum_attention(q, k, v, dropout_p=0.3),
            "dropout": lambda q: ops.dropout(q, 0.3),
            # (an output laid out otherwise than the gradients)
            "dropout-transposed": lambda q: ops.dropout(q.transpose(-2, -1), 0.3)}[op]
    one_by_one = _seeded(torch.autograd.functional.jacobian, call, q)
    batched = _seeded(torch.autograd.functional.jacobian, call, q, vectorize=True)
    assert one_by_one.abs().max() > 0.1
    torch.testing.assert_close(batched, one_by_one, rtol=1e-12, atol=1e-14)
    square = lambda q: call(q).square().sum()  # noqa: E731
    torch.testing.assert_close(
        _seeded(torch.autograd.functional.hessian, square, q, vectorize=True),
        _seeded(torch.autograd.functional.hessian, square, q), rtol=1e-10, atol=1e-12)


def _on_sdpa_math(fn, *args, **kwargs):
    """(SDPA's fused kernels have no double backward, as the README says)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return fn(*args, **kwargs)


def _raw_op_calls(gen):
    """Per case: the op's name, a call of it as a function of one operand, and that operand."""
    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    seed = torch.tensor(7)
    s = torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "identity", None, None, "identity",
                                         None, None, 1e-5, False)

    def q_apply(q, s):
        return torch.ops.galerkin_ext.q_apply(q, None, "identity", None, None, s, 1e-5, 0, False)

    return {
        "dropout": ("dropout", lambda q: torch.ops.galerkin_ext.dropout(q, 0.3, seed), q),
        "quadratic_attention": ("quadratic_attention", lambda q: torch.ops.galerkin_ext.
                                quadratic_attention(q, k, v, 0.3, seed), q),
        "softmax_attention": ("softmax_attention", lambda q: torch.ops.galerkin_ext.
                              softmax_attention(q, k, v, None, 0.5, 0.3, seed)[0], q),
        "kv_reduce": ("kv_reduce", lambda k: torch.ops.galerkin_ext.kv_reduce(
            k, v, None, None, "identity", None, None, "identity", None, None, 1e-5, False), k),
        "q_apply": ("q_apply", lambda q: q_apply(q, s), q),
        "q_apply-s": ("q_apply", lambda s: q_apply(q, s), s),
    }


@pytest.mark.parametrize("case", ["dropout", "quadratic_attention", "softmax_attention",
                                  "kv_reduce", "q_apply", "q_apply-s"])
def test_raw_ops_refuse_forward_mode_naming_the_op(case, gen):
    """The compiled ops have no forward derivative: called directly with a tangent (on any
    operand) they refuse, naming the op (three of them returned zero tangents, the others
    torch's message)."""
    name, call, x = _raw_op_calls(gen)[case]
    message = f"galerkin_ext::{name} has no forward-mode derivative: call it through " \
              "galerkin_ext.ops"
    with pytest.raises(RuntimeError, match=message):
        torch.func.jvp(call, (x,), (torch.ones_like(x),))
    with torch.autograd.forward_ad.dual_level(), pytest.raises(RuntimeError, match=message):
        call(torch.autograd.forward_ad.make_dual(x, torch.ones_like(x)))
    call(x.requires_grad_()).sum().backward()  # reverse mode as before
    assert x.grad.abs().max() > 0


def _seeded(fn, *args, **kwargs):
    torch.manual_seed(1)  # the same dropout masks in both
    return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------------
# Bad input: the message names the argument


def _good(gen):
    x = make_inputs(Case(2, 2, 5, 3, P=1, weight="batched"), gen, dtype=torch.float32)
    return dict(q=x["q"], k=x["k"], v=x["v"], pos=x["pos"], weight=x["weight"], k_norm=x["n1"],
                v_norm=x["n2"])


BAD = {
    "q rank 3": (lambda a: a.update(q=a["q"][0]), "q", ValueError),
    "v other M than k": (lambda a: a.update(k=a["k"][:, :, :4]), "v", ValueError),
    "v other D than v_norm": (lambda a: a.update(v=torch.randn(2, 2, 5, 4)),
                              "v_norm[0]: expected shape (H, D_v) = (2, 4)", ValueError),
    "cross-attention without kv_pos": (lambda a: a.update(k=a["k"][:, :, :4], v=a["v"][:, :, :4]),
                                       "kv_pos", ValueError),
    "k other B": (lambda a: a.update(k=torch.randn(1, 2, 5, 3)), "k", ValueError),
    "k other H": (lambda a: a.update(k=torch.randn(2, 3, 5, 3)), "k", ValueError),
    "pos wrong N": (lambda a: a.update(pos=torch.rand(2, 4, 1)), "pos", ValueError),
    "pos wrong B": (lambda a: a.update(pos=torch.rand(3, 5, 1)), "pos", ValueError),
    "pos rank 1": (lambda a: a.update(pos=torch.rand(5)), "pos", ValueError),
    "weight wrong length": (lambda a: a.update(weight=torch.rand(4)), "weight", ValueError),
    "weight negative": (lambda a: a.update(weight=-torch.rand(5)), "weight", ValueError),
    "weight nan": (lambda a: a.update(weight=torch.full((5,), math.nan)), "weight", ValueError),
    "weight inf": (lambda a: a.update(weight=torch.full((2, 5), math.inf)), "weight", ValueError),
    "norm wrong shape": (lambda a: a.update(k_norm=(torch.ones(2, 4), torch.zeros(2, 4))),
                         "k_norm[0]", ValueError),
    "norm not a pair": (lambda a: a.update(v_norm=torch.ones(2, 3)), "v_norm", TypeError),
    "norm bias dtype": (lambda a: a.update(v_norm=(torch.ones(2, 3), torch.zeros(2, 3).double())),
                        "v_norm[1]", TypeError),
    "mixed devices": (lambda a: a.update(k=a["k"].to("meta")), "k", ValueError),
    "mixed dtypes": (lambda a: a.update(v=a["v"].double()), "v", TypeError),
    "pos dtype": (lambda a: a.update(pos=a["pos"].double()), "pos", TypeError),
    "integer dtype": (lambda a: a.update(q=a["q"].int(), k=a["k"].int(), v=a["v"].int()), "q",
                      TypeError),
    "empty N": (lambda a: a.update(q=torch.randn(2, 2, 0, 3), k=torch.randn(2, 2, 0, 3),
                                   v=torch.randn(2, 2, 0, 3), pos=None, weight=None), "q",
                ValueError),
    "not a tensor": (lambda a: a.update(v=[[1.0]]), "v", TypeError),
    "eps zero": (lambda a: a.update(eps=0.0), "eps", ValueError),
    # below float32's normal range the float32 norms would add 0 or a subnormal (NaN, 15 % off)
    "eps subnormal": (lambda a: a.update(eps=1e-45), r"eps: expected a finite float >= 1.17549e-38",
                      ValueError),
    "dropout_p 1": (lambda a: a.update(dropout_p=1.0), "dropout_p", ValueError),
    "dropout_p negative": (lambda a: a.update(dropout_p=-0.1), "dropout_p", ValueError),
}


@pytest.mark.parametrize("op", ["galerkin", "fourier", "normalized"])
@pytest.mark.parametrize("shared", ["pos", "q=k", "q=k=v"])
def test_higher_order_gradients_of_a_tensor_used_on_both_sides(op, shared, gen):
    """With create_graph=True, a tensor on both the query and the key side -- pos, which
    self-attention also takes as kv_pos, or one tensor as q and k -- had the key side's part
    of its gradient counted twice: d/d(grid) of a model doubled (a physics-informed loss, a
    Hessian) while create_graph=False was right. First and second order against the plain
    PyTorch reference."""
    if op == "normalized" and shared == "pos":
        pytest.skip("the reference's normalised attention takes no coordinates")
    t, v, p = (torch.randn(2, 2, 5, 3, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.randn(2, 5, 2, generator=gen, dtype=torch.float64)

    def call(module, x):
        q, k = (t, t) if shared == "pos" else (x, x)
        value = x if shared == "q=k=v" else v
        if op == "normalized":
            return module.normalized_attention(q, k, value)
        kwargs = {"pos": x if shared == "pos" else pos}
        if op == "galerkin":
            return module.galerkin_attention(q, k, value, **kwargs)
        return module.fourier_attention(q if shared != "pos" else p, k, value, **kwargs)

    def first_and_second(module):
        x = (pos if shared == "pos" else t).clone().requires_grad_()
        first = torch.autograd.grad(call(module, x).square().sum(), x, create_graph=True)[0]
        return first, torch.autograd.grad(first.sin().sum(), x)[0]

    for ours, expected in zip(first_and_second(ops), first_and_second(reference), strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def _refused(galerkin_attention, name, gen):
    """``galerkin_attention`` given the arguments of ``BAD[name]`` raises its error."""
    mutate, argument, error = BAD[name]
    kwargs = _good(gen)
    mutate(kwargs)
    q, k, v = kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v")
    with pytest.raises(error, match=f"^{re.escape(argument)}"):
        galerkin_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_names_argument(name, gen):
    _refused(ops.galerkin_attention, name, gen)


@pytest.mark.parametrize("name", [n for n in BAD if not n.startswith("dropout_p")])
def test_the_reference_refuses_what_the_ops_refuse(name, gen):
    """The oracle used to broadcast a batch-1 weight, a (1, P) pos or a (D, D) dropout mask, and
    to take negative weights and eps."""
    _refused(reference.galerkin_attention, name, gen)
    kwargs = _good(gen)
    fourier = {k: v for k, v in kwargs.items() if k != "v_norm"}
    for call, match in (
        (lambda: reference.galerkin_attention(**kwargs, dropout_mask=torch.ones(4, 4)),
         r"dropout_mask: expected a tensor of shape \(2, 2, 4, 4\)"),
        (lambda: reference.fourier_attention(**{**fourier, "weight": torch.ones(1, 1)}),
         "weight"),
        (lambda: reference.fourier_attention(**fourier, scale=True), "scale"),
        (lambda: reference.normalized_attention(kwargs["q"], kwargs["k"][:1], kwargs["v"]), "k"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            call()


def test_fourier_specific_errors(gen):
    x = _good(gen)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match="^path"):
        ops.fourier_attention(q, k, v, path="fast")
    with pytest.raises(ValueError, match="^path: dropout"):
        ops.fourier_attention(q, k, v, path="factored", dropout_p=0.1)
    with pytest.raises(ValueError, match="^scale"):
        ops.fourier_attention(q, k, v, scale=math.inf)
    with pytest.raises(TypeError, match="^scale"):
        ops.fourier_attention(q, k, v, scale=True)  # a bool is not a number here
    with pytest.raises(ValueError, match="^q_norm"):
        ops.fourier_attention(q, k, v, q_norm=(torch.ones(3, 2), torch.zeros(3, 2)))
    ops.fourier_attention(q, k, v, path="factored", dropout_p=0.0)  # without dropout: fine
    with pytest.raises(TypeError, match="^q: expected a tensor"):  # the fused path's checks too
        ops.fourier_attention([[1.0]], k, v, dropout_p=0.1)
    with pytest.raises(TypeError, match="^torch_masks: expected a bool"):
        ops.kernel_attention(q, k, v, path="quadratic", dropout_p=0.1, torch_masks=1)


def test_meta_tensors_give_shapes(gen):
    """Meta tensors (shape inference, e.g. for model summaries) reach the fake kernels."""
    q = torch.empty(2, 3, 5, 4, device="meta")
    pos = torch.empty(5, 2, device="meta")
    assert ops.galerkin_attention(q, q, q, pos=pos).shape == (2, 3, 5, 6)
    for path in ("factored", "quadratic"):
        out, attn = ops.kernel_attention(q, q, q, pos=pos, path=path)
        assert out.shape == (2, 3, 5, 6) and out.device.type == "meta"
        assert attn.shape == ((2, 3, 5, 5) if path == "quadratic" else (2, 3, 6, 6))


def test_autocast_casts_like_matmul(gen):
    """bf16 activations from autocast Linears meet float32 norm parameters: no dtype error."""
    x = make_inputs(Case(2, 2, 9, 4, P=1, weight="batched"), gen, dtype=torch.float32)
    bf16 = {key: x[key].bfloat16() for key in ("q", "k", "v")}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.galerkin_attention(bf16["q"], bf16["k"], bf16["v"], pos=x["pos"],
                                     weight=x["weight"], k_norm=x["n1"], v_norm=x["n2"])
    assert out.dtype == torch.float32
    expected = galerkin({**x, **{key: t.float() for key, t in bf16.items()}})
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_autocast_runs_both_paths_in_one_precision(dropout_p, gen):
    """Under CPU autocast the op computes in float32 on either path, as it returns float32:
    the quadratic path (also taken with dropout) ran its products in bfloat16 (4e-3 from the
    float64 result) while the factored path ran in float32 (2e-7)."""
    q, k, v = (torch.randn(2, 2, 33, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    exact = ops.fourier_attention(q, k, v)
    for path in ("factored", "quadratic") if dropout_p == 0.0 else ("quadratic",):
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ops.fourier_attention(q.float(), k.float(), v.float(), path=path,
                                        dropout_p=dropout_p)
        torch.manual_seed(0)
        plain = ops.fourier_attention(q.float(), k.float(), v.float(), path=path,
                                      dropout_p=dropout_p)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, plain, rtol=0, atol=0)
        if dropout_p == 0.0:
            torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-6)


def test_autocast_leaves_float64_alone(gen):
    """Autocast does not touch float64 operands (a float64 matmul under it stays float64): nor
    do the ops, which computed them in float32 and returned float32."""
    q, k, v = (torch.randn(2, 2, 7, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.rand(7, 1, generator=gen, dtype=torch.float64)
    calls = {
        "galerkin": lambda: ops.galerkin_attention(q, k, v, pos=pos),
        "fourier": lambda: ops.fourier_attention(q, k, v, pos=pos),
        "continuum": lambda: ops.continuum_attention(q, k, v),
        "normalized": lambda: ops.normalized_attention(q, k, v, pos=pos),
        "hetero": lambda: ops.hetero_normalized_attention(q, [k], [v], pos=pos, kv_pos=[pos]),
    }
    for name, call in calls.items():
        expected = call()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call()
        assert out.dtype == torch.float64, name
        torch.testing.assert_close(out, expected, rtol=0, atol=0, msg=name)


def test_autocast_of_the_normalized_ops_like_the_others(gen):
    """GNOT's ops under autocast: bf16 activations meet float32 coordinates and weights, as in
    galerkin_attention (they used to refuse pos as 'expected dtype torch.bfloat16 like q')."""
    q, k, v = (torch.randn(2, 3, 6, 4, generator=gen) for _ in range(3))
    pos, weight = torch.rand(2, 6, 1, generator=gen), torch.rand(2, 6, generator=gen)
    bf16 = [t.bfloat16() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        single = ops.normalized_attention(*bf16, pos=pos, weight=weight, skip=True)
        hetero = ops.hetero_normalized_attention(bf16[0], [bf16[1]], [bf16[2]], pos=pos,
                                                 kv_pos=[pos], weights=[weight])
    exact = [t.float() for t in bf16]
    assert single.dtype == hetero.dtype == torch.float32
    torch.testing.assert_close(
        single, ops.normalized_attention(*exact, pos=pos, weight=weight, skip=True))
    torch.testing.assert_close(
        hetero, ops.hetero_normalized_attention(exact[0], [exact[1]], [exact[2]], pos=pos,
                                                kv_pos=[pos], weights=[weight]))


@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1e20, 1e36])
def test_layer_norm_across_the_float32_range(magnitude, gen):
    """float32 rows of any magnitude are normalised right (the squares of 1e20 overflow float32:
    the variance must not be formed from them); a constant row gives the bias."""
    q = torch.randn(2, 2, 7, 5, generator=gen)
    k, v = magnitude * torch.randn(2, 2, 7, 5, generator=gen), torch.randn(2, 2, 7, 5,
                                                                          generator=gen)
    k[0, 0, 3] = magnitude  # a constant row
    norm = (1 + 0.1 * torch.randn(2, 5, generator=gen), 0.1 * torch.randn(2, 5, generator=gen))
    for path in ("factored", "quadratic"):
        out = ops.fourier_attention(q, k, v, q_norm=norm, k_norm=norm, path=path)
        ref = reference.fourier_attention(q.double(), k.double(), v.double(),
                                          q_norm=tuple(p.double() for p in norm),
                                          k_norm=tuple(p.double() for p in norm))
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    out = ops.galerkin_attention(q, k, v, k_norm=norm, v_norm=norm)
    ref = reference.galerkin_attention(q.double(), k.double(), v.double(),
                                       k_norm=tuple(p.double() for p in norm),
                                       v_norm=tuple(p.double() for p in norm))
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    # non-finite input stays non-finite, as in torch's layer norm
    k[1, 1, 2, 0] = math.inf
    assert not torch.isfinite(ops.galerkin_attention(q, k, v, k_norm=norm)[1, 1]).all()


@pytest.mark.parametrize("dim", [5, 19, 40])
def test_one_huge_entry_anywhere_in_a_row_is_normalised_right(dim, gen):
    """The float32 layer norm scales a row by its largest magnitude before squaring: found
    wherever it sits, past the last whole vector and at the row's end included (a row whose
    only 3e19 was missed had its squares overflow, and normalised to the bias)."""
    norm = (1 + 0.1 * torch.randn(2, dim, generator=gen), 0.1 * torch.randn(2, dim, generator=gen))
    norm64 = tuple(p.double() for p in norm)
    for place in range(dim):
        q, k, v = (torch.randn(1, 2, 3, dim, generator=gen) for _ in range(3))
        k[0, 1, 2, place] = 3e19
        out = ops.galerkin_attention(q, k, v, k_norm=norm)
        ref = reference.galerkin_attention(q.double(), k.double(), v.double(), k_norm=norm64)
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dim", [3, 33, 100])
def test_constant_rows_of_any_width_and_size_give_the_bias(dim, gen):
    """Every constant float32 row normalises to exactly β. D copies of c do not sum exactly
    unless D is a power of two: the first pass's mean was an ulp off, every centred value that
    ulp, and the row normalised to up to ±0.93 (D = 33, c in 1e3 … 2e5) instead of β; the
    second pass now corrects the mean. Read off S = LN(k)ᵀ·w·v with one key, w = v = 1."""
    constants = torch.cat([torch.linspace(1e3, 2e5, 400), torch.linspace(-7.5, 3.3, 100),
                           1e30 * torch.rand(50, generator=gen), torch.tensor([0.0, 1e-30])])
    k = constants[:, None, None, None].expand(-1, 1, 1, dim)
    beta = torch.randn(1, dim, generator=gen)
    s = ops.kv_reduce(k, torch.ones(len(constants), 1, 1, 1), kv_pos=None, weight=torch.ones(1),
                      k_map="layer_norm", k_norm=(torch.rand(1, dim, generator=gen) + 0.5, beta),
                      v_map="identity", v_norm=None, eps=1e-5, ones_column=False)
    assert torch.equal(s[:, 0, :, 0], beta.expand(len(constants), dim))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quadratic_path_accumulates_in_float32(dtype, gen):
    """Half-precision activations: the N×M matrix and its products are formed in float32 (on
    CUDA, ATen's default flags would let cuBLAS reduce half products in half), so A matches the
    float64 formula on the same (rounded) inputs to float32 accuracy, far below half's 2⁻⁸."""
    x = make_inputs(Case(2, 2, 37, 8, P=1, weight="batched"), gen, dtype=torch.float32)
    low = {key: x[key].to(dtype) for key in ("q", "k", "v", "pos")}
    out, attn = ops.kernel_attention(low["q"], low["k"], low["v"], pos=low["pos"],
                                     weight=x["weight"], q_norm=x["n1"], k_norm=x["n2"],
                                     path="quadratic")
    assert out.dtype == dtype and attn.dtype == torch.float32
    exact = {key: t.double() for key, t in low.items()}
    n1, n2 = (tuple(p.double() for p in x[key]) for key in ("n1", "n2"))
    q_hat = reference.concat_pos(reference.per_head_layer_norm(exact["q"], n1, 1e-5),
                                 exact["pos"])
    k_hat = reference.concat_pos(reference.per_head_layer_norm(exact["k"], n2, 1e-5),
                                 exact["pos"])
    want_attn = (q_hat @ k_hat.transpose(-2, -1) * x["weight"].double()[:, None, None, :]
                 / math.sqrt(q_hat.shape[-1]))
    torch.testing.assert_close(attn.double(), want_attn, rtol=1e-5, atol=1e-6)
    want_out = want_attn @ reference.concat_pos(exact["v"], exact["pos"])
    torch.testing.assert_close(out.double(), want_out, rtol=1e-2, atol=1e-2)  # out is rounded


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_layer_norm_gradients_at_small_variance(dtype, gen):
    """Rows of variance ~1e-4 (the models' initialisation): rsqrt's derivative there,
    ~0.5 (var + eps)^-1.5 ~ 1e6, overflowed float16 when the norm ran in half (finite output,
    NaN gradients of k and v); the statistics run in float32, as in F.layer_norm."""
    x = make_inputs(Case(1, 2, 16, 8), gen, dtype=torch.float32)
    small = {key: (1e-2 * x[key]).to(dtype).requires_grad_() for key in ("q", "k", "v")}
    exact = {key: t.detach().double().requires_grad_() for key, t in small.items()}
    norms = {"k_norm": x["n1"], "v_norm": x["n2"]}
    out = ops.galerkin_attention(*small.values(), **norms)
    want = ops.galerkin_attention(*exact.values(), **{
        key: tuple(p.double() for p in value) for key, value in norms.items()})
    torch.autograd.backward(out.float(), torch.ones_like(out, dtype=torch.float32))
    want.sum().backward()
    for key in ("q", "k", "v"):
        grad, expected = small[key].grad.double(), exact[key].grad
        assert bool(torch.isfinite(grad).all()), key
        assert float((grad - expected).norm() / expected.norm()) < 5e-2, key


@pytest.mark.parametrize("path", ["factored", "quadratic"])
def test_float32_parameters_beside_half_activations(path, gen):
    """Quadrature weights and norm parameters may stay float32 beside bfloat16 activations (as
    autocast leaves them on CUDA); other mixes are errors naming the argument."""
    x = make_inputs(Case(2, 2, 9, 4, P=1, weight="batched"), gen, dtype=torch.float32)
    low = {key: x[key].bfloat16() for key in ("q", "k", "v", "pos")}
    out = ops.fourier_attention(low["q"], low["k"], low["v"], pos=low["pos"], weight=x["weight"],
                                q_norm=x["n1"], k_norm=x["n2"], path=path)
    assert out.dtype == torch.bfloat16
    expected = fourier({**x, **{key: t.float() for key, t in low.items()}}, path=path)
    torch.testing.assert_close(out.float(), expected, rtol=3e-2, atol=3e-2)
    with pytest.raises(TypeError, match="^weight"):
        ops.fourier_attention(x["q"], x["k"], x["v"], pos=x["pos"], weight=x["weight"].double())
    with pytest.raises(TypeError, match=r"^k_norm\[0\]"):
        ops.fourier_attention(low["q"], low["k"], low["v"], pos=low["pos"],
                              k_norm=tuple(p.double() for p in x["n2"]))
