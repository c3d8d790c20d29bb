"""ops.continuum_attention (SPEC §2b) against an explicit float64 sum over the N x M pairs,
and the properties every member of the op family has: zero-weight padding changes nothing,
batch mates never interact, a key split in two with half the weight each changes nothing, key
permutations change nothing, M != N, M = 1, N = 1, gradcheck, torch.compile, clear errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from attention_cases import CROSS_SHAPES, WEIGHT_SHAPES, cross_inputs, needs_cuda, rand

from galerkin_ext import ops
from galerkin_ext.layers import ContinuumAttention
from galerkin_ext.quadrature import trapezoid_weights


def explicit(q, k, v, weight=None, scale=None):
    """z_t = Σ_j w_j exp(s q_t·k_j) v_j / Σ_j w_j exp(s q_t·k_j), loops over every pair."""
    b, h, n, d = q.shape
    m = k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    w = torch.ones(b, m, dtype=torch.float64) if weight is None else weight.expand(b, m)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            logits = scale * (q[bi, hi] @ k[bi, hi].T)  # (n, m)
            logits = logits - logits.max()
            num = torch.zeros(n, v.shape[-1], dtype=torch.float64)
            den = torch.zeros(n, 1, dtype=torch.float64)
            for j in range(m):
                e = w[bi, j] * torch.exp(logits[:, j : j + 1])
                num += e * v[bi, hi, j]
                den += e
            out[bi, hi] = num / den
    return out



@pytest.mark.parametrize("shape", CROSS_SHAPES, ids=str)
@pytest.mark.parametrize("weight_shape", WEIGHT_SHAPES)
def test_matches_explicit_sum(shape, weight_shape, gen):
    q, k, v, weight = cross_inputs(shape, weight_shape, gen)
    b, h, n, _, _, dv = shape
    out = ops.continuum_attention(q, k, v, weight=weight)
    assert out.shape == (b, h, n, dv)
    torch.testing.assert_close(out, explicit(q, k, v, weight), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ops.continuum_attention(q, k, v, weight=weight, scale=0.3),
                               explicit(q, k, v, weight, scale=0.3), rtol=1e-12, atol=1e-12)


def test_uniform_weights_are_plain_sdpa(gen):
    q, k, v = rand(2, 2, 5, 4, gen=gen), rand(2, 2, 7, 4, gen=gen), rand(2, 2, 7, 3, gen=gen)
    plain = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ops.continuum_attention(q, k, v), plain, rtol=0, atol=0)
    for c in (1e-6, 0.37, 1.0, 1e3):  # SPEC-continuum §6.2: any constant c
        constant = torch.full((7,), c, dtype=torch.float64)
        torch.testing.assert_close(ops.continuum_attention(q, k, v, weight=constant), plain,
                                   rtol=1e-12, atol=1e-12)


def test_outputs_are_bounded_by_the_weighted_values(gen):
    """Lemma 26: each output lies in [min v_j, max v_j] over the keys of positive weight, per
    feature, whatever the logits (large scales make the softmax nearly one-hot)."""
    q, k, v = rand(2, 3, 6, 4, gen=gen), rand(2, 3, 9, 4, gen=gen), rand(2, 3, 9, 5, gen=gen)
    weight = torch.rand(2, 9, generator=gen, dtype=torch.float64)
    weight[:, ::3] = 0.0  # removed keys may hold values outside the bounds
    v[:, :, ::3] = 100.0
    live = (weight > 0)[:, None, :, None]
    low = v.masked_fill(~live, math.inf).amin(dim=2, keepdim=True)
    high = v.masked_fill(~live, -math.inf).amax(dim=2, keepdim=True)
    for scale in (0.1, 1.0, 30.0):
        out = ops.continuum_attention(q, k, v, weight=weight, scale=scale)
        assert bool((out >= low - 1e-12).all()) and bool((out <= high + 1e-12).all())


def test_zero_weight_padding_and_batch_mates(gen):
    b, h, n, m, d = 3, 2, 6, 5, 4
    q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
    w = torch.rand(b, m, generator=gen, dtype=torch.float64) + 0.05
    out = ops.continuum_attention(q, k, v, weight=w)
    # three padded keys with weight 0 and wild values
    pad = 3
    kp = torch.cat([k, 1e3 * rand(b, h, pad, d, gen=gen)], dim=2)
    vp = torch.cat([v, 1e6 * rand(b, h, pad, d, gen=gen)], dim=2)
    wp = torch.cat([w, torch.zeros(b, pad, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(ops.continuum_attention(q, kp, vp, weight=wp), out,
                               rtol=1e-12, atol=1e-12)
    for i in range(b):  # each element alone gives its row of the batch
        alone = ops.continuum_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1],
                                        weight=w[i : i + 1])
        torch.testing.assert_close(alone, out[i : i + 1], rtol=1e-12, atol=1e-12)


def test_split_and_permuted_keys(gen):
    b, h, n, m, d = 2, 2, 5, 6, 3
    q, k, v = rand(b, h, n, d, gen=gen), rand(b, h, m, d, gen=gen), rand(b, h, m, d, gen=gen)
    w = torch.rand(b, m, generator=gen, dtype=torch.float64) + 0.05
    out = ops.continuum_attention(q, k, v, weight=w)
    # key 2 twice, each with half its weight
    idx = torch.tensor([0, 1, 2, 2, 3, 4, 5])
    half = w[:, idx].clone()
    half[:, 2:4] /= 2
    torch.testing.assert_close(
        ops.continuum_attention(q, k[:, :, idx], v[:, :, idx], weight=half), out,
        rtol=1e-12, atol=1e-12)
    perm = torch.randperm(m, generator=gen)
    torch.testing.assert_close(
        ops.continuum_attention(q, k[:, :, perm], v[:, :, perm], weight=w[:, perm]), out,
        rtol=1e-12, atol=1e-12)
    qperm = torch.randperm(n, generator=gen)
    torch.testing.assert_close(ops.continuum_attention(q[:, :, qperm], k, v, weight=w),
                               out[:, :, qperm], rtol=1e-12, atol=1e-12)


def test_weights_decades_apart_in_float32():
    """A key whose float32 weight is below 1.2e-38 of the largest still counts, as exactly as
    its logit allows (weights 1 and 1e-40, or 3e38 and 1e-10, with a logit gap that makes up for
    them): the float32 ratio was clamped at 1.2e-38 (0.9995 for 0.9477), or rounded to 0, which
    removed the key (0 for 0.1648)."""
    for weight, gap in (([1.0, 1e-40], 95.0), ([3e38, 1e-10], 110.0)):
        q = torch.ones(1, 1, 1, 1)
        k = torch.tensor([0.0, gap]).view(1, 1, 2, 1)
        v = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
        w = torch.tensor(weight)
        out = ops.continuum_attention(q, k, v, weight=w, scale=1.0)
        exact = explicit(q.double(), k.double(), v.double(), w.double()[None], scale=1.0)
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=0)


def test_element_without_keys_is_an_error(gen):
    """SPEC-continuum §1.1: a batch element with no positive weight has no attention."""
    q, k, v = (rand(2, 2, 4, 3, gen=gen) for _ in range(3))
    w = torch.rand(2, 4, generator=gen, dtype=torch.float64) + 0.1
    w[1] = 0.0
    with pytest.raises(ValueError, match="^weight: batch element 1 has no key of positive"):
        ops.continuum_attention(q, k, v, weight=w)
    with pytest.raises(ValueError, match="^weight: batch element 0"):
        ops.continuum_attention(q, k, v, weight=torch.zeros(4, dtype=torch.float64))


def test_gradcheck(gen):
    q, k, v = (rand(2, 2, 3, 4, gen=gen).requires_grad_() for _ in range(3))
    w = (torch.rand(2, 3, generator=gen, dtype=torch.float64) + 0.2).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, w: ops.continuum_attention(q, k, v, weight=w, scale=0.7), (q, k, v, w))
    assert torch.autograd.gradgradcheck(
        lambda q, k, v, w: ops.continuum_attention(q, k, v, weight=w), (q, k, v, w))


def test_non_contiguous_and_float32(gen):
    base = torch.randn(2, 6, 3, 8, generator=gen)  # (B, M, H, D) viewed as (B, H, M, D)
    k, v = base.transpose(1, 2), base.flip(-1).transpose(1, 2)
    q = torch.randn(2, 3, 8, 5, generator=gen).transpose(2, 3)
    w = torch.rand(6, 2, generator=gen).T  # (B, M), non-contiguous
    assert not (k.is_contiguous() or q.is_contiguous() or w.is_contiguous())
    out = ops.continuum_attention(q, k, v, weight=w)
    assert out.dtype == torch.float32
    ref = explicit(q.double(), k.double(), v.double(), w.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_dropout_whenever_asked(gen):
    q, k, v = rand(1, 1, 8, 4, gen=gen), rand(1, 1, 8, 4, gen=gen), rand(1, 1, 8, 4, gen=gen)
    w = torch.rand(8, generator=gen, dtype=torch.float64) + 0.1
    plain = ops.continuum_attention(q, k, v, weight=w)
    torch.testing.assert_close(ops.continuum_attention(q, k, v, weight=w, dropout_p=0.0), plain)
    torch.manual_seed(0)
    dropped = ops.continuum_attention(q, k, v, weight=w, dropout_p=0.5)
    assert not torch.allclose(dropped, plain)


def test_the_layer_drops_in_training_only(gen):
    layer = ContinuumAttention(8, 2, attn_dropout=0.5).double()
    x = rand(2, 6, 8, gen=gen)
    layer.eval()
    plain = layer(x)
    torch.testing.assert_close(layer(x), plain, rtol=0, atol=0)
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x), plain)


def test_the_layer_is_multi_head_softmax_attention_at_one_over_sqrt_head_width(gen):
    """The layer's default: softmax(Q Kᵀ / √(d_model / H)) V per head, heads concatenated, then
    out_proj (SPEC-continuum; the other tests pass a scale or compare the layer with the op)."""
    layer = ContinuumAttention(12, 3).double()  # head width 4: the logits' scale 1/2
    x = torch.randn(2, 7, 12, generator=gen, dtype=torch.float64)
    q, k, v = (lin(x).view(2, 7, 3, 4).transpose(1, 2)
               for lin in (layer.query, layer.key, layer.value))
    probs = torch.exp(q @ k.transpose(-2, -1) / 2)
    heads = (probs / probs.sum(-1, keepdim=True)) @ v
    want = layer.out_proj(heads.transpose(1, 2).reshape(2, 7, 12))
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)


def test_compile_fullgraph(gen):
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)
    w = torch.rand(2, 7) + 0.1

    def f(q, k, v, w):
        return ops.continuum_attention(q, k, v, weight=w)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, w), f(q, k, v, w))


def test_weights_make_a_nonuniform_grid_converge_to_the_integral():
    """On a graded 1-D grid the weighted layer approximates the integral operator
    z(x) = ∫ exp(s q(x) k(y)) v(y) dy / ∫ exp(s q(x) k(y)) dy; the unweighted one over-counts
    the dense end of the grid."""
    def fields(x):
        return torch.sin(2 * math.pi * x), torch.cos(3 * x), torch.exp(-x)  # q, k, v

    xq = torch.linspace(0, 1, 11, dtype=torch.float64)
    fine = torch.linspace(0, 1, 20001, dtype=torch.float64)
    _, kf, vf = fields(fine)
    qx = fields(xq)[0]
    e = torch.exp(2.0 * qx[:, None] * kf[None, :])
    wf = trapezoid_weights(fine)
    exact = (e * vf * wf).sum(1) / (e * wf).sum(1)
    s = torch.linspace(0, 1, 201, dtype=torch.float64)
    graded = s**3  # points crowd near 0

    def at_queries(x, weight):
        q = fields(xq)[0][None, None, :, None]
        k, v = fields(x)[1][None, None, :, None], fields(x)[2][None, None, :, None]
        return ops.continuum_attention(q, k, v, weight=weight, scale=2.0)[0, 0, :, 0]

    weighted = (at_queries(graded, trapezoid_weights(graded)) - exact).abs().max()
    unweighted = (at_queries(graded, None) - exact).abs().max()
    assert weighted < 1e-4 and unweighted > 100 * weighted


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"q": torch.randn(2, 5, 4)}, ValueError, r"q: expected a non-empty floating-point tensor"),
    ({"k": torch.randn(2, 2, 7, 3)}, ValueError,
     r"k: expected shape \(B, H, M, D\) = \(2, 2, M, 4\)"),
    ({"k": torch.randn(2, 2, 0, 4)}, ValueError, "M >= 1"),
    ({"v": torch.randn(2, 2, 6, 4)}, ValueError,
     r"v: expected shape \(B, H, M, D_v\) = \(2, 2, 7"),
    ({"v": torch.randn(2, 2, 7, 4, dtype=torch.float64)}, TypeError, "v: expected dtype"),
    ({"weight": torch.rand(2, 5)}, ValueError, r"weight: expected shape \(B, M\) = \(2, 7\)"),
    ({"weight": -torch.rand(7)}, ValueError, "non-negative"),
    ({"weight": [0.1] * 7}, TypeError, "weight: expected a tensor"),
    ({"scale": True}, TypeError, "scale: expected a finite float"),
    ({"scale": float("nan")}, ValueError, "scale"),
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
    ({"training": True}, TypeError, "training"),  # dropout_p alone decides, as in SDPA
    ({"q": None}, TypeError, "q: expected a tensor"),
])
def test_errors(kwargs, error, match):
    args = {"q": torch.randn(2, 2, 5, 4), "k": torch.randn(2, 2, 7, 4),
            "v": torch.randn(2, 2, 7, 4)}
    args.update({key: kwargs.pop(key) for key in ("q", "k", "v") if key in kwargs})
    with pytest.raises(error, match=match):
        ops.continuum_attention(args["q"], args["k"], args["v"], **kwargs)


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_mode_transforms_and_second_order(weighted, gen):
    """Forward mode and torch.func run on the math kernel (the fused ones have no forward
    derivative); second-order gradients under sdpa_kernel(MATH), as documented."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # D_v = D: shapes the fused CPU kernel takes
    q, k, v = rand(2, 2, 5, 4, gen=gen), rand(2, 2, 6, 4, gen=gen), rand(2, 2, 6, 4, gen=gen)
    w = torch.rand(2, 6, generator=gen, dtype=torch.float64) + 0.1 if weighted else None

    def call(q, k, v):
        return ops.continuum_attention(q, k, v, weight=w, scale=0.8)

    tangents = tuple(torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in (q, k, v))
    _, jvp = torch.func.jvp(call, (q, k, v), tangents)
    h = 1e-6
    up = call(*(t + h * d for t, d in zip((q, k, v), tangents, strict=True)))
    down = call(*(t - h * d for t, d in zip((q, k, v), tangents, strict=True)))
    torch.testing.assert_close(jvp, (up - down) / (2 * h), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(torch.func.jacfwd(call)(q, k, v), torch.func.jacrev(call)(q, k, v))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected, = torch.autograd.grad(call(*leaves).square().sum(), leaves[0])
    torch.testing.assert_close(torch.func.grad(lambda t: call(t, k, v).square().sum())(q),
                               expected, rtol=1e-12, atol=1e-14)
    with sdpa_kernel(SDPBackend.MATH):
        assert torch.autograd.gradgradcheck(call, leaves)


@needs_cuda
@pytest.mark.parametrize("n", [16383, 16384])
def test_cuda_memory_stays_linear_in_the_keys(n):
    """SPEC-continuum §1.1: at N = 16383 (unaligned) and 16384, B = 1, H = 8, D = 16, the weighted
    attention adds < 256 MiB (an N x N bias or score matrix in float32 alone would be 1 GiB), and
    agrees with the unweighted call for uniform weights."""
    gen = torch.Generator(device="cuda").manual_seed(n)
    q, k, v = (torch.randn(1, 8, n, 16, device="cuda", generator=gen) for _ in range(3))
    w = torch.full((n,), 1.0 / n, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = ops.continuum_attention(q, k, v, weight=w)
    torch.cuda.synchronize()
    added = torch.cuda.max_memory_allocated() - before
    assert added < 256 * 2**20, f"{added / 2**20:.0f} MiB"
    torch.testing.assert_close(out, ops.continuum_attention(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_cpu_autocast_runs_in_float32_like_the_other_ops(dropout_p):
    """Under CPU autocast SDPA ran in bfloat16 (and the dropout left the fused op for torch's
    materialised masks): now float32 on every path, the fused op included, returning float32,
    the same bits as the float32 op outside autocast; gradients reach the bfloat16 inputs."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g) for n in (5, 7, 7))
    weight = torch.rand(2, 7, generator=g) + 0.1
    torch.manual_seed(0)
    expected = ops.continuum_attention(q, k, v, weight=weight, dropout_p=dropout_p)
    low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.continuum_attention(*low, weight=weight, dropout_p=dropout_p)
    assert out.dtype == torch.float32
    torch.manual_seed(0)
    assert torch.equal(out, ops.continuum_attention(*(t.detach().float() for t in low),
                                                    weight=weight, dropout_p=dropout_p))
    assert (out - expected).abs().max() < 0.05  # (the inputs' bfloat16 rounding)
    out.sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in low)
