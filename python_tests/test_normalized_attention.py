"""normalized_attention and hetero_normalized_attention (GNOT's op, SPEC-gnot §1), the compiled
(ops) and the plain (functional) forms,
against an explicit float64 sum over the N x M pairs, and the op family's properties: zero-weight
padding and batch mates change nothing, a key split in two with half the weight each changes
nothing, only weight ratios matter, an input without keys adds exactly 0 with zero gradients,
M != N, M = 1, N = 1, gradcheck, torch.compile, clear errors."""

import pytest
import torch
from attention_cases import CROSS_SHAPES, WEIGHT_SHAPES, cross_inputs, rand
from conftest import skip_where_subnormals_flush

from galerkin_ext import functional, ops, reference


@pytest.fixture(params=[ops, functional], ids=["ops", "functional"])
def impl(request):
    return request.param



def cat_pos(x, pos):
    if pos is None:
        return x
    b, h, n, _ = x.shape
    return torch.cat([pos.expand(b, n, -1)[:, None].expand(b, h, n, -1), x], dim=-1)


def explicit(q, k, v, weight=None, pos=None, kv_pos=None, skip=False):
    """z_t = σ q̃_t + Σ_j w_j (q̃_t·k̃_j) v̂_j / Σ_j w_j (q̃_t·k̃_j), loops over every pair."""
    qt = torch.softmax(cat_pos(q, pos), -1)
    kt = torch.softmax(cat_pos(k, kv_pos), -1)
    vh = cat_pos(v, kv_pos)
    b, h, n, _ = qt.shape
    m = k.shape[2]
    w = torch.full((b, m), 1.0, dtype=torch.float64) if weight is None else weight.expand(b, m)
    out = torch.zeros(b, h, n, vh.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for t in range(n):
                num = torch.zeros(vh.shape[-1], dtype=torch.float64)
                den = torch.zeros((), dtype=torch.float64)
                for j in range(m):
                    a = w[bi, j] * (qt[bi, hi, t] @ kt[bi, hi, j])
                    num += a * vh[bi, hi, j]
                    den += a
                out[bi, hi, t] = num / den if den > 0 else 0.0
    return out + qt if skip else out


@pytest.mark.parametrize("shape", CROSS_SHAPES, ids=str)
@pytest.mark.parametrize("weight_shape", WEIGHT_SHAPES)
def test_matches_explicit_sum(impl, shape, weight_shape, gen):
    q, k, v, weight = cross_inputs(shape, weight_shape, gen)
    b, h, n, _, _, dv = shape
    out = impl.normalized_attention(q, k, v, weight=weight)
    assert out.shape == (b, h, n, dv)
    torch.testing.assert_close(out, explicit(q, k, v, weight), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("skip", [False, True])
def test_reference_form_matches_explicit_sum(skip, gen):
    """galerkin_ext.reference's form, the GNOT oracle's (reference.gnot_forward), with and
    without the skip term."""
    q, k, v = (rand(2, 3, 6, 4, gen=gen) for _ in range(3))
    torch.testing.assert_close(reference.normalized_attention(q, k, v, skip=skip),
                               explicit(q, k, v, skip=skip), rtol=1e-12, atol=1e-12)


def test_coordinates_cross_attention_and_skip(impl, gen):
    b, h, n, m, d, p = 2, 2, 5, 8, 3, 2
    q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
    pos, kv_pos = rand(n, p, gen=gen), rand(b, m, p, gen=gen)
    w = torch.rand(b, m, generator=gen, dtype=torch.float64)
    out = impl.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=w, skip=True)
    assert out.shape == (b, h, n, p + d)
    torch.testing.assert_close(out, explicit(q, k, v, w, pos, kv_pos, skip=True),
                               rtol=1e-12, atol=1e-12)
    # self-attention: kv_pos defaults to pos
    k2, v2 = rand(b, h, n, d, gen=gen), rand(b, h, n, d, gen=gen)
    torch.testing.assert_close(impl.normalized_attention(q, k2, v2, pos=pos),
                               explicit(q, k2, v2, None, pos, pos), rtol=1e-12, atol=1e-12)


def test_padding_batch_mates_ratios_split_and_permuted_keys(impl, gen):
    b, h, n, m, d = 3, 2, 6, 5, 4
    q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
    w = torch.rand(b, m, generator=gen, dtype=torch.float64) + 0.05
    out = impl.normalized_attention(q, k, v, weight=w)
    pad = 3
    kp = torch.cat([k, 1e3 * rand(b, h, pad, d, gen=gen)], dim=2)
    vp = torch.cat([v, 1e6 * rand(b, h, pad, d, gen=gen)], dim=2)
    wp = torch.cat([w, torch.zeros(b, pad, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(impl.normalized_attention(q, kp, vp, weight=wp), out,
                               rtol=1e-12, atol=1e-12)
    for i in range(b):
        alone = impl.normalized_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1],
                                          weight=w[i : i + 1])
        torch.testing.assert_close(alone, out[i : i + 1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(impl.normalized_attention(q, k, v, weight=7.5 * w), out,
                               rtol=1e-12, atol=1e-12)
    idx = torch.tensor([0, 1, 2, 2, 3, 4])
    half = w[:, idx].clone()
    half[:, 2:4] /= 2
    split = impl.normalized_attention(q, k[:, :, idx], v[:, :, idx], weight=half)
    torch.testing.assert_close(split, out, rtol=1e-12, atol=1e-12)
    perm = torch.randperm(m, generator=gen)
    torch.testing.assert_close(
        impl.normalized_attention(q, k[:, :, perm], v[:, :, perm], weight=w[:, perm]), out,
        rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("skip", [False, True])
def test_input_without_keys_adds_zero_with_zero_gradients(impl, skip, gen):
    q, k, v = (rand(2, 2, 4, 3, gen=gen).requires_grad_() for _ in range(3))
    w = torch.rand(2, 4, generator=gen, dtype=torch.float64) + 0.1
    w[1] = 0.0
    w.requires_grad_()
    out = impl.normalized_attention(q, k, v, weight=w, skip=skip)
    q_tilde = torch.softmax(q[1], -1).detach()
    # exactly 0, or q̃ to rounding (the op's softmax is its own, not torch.softmax)
    torch.testing.assert_close(out[1].detach(), q_tilde if skip else torch.zeros_like(q_tilde),
                               rtol=1e-15 if skip else 0, atol=0)
    out.square().sum().backward()
    for t in (k, v, w):
        assert torch.isfinite(t.grad).all() and (t.grad[1] == 0).all()
    assert torch.isfinite(q.grad).all() and (q.grad[1] == 0).all() != skip


@pytest.mark.parametrize("spread", [60.0, 80.0, 86.0])
def test_tiny_normalisers_in_float32(impl, spread, gen):
    """Queries and keys whose large softmax features miss each other (logits ``spread`` apart)
    make δ = Σ_j w_j q̃·k̃_j tiny (1e-26 … 2.8e-39 at 86, where 1 / δ > 3.4e38): the float32
    result stays the float64 one (1 / δ overflowed: inf out; 1 / δ², below δ = 5.4e-20: inf
    gradients). At 86 the gradients, which pass through g / δ, overflow float32 (documented):
    the output only."""
    skip_where_subnormals_flush()
    d = 64
    half = torch.arange(d) < d // 2
    q = torch.where(half, 0.0, -spread) + 0.1 * torch.randn(2, 2, 4, d, generator=gen,
                                                             dtype=torch.float64)
    k = torch.where(half, -spread, 0.0) + 0.1 * torch.randn(2, 2, 3, d, generator=gen,
                                                             dtype=torch.float64)
    v = torch.randn(2, 2, 3, d, generator=gen, dtype=torch.float64)
    grad = torch.randn(2, 2, 4, d, generator=gen, dtype=torch.float64)
    results = []
    for dtype in (torch.float64, torch.float32):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = impl.normalized_attention(*leaves)
        results.append((out, *torch.autograd.grad(out, leaves, grad.to(dtype))))
    for exact, got in list(zip(*results, strict=True))[:1 if spread > 80 else None]:
        scale = exact.abs().max()
        torch.testing.assert_close(got.double() / scale, exact / scale, rtol=0,
                                   atol=1e-3 if spread > 80 else 1e-4)


def test_weights_whose_sum_overflows(impl, gen):
    """Only the weights' ratios matter: float32 weights of 1e38 (their sum inf) are equal
    weights, not a sample without keys (the output was 0, with zero gradients)."""
    q, k, v = (rand(1, 2, n, 4, gen=gen).float() for n in (5, 4, 4))
    torch.testing.assert_close(
        impl.normalized_attention(q, k, v, weight=torch.full((4,), 1e38)),
        impl.normalized_attention(q, k, v))


def test_hetero_sum_mean_and_masked_input(impl, gen):
    b, h, n, d = 2, 2, 5, 4
    q = rand(b, h, n, d, gen=gen)
    ms = (3, 7, 1)
    ks = [rand(b, h, m, d, gen=gen) for m in ms]
    vs = [rand(b, h, m, d, gen=gen) for m in ms]
    ws = [torch.rand(b, m, generator=gen, dtype=torch.float64) + 0.1 for m in ms]
    ws[1][0] = 0.0  # sample 0 has no points of input 1
    singles = [impl.normalized_attention(q, k, v, weight=w)
               for k, v, w in zip(ks, vs, ws, strict=True)]
    total = sum(singles)
    q_tilde = torch.softmax(q, -1)
    torch.testing.assert_close(impl.hetero_normalized_attention(q, ks, vs, weights=ws),
                               total + q_tilde, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        impl.hetero_normalized_attention(q, ks, vs, weights=ws, reduce="mean", skip=False),
        total / 3, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(  # the skip term is added once, after the mean
        impl.hetero_normalized_attention(q, ks, vs, weights=ws, reduce="mean"),
        total / 3 + q_tilde, rtol=1e-12, atol=1e-12)
    assert (singles[1][0] == 0).all()
    for i, (k, v, w) in enumerate(zip(ks, vs, ws, strict=True)):  # the pairwise formula, too
        torch.testing.assert_close(singles[i], explicit(q, k, v, w), rtol=1e-12, atol=1e-12)


def test_gradcheck(impl, gen):
    q, k, v = rand(2, 2, 3, 2, gen=gen), rand(2, 2, 4, 2, gen=gen), rand(2, 2, 4, 2, gen=gen)
    pos, kv_pos = rand(3, 1, gen=gen), rand(2, 4, 1, gen=gen)
    w = torch.rand(2, 4, generator=gen, dtype=torch.float64) + 0.2
    inputs = tuple(t.requires_grad_() for t in (q, k, v, pos, kv_pos, w))
    assert torch.autograd.gradcheck(
        lambda q, k, v, pos, kv_pos, w: impl.normalized_attention(
            q, k, v, pos=pos, kv_pos=kv_pos, weight=w, skip=True), inputs)
    k2 = rand(2, 2, 5, 2, gen=gen).requires_grad_()
    v2 = rand(2, 2, 5, 2, gen=gen).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, k2, v2: impl.hetero_normalized_attention(q, [k, k2], [v, v2],
                                                                 reduce="mean"),
        (inputs[0], inputs[1], inputs[2], k2, v2))


def test_non_contiguous_float32_and_compile(impl, gen):
    base = torch.randn(2, 6, 3, 8, generator=gen)
    k, v = base.transpose(1, 2), base.flip(-1).transpose(1, 2)
    q = torch.randn(2, 3, 8, 5, generator=gen).transpose(2, 3)
    w = torch.rand(6, 2, generator=gen).T
    out = impl.normalized_attention(q, k, v, weight=w)
    ref = explicit(q.double(), k.double(), v.double(), w.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)

    def f(q, k, v, w):
        return impl.normalized_attention(q, k, v, weight=w, skip=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, w), f(q, k, v, w))


Q, K, V = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 3)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda m: m.normalized_attention(Q, K[..., :3], V), ValueError,
     r"k: expected shape \(B, H, M, D\) = \(2, 2, M, 4\)"),
    (lambda m: m.normalized_attention(Q, K, V[:, :, :6]), ValueError, r"v: expected shape"),
    (lambda m: m.normalized_attention(Q, K, V, weight=torch.rand(5)), ValueError,
     r"weight: expected shape \(B, M\) = \(2, 7\)"),
    (lambda m: m.normalized_attention(Q, K, V, weight=-torch.rand(7)), ValueError, "non-negative"),
    (lambda m: m.normalized_attention(Q, K, V, pos=torch.rand(5, 1)), ValueError,
     "kv_pos: required when M != N"),
    (lambda m: m.normalized_attention(Q, K, V, pos=torch.rand(4, 1), kv_pos=torch.rand(7, 1)),
     ValueError, r"pos: expected shape \(B, N, P\) = \(2, 5, P\)"),
    (lambda m: m.normalized_attention(Q, K, V, pos=torch.rand(5, 2), kv_pos=torch.rand(7, 1)),
     ValueError, "kv_pos: expected 2 coordinates like pos, got 1"),
    (lambda m: m.normalized_attention(Q, K, V, skip=True), ValueError, "skip: needs D_v == D"),
    (lambda m: m.normalized_attention(Q, K, V, skip=1), TypeError, "skip: expected a bool"),
    (lambda m: m.normalized_attention(Q, K.double(), V), TypeError, "k: expected dtype"),
    (lambda m: m.hetero_normalized_attention(Q, [K, K], [V]), TypeError, "ks, vs"),
    (lambda m: m.hetero_normalized_attention(Q, K, V), TypeError, "ks, vs"),
    (lambda m: m.hetero_normalized_attention(Q, [K, K], [V, V[:, :, :2]]), ValueError,
     r"vs\[1\]: expected shape"),
    (lambda m: m.hetero_normalized_attention(Q, [K], [V], weights=[torch.rand(3)]), ValueError,
     r"weights\[0\]: expected shape"),
    (lambda m: m.hetero_normalized_attention(Q, [K], [V], weights=[None, None]), ValueError,
     "weights: expected 1 entries"),
    (lambda m: m.hetero_normalized_attention(Q, [K], [V], reduce="max"), ValueError, "reduce"),
    # a tensor where one entry per input is due: its batch rows were taken as the inputs'
    (lambda m: m.hetero_normalized_attention(Q, [K, K], [V, V], kv_pos=torch.rand(2, 7, 1),
                                             pos=torch.rand(5, 1)), TypeError,
     "kv_pos: expected None or a sequence of 2 entries"),
    (lambda m: m.hetero_normalized_attention(Q, [K, K], [V, V], weights=torch.rand(2, 7)),
     TypeError, "weights: expected None or a sequence of 2 entries .* got Tensor"),
])
def test_errors(impl, call, error, match):
    with pytest.raises(error, match=match):
        call(impl)
