"""GNOT (Hao et al. 2023, "GNOT: a General Neural Operator Transformer"; SPEC-gnot §2) and the
baselines of its experiments (SPEC-gnot §6).

* :class:`GNOT` — query points encoded by a trunk MLP, each input function by its own branch
  MLP; blocks of heterogeneous normalised cross-attention to the inputs, geometric-gating
  mixtures of experts and normalised self-attention; a decoder MLP.
* :class:`MIONet` — one branch net per input function (flattened, zero-padded to a fixed size)
  and for θ, a trunk net on the query coordinates, combined by a product over the branches.
* :class:`GKTransformer` — the Galerkin Transformer's encoder (Galerkin attention with
  quadrature weights) on the query coordinates, with a pointwise decoder.

Every model takes padded ragged batches: query points ``x (B, N, query_dim)`` whose first
``space_dim`` columns are the (normalised) coordinates, query weights ``weight (B, N)`` (0 on
padding), input functions ``inputs[l] (B, M_l, b_l)`` with weights ``input_weights[l]``
``(B, M_l)``, and ``theta (B, p)``. Padded points never change a real point's output, as
long as their values are finite (weight 0 times NaN is NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._checks import (
    check_choice,
    check_heads,
    check_int,
    check_like,
    check_model_input,
    check_nonnegative,
    check_probability,
    check_tensor,
)
from ..layers.activation import make_activation
from ..layers.encoder import EncoderLayer
from ..layers.gnot import FFN_NORMS, GeometricGate, GNOTBlock, ResidualMLP

__all__ = ["GKTransformer", "GNOT", "MIONet"]

THETA_MODES = ("query", "branch")
GATES = ("mlp", "given")


def _check_weight(weight: object, name: str, batch: int, n: int, points: str,
                  like: Tensor) -> Tensor | None:
    """``weight (B, n)``, or ``(n,)`` shared by the batch (returned expanded), like ``like``,
    finite and non-negative, or None (checked here, under the caller's name for it: MIONet uses
    no op that would check the values, and the ops' messages name their own arguments).
    ``points`` names ``n`` (``"N"``, ``"M_0"``, …); the sizes themselves are formatted only
    into an error, since formatting a symbolic size would pin it under ``torch.compile``."""
    if weight is None:
        return None
    shared = isinstance(weight, Tensor) and weight.dim() == 1
    check_tensor(weight, name, 1 if shared else 2, f"(B, {points}) or ({points},)")
    assert isinstance(weight, Tensor)
    check_like(weight, name, like, "x")
    if tuple(weight.shape) != ((n,) if shared else (batch, n)):
        raise ValueError(f"{name}: expected shape (B, {points}) = ({batch}, {n}) or ({n},), "
                         f"got {tuple(weight.shape)}")
    check_nonnegative(weight, name)
    return weight.expand(batch, n) if shared else weight


def _check_batch(model: GNOT | MIONet, x: object, inputs: object, theta: object, weight: object,
                 input_weights: object) -> tuple[Tensor, list[Tensor], Tensor | None,
                                                 Tensor | None, list[Tensor | None]]:
    """The arguments every model of this module takes, checked against ``model``'s widths
    (``query_dim``, ``input_dims``, ``theta_dim``)."""
    x, weight = _check_query(model, x, weight)
    batch = x.shape[0]
    dims = model.input_dims
    if not isinstance(inputs, (list, tuple)) or len(inputs) != len(dims):
        raise ValueError(f"inputs: expected a list of {len(dims)} tensors (B, M_l, b_l) with b_l "
                         f"= {list(dims)}, got {type(inputs).__name__} of length "
                         f"{len(inputs) if isinstance(inputs, (list, tuple)) else '-'}")
    for i, (y, b) in enumerate(zip(inputs, dims, strict=True)):
        check_tensor(y, f"inputs[{i}]", 3, f"(B, M_{i}, {b})")
        check_like(y, f"inputs[{i}]", x, "x")
        if y.shape[0] != batch or y.shape[2] != b:
            raise ValueError(f"inputs[{i}]: expected shape (B, M_{i}, {b}) with B = {batch}, "
                             f"got {tuple(y.shape)}")
    if input_weights is None:
        input_weights = [None] * len(dims)
    if not isinstance(input_weights, (list, tuple)) or len(input_weights) != len(dims):
        raise ValueError(f"input_weights: expected None or a list of {len(dims)} weights "
                         f"(B, M_l) or None")
    input_weights = [_check_weight(w, f"input_weights[{i}]", batch, y.shape[1], f"M_{i}", x)
                     for i, (w, y) in enumerate(zip(input_weights, inputs, strict=True))]
    if model.theta_dim:
        check_tensor(theta, "theta", 2, f"(B, theta_dim = {model.theta_dim})")
        assert isinstance(theta, Tensor)
        check_like(theta, "theta", x, "x")
        if tuple(theta.shape) != (batch, model.theta_dim):
            raise ValueError(f"theta: expected shape (B, theta_dim) = ({batch}, "
                             f"{model.theta_dim}), got {tuple(theta.shape)}")
    elif theta is not None:
        raise ValueError("theta: expected None, since the model has theta_dim = 0")
    return x, list(inputs), theta, weight, input_weights


def _check_dims(space_dim: int, query_dim: int) -> tuple[int, int]:
    """``(space_dim, query_dim)`` checked: ``x``'s first ``space_dim`` of its ``query_dim``
    columns are the coordinates."""
    check_int(space_dim, "space_dim")
    check_int(query_dim, "query_dim")
    if query_dim < space_dim:
        raise ValueError(f"query_dim: expected at least space_dim = {space_dim} (x starts "
                         f"with the coordinates), got {query_dim}")
    return space_dim, query_dim


def _check_query(model: nn.Module, x: object, weight: object) -> tuple[Tensor, Tensor | None]:
    """``x (B, N, model.query_dim)`` and its ``weight (B, N)`` or None."""
    check_tensor(x, "x", 3, f"(B, N, query_dim = {model.query_dim})")
    assert isinstance(x, Tensor)
    check_model_input(x, "x", model)
    batch, n, width = x.shape
    if width != model.query_dim:
        raise ValueError(f"x: expected shape (B, N, query_dim = {model.query_dim}), got "
                         f"{tuple(x.shape)}")
    return x, _check_weight(weight, "weight", batch, n, "N", x)


class GNOT(nn.Module):
    """General Neural Operator Transformer (SPEC-gnot §2; defaults and the names ``n_hidden``,
    ``n_layers``, ``n_inner``, ``act``: the reference code's, so that its configurations carry
    over; elsewhere the package says ``d_model``, ``num_layers``, ``activation``).

    * Trunk ``ResidualMLP(t, C, C, m)`` on each query point, ``t = query_dim`` (+ ``theta_dim``
      with ``theta_mode="query"``: θ concatenated to every query point, as the reference code);
      branch ``ResidualMLP(b_l, C, C, m)`` on each point of input function ``l``; decoder
      ``ResidualMLP(C, C, out_dim, m)``.
    * ``theta_mode="branch"`` (the paper, §3.3): θ through ``ResidualMLP(p, C, C, m)`` becomes
      one more input function of one point (weight 1).
    * ``n_layers`` :class:`~galerkin_ext.layers.GNOTBlock`, each with its own gate
      (:class:`~galerkin_ext.layers.GeometricGate` on the coordinates ``x[..., :space_dim]``)
      when ``n_experts > 1``. ``gate="given"`` takes the expert probabilities from the caller
      instead (``expert_probs``, e.g. a one-hot of a subdomain label: the paper's hand-crafted
      gate). SPEC-gnot's ``gate=callable(batch)`` becomes this tensor, which the caller
      computes: a callable inside the model would keep its configuration from being plain
      data that a checkpoint records and :func:`~galerkin_ext.models.build_model` rebuilds.

    Args:
        space_dim: ``d``, coordinates (the first columns of ``x``).
        query_dim: columns of ``x`` (coordinates and any other per-point features).
        input_dims: ``b_l`` per input function (coordinates and values of its points).
        out_dim: output channels.
        theta_dim: ``p``, global parameters per sample (0: none).
        n_hidden: ``C``; n_layers: blocks; n_head: heads (divides ``C``); n_experts: ``K``;
        n_inner: the experts' width is ``F = n_inner · C``; mlp_layers: ``m``; act: activation
        of the MLPs, experts and gate; dropout: on the attention branches; reduce: ``"sum"``
        (reference) or ``"mean"`` (paper) over the inputs; self_skip: the self-attention's
        ``q̃`` skip (the paper's Eq. 9 has none); ffn_norm: ``"post"`` or ``"pre"``.

    Parameters: ``mlp(t, C) + Σ_l mlp(b_l, C) + n_layers · block + mlp(C, out_dim)`` (SPEC-gnot
    §2); 350,721 at the defaults with ``space_dim = query_dim = 2``, ``input_dims = (3,)``,
    ``out_dim = 1``.

    ``forward(x (B, N, query_dim), inputs [(B, M_l, b_l)], theta (B, p) | None, *, weight
    (B, N) | (N,) | None, input_weights [(B, M_l) | (M_l,) | None] | None, expert_probs
    (B, N, K) | None) → (B, N, out_dim)``. Weights: quadrature weights, 0 on padding
    (``None``: uniform; a 1-D one is shared by the batch); ``weight`` is the self-attention's
    key weight.
    """

    def __init__(self, space_dim: int, query_dim: int, input_dims: Sequence[int], out_dim: int,
                 theta_dim: int = 0, n_hidden: int = 64, n_layers: int = 3, n_head: int = 1,
                 n_experts: int = 1, n_inner: int = 4, mlp_layers: int = 3, act: str = "gelu",
                 dropout: float = 0.0, reduce: str = "sum", self_skip: bool = True,
                 theta_mode: str = "query", ffn_norm: str = "post", gate: str = "mlp") -> None:
        super().__init__()
        self.space_dim, self.query_dim = _check_dims(space_dim, query_dim)
        if not isinstance(input_dims, (list, tuple)) or not input_dims:
            raise ValueError(f"input_dims: expected a non-empty list of input widths b_l, got "
                             f"{input_dims!r}")
        self.input_dims = tuple(check_int(b, f"input_dims[{i}]")
                                for i, b in enumerate(input_dims))
        self.theta_dim = check_int(theta_dim, "theta_dim", 0)
        self.theta_mode = check_choice(theta_mode, "theta_mode", THETA_MODES)
        check_choice(ffn_norm, "ffn_norm", FFN_NORMS)
        self.gate_mode = check_choice(gate, "gate", GATES)
        self.n_experts = check_int(n_experts, "n_experts")
        c, m = check_int(n_hidden, "n_hidden"), check_int(mlp_layers, "mlp_layers", 0)
        check_probability(dropout, "dropout")
        make_activation(act, "act")  # named here: the layers call it their activation
        self.act = act
        check_heads(n_head, c, "n_hidden")
        theta_in_query = self.theta_dim if self.theta_mode == "query" else 0
        self.trunk = ResidualMLP(query_dim + theta_in_query, c, c, m, act)
        self.branches = nn.ModuleList(ResidualMLP(b, c, c, m, act) for b in self.input_dims)
        self.theta_branch = (ResidualMLP(self.theta_dim, c, c, m, act)
                             if self.theta_dim and self.theta_mode == "branch" else None)
        n_inputs = len(self.input_dims) + int(self.theta_branch is not None)
        hidden = check_int(n_inner, "n_inner") * c
        self.blocks = nn.ModuleList(
            GNOTBlock(c, n_head, n_inputs, hidden, n_experts, act, dropout, reduce, self_skip,
                      ffn_norm)
            for _ in range(check_int(n_layers, "n_layers")))
        learned_gate = n_experts > 1 and gate == "mlp"
        self.gates = nn.ModuleList(GeometricGate(space_dim, hidden, n_experts, act)
                                   for _ in self.blocks) if learned_gate else None
        self.decoder = ResidualMLP(c, c, check_int(out_dim, "out_dim"), m, act)

    def forward(self, x: Tensor, inputs: Sequence[Tensor], theta: Tensor | None = None, *,
                weight: Tensor | None = None,
                input_weights: Sequence[Tensor | None] | None = None,
                expert_probs: Tensor | None = None) -> Tensor:
        """See the class docstring for shapes."""
        x, inputs, theta, weight, input_weights = _check_batch(self, x, inputs, theta, weight,
                                                               input_weights)
        batch, n, _ = x.shape
        probs = self._given_probs(expert_probs, batch, n, x)
        query = x if theta is None or self.theta_mode != "query" else torch.cat(
            [x, theta[:, None, :].expand(batch, n, self.theta_dim)], dim=-1)
        h = self.trunk(query)
        ys = [branch(y) for branch, y in zip(self.branches, inputs, strict=True)]
        if self.theta_branch is not None:
            ys.append(self.theta_branch(theta)[:, None, :])
            input_weights = [*input_weights, None]  # one key: its normalised weight is 1
        coords = x[..., :self.space_dim]
        for i, block in enumerate(self.blocks):
            p = self.gates[i](coords) if self.gates is not None else probs
            h = block(h, ys, input_weights, weight, p)
        return self.decoder(h)

    def _given_probs(self, expert_probs: Tensor | None, batch: int, n: int,
                     x: Tensor) -> Tensor | None:
        """``expert_probs`` checked: required iff ``gate="given"`` with several experts."""
        wanted = self.gate_mode == "given" and self.n_experts > 1
        if not wanted:
            if expert_probs is not None:
                raise ValueError("expert_probs: expected None (only gate='given' with "
                                 "n_experts > 1 takes the expert probabilities)")
            return None
        # (no sizes in it: formatting symbolic ones under torch.compile pins them)
        doc = f"(B, N, K) with K = {self.n_experts}"
        check_tensor(expert_probs, "expert_probs", 3, doc)
        assert isinstance(expert_probs, Tensor)
        check_like(expert_probs, "expert_probs", x, "x")
        if tuple(expert_probs.shape) != (batch, n, self.n_experts):
            raise ValueError(f"expert_probs: expected shape {(batch, n, self.n_experts)}, "
                             f"got {tuple(expert_probs.shape)}")
        check_nonnegative(expert_probs, "expert_probs", "probabilities")
        return expert_probs


def _mionet_net(in_dim: int, width: int, out_dim: int, n_layers: int, act: str) -> nn.Sequential:
    """``n_layers`` Linear layers ``in_dim → width → … → width → out_dim`` with ``act`` between
    them (none after the last)."""
    widths = [in_dim] + [width] * (n_layers - 1) + [out_dim]
    layers: list[nn.Module] = []
    for i in range(n_layers):
        if i:
            layers.append(make_activation(act))
        layers.append(nn.Linear(widths[i], widths[i + 1]))
    return nn.Sequential(*layers)


class MIONet(nn.Module):
    """MIONet (Jin, Meng, Lu 2022) as GNOT's baseline (SPEC-gnot §6):
    ``u_c(y) = Σ_k T_kc(y) Π_l B^l_kc + β_c``.

    * Branch ``l``: the points of input function ``l`` as one vector, ``[coords | values]`` in
      stored order, zero-padded to ``input_points[l]`` points (the largest in the data set)
      → ``n_layers`` Linear layers (``act`` between, linear output) → ``latent · out_dim``.
      Points of weight 0 are zeroed: the padding, and a real point its weights leave out (as
      the attention models leave it out), so that padding never reaches a branch. θ
      (``theta_dim > 0``) has one more branch.
    * Trunk: the query coordinates ``x[..., :space_dim]`` → the same kind of net, its output
      activated.

    Parameters: ``Σ_nets (lin(in, W) + (n_layers − 2) · lin(W, W) + lin(W, P · o)) + o``.

    ``forward(x (B, N, query_dim), inputs [(B, M_l, b_l)], theta (B, p) | None, *, weight
    (B, N) | (N,) | None, input_weights [(B, M_l) | (M_l,) | None] | None) → (B, N,
    out_dim)``; ``weight`` is
    accepted for a common call signature and unused (the trunk is pointwise).
    """

    def __init__(self, space_dim: int, query_dim: int, input_dims: Sequence[int],
                 input_points: Sequence[int], out_dim: int, theta_dim: int = 0,
                 width: int = 256, latent: int = 256, n_layers: int = 4,
                 act: str = "gelu") -> None:
        super().__init__()
        self.space_dim, self.query_dim = _check_dims(space_dim, query_dim)
        if not isinstance(input_dims, (list, tuple)) or not isinstance(
                input_points, (list, tuple)) or len(input_points) != len(input_dims):
            raise ValueError(f"input_dims, input_points: expected two lists of one entry per "
                             f"input function, got {input_dims!r} and {input_points!r}")
        self.input_dims = tuple(check_int(b, f"input_dims[{i}]")
                                for i, b in enumerate(input_dims))
        self.input_points = tuple(check_int(m, f"input_points[{i}]")
                                  for i, m in enumerate(input_points))
        self.theta_dim = check_int(theta_dim, "theta_dim", 0)
        self.out_dim = check_int(out_dim, "out_dim")
        self.latent = check_int(latent, "latent")
        check_int(width, "width")
        check_int(n_layers, "n_layers", 2)
        out = latent * out_dim
        self.branches = nn.ModuleList(_mionet_net(m * b, width, out, n_layers, act)
                                      for m, b in zip(self.input_points, self.input_dims,
                                                      strict=True))
        self.theta_branch = (_mionet_net(self.theta_dim, width, out, n_layers, act)
                             if self.theta_dim else None)
        self.trunk = nn.Sequential(_mionet_net(space_dim, width, out, n_layers, act),
                                   make_activation(act))
        self.bias = nn.Parameter(torch.zeros(out_dim))

    def forward(self, x: Tensor, inputs: Sequence[Tensor], theta: Tensor | None = None, *,
                weight: Tensor | None = None,
                input_weights: Sequence[Tensor | None] | None = None) -> Tensor:
        """See the class docstring for shapes."""
        x, inputs, theta, _, input_weights = _check_batch(self, x, inputs, theta, weight,
                                                          input_weights)
        batch, n, _ = x.shape
        product = None
        for i, (branch, y, w) in enumerate(zip(self.branches, inputs, input_weights,
                                               strict=True)):
            size = self.input_points[i]
            if y.shape[1] > size:
                raise ValueError(f"inputs[{i}]: at most input_points[{i}] = {size} points "
                                 f"(the size this MIONet was built for), got {y.shape[1]}")
            if w is not None:
                y = torch.where(w[..., None] > 0, y, torch.zeros((), dtype=y.dtype))
            flat = nn.functional.pad(y, (0, 0, 0, size - y.shape[1])).flatten(1)
            b = branch(flat)
            product = b if product is None else product * b
        if self.theta_branch is not None:
            product = product * self.theta_branch(theta)
        assert product is not None
        trunk = self.trunk(x[..., :self.space_dim]).view(batch, n, self.latent, self.out_dim)
        return torch.einsum("bnkc,bkc->bnc", trunk,
                            product.view(batch, self.latent, self.out_dim)) + self.bias


class GKTransformer(nn.Module):
    """The Galerkin Transformer as GNOT's Elasticity baseline (SPEC-gnot §6):
    ``Linear(query_dim, d_model)`` on the query points (their coordinates and any other
    per-point features, e.g. a coefficient's values; Elasticity: the coordinates), ``num_layers``
    :class:`~galerkin_ext.layers.EncoderLayer` (Galerkin attention, norm ``'attn'``, the
    coordinates in every head, the query weights as quadrature weights), and the pointwise
    decoder (``Linear(d_model + space_dim, hidden)``, ``decoder_layers × [Linear, SiLU]``,
    ``Linear(hidden, out_dim)``). 584,321 parameters at the defaults.

    ``forward(x (B, N, query_dim), inputs=None, theta=None, *, weight (B, N) | (N,) | None,
    input_weights=None) → (B, N, out_dim)``: on Elasticity the input function is the query
    mesh itself, so ``inputs``, ``theta`` and ``input_weights`` are accepted for a common call
    signature and ignored.
    """

    def __init__(self, space_dim: int = 2, query_dim: int = 2, out_dim: int = 1,
                 d_model: int = 128, n_head: int = 4, num_layers: int = 4,
                 dim_feedforward: int = 256, decoder_hidden: int = 128,
                 decoder_layers: int = 2) -> None:
        super().__init__()
        self.space_dim, self.query_dim = _check_dims(space_dim, query_dim)
        self.lift = nn.Linear(self.query_dim, check_int(d_model, "d_model"))
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, n_head, attention_type="galerkin", pos_dim=space_dim,
                         dim_feedforward=dim_feedforward, norm="attn")
            for _ in range(check_int(num_layers, "num_layers")))
        # The Galerkin Transformer's pointwise decoder, on point sets: [h | coords] → hidden,
        # decoder_layers × [Linear, SiLU], → out_dim.
        hidden = check_int(decoder_hidden, "decoder_hidden")
        layers: list[nn.Module] = [nn.Linear(d_model + space_dim, hidden)]
        for _ in range(check_int(decoder_layers, "decoder_layers", 0)):
            layers += [nn.Linear(hidden, hidden), nn.SiLU()]
        self.decoder = nn.Sequential(*layers, nn.Linear(hidden, check_int(out_dim, "out_dim")))

    def forward(self, x: Tensor, inputs: object = None, theta: object = None, *,
                weight: Tensor | None = None, input_weights: object = None) -> Tensor:
        """See the class docstring for shapes."""
        x, weight = _check_query(self, x, weight)
        coords = x[..., :self.space_dim]
        h = self.lift(x)
        for layer in self.encoder:
            h = layer(h, coords, weight)
        return self.decoder(torch.cat([h, coords], dim=-1))

