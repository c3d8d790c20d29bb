"""CodomainAttention (the continuum-attention paper's Remark 16): against the attention written
out as sums over the channels' functions (float64), channel-permutation equivariance, any channel
count, the same output for a band-limited field on every grid that resolves it, gradcheck,
errors."""

import math

import pytest
import torch

from galerkin_ext.layers import CodomainAttention

F64 = torch.float64


def layer(token_dim=3, n_head=2, modes=3, **kwargs):
    torch.manual_seed(0)
    return CodomainAttention(token_dim, n_head, modes, **kwargs).double()


def explicit(module, x):
    """softmax_k(scale Σ_points Σ_c Q_h u_j · K_h u_k / N) weighting V_h u_k, per head; then
    Linear(H d, 1) on each channel's heads."""
    b, s1, s2, c = x.shape
    n, h, d = s1 * s2, module.n_head, module.token_dim
    fields = module.qkv(x.permute(0, 3, 1, 2).reshape(b * c, s1, s2, 1))
    fields = fields.reshape(b, c, n, 3, h, d)
    out = torch.zeros(b, c, n, h, d, dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for j in range(c):
                logits = torch.stack([
                    (fields[bi, j, :, 0, hi] * fields[bi, k, :, 1, hi]).sum() / n
                    for k in range(c)]) * module.scale
                probs = torch.exp(logits - logits.max())
                probs = probs / probs.sum()
                for k in range(c):
                    out[bi, j, :, hi] += probs[k] * fields[bi, k, :, 2, hi]
    y = module.out_proj(out.reshape(b, c, n, h * d))[..., 0]  # (B, C, n)
    return y.reshape(b, c, s1, s2).permute(0, 2, 3, 1)


def test_matches_the_written_out_attention(gen):
    module = layer(scale=0.7)
    x = torch.randn(2, 6, 5, 4, generator=gen, dtype=F64)
    torch.testing.assert_close(module(x), explicit(module, x), rtol=1e-12, atol=1e-12)
    one = torch.randn(1, 7, 7, 1, generator=gen, dtype=F64)  # one channel attends to itself
    torch.testing.assert_close(module(one), explicit(module, one), rtol=1e-12, atol=1e-12)


def test_channel_permutation_and_any_channel_count(gen):
    module = layer()
    x = torch.randn(2, 8, 8, 5, generator=gen, dtype=F64)
    perm = torch.tensor([3, 0, 4, 2, 1])
    torch.testing.assert_close(module(x[..., perm]), module(x)[..., perm], rtol=1e-12,
                               atol=1e-12)
    assert module(x[..., :2]).shape == (2, 8, 8, 2)
    assert module(x[:0]).shape == (0, 8, 8, 5)


def band_limited(coeffs: torch.Tensor, s: int) -> torch.Tensor:
    """The trigonometric polynomial with coefficients ``coeffs (C, 5, 5, 2)`` (cos and sin of
    wavenumbers |k_i| <= 2) on the s x s periodic grid (i / s, j / s): (1, s, s, C)."""
    t = torch.arange(s, dtype=F64) / s
    field = torch.zeros(s, s, coeffs.shape[0], dtype=F64)
    for a in range(-2, 3):
        for b in range(-2, 3):
            phase = 2 * math.pi * (a * t[:, None] + b * t[None, :])
            field += (torch.cos(phase)[..., None] * coeffs[:, a + 2, b + 2, 0]
                      + torch.sin(phase)[..., None] * coeffs[:, a + 2, b + 2, 1])
    return field[None]


def test_one_operator_on_every_grid(gen):
    """Q, K, V keep the field's |k| <= 2 modes exactly (modes 3), their products have
    |k| <= 4, which the cell-volume sums integrate exactly on these grids: the same field on
    12², 24² and 36² gives the same output at the shared points."""
    module = layer(modes=3)
    coeffs = torch.randn(3, 5, 5, 2, generator=gen, dtype=F64)
    base = module(band_limited(coeffs, 12))
    for s in (24, 36):
        step = s // 12
        torch.testing.assert_close(module(band_limited(coeffs, s))[:, ::step, ::step], base,
                                   rtol=1e-10, atol=1e-10)


def test_gradcheck(gen):
    module = layer(token_dim=2, n_head=1, modes=2)
    x = torch.randn(1, 4, 5, 3, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda m: m(torch.randn(2, 4, 4)), ValueError, r"x: expected shape \(B, s1, s2, C\)"),
    (lambda m: m(torch.randn(2, 4, 4, 0)), ValueError, "C >= 1"),
    (lambda m: CodomainAttention(0, 2, 3), ValueError, "token_dim"),
    (lambda m: CodomainAttention(2, 2, 3, scale=True), TypeError, "scale"),
])
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(CodomainAttention(2, 2, 3))
