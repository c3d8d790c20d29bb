"""The op core, torch.ops.galerkin_ext.kv_reduce and q_apply (csrc/attention/core.h), and the
attention functions composed from it on the CPU, against explicit float64 sums written here:
every row map, coordinates shared or per sample, weights, the normaliser's column, M != N,
M = 1, N = 1, sizes off the chunk sizes, non-contiguous inputs; gradcheck of every
differentiable input, opcheck, torch.compile, bitwise repeatability, padding invariance."""

import math

import pytest
import torch
from attention_cases import F64, rand

from galerkin_ext import functional, ops


def explicit_row(x, pos, kind, norm, eps=1e-5):
    """One prepared row per (b, h, n), by loops: [pos | x], [pos | LN(x)] or softmax([pos | x])."""
    b_, h_, n_, d_ = x.shape
    p_ = 0 if pos is None else pos.shape[-1]
    out = torch.empty(b_, h_, n_, p_ + d_, dtype=F64)
    for b in range(b_):
        for h in range(h_):
            for n in range(n_):
                row = x[b, h, n].double()
                coords = (torch.zeros(0, dtype=F64) if pos is None
                          else (pos[b, n] if pos.dim() == 3 else pos[n]).double())
                if kind == "softmax":
                    z = torch.cat([coords, row])
                    e = torch.exp(z - z.max())
                    out[b, h, n] = e / e.sum()
                    continue
                if kind == "layer_norm":
                    mean = row.sum() / d_
                    var = ((row - mean) ** 2).sum() / d_
                    row = (row - mean) / torch.sqrt(var + eps) * norm[0][h].double() + norm[1][h]
                out[b, h, n] = torch.cat([coords, row])
    return out


def explicit_s(k, v, kv_pos, weight, k_map, k_norm, v_map, v_norm, ones_column):
    """S[b, h] = Σ_j w_j k̂_j v̂_jᵀ as a sum of outer products over the keys."""
    kh = explicit_row(k, kv_pos, k_map, k_norm)
    vh = explicit_row(v, kv_pos, v_map, v_norm)
    if ones_column:
        vh = torch.cat([vh, torch.ones(*vh.shape[:3], 1, dtype=F64)], dim=-1)
    b_, h_, m_, _ = k.shape
    s = torch.zeros(b_, h_, kh.shape[-1], vh.shape[-1], dtype=F64)
    for b in range(b_):
        for j in range(m_):
            w = 1.0 / m_ if weight is None else float(weight[b, j] if weight.dim() == 2
                                                      else weight[j])
            for h in range(h_):
                s[b, h] += w * torch.outer(kh[b, h, j], vh[b, h, j])
    return s


def quotient_blocks(width, normalizers):
    """The column slices (numerator, its normaliser) of each of the ``normalizers`` blocks of
    Q̂ S, ``width`` columns in all."""
    block = width // normalizers
    return [(slice(lo, lo + block - 1), slice(lo + block - 1, lo + block))
            for lo in range(0, width, block)]


def explicit_apply(q, pos, q_map, q_norm, s, normalizers, skip=False):
    """Q̂ S, or Σ_l (Q̂ S_l) / (Q̂ s_l) with 0/0 := 0, row by row; plus Q̂ with skip."""
    q_hat = explicit_row(q, pos, q_map, q_norm)
    y = q_hat @ s.double()
    if normalizers > 0:
        out = 0.0
        for num, den in quotient_blocks(y.shape[-1], normalizers):
            d = y[..., den]
            out = out + torch.where(d != 0, y[..., num] / torch.where(d != 0, d, 1.0), 0.0)
        y = out
    return y + q_hat if skip else y


def apply_rounding_scale(q, pos, q_map, q_norm, s, normalizers):
    """How far rounding may move each entry of explicit_apply's result, in units of the
    rounding: |Q̂| |S| without normalisers; with them, each quotient num / den adds
    (|Q̂||S|_num + |num / den| |Q̂||S|_den) / |den|. A denominator near 0, which random
    layer-normed rows give now and then, magnifies it."""
    q_hat = explicit_row(q, pos, q_map, q_norm)
    y, y_abs = q_hat @ s.double(), q_hat.abs() @ s.double().abs()
    if normalizers == 0:
        return y_abs
    scale = 0.0
    for num, den in quotient_blocks(y.shape[-1], normalizers):
        d = y[..., den]
        safe = torch.where(d != 0, d.abs(), 1.0)
        scale = scale + torch.where(
            d != 0, (y_abs[..., num] + (y[..., num] / safe).abs() * y_abs[..., den]) / safe, 0.0)
    return scale


def norm_pair(heads, dim, gen, dtype=F64):
    return 1 + 0.2 * rand(heads, dim, gen=gen, dtype=dtype), 0.1 * rand(heads, dim, gen=gen,
                                                                          dtype=dtype)


# (B, H, N, M, D_k, D_v, P, pos layout, weight layout, non-contiguous)
SHAPES = [
    (1, 1, 1, 1, 1, 1, 0, None, None, False),
    (2, 3, 5, 1, 4, 2, 1, "batched", "batched", True),
    (2, 2, 1, 9, 3, 5, 2, "shared", "shared", False),
    (3, 2, 37, 29, 5, 4, 2, "batched", "batched", True),
    (1, 2, 300, 211, 7, 6, 1, "shared", None, True),  # several chunks, off the chunk size
    # The CPU products' column blocks (widths of several vectors, uneven, a partial last
    # vector) and their 64-row blocks; P = 0 with identity maps is the direct path (matmuls).
    (2, 2, 200, 70, 24, 40, 0, None, None, False),
    (1, 3, 131, 67, 17, 33, 1, "batched", None, True),
    (2, 3, 130, 41, 9, 9, 2, "batched", "batched", True),  # D_k = D_v: the skip term too
]
MAPS = [("identity", "identity"), ("layer_norm", "layer_norm"), ("softmax", "identity"),
        ("layer_norm", "identity")]


def core_inputs(shape, maps, gen, dtype=F64):
    b, h, n, m, dk, dv, p, pos_kind, weight_kind, strided = shape
    k_map, v_map = maps

    def operand(rows, dim):
        if strided:  # a (B, N, H, D) projection viewed per head
            return rand(b, rows, h, dim, gen=gen, dtype=dtype).transpose(1, 2)
        return rand(b, h, rows, dim, gen=gen, dtype=dtype)

    def coords(rows):
        if pos_kind is None:
            return None
        return rand(*((b,) if pos_kind == "batched" else ()), rows, p, gen=gen, dtype=dtype)

    weight = None
    if weight_kind is not None:
        weight = torch.rand(*((b,) if weight_kind == "batched" else ()), m, generator=gen,
                            dtype=dtype)
        if m:
            weight[..., 0] = 0.0  # a masked key
    return dict(
        q=operand(n, dk), k=operand(m, dk), v=operand(m, dv), pos=coords(n), kv_pos=coords(m),
        weight=weight, k_map=k_map, v_map=v_map,
        k_norm=norm_pair(h, dk, gen, dtype) if k_map == "layer_norm" else None,
        v_norm=norm_pair(h, dv, gen, dtype) if v_map == "layer_norm" else None,
        q_norm=norm_pair(h, dk, gen, dtype) if k_map == "layer_norm" else None)


def reduce_args(x, ones_column):
    k_norm, v_norm = x["k_norm"] or (None, None), x["v_norm"] or (None, None)
    return (x["k"], x["v"], x["kv_pos"], x["weight"], x["k_map"], *k_norm, x["v_map"], *v_norm,
            1e-5, ones_column)


def apply_args(x, s, normalizers, skip=False):
    q_norm = x["q_norm"] or (None, None)
    return (x["q"], x["pos"], x["k_map"], *q_norm, s, 1e-5, normalizers, skip)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("maps", MAPS, ids=str)
def test_kv_reduce_and_q_apply_match_explicit_sums(shape, maps, gen):
    x = core_inputs(shape, maps, gen)
    for ones_column in (False, True):
        s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, ones_column))
        expected = explicit_s(x["k"], x["v"], x["kv_pos"], x["weight"], x["k_map"], x["k_norm"],
                              x["v_map"], x["v_norm"], ones_column)
        assert s.dtype == F64
        torch.testing.assert_close(s, expected, rtol=1e-12, atol=1e-12)
        normalizers = int(ones_column)
        # (to the rounding scale of each entry: a quotient's denominator may be near 0)
        scale = apply_rounding_scale(x["q"], x["pos"], x["k_map"], x["q_norm"], s, normalizers)
        for skip in (False, True) if x["q"].shape[3] == x["v"].shape[3] else (False,):
            out = torch.ops.galerkin_ext.q_apply(*apply_args(x, s, normalizers, skip))
            error = (out - explicit_apply(x["q"], x["pos"], x["k_map"], x["q_norm"], s,
                                          normalizers, skip)).abs()
            assert bool((error <= 1e-13 * (scale + 1)).all()), float((error / (scale + 1)).max())


def softmax_rows_across_the_range(dtype, gen):
    """(2, 2, 7, 21) rows on which a softmax's max must be found right (a wrong one overflows
    exp(z - max) or loses every term): all large positive, all large negative, wide mixed
    signs, constant, signed zeros, some -inf entries, near float32's exp range."""
    rows = 30 * rand(2, 2, 7, 21, gen=gen)
    rows[:, :, 0] += 1e4
    rows[:, :, 1] = 300 * rows[:, :, 1] - 1e5  # all negative, spread past float64's exp range
    rows[:, :, 2] *= 30  # σ 900, both signs
    rows[:, :, 3] = -5.0
    rows[:, :, 4] = 0.0
    rows[:, :, 4, ::2] = -0.0
    rows[:, :, 5, 3::5] = float("-inf")
    rows[:, :, 6] -= 80
    return rows.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_softmax_rows_across_the_range(dtype, gen):
    k = softmax_rows_across_the_range(dtype, gen)
    v = rand(2, 2, 7, 5, gen=gen, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    s = torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "softmax", None, None, "identity",
                                         None, None, 0.0, True)
    expected = explicit_s(k, v, None, None, "softmax", None, "identity", None, True)
    torch.testing.assert_close(s.double(), expected, **tol)
    out = torch.ops.galerkin_ext.q_apply(k, None, "softmax", None, None, s, 0.0, 1, False)
    torch.testing.assert_close(out.double(),
                               explicit_apply(k, None, "softmax", None, s, 1), **tol)
    # A NaN of either sign makes its row, and so its (b, h) block of S, NaN; nothing else.
    for nan in (float("nan"), -float("nan")):
        k_nan = k.clone()
        k_nan[1, 0, 2, 7] = nan
        s_nan = torch.ops.galerkin_ext.kv_reduce(k_nan, v, None, None, "softmax", None, None,
                                                 "identity", None, None, 0.0, True)
        assert s_nan[1, 0].isnan().all()
        s_nan[1, 0] = s[1, 0]
        torch.testing.assert_close(s_nan, s, rtol=0, atol=0)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.float64, 4e-15)])
def test_softmax_rows_are_accurate_element_by_element(gen, dtype, tolerance):
    """Each softmax entry within a few ulps of torch's float64 softmax, at logits of size O(1)
    (the exp's polynomial truncates below half an ulp; a degree too low read 3e-6 in float32,
    3e-13 in float64 against 8.5e-16): the rows through q_apply against an identity S, which
    hands them back one by one."""
    q = rand(2, 2, 300, 64, gen=gen, dtype=dtype)
    s = torch.eye(64, dtype=dtype).expand(2, 2, 64, 64).contiguous()
    rows = torch.ops.galerkin_ext.q_apply(q, None, "softmax", None, None, s, 0.0, 0, False)
    expected = torch.softmax(q.double(), dim=-1)
    assert ((rows.double() - expected).abs() / expected).max() < tolerance


def test_several_normalizers_and_a_block_without_keys(gen):
    x = core_inputs((2, 2, 6, 5, 3, 4, 1, "batched", "batched", False), ("softmax", "identity"),
                    gen)
    s1 = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, True))
    x["weight"][1] = 0.0  # sample 1 has no keys in the second block
    s2 = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, True))
    s = torch.cat([s1, s2], dim=-1)
    out = torch.ops.galerkin_ext.q_apply(*apply_args(x, s, 2))
    torch.testing.assert_close(out, explicit_apply(x["q"], x["pos"], "softmax", None, s, 2),
                               rtol=1e-12, atol=1e-12)
    alone = torch.ops.galerkin_ext.q_apply(*apply_args(x, s1, 1))
    torch.testing.assert_close(out[1], alone[1], rtol=1e-12, atol=1e-12)


def test_a_block_without_keys_passes_no_gradient(gen):
    """A sample whose weights are all 0 has S = 0, a normaliser δ = 0 and the output 0: every
    gradient through it is 0, after blocks with keys too (the backward's scratch of the block
    before stayed behind: weight gradients of 20 where the formulas give 0)."""
    q, grad_out = rand(2, 2, 4, 3, gen=gen), rand(2, 2, 4, 3, gen=gen)
    s = rand(2, 2, 3, 4, gen=gen)
    s[1] = 0.0
    grad_q, _, _, _, grad_s = torch.ops.galerkin_ext.q_apply_backward(
        grad_out, q, None, "softmax", None, None, s, 1e-5, 1, False, False)
    assert not grad_q[1].any() and not grad_s[1].any()
    assert grad_q[0].abs().min() > 0 and grad_s[0].abs().min() > 0
    k, v = rand(2, 2, 4, 3, gen=gen), rand(2, 2, 4, 3, gen=gen)
    weight = rand(2, 4, gen=gen).abs() + 0.1
    weight[1] = 0.0
    grads = []
    for impl in (ops, functional):
        leaf = weight.clone().requires_grad_()
        s = impl.kv_reduce(k, v, kv_pos=None, weight=leaf, k_map="softmax", k_norm=None,
                           v_map="identity", v_norm=None, eps=1e-5, ones_column=True)
        out = impl.q_apply(q, s, pos=None, q_map="softmax", q_norm=None, eps=1e-5,
                           normalizers=1)
        grads.append(torch.autograd.grad(out.square().sum(), leaf)[0])
    assert not grads[0][1].any()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


GRAD_NAMES = ("q", "k", "v", "pos", "kv_pos", "weight")
NORMS = ("q_norm", "k_norm", "v_norm")


def core_leaves(x):
    """Fresh leaves of the differentiable inputs of core_inputs x: the tensors present, then
    the norm parameters."""
    return ([x[n].detach().requires_grad_() for n in GRAD_NAMES if x[n] is not None]
            + [p.detach().requires_grad_() for key in NORMS for p in (x[key] or ())])


def core_fn(x, ones_column, skip=False):
    """kv_reduce then q_apply on x, as a function of the leaves of core_leaves(x)."""
    def f(*leaves):
        it = iter(leaves)
        y = dict(x)
        for n in GRAD_NAMES:
            if x[n] is not None:
                y[n] = next(it)
        for key in NORMS:
            if x[key] is not None:
                y[key] = (next(it), next(it))
        s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(y, ones_column))
        return torch.ops.galerkin_ext.q_apply(*apply_args(y, s, int(ones_column), skip))
    return f


@pytest.mark.parametrize("maps", MAPS, ids=str)
def test_gradcheck_every_input(maps, gen):
    x = core_inputs((2, 2, 4, 3, 3, 2, 1, "batched", "batched", True), maps, gen)
    x["weight"] = x["weight"] + 0.1
    f, leaves = core_fn(x, maps[0] == "softmax"), core_leaves(x)
    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)
    x = core_inputs((2, 2, 4, 3, 3, 3, 1, "batched", "batched", True), maps, gen)
    x["weight"] = x["weight"] + 0.1
    assert torch.autograd.gradcheck(core_fn(x, maps[0] == "softmax", skip=True),
                                    core_leaves(x))


def test_constant_rows_under_layer_norm_have_the_formulas_gradients(gen):
    """A constant row (variance exactly 0, D >= 2) normalises to β; its gradient is rstd = 1/√eps
    times the centred γ·dy, not 0: gradcheck, and autograd through the explicit formula."""
    x = core_inputs((2, 2, 5, 4, 3, 3, 1, "batched", "batched", False),
                    ("layer_norm", "layer_norm"), gen)
    x["weight"] = x["weight"] + 0.1
    x["q"][:, :, 1] = 0.5
    x["k"][:, :, 2] = -1.25
    x["k"][0, 1, 0] = 0.0
    x["v"][1, 0, 3] = 2.0
    leaves = core_leaves(x)
    f = core_fn(x, False)
    assert torch.autograd.gradcheck(f, leaves)
    grad = rand(*f(*leaves).shape, gen=gen)
    got = torch.autograd.grad(f(*leaves), leaves[:3], grad)
    q, k, v = (t.detach().requires_grad_() for t in leaves[:3])
    s = explicit_s(k, v, x["kv_pos"], x["weight"], "layer_norm", x["k_norm"], "layer_norm",
                   x["v_norm"], False)
    expected = torch.autograd.grad(explicit_apply(q, x["pos"], "layer_norm", x["q_norm"], s, 0),
                                   (q, k, v), grad)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert got[0][:, :, 1].abs().max() > 1.0  # (the constant rows' gradients are not 0)


@pytest.mark.parametrize("wanted, pos_kind", [
    (("v",), None), (("weight", "k_norm"), None), (("kv_pos", "v_norm"), "batched"),
    (("pos", "q_norm"), "shared"), (("q", "weight"), "shared")], ids=str)
def test_gradients_of_some_inputs_first_and_second_order(wanted, pos_kind, gen):
    """Gradients of only some inputs, first and second order, equal the formulas': autograd
    numbers only the tensors given (an absent kv_pos must not shift the weight's place), and a
    second order runs the formula backwards."""
    x = core_inputs((2, 2, 7, 5, 3, 3, 2, pos_kind, "batched", True),
                    ("layer_norm", "layer_norm"), gen)
    leaves = []
    for name in wanted:
        x[name] = (tuple(p.detach().requires_grad_() for p in x[name]) if name.endswith("norm")
                   else x[name].detach().requires_grad_())
        leaves += list(x[name]) if name.endswith("norm") else [x[name]]

    def compiled():
        s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, False))
        return torch.ops.galerkin_ext.q_apply(*apply_args(x, s, 0))

    def formula():
        s = functional.kv_reduce(x["k"], x["v"], kv_pos=x["kv_pos"], weight=x["weight"],
                                 k_map="layer_norm", k_norm=x["k_norm"], v_map="layer_norm",
                                 v_norm=x["v_norm"], eps=1e-5, ones_column=False)
        return functional.q_apply(x["q"], s, pos=x["pos"], q_map="layer_norm",
                                  q_norm=x["q_norm"], eps=1e-5, normalizers=0)

    def first_and_second(fn):
        first = torch.autograd.grad(fn().square().sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum(g.square().sum() for g in first), leaves)
        return [*first, *second]

    for ours, expected in zip(first_and_second(compiled), first_and_second(formula), strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("maps", [("layer_norm", "layer_norm"), ("softmax", "identity"),
                                  ("identity", "identity")], ids=str)
def test_opcheck(maps, gen):
    x = core_inputs((2, 2, 5, 3, 3, 3, 1, "shared", "batched", True), maps, gen,
                    dtype=torch.float32)
    if maps == ("identity", "identity"):  # no coordinates: q_apply's direct products
        x = {**x, "pos": None, "kv_pos": None}
    run_opchecks(x, maps[0] == "softmax")


def run_opchecks(x, ones_column):
    """opcheck of the four ops of the core on core_inputs x (any device; D_k = D_v, so that
    q_apply runs with and without its skip term)."""
    args = reduce_args(x, ones_column)
    torch.library.opcheck(torch.ops.galerkin_ext.kv_reduce, args)
    s = torch.ops.galerkin_ext.kv_reduce(*args)
    torch.library.opcheck(torch.ops.galerkin_ext.kv_reduce_backward,
                          (torch.randn_like(s), *args[:-1], ones_column, x["kv_pos"] is not None,
                           x["weight"] is not None))
    for skip in (False, True):
        apply = apply_args(x, s, int(ones_column), skip)
        torch.library.opcheck(torch.ops.galerkin_ext.q_apply, apply)
        out = torch.ops.galerkin_ext.q_apply(*apply)
        torch.library.opcheck(torch.ops.galerkin_ext.q_apply_backward,
                              (torch.randn_like(out), *apply, x["pos"] is not None))


@pytest.mark.parametrize("maps", [("layer_norm", "layer_norm"), ("softmax", "identity")],
                         ids=str)
@pytest.mark.parametrize(("n", "m"), [(4, 0), (0, 3), (0, 0)])
def test_no_points(n, m, maps, gen):
    """No keys (M = 0: S is a sum over nothing, zeros) or no queries (N = 0: an empty output),
    as a padded batch or a shard of a split domain has; each crashed the interpreter (an
    integer division by zero in the CPU twins' chunking) before core.cpp answered them."""
    x = core_inputs((2, 2, n, m, 3, 3, 1, "batched", "batched", True), maps, gen)
    ones_column = maps[0] == "softmax"
    leaves = {name: x[name].requires_grad_() for name in ("q", "k", "v", "pos", "kv_pos",
                                                          "weight")}
    norms = [t.requires_grad_() for t in (*(x["k_norm"] or ()), *(x["q_norm"] or ()))]
    for fn in (ops, functional):  # the compiled op and the formula
        s = fn.kv_reduce(x["k"], x["v"], kv_pos=x["kv_pos"], weight=x["weight"],
                         k_map=x["k_map"], k_norm=x["k_norm"], v_map=x["v_map"],
                         v_norm=x["v_norm"], eps=1e-5, ones_column=ones_column)
        torch.testing.assert_close(s, explicit_s(x["k"], x["v"], x["kv_pos"],
                                                 x["weight"].detach(),
                                                 x["k_map"], x["k_norm"], x["v_map"],
                                                 x["v_norm"], ones_column))
        out = fn.q_apply(x["q"], s, pos=x["pos"], q_map=x["k_map"], q_norm=x["q_norm"],
                         eps=1e-5, normalizers=int(ones_column))
        assert out.shape == (2, 2, n, 3 + 1)
        grads = torch.autograd.grad(s.square().sum() + out.sum(), [*leaves.values(), *norms])
        for (name, leaf), grad in zip(leaves.items(), grads, strict=False):
            assert grad.shape == leaf.shape, name
        if m == 0:  # nothing reached S: every key-side gradient is zero
            assert all(not g.any() for g in grads[1:])
    x = {**x, **{name: t.detach() for name, t in leaves.items()}}
    s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, ones_column))
    torch.library.opcheck(torch.ops.galerkin_ext.kv_reduce, reduce_args(x, ones_column))
    torch.library.opcheck(torch.ops.galerkin_ext.q_apply, apply_args(x, s, int(ones_column)))


def test_the_core_ops_refuse_an_eps_that_is_not_finite_and_positive(gen):
    """Called directly (the Python functions check eps first): a NaN or negative eps gave
    NaN rows, an infinite one zero rows, and no error. (Maps without a layer norm take none.)"""
    x = core_inputs((1, 2, 5, 6, 3, 3, 1, "batched", "batched", False),
                    ("layer_norm", "layer_norm"), gen)
    s = torch.ops.galerkin_ext.kv_reduce(*reduce_args(x, False))
    q_norm = x["q_norm"] or (None, None)
    for eps in (math.nan, -1.0, 0.0, math.inf):
        reduce = (*reduce_args(x, False)[:10], eps, False)
        apply = (x["q"], x["pos"], x["k_map"], *q_norm, s, eps, 0, False)
        core = torch.ops.galerkin_ext
        calls = [(core.kv_reduce, reduce),
                 (core.kv_reduce_backward, (torch.ones_like(s), *reduce, False, False)),
                 (core.q_apply, apply),
                 (core.q_apply_backward, (torch.ones(1, 2, 5, 4, dtype=F64), *apply, False))]
        for op, args in calls:
            with pytest.raises(RuntimeError, match=r"eps: expected a finite float > 0 for "
                                                   r"layer_norm"):
                op(*args)


@pytest.mark.parametrize("direct", [False, True], ids=["chunked", "direct"])
def test_repeatable_bit_for_bit(direct, gen):
    """Two runs, the same bits: the chunked products, and the direct ones (identity maps
    without coordinates or weights: ATen's matmuls)."""
    maps = ("identity", "identity") if direct else ("layer_norm", "layer_norm")
    x = core_inputs((2, 4, 3000, 2500, 13, 13, 0 if direct else 2, None if direct else "batched",
                     None if direct else "batched", True), maps, gen, dtype=torch.float32)
    names = ("q", "k", "v") if direct else ("q", "k", "v", "pos", "weight")
    leaves = [x[n].requires_grad_() for n in names]

    def run():
        out = ops.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"], kv_pos=x["kv_pos"],
                                     weight=x["weight"], k_norm=x["k_norm"],
                                     v_norm=x["v_norm"])
        return [out, *torch.autograd.grad(out.square().sum(), leaves)]

    for a, b in zip(run(), run(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("width", [1, 8, 16])
def test_a_query_width_of_one(width, gen):
    """D = 1 without coordinates: S's transpose is 'contiguous' with any stride on its size-1
    axis, which the products' stride check refused in the backward (an internal assert)."""
    q, k = (torch.randn(2, 1, 5, 1, generator=gen, dtype=F64).requires_grad_()
            for _ in range(2))
    v = torch.randn(2, 1, 5, width, generator=gen, dtype=F64).requires_grad_()
    out = ops.galerkin_attention(q, k, v)
    torch.testing.assert_close(out, q @ (k.transpose(-1, -2) @ v) / 5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad((q @ (k.transpose(-1, -2) @ v) / 5).square().sum(), (q, k, v))
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b)


_VECTOR_WIDTH_SCRIPT = """
import sys, torch
from galerkin_ext import ops
gen = torch.Generator().manual_seed(0)
results = []
for d, n in ((3, 1), (8, 37), (17, 300), (32, 129), (97, 70)):  # products 4 .. 98 wide
    q, k, v = (torch.randn(2, 2, n, d, generator=gen).requires_grad_() for _ in range(3))
    pos = torch.rand(2, n, 1, generator=gen)
    for attention in (ops.galerkin_attention, ops.fourier_attention):
        out = attention(q, k, v, pos=pos, kv_pos=pos)
        results += [out, *torch.autograd.grad(out.square().sum(), (q, k, v))]
torch.save(results, sys.argv[1])
"""


def test_cpu_products_give_the_same_bits_at_either_vector_width(tmp_path):
    """AVX-512 machines run the products with 64-byte vectors, others (or under
    ATEN_CPU_CAPABILITY=avx2) with 32-byte ones: each output the same sum in the same order,
    so the same bits, forward and backward (on a machine without AVX-512 both runs take the
    32-byte path)."""
    import os
    import subprocess
    import sys

    runs = {}
    for capability in (None, "avx2"):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        path = tmp_path / f"{capability}.pt"
        proc = subprocess.run([sys.executable, "-c", _VECTOR_WIDTH_SCRIPT, str(path)],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**env, "OMP_NUM_THREADS": "1"})  # (cwd: not the sources)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[capability] = torch.load(path, weights_only=True)
    for a, b in zip(runs[None], runs["avx2"], strict=True):
        assert torch.equal(a, b)


def test_galerkin_and_fourier_cross_attention_match_the_pairwise_sum(gen):
    x = core_inputs((2, 3, 23, 17, 5, 5, 2, "batched", "batched", True),
                    ("layer_norm", "layer_norm"), gen)
    q_hat = explicit_row(x["q"], x["pos"], "identity", None)
    k_hat = explicit_row(x["k"], x["kv_pos"], "layer_norm", x["k_norm"])
    v_hat = explicit_row(x["v"], x["kv_pos"], "layer_norm", x["v_norm"])
    w = x["weight"]
    expected = torch.einsum("bhnd,bhmd,bm,bhme->bhne", q_hat, k_hat, w, v_hat)
    out = ops.galerkin_attention(x["q"], x["k"], x["v"], pos=x["pos"], kv_pos=x["kv_pos"],
                                 weight=w, k_norm=x["k_norm"], v_norm=x["v_norm"])
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for path in ("factored", "quadratic"):
        out = ops.fourier_attention(x["q"], x["k"], x["v"], pos=x["pos"], kv_pos=x["kv_pos"],
                                    weight=w, q_norm=x["q_norm"], k_norm=x["k_norm"],
                                    path=path, scale=0.3)
        q_ln = explicit_row(x["q"], x["pos"], "layer_norm", x["q_norm"])
        v_plain = explicit_row(x["v"], x["kv_pos"], "identity", None)
        expected = 0.3 * torch.einsum("bhnd,bhmd,bm,bhme->bhne", q_ln, k_hat, w, v_plain)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", ["galerkin", "fourier", "normalized"])
def test_padding_keys_and_batch_mates_change_nothing(fn, gen):
    """Extra keys of weight 0 change no output (float64, 1e-12); a sample alone = in a batch."""
    b, h, n, m, d, p = 3, 2, 11, 7, 4, 2
    q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
    pos, kv_pos = rand(b, n, p, gen=gen), rand(b, m, p, gen=gen)
    w = torch.rand(b, m, generator=gen, dtype=F64) + 0.1
    norm = norm_pair(h, d, gen)

    def call(q, k, v, pos, kv_pos, w):
        if fn == "galerkin":
            return ops.galerkin_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w,
                                          k_norm=norm, v_norm=norm)
        if fn == "fourier":
            return ops.fourier_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w,
                                         q_norm=norm, k_norm=norm)
        return ops.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w, skip=True)

    out = call(q, k, v, pos, kv_pos, w)
    pad = 5
    padded = call(q, torch.cat([k, rand(b, h, pad, d, gen=gen)], 2),
                  torch.cat([v, rand(b, h, pad, d, gen=gen)], 2), pos,
                  torch.cat([kv_pos, rand(b, pad, p, gen=gen)], 1),
                  torch.cat([w, torch.zeros(b, pad, dtype=F64)], 1))
    torch.testing.assert_close(padded, out, rtol=1e-12, atol=1e-12)
    for i in range(b):
        s = slice(i, i + 1)
        torch.testing.assert_close(call(q[s], k[s], v[s], pos[s], kv_pos[s], w[s]), out[s],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", ["galerkin", "fourier", "fourier_quadratic", "normalized"])
def test_keys_permuted_or_split_and_queries_permuted(fn, gen):
    """SPEC §2b: permuting the keys together with their coordinates and weights leaves the
    output unchanged, splitting a key into two copies of half its weight too, and permuting the
    queries with their coordinates permutes it (float64, 1e-12; also at M = 1 and N = 1)."""
    b, h, d, p = 2, 2, 3, 2
    norm = norm_pair(h, d, gen)

    def call(q, k, v, pos, kv_pos, w):
        if fn == "galerkin":
            return ops.galerkin_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w,
                                          k_norm=norm, v_norm=norm)
        if fn.startswith("fourier"):
            return ops.fourier_attention(
                q, k, v, pos=pos, kv_pos=kv_pos, weight=w, q_norm=norm, k_norm=norm,
                path="quadratic" if fn == "fourier_quadratic" else "factored")
        return ops.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w, skip=True)

    for n, m in ((9, 7), (1, 7), (9, 1)):
        q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
        pos, kv_pos = rand(b, n, p, gen=gen), rand(b, m, p, gen=gen)
        w = torch.rand(b, m, generator=gen, dtype=F64) + 0.1
        out = call(q, k, v, pos, kv_pos, w)
        keys = torch.randperm(m, generator=gen)
        torch.testing.assert_close(call(q, k[:, :, keys], v[:, :, keys], pos, kv_pos[:, keys],
                                        w[:, keys]), out, rtol=1e-12, atol=1e-12)
        queries = torch.randperm(n, generator=gen)
        torch.testing.assert_close(call(q[:, :, queries], k, v, pos[:, queries], kv_pos, w),
                                   out[:, :, queries], rtol=1e-12, atol=1e-12)
        split = torch.cat([torch.arange(m), torch.tensor([m - 1])])  # the last key twice
        halved = w[:, split].clone()
        halved[:, [m - 1, m]] /= 2
        torch.testing.assert_close(call(q, k[:, :, split], v[:, :, split], pos,
                                        kv_pos[:, split], halved), out, rtol=1e-12, atol=1e-12)
        if fn != "normalized" or m > 1:  # (one key alone is the whole of a normalised sum)
            assert not torch.allclose(call(q, k[:, :, split], v[:, :, split], pos,
                                           kv_pos[:, split], w[:, split]), out)  # not halved


def test_compiled_core_agrees_with_the_formulas_and_compiles(gen):
    x = core_inputs((2, 2, 40, 31, 6, 6, 2, "shared", "batched", True),
                    ("layer_norm", "layer_norm"), gen, dtype=torch.float32)

    def cross(q, k, v, pos, kv_pos, weight):
        return (ops.galerkin_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=weight,
                                       k_norm=x["k_norm"], v_norm=x["v_norm"])
                + ops.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=weight,
                                           skip=True))

    args = (x["q"], x["k"], x["v"], x["pos"], x["kv_pos"], x["weight"])
    eager = cross(*args)
    formula = (functional.kernel_attention(
        x["q"], x["k"], x["v"], pos=x["pos"], kv_pos=x["kv_pos"], weight=x["weight"],
        q_norm=None, k_norm=x["k_norm"], v_norm=x["v_norm"], eps=1e-5, scale=1.0,
        path="factored", dropout=None)[0]
        + functional.normalized_attention(*args[:3], pos=x["pos"], kv_pos=x["kv_pos"],
                                          weight=x["weight"], skip=True))
    torch.testing.assert_close(eager, formula, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(cross, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args), eager)


def test_direct_calls_are_checked(gen):
    k, v = rand(2, 2, 5, 3, gen=gen), rand(2, 2, 5, 4, gen=gen)
    with pytest.raises(RuntimeError, match="k_map: expected 'identity'"):
        torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "norm", None, None, "identity", None,
                                         None, 1e-5, False)
    with pytest.raises(RuntimeError, match="k_norm: layer_norm needs"):
        torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "layer_norm", None, None,
                                         "identity", None, None, 1e-5, False)
    with pytest.raises(RuntimeError, match="v: expected shape"):
        torch.ops.galerkin_ext.kv_reduce(k, v[:, :, :4], None, None, "identity", None, None,
                                         "identity", None, None, 1e-5, False)
    s = torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "identity", None, None, "identity",
                                         None, None, 1e-5, True)
    with pytest.raises(RuntimeError, match="normalizers"):
        torch.ops.galerkin_ext.q_apply(k, None, "identity", None, None, s, 1e-5, 2, False)
    with pytest.raises(RuntimeError, match="s: expected shape"):
        torch.ops.galerkin_ext.q_apply(v, None, "identity", None, None, s, 1e-5, 1, False)
    with pytest.raises(RuntimeError, match="skip: needs the output width 4"):
        torch.ops.galerkin_ext.q_apply(k, None, "identity", None, None, s, 1e-5, 1, True)
    # (unchecked, a weight or norm too short was read past its end)
    with pytest.raises(RuntimeError, match=r"weight: expected leading shape \(B, n\) or"):
        torch.ops.galerkin_ext.kv_reduce(k, v, None, rand(7, gen=gen), "identity", None, None,
                                         "identity", None, None, 1e-5, False)
    for width in (2, 5):
        with pytest.raises(RuntimeError, match=r"k_norm: expected shape \(H, D\) = \(2, 3\)"):
            torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "layer_norm",
                                             rand(2, width, gen=gen), rand(2, width, gen=gen),
                                             "identity", None, None, 1e-5, False)
    with pytest.raises(RuntimeError, match="normalizers: 2 blocks of"):  # (d_v = 0 each)
        torch.ops.galerkin_ext.q_apply(k, None, "identity", None, None, s[..., :2], 1e-5, 2,
                                       False)
    with pytest.raises(RuntimeError, match="kv_pos_grad: requested without kv_pos"):
        torch.ops.galerkin_ext.kv_reduce_backward(s, k, v, None, None, "identity", None,
                                                  None, "identity", None, None, 1e-5, True, True,
                                                  False)
    # Half types on the CPU are the Python layer's (it runs the formula): the ops refuse them,
    # on the direct products too (they once returned bfloat16 where the fake kernel says float32);
    # torch raises NotImplementedError, a RuntimeError, from 2.6 on, a plain one before
    for half in (k.bfloat16(), k.half()):
        with pytest.raises(RuntimeError, match="not implemented for"):
            torch.ops.galerkin_ext.kv_reduce(half, half, None, None, "identity", None, None,
                                             "identity", None, None, 1e-5, False)
        with pytest.raises(RuntimeError, match="not implemented for"):
            torch.ops.galerkin_ext.q_apply(half, None, "identity", None, None,
                                           s[..., :3].float(), 1e-5, 0, False)


_SCRATCH_SCRIPT = """
import resource, sys, torch
import galerkin_ext.ops
torch.set_num_threads(1)
n, d = 16384, 512
q, k, v, g = (torch.randn(1, 1, n, d) for _ in range(4))
s = torch.randn(1, 1, d, d) / d
norm = (torch.ones(1, d), torch.zeros(1, d))
def peak():  # (ru_maxrss: bytes on macOS, KiB elsewhere)
    unit = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit
base = peak()
torch.ops.galerkin_ext.kv_reduce(k, v, None, None, "layer_norm", *norm, "layer_norm", *norm,
                                 1e-5, False)
after_reduce = peak()
torch.ops.galerkin_ext.q_apply_backward(g, q, None, "layer_norm", *norm, s, 1e-5, 0, False,
                                        False)
print(after_reduce - base, peak() - base)
"""


def test_sums_over_points_take_scratch_of_the_thread_count_not_the_point_count(tmp_path):
    """S (the forward of kv_reduce) and dS (the backward of q_apply) are sums over the points:
    one partial per chunk of points made their scratch grow as N · d³, 128 MiB here for 32 MiB
    operands (8x them at d = 1024). One partial per thread takes d² each: what either op adds
    to the peak is its output (1 MiB S; 32 MiB dQ) and a few MiB of buffers. In a fresh
    process, one thread: its peak resident size is the measure."""
    import subprocess
    import sys

    # (from another folder: the repository's imports its source tree, without the extension)
    proc = subprocess.run([sys.executable, "-c", _SCRATCH_SCRIPT], capture_output=True,
                          text=True, timeout=120, check=True, cwd=tmp_path)
    reduce_growth, backward_growth = (int(x) for x in proc.stdout.split())
    mib = 2 ** 20
    assert reduce_growth < 1 * mib + 16 * mib, reduce_growth / mib
    assert backward_growth < 32 * mib + 16 * mib, backward_growth / mib
