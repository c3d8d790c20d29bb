"""Continuum attention layers (SPEC-continuum §1.1, §2): the Transformer Neural Operator's
multi-head attention and post-LN encoder layer, and quadrature weights derived from coordinates.

Shapes are channels-last token sequences: ``x (B, N, d_model)`` at points with coordinates
``coords (N, d)`` or ``(B, N, d)``; keys and values may sit at another point set
``context (B, M, d_model)`` (cross-attention) with their own weights ``(M,)`` or ``(B, M)``.

Each head computes ``z_i = Σ_j w_j e^{s q_i·k_j} v_j / Σ_l w_l e^{s q_i·k_l}``
(:func:`galerkin_ext.ops.continuum_attention`), the quadrature of the integral operator
``∫ p(y; u, x) V u(y) dy``: with weights that converge to the integral, one set of parameters
works on any point set.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import ops
from .._checks import (
    check_bool,
    check_choice,
    check_features,
    check_float,
    check_heads,
    check_int,
    check_like,
    check_probability,
    check_scale,
    check_tensor,
    expand_grid,
    is_exporting,
)
from ..functional import opmath_dtype
from ..quadrature import trapezoid_weights
from .activation import make_activation
from .dropout import Dropout

__all__ = ["ContinuumAttention", "ContinuumEncoderLayer", "auto_quadrature_weights",
           "resolve_quadrature_weight"]


def auto_quadrature_weights(coords: Tensor, name: str = "coords") -> Tensor:
    """Quadrature weights of a point set from its coordinates (``weight='auto'``).

    * ``d = 1``: trapezoid weights on the sorted order, scattered back to the given order (a
      repeated point shares its weight with its copy; ``N = 1`` gets weight 1).
    * ``d >= 2``, the points form a tensor grid (every combination of the per-axis coordinate
      values appears exactly once, in any order): uniform weights when every axis is
      equispaced (to float32 round-off, whatever the dtype; SPEC-continuum's rule), otherwise
      the product of per-axis cell widths: half the distance between a node's neighbours,
      the whole distance to its one neighbour at an end. That rule is the uniform one on an
      equispaced axis, so a grid nudged off equispacing changes the weights (and a model's
      output) by as little as the nudge; the product of trapezoid weights, which halves the
      ends, jumped by the whole O(h) gap between the two rules. Both are first order in 2-D;
      pass ``quadrature.grid_weights`` for the second-order trapezoid rule.
    * ``d >= 2``, scattered points: ``ValueError`` (pass e.g.
      :func:`galerkin_ext.quadrature.mesh_weights`).

    Only ratios of weights matter to continuum (softmax) attention, so the uniform case is all
    ones; Galerkin and Fourier attention are linear in the weights (divide by their sum to keep
    their default ``1/N`` scale).

    The rule branches on the coordinates' values: ``torch.export`` and ``jit.trace`` are
    refused, and ``torch.compile`` breaks the graph at it (``fullgraph=True`` fails). Call it
    outside a compiled model and pass the weights in.

    Args:
        coords: ``(N, d)`` or ``(B, N, d)`` finite floating-point coordinates.
        name: the argument's name in error messages (e.g. a model's ``x``).

    Returns:
        ``(N,)`` or ``(B, N)`` non-negative weights in ``coords``' dtype and device.
    """
    rank = 3 if isinstance(coords, Tensor) and coords.dim() == 3 else 2
    check_tensor(coords, name, rank, "(N, d) or (B, N, d)")
    if coords.shape[-2] == 0 or coords.shape[-1] == 0:
        raise ValueError(f"{name}: expected N >= 1 points with d >= 1 coordinates, got shape "
                         f"{tuple(coords.shape)}")
    if coords.device.type == "meta" or is_exporting():
        raise ValueError(f"{name}: weight='auto' chooses its rule from the coordinates' values, "
                         "which meta tensors do not hold and torch.export or torch.jit.trace "
                         "cannot branch on; pass explicit weights (e.g. "
                         "auto_quadrature_weights(coords), computed once beforehand) or None")
    if not bool(torch.isfinite(coords).all()):
        raise ValueError(f"{name}: expected finite coordinates")
    # one point: weight 1 (only ratios matter); an empty batch (B = 0): no weights
    if coords.shape[-2] == 1 or coords.numel() == 0:
        return coords.new_ones(coords.shape[:-1])
    if coords.shape[-1] == 1:
        return trapezoid_weights(coords[..., 0])
    if coords.dim() == 2:
        return _tensor_grid_weights(coords, name)
    # A batch sharing one point set (the usual case) needs one grid analysis.
    if bool((coords == coords[:1]).all()):
        return _tensor_grid_weights(coords[0], f"{name}[0]").expand(coords.shape[0], -1)
    return torch.stack([_tensor_grid_weights(c, f"{name}[{b}]") for b, c in enumerate(coords)])


def _tensor_grid_weights(points: Tensor, name: str) -> Tensor:
    """Weights of ``points (N, d)``, ``d >= 2``, if they form a tensor grid (see
    :func:`auto_quadrature_weights`); ``ValueError`` naming ``name`` otherwise."""
    n, dim = points.shape
    axes = [torch.unique(points[:, a]) for a in range(dim)]  # sorted distinct values per axis
    # each point's place on every axis; the points are the grid when their nodes are distinct
    # (a row-wise torch.unique(dim=0) took 4 ms at 64² on a CPU thread, at every forward; the
    # whole rule now takes 0.3 ms)
    index = [torch.searchsorted(axis, points[:, a].contiguous()) for a, axis in enumerate(axes)]
    if math.prod(len(axis) for axis in axes) != n or _distinct_nodes(index, axes) != n:
        raise ValueError(
            f"{name}: weight='auto' derives quadrature weights only for 1-D points or tensor "
            f"grids, but these {n} points in d = {dim} are scattered; pass "
            "weight=galerkin_ext.quadrature.mesh_weights(points, cells) (lumped mass on a "
            "triangulation), your own (N,) or (B, N) weights, or weight=None for plain softmax")
    if all(_equispaced(axis) for axis in axes):
        return torch.ones(n, dtype=points.dtype, device=points.device)
    weight = torch.ones(n, dtype=points.dtype, device=points.device)
    for a, axis in enumerate(axes):
        if len(axis) > 1:
            # cell widths: the trapezoid weights with whole gaps at the ends
            widths = trapezoid_weights(axis)
            widths[[0, -1]] *= 2
            weight = weight * widths[index[a]]
    return weight


def _distinct_nodes(index: list[Tensor], axes: list[Tensor]) -> int:
    """How many distinct grid nodes the per-axis places ``index`` name (the product of the axes'
    lengths, which the caller has checked equals the number of points, bounds the node number)."""
    node = index[0]
    for place, axis in zip(index[1:], axes[1:], strict=True):
        node = node * len(axis) + place
    return int(torch.unique(node).numel())


def _equispaced(axis: Tensor) -> bool:
    """Whether the sorted distinct values ``axis`` are equally spaced, up to float32 round-off
    (or the dtype's, if coarser): a float32 grid cast to float64 is the same grid, and must get
    the same weights (at float64's round-off it would get the cell widths instead). The gaps of
    float32 grids built by linspace, arange times a step or cast from float64 deviate from
    their mean by at most 1.6 eps·max|axis| (offsets 0 to 1e5, 3 to 8192 points); 4 keeps a
    margin without calling a grid at 1e5 with gaps 0.1, 0.2, 0.7 uniform."""
    if len(axis) < 3:
        return True
    axis = axis.detach()  # a decision, not a value: coordinates that require grad warn in float()
    gaps = axis.diff()
    eps = max(torch.finfo(axis.dtype).eps, torch.finfo(torch.float32).eps)
    tolerance = 4 * eps * float(axis.abs().max())
    return float((gaps - gaps.mean()).abs().max()) <= tolerance


def resolve_quadrature_weight(weight: Tensor | str | None, coords: Tensor | None,
                              coords_name: str = "coords") -> Tensor | None:
    """The key weights an attention layer passes to the op: ``'auto'`` →
    :func:`auto_quadrature_weights` of ``coords`` (required then); a tensor or ``None`` as it is
    (the op validates tensors against the keys)."""
    if isinstance(weight, str):
        check_choice(weight, "weight", ["auto"])
        if coords is None:
            raise ValueError("weight: 'auto' derives the weights from the key points' "
                             f"coordinates; pass {coords_name} (N, d) or (B, N, d)")
        return auto_quadrature_weights(coords, coords_name)
    if weight is not None and not isinstance(weight, Tensor):
        raise TypeError("weight: expected 'auto', None or a tensor of shape (N,) or (B, N), "
                        f"got {type(weight).__name__}")
    return weight


class ContinuumAttention(nn.Module):
    """Multi-head continuum attention: ``W_o · concat_h A_h``, ``A_h`` softmax attention with
    quadrature weights on the keys (:func:`galerkin_ext.ops.continuum_attention`).

    ``Q``, ``K``, ``V``, ``W_o`` are ``Linear(d_model, d_model)`` with bias; each of the ``H``
    heads works on ``d_model / H`` features. Self-attention by default; with ``context`` the
    keys and values come from another point set (cross-attention, ``M != N`` allowed).

    Args:
        d_model: token width; ``n_head`` must divide it.
        n_head: number of heads ``H``.
        scale: the logits' factor; ``None`` for ``1 / sqrt(d_model / H)`` (the authors' code),
            ``1.0`` for the paper's definition.
        attn_dropout: dropout on the attention probabilities, in training only.

    Parameters: ``query``, ``key``, ``value``, ``out_proj``, ``4 (d_model² + d_model)`` in all,
    with ``nn.Linear``'s initialisation (the authors' code).
    """

    # Set by galerkin_ext.layers.draw_torch_masks: the attention probabilities are dropped with
    # torch's masks (through SDPA) on the CPU too, not the compiled op's.
    torch_masks: bool = False

    def __init__(self, d_model: int, n_head: int, *, scale: float | None = None,
                 attn_dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        self.n_head = check_heads(n_head, d_model)
        self.d_head = d_model // n_head
        self.scale = check_scale(scale, 1.0 / math.sqrt(self.d_head))
        self.attn_dropout = check_probability(attn_dropout, "attn_dropout")
        # nn.Linear's own initialisation, as in the authors' TNO (not nn.MultiheadAttention's
        # Glorot weights and zero biases: √3 times larger Q and K weights, ~3 times the logits).
        self.query, self.key, self.value, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_head={self.n_head}, scale={self.scale:g}, "
                f"attn_dropout={self.attn_dropout}")

    def forward(self, x: Tensor, context: Tensor | None = None, *,
                weight: Tensor | str | None = None, coords: Tensor | None = None) -> Tensor:
        """Attend from the points of ``x`` to those of ``context`` (default ``x``).

        Args:
            x: ``(B, N, d_model)`` query tokens.
            context: ``(B, M, d_model)`` key/value tokens, or ``None`` for self-attention.
            weight: the key points' quadrature weights: ``(M,)`` or ``(B, M)`` non-negative
                (zero removes a key), ``None`` for plain softmax, or ``'auto'``
                (:func:`auto_quadrature_weights` of ``coords``).
            coords: the key points' coordinates ``(M, d)`` or ``(B, M, d)``, for ``'auto'``
                (checked whenever given, so a model may pass them with any ``weight``).

        Returns:
            ``(B, N, d_model)``.
        """
        self._check_tokens(x, "x")
        batch, n, _ = x.shape
        if context is None:
            context = x
        else:
            self._check_tokens(context, "context")
            check_like(context, "context", x, "x")
            if context.shape[0] != batch:
                raise ValueError(f"context: expected shape (B, M, d_model) with B = {batch} "
                                 f"like x, got {tuple(context.shape)}")
        m = context.shape[1]
        if coords is not None:
            expanded = expand_grid(coords, "coords", batch, (m,), _last_dim(coords), x)
            # One point set shared by the batch keeps (M, d): its weights are derived once.
            coords = coords if coords.dim() == 2 else expanded
        derived = isinstance(weight, str)
        weight = resolve_quadrature_weight(weight, coords)
        if derived:
            assert weight is not None
            # Half-precision tokens take float32 weights (tiny weights stay normal numbers).
            weight = weight.to(opmath_dtype(x))

        def heads(t: Tensor, proj: nn.Linear) -> Tensor:
            return proj(t).view(batch, t.shape[1], self.n_head, self.d_head).transpose(1, 2)

        out = ops.continuum_attention(
            heads(x, self.query), heads(context, self.key), heads(context, self.value),
            weight=weight, scale=self.scale,
            dropout_p=self.attn_dropout if self.training else 0.0, torch_masks=self.torch_masks)
        return self.out_proj(out.transpose(1, 2).reshape(batch, n, self.d_model))

    def _check_tokens(self, t: object, name: str) -> None:
        check_tensor(t, name, 3, "(B, N, d_model)", self)
        assert isinstance(t, Tensor)
        if t.shape[-1] != self.d_model or t.shape[1] == 0:
            raise ValueError(f"{name}: expected shape (B, N, d_model) with N >= 1 and d_model = "
                             f"{self.d_model}, got {tuple(t.shape)}")


def feedforward_width(dim_feedforward: int | None, d_model: int) -> int:
    """The hidden width of the continuum-attention encoder layers' feed-forward block: given, or
    ``d_model``, as the paper's parameter counts (its Table 4) have it at every width."""
    return d_model if dim_feedforward is None else check_int(dim_feedforward, "dim_feedforward")


def _last_dim(coords: object) -> int:
    """The coordinate dimension of ``coords (M, d)`` / ``(B, M, d)``, for the shape check."""
    return int(coords.shape[-1]) if isinstance(coords, Tensor) and coords.dim() >= 1 else 1


class ContinuumEncoderLayer(nn.Module):
    """The TNO's post-LN encoder layer (paper eq. 10 with ``W₁ = W₂ = I``):

        x ← LN(x + Drop(W_o · heads(x)))
        x ← LN(x + Drop(Lin(GELU(Lin(x)))))

    LN normalises the channels of each point. ``layer_norm=False`` drops both norms: the
    averaging variant of SPEC-continuum, the paper's §5 layer (eq. 34) with its learned
    pointwise ``W₁``, ``W₂`` on the residual paths fixed to ``I`` and multi-head attention. At
    ``d_model = dim_feedforward = 128`` the layer has 99,584 parameters (99,072 without the
    norms).

    Args:
        d_model, n_head, scale, attn_dropout: the attention, see :class:`ContinuumAttention`.
        dim_feedforward: hidden width of the feed-forward block (``None``: ``d_model``,
            :func:`feedforward_width`).
        dropout: on the two residual branches (the paper: 1e-4).
        activation: of the feed-forward block (``'gelu'``, ``'relu'`` or ``'silu'``).
        layer_norm: whether the two residual-stream layer norms exist.
        eps: their epsilon.
    """

    def __init__(self, d_model: int, n_head: int, dim_feedforward: int | None = None,
                 dropout: float = 1e-4, *, activation: str = "gelu", layer_norm: bool = True,
                 scale: float | None = None, attn_dropout: float = 0.0,
                 eps: float = 1e-5) -> None:
        super().__init__()
        check_bool(layer_norm, "layer_norm")
        eps = check_float(eps, "eps")
        self.attn = ContinuumAttention(d_model, n_head, scale=scale, attn_dropout=attn_dropout)
        hidden = feedforward_width(dim_feedforward, d_model)
        self.linear1 = nn.Linear(d_model, hidden)
        self.activation = make_activation(activation)
        self.linear2 = nn.Linear(hidden, d_model)
        self.dropout1 = Dropout(check_probability(dropout, "dropout"))
        self.dropout2 = Dropout(dropout)
        if layer_norm:
            self.norm1: nn.Module = nn.LayerNorm(d_model, eps=eps)
            self.norm2: nn.Module = nn.LayerNorm(d_model, eps=eps)
        else:
            self.norm1 = self.norm2 = nn.Identity()

    def forward(self, x: Tensor, context: Tensor | None = None, *,
                weight: Tensor | str | None = None, coords: Tensor | None = None) -> Tensor:
        """``x (B, N, d_model)`` → ``(B, N, d_model)``, attending to itself or, given, to
        ``context (B, M, d_model)`` (cross-attention: :class:`ContinuumAttention`). ``weight``,
        ``coords``: the quadrature weights of the key points (``(M,)``, ``(B, M)``, ``None`` or
        ``'auto'`` with their coordinates ``coords (M, d)`` / ``(B, M, d)``)."""
        check_features(x, "x", self.linear1.in_features, self)  # (before the norm's own check)
        x = self.norm1(x + self.dropout1(self.attn(x, context, weight=weight, coords=coords)))
        return self.norm2(x + self.dropout2(self.linear2(self.activation(self.linear1(x)))))
