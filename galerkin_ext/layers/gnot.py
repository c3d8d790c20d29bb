"""Building blocks of GNOT (Hao et al. 2023; SPEC-gnot §2).

* :class:`ResidualMLP` — ``Linear(n_in, C) → act``, ``m × [x ← act(Linear(C, C)(x)) + x]``,
  ``Linear(C, n_out)``: GNOT's encoders and decoder.
* :class:`HeteroNormalizedAttention` — heterogeneous normalised linear attention: one query
  projection, per input function its own key and value projections and normaliser, on
  :func:`galerkin_ext.ops.hetero_normalized_attention`.
* :class:`GeometricGate` — the soft gate of the mixture of experts, computed from coordinates.
* :class:`MixtureFFN` — ``Σ_k p_k E_k(x)``, a dense soft mixture of feed-forward experts.
* :class:`GNOTBlock` — cross-attention to the inputs, mixture FFN, self-attention, mixture FFN.

Channels-last: ``(B, N, C)`` query tokens, ``(B, M_l, C)`` input tokens. Padding is weight 0:
a padded key never reaches a real query, so a sample never depends on its batch mates.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import domain, ops
from .._checks import (
    check_bool,
    check_choice,
    check_features,
    check_heads,
    check_int,
    check_like,
    check_model_input,
    check_probability,
    check_tensor,
)
from .activation import make_activation
from .dropout import Dropout

__all__ = ["GNOTBlock", "GeometricGate", "HeteroNormalizedAttention", "MixtureFFN",
           "ResidualMLP"]

FFN_NORMS = ("post", "pre")


class ResidualMLP(nn.Module):
    """``Linear(in_dim, hidden) → act``, ``num_layers × [x ← act(Linear(hidden, hidden)(x)) + x]``,
    ``Linear(hidden, out_dim)``. Input ``(..., in_dim)``, output ``(..., out_dim)``."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int,
                 activation: str = "gelu") -> None:
        super().__init__()
        self.lift = nn.Linear(check_int(in_dim, "in_dim"), check_int(hidden, "hidden"))
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden)
                                    for _ in range(check_int(num_layers, "num_layers", 0)))
        self.out = nn.Linear(hidden, check_int(out_dim, "out_dim"))
        self.activation = make_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., in_dim)`` → ``(..., out_dim)``."""
        check_features(x, "x", self.lift.in_features, self)
        x = self.activation(self.lift(x))
        for layer in self.hidden:
            x = self.activation(layer(x)) + x
        return self.out(x)


class HeteroNormalizedAttention(nn.Module):
    """``Linear(C, C)`` for ``q`` and, per input, ``k_l`` and ``v_l``; the op of SPEC-gnot §1 per
    head (``D = C / n_head``); heads merged; ``Linear(C, C)``.

    Self-attention is the case of one input equal to the queries, weighted by the query weights.

    Args:
        d_model: ``C``.
        n_head: heads (must divide ``d_model``).
        n_inputs: ``L``, the input functions (keys and values of each have their projections).
        reduce: ``"sum"`` (GNOT's code) or ``"mean"`` (its paper) over the inputs.
        skip: add ``softmax(q)`` to each head's output (the reference's in-attention identity).
    """

    # Set by galerkin_ext.domain.make_domain_parallel: the points given to forward are this
    # process's shard of the sample's, split over domain_group (None: the world group).
    domain_parallel: bool = False
    domain_group: dist.ProcessGroup | None = None

    def __init__(self, d_model: int, n_head: int, n_inputs: int, reduce: str = "sum",
                 skip: bool = True) -> None:
        super().__init__()
        check_int(d_model, "d_model")
        self.n_head = check_heads(n_head, d_model)
        check_bool(skip, "skip")
        self.reduce = check_choice(reduce, "reduce", ("sum", "mean"))
        self.skip = skip
        self.query = nn.Linear(d_model, d_model)
        self.keys = nn.ModuleList(nn.Linear(d_model, d_model)
                                  for _ in range(check_int(n_inputs, "n_inputs")))
        self.values = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_inputs))
        self.out = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, reduce={self.reduce!r}, skip={self.skip}"

    def _heads(self, x: Tensor) -> Tensor:
        """``(B, N, C)`` → ``(B, H, N, C / H)``."""
        b, n, c = x.shape
        return x.view(b, n, self.n_head, c // self.n_head).transpose(1, 2)

    def forward(self, x: Tensor, inputs: Sequence[Tensor],
                weights: Sequence[Tensor | None] | None = None) -> Tensor:
        """``x (B, N, C)``, ``inputs`` ``L`` tensors ``(B, M_l, C)``, ``weights`` ``L`` key
        weights ``(B, M_l)`` / ``(M_l,)`` / ``None`` (uniform), or ``None`` for all uniform
        → ``(B, N, C)``."""
        channels = self.query.in_features
        check_tensor(x, "x", 3, f"(B, N, d_model = {channels})", self)
        if x.shape[2] != channels:
            raise ValueError(f"x: expected shape (B, N, d_model = {channels}), got "
                             f"{tuple(x.shape)}")
        n_inputs = len(self.keys)
        weights = [None] * n_inputs if weights is None else weights
        if not isinstance(inputs, Sequence) or not isinstance(weights, Sequence) or (
            len(inputs) != n_inputs or len(weights) != n_inputs
        ):
            raise ValueError(f"inputs, weights: expected sequences of {n_inputs} (one per "
                             f"input function; a weight may be None), got {_count(inputs)} "
                             f"and {_count(weights)}")
        for i, y in enumerate(inputs):
            check_tensor(y, f"inputs[{i}]", 3, f"(B, M, d_model = {channels})")
            check_like(y, f"inputs[{i}]", x, "x")
            if y.shape[0] != x.shape[0] or y.shape[2] != channels:
                raise ValueError(f"inputs[{i}]: expected shape (B = {x.shape[0]}, M, d_model = "
                                 f"{channels}), got {tuple(y.shape)}")
        q = self._heads(self.query(x))
        ks = [self._heads(key(y)) for key, y in zip(self.keys, inputs, strict=True)]
        vs = [self._heads(value(y)) for value, y in zip(self.values, inputs, strict=True)]
        attention = (partial(domain.hetero_normalized_attention, group=self.domain_group)
                     if self.domain_parallel else ops.hetero_normalized_attention)
        z = attention(q, ks, vs, weights=list(weights), reduce=self.reduce, skip=self.skip)
        return self.out(z.transpose(1, 2).flatten(2))


def _count(items: object) -> str:
    """How many items a sequence holds, for messages; else the type given."""
    return str(len(items)) if isinstance(items, Sequence) else type(items).__name__


class GeometricGate(nn.Module):
    """``p = softmax(Linear(F, K) ∘ act ∘ Linear(F, F) ∘ act ∘ Linear(d, F) (coords))``:
    ``coords (B, N, d)`` → expert probabilities ``(B, N, K)``, a function of position only."""

    def __init__(self, space_dim: int, hidden: int, n_experts: int,
                 activation: str = "gelu") -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(check_int(space_dim, "space_dim"), check_int(hidden, "hidden")),
            make_activation(activation), nn.Linear(hidden, hidden), make_activation(activation),
            nn.Linear(hidden, check_int(n_experts, "n_experts", 2)))

    def forward(self, coords: Tensor) -> Tensor:
        """``coords (B, N, d)`` → ``(B, N, K)``, rows summing to 1."""
        space_dim = self.net[0].in_features
        check_tensor(coords, "coords", 3, f"(B, N, space_dim = {space_dim})")
        if coords.shape[2] != space_dim:
            raise ValueError(f"coords: expected shape (B, N, space_dim = {space_dim}), got "
                             f"{tuple(coords.shape)}")
        check_model_input(coords, "coords", self)
        return torch.softmax(self.net(coords), dim=-1)


class MixtureFFN(nn.Module):
    """``Σ_k p_k E_k(x)`` with experts ``E_k = Linear(C, F) → act → Linear(F, C)``; every expert
    runs on every point (dense soft mixture, as GNOT). One expert: ``E_1(x)``, no probabilities.
    """

    def __init__(self, d_model: int, hidden: int, n_experts: int,
                 activation: str = "gelu") -> None:
        super().__init__()
        check_int(d_model, "d_model")
        check_int(hidden, "hidden")
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, hidden), make_activation(activation),
                          nn.Linear(hidden, d_model))
            for _ in range(check_int(n_experts, "n_experts")))

    def forward(self, x: Tensor, probs: Tensor | None) -> Tensor:
        """``x (B, N, C)``, ``probs (B, N, K)`` (``None`` for one expert) → ``(B, N, C)``."""
        # (ignore: an nn.ModuleList item is typed as a plain Module; each expert is a Sequential)
        check_features(x, "x", self.experts[0][0].in_features, self)  # type: ignore[index]
        if len(self.experts) == 1:
            return self.experts[0](x)
        if not isinstance(probs, Tensor) or probs.shape != (*x.shape[:-1], len(self.experts)):
            raise ValueError(f"probs: expected shape {(*x.shape[:-1], len(self.experts))}, got "
                             f"{tuple(probs.shape) if isinstance(probs, Tensor) else probs}")
        check_like(probs, "probs", x, "x")
        out = probs[..., 0:1] * self.experts[0](x)
        for k in range(1, len(self.experts)):
            out = out + probs[..., k:k + 1] * self.experts[k](x)
        return out


class GNOTBlock(nn.Module):
    """One GNOT block (SPEC-gnot §2), ``ffn_norm="post"``::

        x ← x + drop(CrossHNA(LN1(x); LN2_1(Y_1), …, LN2_L(Y_L)))
        x ← x + LN3(Σ_k p_k E1_k(x))
        x ← x + drop(SelfHNA(LN4(x)))
        x ← x + LN5(Σ_k p_k E2_k(x))

    ``ffn_norm="pre"`` (the reference's CGPT) moves LN3/LN5 in front of the mixtures:
    ``x ← x + Σ_k p_k E_k(LN(x))``. The input tokens ``Y_l`` are not updated.

    Args:
        d_model: ``C``; n_head: heads; n_inputs: ``L``; hidden: ``F``, the experts' width;
        n_experts: ``K``; activation: of the experts; dropout: on the two attention branches;
        reduce: over the inputs of the cross-attention; self_skip: the self-attention's
        ``skip`` (the cross-attention always has it); ffn_norm: ``"post"`` or ``"pre"``.
    """

    def __init__(self, d_model: int, n_head: int, n_inputs: int, hidden: int, n_experts: int = 1,
                 activation: str = "gelu", dropout: float = 0.0, reduce: str = "sum",
                 self_skip: bool = True, ffn_norm: str = "post") -> None:
        super().__init__()
        self.ffn_norm = check_choice(ffn_norm, "ffn_norm", FFN_NORMS)
        self.cross = HeteroNormalizedAttention(d_model, n_head, n_inputs, reduce, skip=True)
        self.self_attn = HeteroNormalizedAttention(d_model, n_head, 1, "sum", skip=self_skip)
        self.norm_query = nn.LayerNorm(d_model)
        self.norm_inputs = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n_inputs))
        self.norm_ffn1 = nn.LayerNorm(d_model)
        self.norm_self = nn.LayerNorm(d_model)
        self.norm_ffn2 = nn.LayerNorm(d_model)
        self.ffn1 = MixtureFFN(d_model, hidden, n_experts, activation)
        self.ffn2 = MixtureFFN(d_model, hidden, n_experts, activation)
        self.dropout = Dropout(check_probability(dropout, "dropout"))

    def extra_repr(self) -> str:
        return f"ffn_norm={self.ffn_norm!r}"

    def _mixture(self, ffn: MixtureFFN, norm: nn.LayerNorm, x: Tensor,
                 probs: Tensor | None) -> Tensor:
        if self.ffn_norm == "post":
            return x + norm(ffn(x, probs))
        return x + ffn(norm(x), probs)

    def forward(self, x: Tensor, inputs: Sequence[Tensor], input_weights: Sequence[Tensor | None],
                weight: Tensor | None, probs: Tensor | None) -> Tensor:
        """``x (B, N, C)``, ``inputs`` ``L`` × ``(B, M_l, C)`` with ``input_weights``, query
        ``weight (B, N)`` or ``None`` (the self-attention's key weights), ``probs (B, N, K)``
        → ``(B, N, C)``."""
        if not isinstance(inputs, Sequence) or len(inputs) != len(self.norm_inputs):
            raise ValueError(f"inputs: expected a sequence of {len(self.norm_inputs)} input "
                             f"functions' tokens, got {_count(inputs)}")
        d_model = self.norm_query.normalized_shape[0]  # (the norms would name only theirs)
        for name, t in (("x", x), *((f"inputs[{i}]", y) for i, y in enumerate(inputs))):
            check_tensor(t, name, 3, f"(B, points, d_model = {d_model})", self)
            if t.shape[-1] != d_model:
                raise ValueError(f"{name}: expected shape (B, points, d_model = {d_model}), got "
                                 f"{tuple(t.shape)}")
        ys = [norm(y) for norm, y in zip(self.norm_inputs, inputs, strict=True)]
        x = x + self.dropout(self.cross(self.norm_query(x), ys, input_weights))
        x = self._mixture(self.ffn1, self.norm_ffn1, x, probs)
        h = self.norm_self(x)
        x = x + self.dropout(self.self_attn(h, [h], [weight]))
        return self._mixture(self.ffn2, self.norm_ffn2, x, probs)
