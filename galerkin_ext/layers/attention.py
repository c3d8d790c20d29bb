"""``SimpleAttention``: the paper's multi-head attention with coordinates in every head.

Shapes: ``x (B, N, d_model)`` tokens, ``pos (B, N, P)`` or ``(N, P)`` coordinates with
``P = pos_dim``, ``weight (B, N)`` or ``(N,)`` quadrature weights (default uniform ``1/N``).
Per head ``D = d_model // n_head`` features; with coordinates each head is ``d = D + P`` wide.

* ``fourier``  ``(Q̂ K̂ᵀ W) V̂ / sqrt(d)``, norm on Q, K — compiled op (:mod:`galerkin_ext.ops`).
* ``galerkin`` ``Q̂ (K̂ᵀ W V̂)``, norm on K, V — compiled op.
* ``softmax``  ``softmax(Q̂ K̂ᵀ / sqrt(d) + log w) V̂``, norm on Q, K — PyTorch SDPA.
* ``linear``   ``softmax_feat(Q̂) (softmax_pts(K̂)ᵀ W V̂)``, norm on K, V — plain PyTorch; the
  softmax over the points takes only points with ``w > 0``. SPEC §2's (and the original
  code's) formula: the softmax over the points already sums to 1, so ``W`` (``1/N`` by
  default) is no quadrature weight here and the attention term shrinks as ``1/N``. Unlike the
  other types it is no discretisation of one operator: a model of it evaluated at another
  resolution is not the same model.
"""

from __future__ import annotations

import math
from functools import partial
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .. import domain, ops
from .._checks import (
    check_bool,
    check_choice,
    check_float,
    check_has_keys,
    check_heads,
    check_int,
    check_norm_eps,
    check_probability,
    check_quadrature_weight,
    check_tensor,
)
from ..functional import concat_pos, log_weight_bias, opmath_dtype, per_head_layer_norm

ATTENTION_TYPES = ("fourier", "galerkin", "softmax", "linear")
NORM_SCHEMES = ("attn", "layer", "instance", None)
# The original code calls F.dropout(attn) with its default p on every forward, even in eval().
REFERENCE_DROPOUT_P = 0.5

# Which of Q, K, V carry the per-head norm: the paper normalises the two tensors whose product
# is taken over the points (K and V for Galerkin-type, Q and K for Fourier-type attention).
_NORMED = {"fourier": ("q", "k"), "softmax": ("q", "k"), "galerkin": ("k", "v"),
           "linear": ("k", "v")}


class SimpleAttention(nn.Module):
    """Multi-head self-attention of the Galerkin Transformer with coordinates in every head.

    Args:
        d_model: token width; ``n_head`` must divide it.
        n_head: number of heads ``H``.
        attention_type: ``'fourier'``, ``'galerkin'``, ``'softmax'`` or ``'linear'``.
        pos_dim: coordinate dims ``P`` concatenated in front of every head after the norm
            (0 = none). With ``P > 0`` an output projection ``Linear(H (D + P), d_model)`` maps
            the heads back to ``d_model``, and ``forward`` requires ``pos``.
        norm: ``'attn'`` (the paper's scheme: per-head affine layer norm inside the attention on
            K, V for galerkin/linear, on Q, K for fourier/softmax), ``'instance'`` (per-head
            affine instance norm over the points on the same tensors), ``'layer'`` (the norm is
            on the residual stream, see :class:`~galerkin_ext.layers.EncoderLayer`; nothing
            inside the attention) or ``None``.
        attn_dropout: dropout on the attention matrix, in training only (the Fourier type's
            N × N matrix: on the CPU by a fused op that never stores it).
        eps: epsilon of the norms.
        xavier_init: gain of the ``xavier_uniform_`` init of the Q, K, V projections.
        diagonal_weight: added to their diagonal (the paper's diagonal-dominant init).
        reference_dropout: compatibility mode reproducing the original code, which drops the
            attention matrix with ``p = 0.5`` on every forward, in ``eval()`` too, whatever
            ``attn_dropout`` says; for Fourier attention that materialises the ``N × N``
            matrix, as the reference did. Off by default.

    Parameters: ``query``, ``key``, ``value`` (``Linear(d_model, d_model)``), for
    ``norm='attn'``/``'instance'`` ``{q,k,v}_norm_weight``/``_bias`` of shape ``(H, D)``, and
    ``out_proj`` when ``pos_dim > 0``.
    """

    # Set by galerkin_ext.domain.make_domain_parallel: the points given to forward are this
    # process's shard of the sample's, split over domain_group (None: the world group).
    domain_parallel: bool = False
    domain_group: dist.ProcessGroup | None = None
    # Set by galerkin_ext.layers.draw_torch_masks: the quadratic Fourier and the softmax types
    # drop their N × N matrix with torch's dropout, not the compiled CPU ops' masks (the other
    # paths' masks are torch's).
    torch_masks: bool = False

    def __init__(
        self,
        d_model: int,
        n_head: int,
        attention_type: str = "galerkin",
        pos_dim: int = 0,
        norm: str | None = "attn",
        attn_dropout: float = 0.0,
        eps: float = 1e-5,
        xavier_init: float = 1e-2,
        diagonal_weight: float = 1e-2,
        reference_dropout: bool = False,
    ) -> None:
        super().__init__()
        check_int(d_model, "d_model")
        check_heads(n_head, d_model)
        check_choice(attention_type, "attention_type", ATTENTION_TYPES)
        check_int(pos_dim, "pos_dim", minimum=0)
        check_choice(norm, "norm", NORM_SCHEMES)
        check_bool(reference_dropout, "reference_dropout")
        self.d_model, self.n_head, self.pos_dim = d_model, n_head, pos_dim
        self.d_head = d_model // n_head
        self.attention_type, self.norm = attention_type, norm
        self.attn_dropout = check_probability(attn_dropout, "attn_dropout")
        self.eps = check_norm_eps(eps)
        self.reference_dropout = reference_dropout

        self.query, self.key, self.value = (nn.Linear(d_model, d_model) for _ in range(3))
        gain = check_float(xavier_init, "xavier_init")
        diagonal = check_float(diagonal_weight, "diagonal_weight", low_inclusive=True)
        with torch.no_grad():
            for linear in (self.query, self.key, self.value):
                nn.init.xavier_uniform_(linear.weight, gain=gain)
                linear.weight += diagonal * torch.eye(d_model)
                nn.init.zeros_(linear.bias)

        self.normed = _NORMED[attention_type] if norm in ("attn", "instance") else ()
        for name in self.normed:
            # Same init as nn.LayerNorm / nn.InstanceNorm1d(affine=True): identity affine map.
            self.register_parameter(f"{name}_norm_weight",
                                    nn.Parameter(torch.ones(n_head, self.d_head)))
            self.register_parameter(f"{name}_norm_bias",
                                    nn.Parameter(torch.zeros(n_head, self.d_head)))
        self.out_proj = nn.Linear(n_head * (self.d_head + pos_dim), d_model) if pos_dim else None

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_head={self.n_head}, "
                f"attention_type={self.attention_type!r}, pos_dim={self.pos_dim}, "
                f"norm={self.norm!r}, attn_dropout={self.attn_dropout}, eps={self.eps}, "
                f"reference_dropout={self.reference_dropout}")

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        weight: Tensor | None = None,
        *,
        return_attention: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend over the ``N`` points.

        Args:
            x: ``(B, N, d_model)``.
            pos: ``(B, N, pos_dim)`` or ``(N, pos_dim)``; required iff ``pos_dim > 0``.
            weight: ``(B, N)`` or ``(N,)`` non-negative quadrature weights; ``None`` = ``1/N``.
                Fourier and Galerkin attention are linear in them: keep their total at 1
                (e.g. ``1/N_valid`` on a padded sample's valid points).
            return_attention: also return the attention matrix (after dropout), per head:
                ``(B, H, N, N)`` for fourier/softmax, ``(B, H, D + P, D + P)`` for
                galerkin/linear (``D = d_model / H``, ``P = pos_dim``);
                float32 for half-precision ``x`` for fourier/galerkin (the op accumulates in
                it), else ``x``'s dtype.

        Returns:
            ``(B, N, d_model)``, or ``(output, attention)`` with ``return_attention``.
        """
        check_tensor(x, "x", 3, "(B, N, d_model)", self)
        batch, n, width = x.shape
        # No points is refused for every type alike; only a domain-parallel shard may be empty.
        if width != self.d_model or (n == 0 and not self.domain_parallel):
            raise ValueError(f"x: expected shape (B, N, d_model) with N >= 1 and d_model = "
                             f"{self.d_model}, got {tuple(x.shape)}")
        self._check_pos(pos, x)
        if pos is not None and pos.dtype != x.dtype:  # (under autocast: _check_pos)
            pos = pos.float()  # as autocast's float32 operands; float64 or float16 beside
            # bfloat16 activations would fail in the softmax and linear types' products
        if weight is not None:
            # Where the op validates the values itself, one host sync, not two; its messages
            # would name its own operand k where the user passed x.
            values = (self.attention_type == "linear" or self.norm == "instance"
                      or (self.attention_type == "softmax" and return_attention))
            check_quadrature_weight(weight, batch, n, x, "x", values=values)

        q, k, v = (proj(x).view(batch, n, self.n_head, self.d_head).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        norms: dict[str, tuple[Tensor, Tensor]] = {}
        if self.norm == "attn":
            norms = {name: self._norm_params(name) for name in self.normed}
        elif self.norm == "instance":
            if weight is not None:  # its moments would be 0/0
                check_has_keys(weight, batch, n, "an instance norm's moments over no points")
            tensors = {"q": q, "k": k, "v": v}
            for name in self.normed:
                tensors[name] = _instance_norm(tensors[name], *self._norm_params(name),
                                               self.eps, weight)
            q, k, v = tensors["q"], tensors["k"], tensors["v"]

        if self.reference_dropout:
            dropout_p = REFERENCE_DROPOUT_P
        else:
            dropout_p = self.attn_dropout if self.training else 0.0

        attn: Tensor | None
        fourier = self.attention_type == "fourier"
        if fourier and dropout_p > 0.0 and not (return_attention or self.torch_masks):
            # Dropout on the N×N matrix needs the pairwise order, which the op fuses on the CPU
            # (domain-parallel models refuse Fourier attention's dropout).
            out, attn = ops.fourier_attention(
                q, k, v, pos=pos, weight=weight, q_norm=norms.get("q"), k_norm=norms.get("k"),
                eps=self.eps, dropout_p=dropout_p), None
        elif self.attention_type in ("fourier", "galerkin"):
            # The N×N matrix is only needed to return it or to drop entries of it; otherwise the
            # op reassociates Fourier attention into the O(N d²) product.
            quadratic = fourier and (return_attention or dropout_p > 0.0)
            # (domain-parallel: the factored path, whose masks are torch's anyway)
            attention = (partial(domain.kernel_attention, group=self.domain_group)
                         if self.domain_parallel
                         else partial(ops.kernel_attention, torch_masks=self.torch_masks))
            out, attn = attention(
                q, k, v, pos=pos, weight=weight, q_norm=norms.get("q"), k_norm=norms.get("k"),
                v_norm=norms.get("v"), eps=self.eps, scale=None if fourier else 1.0,
                path="quadratic" if quadratic else "factored", dropout_p=dropout_p,
            )
        elif self.attention_type == "softmax":
            out, attn = _softmax_attention(q, k, v, pos, weight, norms, self.eps, dropout_p,
                                           return_attention, self.torch_masks)
        else:
            out, attn = _linear_attention(q, k, v, pos, weight, norms, self.eps, dropout_p)

        out = out.transpose(1, 2).flatten(2)
        if self.out_proj is not None:
            out = self.out_proj(out)
        # (cast: attn is None only where return_attention is False)
        return (out, cast(Tensor, attn)) if return_attention else out

    def _norm_params(self, name: str) -> tuple[Tensor, Tensor]:
        return getattr(self, f"{name}_norm_weight"), getattr(self, f"{name}_norm_bias")

    def _check_pos(self, pos: Tensor | None, x: Tensor) -> None:
        batch, n, _ = x.shape

        # Built on failure only: formatting symbolic sizes under torch.compile pins them (a
        # recompilation at every new N) and made dynamo take the valid shape for a failing one.
        def doc() -> str:
            return f"({batch}, {n}, {self.pos_dim}) or ({n}, {self.pos_dim})"

        if self.pos_dim == 0:
            if pos is not None:
                raise ValueError("pos: expected None because pos_dim = 0; build the attention "
                                 "with pos_dim > 0 to use coordinates")
            return
        if pos is None:
            raise ValueError(f"pos: expected coordinates of shape {doc()} (pos_dim = "
                             f"{self.pos_dim}), got None")
        if not isinstance(pos, Tensor):
            raise TypeError(f"pos: expected a tensor of shape {doc()}, got "
                            f"{type(pos).__name__}")
        if tuple(pos.shape) not in ((batch, n, self.pos_dim), (n, self.pos_dim)):
            raise ValueError(f"pos: expected shape {doc()}, got {tuple(pos.shape)}")
        # (under autocast the op casts both: float32 coordinates meet bfloat16 activations)
        if pos.device != x.device or (pos.dtype != x.dtype and not (
                pos.is_floating_point() and ops.under_autocast(x))):
            raise TypeError(f"pos: expected dtype {x.dtype} on {x.device} like x, "
                            f"got {pos.dtype} on {pos.device}")


def _instance_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
                   quadrature: Tensor | None) -> Tensor:
    """Per-head affine instance norm of ``x (B, H, N, D)``: each feature column over the points.

    The moments use the quadrature weights when given, so masked points (weight 0) do not leak
    into the statistics; uniform weights give ``nn.InstanceNorm1d``'s biased moments. Half
    types in float32, as :func:`~galerkin_ext.functional.per_head_layer_norm`.
    """
    work = x.to(opmath_dtype(x))
    if quadrature is None:
        mean = work.mean(dim=-2, keepdim=True)
        var = work.var(dim=-2, unbiased=False, keepdim=True)
    else:
        w = quadrature.expand(x.shape[0], x.shape[-2]).to(work.dtype)
        w = (w / w.sum(dim=-1, keepdim=True))[:, None, :, None]
        mean = (w * work).sum(dim=-2, keepdim=True)
        var = (w * (work - mean).square()).sum(dim=-2, keepdim=True)
    out = (work - mean) * torch.rsqrt(var + eps) * weight[:, None] + bias[:, None]
    return out.to(x.dtype)


def _dropout(attn: Tensor, p: float) -> Tensor:
    # The caller already decided whether dropout is active (training or compatibility mode).
    return F.dropout(attn, p, training=True) if p > 0.0 else attn


def _softmax_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None,
                       weight: Tensor | None, norms: dict[str, tuple[Tensor, Tensor]],
                       eps: float, dropout_p: float, return_attention: bool,
                       torch_masks: bool) -> tuple[Tensor, Tensor | None]:
    q_hat = concat_pos(per_head_layer_norm(q, norms.get("q"), eps), pos)
    k_hat = concat_pos(per_head_layer_norm(k, norms.get("k"), eps), pos)
    v_hat = concat_pos(v, pos)
    if not return_attention:
        return ops.continuum_attention(q_hat, k_hat, v_hat, weight=weight, dropout_p=dropout_p,
                                       torch_masks=torch_masks), None
    # softmax(QKᵀ/sqrt(d) + log w), with continuum_attention's bias and its rule for samples
    # without keys (an error; 0 where tracing skips that check); half types' logits and
    # softmax in float32, which the weights' bias may be
    work = opmath_dtype(q_hat)
    logits = q_hat.to(work) @ k_hat.to(work).transpose(-2, -1) / math.sqrt(q_hat.shape[-1])
    if weight is not None:
        check_has_keys(weight, q.shape[0], k.shape[2])
        bias, has_keys = log_weight_bias(weight, q.shape[0], k.shape[2])
        logits = logits + bias[:, None, None, :].to(work)
    attn = logits.softmax(dim=-1).to(v_hat.dtype)
    if dropout_p > 0.0:  # continuum_attention's masks: ops.dropout's over this matrix
        attn = (F.dropout if torch_masks else ops.dropout)(attn, dropout_p, training=True)
    if weight is not None:
        attn = attn * has_keys[:, :, None, None]
    return attn @ v_hat, attn


def _linear_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor | None,
                      weight: Tensor | None, norms: dict[str, tuple[Tensor, Tensor]],
                      eps: float, dropout_p: float) -> tuple[Tensor, Tensor]:
    q_hat = concat_pos(q, pos).softmax(dim=-1)
    k_logits = concat_pos(per_head_layer_norm(k, norms.get("k"), eps), pos)
    v_hat = concat_pos(per_head_layer_norm(v, norms.get("v"), eps), pos)
    if weight is None:
        v_hat = v_hat / v_hat.shape[-2]
    else:
        w = weight.expand(q.shape[0], -1)
        # The softmax over the points takes only points with w > 0: a padded point must not
        # enter the normalisation of the real ones (an element without any keeps a finite
        # softmax; its weights zero the output).
        removed = (w == 0) & (w > 0).any(dim=1, keepdim=True)
        k_logits = k_logits.masked_fill(removed[:, None, :, None], -math.inf)
        v_hat = (v_hat * w[:, None, :, None]).to(v_hat.dtype)  # (float32 w of half types)
    k_hat = k_logits.softmax(dim=-2)
    attn = _dropout(k_hat.transpose(-2, -1) @ v_hat, dropout_p)
    return q_hat @ attn, attn
