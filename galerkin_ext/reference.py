"""Plain-PyTorch reference for the attention ops, written for clarity, not speed.

It follows the original Galerkin Transformer code step by step: a Python loop of per-head layer
norms, ``torch.cat`` of the coordinates in front of every head, then the matrix products. The
tests use it in float64 as the oracle for the compiled ops, and ``benchmarks/attention.py`` times
it as the "eager" baseline. Shapes and semantics are those of :mod:`galerkin_ext.ops`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import (
    check_attention_operands,
    check_norm,
    check_norm_eps,
    check_quadrature_weight,
    check_scale,
)
from .functional import resolve_kv_pos

if TYPE_CHECKING:
    from .layers.gnot import GeometricGate
    from .models.gnot import GNOT

Norm = tuple[Tensor, Tensor] | None


def per_head_layer_norm(x: Tensor, norm: Norm, eps: float) -> Tensor:
    """Layer norm over the last dim of ``x (B, H, N, D)`` with head h's ``(weight[h], bias[h])``."""
    if norm is None:
        return x
    weight, bias = norm
    heads = [
        F.layer_norm(x[:, h], (x.shape[-1],), weight[h], bias[h], eps) for h in range(x.shape[1])
    ]
    return torch.stack(heads, dim=1)


def concat_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    """``[pos | x]`` for every head: ``x (B, H, N, D)``, ``pos (B, N, P)`` or ``(N, P)``."""
    if pos is None:
        return x
    batch, heads, n, _ = x.shape
    pos = pos.expand(batch, n, pos.shape[-1]).unsqueeze(1).expand(batch, heads, n, -1)
    return torch.cat([pos, x], dim=-1)


def _check(q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None, kv_pos: Tensor | None,
           weight: Tensor | None, norms: dict[str, Norm], eps: float) -> Tensor | None:
    """The ops' argument rules (so the oracle refuses what they refuse, rather than broadcast
    it); returns the keys' coordinates."""
    batch, _, _, m, _ = check_attention_operands(q, k, v)
    kv_pos = resolve_kv_pos(pos, kv_pos, q, k)
    if weight is not None:
        check_quadrature_weight(weight, batch, m, k, "k", axis="M")
    for name, norm in norms.items():
        check_norm(norm, name, v if name == "v_norm" else q, "v" if name == "v_norm" else "q")
    check_norm_eps(eps)
    return kv_pos


def _check_mask(mask: Tensor | None, shape: torch.Size) -> None:
    if mask is not None and (not isinstance(mask, Tensor) or mask.shape != shape):
        raise ValueError(f"dropout_mask: expected a tensor of shape {tuple(shape)}, got "
                         f"{tuple(mask.shape) if isinstance(mask, Tensor) else mask!r}")


def _weight_rows(x: Tensor, weight: Tensor | None) -> Tensor:
    """``diag(w) x`` over the points; ``None`` means the uniform weight 1/N."""
    if weight is None:
        return x / x.shape[-2]
    return x * weight.expand(x.shape[0], x.shape[-2])[:, None, :, None]


def galerkin_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    weight: Tensor | None = None,
    k_norm: Norm = None,
    v_norm: Norm = None,
    eps: float = 1e-5,
    dropout_mask: Tensor | None = None,
) -> Tensor:
    """``Q̂ (K̂ᵀ W V̂)``; ``dropout_mask (B, H, d, d)`` multiplies ``K̂ᵀ W V̂`` if given.
    ``kv_pos``: the keys' coordinates (default ``pos``)."""
    kv_pos = _check(q, k, v, pos, kv_pos, weight, {"k_norm": k_norm, "v_norm": v_norm}, eps)
    q_hat = concat_pos(q, pos)
    k_hat = concat_pos(per_head_layer_norm(k, k_norm, eps), kv_pos)
    v_hat = concat_pos(per_head_layer_norm(v, v_norm, eps), kv_pos)
    scores = k_hat.transpose(-2, -1) @ _weight_rows(v_hat, weight)
    _check_mask(dropout_mask, scores.shape)
    if dropout_mask is not None:
        scores = scores * dropout_mask
    return q_hat @ scores


def fourier_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    weight: Tensor | None = None,
    q_norm: Norm = None,
    k_norm: Norm = None,
    eps: float = 1e-5,
    scale: float | None = None,
    dropout_mask: Tensor | None = None,
) -> Tensor:
    """``(Q̂ K̂ᵀ W) V̂ · scale`` via the N×M matrix; ``dropout_mask (B, H, N, M)`` multiplies it.
    ``kv_pos``: the keys' coordinates (default ``pos``)."""
    kv_pos = _check(q, k, v, pos, kv_pos, weight, {"q_norm": q_norm, "k_norm": k_norm}, eps)
    q_hat = concat_pos(per_head_layer_norm(q, q_norm, eps), pos)
    k_hat = concat_pos(per_head_layer_norm(k, k_norm, eps), kv_pos)
    v_hat = concat_pos(v, kv_pos)
    scale = check_scale(scale, 1.0 / math.sqrt(q_hat.shape[-1]))
    scores = q_hat @ _weight_rows(k_hat, weight).transpose(-2, -1) * scale
    _check_mask(dropout_mask, scores.shape)
    if dropout_mask is not None:
        scores = scores * dropout_mask
    return scores @ v_hat


def normalized_attention(q: Tensor, k: Tensor, v: Tensor, *, skip: bool = False) -> Tensor:
    """GNOT's normalised linear attention as its code computes it, uniform weights and no
    coordinates: feature softmax of q and k, ``Σ_j k̃_j``, the normaliser's inverse and the
    context ``k̃ᵀ v`` by einsum, then ``q̃`` times both (plus ``q̃`` if ``skip``)."""
    check_attention_operands(q, k, v)
    q, k = q.softmax(dim=-1), k.softmax(dim=-1)
    inv = 1.0 / torch.einsum("bhnd,bhd->bhn", q, k.sum(dim=-2))
    context = torch.einsum("bhmd,bhme->bhde", k, v)
    out = torch.einsum("bhnd,bhde,bhn->bhne", q, context, inv)
    return out + q if skip else out


def gnot_forward(model: GNOT, x: Tensor, inputs: list[Tensor],
                 theta: Tensor | None = None) -> Tensor:
    """GNOT's forward as its reference code computes it (SPEC-gnot §2, ``ffn_norm="post"``,
    ``theta_mode="query"``, ``gate="mlp"``), with ``model``'s parameters: every point of every
    sample is a key with the same weight, padded or not (the reference has no masks).

    ``x (B, N, query_dim)``, ``inputs`` ``[(B, M_l, b_l)]``, ``theta (B, p)`` → ``(B, N, out)``.
    """

    # the configuration of the reference code, fixed here rather than read from the model's
    # layers, which an oracle must not echo
    # (one expert has no gate, whichever kind the model was given)
    blocks: Any = model.blocks
    if (model.act, model.theta_mode) != ("gelu", "query") or (
            model.n_experts > 1 and model.gate_mode != "mlp") or any(
            (b.ffn_norm, b.cross.reduce, b.cross.skip, b.self_attn.skip) != ("post", "sum", True,
                                                                             True)
            for b in blocks):
        raise ValueError("model: the reference forward is the reference code's configuration: "
                         "act='gelu', theta_mode='query', gate='mlp', ffn_norm='post', "
                         "reduce='sum', skip terms in the cross- and self-attention "
                         "(self_skip=True)")

    # (the sub-modules are read by attribute name: Any, which their nn.ModuleList hides anyway)
    def mlp(net: Any, h: Tensor) -> Tensor:
        h = F.gelu(net.lift(h))
        for layer in net.hidden:
            h = F.gelu(layer(h)) + h
        return net.out(h)

    def heads(t: Tensor, n_head: int) -> Tensor:
        b, n, c = t.shape
        return t.reshape(b, n, n_head, c // n_head).permute(0, 2, 1, 3)

    def attention(layer: Any, h: Tensor, ys: list[Tensor]) -> Tensor:
        n_head = layer.n_head
        q = heads(layer.query(h), n_head)
        out = q.softmax(dim=-1)  # the skip term, in cross- and self-attention
        for key, value, y in zip(layer.keys, layer.values, ys, strict=True):
            out = out + normalized_attention(q, heads(key(y), n_head), heads(value(y), n_head))
        b, _, n, _ = out.shape
        return layer.out(out.permute(0, 2, 1, 3).reshape(b, n, -1))

    def mixture(ffn: Any, h: Tensor, probs: Tensor | None) -> Tensor:
        outs = [expert[2](F.gelu(expert[0](h))) for expert in ffn.experts]
        if probs is None:
            return outs[0]
        return sum(probs[..., k, None] * o for k, o in enumerate(outs))

    if theta is not None:
        x = torch.cat([x, theta[:, None, :].expand(-1, x.shape[1], -1)], dim=-1)
    coords = x[..., :model.space_dim]
    h = mlp(model.trunk, x)
    ys = [mlp(branch, y) for branch, y in zip(model.branches, inputs, strict=True)]
    for i, block in enumerate(blocks):
        probs = None
        if model.gates is not None:
            probs = cast("GeometricGate", model.gates[i]).net(coords).softmax(dim=-1)
        normed = [norm(y) for norm, y in zip(block.norm_inputs, ys, strict=True)]
        h = h + attention(block.cross, block.norm_query(h), normed)
        h = h + block.norm_ffn1(mixture(block.ffn1, h, probs))
        s = block.norm_self(h)
        h = h + attention(block.self_attn, s, [s])
        h = h + block.norm_ffn2(mixture(block.ffn2, h, probs))
    return mlp(model.decoder, h)
