"""Domain-parallel attention: one sample's points split over the processes of a group.

Data parallelism (``torchrun`` + DDP, :mod:`galerkin_ext.training.distributed`) spreads many
samples; this module spreads the points of one sample that is too large for one device. The
softmax-free attention types need, for every query, only the key side's reduction
``S = K̂ᵀ W V̂`` (``(P + D) × (P + D_v)`` per head, plus the normaliser column ``Σ_j w_j k̃_j`` for
normalised attention). Each process computes the ``S`` of its own keys, the group sums them in
one all-reduce, and each process applies the sum to its own queries. The backward sums
``∂L/∂S`` the same way (the loss is the sum of the ranks' losses, and every rank's ``S`` reaches
every rank's queries), so an attention layer costs one all-reduce of ``B·H·d·d_v`` numbers in
the forward and one in the backward, whatever the number of points. Layer norms, feed-forward
blocks and other pointwise maps need no communication at all.

* :class:`DomainSplit` — contiguous, possibly uneven or empty, shards of ``n`` points over the
  ranks, with their quadrature weights; :meth:`DomainSplit.gather` puts the shards back
  together (for metrics and plots); :class:`PointShards` — a dataset's samples cut to this
  rank's points.
* :func:`galerkin_attention`, :func:`fourier_attention` (the factored path),
  :func:`kernel_attention`, :func:`normalized_attention`, :func:`hetero_normalized_attention` —
  the ops of :mod:`galerkin_ext.ops` with the same arguments plus ``group``, on this process's
  shard of the queries and of the keys.
* :func:`make_domain_parallel` — turns the attention layers of a model (the paper's encoder,
  GNOT's blocks) domain-parallel, or says which part of the model needs the whole grid.
* :func:`sum_gradients` — the parameters' gradients summed over the group (each rank's
  backward gives the part of the sample's gradient that flows through its own points).
* :func:`sum_over_ranks` — a differentiable sum over the group, for losses and metrics of the
  whole sample from each rank's sums over its own points.
* Training: :class:`~galerkin_ext.training.Trainer` with ``parallel="domain"``;
  ``examples/domain_parallel.py`` shows the whole pattern.

Weights: each rank passes its own points' quadrature weights. ``weight=None`` means uniform
weights ``1/N`` over the *whole* sample's ``N`` points: the ranks' point counts travel in the
same all-reduce as the partial sums. The normalised forms use only the weights' ratios and take
them as given (the single-process ops scale each sample's weights to sum 1, which no shard can
do on its own; mathematically the same, since the ratios are unchanged).

Requirements: every rank of the group calls every attention layer in the same order (also with
no points of its own) and runs the backward of a loss that depends on each layer's output (sum
the ranks' losses: a mean over an empty shard is NaN); every key point lives on exactly one
rank. The ranks' calls agree in everything but their own points: batch, heads, widths and
``dropout_p`` size the all-reduce, and a rank whose call makes another size stops the group
(gloo and NCCL abort, or wait until the group's timeout, without a message of ours), but calls
of other shapes and one size (``B`` and ``H`` swapped, ``D`` and ``D_v``) are not told apart:
their sums are added as if they matched, a wrong answer on every rank. Whether ``weight``
is ``None`` travels in the all-reduce, and a mix is refused on every rank. An argument that
one rank refuses on its own (a negative weight, a missing ``kv_pos``) raises there before the
all-reduce: under torchrun that process's exit ends the others, but a process that catches
the error leaves them waiting until the group's timeout. As in the single-process ops,
``kv_pos=None`` with ``pos`` given takes ``pos`` for the keys where a shard has as many keys
as queries, and is refused where it has not: pass ``kv_pos`` on every rank for
cross-attention. Without an initialised process group, or with a group of one process, the
functions are exactly the single-process ops.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import Dataset

from . import functional, ops
from ._checks import (
    check_choice,
    check_device,
    check_float_dtype,
    check_int,
    check_probability,
)

__all__ = ["DomainSplit", "PointShards", "fourier_attention", "galerkin_attention",
           "hetero_normalized_attention", "kernel_attention", "make_domain_parallel",
           "normalized_attention", "sum_gradients", "sum_over_ranks"]

Norm = tuple[Tensor, Tensor] | None


# ----------------------------------------------------------------------------------------------
# The process group


def _world(group: object) -> dist.ProcessGroup | None:
    """The checked ``group`` (``None``: the world group), or ``None`` where there is no
    initialised process group."""
    if dist.is_available() and group is dist.GroupMember.NON_GROUP_MEMBER:
        # (what torch.distributed.new_group returns to the processes it leaves out)
        raise ValueError("group: this process is not a member of the group")
    if group is not None and not (dist.is_available()
                                  and isinstance(group, dist.ProcessGroup)):
        raise TypeError(f"group: expected a torch.distributed ProcessGroup or None (the world "
                        f"group), got {type(group).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("group: given, but torch.distributed is not initialised "
                             "(call torch.distributed.init_process_group first)")
        return None
    if group is None:
        return dist.group.WORLD
    if dist.get_rank(group) < 0:
        raise ValueError("group: this process is not a member of the group")
    return group


def _split_group(group: object) -> dist.ProcessGroup | None:
    """The group the points are split over, or ``None`` where this process holds them all
    (no initialised process group, or a group of one): then the single-process ops run."""
    world = _world(group)
    return world if world is not None and dist.get_world_size(world) > 1 else None


class _SumOverGroup(torch.autograd.Function):
    """``(Σ_r s_r, Σ_r extra_r)`` over the ranks of a group in one all-reduce of the two
    stacked. The backward sums the gradient of ``s`` over the group: each rank's ``s`` reaches
    every rank's loss through the sum, and the total loss is the sum of the ranks' losses.
    ``extra`` (point counts, a dropout mask) has no gradient."""

    @staticmethod
    def forward(ctx, s: Tensor, extra: Tensor, group: dist.ProcessGroup):
        ctx.group = group
        buffer = torch.cat([s.reshape(-1), extra.to(s.dtype)])
        dist.all_reduce(buffer, group=group)
        total, extra_total = buffer.split([s.numel(), extra.numel()])
        ctx.mark_non_differentiable(extra_total)
        return total.view(s.shape), extra_total

    @staticmethod
    def backward(ctx, grad_total: Tensor, grad_extra: Tensor | None):
        # Through this Function again, so that a double backward sums over the group too.
        grad, _ = _SumOverGroup.apply(grad_total, grad_total.new_empty(0), ctx.group)
        return grad, None, None


def sum_over_ranks(x: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """``x`` summed over the ranks of ``group`` (``None``: the world group), differentiably:
    e.g. each rank's per-sample sums over its own points (``(B, ...)``) become the whole
    samples' sums, the same on every rank.

    A loss built from such sums is the whole batch's loss on every rank; give each rank's
    backward that loss divided by the number of ranks (the ranks' shares then add up to it,
    and the backward of the sum adds up the ranks' gradients). ``x`` has one shape and dtype on
    every rank (they size the all-reduce; not compared, which would cost a second collective).
    Without a process group of more than one process, ``x`` itself.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a tensor, got {type(x).__name__}")
    world = _split_group(group)
    return x if world is None else _group_sum(x, None, world)[0]


def _group_sum(s: Tensor, extra: Tensor | None, group: dist.ProcessGroup) -> tuple[Tensor, Tensor]:
    """``s`` (differentiable) and the flat ``extra`` (or nothing) summed over ``group`` in one
    all-reduce."""
    return _SumOverGroup.apply(s, s.new_empty(0) if extra is None else extra, group)


# ----------------------------------------------------------------------------------------------
# One shard's halves of the op core


def _shard_kv_reduce(
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
    """This shard's ``S = K̂ᵀ W V̂`` (arguments as :func:`galerkin_ext.ops.kv_reduce`).

    ``weight=None`` means weight 1 on every point: the same constant on every rank (the op's
    ``1/M`` would be the shard's ``M``); the callers fix its scale. A shard without keys gives
    zeros (a sum over no points)."""
    if weight is None:
        weight = torch.ones(k.shape[2], dtype=functional.opmath_dtype(k), device=k.device)
    return ops._kv_reduce(k, v, kv_pos=kv_pos, weight=weight, k_map=k_map, k_norm=k_norm,
                          v_map=v_map, v_norm=v_norm, eps=eps,
                          ones_column=ones_column)  # (checked arguments)


def _summed_q_apply(q: Tensor, s: Tensor, *, group: dist.ProcessGroup,
                    weights: Sequence[Tensor | None] | None, normalizers: int,
                    **kwargs: Any) -> Tensor:
    """``q_apply`` of the ranks' summed ``S``: the normalised forms' one all-reduce, after
    every input's block is stacked into ``s``. Whether this rank's keys of each input have
    ``weights`` (checked by now) is counted in the same all-reduce: a rank's ``None`` (weight
    1 a point) mixed with other ranks' weights would give a wrong sum without an error."""
    weighted = [False] * normalizers if weights is None else [w is not None for w in weights]
    total, given = _group_sum(s, torch.tensor(weighted, dtype=s.dtype, device=s.device),
                              group)
    size = dist.get_world_size(group)
    for i, count in enumerate(given.tolist()):
        if count not in (0, size):  # (the same sums on every rank: each raises)
            raise ValueError(f"weights[{i}]: given on {int(count)} of the {size} ranks and "
                             "None on the others; pass weights on every rank or on none")
    return ops._q_apply(q, total, normalizers=normalizers, **kwargs)


# ----------------------------------------------------------------------------------------------
# The domain-parallel ops


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
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """:func:`galerkin_ext.ops.galerkin_attention` with the points split over ``group``.

    ``q (B, H, N_r, D)``, ``k (B, H, M_r, D)``, ``v (B, H, M_r, D_v)``, ``pos (B, N_r, P)`` or
    ``(N_r, P)``, ``kv_pos``, ``weight (B, M_r)`` or ``(M_r,)``: this rank's points (``N_r`` and
    ``M_r`` may be 0); ``weight=None`` is ``1/M`` over the whole sample. Dropout draws one mask
    of the ``d × d_v`` matrix for the whole sample (on the group's rank 0; it travels in the
    same all-reduce). ``group``: a process group, ``None`` for the world group. Returns this
    rank's ``(B, H, N_r, P + D_v)``.
    """
    out, _ = kernel_attention(
        q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, k_norm=k_norm, v_norm=v_norm, eps=eps,
        scale=1.0, path="factored", dropout_p=dropout_p, group=group)
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
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """:func:`galerkin_ext.ops.fourier_attention` with the points split over ``group``, on the
    factored path ``Q̂ (K̂ᵀ W V̂) · scale`` (``path`` ``"auto"`` or ``"factored"``).

    The quadratic path and dropout (which acts on the ``N × M`` matrix) are not
    domain-parallel: no rank holds that matrix. Shapes and ``weight`` as
    :func:`galerkin_attention`. Returns this rank's ``(B, H, N_r, P + D_v)``.
    """
    dropout_p = check_probability(dropout_p, "dropout_p")
    check_choice(path, "path", ("auto", "factored", "quadratic"))
    if dropout_p > 0.0:
        raise ValueError("dropout_p: Fourier-type attention drops entries of the N × M "
                         "attention matrix, which no rank holds; it is not domain-parallel "
                         f"(got dropout_p={dropout_p})")
    out, _ = kernel_attention(
        q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, q_norm=q_norm, k_norm=k_norm, eps=eps,
        scale=scale, path="factored" if path == "auto" else path, group=group)
    return out


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
    group: dist.ProcessGroup | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`galerkin_ext.ops.kernel_attention` with the points split over ``group``:
    ``out = Q̂ A``, ``A = scale · Σ_ranks K̂ᵀ W V̂`` (``path="factored"`` only: the quadratic
    path forms the ``N × M`` matrix, which no rank holds).

    One all-reduce in the forward (``A``'s partial sums, with the point counts for
    ``weight=None`` and the dropout mask for ``dropout_p > 0``, drawn on the group's rank 0)
    and one in the backward. Shapes and ``weight`` as :func:`galerkin_attention`. Returns
    ``(out (B, H, N_r, P + D_v), A (B, H, P + D, P + D_v))``; ``A`` is the whole sample's, the
    same on every rank.
    """
    if path != "factored":
        check_choice(path, "path", ("factored", "quadratic"))
        raise ValueError("path: 'quadratic' forms the N × M matrix of every query with every "
                         "key, which no rank holds; only 'factored' is domain-parallel")
    world = _split_group(group)
    if world is None:
        return ops.kernel_attention(
            q, k, v, pos=pos, kv_pos=kv_pos, weight=weight, q_norm=q_norm, k_norm=k_norm,
            v_norm=v_norm, eps=eps, scale=scale, path="factored", dropout_p=dropout_p)
    a = ops.kernel_arguments(q, k, v, pos, kv_pos, weight, q_norm, k_norm, v_norm, eps, scale,
                             dropout_p, allow_empty=True)
    q, k, v, pos, kv_pos, weight = a.q, a.k, a.v, a.pos, a.kv_pos, a.weight
    q_norm, k_norm, v_norm, eps, scale, dropout_p = (a.q_norm, a.k_norm, a.v_norm, a.eps,
                                                     a.scale, a.dropout_p)

    s = _shard_kv_reduce(k, v, kv_pos=kv_pos, weight=weight, k_map=functional.norm_map(k_norm),
                         k_norm=k_norm, v_map=functional.norm_map(v_norm), v_norm=v_norm,
                         eps=eps, ones_column=False)
    # The shard's key count (S is divided by the whole sample's where weight is None) and
    # whether it has weights, on every rank whatever its weight: the all-reduce keeps one size,
    # and a rank's None among other ranks' weights is refused on every rank.
    extra = [s.new_tensor([float(a.m), float(weight is not None)])]
    mask_shape = a.attn_shape
    if dropout_p > 0.0:
        # One mask for the whole sample, drawn as the single-process op draws it; the other
        # ranks add zeros.
        mask = (ops.dropout_mask(mask_shape, dropout_p, s.dtype, s.device)
                if dist.get_rank(world) == 0 else s.new_zeros(mask_shape))
        extra.append(mask.reshape(-1))
    attn, extra_total = _group_sum(s, torch.cat(extra), world)
    size = dist.get_world_size(world)
    given = int(extra_total[1])
    if given not in (0, size):  # (the same sums on every rank: each raises)
        raise ValueError(f"weight: given on {given} of the {size} ranks and None on the "
                         "others; pass weight on every rank or on none")
    if weight is None:
        # (a sample without keys on any rank sums to 0, and gets 0 like one whose weights are)
        attn = attn / extra_total[0].clamp_min(1.0)
    if scale != 1.0:
        attn = attn * scale
    if dropout_p > 0.0:
        attn = attn * extra_total[-mask.numel():].view(mask_shape)
    out = ops._q_apply(q, attn, pos=pos, q_map=functional.norm_map(q_norm), q_norm=q_norm,
                       eps=eps, normalizers=0)
    return out, attn


def normalized_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    pos: Tensor | None = None,
    kv_pos: Tensor | None = None,
    weight: Tensor | None = None,
    skip: bool = False,
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """:func:`galerkin_ext.ops.normalized_attention` (GNOT's normalised linear attention) with
    the points split over ``group``: one all-reduce of ``[S | s]`` in the forward, one in the
    backward.

    Shapes as :func:`galerkin_attention`; ``weight`` this rank's key weights (only the ratios
    over the whole sample matter; ``None`` is uniform). Returns this rank's
    ``(B, H, N_r, P + D_v)``.
    """
    world = _split_group(group)
    if world is None:
        return ops.normalized_attention(q, k, v, pos=pos, kv_pos=kv_pos, weight=weight,
                                        skip=skip)
    return functional.normalized_core(
        q, [k], [v], pos=pos, kv_pos=[kv_pos], weights=[weight], reduce="sum", skip=skip,
        hetero=False, kv_reduce_fn=_shard_kv_reduce,
        q_apply_fn=partial(_summed_q_apply, group=world, weights=[weight]), sharded=True)


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
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    """:func:`galerkin_ext.ops.hetero_normalized_attention` with the points of the queries
    and of each input function split over ``group``: the ``L`` blocks ``[S_l | s_l]`` travel
    in one all-reduce in the forward, and their gradients in one in the backward.

    ``ks[l] (B, H, M_l,r, D)``, ``vs[l]``, ``kv_pos[l]``, ``weights[l]``: this rank's points of
    input ``l`` (possibly none). An input that every rank holds whole (GNOT's one-point θ
    token, weight ``None``) also works: each of its terms is counted once per rank, a factor
    its own normaliser cancels. Returns this rank's ``(B, H, N_r, P + D_v)``.
    """
    world = _split_group(group)
    if world is None:
        return ops.hetero_normalized_attention(q, ks, vs, pos=pos, kv_pos=kv_pos,
                                               weights=weights, reduce=reduce, skip=skip)
    return functional.normalized_core(
        q, ks, vs, pos=pos, kv_pos=kv_pos, weights=weights, reduce=reduce, skip=skip,
        hetero=True, kv_reduce_fn=_shard_kv_reduce,
        q_apply_fn=partial(_summed_q_apply, group=world, weights=weights), sharded=True)


# ----------------------------------------------------------------------------------------------
# The split of a sample's points


def _check_points(x: object, dim: object, n: int, what: str) -> None:
    """``x`` a tensor with ``n`` points (``what`` names them) on its axis ``dim``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a tensor, got {type(x).__name__}")
    if (isinstance(dim, bool) or not isinstance(dim, numbers.Integral)
            or not -x.dim() <= int(dim) < x.dim()):
        raise ValueError(f"dim: expected an axis of x, which has {x.dim()}, got {dim!r}")
    if x.shape[dim] != n:
        raise ValueError(f"x: expected {what} = {n} points on axis {dim}, got shape "
                         f"{tuple(x.shape)}")


class DomainSplit:
    """Contiguous shards of a sample's ``n`` points over the ranks of a process group: the
    group's rank ``r`` holds points ``[start_r, start_r + counts[r])``. Shards may be uneven or
    empty.

    Args:
        counts: points per rank, one int ``>= 0`` for each rank of ``group``, in group-rank
            order.
        group: the process group, ``None`` for the world group; without an initialised
            process group, one rank holds every point (``counts`` has one entry).

    Constructing it is a collective: every rank of ``group`` does it, with the same
    ``counts`` (compared across the ranks; a mismatch is refused on every rank).

    Attributes: ``counts``, ``n`` (their sum), ``rank``, ``world_size``, ``start``, ``stop``
    and ``local_n`` (this rank's points ``[start, stop)``).
    """

    def __init__(self, counts: Sequence[int], group: dist.ProcessGroup | None = None) -> None:
        self.group = _world(group)
        self.world_size = 1 if self.group is None else dist.get_world_size(self.group)
        self.rank = 0 if self.group is None else dist.get_rank(self.group)
        valid = not isinstance(counts, (str, bytes)) and isinstance(counts, Sequence) and len(
            counts) == self.world_size and all(isinstance(c, numbers.Integral) and not isinstance(
                c, bool) and c >= 0 for c in counts)
        # (ignore: None only on the way to the ValueError below, after the collective)
        self.counts: tuple[int, ...] = (tuple(int(c) for c in counts)
                                        if valid else None)  # type: ignore[assignment]
        # Every rank reaches the comparison, valid counts or not: a rank refusing its own
        # before it would leave the others waiting in the collective.
        every: list[tuple[int, ...] | None] = [self.counts]
        if self.world_size > 1:  # shards from different splits would overlap or miss points
            every = [None] * self.world_size
            dist.all_gather_object(every, self.counts, group=self.group)
        if not valid:
            raise ValueError(f"counts: expected one int >= 0 per rank of the group "
                             f"({self.world_size} ranks), got {counts!r}")
        if any(other != self.counts for other in every):
            raise ValueError("counts: every rank must give the same valid counts, got "
                             + ", ".join(f"{c} on rank {r}" for r, c in enumerate(every)))
        self.n = sum(self.counts)
        self.start = sum(self.counts[:self.rank])
        self.local_n = self.counts[self.rank]
        self.stop = self.start + self.local_n

    @classmethod
    def even(cls, n: int, group: dist.ProcessGroup | None = None) -> DomainSplit:
        """``n`` points in shards as even as they can be: the first ``n mod world_size`` ranks
        hold one point more. A collective, as the constructor (a rank's invalid ``n`` is
        refused on every rank)."""
        problem = None
        try:
            check_int(n, "n", 0)
        except (TypeError, ValueError) as error:
            problem = error
        world = _world(group)
        size = 1 if world is None else dist.get_world_size(world)
        counts = None if problem else [n // size + (r < n % size) for r in range(size)]
        try:
            # (ignore: a None is refused by the constructor, on every rank, after its collective)
            return cls(counts, group)  # type: ignore[arg-type]  # every rank reaches its collective
        except ValueError:
            if problem is not None:
                raise problem from None
            raise

    def __repr__(self) -> str:
        return (f"DomainSplit(counts={self.counts}, rank={self.rank}, "
                f"points=[{self.start}, {self.stop}))")

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """This rank's points of ``x``, whose axis ``dim`` holds all ``n`` (e.g. ``(B, n, C)``
        with ``dim=1``, ``(n, P)`` coordinates with ``dim=0``): a view with ``local_n`` there."""
        _check_points(x, dim, self.n, "the split's n")
        return x.narrow(dim, self.start, self.local_n)

    def local_weight(self, weight: Tensor | None = None, *, dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
        """This rank's quadrature weights: of ``weight (B, n)`` or ``(n,)``, the shard on the
        last axis; for ``None``, uniform ``1/n`` over the whole sample, ``(local_n,)`` of
        ``dtype`` on ``device``."""
        if weight is None:
            check_float_dtype(dtype)
            if self.n == 0:
                raise ValueError("weight: uniform weights 1/n need n >= 1 points, the split "
                                 "has none")
            return torch.full((self.local_n,), 1.0 / self.n, dtype=dtype,
                              device=check_device(device))
        if not isinstance(weight, Tensor):
            raise TypeError(f"weight: expected a tensor (B, n) or (n,) with n = {self.n}, got "
                            f"{type(weight).__name__}")
        if weight.dim() not in (1, 2) or weight.shape[-1] != self.n:
            raise ValueError(f"weight: expected shape (B, n) or (n,) with n = {self.n}, got "
                             f"{tuple(weight.shape)}")
        return self.shard(weight, dim=-1)

    def gather(self, x: Tensor, dim: int = 1) -> Tensor:
        """Every rank's shard of ``x`` (``local_n`` points on axis ``dim``) put together, on
        every rank: ``n`` points on axis ``dim``. A collective (every rank calls it, with
        shards of one dtype and equal sizes but on ``dim``: compared first, and a rank's
        invalid ``x`` is refused on every rank); not differentiable (for metrics and plots)."""
        problem = None
        try:
            _check_points(x, dim, self.local_n, "this rank's local_n")
        except (TypeError, ValueError) as error:
            problem = error
        if self.world_size == 1:
            if problem is not None:
                raise problem
            return x.detach()
        # What every rank holds (the shape with None on dim), compared before the gather, which
        # would mix shards of other shapes: garbage on one rank, an abort on another.
        # (ignore: None only where problem is raised below, after the collective)
        dim = None if problem else dim % x.dim()  # type: ignore[assignment]
        layout = None if problem else (str(x.dtype), (*x.shape[:dim], None, *x.shape[dim + 1:]))
        every = [None] * self.world_size
        dist.all_gather_object(every, layout, group=self.group)
        if problem is not None:
            raise problem
        if any(other != layout for other in every):
            held = ("an invalid x" if o is None else f"{o[0]} of shape {o[1]}" for o in every)
            raise ValueError("x: every rank must give one dtype and shape but on dim, got "
                             + ", ".join(f"{h} on rank {r}" for r, h in enumerate(held)))
        # gloo gathers equal sizes only: every shard padded to the largest, then cut back
        longest = max(self.counts)
        pad = list(x.shape)
        pad[dim] = longest - self.local_n
        padded = torch.cat([x.detach(), x.new_zeros(pad)], dim=dim).contiguous()
        pieces = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(pieces, padded, group=self.group)
        return torch.cat([p.narrow(dim, 0, c) for p, c in zip(pieces, self.counts, strict=True)],
                         dim=dim)


class PointShards(Dataset):
    """The samples of ``dataset`` with only this rank's points of ``split``: what each rank's
    data loader hands it in domain-parallel training.

    ``dataset[i]`` must be a dict of tensors; for each ``key: grid_dims`` of ``point_dims``
    the entry's first ``grid_dims`` axes (a grid ``(s, s, C)`` has 2, a point list ``(n, C)``
    1) are flattened to the ``split.n`` points (row-major) and cut to this rank's
    ``[split.start, split.stop)``: ``(local_n, C)``. Other entries are left out. A wrapper
    around a dataset held in memory; a dataset too large for one process should read only its
    shard itself (e.g. by HDF5 slicing).
    """

    def __init__(self, dataset: Dataset, split: DomainSplit,
                 point_dims: Mapping[str, int]) -> None:
        if not isinstance(dataset, Dataset) or not hasattr(dataset, "__len__"):
            raise TypeError(f"dataset: expected a torch Dataset with __len__, got "
                            f"{type(dataset).__name__}")
        if not isinstance(split, DomainSplit):
            raise TypeError(f"split: expected a DomainSplit, got {type(split).__name__}")
        if not isinstance(point_dims, Mapping) or not point_dims or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1
                for d in point_dims.values()):
            raise ValueError(f"point_dims: expected a non-empty dict of key -> number of "
                             f"grid axes (int >= 1), got {point_dims!r}")
        self.dataset, self.point_dims = dataset, dict(point_dims)
        # the split's numbers, not the split: its process group cannot be pickled into the
        # DataLoader's worker processes where they are spawned (macOS, Windows)
        self.n, self.start, self.local_n = split.n, split.start, split.local_n

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        item = self.dataset[i]
        if not isinstance(item, Mapping):
            raise TypeError(f"dataset[{i}]: expected a sample dict of named tensors (as "
                            f"point_dims names them), got {type(item).__name__}")
        out = {}
        for key, grid_dims in self.point_dims.items():
            if key not in item:
                raise KeyError(f"point_dims: the samples have no {key!r} (keys {sorted(item)})")
            value = item[key]
            if not isinstance(value, Tensor):
                raise TypeError(f"dataset[{i}][{key!r}]: expected a tensor, got "
                                f"{type(value).__name__}")
            if value.dim() <= grid_dims:
                raise ValueError(f"dataset[{i}][{key!r}]: expected {grid_dims} grid axes and "
                                 f"channels, got shape {tuple(value.shape)}")
            points = value.flatten(0, grid_dims - 1)
            if points.shape[0] != self.n:
                raise ValueError(f"dataset[{i}][{key!r}]: expected the split's n = {self.n} "
                                 f"points on its {grid_dims} grid axes, got shape "
                                 f"{tuple(value.shape)}")
            out[key] = points.narrow(0, self.start, self.local_n)
        return out


# ----------------------------------------------------------------------------------------------
# Models


_UNKNOWN = "it is not known to act pointwise on the points"
_POINTWISE_TORCH = (nn.Linear, nn.LayerNorm, nn.Dropout, nn.Identity, nn.Sequential,
                    nn.ModuleList, nn.ModuleDict, nn.ReLU, nn.SiLU, nn.GELU, nn.Tanh, nn.Sigmoid,
                    nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Mish)


def _not_domain_parallel(module: nn.Module) -> str | None:
    """Why ``module`` cannot run on a shard of the points, or ``None`` if it can: attention
    layers of a domain-parallel type, pointwise maps, and modules from outside torch.nn and
    this package (whose own code is the caller's to judge)."""
    from .layers import (
        AFNOBlock,
        AFNOFilter,
        CiNNDownsampler,
        CiNNUpsampler,
        ContinuumAttention,
        ContinuumEncoderLayer,
        EncoderLayer,
        FeedForward,
        GeometricGate,
        GNOTBlock,
        HeteroNormalizedAttention,
        MixtureFFN,
        PatchedAttention,
        PatchedEncoderLayer,
        PointwiseRegressor,
        ResidualMLP,
        SimpleAttention,
        SpectralConv,
        SpectralConv1d,
        SpectralConv2d,
        SpectralRegressor,
        SpectralSmoothing,
    )
    from .layers.regressors import _GridInput
    from .models import GNOT, GKTransformer, GTEncoder, MIONet

    if isinstance(module, SimpleAttention):
        if module.attention_type == "softmax":
            return "softmax attention normalises each query over every key of the sample"
        if module.attention_type == "linear":
            return "linear attention's softmax runs over every point of the sample"
        if module.norm == "instance":
            return "norm='instance' takes its moments over every point of the sample"
        if module.attention_type == "fourier" and (module.attn_dropout > 0.0
                                                   or module.reference_dropout):
            return ("Fourier-type attention's dropout acts on the N × N matrix, which no rank "
                    "holds (attn_dropout=0 and reference_dropout=False are)")
        return None
    supported = (EncoderLayer, FeedForward, HeteroNormalizedAttention, GNOTBlock, GeometricGate,
                 MixtureFFN, ResidualMLP, PointwiseRegressor, _GridInput, GNOT, GKTransformer,
                 GTEncoder)
    if isinstance(module, supported + _POINTWISE_TORCH):
        return None
    known = {
        (SpectralRegressor, SpectralConv1d, SpectralConv2d, SpectralConv, AFNOFilter, AFNOBlock,
         SpectralSmoothing): "its FFT needs the whole grid",
        (CiNNDownsampler, CiNNUpsampler): "its convolutions and interpolation need the whole "
                                          "grid",
        (ContinuumAttention, ContinuumEncoderLayer): "softmax attention normalises each query "
                                                     "over every key of the sample",
        (PatchedAttention, PatchedEncoderLayer): "its patches are pieces of the whole grid",
        (MIONet,): "its branch nets take each input function whole",
    }
    for kinds, reason in known.items():
        if isinstance(module, kinds):
            return reason
    origin = type(module).__module__
    return _UNKNOWN if origin.startswith(("galerkin_ext.", "torch.nn.")) else None


def make_domain_parallel(module: nn.Module,
                         group: dist.ProcessGroup | None = None) -> nn.Module:
    """Make the attention layers of ``module`` domain-parallel over ``group``, in place, and
    return ``module``.

    Afterwards each process passes its shard of every sample's points (coordinates, weights,
    inputs: see :class:`DomainSplit`) and gets its shard of the output; every
    :class:`~galerkin_ext.layers.SimpleAttention` (Galerkin or Fourier type) and
    :class:`~galerkin_ext.layers.HeteroNormalizedAttention` sums its key-side reduction over
    the group (one all-reduce per layer in the forward and one in the backward). Supported: the
    paper's encoder (:class:`~galerkin_ext.layers.EncoderLayer`), GNOT's blocks and model
    (:class:`~galerkin_ext.models.GNOT`), :class:`~galerkin_ext.models.gnot.GKTransformer`,
    the continuum benchmark's :class:`~galerkin_ext.models.GTEncoder`, pointwise decoders and
    torch's pointwise modules; modules from outside torch and this package are taken as they
    are (their own code must act pointwise on the points). After the backward, sum the
    parameters' gradients with :func:`sum_gradients`.

    Raises:
        ValueError: naming the first submodule that needs the whole sample: FFT-based
            (spectral) decoders and layers, the CiNN, softmax, linear and continuum attention,
            instance norms, Fourier-type attention with dropout, patched attention, MIONet.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    _world(group)
    from .layers import HeteroNormalizedAttention, SimpleAttention

    failures = [(name, sub, reason) for name, sub in module.named_modules()
                if (reason := _not_domain_parallel(sub)) is not None]
    if failures:
        # The first with a specific reason (a spectral decoder, say), rather than the model
        # that contains it and is unknown as a whole.
        name, sub, reason = next((f for f in failures if f[2] != _UNKNOWN), failures[0])
        where = f"{name} ({type(sub).__name__})" if name else type(sub).__name__
        raise ValueError(f"module: {where} is not domain-parallel: {reason}")
    for sub in module.modules():
        if isinstance(sub, (SimpleAttention, HeteroNormalizedAttention)):
            sub.domain_parallel = True
            sub.domain_group = group
    # What the Trainer's parallel="domain" asks of its model. (ignore: torch types
    # nn.Module.__setattr__ for tensors and modules only)
    module.domain_parallel = True  # type: ignore[assignment]
    return module


def sum_gradients(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum the gradients of ``module``'s parameters over ``group`` (``None``: the world group),
    in place: one all-reduce per dtype and device.

    With the points of a sample split, each rank's backward yields the part of the gradient
    that flows through its own points (the attention layers have already exchanged what
    couples the shards), and the sample's gradient is the sum (not DDP's mean). A parameter
    without a gradient on this rank counts as zeros. Nothing happens without a process group
    of more than one process.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    world = _split_group(group)
    if world is None:
        return
    buckets: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
    for p in module.parameters():
        if p.requires_grad:
            buckets.setdefault((p.dtype, p.device), []).append(p)
    for params in buckets.values():
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        dist.all_reduce(flat, group=world)
        offset = 0
        for p in params:
            total = flat[offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = total.clone()
            else:
                p.grad.copy_(total)
            offset += p.numel()
