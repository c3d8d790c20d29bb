"""The attention family as compiled PyTorch ops (SPEC §2, §2b).

Shapes: queries ``q (B, H, N, D)`` with coordinates ``pos (B, N, P)`` or ``(N, P)``; keys and
values ``k (B, H, M, D)``, ``v (B, H, M, D_v)`` with ``kv_pos (B, M, P)`` or ``(M, P)`` (default
``pos`` when ``M == N``) and quadrature ``weight (B, M)`` or ``(M,)`` on the sum over keys
(default uniform ``1/M``; zero masks a key out; the Galerkin and Fourier outputs are linear in
it, so a padded sample's valid keys need weights of the same total, e.g. ``1/M_valid``); a
norm is ``None`` or a ``(weight, bias)`` pair of shape ``(H, D)`` (``(H, D_v)`` for the values'
``v_norm``), one affine layer norm per head. Coordinates go in front of every head after the
norm, so outputs are ``(B, H, N, P + D_v)``.

The op core (``csrc/attention/core.h``) is two compiled ops with compiled backwards, each with
a CPU and a CUDA twin: ``torch.ops.galerkin_ext.kv_reduce`` builds ``S = K̂ᵀ W V̂`` and
``q_apply`` applies it to ``Q̂``, each forming its prepared operands in cache (CPU) or registers
(CUDA), never in memory. Galerkin, factored Fourier and GNOT's normalised attention are
compositions of the two. The quadratic Fourier order and ``continuum_attention`` are pairwise:
where they drop entries of their ``N × M`` matrix on the CPU, each runs as one compiled op that
never stores it, ``torch.ops.galerkin_ext.quadratic_attention`` and ``softmax_attention``
(``csrc/attention/quadratic_cpu.cpp``, ``softmax_cpu.cpp``); else on ATen (the latter on
SDPA), as does ``patched_attention`` (patch functions as tokens, SPEC-continuum §1.2: two
batched GEMMs). This module adds input validation, dropout masks,
fake kernels and the formula backwards of second-order gradients (the ops' autograd is C++,
``csrc/attention/autograd.cpp``). Where the compiled core does not run (CPU half types, CUDA rows
wider than ``_C.cuda_max_width``, forward-mode and ``torch.func`` autodiff), the plain formulas
of :mod:`galerkin_ext.functional` compute the same.

:func:`dropout`, the layers' dropout and the fused ops' mask, is a compiled CPU op too
(``torch.ops.galerkin_ext.dropout``, ``csrc/dropout/``): its mask is a function of a seed and of
each element's place in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import NamedTuple, cast

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import functional
from ._checks import (
    check_attention_operands,
    check_bool,
    check_cell_weight,
    check_choice,
    check_has_keys,
    check_kv_reduce,
    check_norm,
    check_norm_eps,
    check_patched_operands,
    check_probability,
    check_q_apply,
    check_quadrature_weight,
    check_scale,
)
from ._extension import load_extension

__all__ = ["continuum_attention", "cuda_built", "dropout", "fourier_attention",
           "galerkin_attention", "hetero_normalized_attention", "kernel_attention", "kv_reduce",
           "normalized_attention", "patched_attention", "q_apply"]

Norm = tuple[Tensor, Tensor] | None

_C = load_extension()

# Read once: a call into the extension inside traced code would break torch.compile's graph.
_CUDA_BUILT = bool(_C.cuda_built())
_CUDA_MAX_WIDTH = int(_C.cuda_max_width)
_CUDA_MAX_COORDINATES = int(_C.cuda_max_coordinates)
_CUDA_MAX_BATCH_HEADS = int(_C.cuda_max_batch_heads)
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def cuda_built() -> bool:
    """Whether the extension was compiled with its CUDA kernels."""
    return _CUDA_BUILT


# ----------------------------------------------------------------------------------------------
# Public functions


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
    dropout_p: float = 0.0,
) -> Tensor:
    """Galerkin-type attention ``Q̂ (K̂ᵀ W V̂)`` with ``Q̂ = [pos | q]``,
    ``K̂ = [kv_pos | LN_k(k)]``, ``V̂ = [kv_pos | LN_v(v)]``.

    Cost O((N + M) d d_v). ``dropout_p > 0`` drops entries of the ``d × d_v`` matrix
    ``K̂ᵀ W V̂`` on every call, as in ``F.scaled_dot_product_attention``: a module passes
    ``dropout_p`` only in training. Returns ``(B, H, N, P + D_v)``; the shapes of the
    arguments, the norms and the weights: the module doc.
    """
    out, _ = kernel_attention(
        q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, k_norm=k_norm, v_norm=v_norm, eps=eps,
        scale=1.0, path="factored", dropout_p=dropout_p,
    )
    return out


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
    path: str = "auto",
    dropout_p: float = 0.0,
) -> Tensor:
    """Fourier-type attention ``(Q̂ K̂ᵀ W) V̂ · scale`` with ``Q̂ = [pos | LN_q(q)]``,
    ``K̂ = [kv_pos | LN_k(k)]``, ``V̂ = [kv_pos | v]``.

    ``scale=None`` means ``1/sqrt(D + P)``. Without softmax the product reassociates exactly, so
    ``path="factored"`` computes ``Q̂ (K̂ᵀ W V̂)`` in O((N + M) d²) and ``path="quadratic"``
    evaluates ``(Q̂ K̂ᵀ W) V̂`` through the ``N × M`` matrix (needed for dropout on it:
    ``dropout_p > 0`` drops its entries on every call, as in ``F.scaled_dot_product_attention``,
    with :func:`dropout`'s masks). With dropout on the CPU that order is one fused op,
    ``torch.ops.galerkin_ext.quadratic_attention``, which never stores the matrix (forward and
    backward regenerate its blocks); elsewhere, and under forward-mode AD or ``torch.func``, the
    matrix is formed. ``"auto"`` takes the factored path unless ``dropout_p > 0``. Returns
    ``(B, H, N, P + D_v)``; the shapes of the arguments, the norms and the weights: the module
    doc.
    """
    dropout_p = check_probability(dropout_p, "dropout_p")
    check_choice(path, "path", ("auto", "factored", "quadratic"))
    if path == "factored" and dropout_p > 0.0:
        raise ValueError(
            "path: dropout on the N×M attention matrix needs path='quadratic' (or 'auto'), "
            f"got path='factored' with dropout_p={dropout_p}"
        )
    a = kernel_arguments(q, k, v, pos, kv_pos, weight, q_norm, k_norm, None, eps, scale,
                         dropout_p)
    if dropout_p > 0.0 and a.q.device.type == "cpu" and not _autodiff_beyond_the_op():
        return _fused_quadratic_attention(a)
    out, _ = _kernel_attention(a, quadratic=path == "quadratic" or dropout_p > 0.0,
                               torch_masks=False)
    return out


def _fused_quadratic_attention(a: KernelArguments) -> Tensor:
    """``(Q̂ K̂ᵀ W) V̂ · scale`` with :func:`dropout`'s mask on the ``N × M`` matrix, by the fused
    CPU op (checked arguments)."""
    with _own_precision(a.q):
        q_hat, k_hat, v_hat = functional.quadratic_operands(
            a.q, a.k, a.v, pos=a.pos, kv_pos=a.kv_pos, weight=a.weight, q_norm=a.q_norm,
            k_norm=a.k_norm, v_norm=a.v_norm, eps=a.eps, scale=a.scale)
        out = torch.ops.galerkin_ext.quadratic_attention(q_hat, k_hat, v_hat, a.dropout_p,
                                                         _draw_seed())
    return out.to(a.q.dtype)


class KernelArguments(NamedTuple):
    """:func:`kernel_attention`'s arguments after autocast and the checks (``eps`` a float,
    ``scale`` resolved, ``kv_pos`` resolved), and the sizes they imply: ``n``, ``m`` query and
    key points, ``attn_shape`` that of ``A``, ``(B, H, P + D, P + D_v)``."""

    q: Tensor
    k: Tensor
    v: Tensor
    pos: Tensor | None
    kv_pos: Tensor | None
    weight: Tensor | None
    q_norm: Norm
    k_norm: Norm
    v_norm: Norm
    eps: float
    scale: float
    dropout_p: float
    batch: int
    heads: int
    n: int
    m: int
    attn_shape: tuple[int, int, int, int]


def kernel_arguments(q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None,
                     kv_pos: Tensor | None, weight: Tensor | None, q_norm: Norm, k_norm: Norm,
                     v_norm: Norm, eps: float, scale: float | None, dropout_p: float, *,
                     allow_empty: bool = False) -> KernelArguments:
    """The one place :func:`kernel_attention` and its domain-parallel form
    (:func:`galerkin_ext.domain.kernel_attention`, ``allow_empty=True``: a shard may hold no
    points) apply the op's autocast policy and check their arguments."""
    if under_autocast(q):
        q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm = _autocast(
            q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm)
    batch, heads, n, m, dim_v = check_attention_operands(q, k, v, allow_empty=allow_empty)
    kv_pos = functional.resolve_kv_pos(pos, kv_pos, q, k)
    if weight is not None:
        check_quadrature_weight(weight, batch, m, k, "k", axis="M")
    q_norm = check_norm(q_norm, "q_norm", q)
    k_norm = check_norm(k_norm, "k_norm", q)
    v_norm = check_norm(v_norm, "v_norm", v, "v")
    eps = check_norm_eps(eps)
    dropout_p = check_probability(dropout_p, "dropout_p")
    coordinates = pos.shape[-1] if pos is not None else 0
    width = q.shape[3] + coordinates
    scale = check_scale(scale, 1.0 / math.sqrt(width))
    return KernelArguments(q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm, eps, scale,
                           dropout_p, batch, heads, n, m,
                           (batch, heads, width, coordinates + dim_v))


def kernel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    weight: Tensor | None = None,
    q_norm: Norm = None,
    k_norm: Norm = None,
    v_norm: Norm = None,
    eps: float = 1e-5,
    scale: float | None = None,
    path: str = "factored",
    dropout_p: float = 0.0,
    torch_masks: bool = False,
) -> tuple[Tensor, Tensor]:
    """Softmax-free kernel attention, the general op behind the Galerkin and Fourier types;
    also returns the attention matrix.

    With ``Q̂ = [pos | LN(q)]``, ``K̂, V̂ = [kv_pos | LN(·)]`` (a norm only where given) it
    computes ``out = Q̂ A`` with ``A = scale · K̂ᵀ W V̂`` of shape ``(B, H, P + D, P + D_v)``
    (``path="factored"``), or ``out = A V̂`` with ``A = scale · Q̂ K̂ᵀ W`` of shape
    ``(B, H, N, M)`` (``path="quadratic"``). ``dropout_p > 0`` applies inverted dropout to ``A``
    (always: callers decide on training): the factored path's ``d × d_v`` mask from torch's
    generator, the quadratic path's ``N × M`` one by :func:`dropout` (on the CPU the compiled
    op, which stores no mask), or by torch's dropout with ``torch_masks=True`` (the original
    code's masks from the same seed). ``scale=None`` means ``1/sqrt(D + P)``. Returns
    ``(out (B, H, N, P + D_v), A)``; ``A`` is differentiable too, for losses or visualisation,
    and is in the dtype the products accumulate in (float32 for half types).
    """
    a = kernel_arguments(q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm, eps, scale,
                         dropout_p)
    quadratic = check_choice(path, "path", ("factored", "quadratic")) == "quadratic"
    check_bool(torch_masks, "torch_masks")
    return _kernel_attention(a, quadratic, torch_masks)


def _kernel_attention(a: KernelArguments, quadratic: bool,
                      torch_masks: bool) -> tuple[Tensor, Tensor]:
    """:func:`kernel_attention` on checked arguments, through the ``N × M`` matrix where
    ``quadratic``."""
    q, k, v, pos, kv_pos, weight = a.q, a.k, a.v, a.pos, a.kv_pos, a.weight
    q_norm, k_norm, v_norm, eps, scale, dropout_p = (a.q_norm, a.k_norm, a.v_norm, a.eps,
                                                     a.scale, a.dropout_p)
    drop: Callable[[Tensor], Tensor] | None = None
    if dropout_p > 0.0 and quadratic:
        drop = partial(torch.nn.functional.dropout if torch_masks else dropout, p=dropout_p,
                       training=True)
    elif dropout_p > 0.0:
        # 1 / keep unrounded, as A is; drawn as the domain-parallel form draws it
        mask = dropout_mask(a.attn_shape, dropout_p, functional.opmath_dtype(q), q.device)
        drop = mask.mul
    with _own_precision(q):
        if quadratic:
            return functional.kernel_attention(
                q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, q_norm=q_norm, k_norm=k_norm,
                v_norm=v_norm, eps=eps, scale=scale, path="quadratic", dropout=drop)
        return functional.factored_attention(
            q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, q_norm=q_norm, k_norm=k_norm,
            v_norm=v_norm, eps=eps, scale=scale, dropout=drop, kv_reduce_fn=_kv_reduce,
            q_apply_fn=_q_apply)


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
    """GNOT's normalised linear attention,
    ``z_t = σ q̃_t + Σ_j w_j (q̃_t·k̃_j) v̂_j / Σ_j w_j (q̃_t·k̃_j)``, on the compiled core.

    ``q̃ = softmax([pos | q])`` and ``k̃ = softmax([kv_pos | k])`` over the head's features (the
    coordinates join the features before the softmax, as GNOT does with its per-head features),
    ``v̂ = [kv_pos | v]``, ``σ = 1`` if ``skip``. The normaliser comes from the same reduction
    (a column of ones appended to ``V̂``). Only the weights' ratios matter; ``w_j = 0`` removes
    key ``j``; a sample without keys gets 0, with zero gradients. So does a query whose every
    product ``q̃_t·k̃_j`` underflows to 0, which takes features whose logits within a row differ
    by more than about 87 (float32; 708 in float64): the formula's 0/0 (the original codes give
    NaN) has no value without log-space sums. Before that, the output stays within float32's
    rounding to spreads of about 82 (86 with a few keys; with 4096 keys 2.5e-5 relative at 84,
    1e-4 at 86), and its gradients, which pass through ``g / Σ_j w_j q̃_t·k̃_j``, overflow once
    that sum nears float32's smallest normal number, 1.2e-38 (a spread near 85). Arguments and
    result as
    :func:`galerkin_ext.functional.normalized_attention`: ``(B, H, N, P + D_v)``.
    """
    if under_autocast(q):
        q, k, v, pos, kv_pos, weight, *_ = _autocast(q, k, v, pos, kv_pos, weight, None, None,
                                                     None)
    with _own_precision(q):
        return functional.normalized_core(
            q, [k], [v], pos=pos, kv_pos=[kv_pos], weights=[weight], reduce="sum", skip=skip,
            hetero=False, kv_reduce_fn=_kv_reduce, q_apply_fn=_q_apply)


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
    """Normalised attention over ``L`` input functions, each with its own normaliser,
    ``z_t = σ q̃_t + c Σ_l (q̃_t S_l) / (q̃_t · s_l)`` (SPEC-gnot §1), on the compiled core:
    one ``kv_reduce`` per input, one ``q_apply`` for all. Arguments and result as
    :func:`galerkin_ext.functional.hetero_normalized_attention`.
    """
    if under_autocast(q):  # (the sequences come back as tuples; they are checked after)
        q, ks, vs, pos, kv_pos, weights, *_ = _autocast(q, ks, vs, pos, kv_pos, weights, None,
                                                        None, None)
    with _own_precision(q):
        return functional.normalized_core(
            q, ks, vs, pos=pos, kv_pos=kv_pos, weights=weights, reduce=reduce, skip=skip,
            hetero=True, kv_reduce_fn=_kv_reduce, q_apply_fn=_q_apply)


# ----------------------------------------------------------------------------------------------
# The op core: kv_reduce and q_apply


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
    """``S = K̂ᵀ W V̂`` (as :func:`galerkin_ext.functional.kv_reduce`): the compiled op where it
    runs, else the formula."""
    check_kv_reduce(k, v, kv_pos, weight, k_map, k_norm, v_map, v_norm, eps, ones_column)
    return _kv_reduce(k, v, kv_pos=kv_pos, weight=weight, k_map=k_map, k_norm=k_norm,
                      v_map=v_map, v_norm=v_norm, eps=eps, ones_column=ones_column)


def _kv_reduce(k: Tensor, v: Tensor, *, kv_pos: Tensor | None, weight: Tensor | None,
               k_map: str, k_norm: Norm, v_map: str, v_norm: Norm, eps: float,
               ones_column: bool) -> Tensor:
    """:func:`kv_reduce` on checked arguments (the attention functions check theirs once)."""
    coordinates = kv_pos.shape[-1] if kv_pos is not None else 0
    widths = (coordinates + k.shape[3], coordinates + v.shape[3] + int(ones_column))
    if not _compiled_core(k, widths, coordinates):
        return functional._kv_reduce(k, v, kv_pos=kv_pos, weight=weight, k_map=k_map,
                                     k_norm=k_norm, v_map=v_map, v_norm=v_norm, eps=eps,
                                     ones_column=ones_column)
    return torch.ops.galerkin_ext.kv_reduce(k, v, kv_pos, weight, k_map, *_norm_pair(k_norm),
                                            v_map, *_norm_pair(v_norm), eps, ones_column)


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
    """``Q̂ S``, or ``Σ_l (Q̂ S_l) / (Q̂ · s_l)`` over ``normalizers`` blocks, plus ``Q̂`` with
    ``skip`` (as :func:`galerkin_ext.functional.q_apply`): the compiled op where it runs, else
    the formula."""
    check_q_apply(q, s, pos, q_map, q_norm, eps, normalizers, skip)
    return _q_apply(q, s, pos=pos, q_map=q_map, q_norm=q_norm, eps=eps,
                    normalizers=normalizers, skip=skip)


def _q_apply(q: Tensor, s: Tensor, *, pos: Tensor | None, q_map: str, q_norm: Norm, eps: float,
             normalizers: int, skip: bool = False) -> Tensor:
    """:func:`q_apply` on checked arguments (the attention functions check theirs once)."""
    coordinates = pos.shape[-1] if pos is not None else 0
    if not _compiled_core(q, (coordinates + q.shape[3], s.shape[3]), coordinates):
        return functional._q_apply(q, s, pos=pos, q_map=q_map, q_norm=q_norm, eps=eps,
                                   normalizers=normalizers, skip=skip)
    return torch.ops.galerkin_ext.q_apply(q, pos, q_map, *_norm_pair(q_norm), s, eps,
                                          normalizers, skip)


def _compiled_core(x: Tensor, widths: tuple[int, int], coordinates: int) -> bool:
    """Whether the compiled kv_reduce/q_apply run, under plain reverse-mode autograd: on CPU
    float32/float64 tensors; on CUDA, where the kernels were built, within their limits: rows
    and ``S`` sides of ``widths`` up to ``_C.cuda_max_width``, ``coordinates`` up to
    ``_C.cuda_max_coordinates``, ``B·H`` up to ``_C.cuda_max_batch_heads``."""
    if _autodiff_beyond_the_op():
        return False
    if x.device.type in ("cpu", "meta"):
        return x.dtype in (torch.float32, torch.float64)
    return (x.device.type == "cuda" and _CUDA_BUILT and x.dtype in _CUDA_DTYPES
            and max(widths) <= _CUDA_MAX_WIDTH and coordinates <= _CUDA_MAX_COORDINATES
            and x.shape[0] * x.shape[1] <= _CUDA_MAX_BATCH_HEADS)


def continuum_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    weight: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    torch_masks: bool = False,
) -> Tensor:
    """Continuum (softmax) attention with quadrature weights on the keys:
    ``z_t = Σ_j w_j exp(scale q_t·k_j) v_j / Σ_j w_j exp(scale q_t·k_j)``.

    The quadrature of the continuum-attention operator (SPEC-continuum §1): on a non-uniform
    grid or mesh, ``weight`` (e.g. :mod:`galerkin_ext.quadrature`) makes it converge to the
    integral instead of over-counting densely sampled regions. The weights enter as the additive
    key bias ``log(w / max_j w)``, so only their ratios matter, ``w_j = 0`` removes key ``j``
    exactly, and constant weights give plain softmax attention (``weight=None`` is exactly
    ``F.scaled_dot_product_attention``).

    Under CPU autocast it runs in float32 and returns float32, as the other ops on the CPU (on
    CUDA, SDPA takes the autocast dtype). Computed by ``scaled_dot_product_attention``, except
    with dropout on CPU float32 and float64 tensors (outside forward-mode AD and
    ``torch.func``; without ``torch_masks``):
    there SDPA leaves its fused kernel for one that stores the ``N × M`` matrix and draws torch's
    mask element by element, so one fused op, ``torch.ops.galerkin_ext.softmax_attention``
    (``csrc/attention/softmax_cpu.cpp``), forms the matrix block by block in cache, drops its
    probabilities with :func:`dropout`'s mask and keeps only each row's log-sum-exp for the
    backward.

    Args:
        q: ``(B, H, N, D)`` queries.
        k: ``(B, H, M, D)`` keys, ``M`` independent of ``N`` (cross-attention).
        v: ``(B, H, M, D_v)`` values.
        weight: ``(B, M)`` or ``(M,)`` finite non-negative quadrature weights, or ``None``
            (uniform).
        scale: the logits' factor, ``None`` for ``1/sqrt(D)``.
        dropout_p: dropout of the attention probabilities, on every call where ``> 0`` (as in
            ``F.scaled_dot_product_attention``: a module passes it only in training).
        torch_masks: drop through SDPA with torch's masks on the CPU too (the Galerkin
            Transformer's reference mode repeats the original code's seeded masks).

    Returns:
        ``(B, H, N, D_v)``.  Gradients with respect to ``weight`` are exact where ``w > 0`` and
        0 for removed keys.  Forward mode (``torch.func.jvp``, dual tensors) and ``torch.func``
        transforms run on PyTorch's math kernel; second-order gradients need it too: compute
        the forward under ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` (SDPA's fused
        kernels have no double backward; the fused dropout op has one).

    Raises:
        ValueError: naming ``weight`` where a batch element has no key of positive weight (its
            attention is undefined). That check reads the weights, so it is skipped while
            tracing or capturing a CUDA graph; such an element then gives 0.
    """
    batch, _, _, m, _ = check_attention_operands(q, k, v)
    if q.device.type == "cpu" and under_autocast(q):  # (SDPA would run in bfloat16 there)
        with torch.autocast("cpu", enabled=False):
            return continuum_attention(q.float(), k.float(), v.float(), weight=weight,
                                       scale=scale, dropout_p=dropout_p, torch_masks=torch_masks)
    dim = q.shape[3]
    scale = check_scale(scale, 1.0 / math.sqrt(dim))
    dropout_p = check_probability(dropout_p, "dropout_p")
    check_bool(torch_masks, "torch_masks")
    bias, has_keys = None, None
    if weight is not None:
        check_quadrature_weight(weight, batch, m, k, "k", axis="M")
        check_has_keys(weight, batch, m)
        bias, has_keys = functional.log_weight_bias(weight, batch, m)
        bias = bias.to(q.dtype)
    if (dropout_p > 0.0 and not torch_masks and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.float64) and not _autodiff_beyond_the_op()):
        out, _ = torch.ops.galerkin_ext.softmax_attention(q, k, v, bias, scale, dropout_p,
                                                          _draw_seed())
    else:
        mask = None if bias is None else bias[:, None, None, :]
        # The fused kernels have no forward derivative and no functorch rules; the math one
        # has (otherwise the user's choice of kernels, e.g. sdpa_kernel for second-order
        # gradients).
        with sdpa_kernel(SDPBackend.MATH) if _autodiff_beyond_the_op() else nullcontext():
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out if has_keys is None else out * has_keys[:, :, None, None].to(out.dtype)


def patched_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cell_weight: float | Tensor,
    *,
    scale: float = 1.0,
) -> Tensor:
    """Patched softmax attention (SPEC-continuum §1.2): tokens are patch functions compared by
    the L²(D′) inner product of the patch,

        S_jk = scale Σ_m ω_m Σ_c Q_{j,m,c} K_{k,m,c},    Z_{j,m,:} = Σ_k softmax_k(S_jk) V_{k,m,:}.

    Every patch holds the same ``n`` in-patch points with cell volumes ``ω_m``, so ``S`` is a
    quadrature of ``∫_{D′} ⟨Q_j(y), K_k(y)⟩ dy`` and converges under refinement with the number
    of patches fixed, provided ``ω`` follows the grid (``|D| / N_total`` on a uniform grid): it
    sits inside the exponential, so unlike :func:`continuum_attention`'s key weights its overall
    scale matters.

    Computed as two batched GEMMs on the flattened ``n · D`` features, ``(B·H, P, n·D)`` against
    ``(B·H, O, n·D)``, never through ``scaled_dot_product_attention``, whose fused kernels cap
    the head dimension far below ``n · D`` (32² · 16 = 16384 in the paper). A tensor ``ω``
    multiplies the smaller of ``q`` and ``k``, a float ``ω`` (and ``scale``) the ``P × O``
    logits. For float16/bfloat16 inputs the logits and the softmax are float32, since a sum of
    ``n · D`` products can overflow float16; the probabilities are then cast to ``v``'s dtype
    for the second GEMM (a convex combination of ``v``, which cannot overflow). Under autocast
    the op keeps its operands' dtypes (the projections before it are where autocast acts).

    Args:
        q: ``(B, H, P, n, D)`` query patches.
        k: ``(B, H, O, n, D)`` key patches, ``O`` independent of ``P`` (patched
            cross-attention over a domain cut into congruent patches of the same points).
        v: ``(B, H, O, n, D_v)`` value patches.
        cell_weight: ``ω``, a positive float or 0-d tensor (one cell volume for every point),
            or an ``(n,)`` tensor of finite non-negative volumes (dtype of ``q``, or float32
            for half ``q``).
        scale: the logits' factor ``s`` (the paper: 1); ``None`` also means 1.

    Returns:
        ``(B, H, P, n, D_v)`` in ``q``'s dtype. Differentiable in ``q``, ``k``, ``v`` and a
        tensor ``cell_weight``.
    """
    batch, heads, p, o, n, dim, dim_v = check_patched_operands(q, k, v)
    omega = check_cell_weight(cell_weight, n, q)
    factor: float | Tensor = check_scale(scale, 1.0)  # (times a 0-d tensor omega below)
    device = q.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        # Autocast would run the logits GEMM in half precision again: the operands (already
        # in the dtype of the projections that made them) are taken as they are.
        with torch.autocast(device, enabled=False):
            return patched_attention(q, k, v, cell_weight, scale=scale)
    # Half types: a float32 logits GEMM (no overflow of the n·D-term sums) and softmax.
    logit_dtype = functional.opmath_dtype(q)
    qf, kf = q.to(logit_dtype), k.to(logit_dtype)
    if isinstance(omega, Tensor) and omega.dim() == 1:
        w = omega.to(logit_dtype)[:, None]  # (n, 1): the same volume for every feature
        if p <= o:
            qf = qf * w
        else:
            kf = kf * w
    else:  # one volume: a float, or a 0-d tensor
        factor = factor * omega
    logits = torch.bmm(qf.reshape(batch * heads, p, n * dim),
                       kf.reshape(batch * heads, o, n * dim).transpose(1, 2)) * factor
    probs = torch.softmax(logits, dim=-1).to(v.dtype)
    out = torch.bmm(probs, v.reshape(batch * heads, o, n * dim_v))
    return out.view(batch, heads, p, n, dim_v)


def _cast(dtype: torch.dtype, *items):
    """``items`` with each floating tensor, also inside a norm pair, in ``dtype``; anything else
    as it is (the argument checks come after)."""
    def one(t):
        if isinstance(t, Tensor) and t.is_floating_point():
            return t.to(dtype)
        if isinstance(t, (tuple, list)):
            return tuple(one(p) for p in t)
        return t

    return tuple(one(t) for t in items)


def under_autocast(x: object) -> bool:
    """Whether autocast applies to ``x``: it is on for ``x``'s device (it exists for CPU and
    CUDA only: meta tensors, e.g., go straight to the op) and ``x`` is not float64, which
    autocast leaves alone (``q @ k.mT`` of float64 tensors stays float64 under it)."""
    return (isinstance(x, Tensor) and x.device.type in ("cpu", "cuda")
            and x.dtype != torch.float64 and torch.is_autocast_enabled(x.device.type))


def _autocast(q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm):
    """Under autocast the op runs like a matmul: on CUDA the activations and coordinates in the
    autocast dtype (statistics and accumulation stay float32 inside) while the quadrature weight
    and the norm parameters stay float32 (their gradients are not rounded, and weights below
    2^-14 are not subnormal); on CPU, where the kernels have no half types, all in float32."""
    device = q.device.type
    low = torch.get_autocast_dtype(device) if device == "cuda" else torch.float32
    with torch.autocast(device, enabled=False):
        return (*_cast(low, q, k, v, pos, kv_pos),
                *_cast(torch.float32, weight, q_norm, k_norm, v_norm))


def dropout_mask(shape: tuple[int, ...], dropout_p: float, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
    """Inverted dropout's mask: 0 with probability ``dropout_p``, else ``1 / (1 - dropout_p)``.
    Drawn out of place: ``torch.func.vmap(randomness="different")`` refuses an in-place draw
    into a tensor it does not batch (an ensemble's members each get their own mask)."""
    keep = 1.0 - dropout_p
    return torch.bernoulli(torch.full(shape, keep, dtype=dtype, device=device)).div_(keep)


def _own_precision(x: Tensor):
    """Autocast off inside an op that has applied :func:`_autocast`: its formulas' products
    would otherwise run in the autocast dtype (on the CPU the quadratic path's in bfloat16 while
    the factored path's compiled kernels ran in float32, both returning float32)."""
    return torch.autocast(x.device.type, enabled=False) if under_autocast(x) else nullcontext()


def _norm_pair(norm: Norm) -> tuple[Tensor | None, Tensor | None]:
    return (None, None) if norm is None else norm


def _draw_seed() -> Tensor:
    """The compiled ops' mask seed, a 0-dim int64 tensor from torch's default generator (so
    ``torch.manual_seed`` repeats the masks)."""
    return torch.randint(2**62, (), dtype=torch.int64, device="cpu")  # (not a default device's)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: each element of ``x`` zeroed with probability ``p``, the others
    multiplied by ``1 / (1 - p)``; ``x`` itself when not ``training`` or when ``p = 0``.

    On CPU float32 and float64 tensors the mask comes from ``torch.ops.galerkin_ext.dropout``: a
    counter-based generator (Threefry-2x32-20) keyed by a seed drawn from torch's default
    generator, so ``torch.manual_seed`` repeats it; the backward regenerates the mask instead of
    storing it. It costs a fraction of torch's CPU dropout, whose mask is drawn element by element
    (``benchmarks/dropout_cpu.py``). Elsewhere (CUDA, half types, forward-mode AD, ``torch.func``
    transforms) torch's dropout runs: the two draw different masks of the same distribution.

    Args:
        x: any shape, a floating dtype.
        p: the probability of zeroing an element, in ``[0, 1)``.
        training: drop only when true, as ``F.dropout``.

    Returns:
        ``x``'s shape and dtype, laid out as ``torch.empty_like(x)``: as ``x`` when dense.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x: expected a floating-point tensor, got {got}")
    p = check_probability(p, "p")
    check_bool(training, "training")
    if not training or p == 0.0:
        return x
    if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64)
            or _autodiff_beyond_the_op()):
        return torch.nn.functional.dropout(x, p, training=True)
    return torch.ops.galerkin_ext.dropout(x, p, _draw_seed())


# ----------------------------------------------------------------------------------------------
# Second-order gradients and fake (meta) kernels of the compiled ops


def _autodiff_beyond_the_op() -> bool:
    """Forward-mode AD (dual tensors) or a ``torch.func`` transform is active: the compiled op
    has neither a forward derivative nor functorch rules, so the plain formula runs instead
    (also inside ``torch.compile``, which traces a transform it compiles)."""
    return forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def _pair_or_none(weight: Tensor | None, bias: Tensor | None) -> Norm:
    # (cast: the ops check a norm's weight and bias as one pair, given together or not at all)
    return None if weight is None else (weight, cast(Tensor, bias))


def _formula_grads(formula, inputs, wanted, grad) -> list[Tensor]:
    """Gradients of ``formula(*inputs)`` against ``grad`` for each input that is given, wanted
    and requires grad, differentiable in turn under ``create_graph=True`` (plain under a vmap of
    the backward, which runs without grad mode); an empty placeholder for the rest, which the
    autograd kernel discards.

    The partial derivatives, each argument's own: the formula runs on a view of every input, and
    the gradients are taken against the views. Against the inputs themselves, autograd would also
    follow the other paths to them -- ``q_apply``'s ``s`` depends on ``pos`` through ``kv_pos``
    in self-attention, and one tensor may be both ``q`` and ``k`` -- which the engine adds again
    through the other op's own backward: those parts counted twice.
    """
    result = [inputs[0].new_empty((0,))] * len(inputs)
    targets = [i for i, t in enumerate(inputs) if t is not None and wanted[i] and t.requires_grad]
    if not targets:
        return result
    create_graph = torch.is_grad_enabled()
    with torch.enable_grad():
        views = [t if t is None or not t.requires_grad else t.view_as(t) for t in inputs]
        found = torch.autograd.grad(formula(*views), [views[i] for i in targets], grad,
                                    create_graph=create_graph, allow_unused=True)
    for i, g in zip(targets, found, strict=True):
        result[i] = torch.zeros_like(inputs[i]) if g is None else g
    return result


def _kv_reduce_backward_formula(grad_s, k, v, kv_pos, weight, k_map, knw, knb, v_map, vnw, vnb,
                                eps, ones_column, kv_pos_grad, weight_grad) -> list[Tensor]:
    def formula(k, v, kv_pos, weight, knw, knb, vnw, vnb):
        return functional._kv_reduce(
            k, v, kv_pos=kv_pos, weight=weight, k_map=k_map, k_norm=_pair_or_none(knw, knb),
            v_map=v_map, v_norm=_pair_or_none(vnw, vnb), eps=eps, ones_column=ones_column)

    return _formula_grads(formula, (k, v, kv_pos, weight, knw, knb, vnw, vnb),
                          (True, True, kv_pos_grad, weight_grad, True, True, True, True), grad_s)


def _q_apply_backward_formula(grad_out, q, pos, q_map, qnw, qnb, s, eps, normalizers, skip,
                              pos_grad) -> list[Tensor]:
    def formula(q, pos, qnw, qnb, s):
        return functional._q_apply(q, s, pos=pos, q_map=q_map, q_norm=_pair_or_none(qnw, qnb),
                                   eps=eps, normalizers=normalizers, skip=skip)

    return _formula_grads(formula, (q, pos, qnw, qnb, s), (True, pos_grad, True, True, True),
                          grad_out)


def _one_device(*tensors: Tensor | None, seed: Tensor | None = None) -> None:
    """The kernels' rule on devices, in the fakes too: torch also dispatches a call with one
    meta tensor among CPU ones to the fake, which returned uninitialised CPU memory. The
    operands share one device; a mask's seed is on the CPU or on theirs."""
    devices = {t.device for t in tensors if t is not None}
    torch._check(len(devices) == 1, lambda: "expected every tensor on one device, got "
                                            f"{sorted(map(str, devices))}")
    if seed is not None:
        torch._check(seed.device.type == "cpu" or seed.device in devices,
                     lambda: f"seed: expected a CPU tensor, got one on {seed.device}")


def _grad_like(t: Tensor | None, wanted: bool, like: Tensor) -> Tensor:
    """A gradient's fake: like ``t`` where wanted, else ``like``'s empty placeholder."""
    return t.new_empty(t.shape) if wanted and t is not None else like.new_empty((0,))


@torch.library.register_fake("galerkin_ext::dropout")
def _dropout_fake(x, p, seed):
    _one_device(x, seed=seed)
    return torch.empty_like(x)  # as the kernel


@torch.library.register_fake("galerkin_ext::quadratic_attention")
def _quadratic_attention_fake(q, k, v, p, seed):
    _one_device(q, k, v, seed=seed)
    return q.new_empty((*q.shape[:3], v.shape[3]))


@torch.library.register_fake("galerkin_ext::quadratic_attention_backward")
def _quadratic_attention_backward_fake(grad_out, q, k, v, p, seed):
    _one_device(grad_out, q, k, v, seed=seed)
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)]


def _quadratic_attention_backward_formula(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                          p: float, seed: Tensor) -> list[Tensor]:
    """The fused op's gradients through the ``N × M`` matrix, with its mask: the dropout op's
    over that matrix stored contiguously."""
    attn, grad_attn = q @ k.transpose(-2, -1), grad @ v.transpose(-2, -1)
    if p > 0.0:
        mask = torch.ops.galerkin_ext.dropout(
            torch.ones(attn.shape, dtype=attn.dtype, device=attn.device), p, seed)
        attn, grad_attn = attn * mask, grad_attn * mask
    return [grad_attn @ k, grad_attn.transpose(-2, -1) @ q, attn.transpose(-2, -1) @ grad]


@torch.library.register_fake("galerkin_ext::softmax_attention")
def _softmax_attention_fake(q, k, v, bias, scale, p, seed):
    _one_device(q, k, v, bias, seed=seed)
    return q.new_empty((*q.shape[:3], v.shape[3])), q.new_empty(q.shape[:3])


@torch.library.register_fake("galerkin_ext::softmax_attention_backward")
def _softmax_attention_backward_fake(grad_out, q, k, v, bias, out, lse, scale, p, seed):
    _one_device(grad_out, q, k, v, bias, out, lse, seed=seed)
    grads = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)]
    return [*grads, q.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)]


def _softmax_attention_backward_formula(grad: Tensor, q: Tensor, k: Tensor, v: Tensor,
                                        bias: Tensor | None, out: Tensor, lse: Tensor,
                                        scale: float, p: float, seed: Tensor) -> list[Tensor]:
    """The fused op's gradients through the ``N × M`` matrix of probabilities ``P``, with its
    mask ``D`` (the dropout op's over that matrix stored contiguously): ``dV = (P ∘ D)ᵀ dO``,
    ``dS = P ∘ (dP - Σ_j P dP)`` with ``dP = dO Vᵀ ∘ D``, ``dQ = scale dS K``,
    ``dK = scale dSᵀ Q``, ``db`` the sum of ``dS`` over heads and queries. (``out`` and
    ``lse``: the compiled backward's arguments, which the formulas recompute.)"""
    logits = scale * (q @ k.transpose(-2, -1))
    if bias is not None:
        logits = logits + bias[:, None, None, :]
    probs = logits.softmax(dim=-1)
    kept, grad_probs = probs, grad @ v.transpose(-2, -1)
    if p > 0.0:
        mask = torch.ops.galerkin_ext.dropout(
            torch.ones(probs.shape, dtype=probs.dtype, device=probs.device), p, seed)
        kept, grad_probs = probs * mask, grad_probs * mask
    grad_logits = probs * (grad_probs - (probs * grad_probs).sum(dim=-1, keepdim=True))
    grad_bias = grad_logits.sum(dim=(1, 2)) if bias is not None else q.new_empty((0,))
    return [scale * (grad_logits @ k), scale * (grad_logits.transpose(-2, -1) @ q),
            kept.transpose(-2, -1) @ grad, grad_bias]


# The ops' autograd is C++ (csrc/attention/autograd.cpp); under create_graph=True or a torch.func
# transform of the backward it calls these formula backwards, composite kernels that autograd
# differentiates through and vmap batches.
_FORMULA_BACKWARDS = torch.library.Library("galerkin_ext", "IMPL")
for _name, _formula in [("kv_reduce", _kv_reduce_backward_formula),
                        ("q_apply", _q_apply_backward_formula),
                        ("quadratic_attention", _quadratic_attention_backward_formula),
                        ("softmax_attention", _softmax_attention_backward_formula)]:
    _FORMULA_BACKWARDS.impl(f"{_name}_backward_formula", _formula, "CompositeImplicitAutograd")


@torch.library.register_fake("galerkin_ext::kv_reduce")
def _kv_reduce_fake(k, v, kv_pos, weight, k_map, knw, knb, v_map, vnw, vnb, eps, ones_column):
    _one_device(k, v, kv_pos, weight, knw, knb, vnw, vnb)
    batch, heads, _, dim_k = k.shape
    coordinates = kv_pos.shape[-1] if kv_pos is not None else 0
    width_v = coordinates + v.shape[3] + int(ones_column)
    return k.new_empty((batch, heads, coordinates + dim_k, width_v),
                       dtype=functional.opmath_dtype(k))


@torch.library.register_fake("galerkin_ext::kv_reduce_backward")
def _kv_reduce_backward_fake(grad_s, k, v, kv_pos, weight, k_map, knw, knb, v_map, vnw, vnb,
                             eps, ones_column, kv_pos_grad, weight_grad):
    _one_device(grad_s, k, v, kv_pos, weight, knw, knb, vnw, vnb)
    return [k.new_empty(k.shape), v.new_empty(v.shape), _grad_like(kv_pos, kv_pos_grad, k),
            _grad_like(weight, weight_grad, k), *(_grad_like(t, True, k)
                                                 for t in (knw, knb, vnw, vnb))]


@torch.library.register_fake("galerkin_ext::q_apply")
def _q_apply_fake(q, pos, q_map, qnw, qnb, s, eps, normalizers, skip):
    _one_device(q, pos, qnw, qnb, s)
    width = s.shape[3] if normalizers == 0 else s.shape[3] // normalizers - 1
    return q.new_empty((*q.shape[:3], width))


@torch.library.register_fake("galerkin_ext::q_apply_backward")
def _q_apply_backward_fake(grad_out, q, pos, q_map, qnw, qnb, s, eps, normalizers, skip,
                           pos_grad):
    _one_device(grad_out, q, pos, qnw, qnb, s)
    return [q.new_empty(q.shape), _grad_like(pos, pos_grad, q), _grad_like(qnw, True, q),
            _grad_like(qnb, True, q), s.new_empty(s.shape)]
