"""Fourier- and Galerkin-type attention as compiled PyTorch ops.

Shapes: ``q, k, v (B, H, N, D)``; ``pos (B, N, P)`` or ``(N, P)`` concatenated in front of every
head after the norm, so outputs are ``(B, H, N, D + P)``; ``weight (B, N)`` or ``(N,)``
quadrature weights on the key/value side of the sum over points (default uniform ``1/N``; zero
masks a point out); a norm is ``None`` or a ``(weight, bias)`` pair of shape ``(H, D)``, one
affine layer norm per head over ``D``.

The C++/CUDA op ``torch.ops.galerkin_ext.attention_forward`` does the fused per-head norm,
coordinate concatenation and weighting and the batched GEMMs; ``attention_backward`` is its
compiled backward. This module adds input validation, dropout masks, autograd and fake kernels.

``continuum_attention`` (softmax attention with quadrature weights on ``M`` keys, for the
continuum-attention operators) is pairwise and runs on ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import _C, functional
from ._checks import (
    check_attention_operands,
    check_choice,
    check_float,
    check_like,
    check_probability,
    check_quadrature_weight,
)

Norm = tuple[Tensor, Tensor] | None

_CPU_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Read once: a call into the extension inside traced code would break torch.compile's graph.
_CUDA_BUILT = bool(_C.cuda_built())


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
    weight: Tensor | None = None,
    k_norm: Norm = None,
    v_norm: Norm = None,
    eps: float = 1e-5,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Galerkin-type attention ``Q̂ (K̂ᵀ W V̂)``, ``K̂ = [pos | LN_k(k)]``, ``V̂ = [pos | LN_v(v)]``.

    Cost O(N d²). ``dropout_p`` drops entries of the ``d × d`` matrix ``K̂ᵀ W V̂`` when
    ``training``. Returns ``(B, H, N, D + P)``.
    """
    _check_dropout(dropout_p, training)
    out, _ = kernel_attention(
        q, k, v, pos=pos, weight=weight, k_norm=k_norm, v_norm=v_norm, eps=eps, scale=1.0,
        path="factored", dropout_p=dropout_p if training else 0.0,
    )
    return out


def fourier_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    weight: Tensor | None = None,
    q_norm: Norm = None,
    k_norm: Norm = None,
    eps: float = 1e-5,
    scale: float | None = None,
    path: str = "auto",
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Fourier-type attention ``(Q̂ K̂ᵀ W) V̂ · scale`` with ``Q̂ = [pos | LN_q(q)]``,
    ``K̂ = [pos | LN_k(k)]``, ``V̂ = [pos | v]``.

    ``scale=None`` means ``1/sqrt(D + P)``. Without softmax the product reassociates exactly, so
    ``path="factored"`` computes ``Q̂ (K̂ᵀ W V̂)`` in O(N d²) and ``path="quadratic"``
    materialises the ``N × N`` matrix (needed for dropout on it). ``"auto"`` takes the factored
    path unless dropout is active. Returns ``(B, H, N, D + P)``.
    """
    _check_dropout(dropout_p, training)
    check_choice(path, "path", ("auto", "factored", "quadratic"))
    dropout_active = training and dropout_p > 0.0
    if path == "factored" and dropout_active:
        raise ValueError(
            "path: dropout on the N×N attention matrix needs path='quadratic' (or 'auto'), "
            "got path='factored' with training=True and dropout_p > 0"
        )
    out, _ = kernel_attention(
        q, k, v, pos=pos, weight=weight, q_norm=q_norm, k_norm=k_norm, eps=eps, scale=scale,
        path="quadratic" if path == "quadratic" or dropout_active else "factored",
        dropout_p=dropout_p if dropout_active else 0.0,
    )
    return out


def kernel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    weight: Tensor | None = None,
    q_norm: Norm = None,
    k_norm: Norm = None,
    v_norm: Norm = None,
    eps: float = 1e-5,
    scale: float | None = None,
    path: str = "factored",
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Softmax-free kernel attention, the general op behind the Galerkin and Fourier types;
    also returns the attention matrix.

    With ``Q̂, K̂, V̂ = [pos | LN(·)]`` (a norm only where given) it computes
    ``out = Q̂ A`` with ``A = scale · K̂ᵀ W V̂`` of shape ``(B, H, d, d)`` (``path="factored"``),
    or ``out = A V̂`` with ``A = scale · Q̂ K̂ᵀ W`` of shape ``(B, H, N, N)``
    (``path="quadratic"``).
    ``dropout_p > 0`` applies inverted dropout to ``A`` (always: callers decide on training).
    ``scale=None`` means ``1/sqrt(D + P)``. Returns ``(out (B, H, N, d), A)``; ``A`` is
    differentiable too, for losses or visualisation.
    """
    # (autocast exists for CPU and CUDA only: meta tensors, e.g., go straight to the op)
    if isinstance(q, Tensor) and q.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(
        q.device.type
    ):
        q, k, v, pos, weight, q_norm, k_norm, v_norm = _autocast(
            q, k, v, pos, weight, q_norm, k_norm, v_norm)
    _check_inputs(q, k, v, pos, weight, eps)
    q_norm = _check_norm(q_norm, "q_norm", q)
    k_norm = _check_norm(k_norm, "k_norm", q)
    v_norm = _check_norm(v_norm, "v_norm", q)
    check_probability(dropout_p, "dropout_p")
    quadratic = check_choice(path, "path", ("factored", "quadratic")) == "quadratic"
    batch, heads, n, dim = q.shape
    width = dim + (pos.shape[-1] if pos is not None else 0)
    if scale is None:
        scale = 1.0 / math.sqrt(width)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(
        scale
    ):
        raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
    mask = None
    if dropout_p > 0.0:
        side = n if quadratic else width
        keep = 1.0 - dropout_p
        mask = torch.empty((batch, heads, side, side), dtype=q.dtype, device=q.device)
        mask = mask.bernoulli_(keep).div_(keep)
    if _autodiff_beyond_the_op():
        return functional.kernel_attention(
            q, k, v, pos=pos, weight=weight, q_norm=q_norm, k_norm=k_norm, v_norm=v_norm,
            eps=float(eps), scale=float(scale), path=path, dropout_mask=mask)
    out, attn, *_ = torch.ops.galerkin_ext.attention_forward(
        q, k, v, pos, weight, *_norm_pair(q_norm), *_norm_pair(k_norm), *_norm_pair(v_norm),
        mask, float(eps), float(scale), bool(quadratic),
    )
    return out, attn


def continuum_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    weight: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> Tensor:
    """Continuum (softmax) attention with quadrature weights on the keys:
    ``z_t = Σ_j w_j exp(scale q_t·k_j) v_j / Σ_j w_j exp(scale q_t·k_j)``.

    The quadrature of the continuum-attention operator (SPEC-continuum §1): on a non-uniform
    grid or mesh, ``weight`` (e.g. :mod:`galerkin_ext.quadrature`) makes it converge to the
    integral instead of over-counting densely sampled regions.  Computed by
    ``scaled_dot_product_attention`` with ``log(w / max_j w)`` as an additive key bias, so only
    the weights' ratios matter, ``w_j = 0`` removes key ``j`` exactly, and constant weights give
    plain softmax attention (``weight=None`` is exactly ``F.scaled_dot_product_attention``).

    Args:
        q: ``(B, H, N, D)`` queries.
        k: ``(B, H, M, D)`` keys, ``M`` independent of ``N`` (cross-attention).
        v: ``(B, H, M, D_v)`` values.
        weight: ``(B, M)`` or ``(M,)`` finite non-negative quadrature weights, or ``None``
            (uniform).
        scale: the logits' factor, ``None`` for ``1/sqrt(D)``.
        dropout_p, training: dropout of the attention probabilities, when ``training``.

    Returns:
        ``(B, H, N, D_v)``.  A batch element whose weights are all 0 has no keys: its output is
        0, with zero gradients.  Gradients with respect to ``weight`` are exact where
        ``w > 0`` and 0 for removed keys.
    """
    batch, _, _, m, _ = check_attention_operands(q, k, v)
    dim = q.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(
        scale
    ):
        raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
    _check_dropout(dropout_p, training)
    p = dropout_p if training else 0.0
    if weight is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                                                scale=float(scale))
    check_quadrature_weight(weight, batch, m, k, "k", axis="M")
    w = weight.expand(batch, m)
    top = w.amax(dim=1, keepdim=True)
    has_keys = top > 0
    # log(w / max w): 0 for the largest weight, so constant weights add an exact zero bias;
    # the clamp keeps log's gradient finite where the bias is -inf (removed keys).
    ratio = w / torch.where(has_keys, top, torch.ones_like(top))
    bias = torch.where(ratio > 0, ratio.clamp_min(torch.finfo(w.dtype).tiny).log(),
                       torch.full_like(ratio, -math.inf))
    bias = torch.where(has_keys, bias, torch.zeros_like(bias))  # no keys: finite, zeroed below
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=bias[:, None, None, :].to(q.dtype), dropout_p=p, scale=float(scale))
    return out * has_keys[:, :, None, None].to(out.dtype)


def _autocast(q, k, v, pos, weight, *norms):
    """Under autocast the op runs like a matmul: in the autocast dtype on CUDA (statistics and
    accumulation stay float32 inside), in float32 on CPU, where the kernels have no half types.
    Norm parameters, kept float32 by the user's model, are cast along with the activations."""
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if device == "cuda" else torch.float32

    def cast(t):
        if isinstance(t, Tensor) and t.is_floating_point():
            return t.to(dtype)
        if isinstance(t, (tuple, list)):
            return tuple(cast(p) for p in t)
        return t

    with torch.autocast(device, enabled=False):
        return tuple(cast(t) for t in (q, k, v, pos, weight, *norms))


# ----------------------------------------------------------------------------------------------
# Validation: every message names the argument and what was expected.


def _check_dropout(dropout_p: float, training: bool) -> None:
    """The public functions' dropout arguments (p is checked even when not training)."""
    check_probability(dropout_p, "dropout_p")
    if not isinstance(training, bool):
        raise TypeError(f"training: expected a bool, got {type(training).__name__}")


def _check_norm(norm: Norm, name: str, q: Tensor) -> Norm:
    if norm is None:
        return None
    if not isinstance(norm, (tuple, list)) or len(norm) != 2:
        raise TypeError(f"{name}: expected None or a (weight, bias) pair of tensors, got {norm!r}")
    heads, dim = q.shape[1], q.shape[3]
    for i, p in enumerate(norm):
        if not isinstance(p, Tensor):
            raise TypeError(f"{name}[{i}]: expected a tensor, got {type(p).__name__}")
        check_like(p, f"{name}[{i}]", q)
        if p.shape != (heads, dim):
            raise ValueError(
                f"{name}[{i}]: expected shape (H, D) = ({heads}, {dim}), got {tuple(p.shape)}"
            )
    return norm[0], norm[1]


def _check_inputs(
    q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None, weight: Tensor | None, eps: float
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected shape (B, H, N, D), got {tuple(t.shape)}")
    allowed = _CPU_DTYPES if q.device.type == "cpu" else _CUDA_DTYPES
    if q.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"q: expected dtype {names} on {q.device.type}, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        check_like(t, name, q)
        if t.shape != q.shape:
            raise ValueError(
                f"{name}: expected shape (B, H, N, D) = {tuple(q.shape)} like q, "
                f"got {tuple(t.shape)}"
            )
    if q.device.type == "cuda" and not _CUDA_BUILT:
        raise RuntimeError("q: CUDA tensor given but galerkin_ext was built without CUDA")
    batch, heads, n, dim = q.shape
    if n == 0:
        raise ValueError("q: expected at least one point (N >= 1), got N = 0")
    if dim == 0:
        raise ValueError("q: expected at least one feature per head (D >= 1), got D = 0")
    if pos is not None:
        if not isinstance(pos, Tensor):
            raise TypeError(f"pos: expected a tensor or None, got {type(pos).__name__}")
        check_like(pos, "pos", q)
        batched = pos.dim() == 3 and pos.shape[:2] == (batch, n)
        if not (batched or (pos.dim() == 2 and pos.shape[0] == n)):
            raise ValueError(
                f"pos: expected shape (B, N, P) = ({batch}, {n}, P) or (N, P) = ({n}, P), "
                f"got {tuple(pos.shape)}"
            )
    if weight is not None:
        check_quadrature_weight(weight, batch, n, q)
    check_float(eps, "eps")


def _norm_pair(norm: Norm) -> tuple[Tensor | None, Tensor | None]:
    return (None, None) if norm is None else norm


# ----------------------------------------------------------------------------------------------
# Autograd and fake (meta) kernels of the compiled ops


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, eps, scale, quadratic = inputs
    _out, attn = output
    # The inputs, not the prepared operands: the backward recomputes those (cheaper than memory).
    ctx.save_for_backward(q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, attn)
    ctx.eps, ctx.scale, ctx.quadratic = eps, scale, quadratic
    ctx.set_materialize_grads(False)


def _autodiff_beyond_the_op() -> bool:
    """Forward-mode AD (dual tensors) or a ``torch.func`` transform is active: the compiled op
    has neither a forward derivative nor functorch rules, so the plain formula runs instead."""
    if torch.compiler.is_compiling():
        return False
    return forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def _backward(ctx, grad_out, grad_attn):
    if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
        return _differentiable_backward(ctx, grad_out, grad_attn)
    q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, attn = ctx.saved_tensors
    if grad_out is None:  # only the attention matrix was used
        width = q.shape[-1] + (pos.shape[-1] if pos is not None else 0)
        grad_out = q.new_zeros((*q.shape[:3], width))
    needs = ctx.needs_input_grad
    grads = torch.ops.galerkin_ext.attention_backward(
        grad_out, grad_attn, q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, attn,
        ctx.eps, ctx.scale, ctx.quadratic, pos is not None and needs[3],
        weight is not None and needs[4],
    )
    present = (True, True, True, pos is not None and needs[3], weight is not None and needs[4],
               qnw is not None, qnb is not None, knw is not None, knb is not None,
               vnw is not None, vnb is not None)
    return (*(g if ok else None for g, ok in zip(grads, present, strict=True)),
            None, None, None, None)


def _differentiable_backward(ctx, grad_out, grad_attn):
    """The gradients as a differentiable function of the inputs (for second-order derivatives,
    ``create_graph=True``): the plain formula, recomputed and differentiated by autograd."""
    q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, _attn = ctx.saved_tensors
    inputs = (q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb)
    out, attn = functional.kernel_attention(
        q, k, v, pos=pos, weight=weight, q_norm=None if qnw is None else (qnw, qnb),
        k_norm=None if knw is None else (knw, knb), v_norm=None if vnw is None else (vnw, vnb),
        eps=ctx.eps, scale=ctx.scale, path="quadratic" if ctx.quadratic else "factored",
        dropout_mask=mask)
    pairs = [(o, g) for o, g in ((out, grad_out), (attn, grad_attn)) if g is not None]
    wanted = [i for i, t in enumerate(inputs) if t is not None and ctx.needs_input_grad[i]]
    grads = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                [g for _, g in pairs], create_graph=True, allow_unused=True)
    result: list[Tensor | None] = [None] * 15
    for i, g in zip(wanted, grads, strict=True):
        result[i] = g
    return tuple(result)


torch.library.register_autograd(
    "galerkin_ext::attention_forward", _backward, setup_context=_setup_context
)


def _padded_width(d):
    """Row length of the op's internal operands: mirrors padded_width() in attention.h (opcheck
    compares these fake kernels with the real ones, so the two cannot drift apart unnoticed)."""
    up = (d + 7) // 8 * 8
    return up if (up - d) * 8 <= d else d


@torch.library.register_fake("galerkin_ext::attention_forward")
def _attention_forward_fake(q, k, v, pos, weight, qnw, qnb, knw, knb, vnw, vnb, mask, eps,
                            scale, quadratic):
    batch, heads, n, dim = q.shape
    width = dim + (pos.shape[-1] if pos is not None else 0)
    side = n if quadratic else width
    return q.new_empty((batch, heads, n, width)), q.new_empty((batch, heads, side, side))


@torch.library.register_fake("galerkin_ext::attention_backward")
def _attention_backward_fake(grad_out, grad_attn, q, k, v, pos, weight, qnw, qnb, knw, knb, vnw,
                             vnb, mask, attn, eps, scale, quadratic, pos_grad, weight_grad):
    empty = q.new_empty((0,))
    heads, dim = q.shape[1], q.shape[3]
    norm_grads = []
    for norm_weight in (qnw, knw, vnw):
        shape = (heads, dim) if norm_weight is not None else (0,)
        norm_grads += [q.new_empty(shape), q.new_empty(shape)]
    coordinates = pos.shape[-1] if pos is not None else 0
    width = dim + coordinates
    fused = q.device.type == "cpu" or _C.linear_cuda_fits(width, coordinates)
    if not quadratic and fused:  # the fused paths write them dense
        qkv = [q.new_empty(q.shape) for _ in range(3)]
    else:  # views (B, H, N, D) of the padded operand gradients, formed in place there
        batch, n = q.shape[0], q.shape[2]
        buffer = (batch, heads, n, _padded_width(width))
        qkv = [q.new_empty(buffer)[..., width - dim:width] for _ in range(3)]
    return [*qkv,
            q.new_empty(pos.shape) if pos_grad else empty,
            q.new_empty(weight.shape) if weight_grad else empty, *norm_grads]
