"""Patched attention (SPEC-continuum §1.2) and the ViT NO / FANO (§2): ops.patched_attention
against explicit float64 loops, gradcheck, errors; the §6 properties (bounded pointwise,
patch-mean averaging, convergence of the logits under refinement with the patches fixed, the
failure of a frozen cell weight); patching, the periodic patch extension, spectral smoothing;
the layers and models: exact parameter counts, resolution agnostic at s = 208 … 832 with
13² patches, batch independence, gradients, empty batches. SpectralConv's own resolution
invariance (§6.8) is tested in test_continuum_models.py."""

from __future__ import annotations

import math

import pytest
import torch

from galerkin_ext import ops
from galerkin_ext.layers import (
    PatchedAttention,
    PatchedEncoderLayer,
    SpectralConv,
    SpectralSmoothing,
    even_extension,
    patchify,
    periodic_extension,
    unpatchify,
)
from galerkin_ext.models import FANO, ViTNO, available_models, build_model

F64 = torch.float64


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def randn(*shape, gen, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=dtype)


def explicit(q, k, v, cell_weight, scale=1.0):
    """Z_{j,m} = Σ_k e^{S_jk} V_{k,m} / Σ_l e^{S_jl}, S_jk = scale Σ_m ω_m Σ_c Q_{j,m,c} K_{k,m,c},
    one (b, h, j, k) pair at a time."""
    b, h, p, n, _ = q.shape
    o, dv = k.shape[2], v.shape[-1]
    w = cell_weight if isinstance(cell_weight, torch.Tensor) else torch.full((n,), cell_weight,
                                                                             dtype=F64)
    out = torch.zeros(b, h, p, n, dv, dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for j in range(p):
                logits = torch.stack([
                    scale * (w[:, None] * q[bi, hi, j] * k[bi, hi, kk]).sum() for kk in range(o)])
                e = torch.exp(logits - logits.max())
                for kk in range(o):
                    out[bi, hi, j] += e[kk] * v[bi, hi, kk]
                out[bi, hi, j] /= e.sum()
    return out


def unit_grid(s1: int, s2: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """``(s₁, s₂, 2)`` cell-centred coordinates in [0, 1]²."""
    t1 = (torch.arange(s1, dtype=dtype) + 0.5) / s1
    t2 = (torch.arange(s2 or s1, dtype=dtype) + 0.5) / (s2 or s1)
    return torch.stack(torch.meshgrid(t1, t2, indexing="ij"), dim=-1)


# ---------------------------------------------------------------------------------------------
# ops.patched_attention


# (B, H, P, O, n, D, D_v): P = O = 1, n = 1, O != P both ways (ω on q and on k), D_v != D
SHAPES = [(2, 2, 3, 3, 6, 3, 3), (1, 2, 1, 1, 5, 2, 4), (2, 1, 3, 5, 1, 4, 2),
          (1, 2, 6, 2, 4, 2, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_explicit_loops(shape, gen):
    b, h, p, o, n, d, dv = shape
    q, k, v = randn(b, h, p, n, d, gen=gen), randn(b, h, o, n, d, gen=gen), randn(
        b, h, o, n, dv, gen=gen)
    w = torch.rand(n, generator=gen, dtype=F64)
    w[0] = 0.0  # a zero cell volume is allowed
    for cell_weight, scale in ((0.37, 1.0), (w, 2.5), (1e-3, None)):
        out = ops.patched_attention(q, k, v, cell_weight, scale=scale)
        assert out.shape == (b, h, p, n, dv) and out.dtype == F64
        expected = explicit(q, k, v, cell_weight, 1.0 if scale is None else scale)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs(gen):
    q = randn(2, 4, 3, 5, 3, gen=gen).transpose(1, 2)  # (2, 3, 4, 5, 3), strided
    k = randn(2, 3, 3, 5, 6, gen=gen)[..., ::2]  # (2, 3, 3, 5, 3)
    v = randn(2, 3, 5, 3, 2, gen=gen).permute(0, 1, 3, 2, 4)  # (2, 3, 3, 5, 2)
    w = torch.rand(10, generator=gen, dtype=F64)[::2]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous()
                or w.is_contiguous())
    out = ops.patched_attention(q, k, v, w)
    torch.testing.assert_close(out, explicit(q, k, v, w), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        out, ops.patched_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                   w.contiguous()), rtol=0, atol=0)


def test_empty_batch():
    q, k, v = torch.zeros(0, 2, 3, 4, 5), torch.zeros(0, 2, 6, 4, 5), torch.zeros(0, 2, 6, 4, 1)
    assert ops.patched_attention(q, k, v, 0.5).shape == (0, 2, 3, 4, 1)


@pytest.mark.parametrize("p", [2, 4])  # ω multiplies q (P <= O) or k (P > O)
def test_gradcheck_including_the_cell_weight(p, gen):
    q = randn(2, 2, p, 3, 2, gen=gen).requires_grad_()
    k = randn(2, 2, 3, 3, 2, gen=gen).requires_grad_()
    v = randn(2, 2, 3, 3, 4, gen=gen).requires_grad_()
    w = (torch.rand(3, generator=gen, dtype=F64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, w: ops.patched_attention(q, k, v, w, scale=0.8), (q, k, v, w))
    assert torch.autograd.gradcheck(lambda q, k, v: ops.patched_attention(q, k, v, 0.3),
                                    (q, k, v))


def test_half_inputs_do_not_overflow(gen):
    """n·D = 4096 products of size 100 sum to 4e5 > 65504: float16 logits would be inf."""
    q = 10 + randn(1, 2, 3, 64, 64, gen=gen)
    k = 10 + randn(1, 2, 4, 64, 64, gen=gen)
    v = randn(1, 2, 4, 64, 3, gen=gen)
    w = torch.full((64,), 1 / 4096, dtype=torch.float32)  # float32 weights with half tokens
    for dtype, tol in ((torch.float16, 5e-3), (torch.bfloat16, 3e-2)):
        low = [t.to(dtype) for t in (q, k, v)]
        expected = explicit(*(t.to(F64) for t in low), w.to(F64))  # from the rounded inputs
        for cell_weight in (1 / 4096, w):
            out = ops.patched_attention(*low, cell_weight)
            assert out.dtype == dtype
            torch.testing.assert_close(out.to(F64), expected, rtol=0, atol=tol)


def test_autocast_and_compile(gen):
    """Under autocast the op keeps its operands' dtype (float32 logits stay float32), and it
    traces into one graph (torch.compile fullgraph)."""
    q, k, v = (randn(2, 2, 3, 4, 5, gen=gen, dtype=torch.float32) for _ in range(3))
    w = torch.rand(4, generator=gen) + 0.1
    plain = ops.patched_attention(q, k, v, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ops.patched_attention(q, k, v, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    compiled = torch.compile(lambda q, k, v, w: ops.patched_attention(q, k, v, w, scale=0.5),
                             fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, w), ops.patched_attention(q, k, v, w, scale=0.5))


def test_op_errors():
    q, k, v = torch.randn(1, 2, 3, 4, 5), torch.randn(1, 2, 6, 4, 5), torch.randn(1, 2, 6, 4, 7)
    call = ops.patched_attention
    cases = [
        (lambda: call(q.numpy(), k, v, 1.0), TypeError, "q: expected a tensor"),
        (lambda: call(q[0], k, v, 1.0), ValueError, r"q: expected .*\(B, H, P, n, D\)"),
        (lambda: call(q.int(), k, v, 1.0), TypeError, "q: expected a floating-point"),
        (lambda: call(q[:, :, :, :0], k, v, 1.0), ValueError, "q: expected a non-empty"),
        (lambda: call(q, k[:, :, :, :3], v, 1.0), ValueError,
         r"k: expected shape \(B, H, O, n, D\) = \(1, 2, O, 4, 5\)"),
        (lambda: call(q, k[:, :, :0], v, 1.0), ValueError, "O >= 1"),
        (lambda: call(q, k, v[:, :, :5], 1.0), ValueError,
         r"v: expected shape \(B, H, O, n, D_v\) = \(1, 2, 6, 4, D_v\)"),
        (lambda: call(q, k.double(), v, 1.0), TypeError, "k: expected dtype torch.float32"),
        (lambda: call(q, k, v, 0.0), ValueError, "cell_weight: expected a finite float > 0"),
        (lambda: call(q, k, v, math.inf), ValueError, "cell_weight: expected a finite float"),
        (lambda: call(q, k, v, True), TypeError, "cell_weight: expected"),
        (lambda: call(q, k, v, [1.0] * 4), TypeError, "cell_weight: expected"),
        (lambda: call(q, k, v, torch.ones(5)), ValueError,
         r"cell_weight: .*\(n,\) = \(4,\), got shape \(5,\)"),
        (lambda: call(q, k, v, -torch.ones(4)), ValueError, "cell_weight: expected finite, non"),
        (lambda: call(q, k, v, torch.tensor([1.0, math.nan, 1.0, 1.0])), ValueError,
         "cell_weight: expected finite"),
        (lambda: call(q, k, v, torch.ones(4, dtype=F64)), TypeError, "cell_weight: expected dtype"),
        (lambda: call(q, k, v, torch.tensor(0.0)), ValueError, "cell_weight: .*got 0.0"),
        (lambda: call(q, k, v, torch.tensor(1)), TypeError, "cell_weight: .*int64 tensor"),
        (lambda: call(q, k, v, torch.tensor(0.5, device="meta")), ValueError,
         "cell_weight: expected a 0-dim tensor on cpu like q, got one on meta"),
        (lambda: call(q, k, v, 1.0, scale=math.nan), ValueError, "scale: expected a finite"),
        (lambda: call(q, k, v, 1.0, scale="1"), TypeError, "scale: expected a finite"),
    ]
    for fn, error, match in cases:
        with pytest.raises(error, match=match):
            fn()
    # one volume as a 0-d tensor (as under torch.jit.trace) is the float
    torch.testing.assert_close(call(q, k, v, torch.tensor(0.3)), call(q, k, v, 0.3))


# ---------------------------------------------------------------------------------------------
# SPEC-continuum §6.1, §6.5, §6.7


def test_bounded_pointwise(gen):
    """Each Z_{j,m,c} lies in [min_k V_{k,m,c}, max_k V_{k,m,c}] (pointwise over the patch),
    however sharp the softmax."""
    q, k, v = randn(2, 2, 4, 6, 3, gen=gen), randn(2, 2, 5, 6, 3, gen=gen), randn(
        2, 2, 5, 6, 2, gen=gen)
    low, high = v.amin(dim=2, keepdim=True), v.amax(dim=2, keepdim=True)
    for cell_weight in (0.01, 1.0, 50.0):
        out = ops.patched_attention(q, k, v, cell_weight)
        assert bool((out >= low - 1e-12).all()) and bool((out <= high + 1e-12).all())


def test_averaging_gives_the_patch_mean_function(gen):
    """Q = K = 0: every query patch gets (1/O) Σ_k V_k, the mean of the patch functions, at
    every in-patch point (op), and with V = W_o = I the layer returns that of its input."""
    v = randn(2, 2, 5, 6, 3, gen=gen)
    zeros = torch.zeros(2, 2, 4, 6, 3, dtype=F64)
    out = ops.patched_attention(zeros, zeros[:, :, :1].expand(2, 2, 5, 6, 3), v, 0.1)
    torch.testing.assert_close(out, v.mean(dim=2, keepdim=True).expand(2, 2, 4, 6, 3), rtol=0,
                               atol=1e-14)
    attn = PatchedAttention(6, 3).to(F64)
    with torch.no_grad():
        for lin in (attn.query, attn.key):
            lin.weight.zero_()
            lin.bias.zero_()
        for lin in (attn.value, attn.out_proj):
            lin.weight.copy_(torch.eye(6, dtype=F64))
            lin.bias.zero_()
    x = randn(2, 4, 3, 2, 6, gen=gen)
    torch.testing.assert_close(attn(x), x.mean(dim=1, keepdim=True).expand_as(x), rtol=0,
                               atol=1e-14)


def _features(points: torch.Tensor) -> torch.Tensor:
    """A smooth u: [0, 1]² → R⁴ at ``points (..., 2)``."""
    x1, x2 = points[..., 0], points[..., 1]
    return torch.stack([torch.sin(2 * math.pi * x1) * torch.cos(math.pi * x2),
                        torch.exp(x1 * x2), x1 * x1 - x2, torch.cos(3 * x1 + x2)], dim=-1)


def _patch_tokens(points: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(1, 1, 16, n, 4)`` patch tokens of ``_features @ weight`` on a grid cut 4 × 4."""
    f = _features(points.to(F64))[None] @ weight
    tiles = patchify(f, 4)
    return tiles.reshape(1, 1, 16, -1, weight.shape[1])


def _exact_logits(wq, wk) -> torch.Tensor:
    """The patch logits ∫_{D′} Q_j·K_k (16 × 16), Richardson-extrapolated midpoint sums at 128²
    and 256² points per patch: error O(h⁴) ≈ 1e-10."""
    sums = []
    for n in (128, 256):
        grid = unit_grid(4 * n, dtype=F64)
        q, k = _patch_tokens(grid, wq)[0, 0], _patch_tokens(grid, wk)[0, 0]
        sums.append(q.flatten(1) @ k.flatten(1).T / (4 * n) ** 2)
    return (4 * sums[1] - sums[0]) / 3


def _logit_differences(q, k, cell_weight) -> torch.Tensor:
    """S_jk − S_j0 read off the op: with V_k = e_k (constant over the patch) Z_{j,m,k} is the
    softmax probability p_jk, and log p_jk − log p_j0 = S_jk − S_j0."""
    n = q.shape[3]
    v = torch.eye(16, dtype=F64)[None, None, :, None, :].expand(1, 1, 16, n, 16)
    log_p = ops.patched_attention(q, k, v, cell_weight)[0, 0, :, 0].log()
    return log_p - log_p[:, :1]


def _slope(ns, errors) -> float:
    x, y = torch.log(torch.tensor(ns, dtype=F64)), torch.log(torch.tensor(errors, dtype=F64))
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def test_logits_converge_under_refinement_with_patches_fixed():
    """§6.7: P = 4 × 4 fixed, n = 8 … 64 points per patch axis, ω = 1/s² of the grid. Order 2 on
    cell-centred grids, at least 1 on node grids; a cell weight frozen at s₀ scales every logit
    by (s/s₀)² (here the logit differences, which is what the output sees)."""
    g = torch.Generator().manual_seed(5)
    wq, wk = randn(4, 4, gen=g), randn(4, 4, gen=g)
    exact = _exact_logits(wq, wk)
    exact = exact - exact[:, :1]
    ns = [8, 16, 32, 64]
    s0 = 4 * ns[0]
    centred, nodes, frozen_errors = [], [], []
    for n in ns:
        s = 4 * n
        q, k = _patch_tokens(unit_grid(s, dtype=F64), wq), _patch_tokens(unit_grid(s, dtype=F64),
                                                                          wk)
        diff = _logit_differences(q, k, 1.0 / s**2)
        centred.append(float((diff - exact).abs().max()))
        frozen = _logit_differences(q, k, 1.0 / s0**2)  # the cell weight of the s₀ grid
        torch.testing.assert_close(frozen, (s / s0) ** 2 * diff, rtol=1e-9, atol=1e-12)
        frozen_errors.append(float((frozen - exact).abs().max()))
        t = torch.linspace(0, 1, s, dtype=F64)
        node_grid = torch.stack(torch.meshgrid(t, t, indexing="ij"), dim=-1)
        diff = _logit_differences(_patch_tokens(node_grid, wq), _patch_tokens(node_grid, wk),
                                  1.0 / s**2)
        nodes.append(float((diff - exact).abs().max()))
    assert abs(_slope(ns, centred) + 2) < 0.2, centred
    assert _slope(ns, nodes) < -0.9, nodes
    # frozen: no convergence, the error grows like (s/s₀)² times the logit differences
    assert frozen_errors[0] == centred[0]
    assert all(b > 3 * a for a, b in zip(frozen_errors[1:], frozen_errors[2:], strict=False))
    assert frozen_errors[-1] > 1e3 * centred[-1]


def test_layer_derives_the_cell_weight_from_each_grid(gen):
    """PatchedAttention on the same smooth field at s = 32, 64, 128 (4 × 4 patches): its output,
    block-averaged from the finer grid, converges at order 2, which needs ω = 1/s² at every
    call; an explicit cell_weight replaces the derived one."""
    attn = PatchedAttention(4, 2).to(F64).eval().requires_grad_(False)
    outs = {}
    for s in (32, 64, 128, 256):
        tokens = patchify(_features(unit_grid(s, dtype=F64))[None], 4)
        outs[s] = unpatchify(attn(tokens), 4)
        if s == 32:
            torch.testing.assert_close(attn(tokens, cell_weight=1 / s**2), attn(tokens),
                                       rtol=0, atol=0)
            assert (attn(tokens, cell_weight=4.0 / s**2) - attn(tokens)).abs().max() > 1e-4

    def restrict(y):  # cell-centred 2 × 2 block means: O(h²) from the coarse centres
        return y.unflatten(1, (-1, 2)).unflatten(3, (-1, 2)).mean(dim=(2, 4))

    gaps = [float((outs[s] - restrict(outs[2 * s])).abs().max()) for s in (32, 64, 128)]
    assert 3.0 < gaps[0] / gaps[1] < 5.0 and 3.0 < gaps[1] / gaps[2] < 5.0, gaps
    assert list(attn.state_dict()) == [f"{m}.{p}" for m in ("query", "key", "value", "out_proj")
                                       for p in ("weight", "bias")]  # nothing grid-dependent


# ---------------------------------------------------------------------------------------------
# Patching, periodic extension, smoothing


def test_patchify_round_trip_and_order(gen):
    x = randn(2, 12, 10, 3, gen=gen)
    tiles = patchify(x, (3, 2))
    assert tiles.shape == (2, 6, 4, 5, 3)
    # row-major: patch i₁ P₂ + i₂ holds rows [4 i₁, 4 i₁ + 4), columns [5 i₂, 5 i₂ + 5)
    for index, (i1, i2) in enumerate((i1, i2) for i1 in range(3) for i2 in range(2)):
        torch.testing.assert_close(tiles[:, index], x[:, 4 * i1 : 4 * i1 + 4, 5 * i2 : 5 * i2 + 5],
                                   rtol=0, atol=0)
    torch.testing.assert_close(unpatchify(tiles, (3, 2)), x, rtol=0, atol=0)
    torch.testing.assert_close(unpatchify(patchify(x, 1), 1), x, rtol=0, atol=0)
    assert patchify(x, (12, 10)).shape == (2, 120, 1, 1, 3)
    with pytest.raises(ValueError, match=r"x: expected a grid s1 × s2 that the patches \(5, 2\)"):
        patchify(x, (5, 2))
    with pytest.raises(ValueError, match=r"u: .*got 12 × 10"):
        patchify(x, 4, name="u")
    with pytest.raises(ValueError, match=r"x: expected shape \(B, P, p1, p2, C\) with P = 3"):
        unpatchify(tiles, (3, 1))
    with pytest.raises(ValueError, match=r"patches\[1\]: expected an int >= 1"):
        patchify(x, (2, 0))
    with pytest.raises(TypeError, match="patches: expected an int or a pair"):
        patchify(x, (2, 2, 2))


def test_even_extension_and_periodic_extension(gen):
    x = randn(3, 5, 4, 2, gen=gen)
    ext = even_extension(x)
    assert ext.shape == (3, 10, 8, 2)
    torch.testing.assert_close(ext[:, :5, :4], x, rtol=0, atol=0)
    torch.testing.assert_close(ext, ext.flip(1), rtol=0, atol=0)  # even about the patch edge
    torch.testing.assert_close(ext, ext.flip(2), rtol=0, atol=0)
    # the 2p-periodic continuation is continuous: the last row and column repeat the first
    torch.testing.assert_close(ext[:, -1], ext[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(ext[:, :, -1], ext[:, :, 0], rtol=0, atol=0)
    # pointwise operators are unchanged by the extension
    torch.testing.assert_close(periodic_extension(torch.tanh, x), torch.tanh(x), rtol=0, atol=0)
    # an operator without the extension's mirror symmetry: its output on the extension written
    # out ([[x, flip₂ x], [flip₁ x, flip₁₂ x]]), cropped to the patch's own corner
    def shift(z):
        return torch.roll(z, 1, dims=1) + 2 * torch.roll(z, -2, dims=2)

    written = torch.cat([torch.cat([x, x.flip(2)], 2), torch.cat([x.flip(1), x.flip(1, 2)], 2)],
                        1)
    torch.testing.assert_close(periodic_extension(shift, x), shift(written)[:, :5, :4], rtol=0,
                               atol=0)
    # a cosine mode of the patch (cell-centred, not periodic on the patch) becomes one Fourier
    # mode of the extension: a SpectralConv that passes its retained modes keeps it exactly,
    # while on the bare patch the jump at the edge feeds the discarded modes
    p1, p2 = 8, 6
    i, j = torch.meshgrid(torch.arange(p1, dtype=F64) + 0.5, torch.arange(p2, dtype=F64) + 0.5,
                          indexing="ij")
    mode = (torch.cos(math.pi * 3 * i / p1) * torch.cos(math.pi * j / p2))[None, :, :, None]
    conv = SpectralConv(1, 1, 4).to(F64).requires_grad_(False)
    with torch.no_grad():
        conv.weight_pos.fill_(1.0)
        conv.weight_neg.fill_(1.0)
    torch.testing.assert_close(periodic_extension(conv, mode), mode, rtol=0, atol=1e-12)
    assert float((conv(mode) - mode).abs().max()) > 0.1
    # an operator that does not keep the extended grid would be cropped into a wrong shape
    with pytest.raises(ValueError, match=r"operator: expected an output of shape .* = \(1, 16, "
                                         r"12, C'\) .* got \(1, 8, 12, 1\)"):
        periodic_extension(lambda z: z[:, :8], mode)
    with pytest.raises(TypeError, match="operator: expected a callable, got NoneType"):
        periodic_extension(None, mode)


def test_spectral_smoothing_spectrum():
    """§6.9: constants pass unchanged; mode k (integer wavenumbers, Nyquist included) is scaled
    by exactly (1 + ε|k|²)^(-α); real fields stay real; no parameters."""
    smooth = SpectralSmoothing(1e-3, 1.001)
    assert n_params(smooth) == 0
    s1, s2 = 16, 9
    const = torch.full((2, s1, s2, 3), 2.5, dtype=F64)
    torch.testing.assert_close(smooth(const), const, rtol=0, atol=1e-14)
    i, j = torch.meshgrid(torch.arange(s1, dtype=F64), torch.arange(s2, dtype=F64),
                          indexing="ij")
    for k1, k2 in ((1, 0), (0, 4), (3, 2), (-5, 3), (8, 1), (8, 0), (7, 4)):
        wave = torch.cos(2 * math.pi * (k1 * i / s1 + k2 * j / s2) + 0.3)[None, :, :, None]
        if k1 == 8:  # the Nyquist row of the even axis holds only its cosine
            wave = torch.cos(2 * math.pi * (k1 * i / s1 + k2 * j / s2))[None, :, :, None]
        factor = (1 + 1e-3 * (k1**2 + k2**2)) ** -1.001
        torch.testing.assert_close(smooth(wave), factor * wave, rtol=0, atol=1e-13)
    strong = SpectralSmoothing(0.5, 2.0)
    wave = torch.sin(2 * math.pi * 3 * i / s1)[None, :, :, None].float()
    torch.testing.assert_close(strong(wave), (1 + 0.5 * 9) ** -2.0 * wave, rtol=0, atol=1e-6)
    torch.testing.assert_close(SpectralSmoothing(0.0, 1.0)(wave), wave, rtol=0, atol=1e-6)
    assert smooth(torch.zeros(0, 4, 4, 1)).shape == (0, 4, 4, 1)
    with pytest.raises(ValueError, match="alpha: expected a finite float >= 0"):
        SpectralSmoothing(1e-3, -1.0)


# ---------------------------------------------------------------------------------------------
# Layers


def test_layer_parameter_counts():
    assert n_params(PatchedEncoderLayer(128, 8)) == 99_584
    assert n_params(PatchedAttention(128, 8)) == 4 * (128 * 128 + 128)
    spectral = PatchedAttention(16, 4, qkv_modes=3)
    assert n_params(spectral) == 3 * 2 * 16 * 16 * 9 + 16 * 16 + 16


def test_initialised_as_the_authors_code():
    """The ViT NO's pointwise Q, K, V keep nn.Linear's initialisation (weights and biases
    U(±1/√d)), and the FANO's spectral ones are the authors' per-head operators d_model → d_head:
    real and imaginary parts U(0, 1/(d_model d_head)). They were Glorot with zero biases, and
    U(0, 1/d_model²), 8 times smaller at 8 heads."""
    torch.manual_seed(0)
    pointwise = PatchedAttention(64, 8)
    for linear in (pointwise.query, pointwise.key, pointwise.value, pointwise.out_proj):
        for parameter in (linear.weight, linear.bias):
            assert 0.9 / 8 < float(parameter.detach().abs().max()) <= 1 / 8
    spectral = PatchedAttention(64, 8, qkv_modes=3)
    bound = 1 / (64 * 8)
    for weight in (spectral.qkv.weight_pos, spectral.qkv.weight_neg):
        parts = torch.view_as_real(weight.detach())
        assert float(parts.min()) >= 0 and 0.9 * bound < float(parts.max()) <= bound


@pytest.mark.parametrize(("qkv_modes", "extension"), [(None, None), (2, None),
                                                     (2, "periodic")])
def test_layer_heads_against_an_explicit_computation(qkv_modes, extension, gen):
    """Per head h: channels [h d_K, (h+1) d_K) of Q, K, V per patch (spectral ones on each
    patch, or its periodic extension), logits ω Σ_m Σ_c, softmax over the key patches, then
    W_o, written with einsum (float64)."""
    attn = PatchedAttention(6, 3, qkv_modes=qkv_modes, patch_extension=extension,
                            scale=0.7).to(F64)
    b, p, p1, p2 = 2, 4, 3, 5
    x = randn(b, p, p1, p2, 6, gen=gen)

    def project(proj):
        if qkv_modes is None:
            return proj(x)
        if extension is None:
            return torch.stack([proj(x[:, i]) for i in range(p)], dim=1)  # patch by patch
        return torch.stack([periodic_extension(proj, x[:, i]) for i in range(p)], dim=1)

    if qkv_modes is None:
        q, k, v = (project(proj).reshape(b, p, p1 * p2, 3, 2)
                   for proj in (attn.query, attn.key, attn.value))
    else:  # one operator, outputs [Q, K, V]
        q, k, v = project(attn.qkv).reshape(b, p, p1 * p2, 3, 3, 2).unbind(3)
    logits = 0.7 / (p * p1 * p2) * torch.einsum("bjmhc,bkmhc->bhjk", q, k)
    z = torch.einsum("bhjk,bkmhc->bjmhc", logits.softmax(dim=-1), v)
    expected = attn.out_proj(z.reshape(b, p, p1, p2, 6))
    torch.testing.assert_close(attn(x), expected, rtol=1e-12, atol=1e-12)


def test_layer_errors():
    cases = [
        (lambda: PatchedAttention(6, 4), ValueError, "n_head: expected a divisor"),
        (lambda: PatchedAttention(6, 3, patch_extension="periodic"), ValueError,
         "patch_extension: 'periodic' extends the patches for spectral"),
        (lambda: PatchedAttention(6, 3, qkv_modes=2, patch_extension="mirror"), ValueError,
         r"patch_extension: expected one of \[None, 'periodic'\]"),
        (lambda: PatchedAttention(6, 3, qkv_modes=0), ValueError, "qkv_modes: expected an int"),
        (lambda: PatchedEncoderLayer(6, 3, dropout=1.0), ValueError, "dropout: expected"),
        (lambda: PatchedAttention(6, 3)(torch.randn(2, 4, 3, 3, 5)), ValueError,
         r"x: expected shape \(B, P, p1, p2, d_model\)"),
        (lambda: PatchedAttention(6, 3)(torch.randn(4, 3, 3, 6)), ValueError,
         r"x: expected shape \(B, P, p1, p2, d_model\)"),
        (lambda: PatchedAttention(6, 3)(torch.randn(1, 2, 2, 2, 6), cell_weight=-1.0),
         ValueError, "cell_weight: expected a finite float > 0"),
    ]
    for fn, error, match in cases:
        with pytest.raises(error, match=match):
            fn()


# ---------------------------------------------------------------------------------------------
# Models


def test_parameter_counts_of_the_paper():
    assert {"vitno", "fano"} <= set(available_models())
    assert n_params(build_model("vitno")) == 716_417
    with torch.device("meta"):  # 48M parameters: count them without allocating
        fano = build_model("fano")
    assert n_params(fano) == 48_084_865
    assert n_params(ViTNO(final_modes=None)) == 716_417 - 2 * 64 * 64
    with torch.device("meta"):
        assert n_params(FANO(patch_extension="periodic")) == 48_084_865


def _tiny(cls, **kwargs):
    config = {"d_model": 4, "n_head": 2, "num_layers": 1, "dim_feedforward": 4, **kwargs}
    if cls is ViTNO:
        config.setdefault("lift_modes", 4)
    else:
        config.setdefault("qkv_modes", 3)
    return cls(**config).eval()


def test_resolution_agnostic_at_the_paper_resolutions(gen):
    """§6.10: one ViT NO (with smoothing) and one FANO, 13² patches, at s = 208, 312, 416, 624,
    832 (patches of 16² … 64² points); a FANO with the periodic extension (4× the FFT work) at
    the first three."""
    models = [_tiny(ViTNO, final_modes=64, smoothing=(1e-3, 1.001)),
              _tiny(FANO, final_modes=64)]
    extended = _tiny(FANO, final_modes=64, patch_extension="periodic")
    with torch.no_grad():
        for s in (208, 312, 416, 624, 832):
            u = torch.randn(1, s, s, 1, generator=gen)
            for model in models + ([extended] if s <= 416 else []):
                out = model(u, unit_grid(s))
                assert out.shape == (1, s, s, 1) and bool(out.isfinite().all())


@pytest.mark.parametrize("cls", [ViTNO, FANO])
def test_batch_independence_and_empty_batch(cls, gen):
    model = _tiny(cls, patches=(2, 3), final_modes=5).to(F64)
    u, x = randn(3, 8, 12, 1, gen=gen), unit_grid(8, 12, F64)
    out = model(u, x)
    assert out.shape == (3, 8, 12, 1)
    for b in range(3):
        torch.testing.assert_close(model(u[b : b + 1], x), out[b : b + 1], rtol=1e-12,
                                   atol=1e-12)
    # per-sample coordinates give the same as a shared grid
    torch.testing.assert_close(model(u, x.expand(3, 8, 12, 2)), out, rtol=1e-12, atol=1e-12)
    assert model(u[:0], x).shape == (0, 8, 12, 1)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",
                            "ignore:`torch.jit:DeprecationWarning")
@pytest.mark.parametrize("cls", [ViTNO, FANO])
def test_jit_trace_follows_the_grid(cls, gen):
    """Under torch.jit.trace the cell volume 1 / (points) is a 0-d tensor of the traced sizes:
    the traced model gives eager's output at its own grid and at a finer one (to float64
    rounding of two algorithms: traced, the spectral products run the FFTs; eager, at these
    sizes, the DFT-matrix products; 1e-12 failed once by 2.6e-12)."""
    model = _tiny(cls, patches=(2, 2), final_modes=3).to(F64)
    u = randn(1, 8, 8, 1, gen=gen)
    traced = torch.jit.trace(model, (u, unit_grid(8, dtype=F64)))
    with torch.no_grad():
        for s in (8, 12):
            u, x = randn(2, s, s, 1, gen=gen), unit_grid(s, dtype=F64)
            torch.testing.assert_close(traced(u, x), model(u, x), rtol=1e-10, atol=1e-10)


def test_smoothing_and_final_conv_act_on_the_output(gen):
    base = _tiny(ViTNO, patches=2, final_modes=None).to(F64)
    smoothed = _tiny(ViTNO, patches=2, final_modes=None, smoothing=(0.1, 1.0)).to(F64)
    smoothed.load_state_dict(base.state_dict())  # smoothing has no parameters
    u, x = randn(2, 8, 8, 1, gen=gen), unit_grid(8, dtype=F64)
    torch.testing.assert_close(smoothed(u, x), SpectralSmoothing(0.1, 1.0)(base(u, x)),
                               rtol=0, atol=1e-12)
    # the periodic extension changes no parameter: the two FANOs share state dicts
    plain, extended = _tiny(FANO, patches=2), _tiny(FANO, patches=2, patch_extension="periodic")
    extended.load_state_dict(plain.state_dict())
    u, x = torch.randn(1, 8, 8, 1, generator=gen), unit_grid(8)
    assert (plain(u, x) - extended(u, x)).abs().max() > 1e-6


def test_gradients(gen):
    """float64 gradcheck of a tiny ViT NO in u; in training, every parameter of both models
    gets a finite, non-zero gradient."""
    model = ViTNO(d_model=4, n_head=2, num_layers=1, patches=2, lift_modes=2, final_modes=3,
                  dim_feedforward=4, dropout=0.0).to(F64).eval()
    x = unit_grid(6, dtype=F64)
    u = randn(1, 6, 6, 1, gen=gen).requires_grad_()
    assert torch.autograd.gradcheck(lambda u: model(u, x), (u,))
    for model in (_tiny(ViTNO, patches=2, final_modes=3).train(),
                  _tiny(FANO, patches=2, final_modes=3, patch_extension="periodic").train()):
        u = torch.randn(2, 8, 8, 1, generator=gen)
        model(u, unit_grid(8)).square().mean().backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and bool(p.grad.isfinite().all()), name
            assert float(p.grad.abs().max()) > 0, name


def test_model_errors():
    u, x = torch.randn(1, 26, 26, 1), unit_grid(26)
    cases = [
        (lambda: _tiny(ViTNO)(u[:, :25, :25], x[:25, :25]), ValueError,
         r"u: expected a grid s1 × s2 that the patches \(13, 13\) divide"),
        (lambda: _tiny(ViTNO)(u, x[:24]), ValueError, r"x: expected shape \(26, 26, 2\)"),
        (lambda: _tiny(FANO)(torch.randn(1, 26, 26, 2), x), ValueError,
         r"u: expected shape \(B, s1, s2, in_dim\) with in_dim = 1 \(FANO\)"),
        (lambda: ViTNO(patches=0), ValueError, "patches: expected an int >= 1"),
        (lambda: ViTNO(smoothing=1e-3), TypeError, r"smoothing: expected None or a pair"),
        (lambda: ViTNO(smoothing=(1e-3, -1)), ValueError, r"smoothing\[1\] \(alpha\)"),
        (lambda: ViTNO(lift_modes=0), ValueError, "lift_modes: expected an int >= 1"),
        (lambda: FANO(qkv_modes=None), TypeError, "qkv_modes: expected an int"),
        (lambda: FANO(patch_extension="reflect"), ValueError, "patch_extension: expected one"),
        (lambda: build_model("vitno", qkv_modes=3), TypeError, "not arguments of ViTNO"),
    ]
    for fn, error, match in cases:
        with pytest.raises(error, match=match):
            fn()
