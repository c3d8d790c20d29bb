"""Plain-PyTorch formulas of the attention family, for layers where no compiled op applies.

Public (``__all__``), each checking its arguments as the ops do:

* :func:`kv_reduce`, :func:`q_apply` — the op core's two halves (``S = K̂ᵀ W V̂``, then ``Q̂ S``
  with or without normalisers), twins of the compiled ops ``torch.ops.galerkin_ext.kv_reduce``
  and ``q_apply`` with the same signatures, so compositions take either;
* :func:`normalized_attention` — GNOT's normalised linear attention (SPEC §2b, SPEC-gnot §1);
* :func:`hetero_normalized_attention` — its heterogeneous form over several input functions.

Shared with :mod:`galerkin_ext.ops` and the layers, which call them with arguments they have
checked (the checks themselves are in ``_checks``): :func:`kernel_attention` (the Galerkin and
Fourier types' formula, for the autodiff modes the compiled op lacks and for devices without
its kernels; :func:`galerkin_ext.ops.kernel_attention` is its checked form), the row maps
:func:`row_map`, :func:`per_head_layer_norm`, :func:`concat_pos`, and :func:`resolve_kv_pos`,
:func:`normalized_core`.

The factored and normalised forms cost O((N + M) d d_v) per head: the key side is reduced to
``S`` first, and no ``N × M`` matrix is formed. Padding is weight 0; a sample never depends on its
batch mates, and one whose weights are all 0 gets exactly 0 from a normalised input, with zero
gradients (``0/0 := 0``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ._checks import (
    check_attention_operands,
    check_bool,
    check_choice,
    check_kv_reduce,
    check_pos,
    check_q_apply,
    check_quadrature_weight,
)

__all__ = ["hetero_normalized_attention", "kv_reduce", "normalized_attention", "q_apply"]

Norm = tuple[Tensor, Tensor] | None


def per_head_layer_norm(x: Tensor, norm: Norm, eps: float) -> Tensor:
    """Layer norm over the features of ``x (B, H, N, D)`` with head ``h``'s affine
    ``(weight[h], bias[h])``, ``weight, bias (H, D)``; ``norm=None`` is the identity."""
    if norm is None:
        return x
    weight, bias = norm
    # Half types in float32, as F.layer_norm and the CUDA rows do: rsqrt's derivative at a
    # small variance, ~0.5 (var + eps)^-1.5, overflows float16 (NaN gradients at the models'
    # initialisation).
    work = _opmath(x)
    # As the compiled rows do (csrc/attention/norm_stats.h): rows above 1 in magnitude are
    # divided by their largest |x| first, so that no square overflows (float32 rows of 1e20),
    # with eps scaled to match; exact, since a layer norm ignores its input's scale but for eps.
    scale = work.detach().abs().amax(dim=-1, keepdim=True).clamp_min(1.0)
    xs = work / scale
    centred = xs - xs.mean(dim=-1, keepdim=True)
    denominator = centred.square().mean(dim=-1, keepdim=True) + eps / scale.square()
    # (0 only for a constant row whose eps / scale² underflowed: its centred values are 0)
    rstd = torch.rsqrt(torch.where(denominator > 0, denominator, torch.ones_like(denominator)))
    return (centred * rstd * weight[:, None] + bias[:, None]).to(x.dtype)


def concat_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    """``[pos | x]`` in every head: ``x (B, H, n, D)``, ``pos (B, n, P)`` or ``(n, P)``."""
    if pos is None:
        return x
    batch, heads, n, _ = x.shape
    pos = pos.expand(batch, n, pos.shape[-1])[:, None].expand(batch, heads, n, -1)
    return torch.cat([pos, x], dim=-1)


def row_map(x: Tensor, pos: Tensor | None, kind: str, norm: Norm, eps: float) -> Tensor:
    """A prepared operand: ``[pos | x]`` (``"identity"``), ``[pos | LN(x)]`` (``"layer_norm"``
    with head ``h``'s affine ``norm``) or ``softmax([pos | x])`` over the features
    (``"softmax"``)."""
    if kind == "softmax":
        return torch.softmax(concat_pos(x, pos), dim=-1)
    return concat_pos(per_head_layer_norm(x, norm if kind == "layer_norm" else None, eps), pos)


def norm_map(norm: Norm) -> str:
    """The row map of a Galerkin/Fourier operand: a layer norm where one is given."""
    return "identity" if norm is None else "layer_norm"


def opmath_dtype(t: Tensor) -> torch.dtype:
    """The dtype ``S`` is accumulated in: float64 for float64 inputs, else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _opmath(t: Tensor) -> Tensor:
    return t.to(opmath_dtype(t))


def kv_reduce(
    k: Tensor,
    v: Tensor,
    *,
    kv_pos: Tensor | None,
    weight: Tensor | None,
    k_map: str,
    k_norm: Norm,
    v_map: str,
    v_norm: Norm,
    eps: float,
    ones_column: bool,
) -> Tensor:
    """The key-side reduction ``S = K̂ᵀ W V̂``, ``(B, H, P + D_k, P + D_v [+ 1])`` in float32
    (float64 for float64 inputs).

    ``K̂``, ``V̂`` are :func:`row_map` of ``k (B, H, M, D_k)``, ``v (B, H, M, D_v)`` with
    ``kv_pos``; ``W`` the weights ``(B, M)`` or ``(M,)`` (uniform ``1/M`` for ``None``);
    ``ones_column`` appends a column of ones to ``V̂``, so ``S``'s last column is the normaliser
    ``s = Σ_j w_j k̂_j``.
    """
    check_kv_reduce(k, v, kv_pos, weight, k_map, k_norm, v_map, v_norm, eps, ones_column)
    return _kv_reduce(k, v, kv_pos=kv_pos, weight=weight, k_map=k_map, k_norm=k_norm,
                      v_map=v_map, v_norm=v_norm, eps=eps, ones_column=ones_column)


def _kv_reduce(k: Tensor, v: Tensor, *, kv_pos: Tensor | None, weight: Tensor | None,
               k_map: str, k_norm: Norm, v_map: str, v_norm: Norm, eps: float,
               ones_column: bool) -> Tensor:
    """:func:`kv_reduce` on checked arguments (the attention functions check theirs once)."""
    batch, _, m, _ = k.shape
    k_hat = _opmath(row_map(k, kv_pos, k_map, k_norm, eps))
    v_hat = _opmath(row_map(v, kv_pos, v_map, v_norm, eps))
    if ones_column:
        v_hat = torch.cat([v_hat, v_hat.new_ones((*v_hat.shape[:3], 1))], dim=-1)
    w = (k_hat.new_full((1, m), 1.0 / max(m, 1)) if weight is None  # M = 0: a sum of nothing
         else _opmath(weight).expand(batch, m))[:, None, :, None]
    return (k_hat * w).transpose(-2, -1) @ v_hat


def q_apply(
    q: Tensor,
    s: Tensor,
    *,
    pos: Tensor | None,
    q_map: str,
    q_norm: Norm,
    eps: float,
    normalizers: int,
    skip: bool = False,
) -> Tensor:
    """The query-side apply, in ``q``'s dtype: ``Q̂ S`` for ``normalizers=0``; otherwise ``S``'s
    columns are ``L = normalizers`` blocks ``[S_l | s_l]`` and the result is
    ``Σ_l (Q̂ S_l) / (Q̂ · s_l)`` with ``0/0 := 0``; plus ``Q̂`` itself with ``skip`` (the
    result's width must then be ``Q̂``'s). ``Q̂`` is :func:`row_map` of ``q (B, H, N, D)`` with
    ``pos``; ``s (B, H, P + D, W)``."""
    check_q_apply(q, s, pos, q_map, q_norm, eps, normalizers, skip)
    return _q_apply(q, s, pos=pos, q_map=q_map, q_norm=q_norm, eps=eps,
                    normalizers=normalizers, skip=skip)


def _q_apply(q: Tensor, s: Tensor, *, pos: Tensor | None, q_map: str, q_norm: Norm, eps: float,
             normalizers: int, skip: bool = False) -> Tensor:
    """:func:`q_apply` on checked arguments (the attention functions check theirs once)."""
    q_hat = _opmath(row_map(q, pos, q_map, q_norm, eps))
    y = q_hat @ s
    if normalizers > 0:
        y = y.unflatten(-1, (normalizers, -1))
        num, den = y[..., :-1], y[..., -1:]
        nonzero = den != 0
        y = torch.where(nonzero, num / torch.where(nonzero, den, torch.ones_like(den)),
                        torch.zeros_like(num)).sum(dim=-2)
    if skip:
        y = y + q_hat
    return y.to(q.dtype)


def kernel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None,
    kv_pos: Tensor | None,
    weight: Tensor | None,
    q_norm: Norm,
    k_norm: Norm,
    v_norm: Norm,
    eps: float,
    scale: float,
    path: str,
    dropout: Callable[[Tensor], Tensor] | None,
) -> tuple[Tensor, Tensor]:
    """The formula of :func:`galerkin_ext.ops.kernel_attention` in differentiable PyTorch (the
    op calls it, with checked arguments, where no compiled op applies).

    ``Q̂ = [pos | LN(q)]``, ``K̂, V̂ = [kv_pos | LN(·)]`` (a norm only where given);
    ``A = scale · K̂ᵀ W V̂`` and ``out = Q̂ A`` (``"factored"``) or ``A = scale · Q̂ K̂ᵀ W`` and
    ``out = A V̂`` (``"quadratic"``); ``dropout``, when given, is applied to ``A`` (the op's
    inverted dropout).
    Returns ``(out, A)``: ``out`` in ``q``'s dtype, ``A`` in the opmath dtype (float32 for half
    types), in which both paths compute: the quadratic path's products too, as cuBLAS would
    otherwise be allowed to reduce half-precision products in half under ATen's default flags.
    """
    if path == "factored":
        return factored_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=weight,
                                  q_norm=q_norm, k_norm=k_norm, v_norm=v_norm, eps=eps,
                                  scale=scale, dropout=dropout,
                                  kv_reduce_fn=_kv_reduce, q_apply_fn=_q_apply)
    q_hat, k_hat, v_hat = quadratic_operands(q, k, v, pos=pos, kv_pos=kv_pos, weight=weight,
                                             q_norm=q_norm, k_norm=k_norm, v_norm=v_norm,
                                             eps=eps, scale=scale)
    attn = q_hat @ k_hat.transpose(-2, -1)
    if dropout is not None:
        attn = dropout(attn)
    return (attn @ v_hat).to(q.dtype), attn


def quadratic_operands(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None,
    kv_pos: Tensor | None,
    weight: Tensor | None,
    q_norm: Norm,
    k_norm: Norm,
    v_norm: Norm,
    eps: float,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """The quadratic path's operands in the opmath dtype: ``Q̂`` ``(B, H, N, P + D)``, ``K̂``
    with its rows scaled by ``scale · w`` ``(B, H, M, P + D)`` and ``V̂`` ``(B, H, M, P + D_v)``,
    so that ``Q̂ K̂ᵀ`` is ``A = scale · Q̂ K̂ᵀ W`` (the weights on the ``M`` key rows rather than
    on the ``N × M`` matrix: no pass over it, forward or backward)."""
    # (ignores: mypy cannot follow that each item keeps its None-ness through the generators)
    q, k, v, pos, kv_pos, weight = (None if t is None else _opmath(t)  # type: ignore[assignment]
                                    for t in (q, k, v, pos, kv_pos, weight))
    q_norm, k_norm, v_norm = (None if n is None  # type: ignore[assignment]
                              else tuple(_opmath(p) for p in n)
                              for n in (q_norm, k_norm, v_norm))
    q_hat = row_map(q, pos, norm_map(q_norm), q_norm, eps)
    k_hat = row_map(k, kv_pos, norm_map(k_norm), k_norm, eps)
    v_hat = row_map(v, kv_pos, norm_map(v_norm), v_norm, eps)
    batch, _, m, _ = k.shape
    w = k.new_full((1, m), scale / m) if weight is None else scale * weight.expand(batch, m)
    return q_hat, k_hat * w[:, None, :, None], v_hat


def factored_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None,
    kv_pos: Tensor | None,
    weight: Tensor | None,
    q_norm: Norm,
    k_norm: Norm,
    v_norm: Norm,
    eps: float,
    scale: float,
    dropout: Callable[[Tensor], Tensor] | None,
    kv_reduce_fn: Callable[..., Tensor],
    q_apply_fn: Callable[..., Tensor],
) -> tuple[Tensor, Tensor]:
    """``out = Q̂ A`` with ``A = dropout(scale · S)``, ``S = K̂ᵀ W V̂``, composed from a key-side
    reduction and a query-side apply with the signatures of :func:`kv_reduce` and
    :func:`q_apply` (these formulas or the compiled ops). Returns ``(out, A)``, ``A`` in the
    opmath dtype (float32 for half types) in which ``S`` is accumulated."""
    attn = kv_reduce_fn(k, v, kv_pos=kv_pos, weight=weight, k_map=norm_map(k_norm),
                        k_norm=k_norm, v_map=norm_map(v_norm), v_norm=v_norm, eps=eps,
                        ones_column=False)
    if scale != 1.0:
        attn = attn * scale
    if dropout is not None:
        attn = dropout(attn)
    out = q_apply_fn(q, attn, pos=pos, q_map=norm_map(q_norm), q_norm=q_norm, eps=eps,
                     normalizers=0)
    return out, attn


def resolve_kv_pos(pos: Tensor | None, kv_pos: Tensor | None, q: Tensor, k: Tensor,
                   name: str = "kv_pos") -> Tensor | None:
    """The keys' coordinates, checked with the queries' (SPEC §2b): ``kv_pos``, or ``pos`` when
    ``M == N``; required when ``M != N`` and ``pos`` is given; as many coordinates as ``pos``."""
    n, m = q.shape[2], k.shape[2]
    check_pos(pos, q, "pos", "N")
    if kv_pos is None and pos is not None:
        if m != n:
            raise ValueError(f"{name}: required when M != N and pos is given (M = {m}, N = {n})")
        return pos
    check_pos(kv_pos, k, name, "M")
    p = 0 if pos is None else pos.shape[-1]
    p_kv = 0 if kv_pos is None else kv_pos.shape[-1]
    if p != p_kv:
        raise ValueError(f"{name}: expected {p} coordinates like pos, got {p_kv}")
    return kv_pos


def log_weight_bias(weight: Tensor, batch: int, m: int) -> tuple[Tensor, Tensor]:
    """Quadrature weights ``(B, M)`` or ``(M,)`` as the additive logit bias of softmax attention,
    ``log(w / max_j w)`` of shape ``(B, M)``, and ``has_keys (B, 1)``: whether a sample has any
    key. Constant weights give an exact zero bias; ``w_j = 0`` gives ``-inf`` (key removed) with
    a finite gradient; a sample without keys gets a zero bias, and its output must be zeroed
    with ``has_keys``. The ratio is formed in float64: a float32 ratio below 1.2e-38 (weights
    38 decades apart) was clamped there, or rounded to 0, which removed a weighted key."""
    w = weight.expand(batch, m)
    top = w.amax(dim=1, keepdim=True)
    has_keys = top > 0
    ratio = w.double() / torch.where(has_keys, top, torch.ones_like(top)).double()
    # the clamp keeps log's gradient finite where the bias is -inf
    bias = torch.where(ratio > 0, ratio.clamp_min(torch.finfo(ratio.dtype).tiny).log(),
                       torch.full_like(ratio, -math.inf)).to(w.dtype)
    return torch.where(has_keys, bias, torch.zeros_like(bias)), has_keys


def unit_weights(weight: Tensor | None, batch: int, m: int) -> Tensor | None:
    """Key weights scaled to sum 1 per sample (0 where they sum to 0) for the normalised forms,
    where only their ratios matter: the sums stay bounded. ``None`` stays uniform. Divided by
    their largest first: float32 weights of 1e38 sum to inf, and w / inf read as "no keys"
    (a zero output). The result does not depend on that divisor, so no gradient flows to it."""
    if weight is None:
        return None
    weight = weight.expand(batch, m)
    top = weight.detach().amax(dim=1, keepdim=True)
    weight = weight / torch.where(top > 0, top, torch.ones_like(top))
    total = weight.sum(dim=1, keepdim=True)  # in [1, m] where a weight is > 0
    return torch.where(total > 0, weight / torch.where(total > 0, total, torch.ones_like(total)),
                       torch.zeros_like(weight))


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
    return normalized_core(q, [k], [v], pos=pos, kv_pos=[kv_pos], weights=[weight],
                           reduce="sum", skip=skip, hetero=False, kv_reduce_fn=_kv_reduce,
                           q_apply_fn=_q_apply)


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
    return normalized_core(q, ks, vs, pos=pos, kv_pos=kv_pos, weights=weights, reduce=reduce,
                           skip=skip, hetero=True, kv_reduce_fn=_kv_reduce, q_apply_fn=_q_apply)


def normalized_core(
    q: Tensor,
    ks: Sequence[Tensor],
    vs: Sequence[Tensor],
    *,
    pos: Tensor | None,
    kv_pos: Sequence[Tensor | None] | None,
    weights: Sequence[Tensor | None] | None,
    reduce: str,
    skip: bool,
    hetero: bool,
    kv_reduce_fn: Callable[..., Tensor],
    q_apply_fn: Callable[..., Tensor],
    sharded: bool = False,
) -> Tensor:
    """The normalised forms, single (``hetero=False``: one input, messages name ``k``, ``v``,
    ``kv_pos``, ``weight``) and heterogeneous (messages name ``ks[i]``, …): checks the arguments,
    then composes a key-side reduction and a query-side apply with the signatures of
    :func:`kv_reduce` and :func:`q_apply` (these formulas or the compiled ops): one
    ``[S_l | s_l]`` block per input, then one apply with ``L`` normalisers.

    ``sharded``: the points are one process's shard of the sample's
    (:mod:`galerkin_ext.domain`, whose ``q_apply_fn`` sums ``S`` over the shards): a shard may
    hold none, and the weights go to ``kv_reduce_fn`` as given (``None`` included), since a
    shard cannot scale them by the sample's total."""
    ks, vs, kv_pos, weights = _input_lists(ks, vs, kv_pos, weights)
    check_choice(reduce, "reduce", ("sum", "mean"))
    check_bool(skip, "skip")
    resolved = []  # every argument is checked before any work
    for i, (k, v, k_pos, w) in enumerate(zip(ks, vs, kv_pos, weights, strict=True)):
        k_name, v_name, pos_name, w_name = ((f"ks[{i}]", f"vs[{i}]", f"kv_pos[{i}]",
                                             f"weights[{i}]") if hetero
                                            else ("k", "v", "kv_pos", "weight"))
        batch, _, _, m, dv = check_attention_operands(q, k, v, k_name, v_name,
                                                      allow_empty=sharded)
        if dv != vs[0].shape[3]:
            raise ValueError(f"{v_name}: expected D_v = {vs[0].shape[3]} like the first input "
                             f"(the inputs' terms are summed), got {dv}")
        if w is not None:
            check_quadrature_weight(w, batch, m, k, k_name, axis="M", name=w_name)
        resolved.append((resolve_kv_pos(pos, k_pos, q, k, pos_name),
                         w if sharded else unit_weights(w, batch, m)))
    if skip and vs[0].shape[3] != q.shape[3]:
        raise ValueError(f"skip: needs D_v == D (the output's width P + D_v equals q̃'s P + D), "
                         f"got D_v = {vs[0].shape[3]}, D = {q.shape[3]}")
    blocks = [kv_reduce_fn(k, v, kv_pos=k_pos, weight=w, k_map="softmax", k_norm=None,
                           v_map="identity", v_norm=None, eps=0.0, ones_column=True)
              for k, v, (k_pos, w) in zip(ks, vs, resolved, strict=True)]
    s = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-1)
    if reduce == "mean":  # 1/L on each block's numerator columns, before the skip term is added
        numerators = torch.ones(s.shape[-1] // len(blocks), dtype=s.dtype, device=s.device)
        numerators[-1] = len(blocks)
        s = s * (numerators / len(blocks)).repeat(len(blocks))
    return q_apply_fn(q, s, pos=pos, q_map="softmax", q_norm=None, eps=0.0,
                      normalizers=len(blocks), skip=skip)


def _input_lists(
    ks: Sequence[Tensor],
    vs: Sequence[Tensor],
    kv_pos: Sequence[Tensor | None] | None,
    weights: Sequence[Tensor | None] | None,
) -> tuple[list[Tensor], list[Tensor], list[Tensor | None], list[Tensor | None]]:
    """The per-input arguments as lists, one entry per input (checked)."""
    if isinstance(ks, Tensor) or isinstance(vs, Tensor) or not isinstance(
        ks, Sequence
    ) or not isinstance(vs, Sequence) or len(ks) == 0 or len(ks) != len(vs):
        raise TypeError("ks, vs: expected two non-empty sequences of tensors of equal length")
    n_inputs = len(ks)
    for name, seq in (("kv_pos", kv_pos), ("weights", weights)):
        # a tensor would be split along its batch axis as if it were one entry per input
        if seq is not None and (isinstance(seq, Tensor) or not isinstance(seq, Sequence)):
            raise TypeError(f"{name}: expected None or a sequence of {n_inputs} entries (one "
                            f"per input, each a tensor or None), got {type(seq).__name__}")
    kv_pos = [None] * n_inputs if kv_pos is None else list(kv_pos)
    weights = [None] * n_inputs if weights is None else list(weights)
    for name, seq in (("kv_pos", kv_pos), ("weights", weights)):
        if len(seq) != n_inputs:
            raise ValueError(f"{name}: expected {n_inputs} entries (one per input), got "
                             f"{len(seq)}")
    return list(ks), list(vs), kv_pos, weights
