"""Models of "Continuum Attention for Neural Operators" (SPEC-continuum §2) and the paper's
Darcy baselines.

* :class:`TNO` — the Transformer Neural Operator on any point set: ``[u, x]`` lifted pointwise,
  post-LN encoder layers with continuum attention, pointwise projection.
* :class:`ViTNO` (``'vitno'``), :class:`FANO` (``'fano'``) — patched attention on 2-D grids:
  ``[u, x]`` cut into a fixed number of patches (tokens are patch functions), a spectral
  (ViT NO) or pointwise (FANO) lift, post-LN encoder layers with pointwise (ViT NO) or
  spectral (FANO) ``Q``, ``K``, ``V``, un-patching, a projection and a final spectral
  convolution over the domain.
* :class:`FNOChannelMLP` (``'fno_ca'``) — the FNO in the NeuralOperator library's layout.
* :class:`AFNO` (``'afno'``) — the AFNO in the PhysicsNeMo layout, tied to one grid.
* :class:`GTEncoder` (``'gt_encoder'``) — the Galerkin Transformer's encoder between TNO-style
  linear lift and projection.

Point-set models take ``u (B, N, d_u)`` with coordinates ``x (N, d)`` or ``(B, N, d)``; grid
models take ``u (B, s₁, s₂, d_u)`` with ``x (s₁, s₂, 2)`` or ``(B, s₁, s₂, 2)``, in any floating
dtype (cast to ``u``'s, as the transformer models do with their grids).  The names are
the paper's (the input function ``u`` at the points ``x``); a dataset item holds them as
``"x"`` (the values) and ``"grid"`` (the coordinates), so a model is called
``model(batch["x"], batch["grid"])``.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_float,
    check_int,
    check_int_pair,
    check_like,
    check_model_input,
    check_probability,
    check_tensor,
    expand_grid,
)
from ..functional import opmath_dtype
from ..layers.continuum import ContinuumEncoderLayer, resolve_quadrature_weight
from ..layers.encoder import EncoderLayer
from ..layers.fourier import AFNOBlock, SpectralConv
from ..layers.patching import PatchedEncoderLayer, SpectralSmoothing, patchify, unpatchify

__all__ = ["AFNO", "FANO", "TNO", "FNOChannelMLP", "GTEncoder", "ViTNO"]


def _check_points(model: nn.Module, u: object, x: object, in_dim: int,
                  domain_dim: int, *, empty: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """``u (B, N, in_dim)``, ``x (N, d)`` / ``(B, N, d)`` on ``u``'s device, in any floating
    dtype (a float64 grid made with numpy, say; the transformer models take them so too);
    returns ``u``, ``x`` in ``u``'s dtype as given and expanded to ``(B, N, d)``. ``empty``:
    ``N = 0`` is taken (a domain-parallel shard without points)."""
    check_tensor(u, "u", 3, "(B, N, in_dim)")
    assert isinstance(u, Tensor)
    check_model_input(u, "u", model)
    batch, n, channels = u.shape
    if channels != in_dim or (n == 0 and not empty):
        raise ValueError(f"u: expected shape (B, N, in_dim) with N >= 1 and in_dim = {in_dim} "
                         f"({type(model).__name__}), got {tuple(u.shape)}")
    expanded = expand_grid(x, "x", batch, (n,), domain_dim, u, "u")
    assert isinstance(x, Tensor)
    return u, x.to(u.dtype), expanded.to(u.dtype)


def _weight_for(u: Tensor, weight: Tensor | None) -> Tensor | None:
    """Quadrature weights of any floating dtype in the one the ops take for ``u``'s tokens (as
    the coordinates are cast to ``u``'s: a float64 ``mesh_weights`` was refused, naming the
    op's inner ``k``); anything else as given, for the ops' checks."""
    if isinstance(weight, Tensor) and weight.is_floating_point():  # (else the ops' message)
        return weight.to(opmath_dtype(u))
    return weight


def _check_grid(model: nn.Module, u: object, x: object, in_dim: int) -> Tensor:
    """``u (B, s₁, s₂, in_dim)``, ``x (s₁, s₂, 2)`` / ``(B, s₁, s₂, 2)`` on ``u``'s device (any
    floating dtype, cast to ``u``'s); returns ``[u, x]`` of shape ``(B, s₁, s₂, in_dim + 2)``."""
    check_tensor(u, "u", 4, "(B, s1, s2, in_dim)")
    assert isinstance(u, Tensor)
    check_model_input(u, "u", model)
    batch, s1, s2, channels = u.shape
    if channels != in_dim or 0 in (s1, s2):
        raise ValueError(f"u: expected shape (B, s1, s2, in_dim) with in_dim = {in_dim} "
                         f"({type(model).__name__}), got {tuple(u.shape)}")
    expanded = expand_grid(x, "x", batch, (s1, s2), 2, u, "u")
    return torch.cat([u, expanded.to(u.dtype)], dim=-1)


class TNO(nn.Module):
    """Transformer Neural Operator (paper §4.2): ``P ∘ E_L ∘ … ∘ E_1 ∘ R`` on any point set.

    * Lift ``R``: ``Linear(d_u + d, d_model)`` on ``[u(x), x]`` at every point (the coordinates
      are the only positional encoding).
    * ``num_layers`` :class:`~galerkin_ext.layers.ContinuumEncoderLayer` (post-LN, GELU
      feed-forward of width ``dim_feedforward``, dropout ``dropout``) attending with the
      points' quadrature weights; in training, each attention probability is dropped with
      probability ``attn_dropout``.
    * Projection ``P``: ``Linear(d_model, d_z)`` at every point.

    The output lives on the input points, or with ``query_head`` at any query points. One set
    of parameters runs at any ``N >= 1``.

    **Query head** (``query_head=True``; SPEC-continuum §8, cross-attention of Defs 10-11): the
    query points' coordinates, lifted by ``Linear(d, d_model) → GELU → Linear(d_model,
    d_model)``, pass one more encoder layer whose attention takes its keys and values from the
    encoded input points (with their quadrature weights), then the projection. The output
    then lives on the ``query`` points of each call (the input points by default): their
    number and place are free, and each query point's output depends on its own coordinates
    and the input alone.

    **Initial-condition token** (``token0_dim``; Lorenz-63 (a)): ``Linear(token0_dim, d_model)``
    on ``token0`` (e.g. ``[x(0), y(0), z(0), t₀]``) replaces the lifted token of the initial
    time, the point with the smallest coordinate among those of non-zero weight (the first
    such point on ties; the authors' code replaces the first token); the length is unchanged.
    Needs ``domain_dim = 1``.

    **Averaging variant** (paper §5, ``layer_norm=False``): no layer norms; the lift becomes the
    MLP ``R₂ GELU(R₁[u, x] + b) + b̃`` and the projection ``P₂ GELU(P₁[v, x] + b) + b̃`` (hidden
    width ``d_model``). Its attention represents the domain average (``Q = K = 0``, ``V = I``,
    as in the proof of Theorem 22); the layers keep identity residuals where eq. (34) learns
    ``W₁``, ``W₂`` (the proof takes ``W₂ = 0``), so the theorem's construction is not one of
    its parameter settings.

    Args:
        in_dim: ``d_u``, input channels.
        out_dim: ``d_z``, output channels.
        domain_dim: ``d``, coordinates per point.
        d_model, n_head, num_layers: encoder width, heads and depth.
        token0_dim: width of the initial-condition token, or ``None``.
        layer_norm: ``True`` for the paper's TNO, ``False`` for the averaging variant.
        dim_feedforward: hidden width of the feed-forward blocks (``None``: ``d_model``).
        dropout: on the encoder's residual branches.
        attn_dropout: on the attention probabilities. The default 0.1 is the authors' TNO's:
            its attention keeps its own dropout's default, which their runs never set (their
            ``dropout``, 1e-4, reaches only the residual branches). On the CPU it runs in the
            fused op behind :func:`~galerkin_ext.ops.continuum_attention` (a training step of
            the quick Darcy TNO 1.5x that without it; through SDPA, 5x).
        scale: attention logits' factor (``None``: ``1/sqrt(d_model / n_head)``).
        query_head: whether the model outputs at query points through the query head.
        quadrature: ``True`` for the paper's TNO, whose attention weighs the points by
            quadrature weights (the forward's ``weight``); ``False`` for plain softmax over the
            points, the "vanilla transformer" of the paper's Figs 8-9, whose forward takes
            ``weight='auto'`` or ``None`` and attends without weights. A model's own setting,
            so that one rebuilt from its arguments attends as it was trained.

    Parameters at the defaults: ``6 · 99,584`` in the encoder, ``(d_u + d + 1) d_model`` in the
    lift, ``(d_model + 1) d_z`` in the projection and ``(token0_dim + 1) d_model`` in the token
    lift (598,145 for Darcy, ``d_u = 1, d = 2, d_z = 1``); the query head adds one layer's
    99,584 and ``(d + 1) d_model + (d_model + 1) d_model`` in its lift (116,480 for ``d = 2``).
    """

    def __init__(self, in_dim: int, out_dim: int, domain_dim: int, d_model: int = 128,
                 n_head: int = 8, num_layers: int = 6, token0_dim: int | None = None,
                 layer_norm: bool = True, dim_feedforward: int | None = None,
                 dropout: float = 1e-4, attn_dropout: float = 0.1,
                 scale: float | None = None, query_head: bool = False,
                 quadrature: bool = True) -> None:
        super().__init__()
        self.in_dim = check_int(in_dim, "in_dim")
        self.out_dim = check_int(out_dim, "out_dim")
        self.domain_dim = check_int(domain_dim, "domain_dim")
        check_int(d_model, "d_model")
        check_bool(layer_norm, "layer_norm")
        self.layer_norm = layer_norm
        self.token0_dim = None if token0_dim is None else check_int(token0_dim, "token0_dim")
        if token0_dim is not None and domain_dim != 1:
            raise ValueError(f"token0_dim: the initial-condition token replaces the token of the "
                             f"initial time and needs domain_dim = 1, got domain_dim = "
                             f"{domain_dim}")
        lift_in = in_dim + domain_dim
        if layer_norm:
            self.lift: nn.Module = nn.Linear(lift_in, d_model)
            self.project_hidden = None
            self.project = nn.Linear(d_model, out_dim)
        else:
            self.lift = nn.Sequential(nn.Linear(lift_in, d_model), nn.GELU(),
                                      nn.Linear(d_model, d_model))
            # P₁ sees [v, x]; P₂ maps to the output.
            self.project_hidden = nn.Linear(d_model + domain_dim, d_model)
            self.project = nn.Linear(d_model, out_dim)
        self.token0_lift = None if token0_dim is None else nn.Linear(token0_dim, d_model)
        check_int(num_layers, "num_layers")
        check_bool(query_head, "query_head")
        check_bool(quadrature, "quadrature")
        self.quadrature = quadrature

        def layer() -> ContinuumEncoderLayer:
            return ContinuumEncoderLayer(d_model, n_head, dim_feedforward, dropout,
                                         layer_norm=layer_norm, scale=scale,
                                         attn_dropout=attn_dropout)

        self.encoder = nn.ModuleList(layer() for _ in range(num_layers))
        self.query_lift = nn.Sequential(nn.Linear(domain_dim, d_model), nn.GELU(),
                                        nn.Linear(d_model, d_model)) if query_head else None
        self.query_layer = layer() if query_head else None

    def forward(self, u: Tensor, x: Tensor, weight: Tensor | str | None = "auto",
                token0: Tensor | None = None, *, query: Tensor | None = None) -> Tensor:
        """Map ``u`` at the points ``x`` to the output at the same points, or with the query
        head at the ``query`` points.

        Args:
            u: ``(B, N, in_dim)`` input function values.
            x: ``(N, domain_dim)`` coordinates shared by the batch, or ``(B, N, domain_dim)``.
            weight: quadrature weights of the points: ``'auto'`` (trapezoid in 1-D, uniform on
                tensor grids, an error for scattered points in ``d >= 2``; see
                :func:`~galerkin_ext.layers.auto_quadrature_weights`), ``(N,)`` or ``(B, N)``
                non-negative weights (zero removes a padded point), or ``None`` (plain softmax,
                the "vanilla transformer"). A model built with ``quadrature=False`` takes
                ``'auto'`` or ``None``, and attends without weights either way.
            token0: ``(B, token0_dim)``, required iff the model has ``token0_dim``.
            query: ``(N_q, domain_dim)`` or ``(B, N_q, domain_dim)`` coordinates of the output
                points, ``N_q >= 1`` (only with ``query_head``; default: ``x``).

        Returns:
            ``(B, N, out_dim)``, or ``(B, N_q, out_dim)`` at the ``query`` points.
        """
        u, x, expanded = _check_points(self, u, x, self.in_dim, self.domain_dim)
        points = expanded if query is None else self._check_query(query, u)
        if not self.quadrature:
            if not (weight is None or (isinstance(weight, str) and weight == "auto")):
                got = repr(weight) if isinstance(weight, str) else f"a {type(weight).__name__}"
                raise ValueError("weight: this TNO attends without quadrature weights (built "
                                 f"with quadrature=False); expected 'auto' or None, got {got}")
            weight = None
        # A point set shared by the batch keeps (N, d): its weights are derived once; from
        # half-precision coordinates in float32 (the ops take float32 weights for half tokens).
        coords = x if x.dim() == 2 else expanded
        if isinstance(weight, str):
            coords = coords.to(opmath_dtype(coords))
        weight = _weight_for(u, resolve_quadrature_weight(weight, coords, coords_name="x"))
        h = self.lift(torch.cat([u, expanded], dim=-1))
        h = self._insert_token0(h, u, expanded, weight, token0)
        for layer in self.encoder:
            h = layer(h, weight=weight)
        if self.query_layer is not None:
            # (cast: query_lift and query_layer are built together, both or neither)
            h = self.query_layer(cast(nn.Sequential, self.query_lift)(points), h, weight=weight)
        if self.project_hidden is not None:
            h = F.gelu(self.project_hidden(torch.cat([h, points], dim=-1)))
        return self.project(h)

    def extra_repr(self) -> str:
        return f"quadrature={self.quadrature}"

    def _check_query(self, query: object, u: Tensor) -> Tensor:
        """``query`` as ``(B, N_q, domain_dim)`` in ``u``'s dtype (any floating dtype given)."""
        if self.query_layer is None:
            raise ValueError("query: the model outputs at its input points only; build it with "
                             "query_head=True to give query points")
        doc = f"(N_q, {self.domain_dim}) or (B, N_q, {self.domain_dim}) with N_q >= 1"
        if not isinstance(query, Tensor):
            raise TypeError(f"query: expected a tensor of shape {doc}, got "
                            f"{type(query).__name__}")
        if query.dim() not in (2, 3) or query.shape[-2] == 0:
            raise ValueError(f"query: expected shape {doc}, got {tuple(query.shape)}")
        points = expand_grid(query, "query", u.shape[0], (query.shape[-2],), self.domain_dim,
                             u, "u")
        return points.to(u.dtype)

    def _insert_token0(self, h: Tensor, u: Tensor, x: Tensor, weight: Tensor | None,
                       token0: Tensor | None) -> Tensor:
        """``h (B, N, d_model)`` with the initial time's token replaced by the lifted
        ``token0``; points of zero weight (padding) are not candidates."""
        if self.token0_lift is None:
            if token0 is not None:
                raise ValueError("token0: expected None, since the model has no "
                                 "initial-condition token (token0_dim = None)")
            return h
        batch, n, _ = h.shape
        # (no sizes in it: formatting symbolic ones under torch.compile pins them)
        doc = f"(B, token0_dim) with token0_dim = {self.token0_dim}"
        if token0 is None:
            raise ValueError(f"token0: expected a tensor of shape {doc} (the model has "
                             f"token0_dim = {self.token0_dim}), got None")
        check_tensor(token0, "token0", 2, doc)
        check_like(token0, "token0", u, "u")
        if tuple(token0.shape) != (batch, self.token0_dim):
            raise ValueError(f"token0: expected shape {(batch, self.token0_dim)}, got "
                             f"{tuple(token0.shape)}")
        times = x[..., 0]
        if weight is not None:
            times = times.masked_fill(weight.expand(batch, n) == 0, torch.inf)
        first = times.argmin(dim=1)  # the initial time of each sample
        # a comparison, not F.one_hot, whose class count would fix N in an exported program
        at_first = (torch.arange(n, device=h.device) == first[:, None])[..., None]
        return torch.where(at_first, self.token0_lift(token0)[:, None, :], h)


class _FNOLayer(nn.Module):
    """One NeuralOperator-layout FNO block: ``y = K x + b + W x`` (``W`` a 1×1 skip without
    bias), ``h = GELU(y)``, ``x' = MLP(h) + g ⊙ x`` (channel MLP of hidden width
    ``width · expansion``, soft-gating skip ``g``), GELU after all but the last block."""

    def __init__(self, width: int, modes: int, last_modes: int, expansion: float,
                 last: bool) -> None:
        super().__init__()
        self.spectral = SpectralConv(width, width, modes, last_modes)
        self.bias = nn.Parameter(torch.zeros(width))
        self.skip = nn.Linear(width, width, bias=False)
        hidden = max(1, round(width * expansion))
        self.channel_mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(),
                                         nn.Linear(hidden, width))
        self.gate = nn.Parameter(torch.ones(width))
        self.last = last
        # A variance-preserving N(0, 2 / (c_in + c_out)) for this baseline's spectral weights,
        # the NeuralOperator layout's scale (SpectralConv's U(0, 1/(c_in c_out)) is the ViT NO's
        # and FANO's, SPEC-continuum §2; at width 128 it starts the FNO near zero).
        std = (2.0 / (2 * width)) ** 0.5
        with torch.no_grad():
            for weight in (self.spectral.weight_pos, self.spectral.weight_neg):
                torch.view_as_real(weight).normal_(0.0, std / 2**0.5)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.spectral(x) + self.bias + self.skip(x))
        out = self.channel_mlp(h) + self.gate * x
        return out if self.last else F.gelu(out)


class FNOChannelMLP(nn.Module):
    """FNO in the NeuralOperator library's layout (the paper's FNO baseline, ``'fno_ca'``).

    Lift MLP ``[u, x] → lifting → width`` (GELU), ``num_layers`` blocks (spectral convolution
    with ``n_modes`` wavenumbers per axis — ``k₁ ∈ [-n/2, n/2)``, ``k₂ ∈ [0, n/2]`` — plus bias,
    a 1×1 skip, a channel MLP of hidden width ``width · expansion`` with a soft-gating skip;
    GELU), projection MLP ``width → projection → d_z`` (GELU). Mode skipping (see
    :class:`~galerkin_ext.layers.SpectralConv`) lets it run on any grid.
    5,671,553 parameters at the defaults.

    Args:
        in_dim, out_dim: ``d_u``, ``d_z``.
        width, n_modes, num_layers: the Fourier blocks (``n_modes`` even).
        lifting, projection: hidden widths of the lift and projection MLPs.
        expansion: channel-MLP width over ``width``.

    ``forward(u (B, s₁, s₂, d_u), x (s₁, s₂, 2) | (B, s₁, s₂, 2)) → (B, s₁, s₂, d_z)``.
    """

    def __init__(self, in_dim: int = 1, out_dim: int = 1, width: int = 128, n_modes: int = 12,
                 num_layers: int = 4, lifting: int = 128, projection: int = 128,
                 expansion: float = 0.5) -> None:
        super().__init__()
        self.in_dim = check_int(in_dim, "in_dim")
        check_int(out_dim, "out_dim")
        check_int(width, "width")
        if check_int(n_modes, "n_modes", 2) % 2:
            raise ValueError(f"n_modes: expected an even int >= 2 (n/2 wavenumbers per sign), "
                             f"got {n_modes}")
        check_int(num_layers, "num_layers")
        check_float(expansion, "expansion")
        self.lift = nn.Sequential(nn.Linear(in_dim + 2, check_int(lifting, "lifting")),
                                  nn.GELU(), nn.Linear(lifting, width))
        self.layers = nn.ModuleList(
            _FNOLayer(width, n_modes // 2, n_modes // 2 + 1, expansion, i == num_layers - 1)
            for i in range(num_layers))
        self.project = nn.Sequential(nn.Linear(width, check_int(projection, "projection")),
                                     nn.GELU(), nn.Linear(projection, out_dim))

    def forward(self, u: Tensor, x: Tensor) -> Tensor:
        """``u (B, s₁, s₂, d_u)``, ``x (s₁, s₂, 2)`` or ``(B, s₁, s₂, 2)`` →
        ``(B, s₁, s₂, d_z)``."""
        h = self.lift(_check_grid(self, u, x, self.in_dim))
        for layer in self.layers:
            h = layer(h)
        return self.project(h)


class AFNO(nn.Module):
    """AFNO in the PhysicsNeMo layout (the paper's AFNO baseline, ``'afno'``), without patching.

    Pointwise embedding ``Linear(d_u + 2, d_model)`` of ``[u, x]`` (a patch-1 convolution), a
    learned positional embedding of shape ``(s₁ s₂, d_model)``, ``num_layers``
    :class:`~galerkin_ext.layers.AFNOBlock`, head ``Linear(d_model, d_z)``. The positional
    embedding ties the model to the ``grid`` it was built for: it is not a neural operator, and
    other grids raise. 1,088,641 parameters at the defaults (64²; SPEC-continuum's count, with
    a head bias, which PhysicsNeMo's head lacks: it starts at 0 here).

    Initialised as PhysicsNeMo's AFNO: the positional embedding and every linear layer of the
    blocks and head truncated normal with std 0.02 and zero biases, layer norms with eps 1e-6;
    the embedding keeps PyTorch's default, that of the convolution it stands for.

    Args:
        in_dim, out_dim: ``d_u``, ``d_z``.
        grid: ``(s₁, s₂)``.
        d_model, num_layers, num_blocks, mlp_ratio, sparsity_threshold: the blocks.

    ``forward(u (B, s₁, s₂, d_u), x (s₁, s₂, 2) | (B, s₁, s₂, 2)) → (B, s₁, s₂, d_z)``.
    """

    def __init__(self, in_dim: int = 1, out_dim: int = 1, grid: tuple[int, int] = (64, 64),
                 d_model: int = 128, num_layers: int = 4, num_blocks: int = 8,
                 mlp_ratio: int = 4, sparsity_threshold: float = 0.01) -> None:
        super().__init__()
        self.in_dim = check_int(in_dim, "in_dim")
        if not isinstance(grid, (tuple, list)) or len(grid) != 2:
            raise ValueError(f"grid: expected (s1, s2), got {grid!r}")
        self.grid = (check_int(grid[0], "grid[0]"), check_int(grid[1], "grid[1]"))
        self.embed = nn.Linear(in_dim + 2, check_int(d_model, "d_model"))
        self.pos_embed = nn.Parameter(torch.empty(self.grid[0] * self.grid[1], d_model))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        check_int(num_layers, "num_layers")
        self.blocks = nn.ModuleList(
            AFNOBlock(d_model, num_blocks, mlp_ratio, sparsity_threshold, eps=1e-6)
            for _ in range(num_layers))
        self.head = nn.Linear(d_model, check_int(out_dim, "out_dim"))
        for linear in (m for m in (*self.blocks.modules(), self.head)
                       if isinstance(m, nn.Linear)):
            nn.init.trunc_normal_(linear.weight, std=0.02)
            nn.init.zeros_(linear.bias)

    def forward(self, u: Tensor, x: Tensor) -> Tensor:
        """``u (B, s₁, s₂, d_u)``, ``x (s₁, s₂, 2)`` or ``(B, s₁, s₂, 2)`` →
        ``(B, s₁, s₂, d_z)``, on the model's grid only."""
        check_tensor(u, "u", 4, "(B, s1, s2, in_dim)")
        if tuple(u.shape[1:3]) != self.grid:
            raise ValueError(
                f"u: the AFNO was built for a {self.grid[0]}×{self.grid[1]} grid and its learned "
                f"positional embedding has one row per grid point, got a "
                f"{u.shape[1]}×{u.shape[2]} grid: the AFNO is not a neural operator (build a new "
                "model for this grid)")
        h = self.embed(_check_grid(self, u, x, self.in_dim))
        h = h + self.pos_embed.view(*self.grid, -1)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class GTEncoder(nn.Module):
    """The Galerkin Transformer's encoder between TNO-style linear maps (``'gt_encoder'``).

    ``Linear(d_u + d, d_model)`` on ``[u, x]``, ``num_layers``
    :class:`~galerkin_ext.layers.EncoderLayer` with :class:`~galerkin_ext.layers.SimpleAttention`
    (``attention_type`` Fourier by default, norm ``'attn'``, the coordinates in every head),
    ``Linear(d_model, d_z)``. 534,657 parameters at the defaults (Darcy, ``d_u = 1``).

    Args:
        in_dim, out_dim, domain_dim: ``d_u``, ``d_z``, ``d``.
        d_model, n_head, num_layers, dim_feedforward: the encoder.
        attention_type: ``'fourier'`` (paper) or ``'galerkin'`` (also ``'softmax'``,
            ``'linear'``).
        norm: the encoder's norm scheme (see :class:`~galerkin_ext.layers.EncoderLayer`).
        dropout: the encoder's dropout.

    ``forward(u (B, N, d_u), x (N, d) | (B, N, d), weight=None) → (B, N, d_z)``; ``weight``
    ``(N,)`` or ``(B, N)`` quadrature weights (default uniform ``1/N``).
    """

    def __init__(self, in_dim: int = 1, out_dim: int = 1, domain_dim: int = 2,
                 d_model: int = 128, n_head: int = 4, num_layers: int = 4,
                 dim_feedforward: int = 256, attention_type: str = "fourier",
                 norm: str | None = "attn", dropout: float = 0.0) -> None:
        super().__init__()
        self.in_dim = check_int(in_dim, "in_dim")
        self.domain_dim = check_int(domain_dim, "domain_dim")
        self.lift = nn.Linear(in_dim + domain_dim, check_int(d_model, "d_model"))
        check_int(num_layers, "num_layers")
        check_probability(dropout, "dropout")
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, n_head, attention_type=attention_type, pos_dim=domain_dim,
                         dim_feedforward=dim_feedforward, norm=norm, dropout=dropout)
            for _ in range(num_layers))
        self.project = nn.Linear(d_model, check_int(out_dim, "out_dim"))

    def forward(self, u: Tensor, x: Tensor, weight: Tensor | None = None) -> Tensor:
        """``u (B, N, d_u)``, ``x (N, d)`` or ``(B, N, d)``, ``weight (N,)`` / ``(B, N)`` /
        ``None`` → ``(B, N, d_z)``."""
        # (a domain-parallel encoder's shard may hold no points: see galerkin_ext.domain)
        sharded = any(getattr(m, "domain_parallel", False) for m in self.encoder.modules())
        u, x, expanded = _check_points(self, u, x, self.in_dim, self.domain_dim, empty=sharded)
        weight = _weight_for(u, weight)
        h = self.lift(torch.cat([u, expanded], dim=-1))
        pos = x if x.dim() == 2 else expanded  # a shared grid is broadcast by the ops
        for layer in self.encoder:
            h = layer(h, pos, weight)
        return self.project(h)


class _PatchedOperator(nn.Module):
    """The pipeline shared by :class:`ViTNO` and :class:`FANO`: ``[u, x]`` cut into patches,
    a per-patch lift ``lift`` (a module on ``(N, p₁, p₂, d_u + 2)`` patches, built by the
    subclass), patched encoder layers, un-patching, a pointwise projection, the final spectral
    convolution and optional smoothing."""

    lift: nn.Module

    def __init__(self, in_dim: int, out_dim: int, d_model: int, n_head: int, num_layers: int,
                 patches: int | tuple[int, int], final_modes: int | None,
                 dim_feedforward: int | None, dropout: float,
                 smoothing: tuple[float, float] | None, qkv_modes: int | None,
                 patch_extension: str | None) -> None:
        super().__init__()
        self.in_dim = check_int(in_dim, "in_dim")
        self.out_dim = check_int(out_dim, "out_dim")
        self.d_model = check_int(d_model, "d_model")
        self.patches = check_int_pair(patches, "patches")
        check_int(num_layers, "num_layers")
        self.encoder = nn.ModuleList(
            PatchedEncoderLayer(d_model, n_head, dim_feedforward, dropout, qkv_modes=qkv_modes,
                                patch_extension=patch_extension)
            for _ in range(num_layers))
        self.project = nn.Linear(d_model, out_dim)
        self.final = None if final_modes is None else SpectralConv(
            out_dim, out_dim, check_int(final_modes, "final_modes"))
        if smoothing is None:
            self.smoothing = None
        elif isinstance(smoothing, (tuple, list)) and len(smoothing) == 2:
            self.smoothing = SpectralSmoothing(
                check_float(smoothing[0], "smoothing[0] (eps)", low_inclusive=True),
                check_float(smoothing[1], "smoothing[1] (alpha)", low_inclusive=True))
        else:
            raise TypeError(f"smoothing: expected None or a pair (eps, alpha), got {smoothing!r}")

    def forward(self, u: Tensor, x: Tensor) -> Tensor:
        """Map ``u`` on a grid to the output on the same grid.

        Args:
            u: ``(B, s₁, s₂, in_dim)``; the patches ``(P₁, P₂)`` must divide ``(s₁, s₂)``.
            x: ``(s₁, s₂, 2)`` or ``(B, s₁, s₂, 2)`` coordinates in ``[0, 1]²`` (the patched
                attention's cell weight is ``1/(s₁s₂)``, the cell volume of the unit square).

        Returns:
            ``(B, s₁, s₂, out_dim)``.
        """
        tokens = patchify(_check_grid(self, u, x, self.in_dim), self.patches, name="u")
        batch, p, p1, p2, channels = tokens.shape  # the patches form the lift's batch
        h = self.lift(tokens.reshape(batch * p, p1, p2, channels)).reshape(
            batch, p, p1, p2, self.d_model)
        for layer in self.encoder:
            h = layer(h)
        y = self.project(unpatchify(h, self.patches))
        if self.final is not None:
            y = y + self.final(y)
        return y if self.smoothing is None else self.smoothing(y)


class ViTNO(_PatchedOperator):
    """Vision Transformer Neural Operator (paper §3, SPEC-continuum §2): patched attention on
    a 2-D grid, one set of parameters at every resolution.

    1. ``[u, x]`` is cut into ``P₁ × P₂`` patches of ``s_i / P_i`` points (row-major; the number
       of patches stays fixed across resolutions, the patches get finer).
    2. Each patch is lifted by one shared ``SpectralConv(d_u + 2, d_model, lift_modes)`` (modes
       a patch cannot hold are skipped).
    3. ``num_layers`` :class:`~galerkin_ext.layers.PatchedEncoderLayer` with pointwise ``Q``,
       ``K``, ``V`` and the cell weight ``1/(s₁s₂)`` of the current grid.
    4. Un-patch, ``Linear(d_model, d_z)``, then ``y ← y + SpectralConv(d_z, d_z, final_modes)(y)``
       over the whole domain (the paper's Remark 21 "final spectral convolution";
       ``final_modes=None`` leaves it out), and with ``smoothing=(ε, α)`` mode ``k`` of the
       output multiplied by ``(1 + ε|k|²)^(-α)`` (periodic data;
       :class:`~galerkin_ext.layers.SpectralSmoothing`).

    716,417 parameters at the defaults with ``d_u = d_z = 1`` (``'vitno'``): 6 · 99,584 in the
    encoder, 110,592 in the lift, 129 in the projection, 8,192 in the final convolution.

    Args:
        in_dim, out_dim: ``d_u``, ``d_z``.
        d_model, n_head, num_layers, dim_feedforward, dropout: the encoder
            (``dim_feedforward=None``: ``d_model``).
        patches: ``(P₁, P₂)`` (or one int for both).
        lift_modes, final_modes: modes of the lift's and the final spectral convolutions.
        smoothing: ``None`` or ``(ε, α)``.

    ``forward(u (B, s₁, s₂, d_u), x (s₁, s₂, 2) | (B, s₁, s₂, 2)) → (B, s₁, s₂, d_z)``.
    """

    def __init__(self, in_dim: int = 1, out_dim: int = 1, d_model: int = 128, n_head: int = 8,
                 num_layers: int = 6, patches: int | tuple[int, int] = (13, 13),
                 lift_modes: int = 12, final_modes: int | None = 64,
                 dim_feedforward: int | None = None, dropout: float = 1e-4,
                 smoothing: tuple[float, float] | None = None) -> None:
        super().__init__(in_dim, out_dim, d_model, n_head, num_layers, patches, final_modes,
                         dim_feedforward, dropout, smoothing, qkv_modes=None,
                         patch_extension=None)
        self.lift = SpectralConv(self.in_dim + 2, self.d_model,
                                 check_int(lift_modes, "lift_modes"))


class FANO(_PatchedOperator):
    """Fourier Attention Neural Operator (paper §3, SPEC-continuum §2): the
    :class:`ViTNO` with a pointwise lift ``Linear(d_u + 2, d_model)`` and, in every layer,
    ``Q``, ``K``, ``V`` each one ``SpectralConv(d_model, d_model, qkv_modes)`` applied to every
    patch (``d_model = H · d_K``). ``patch_extension='periodic'`` applies those convolutions to
    the patch mirrored to ``2p₁ × 2p₂`` and crops the result
    (:func:`~galerkin_ext.layers.periodic_extension`). The final spectral convolution is on
    by default, as in the paper (``final_modes=None`` leaves it out, as the authors' script
    does).

    48,084,865 parameters at the defaults with ``d_u = d_z = 1`` (``'fano'``): per layer
    ``3 · 2,654,208`` in ``Q``, ``K``, ``V``, 16,512 in ``W_o``, 33,024 in the feed-forward
    block and 512 in the norms; 512 in the lift, 129 in the projection, 8,192 in the final
    convolution.

    Args:
        in_dim, out_dim, d_model, n_head, num_layers, patches, final_modes, dim_feedforward,
            dropout, smoothing: as :class:`ViTNO`.
        qkv_modes: modes of the ``Q``, ``K``, ``V`` convolutions.
        patch_extension: ``None`` or ``'periodic'``.

    ``forward(u (B, s₁, s₂, d_u), x (s₁, s₂, 2) | (B, s₁, s₂, 2)) → (B, s₁, s₂, d_z)``.
    """

    def __init__(self, in_dim: int = 1, out_dim: int = 1, d_model: int = 128, n_head: int = 8,
                 num_layers: int = 6, patches: int | tuple[int, int] = (13, 13),
                 qkv_modes: int = 9, final_modes: int | None = 64,
                 dim_feedforward: int | None = None, dropout: float = 1e-4,
                 smoothing: tuple[float, float] | None = None,
                 patch_extension: str | None = None) -> None:
        super().__init__(in_dim, out_dim, d_model, n_head, num_layers, patches, final_modes,
                         dim_feedforward, dropout, smoothing,
                         qkv_modes=check_int(qkv_modes, "qkv_modes"),
                         patch_extension=patch_extension)
        self.lift = nn.Linear(self.in_dim + 2, self.d_model)
