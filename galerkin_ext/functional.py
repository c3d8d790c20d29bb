"""Plain-PyTorch formulas of the attention family, for layers where no compiled op applies.

* :func:`normalized_attention` — GNOT's normalised linear attention (SPEC §2b, SPEC-gnot §1);
* :func:`hetero_normalized_attention` — its heterogeneous form over several input functions;
* :func:`kernel_attention` — the compiled op's formula, for the autodiff modes it lacks;
* :func:`per_head_layer_norm`, :func:`concat_pos` — the row maps they share with the layers.

The normalised forms cost O((N + M) D D_v) per head: the key side is reduced to
``S = Σ_j w_j k̃_j v̂_jᵀ`` and ``s = Σ_j w_j k̃_j`` first, and no ``N × M`` matrix is formed.
Padding is weight 0; a sample never depends on its batch mates, and one whose weights are all 0
gets exactly 0 from that input, with zero gradients (``0/0 := 0``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_attention_operands, check_choice, check_like, check_quadrature_weight

__all__ = ["concat_pos", "hetero_normalized_attention", "kernel_attention",
           "normalized_attention", "per_head_layer_norm"]

Norm = tuple[Tensor, Tensor] | None


def per_head_layer_norm(x: Tensor, norm: Norm, eps: float) -> Tensor:
    """Layer norm over the features of ``x (B, H, N, D)`` with head ``h``'s affine
    ``(weight[h], bias[h])``, ``weight, bias (H, D)``; ``norm=None`` is the identity."""
    if norm is None:
        return x
    weight, bias = norm
    return F.layer_norm(x, x.shape[-1:], eps=eps) * weight[:, None] + bias[:, None]


def concat_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    """``[pos | x]`` in every head: ``x (B, H, n, D)``, ``pos (B, n, P)`` or ``(n, P)``."""
    if pos is None:
        return x
    batch, heads, n, _ = x.shape
    pos = pos.expand(batch, n, pos.shape[-1])[:, None].expand(batch, heads, n, -1)
    return torch.cat([pos, x], dim=-1)


def kernel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None,
    weight: Tensor | None,
    q_norm: Norm,
    k_norm: Norm,
    v_norm: Norm,
    eps: float,
    scale: float,
    path: str,
    dropout_mask: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """The formula of :func:`galerkin_ext.ops.kernel_attention` in differentiable PyTorch, for
    what the compiled op cannot do: forward-mode and higher-order derivatives and the
    ``torch.func`` transforms (the op calls it then, with checked arguments).

    ``Q̂, K̂, V̂ = [pos | LN(·)]``; ``A = scale · K̂ᵀ W V̂`` and ``out = Q̂ A`` (``"factored"``) or
    ``A = scale · Q̂ K̂ᵀ W`` and ``out = A V̂`` (``"quadratic"``); ``A`` is multiplied by
    ``dropout_mask`` when given.  Returns ``(out, A)``.
    """
    q_hat = concat_pos(per_head_layer_norm(q, q_norm, eps), pos)
    k_hat = concat_pos(per_head_layer_norm(k, k_norm, eps), pos)
    v_hat = concat_pos(per_head_layer_norm(v, v_norm, eps), pos)
    n = k.shape[2]
    w = (torch.full((1, n), 1.0 / n, dtype=k.dtype, device=k.device) if weight is None
         else weight.expand(k.shape[0], n))[:, None, :, None]
    if path == "factored":
        attn = scale * (k_hat.transpose(-2, -1) @ (w * v_hat))
    else:
        attn = scale * (q_hat @ (w * k_hat).transpose(-2, -1))
    if dropout_mask is not None:
        attn = attn * dropout_mask
    return (q_hat @ attn if path == "factored" else attn @ v_hat), attn


def _check_pos(pos: Tensor | None, x: Tensor, name: str, points: str) -> None:
    """``pos`` fits the rows of ``x (B, H, n, D)``: ``(B, n, P)`` or ``(n, P)``, or None."""
    if pos is None:
        return
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name}: expected a tensor or None, got {type(pos).__name__}")
    check_like(pos, name, x)
    batch, _, n, _ = x.shape
    if not ((pos.dim() == 3 and pos.shape[:2] == (batch, n)) or (pos.dim() == 2
                                                                   and pos.shape[0] == n)):
        raise ValueError(f"{name}: expected shape (B, {points}, P) = ({batch}, {n}, P) or "
                         f"({points}, P) = ({n}, P), got {tuple(pos.shape)}")


def _key_side(k_tilde: Tensor, v: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(S (B, H, D, D_v), s (B, H, D))`` with the weights normalised to sum 1 per sample
    (0 where they sum to 0), so only their ratios matter and the sums stay bounded."""
    batch, _, m, _ = k_tilde.shape
    if weight is None:
        w = k_tilde.new_full((1, m), 1.0 / m)
    else:
        total = weight.expand(batch, m).sum(dim=1, keepdim=True)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        w = torch.where(total > 0, weight / safe, torch.zeros_like(weight.expand(batch, m)))
    k_weighted = k_tilde * w[:, None, :, None]
    return k_weighted.transpose(-2, -1) @ v, k_weighted.sum(dim=2)


def _apply(q_tilde: Tensor, big_s: Tensor, small_s: Tensor) -> Tensor:
    """``(q̃ S) / (q̃ · s)`` with ``0/0 := 0`` (an input without keys has ``S = 0, s = 0``)."""
    den = (q_tilde * small_s[:, :, None, :]).sum(dim=-1, keepdim=True)
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return (q_tilde @ big_s) / safe


def normalized_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    weight: Tensor | None = None,
    skip: bool = False,
) -> Tensor:
    """Normalised linear attention (GNOT):
    ``z_t = σ q̃_t + Σ_j w_j (q̃_t·k̃_j) v̂_j / Σ_j w_j (q̃_t·k̃_j)``.

    ``q̃ = softmax([pos | q])`` and ``k̃ = softmax([kv_pos | k])`` over the head's features
    (not over points; the coordinates, when given, join the features before the softmax, as
    GNOT does with its per-head features), ``v̂ = [kv_pos | v]``, ``σ = 1`` if ``skip`` else 0.

    Args:
        q: ``(B, H, N, D)``; k: ``(B, H, M, D)``; v: ``(B, H, M, D_v)``.
        pos: ``(B, N, P)`` or ``(N, P)`` query coordinates, or ``None``.
        kv_pos: ``(B, M, P)`` or ``(M, P)`` key coordinates; default ``pos`` when ``M == N``,
            required when ``M != N`` and ``pos`` is given.
        weight: ``(B, M)`` or ``(M,)`` finite non-negative key weights (default uniform); only
            their ratios matter, 0 removes a key.
        skip: add ``q̃`` (needs ``P + D_v == P + D``).

    Returns:
        ``(B, H, N, P + D_v)``.
    """
    return _normalized(q, [k], [v], pos, [kv_pos], [weight], "sum", skip,
                       lambda i: ("k", "v", "kv_pos", "weight"))


def hetero_normalized_attention(
    q: Tensor,
    ks: Sequence[Tensor],
    vs: Sequence[Tensor],
    *,
    pos: Tensor | None = None,
    kv_pos: Sequence[Tensor | None] | None = None,
    weights: Sequence[Tensor | None] | None = None,
    reduce: str = "sum",
    skip: bool = True,
) -> Tensor:
    """Normalised attention over ``L`` input functions, each with its own normaliser:
    ``z_t = σ q̃_t + c Σ_l (q̃_t S_l) / (q̃_t · s_l)`` (SPEC-gnot §1).

    ``c = 1`` for ``reduce="sum"`` (GNOT's code) or ``1/L`` for ``"mean"`` (its paper, Eq. 7);
    ``L`` is static: an input whose weights are all 0 for a sample adds 0 and still counts.

    Args:
        q: ``(B, H, N, D)``.
        ks, vs: ``L`` tensors ``(B, H, M_l, D)`` and ``(B, H, M_l, D_v)``.
        pos: ``(B, N, P)`` or ``(N, P)`` query coordinates, or ``None``.
        kv_pos: ``L`` coordinates (or ``None`` entries) of the inputs' points, as
            :func:`normalized_attention`'s ``kv_pos``.
        weights: ``L`` key weights (``None`` entries: uniform), as its ``weight``.
        reduce: ``"sum"`` or ``"mean"``.
        skip: add ``q̃`` once.

    Returns:
        ``(B, H, N, P + D_v)``.
    """
    if isinstance(ks, Tensor) or isinstance(vs, Tensor) or not isinstance(
        ks, Sequence
    ) or not isinstance(vs, Sequence) or len(ks) == 0 or len(ks) != len(vs):
        raise TypeError("ks, vs: expected two non-empty sequences of tensors of equal length")
    n_inputs = len(ks)
    kv_pos = [None] * n_inputs if kv_pos is None else list(kv_pos)
    weights = [None] * n_inputs if weights is None else list(weights)
    for name, seq in (("kv_pos", kv_pos), ("weights", weights)):
        if len(seq) != n_inputs:
            raise ValueError(f"{name}: expected {n_inputs} entries (one per input), got "
                             f"{len(seq)}")
    return _normalized(q, list(ks), list(vs), pos, kv_pos, weights, reduce, skip,
                       lambda i: (f"ks[{i}]", f"vs[{i}]", f"kv_pos[{i}]", f"weights[{i}]"))


def _normalized(
    q: Tensor,
    ks: list[Tensor],
    vs: list[Tensor],
    pos: Tensor | None,
    kv_pos: list[Tensor | None],
    weights: list[Tensor | None],
    reduce: str,
    skip: bool,
    names: Callable[[int], tuple[str, str, str, str]],
) -> Tensor:
    """Both public functions; ``names(i)`` gives input ``i``'s argument names for messages."""
    check_choice(reduce, "reduce", ("sum", "mean"))
    if not isinstance(skip, bool):
        raise TypeError(f"skip: expected a bool, got {skip!r}")
    q_hat = out = None
    for i, (k, v, k_pos, w) in enumerate(zip(ks, vs, kv_pos, weights, strict=True)):
        k_name, v_name, pos_name, w_name = names(i)
        batch, _, n, m, _ = check_attention_operands(q, k, v, k_name, v_name)
        if k_pos is None and pos is not None:
            if m != n:
                raise ValueError(f"{pos_name}: required when M != N and pos is given (M = {m}, "
                                 f"N = {n})")
            k_pos = pos
        if q_hat is None:
            _check_pos(pos, q, "pos", "N")
            q_hat = torch.softmax(concat_pos(q, pos), dim=-1)
        _check_pos(k_pos, k, pos_name, "M")
        k_hat = concat_pos(k, k_pos)
        if k_hat.shape[-1] != q_hat.shape[-1]:
            raise ValueError(f"{pos_name}: expected {q_hat.shape[-1] - q.shape[-1]} coordinates "
                             f"like pos, got {k_hat.shape[-1] - k.shape[-1]}")
        if w is not None:
            check_quadrature_weight(w, batch, m, k, k_name, axis="M", name=w_name)
        big_s, small_s = _key_side(torch.softmax(k_hat, dim=-1), concat_pos(v, k_pos), w)
        term = _apply(q_hat, big_s, small_s)
        out = term if out is None else out + term
    assert out is not None and q_hat is not None
    if reduce == "mean":
        out = out / len(ks)
    if skip:
        if q_hat.shape != out.shape:
            raise ValueError(f"skip: needs D_v == D (the output's width {out.shape[-1]} equals "
                             f"q̃'s {q_hat.shape[-1]})")
        out = out + q_hat
    return out
