"""Tests of galerkin_ext.layers: attention (against a plain-PyTorch composition of the same math),
encoder layer, spectral convolutions (against an explicit DFT), decoders, CiNN, denormaliser."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TORCH_BEFORE_2_6

from galerkin_ext import reference
from galerkin_ext.layers import (
    ATTENTION_TYPES,
    CiNNDownsampler,
    CiNNUpsampler,
    Denormalizer,
    EncoderLayer,
    FeedForward,
    PointwiseRegressor,
    SimpleAttention,
    SpectralConv1d,
    SpectralConv2d,
    SpectralRegressor,
    cinn_sizes,
)

NORMS = ("attn", "layer", "instance", None)


def _randomise(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Random values in every parameter, so that norms' affine maps and biases matter."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)


def _plain_attention(attn: SimpleAttention, x, pos, weight):
    """The same math written out with torch primitives and galerkin_ext.reference."""
    b, n, _ = x.shape
    h, d = attn.n_head, attn.d_head
    q, k, v = ((x @ lin.weight.T + lin.bias).reshape(b, n, h, d).permute(0, 2, 1, 3)
               for lin in (attn.query, attn.key, attn.value))
    normed = {"fourier": "qk", "softmax": "qk", "galerkin": "kv", "linear": "kv"}[
        attn.attention_type]
    params = {t: (getattr(attn, f"{t}_norm_weight"), getattr(attn, f"{t}_norm_bias"))
              for t in normed} if attn.norm in ("attn", "instance") else {}
    if attn.norm == "instance":  # per head, every feature column over the points
        tensors = {"q": q, "k": k, "v": v}
        for t, (w, bias) in params.items():
            if weight is None:  # nn.InstanceNorm1d's biased moments
                tensors[t] = torch.stack([
                    F.instance_norm(tensors[t][:, i].transpose(1, 2), weight=w[i],
                                    bias=bias[i], eps=attn.eps).transpose(1, 2)
                    for i in range(h)], dim=1)
            else:  # moments of the quadrature rule
                p = (weight / weight.sum(-1, keepdim=True)).reshape(-1, 1, n, 1)
                mean = (p * tensors[t]).sum(2, keepdim=True)
                var = (p * (tensors[t] - mean) ** 2).sum(2, keepdim=True)
                tensors[t] = (tensors[t] - mean) / torch.sqrt(var + attn.eps) * w[:, None] \
                    + bias[:, None]
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        params = {}
    if attn.attention_type == "galerkin":
        out = reference.galerkin_attention(q, k, v, pos=pos, weight=weight,
                                           k_norm=params.get("k"), v_norm=params.get("v"),
                                           eps=attn.eps)
    elif attn.attention_type == "fourier":
        out = reference.fourier_attention(q, k, v, pos=pos, weight=weight,
                                          q_norm=params.get("q"), k_norm=params.get("k"),
                                          eps=attn.eps)
    else:
        ln = reference.per_head_layer_norm
        if attn.attention_type == "softmax":
            qh = reference.concat_pos(ln(q, params.get("q"), attn.eps), pos)
            kh = reference.concat_pos(ln(k, params.get("k"), attn.eps), pos)
            vh = reference.concat_pos(v, pos)
            logits = qh @ kh.transpose(-1, -2) / math.sqrt(qh.shape[-1])
            if weight is not None:
                logits = logits + torch.log(weight).reshape(-1, 1, 1, n)
            out = torch.softmax(logits, dim=-1) @ vh
        else:
            qh = torch.softmax(reference.concat_pos(q, pos), dim=-1)
            kh = reference.concat_pos(ln(k, params.get("k"), attn.eps), pos).exp()
            if weight is not None:  # the softmax over the points counts points with w > 0
                kh = kh * (weight > 0).reshape(-1, 1, n, 1)
            kh = kh / kh.sum(dim=-2, keepdim=True)
            vh = reference.concat_pos(ln(v, params.get("v"), attn.eps), pos)
            w = torch.full((n,), 1.0 / n, dtype=x.dtype) if weight is None else weight
            out = qh @ (kh.transpose(-1, -2) @ (vh * w.reshape(-1, 1, n, 1)))
    out = out.permute(0, 2, 1, 3).reshape(b, n, -1)
    return out if attn.out_proj is None else out @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
@pytest.mark.parametrize("norm", NORMS)
def test_attention_matches_plain_pytorch(attention_type, norm, gen):
    attn = SimpleAttention(12, 3, attention_type, pos_dim=2, norm=norm, attn_dropout=0.3,
                           eps=1e-5).double().eval()
    _randomise(attn, gen)
    x = torch.randn(2, 7, 12, generator=gen, dtype=torch.float64)
    pos = torch.rand(7, 2, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(attn(x, pos), _plain_attention(attn, x, pos, None))
    # Per-sample coordinates and quadrature weights, one of them zero (a masked point).
    pos_b = torch.rand(2, 7, 2, generator=gen, dtype=torch.float64)
    weight = torch.rand(2, 7, generator=gen, dtype=torch.float64)
    weight[:, 3] = 0.0
    torch.testing.assert_close(attn(x, pos_b, weight), _plain_attention(attn, x, pos_b, weight))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_attention_without_coordinates(attention_type, gen):
    attn = SimpleAttention(8, 2, attention_type, pos_dim=0).double()
    _randomise(attn, gen)
    x = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    assert attn.out_proj is None
    torch.testing.assert_close(attn(x), _plain_attention(attn, x, None, None))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_attention_empty_batch(attention_type):
    attn = SimpleAttention(8, 2, attention_type, pos_dim=1)
    x = torch.zeros(0, 5, 8, requires_grad=True)
    out = attn(x, torch.rand(5, 1))
    assert out.shape == (0, 5, 8)
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert attn(x, torch.rand(0, 5, 1), torch.rand(0, 5)).shape == (0, 5, 8)


@pytest.mark.parametrize("return_attention", [False, True])
def test_softmax_attention_sample_without_keys_is_an_error(return_attention, gen):
    """A sample whose weights are all 0 has no keys: softmax attention over them is undefined,
    an error naming weight on both paths (as ops.continuum_attention)."""
    attn = SimpleAttention(8, 2, "softmax", pos_dim=1).double()
    _randomise(attn, gen)
    x = torch.randn(2, 5, 8, generator=gen, dtype=torch.float64)
    pos = torch.rand(5, 1, generator=gen, dtype=torch.float64)
    weight = torch.rand(2, 5, generator=gen, dtype=torch.float64)
    weight[1] = 0.0
    with pytest.raises(ValueError, match="^weight: batch element 1 has no key"):
        attn(x, pos, weight, return_attention=return_attention)


def test_softmax_attention_sample_without_keys_is_zero_where_tracing_skips_the_check(gen):
    """Compiled, the check for keys is skipped (it branches on values): such a sample gives 0,
    output and returned attention, not NaN (softmax over logits that are all -inf)."""
    attn = SimpleAttention(8, 2, "softmax", norm=None).eval()
    x = torch.randn(2, 5, 8, generator=gen)
    weight = torch.rand(2, 5, generator=gen)
    weight[1] = 0.0
    compiled = torch.compile(lambda x, w: attn(x, weight=w, return_attention=True),
                             backend="aot_eager")
    out, matrix = compiled(x, weight)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(matrix[1], torch.zeros_like(matrix[1]))
    eager, eager_matrix = attn(x[:1], weight=weight[:1], return_attention=True)
    torch.testing.assert_close(out[:1], eager)
    torch.testing.assert_close(matrix[:1], eager_matrix)


def test_linear_attention_weights_are_checked_and_a_sample_without_keys_is_zero(gen):
    """Linear attention takes the weights into its own softmax, not through an op that checks
    them: negative weights are refused here; a sample whose weights are all 0 gives 0 (its
    softmax over the points stays finite), and the others are as without it."""
    attn = SimpleAttention(8, 2, "linear").eval()
    x = torch.randn(2, 5, 8, generator=gen)
    with pytest.raises(ValueError, match="^weight: expected finite, non-negative"):
        attn(x, weight=torch.full((5,), -0.2))
    weight = torch.full((2, 5), 0.2)
    weight[0, 3] = 0.0  # a padded point of sample 0
    weight[1] = 0.0
    out = attn(x, weight=weight)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[:1], attn(x[:1], weight=weight[:1]))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_instance_norm_uses_quadrature_weights(attention_type, gen):
    """A point with weight 0 changes neither the statistics nor the other outputs."""
    attn = SimpleAttention(8, 2, attention_type, pos_dim=1, norm="instance").double()
    _randomise(attn, gen)
    x = torch.randn(1, 6, 8, generator=gen, dtype=torch.float64)
    pos = torch.rand(6, 1, generator=gen, dtype=torch.float64)
    weight = torch.full((6,), 0.2, dtype=torch.float64)
    weight[-1] = 0.0
    x2 = x.clone()
    x2[:, -1] += 10.0
    out1, out2 = attn(x, pos, weight), attn(x2, pos, weight)
    torch.testing.assert_close(out1[:, :-1], out2[:, :-1])
    # a sample without a point of positive weight has no moments: an error, not NaN
    with pytest.raises(ValueError, match="^weight: batch element 1 has no key of positive "
                                         "weight \\(an instance norm's moments"):
        attn(x.expand(2, 6, 8), pos, torch.stack([weight, torch.zeros_like(weight)]))


@pytest.mark.parametrize("norm", ["attn", "instance"])
@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_half_model_gradients_are_finite(attention_type, norm, gen):
    """A .half() layer at the default initialisation (xavier 1e-2: rows of small variance) gave
    a finite output and NaN gradients: the per-head norms' statistics ran in float16, whose
    range rsqrt's derivative there exceeds; they run in float32."""
    torch.manual_seed(0)
    attn = SimpleAttention(16, 2, attention_type, pos_dim=1, norm=norm)
    exact = copy.deepcopy(attn).double()
    x = torch.randn(2, 33, 16, generator=gen)
    pos = torch.rand(33, 1, generator=gen)
    low, high = x.half().requires_grad_(), x.double().requires_grad_()
    attn.half()(low, pos.half()).float().sum().backward()
    exact(high, pos.double()).sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in attn.parameters())
    assert float((low.grad.double() - high.grad).norm() / high.grad.norm()) < 3e-2


def test_attention_parameters_and_init():
    attn = SimpleAttention(96, 4, "galerkin", pos_dim=2, xavier_init=1e-2, diagonal_weight=0.5)
    assert attn.k_norm_weight.shape == attn.v_norm_bias.shape == (4, 24)
    assert not hasattr(attn, "q_norm_weight")
    assert torch.equal(attn.k_norm_weight, torch.ones(4, 24))
    assert torch.equal(attn.k_norm_bias, torch.zeros(4, 24))
    assert attn.out_proj.in_features == 4 * (24 + 2)
    for lin in (attn.query, attn.key, attn.value):
        assert torch.equal(lin.bias, torch.zeros(96))
        off = lin.weight - 0.5 * torch.eye(96)
        bound = 1e-2 * math.sqrt(6 / (96 + 96))  # xavier_uniform_ bound
        assert off.abs().max() <= bound and off.abs().max() > bound / 2
    fourier = SimpleAttention(96, 4, "fourier", pos_dim=1)
    assert hasattr(fourier, "q_norm_weight") and not hasattr(fourier, "v_norm_weight")
    for norm in ("layer", None):
        assert sum(p.numel() for p in SimpleAttention(96, 4, norm=norm).parameters()) == \
            3 * (96 * 96 + 96)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_dropout_only_in_training(attention_type, gen):
    attn = SimpleAttention(8, 2, attention_type, pos_dim=1, attn_dropout=0.5)
    x = torch.randn(2, 16, 8, generator=gen)
    pos = torch.linspace(0, 1, 16)[:, None]
    attn.eval()
    out = attn(x, pos)
    torch.testing.assert_close(attn(x, pos), out, rtol=0, atol=0)
    attn.train()
    torch.manual_seed(0)
    assert not torch.allclose(attn(x, pos), out)
    # p = 0 in training is the eval output.
    attn.attn_dropout = 0.0
    torch.testing.assert_close(attn(x, pos), out)


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_reference_dropout_mode(attention_type, gen):
    """The compatibility mode drops half of the attention matrix in eval() too."""
    attn = SimpleAttention(8, 2, attention_type, pos_dim=1, attn_dropout=0.0,
                           reference_dropout=True).eval()
    x = torch.randn(2, 16, 8, generator=gen)
    pos = torch.linspace(0, 1, 16)[:, None]
    _, matrix = attn(x, pos, return_attention=True)
    zero_fraction = (matrix == 0).float().mean().item()
    assert 0.35 < zero_fraction < 0.65
    plain = SimpleAttention(8, 2, attention_type, pos_dim=1).eval()
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(attn(x, pos), plain(x, pos))


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_return_attention(attention_type, gen):
    attn = SimpleAttention(12, 3, attention_type, pos_dim=2).double().eval()
    _randomise(attn, gen)
    x = torch.randn(2, 9, 12, generator=gen, dtype=torch.float64)
    pos = torch.rand(2, 9, 2, generator=gen, dtype=torch.float64)
    out, matrix = attn(x, pos, return_attention=True)
    side = 9 if attention_type in ("fourier", "softmax") else 4 + 2
    assert matrix.shape == (2, 3, side, side)
    torch.testing.assert_close(out, attn(x, pos))
    if attention_type == "softmax":
        torch.testing.assert_close(matrix.sum(-1), torch.ones(2, 3, 9, dtype=torch.float64))


@pytest.mark.parametrize("attention_type", ["fourier", "softmax"])
def test_returning_the_matrix_keeps_the_training_masks(attention_type, gen):
    """The N×N dropout draws the same masks whether the matrix is returned or not: the softmax
    type's returned-matrix path drew torch's masks (its output 0.15 from the plain one's)."""
    attn = SimpleAttention(16, 2, attention_type, pos_dim=1, attn_dropout=0.3).train()
    x, pos = torch.randn(2, 10, 16, generator=gen), torch.rand(10, 1, generator=gen)
    torch.manual_seed(3)
    plain = attn(x, pos)
    torch.manual_seed(3)
    out, matrix = attn(x, pos, return_attention=True)
    torch.testing.assert_close(out, plain)
    assert bool((matrix == 0).any())


@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_autocast_takes_coordinates_of_any_float_dtype_and_leaves_float64(attention_type, gen):
    """Under CPU autocast float64 or float16 coordinates reach every type (the softmax and
    linear types failed on their mixed products), and a float64 layer stays float64, as a float64
    matmul does (the ops cast it to float32, and its output projection then failed)."""
    attn = SimpleAttention(8, 2, attention_type, pos_dim=2).eval()
    x = torch.randn(2, 7, 8, generator=gen)
    pos = torch.rand(7, 2, generator=gen)
    with torch.no_grad():
        reference = attn(x, pos)
        for dtype in (torch.float64, torch.float16):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = attn(x, pos.to(dtype))
            assert low.dtype == torch.bfloat16
            torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.02)
        exact = copy.deepcopy(attn).double()
        expected = exact(x.double(), pos.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = exact(x.double(), pos.double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("return_attention", [False, True])
@pytest.mark.parametrize("attention_type", ATTENTION_TYPES)
def test_half_model_takes_float32_weights(attention_type, return_attention, gen):
    """A bfloat16 layer takes float32 quadrature weights, as the weight check says, in every
    type: the linear type and the softmax type's returned-matrix path failed on a dtype mix."""
    attn = SimpleAttention(8, 2, attention_type, pos_dim=2).eval()
    x, pos = torch.randn(2, 7, 8, generator=gen), torch.rand(7, 2, generator=gen)
    weight = torch.rand(7, generator=gen) + 0.1
    weight = weight / weight.sum()
    with torch.no_grad():
        reference = attn(x, pos, weight)
        low = copy.deepcopy(attn).bfloat16()(x.bfloat16(), pos.bfloat16(), weight,
                                             return_attention=return_attention)
    low = low[0] if return_attention else low
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), reference, rtol=0.05, atol=0.02)


def test_attention_gradients_flow_to_every_parameter(gen):
    for attention_type in ATTENTION_TYPES:
        attn = SimpleAttention(8, 2, attention_type, pos_dim=1)
        x = torch.randn(2, 6, 8, generator=gen, requires_grad=True)
        attn(x, torch.rand(6, 1, generator=gen)).square().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        for name, p in attn.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (attention_type, name)


def test_attention_errors():
    with pytest.raises(ValueError, match="n_head"):
        SimpleAttention(10, 3)
    with pytest.raises(ValueError, match="attention_type"):
        SimpleAttention(8, 2, "cosine")
    with pytest.raises(ValueError, match="norm"):
        SimpleAttention(8, 2, norm="batch")
    with pytest.raises(ValueError, match="attn_dropout"):
        SimpleAttention(8, 2, attn_dropout=1.0)
    with pytest.raises(ValueError, match="eps"):
        SimpleAttention(8, 2, eps=0.0)
    with pytest.raises(ValueError, match="eps: expected a finite float >= 1.17549e-38"):
        SimpleAttention(8, 2, eps=1e-45)  # at construction, not at the first forward
    with pytest.raises(ValueError, match="pos_dim"):
        SimpleAttention(8, 2, pos_dim=-1)
    with pytest.raises(TypeError, match="reference_dropout"):
        SimpleAttention(8, 2, reference_dropout=1)
    attn = SimpleAttention(8, 2, pos_dim=2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"x: expected shape \(B, N, d_model\)"):
        attn(torch.randn(2, 5, 6), torch.rand(5, 2))
    with pytest.raises(ValueError, match="x: expected shape"):
        attn(torch.randn(5, 8), torch.rand(5, 2))
    for attention_type in ("fourier", "galerkin", "softmax", "linear"):  # alike, by the layer
        with pytest.raises(ValueError, match=r"x: expected shape \(B, N, d_model\) with N >= 1"):
            SimpleAttention(8, 2, attention_type)(torch.randn(2, 0, 8))
    with pytest.raises(ValueError, match="pos: expected coordinates"):
        attn(x)
    with pytest.raises(ValueError, match="pos: expected shape"):
        attn(x, torch.rand(5, 3))
    with pytest.raises(TypeError, match="pos: expected dtype"):
        attn(x, torch.rand(5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="weight: expected shape"):
        attn(x, torch.rand(5, 2), torch.rand(4))
    with pytest.raises(ValueError, match="weight: expected finite, non-negative"):
        attn(x, torch.rand(5, 2), -torch.rand(5))
    for attention_type in ("fourier", "galerkin", "softmax", "linear"):  # the user's x, not k
        with pytest.raises(TypeError, match="weight: expected dtype torch.float32 like x"):
            SimpleAttention(8, 2, attention_type)(x, weight=torch.ones(5, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"weight: expected shape \(B, N\) = \(2, 5\)"):
            SimpleAttention(8, 2, attention_type)(x, weight=torch.ones(3))
    with pytest.raises(ValueError, match="pos: expected None"):
        SimpleAttention(8, 2)(x, torch.rand(5, 2))


def test_encoder_layer_feed_forward_defaults_to_twice_the_width():
    layer = EncoderLayer(32, 4)
    assert (layer.ffn.linear1.in_features, layer.ffn.linear1.out_features) == (32, 64)
    assert (layer.ffn.linear2.in_features, layer.ffn.linear2.out_features) == (64, 32)


@pytest.mark.parametrize("norm", NORMS)
def test_encoder_layer_is_post_norm_residual(norm, gen):
    layer = EncoderLayer(8, 2, "galerkin", pos_dim=1, dim_feedforward=16, norm=norm,
                         dropout=0.1).double().eval()
    _randomise(layer, gen)
    x = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64)
    pos = torch.rand(6, 1, generator=gen, dtype=torch.float64)
    ln1 = layer.norm1 if norm == "layer" else (lambda t: t)
    ln2 = layer.norm2 if norm == "layer" else (lambda t: t)
    h = ln1(x + layer.attn(x, pos))
    expected = ln2(h + layer.ffn.linear2(torch.relu(layer.ffn.linear1(h))))
    torch.testing.assert_close(layer(x, pos), expected)
    out, matrix = layer(x, pos, return_attention=True)
    torch.testing.assert_close(out, expected)
    assert matrix.shape == (2, 2, 5, 5)
    has_ln = isinstance(layer.norm1, torch.nn.LayerNorm)
    assert has_ln == (norm == "layer")
    assert layer.attn.norm == norm


def test_encoder_layer_dropouts():
    layer = EncoderLayer(8, 2, dropout=0.2)
    assert layer.attn.attn_dropout == 0.2 and layer.ffn.dropout.p == 0.2
    assert layer.dropout1.p == layer.dropout2.p == 0.2
    layer = EncoderLayer(8, 2, dropout=0.2, ffn_dropout=0.0, attn_dropout=0.1)
    assert layer.attn.attn_dropout == 0.1 and layer.ffn.dropout.p == 0.0
    with pytest.raises(ValueError, match="dropout"):
        EncoderLayer(8, 2, dropout=-0.1)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, activation="tanh")
    with pytest.raises(ValueError, match="dim_feedforward"):
        FeedForward(8, 0)


# ---------------------------------------------------------------------------------------------
# Spectral convolutions against an explicit DFT


def _dft_1d(x, weight, modes):
    """Keep modes < `modes` of the orthonormal DFT, multiply, and sum the real inverse series."""
    n = x.shape[1]
    j = torch.arange(n, dtype=torch.float64)
    k = torch.arange(modes, dtype=torch.float64)
    basis = torch.exp(-2j * math.pi * j[:, None] * k[None, :] / n) / math.sqrt(n)  # (n, modes)
    x_hat = torch.einsum("bjc,jk->bck", x.to(torch.complex128), basis)
    w = torch.complex(weight[..., 0], weight[..., 1])
    out_hat = torch.einsum("bik,iok->bok", x_hat, w)
    c = torch.full((modes,), 2.0, dtype=torch.float64)
    c[0] = 1.0  # Hermitian symmetry: every mode but k = 0 stands for itself and its conjugate
    return torch.einsum("bok,jk->bjo", out_hat * c, basis.conj()).real


def test_spectral_conv1d_matches_explicit_dft(gen):
    conv = SpectralConv1d(3, 4, modes=5, activation=None).double()
    _randomise(conv, gen)
    x = torch.randn(2, 17, 3, generator=gen, dtype=torch.float64)
    expected = _dft_1d(x, conv.weight, 5) + conv.linear(x)
    torch.testing.assert_close(conv(x), expected)
    silu = SpectralConv1d(3, 4, modes=5).double()
    silu.load_state_dict(conv.state_dict())
    torch.testing.assert_close(silu(x), F.silu(expected))


def test_spectral_conv2d_matches_explicit_dft(gen):
    m, n1, n2 = 3, 8, 11
    conv = SpectralConv2d(2, 3, modes=m, activation=None).double()
    _randomise(conv, gen)
    x = torch.randn(2, n1, n2, 2, generator=gen, dtype=torch.float64)
    k1 = torch.tensor(list(range(m)) + list(range(n1 - m, n1)), dtype=torch.float64)
    k2 = torch.arange(m, dtype=torch.float64)
    j1, j2 = torch.arange(n1, dtype=torch.float64), torch.arange(n2, dtype=torch.float64)
    e1 = torch.exp(-2j * math.pi * j1[:, None] * k1[None] / n1)  # (n1, 2m)
    e2 = torch.exp(-2j * math.pi * j2[:, None] * k2[None] / n2)  # (n2, m)
    norm = math.sqrt(n1 * n2)
    x_hat = torch.einsum("bxyc,xk,yl->bckl", x.to(torch.complex128), e1, e2) / norm
    w = torch.cat([conv.weight_pos, conv.weight_neg], dim=2)  # first axis: low then high
    out_hat = torch.einsum("bikl,iokl->bokl", x_hat, torch.complex(w[..., 0], w[..., 1]))
    c = torch.full((m,), 2.0, dtype=torch.float64)
    c[0] = 1.0
    y = torch.einsum("bokl,xk,yl->bxyo", out_hat * c, e1.conj(), e2.conj()).real / norm
    torch.testing.assert_close(conv(x), y + conv.linear(x))


def test_spectral_conv_dropout_acts_on_the_spectral_branch_input(gen):
    """Dropout on the spectral branch's input (the reference's place): in training, the output
    minus the residual Linear still holds only the kept modes. Dropout on the branch's output
    would spread the masked product over every mode."""
    m, n1, n2 = 3, 10, 11
    for conv, x in ((SpectralConv1d(2, 3, modes=m, activation=None, dropout=0.5),
                     torch.randn(2, n2, 2, generator=gen, dtype=torch.float64)),
                    (SpectralConv2d(2, 3, modes=m, activation=None, dropout=0.5),
                     torch.randn(2, n1, n2, 2, generator=gen, dtype=torch.float64))):
        conv = conv.double().train()
        _randomise(conv, gen)
        torch.manual_seed(0)
        branch = conv(x) - conv.linear(x)
        assert branch.abs().max() > 1e-3
        if x.dim() == 3:
            spectrum = torch.fft.rfft(branch, dim=1)
            outside = spectrum[:, m:]
        else:
            spectrum = torch.fft.rfft2(branch, dim=(1, 2))
            # |k₁| <= m: the k₂ = 0 column holds the conjugates of k₁ = -m .. -1 too
            outside = torch.cat([spectrum[:, m + 1:n1 - m].flatten(),
                                 spectrum[:, :, m:].flatten()])
        assert outside.abs().max() < 1e-12 * spectrum.abs().max()
        # and the mask reaches it: training differs from evaluation
        assert not torch.allclose(branch, conv.eval()(x) - conv.linear(x))


def _explicit_spectral_product(x, weight, n_pos, norm):
    """spectral_product written out: the kept modes of the DFT as sums over the grid, each
    mixed by its matrix, then the real series Σ_k c_k Re(Y_k e^{ik·x}) (c = 2 for the modes
    that stand for their conjugates too, 1 for k₂ = 0 and the Nyquist column)."""
    _, p1, p2, _ = x.shape
    rows, cols = weight.shape[2:]
    k1 = torch.tensor(list(range(n_pos)) + list(range(n_pos - rows, 0)), dtype=torch.float64)
    k2 = torch.arange(cols, dtype=torch.float64)
    j1, j2 = torch.arange(p1, dtype=torch.float64), torch.arange(p2, dtype=torch.float64)
    e1 = torch.exp(-2j * math.pi * j1[:, None] * k1[None] / p1)  # (p1, R)
    e2 = torch.exp(-2j * math.pi * j2[:, None] * k2[None] / p2)  # (p2, K)
    forward = 1 / math.sqrt(p1 * p2) if norm == "ortho" else 1.0
    inverse = 1 / math.sqrt(p1 * p2) if norm == "ortho" else 1 / (p1 * p2)
    x_hat = torch.einsum("bxyc,xk,yl->bckl", x.to(torch.complex128), e1, e2) * forward
    out_hat = torch.einsum("bikl,iokl->bokl", x_hat, weight.to(torch.complex128))
    c = torch.where((k2 == 0) | (2 * k2 == p2), 1.0, 2.0).to(torch.float64)
    y = torch.einsum("bokl,xk,yl->bxyo", out_hat * c, e1.conj(), e2.conj()).real
    return y * inverse


# (p1, p2, n_pos, n_neg, K): odd sizes and primes, one row (the 1-D layer), no negative rows,
# the Nyquist column (p2 = 2K - 2), every column kept (the FFT's side of the rule)
SPECTRAL_GRIDS = [(7, 11, 2, 2, 3), (1, 17, 1, 0, 5), (13, 9, 3, 0, 3), (24, 22, 12, 12, 12),
                  (6, 10, 3, 2, 6), (1, 1, 1, 0, 1), (1, 12, 1, 0, 5), (29, 31, 4, 3, 8),
                  (1, 10, 1, 0, 6)]


@pytest.mark.parametrize("grid", SPECTRAL_GRIDS)
@pytest.mark.parametrize("norm", ["ortho", "backward"])
def test_spectral_product_paths_match_explicit_sums(gen, grid, norm):
    """Both paths of layers.fourier.spectral_product (FFTs; products with the DFT matrices, the
    CPU's where 2 K < p2) against the written-out sums: float64 to 1e-12, float32 to its
    tolerance, on a permuted (non-contiguous) input; the dispatcher returns its path's bits.
    On one row, spectral_product_1d (the 1-D layer's) gives the same: through the matrices at
    n = 17 and 12 (K = 5), through rfft and irfft at n = 10 (K = 6, the Nyquist column) and
    n = 1."""
    from galerkin_ext.layers import fourier

    p1, p2, n_pos, n_neg, cols = grid
    x64 = torch.randn(3, p2, p1, 4, generator=gen, dtype=torch.float64).transpose(1, 2)
    w64 = torch.randn(4, 5, n_pos + n_neg, cols, generator=gen, dtype=torch.complex128)
    expected = _explicit_spectral_product(x64, w64, n_pos, norm)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        x, w = x64.to(dtype), w64.to(torch.promote_types(dtype, torch.complex64))
        for path in (fourier._spectral_product_fft, fourier._spectral_product_matmul):
            out = path(x, w, n_pos, norm)
            assert out.dtype == dtype
            torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
        chosen = (fourier._spectral_product_matmul if 2 * cols < p2  # and cols <= 24
                  else fourier._spectral_product_fft)
        assert torch.equal(fourier.spectral_product(x, w, n_pos, norm), chosen(x, w, n_pos, norm))
        if p1 == 1:
            line = fourier.spectral_product_1d(x[:, 0], w[:, :, 0], norm)
            torch.testing.assert_close(line.double(), expected[:, 0], rtol=tol, atol=tol)
    # weights conjugated lazily (torch's conj bit, as w.conj() gives them) on both paths
    conj = _explicit_spectral_product(x64, w64.conj().resolve_conj(), n_pos, norm)
    for path in (fourier._spectral_product_fft, fourier._spectral_product_matmul):
        torch.testing.assert_close(path(x64, w64.conj(), n_pos, norm), conj, rtol=1e-12,
                                   atol=1e-12)


def test_spectral_product_matmul_path_gradients_layout_autocast_and_vmap(gen):
    """The matrix-product path: gradcheck in float64 for the input and the weights; the result
    and the input's gradient are contiguous channels-last, as the input is (the layers before
    take that gradient on), on the FFTs' path too; under bfloat16 autocast it stays float32
    (as the FFTs do); torch.func.vmap over stacked weights."""
    from galerkin_ext.layers import fourier

    x = torch.randn(2, 5, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 4, 3, generator=gen, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w: fourier._spectral_product_matmul(x, w, 2, "ortho"), (x, w))
    for shape in ((2, 5, 9, 3), (2, 1, 9, 3)):  # a grid; a line (the 1-D layer's)
        for path in (fourier._spectral_product_matmul, fourier._spectral_product_fft):
            x = torch.randn(*shape, generator=gen, requires_grad=True)
            out = path(x, w[:, :, : shape[1]].to(torch.complex64), 1, "ortho")
            out.backward(torch.randn(out.shape, generator=gen))
            assert out.is_contiguous() and x.grad.is_contiguous()
    line = fourier.spectral_product_1d(torch.randn(2, 6, 3, generator=gen), w[:, :, 0], "ortho")
    assert line.is_contiguous()  # (6 points, 3 columns: the FFTs)
    x32 = torch.randn(2, 20, 18, 3, generator=gen)
    w32 = torch.randn(3, 2, 6, 5, generator=gen, dtype=torch.complex64)
    plain = fourier.spectral_product(x32, w32, 3, "backward")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = fourier.spectral_product(x32, w32, 3, "backward")
    assert cast.dtype == torch.float32
    torch.testing.assert_close(cast, plain, rtol=0, atol=0)
    stacked = torch.randn(4, 3, 2, 6, 5, generator=gen, dtype=torch.complex64)
    outs = torch.func.vmap(lambda w: fourier.spectral_product(x32, w, 3, "ortho"))(stacked)
    for out, member in zip(outs, stacked, strict=True):
        torch.testing.assert_close(out, fourier.spectral_product(x32, member, 3, "ortho"),
                                   rtol=1e-5, atol=1e-6)


def test_compiled_spectral_products_follow_the_rule(gen, monkeypatch):
    """torch.compile takes the CPU's rule as a guard on the sizes: a compiled SpectralConv2d
    traces the DFT-matrix products where eager runs them (30², K = 6) and the FFTs where it
    does not (12², K = 6), with eager's values and gradients at both; with torch < 2.7 the
    FFTs."""
    from galerkin_ext import _checks
    from galerkin_ext.layers import fourier

    if TORCH_BEFORE_2_6:
        pytest.skip("torch 2.5's dynamo breaks the graph at an FFT of symbolic size")
    traced: list[str] = []

    def spy(name: str):
        path = getattr(fourier, name)

        def run(*args):
            traced.append(name)
            return path(*args)
        return run

    for name in ("_spectral_product_matmul", "_spectral_product_fft"):
        monkeypatch.setattr(fourier, name, spy(name))
    layer = SpectralConv2d(3, 4, 6)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager")
    at_30 = "_spectral_product_matmul" if _checks.EXPORT_DETECTABLE else "_spectral_product_fft"
    for side, path in ((30, at_30), (12, "_spectral_product_fft")):
        x = torch.randn(2, side, side, 3, generator=gen, requires_grad=True)
        traced.clear()
        out = compiled(x)
        assert traced == [path]
        grad = torch.randn(out.shape, generator=gen)
        got = torch.autograd.grad(out, [x, *layer.parameters()], grad)
        expected = torch.autograd.grad(layer(x), [x, *layer.parameters()], grad)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # torch < 2.7 cannot tell an export (which takes no guard on sizes) from a compile: there
    # every compiled program keeps the FFTs (as above; here shown on any torch)
    monkeypatch.setattr(_checks, "EXPORT_DETECTABLE", False)
    torch._dynamo.reset()
    traced.clear()
    torch.compile(layer, backend="aot_eager")(torch.randn(2, 30, 30, 3, generator=gen))
    assert traced == ["_spectral_product_fft"]
    torch._dynamo.reset()


def test_spectral_product_rule_and_argument_errors():
    """The DFT-matrix products take at most 24 kept columns (their work grows with them, the
    FFTs' does not), and fewer than half the axis; every argument is checked by name."""
    from galerkin_ext.layers import fourier

    cpu = torch.empty(0)
    assert fourier._matmuls_pay(cpu, 24, 49) and not fourier._matmuls_pay(cpu, 24, 48)
    assert not fourier._matmuls_pay(cpu, 25, 10_000)
    assert not fourier._matmuls_pay(torch.empty(0, device="meta"), 4, 64)
    x, w = torch.randn(2, 16, 16, 3), torch.randn(3, 2, 4, 4, dtype=torch.complex64)
    product, line = fourier.spectral_product, fourier.spectral_product_1d
    for call, error, match in [
        (lambda: product(x, w, 2, "orth"), ValueError, "norm: expected one of"),
        (lambda: product(x.half(), w, 2, "ortho"), TypeError, "x: expected float32 or float64"),
        (lambda: product(x, w.real, 2, "ortho"), TypeError, "weight: expected a complex"),
        (lambda: product(x, w[:2], 2, "ortho"), ValueError, "c_in = 3"),
        (lambda: product(x, torch.randn(3, 2, 17, 4, dtype=torch.complex64), 2, "ortho"),
         ValueError, "at most p1 rows and 9 columns"),
        (lambda: product(x, torch.randn(3, 2, 4, 10, dtype=torch.complex64), 2, "ortho"),
         ValueError, "at most p1 rows and 9 columns"),
        (lambda: product(x, w, 5, "ortho"), ValueError, "n_pos: expected an int from 0"),
        (lambda: product(x[0], w, 2, "ortho"), ValueError, r"x: expected shape \(B, p1"),
        (lambda: line(x[:, 0], torch.randn(3, 2, 10, dtype=torch.complex64), "backward"),
         ValueError, "at most 9 columns"),
        (lambda: line(x[:, 0], w, "ortho"), ValueError, r"\(c_in, c_out, K\)"),
    ]:
        with pytest.raises(error, match=match):
            call()


def test_spectral_shapes_resolutions_and_errors(gen):
    conv1 = SpectralConv1d(2, 5, modes=4)
    for n in (6, 7, 64):
        assert conv1(torch.randn(3, n, 2, generator=gen)).shape == (3, n, 5)
    with pytest.raises(ValueError, match="modes = 4"):
        conv1(torch.randn(1, 5, 2))
    with pytest.raises(ValueError, match="in_channels = 2"):
        conv1(torch.randn(1, 16, 3))
    conv2 = SpectralConv2d(2, 5, modes=4)
    assert conv2(torch.randn(2, 8, 6, 2, generator=gen)).shape == (2, 8, 6, 5)
    with pytest.raises(ValueError, match="too coarse"):
        conv2(torch.randn(1, 7, 16, 2))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, n1, n2, in_channels\)"):
        conv2(torch.randn(8, 8, 2))
    with pytest.raises(ValueError, match="modes"):
        SpectralConv1d(2, 2, modes=0)
    with pytest.raises(ValueError, match="activation"):
        SpectralConv2d(2, 2, modes=2, activation="elu")


def test_spectral_init_scale():
    """Xavier-normal with the reference gains: std = gain * sqrt(2 / (fan_in + fan_out))."""
    conv = SpectralConv1d(48, 48, modes=16)
    fan = 48 * 16 * 2
    expected = 1 / (48 * 48) * math.sqrt(2 / (2 * fan))
    assert abs(conv.weight.std().item() / expected - 1) < 0.05
    conv2 = SpectralConv2d(32, 32, modes=12)
    fan = 32 * 12 * 12 * 2
    expected = math.sqrt(64) / (32 * 32) * math.sqrt(2 / (2 * fan))
    for w in (conv2.weight_pos, conv2.weight_neg):
        assert abs(w.std().item() / expected - 1) < 0.05


# ---------------------------------------------------------------------------------------------
# Decoders


def test_spectral_regressor(gen):
    reg = SpectralRegressor(6, 8, 2, modes=3, num_layers=3, spatial_dim=2, spatial_fc=True,
                            last_activation=False).double()
    x = torch.randn(2, 9, 10, 6, generator=gen, dtype=torch.float64)
    grid = torch.rand(9, 10, 2, generator=gen, dtype=torch.float64)
    h = reg.input.fc(torch.cat([x, grid.expand(2, 9, 10, 2)], dim=-1))
    for layer in reg.spectral:
        h = layer(h)
    assert isinstance(reg.spectral[-1].activation, torch.nn.Identity)
    assert isinstance(reg.spectral[0].activation, torch.nn.SiLU)
    assert reg.mlp[0].out_features == 2 * 2 * 8  # default dim_feedforward
    torch.testing.assert_close(reg(x, grid), reg.mlp(h))
    torch.testing.assert_close(reg(x, grid.expand(2, 9, 10, 2)), reg(x, grid))
    one_d = SpectralRegressor(5, 4, 1, modes=2, spatial_dim=1)
    assert one_d.spectral[0].linear.in_features == 5
    assert one_d(torch.randn(2, 8, 5)).shape == (2, 8, 1)
    with pytest.raises(ValueError, match="grid: expected None"):
        one_d(torch.randn(2, 8, 5), torch.rand(8, 1))
    with pytest.raises(ValueError, match="grid: expected the coordinates"):
        reg(x)
    with pytest.raises(ValueError, match="grid: expected shape"):
        reg(x, torch.rand(9, 9, 2))
    with pytest.raises(ValueError, match="spatial_dim"):
        SpectralRegressor(5, 4, 1, modes=2, spatial_dim=3)


def test_spectral_regressor_activates_every_layer_but_the_last(gen):
    """With last_activation=False every spectral layer but the last is followed by its
    activation, against a chain of 2-D DFTs written out here (the test above checked the first
    and last layers' activations and compared the regressor with a loop over its own layers)."""
    reg = SpectralRegressor(6, 8, 2, modes=3, num_layers=4, spatial_dim=2, spatial_fc=True,
                            last_activation=False).double()
    x = torch.randn(2, 9, 10, 6, generator=gen, dtype=torch.float64)
    grid = torch.rand(9, 10, 2, generator=gen, dtype=torch.float64)
    h = reg.input.fc(torch.cat([x, grid.expand(2, 9, 10, 2)], dim=-1))
    for i, layer in enumerate(reg.spectral):
        weight = torch.view_as_complex(torch.cat([layer.weight_pos, layer.weight_neg], 2))
        m = layer.modes
        z = torch.fft.rfft2(h, dim=(1, 2), norm="ortho")
        mixed = torch.zeros(2, 9, 6, 8, dtype=torch.complex128)
        mixed[:, :m, :m] = torch.einsum("bxyi,ioxy->bxyo", z[:, :m, :m], weight[:, :, :m])
        mixed[:, -m:, :m] = torch.einsum("bxyi,ioxy->bxyo", z[:, -m:, :m], weight[:, :, m:])
        h = torch.fft.irfft2(mixed, s=(9, 10), dim=(1, 2), norm="ortho") + layer.linear(h)
        h = h if i == len(reg.spectral) - 1 else torch.nn.functional.silu(h)
    torch.testing.assert_close(reg(x, grid), reg.mlp(h), rtol=1e-12, atol=1e-12)


def test_pointwise_regressor(gen):
    reg = PointwiseRegressor(6, 8, 3, num_layers=2, spatial_dim=2, spatial_fc=True,
                             dropout=0.5).double().eval()
    x = torch.randn(2, 4, 4, 6, generator=gen, dtype=torch.float64)
    grid = torch.rand(2, 4, 4, 2, generator=gen, dtype=torch.float64)
    h = reg.input.fc(torch.cat([x, grid], dim=-1))
    for block in reg.layers:
        h = F.silu(block[0](h))
    torch.testing.assert_close(reg(x, grid), reg.out(h))
    plain = PointwiseRegressor(6, 8, 3, num_layers=1, spatial_dim=2)
    assert plain.layers[0][0].in_features == 6 and plain(torch.randn(1, 3, 3, 6)).shape == (
        1, 3, 3, 3)
    with pytest.raises(ValueError, match="num_layers"):
        PointwiseRegressor(6, 8, 3, num_layers=0)
    with pytest.raises(TypeError, match="spatial_fc"):
        PointwiseRegressor(6, 8, 3, spatial_fc=1)


# ---------------------------------------------------------------------------------------------
# CiNN


@pytest.mark.parametrize(
    ("fine", "coarse", "down_middle", "up_middle"),
    [(211, 61, 113, 113), (141, 43, 78, 77), (85, 29, 50, 49), (141, 36, 71, 71),
     (211, 71, 123, 122)],
)
def test_cinn_sizes_of_the_paper(fine, coarse, down_middle, up_middle):
    assert cinn_sizes(fine, coarse) == (fine, down_middle, coarse, up_middle)


def _reference_scaled_sizes(fine: int, coarse: int) -> tuple[int, int, int]:
    """The reference's Darcy scripts' sizes, as they compute them (numpy, the factor's printed
    last digit, torch's scale-factor interpolation): ``(down middle, reached, up middle)``."""
    factor = np.round(np.sqrt(coarse / fine), 4)
    last_digit = float(str(factor)[-1])
    factor = np.round(factor, 3)
    if last_digit < 5:
        factor += 5e-3
    factor = int(factor / 5e-3 + 5e-1) * 5e-3

    def scaled(n: int) -> int:
        return F.interpolate(torch.zeros(1, 1, n, n), scale_factor=factor, mode="bilinear",
                             align_corners=True, recompute_scale_factor=True).shape[-1]

    middle = scaled(fine)
    return middle, scaled(middle), round(fine * factor) - 1


def test_cinn_sizes_are_the_references_wherever_it_runs():
    # every grid pair of the reference's Darcy scripts (421 subsampled by s: 421, 211, 141, …),
    # and a sweep of small grids
    grids = [420 // s + 1 for s in range(1, 61) if 420 % s == 0]
    pairs = [(f, c) for f in grids for c in grids if c <= f]
    pairs += [(f, c) for f in range(2, 60) for c in range(2, f + 1)]
    runs = 0
    for fine, coarse in pairs:
        middle, reached, up = _reference_scaled_sizes(fine, coarse)
        sizes = cinn_sizes(fine, coarse)
        if reached == coarse:
            runs += 1
            assert sizes == (fine, middle, coarse, up), (fine, coarse)
        else:  # a pair the reference cannot run (its attention grid would not be coarse²)
            geometric = round(math.sqrt(fine * coarse))
            assert sizes == (fine, geometric, coarse, geometric), (fine, coarse)
    assert runs > len(pairs) // 4  # both branches are exercised


def test_cinn_sizes_elsewhere_and_errors():
    assert cinn_sizes(100, 25) == (100, 50, 25, 49)  # factor 0.5
    assert cinn_sizes(85, 22) == (85, 43, 22, 43)  # the reference's scaling reaches 21
    assert cinn_sizes(16, 16) == (16, 16, 16, 15)  # factor 1.005
    with pytest.raises(ValueError, match="coarse: expected at most fine"):
        cinn_sizes(20, 30)
    with pytest.raises(ValueError, match="fine"):
        cinn_sizes(1, 1)


def test_cinn_down_and_up(gen):
    down = CiNNDownsampler(2, 10, (9, 5), activation="relu").double().eval()
    x = torch.randn(2, 17, 17, 2, generator=gen, dtype=torch.float64)
    out = down(x)
    assert out.shape == (2, 5, 5, 10) and (out >= 0).all()  # ends with a ReLU
    assert [b[0].out_channels for b in down.branches] == [3, 3, 4]
    assert all(not b[0].bias for b in [down.lift, *down.branches])
    # The same computation spelled out (channels-first).
    h = F.relu(down.lift[0](x.permute(0, 3, 1, 2)))
    h = F.relu(F.interpolate(h, size=(9, 9), mode="bilinear", align_corners=True))
    parts = []
    for branch in down.branches:
        h = F.relu(branch[0](h))
        parts.append(h)
    h = F.relu(F.interpolate(torch.cat(parts, 1), size=(5, 5), mode="bilinear",
                             align_corners=True))
    torch.testing.assert_close(out, h.permute(0, 2, 3, 1))

    up = CiNNUpsampler(10, 4, (9, 17), activation="silu").double().eval()
    y = up(out)
    assert y.shape == (2, 17, 17, 4)
    h = F.interpolate(out.permute(0, 3, 1, 2), size=(9, 9), mode="bilinear", align_corners=True)
    h = F.silu(F.silu(up.conv[0][0](h)))  # the reference applies the activation twice
    h = F.interpolate(h, size=(17, 17), mode="bilinear", align_corners=True)
    torch.testing.assert_close(y, h.permute(0, 2, 3, 1))
    with pytest.raises(ValueError, match="out_channels"):
        CiNNDownsampler(1, 2, (4, 3))
    with pytest.raises(TypeError, match="sizes: expected a pair"):  # as check_int_pair
        CiNNUpsampler(4, 4, (4,))
    with pytest.raises(ValueError, match="in_channels = 2"):
        down(torch.randn(1, 9, 9, 3, dtype=torch.float64))
    # a non-square grid was interpolated to a square one without a word
    with pytest.raises(ValueError, match="a square grid"):
        down(torch.randn(1, 9, 7, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="a square grid"):
        up(torch.randn(1, 5, 4, 10, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Denormalizer


def test_denormalizer(gen):
    denorm = Denormalizer()
    x = torch.randn(2, 4, 4, 1, generator=gen)
    torch.testing.assert_close(denorm(x), x)
    mean, std = torch.randn(4, 4, 1, generator=gen), torch.rand(4, 4, 1, generator=gen)
    denorm.set_statistics(mean, std, eps=1e-5)
    torch.testing.assert_close(denorm(x), x * (std + 1e-5) + mean)
    fresh = Denormalizer()
    fresh.load_state_dict(denorm.state_dict())  # resizes the 0-dim buffers
    torch.testing.assert_close(fresh(x), denorm(x))
    with pytest.raises(ValueError, match="another resolution"):
        denorm(torch.randn(2, 5, 5, 1))
    with pytest.raises(ValueError, match="std: expected the shape of mean"):
        denorm.set_statistics(mean, std[0])
    with pytest.raises(ValueError, match="std: expected finite, non-negative values"):
        denorm.set_statistics(mean, -std)
    with pytest.raises(TypeError, match="mean"):
        denorm.set_statistics([0.0], std)
    # statistics that broadcast (one per channel) serve every resolution
    per_channel = Denormalizer()
    mean, std = torch.randn(1, 1, 2, generator=gen), torch.rand(1, 1, 2, generator=gen)
    per_channel.set_statistics(mean, std, eps=1e-5)
    for side in (4, 5):
        y = torch.randn(3, side, side, 2, generator=gen)
        torch.testing.assert_close(per_channel(y), y * (std + 1e-5) + mean)


def _layer_cases():
    from galerkin_ext.layers import (
        AFNOBlock,
        CiNNDownsampler,
        CodomainAttention,
        ContinuumAttention,
        ContinuumEncoderLayer,
        FeedForward,
        GeometricGate,
        HeteroNormalizedAttention,
        MixtureFFN,
        PatchedAttention,
        ResidualMLP,
        SpectralConv1d,
        SpectralConv2d,
    )

    r = torch.rand
    # layer, inputs (the first float32 and checked); SpectralConv, whose only
    # parameters are complex, computes in the input's precision instead
    return {
        "SimpleAttention": (SimpleAttention(8, 2), (r(2, 5, 8),)),
        "ContinuumAttention": (ContinuumAttention(8, 2), (r(2, 5, 8),)),
        "ContinuumEncoderLayer": (ContinuumEncoderLayer(8, 2, 16), (r(2, 5, 8),)),
        "PatchedAttention": (PatchedAttention(8, 2), (r(2, 4, 3, 3, 8),)),
        "SpectralConv1d": (SpectralConv1d(8, 8, 3), (r(2, 8, 8),)),
        "SpectralConv2d": (SpectralConv2d(8, 8, 2), (r(2, 8, 8, 8),)),
        "HeteroNormalizedAttention": (HeteroNormalizedAttention(8, 2, 1), (r(2, 5, 8),
                                                                         [r(2, 4, 8)])),
        "GeometricGate": (GeometricGate(2, 8, 3), (r(2, 5, 2),)),
        "ResidualMLP": (ResidualMLP(8, 8, 4, 1), (r(2, 5, 8),)),
        "MixtureFFN": (MixtureFFN(8, 16, 1), (r(2, 5, 8), None)),
        "FeedForward": (FeedForward(8, 16), (r(2, 5, 8),)),
        "CiNNDownsampler": (CiNNDownsampler(8, 6, (5, 3)), (r(2, 9, 9, 8),)),
        "AFNOBlock": (AFNOBlock(8, 2), (r(2, 6, 6, 8),)),
        "CodomainAttention": (CodomainAttention(8, 2, 2), (r(2, 6, 6, 8),)),
    }


@pytest.mark.parametrize("name", sorted(_layer_cases()))
def test_layers_name_an_input_of_another_dtype_or_width(name):
    """A float64 input into float32 weights is named, as by the models (it was torch's 'mat1
    and mat2 must have the same dtype' or 'mixed dtype (CPU)'); so is a wrong feature width in
    the pointwise layers (it was 'mat1 and mat2 shapes cannot be multiplied')."""
    layer, inputs = _layer_cases()[name]
    argument = "coords" if name == "GeometricGate" else "x"
    layer(*inputs)  # as given: fine
    with pytest.raises(TypeError, match=f"^{argument}: expected torch.float32 like the model's"):
        layer(inputs[0].double(), *inputs[1:])
    if name in ("ResidualMLP", "MixtureFFN", "FeedForward", "ContinuumEncoderLayer"):
        with pytest.raises(ValueError, match=r"^x: expected shape \(\.\.\., 8\), got"):
            layer(inputs[0][..., :5], *inputs[1:])


def test_gnot_block_and_point_shards_name_a_wrong_input():
    """GNOTBlock's x and input tokens of another width (it was LayerNorm's 'Given
    normalized_shape=[8]'), a point shard of samples that are not dicts (a KeyError listing
    tensors as keys)."""
    from torch.utils.data import TensorDataset

    from galerkin_ext.domain import DomainSplit, PointShards
    from galerkin_ext.layers import GNOTBlock

    block = GNOTBlock(8, 2, 1, 16)
    x, y = torch.rand(2, 5, 8), torch.rand(2, 4, 8)
    assert block(x, [y], [None], None, None).shape == (2, 5, 8)
    for args, message in (((x[..., :6], [y]), r"^x: expected shape \(B, points, d_model = 8\)"),
                          ((x, [y[..., :6]]), r"^inputs\[0\]: expected shape"),
                          ((x, [y.double()]), r"^inputs\[0\]: expected torch.float32")):
        with pytest.raises((TypeError, ValueError), match=message):
            block(*args, [None], None, None)
    shards = PointShards(TensorDataset(torch.rand(3, 5, 2)), DomainSplit([5]), {"x": 1})
    with pytest.raises(TypeError, match=r"^dataset\[0\]: expected a sample dict"):
        shards[0]


def test_repr_shows_the_settings_that_change_the_output():
    """Modules that differ only in such a setting printed the same repr."""
    from galerkin_ext.layers.gnot import GNOTBlock, HeteroNormalizedAttention
    from galerkin_ext.layers.spectral import SpectralConv1d, SpectralConv2d
    from galerkin_ext.models import build_model

    pairs = [
        (SpectralConv1d(3, 3, 4), SpectralConv1d(3, 3, 8)),
        (SpectralConv2d(3, 3, 3), SpectralConv2d(3, 3, 5)),
        (HeteroNormalizedAttention(8, 1, 2), HeteroNormalizedAttention(8, 4, 2, "mean",
                                                                        skip=False)),
        (GNOTBlock(8, 2, 1, 16), GNOTBlock(8, 2, 1, 16, ffn_norm="pre")),
        (build_model("fno2d", width=8, modes=4), build_model("fno2d", width=8, modes=4,
                                                              boundary="dirichlet")),
        (build_model("darcy", fine=29, coarse=15, d_model=16, n_head=2, num_layers=1),
         build_model("darcy", fine=29, coarse=15, d_model=16, n_head=2, num_layers=1,
                     boundary="free")),
    ]
    for a, b in pairs:
        assert repr(a) != repr(b), type(a).__name__
