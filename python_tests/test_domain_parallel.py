"""Domain-parallel attention (:mod:`galerkin_ext.domain`): 2 and 3 gloo processes on the CPU give
the single-process outputs and gradients (float64, max abs difference <= 1e-12), with one
all-reduce per attention layer in the forward and one in the backward.

One launcher per world size spawns the processes once; each process runs every case on uneven
shards and on shards where one rank has no points, against the single-process op computed on
the whole sample in the same process. Gradients of sharded inputs are compared shard by shard;
those of tensors every rank holds (norm parameters, model parameters, θ) after summing over the
ranks. The arguments' checks and the single-process fallback run in the test process itself.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from galerkin_ext import domain, ops
from galerkin_ext.domain import DomainSplit, make_domain_parallel, sum_gradients
from galerkin_ext.layers import EncoderLayer, SimpleAttention
from galerkin_ext.models import GNOT, GKTransformer, GTEncoder, MIONet, SimpleTransformer1d
from galerkin_ext.training import DistributedContext, cleanup_distributed

F64 = torch.float64
TOL = 1e-12
B, H, D = 2, 2, 3
N, M1, M2 = 11, 9, 7  # query points and the points of two input functions
KINDS = ("uneven", "empty")
# case -> all-reduces per forward (and per backward): one per attention layer
CASES = {"galerkin": 1, "galerkin_cross_weights": 1, "galerkin_dropout": 1, "fourier": 1,
         "normalized": 1, "normalized_cross_weights": 1, "hetero": 1, "encoder_stack": 2,
         "gk_transformer": 2, "gt_encoder": 2, "gnot": 4, "whole_sample_loss": 3}
SPAWN_TIMEOUT_S = 180


# ----------------------------------------------------------------------------------------------
# The worker processes


def _counts(kind: str, n: int, world: int) -> list[int]:
    """Points per rank: ``"uneven"`` in the ratios 1 : 2 : … : world; ``"empty"`` with one
    rank holding none (rank 0 of two, the rank that draws dropout masks; rank 1 of three)."""
    if kind == "uneven":
        total = world * (world + 1) // 2
        counts = [n * (r + 1) // total for r in range(world)]
        counts[-1] += n - sum(counts)
        return counts
    empty = 0 if world == 2 else 1
    others = [r for r in range(world) if r != empty]
    counts = [0] * world
    for i, r in enumerate(others):
        counts[r] = n // len(others) + (i < n % len(others))
    return counts


def _rand(g: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64)


def _weights(g: torch.Generator, shape: tuple[int, ...], split: DomainSplit) -> Tensor:
    """Quadrature-like weights (of order 1/n), some 0, scaled by 3^r on rank r's points: every
    shard's weights sum differently."""
    w = torch.rand(shape, generator=g, dtype=F64) * (torch.rand(shape, generator=g) > 0.25)
    owner = torch.repeat_interleave(torch.arange(split.world_size), torch.tensor(split.counts))
    return w * 3.0 ** owner.to(F64) / split.n


def _norm_params(g: torch.Generator, prefix: str) -> dict[str, Tensor]:
    return {f"{prefix}w": 1.0 + 0.3 * _rand(g, H, D), f"{prefix}b": 0.1 * _rand(g, H, D)}


class _AllReduceCount:
    """Counts the calls of ``torch.distributed.all_reduce`` inside the ``with`` block."""

    def __enter__(self) -> _AllReduceCount:
        self.calls = 0
        self._original = dist.all_reduce

        def counted(*args, **kwargs):
            self.calls += 1
            return self._original(*args, **kwargs)

        dist.all_reduce = counted
        return self

    def __exit__(self, *exc: object) -> None:
        dist.all_reduce = self._original


def _max_diff(a: Tensor, b: Tensor) -> float:
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def _compare(call: Callable[[dict[str, Tensor], bool], Tensor], inputs: dict[str, Tensor],
             splits: dict[str, tuple[DomainSplit, int]], out_split: DomainSplit,
             out_dim: int, models: tuple[nn.Module, nn.Module] | None = None,
             rng_seed: int | None = None) -> dict[str, float]:
    """``call(tensors, distributed)`` on the whole sample in this process against it on this
    rank's shards (``splits``: the inputs' split and points axis; others are held whole by every
    rank): the largest differences of the output (this rank's and the gathered whole) and of
    the gradients, and the all-reduces of the forward and the backward."""
    whole = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    ref = call(whole, False)
    cotangent = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (ref * cotangent).sum().backward()

    shards = {k: (splits[k][0].shard(v, splits[k][1]) if k in splits else v)
              .clone().requires_grad_() for k, v in inputs.items()}
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    with _AllReduceCount() as forward:
        out = call(shards, True)
    with _AllReduceCount() as backward:
        (out * out_split.shard(cotangent, out_dim)).sum().backward()

    diff_out = max(_max_diff(out, out_split.shard(ref.detach(), out_dim)),
                   _max_diff(out_split.gather(out, out_dim), ref.detach()))
    pairs = []
    for k, leaf in shards.items():
        grad = torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
        if k in splits:
            pairs.append((grad, splits[k][0].shard(whole[k].grad, splits[k][1])))
        else:  # each rank holds the part of the gradient through its own points
            grad = grad.clone()
            dist.all_reduce(grad)
            pairs.append((grad, whole[k].grad))
    if models is not None:
        reference, distributed = models
        sum_gradients(distributed)
        pairs += [(p.grad, q.grad) for p, q in zip(distributed.parameters(),
                                                   reference.parameters(), strict=True)]
    return {"out": diff_out, "grad": max(_max_diff(a, b) for a, b in pairs),
            "forward_all_reduces": forward.calls, "backward_all_reduces": backward.calls}


def _op(distributed: bool):
    return domain if distributed else ops


def _case_galerkin(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, N, D), "v": _rand(g, B, H, N, D),
         "pos": _rand(g, B, N, 2), **_norm_params(g, "k"), **_norm_params(g, "v")}
    splits = {"q": (split, 2), "k": (split, 2), "v": (split, 2), "pos": (split, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).galerkin_attention(
            t["q"], t["k"], t["v"], pos=t["pos"], k_norm=(t["kw"], t["kb"]),
            v_norm=(t["vw"], t["vb"]))

    return _compare(call, t, splits, split, 2)


def _case_galerkin_cross_weights(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    queries, keys = DomainSplit(_counts(kind, N, world)), DomainSplit(_counts(kind, M1, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, M1, D), "v": _rand(g, B, H, M1, 4),
         "pos": _rand(g, N, 2), "kv_pos": _rand(g, M1, 2),
         "weight": _weights(g, (B, M1), keys), **_norm_params(g, "k")}
    splits = {"q": (queries, 2), "k": (keys, 2), "v": (keys, 2), "pos": (queries, 0),
              "kv_pos": (keys, 0), "weight": (keys, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).galerkin_attention(
            t["q"], t["k"], t["v"], pos=t["pos"], kv_pos=t["kv_pos"], weight=t["weight"],
            k_norm=(t["kw"], t["kb"]))

    return _compare(call, t, splits, queries, 2)


def _case_galerkin_dropout(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, N, D), "v": _rand(g, B, H, N, D),
         "weight": _weights(g, (N,), split), **_norm_params(g, "v")}
    splits = {"q": (split, 2), "k": (split, 2), "v": (split, 2), "weight": (split, 0)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).galerkin_attention(
            t["q"], t["k"], t["v"], weight=t["weight"], v_norm=(t["vw"], t["vb"]),
            dropout_p=0.4)

    # the same seed: rank 0 draws the whole sample's mask as the single-process op does
    return _compare(call, t, splits, split, 2, rng_seed=int(torch.randint(2**31, (1,),
                                                                          generator=g)))


def _case_fourier(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, N, D), "v": _rand(g, B, H, N, D),
         "pos": _rand(g, B, N, 1), "weight": _weights(g, (B, N), split),
         **_norm_params(g, "q"), **_norm_params(g, "k")}
    splits = {"q": (split, 2), "k": (split, 2), "v": (split, 2), "pos": (split, 1),
              "weight": (split, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).fourier_attention(
            t["q"], t["k"], t["v"], pos=t["pos"], weight=t["weight"],
            q_norm=(t["qw"], t["qb"]), k_norm=(t["kw"], t["kb"]))

    return _compare(call, t, splits, split, 2)


def _case_normalized(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, N, D), "v": _rand(g, B, H, N, D),
         "pos": _rand(g, B, N, 2)}
    splits = {"q": (split, 2), "k": (split, 2), "v": (split, 2), "pos": (split, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).normalized_attention(t["q"], t["k"], t["v"], pos=t["pos"],
                                                     skip=True)

    return _compare(call, t, splits, split, 2)


def _case_normalized_cross_weights(g: torch.Generator, kind: str,
                                   world: int) -> dict[str, float]:
    queries, keys = DomainSplit(_counts(kind, N, world)), DomainSplit(_counts(kind, M1, world))
    t = {"q": _rand(g, B, H, N, D), "k": _rand(g, B, H, M1, D), "v": _rand(g, B, H, M1, 4),
         "pos": _rand(g, N, 2), "kv_pos": _rand(g, B, M1, 2), "weight": _weights(g, (M1,), keys)}
    splits = {"q": (queries, 2), "k": (keys, 2), "v": (keys, 2), "pos": (queries, 0),
              "kv_pos": (keys, 1), "weight": (keys, 0)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).normalized_attention(
            t["q"], t["k"], t["v"], pos=t["pos"], kv_pos=t["kv_pos"], weight=t["weight"])

    return _compare(call, t, splits, queries, 2)


def _case_hetero(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    queries = DomainSplit(_counts(kind, N, world))
    first, second = DomainSplit(_counts(kind, M1, world)), DomainSplit(_counts(kind, M2, world))
    t = {"q": _rand(g, B, H, N, D), "k1": _rand(g, B, H, M1, D), "v1": _rand(g, B, H, M1, D),
         "k2": _rand(g, B, H, M2, D), "v2": _rand(g, B, H, M2, D), "pos": _rand(g, B, N, 2),
         "pos1": _rand(g, M1, 2), "pos2": _rand(g, B, M2, 2),
         "w1": _weights(g, (B, M1), first)}
    splits = {"q": (queries, 2), "k1": (first, 2), "v1": (first, 2), "k2": (second, 2),
              "v2": (second, 2), "pos": (queries, 1), "pos1": (first, 0), "pos2": (second, 1),
              "w1": (first, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        return _op(distributed).hetero_normalized_attention(
            t["q"], [t["k1"], t["k2"]], [t["v1"], t["v2"]], pos=t["pos"],
            kv_pos=[t["pos1"], t["pos2"]], weights=[t["w1"], None], reduce="mean")

    return _compare(call, t, splits, queries, 2)


def _models(build: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    """The same model twice (every rank builds the same), the second domain-parallel."""
    torch.manual_seed(0)
    model = build().double()
    return model, make_domain_parallel(copy.deepcopy(model))


def _case_encoder_stack(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    # (projections of unit gain: the default 1e-2 makes the layer norms' gradients 50 times
    # larger, and their rounding with them)
    ref_model, dom_model = _models(lambda: nn.ModuleList([
        EncoderLayer(8, 2, "fourier", pos_dim=2, norm="attn", xavier_init=1.0),
        EncoderLayer(8, 2, "galerkin", pos_dim=2, norm="layer", dim_feedforward=12,
                     xavier_init=1.0)]))
    t = {"x": _rand(g, B, N, 8), "pos": torch.rand(N, 2, generator=g, dtype=F64),
         "weight": _weights(g, (B, N), split)}
    splits = {"x": (split, 1), "pos": (split, 0), "weight": (split, 1)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        x = t["x"]
        for layer in dom_model if distributed else ref_model:
            x = layer(x, t["pos"], t["weight"])
        return x

    return _compare(call, t, splits, split, 1, models=(ref_model, dom_model))


def _case_gk_transformer(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    ref_model, dom_model = _models(lambda: GKTransformer(
        d_model=8, n_head=2, num_layers=2, dim_feedforward=12, decoder_hidden=8))
    t = {"x": torch.rand(B, N, 2, generator=g, dtype=F64)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:  # uniform weights: None
        return (dom_model if distributed else ref_model)(t["x"])

    return _compare(call, t, {"x": (split, 1)}, split, 1, models=(ref_model, dom_model))


class _Wrapped(nn.Module):
    """A user's module around a GTEncoder: make_domain_parallel marks the module it is given,
    not the GTEncoder inside, which must still take an empty shard."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = GTEncoder(in_dim=2, out_dim=1, d_model=8, n_head=2, num_layers=2,
                               dim_feedforward=12)

    def forward(self, u: Tensor, x: Tensor) -> Tensor:
        return self.inner(u, x)


def _case_gt_encoder(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    split = DomainSplit(_counts(kind, N, world))
    ref_model, dom_model = _models(_Wrapped)
    t = {"u": _rand(g, B, N, 2), "x": torch.rand(N, 2, generator=g, dtype=F64)}

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:  # uniform weights: None
        return (dom_model if distributed else ref_model)(t["u"], t["x"])

    return _compare(call, t, {"u": (split, 1), "x": (split, 0)}, split, 1,
                    models=(ref_model, dom_model))


def _case_gnot(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    queries = DomainSplit(_counts(kind, N, world))
    first, second = DomainSplit(_counts(kind, M1, world)), DomainSplit(_counts(kind, M2, world))
    ref_model, dom_model = _models(lambda: GNOT(
        space_dim=2, query_dim=2, input_dims=[3, 2], out_dim=1, theta_dim=2, n_hidden=8,
        n_layers=2, n_head=2, n_experts=2, n_inner=1, mlp_layers=1, theta_mode="branch"))
    t = {"x": torch.rand(B, N, 2, generator=g, dtype=F64), "y1": _rand(g, B, M1, 3),
         "y2": _rand(g, B, M2, 2), "theta": _rand(g, B, 2),
         "weight": _weights(g, (B, N), queries), "w1": _weights(g, (B, M1), first)}
    splits = {"x": (queries, 1), "y1": (first, 1), "y2": (second, 1),
              "weight": (queries, 1), "w1": (first, 1)}  # θ: every rank holds it

    def call(t: dict[str, Tensor], distributed: bool) -> Tensor:
        model = dom_model if distributed else ref_model
        return model(t["x"], [t["y1"], t["y2"]], t["theta"], weight=t["weight"],
                     input_weights=[t["w1"], None])

    return _compare(call, t, splits, queries, 1, models=(ref_model, dom_model))


def _case_whole_sample_loss(g: torch.Generator, kind: str, world: int) -> dict[str, float]:
    """The mean relative L2 error of whole samples, from each rank's sums over its points
    (``sum_over_ranks``), each rank running the backward of its share (the loss over the number
    of ranks), the gradients summed: the single-process loss and parameter gradients."""
    split = DomainSplit(_counts(kind, N, world))
    ref_model, dom_model = _models(lambda: GKTransformer(
        space_dim=2, query_dim=3, d_model=8, n_head=2, num_layers=2, dim_feedforward=12,
        decoder_hidden=8))
    x, target = torch.rand(B, N, 3, generator=g, dtype=F64), _rand(g, B, N, 1)

    def rel_l2(pred: Tensor, y: Tensor, distributed: bool) -> Tensor:
        sums = torch.stack([((pred - y) ** 2).sum(dim=(1, 2)), (y ** 2).sum(dim=(1, 2))])
        err, ref = domain.sum_over_ranks(sums) if distributed else sums
        return (err / ref).sqrt().mean()

    ref_loss = rel_l2(ref_model(x), target, False)
    ref_loss.backward()
    with _AllReduceCount() as forward:
        share = rel_l2(dom_model(split.shard(x)), split.shard(target), True) / world
    with _AllReduceCount() as backward:
        share.backward()
    sum_gradients(dom_model)
    total = share.detach().clone()
    dist.all_reduce(total)
    return {"out": abs(float(total - ref_loss)),
            "grad": max(_max_diff(p.grad, q.grad) for p, q in zip(
                dom_model.parameters(), ref_model.parameters(), strict=True)),
            "forward_all_reduces": forward.calls, "backward_all_reduces": backward.calls}


def _refused(call: Callable[[], object], *messages: str) -> bool:
    """Whether ``call()`` raises a ValueError holding one of ``messages``."""
    try:
        call()
    except ValueError as err:
        return any(message in str(err) for message in messages)
    return False


def _on_every_rank(ok: list[bool]) -> bool:
    """Whether every check held on every rank (a collective)."""
    flag = torch.tensor([float(all(ok))], dtype=F64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


def _refuses_mixed_weights(rank: int) -> bool:
    """Weights on some ranks and None on others: the normalised forms summed a None shard's
    weight-1 points with the others' weights, a wrong result without an error; the kernel
    forms' all-reduce was one number longer where weight was None (one rank went on with a
    result, the other waited or aborted). Every rank must refuse (the flags travel in the same
    all-reduce, so none is left waiting)."""
    q, k, v = (torch.rand(1, 1, 3, 4, dtype=F64) for _ in range(3))
    weight = None if rank == 0 else torch.rand(3, dtype=F64)
    calls = (lambda: domain.normalized_attention(q, k, v, weight=weight),
             lambda: domain.hetero_normalized_attention(q, [k, k], [v, v],
                                                        weights=[None, weight]),
             lambda: domain.galerkin_attention(q, k, v, weight=weight),
             lambda: domain.fourier_attention(q, k, v, weight=weight))
    return _on_every_rank([_refused(call, "None on the others") for call in calls])


def _refuses_disagreeing_counts(rank: int, world: int) -> bool:
    """A split whose counts differ between ranks gave overlapping or missing shards, a wrong
    result without an error; every rank must refuse it. So must they a rank's own invalid
    counts or n, which it refused before the collective, leaving the others waiting in it."""
    differing = [2] * world
    differing[rank] += 1
    agreed = "every rank must give the same valid counts"
    own = ("expected one int >= 0", "n: expected an int >= 0") if rank == 0 else ()
    return _on_every_rank([
        _refused(lambda: DomainSplit(differing), agreed),
        _refused(lambda: DomainSplit([2] * world if rank else [-1] * world), agreed, *own),
        _refused(lambda: DomainSplit.even(4 if rank else -1), agreed, *own)])


def _refuses_disagreeing_shards(rank: int, world: int) -> bool:
    """gather of shards whose shapes differ between ranks, or of a wrong size on one rank:
    garbage on one rank and an abort or a wait on another. Every rank must refuse."""
    split = DomainSplit.even(2 * world)
    agreed = "every rank must give one dtype and shape"
    own = ("expected this rank's local_n",) if rank == 0 else ()
    return _on_every_rank([
        _refused(lambda: split.gather(torch.zeros(1, 2, 2 if rank else 3)), agreed),
        _refused(lambda: split.gather(torch.zeros(1, 2 if rank else 5, 2)), agreed, *own)])


def _uniform_weights_sum_to_one(world: int) -> bool:
    """local_weight() without weights: 1/n on this rank's points of the whole sample's n (the
    shard's own count gave weights summing to the number of ranks), for uneven and empty
    shards."""
    ok = []
    for kind in KINDS:
        split = DomainSplit(_counts(kind, N, world))
        w = split.local_weight(dtype=F64)
        total = w.sum()
        dist.all_reduce(total)
        ok += [w.shape == (split.local_n,), bool((w == 1.0 / N).all()),
               abs(float(total) - 1.0) <= 1e-15]
    return _on_every_rank(ok)


def _contexts_follow_the_group(rank: int, world: int) -> bool:
    """A DistributedContext that disagrees with the process group split the evaluation's
    samples wrongly without an error; setup_distributed, given a group initialised without
    torchrun's variables, returned a single-process context on every process (each then wrote
    the run's files); a process left out of a group got a message about an int."""
    from galerkin_ext.training import setup_distributed

    mine = f"this process is rank {rank} of {world}"
    ok = [_refused(lambda: DistributedContext(rank=(rank + 1) % world, world_size=world), mine),
          _refused(lambda: DistributedContext(rank=rank, world_size=world + 1), mine)]
    os.environ.pop("LOCAL_RANK", None)  # (a group joined without torchrun: it is the rank)
    ctx = setup_distributed("cpu")
    ok.append((ctx.rank, ctx.world_size, ctx.local_rank) == (rank, world, rank))
    first = dist.new_group([0])  # a collective: every rank creates it
    if rank:
        ok.append(_refused(lambda: DomainSplit([3], group=first), "not a member of the group"))
    return _on_every_rank(ok)


def _point_shards_hold_each_ranks_points(rank: int, world: int) -> bool:
    """Each rank's PointShards holds its own points [start, stop) of the flattened grid, from
    uneven counts (a single process starts at 0, where any offset would pass)."""
    counts = [5, 7, 3][:world]
    n = sum(counts)
    grid = torch.arange(n * 2.0).view(1, n, 2).expand(2, n, 2).reshape(2, 3, n // 3, 2)
    data = _Samples([{"x": grid[i], "target": torch.arange(n * 1.0).view(n, 1)}
                     for i in range(2)])
    shards = domain.PointShards(data, DomainSplit(counts), {"x": 2, "target": 1})
    start = sum(counts[:rank])
    mine = torch.arange(start, start + counts[rank], dtype=torch.float32)
    item = shards[1]
    return _on_every_rank([torch.equal(item["target"][:, 0], mine),
                           torch.equal(item["x"], torch.stack([2 * mine, 2 * mine + 1], 1))])


def _worker(rank: int, world: int, init_file: str, seed: int, out_file: str) -> None:
    torch.set_num_threads(1)  # the ranks share the CI machine's cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        results = {}
        for case in CASES:
            for kind in KINDS:
                # (crc32, not hash(): string hashes differ between processes)
                g = torch.Generator().manual_seed(seed ^ zlib.crc32(f"{case}/{kind}".encode()))
                r = globals()[f"_case_{case}"](g, kind, world)
                worst = torch.tensor([r["out"], r["grad"], r["forward_all_reduces"],
                                      r["backward_all_reduces"]], dtype=F64)
                fewest = -worst[2:].clone()
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                dist.all_reduce(fewest, op=dist.ReduceOp.MAX)
                results[f"{case}/{kind}"] = {
                    "out": float(worst[0]), "grad": float(worst[1]),
                    "forward_all_reduces": [-float(fewest[0]), float(worst[2])],
                    "backward_all_reduces": [-float(fewest[1]), float(worst[3])]}
        results["refused_mixed_weights"] = _refuses_mixed_weights(rank)
        results["refused_disagreeing_counts"] = _refuses_disagreeing_counts(rank, world)
        results["refused_disagreeing_shards"] = _refuses_disagreeing_shards(rank, world)
        results["contexts_follow_the_group"] = _contexts_follow_the_group(rank, world)
        results["uniform_weights_sum_to_one"] = _uniform_weights_sum_to_one(world)
        results["point_shards"] = _point_shards_hold_each_ranks_points(rank, world)
        if rank == 0:
            Path(out_file).write_text(json.dumps(results))
        # every rank done before the teardown, which torch 2.5's gloo could hang in otherwise
        cleanup_distributed(DistributedContext(rank=rank, world_size=world))
    finally:
        if dist.is_initialized():  # failed on the way: leave without waiting for the others
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def results(request, tmp_path_factory) -> dict[str, dict]:
    """Every case's differences, on ``world`` gloo processes spawned once."""
    from conftest import SEED, run_processes

    world = request.param
    folder = tmp_path_factory.mktemp(f"domain_world{world}")
    out_file = folder / "results.json"
    run_processes(_worker, (world, str(folder / "init"), SEED, str(out_file)), world,
                  SPAWN_TIMEOUT_S)
    return json.loads(out_file.read_text())


def test_weights_given_on_some_ranks_only_are_refused(results: dict[str, dict]) -> None:
    assert results["refused_mixed_weights"]


def test_counts_differing_between_ranks_are_refused(results: dict[str, dict]) -> None:
    assert results["refused_disagreeing_counts"]


def test_shards_differing_between_ranks_are_refused(results: dict[str, dict]) -> None:
    assert results["refused_disagreeing_shards"]


def test_contexts_follow_the_process_group(results: dict[str, dict]) -> None:
    assert results["contexts_follow_the_group"]


def test_uniform_local_weights_sum_to_one_over_the_ranks(results: dict[str, dict]) -> None:
    assert results["uniform_weights_sum_to_one"]


def test_point_shards_hold_each_ranks_points(results: dict[str, dict]) -> None:
    assert results["point_shards"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_single_process(results: dict[str, dict], case: str, kind: str) -> None:
    r = results[f"{case}/{kind}"]
    assert r["out"] <= TOL, f"output differs by {r['out']:.3g}"
    assert r["grad"] <= TOL, f"gradient differs by {r['grad']:.3g}"
    layers = CASES[case]
    assert r["forward_all_reduces"] == [layers, layers]  # on every rank
    assert r["backward_all_reduces"] == [layers, layers]


def _single_process_cases(gen: torch.Generator) -> list[tuple[Tensor, Tensor]]:
    """(domain-parallel form, op) outputs for every function, in one process."""
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=F64) for _ in range(3))
    pos = torch.rand(N, 2, generator=gen, dtype=F64)
    weight = torch.rand(B, N, generator=gen, dtype=F64)
    norm = (torch.ones(H, D, dtype=F64), torch.zeros(H, D, dtype=F64))
    pairs = []
    for mod in (domain, ops):
        torch.manual_seed(3)  # the same dropout mask
        pairs.append([
            mod.galerkin_attention(q, k, v, pos=pos, k_norm=norm, dropout_p=0.2),
            mod.fourier_attention(q, k, v, pos=pos, weight=weight, q_norm=norm),
            *mod.kernel_attention(q, k, v, v_norm=norm, scale=0.5),
            mod.normalized_attention(q, k, v, pos=pos, weight=weight, skip=True),
            mod.hetero_normalized_attention(q, [k, k[:, :, :4]], [v, v[:, :, :4]],
                                            weights=[None, weight[:, :4]]),
        ])
    return list(zip(*pairs, strict=True))


class _Samples(torch.utils.data.Dataset):
    """A dataset of the given list of samples."""

    def __init__(self, samples: list[dict[str, Tensor]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.samples[i]


def _check_single_process(gen: torch.Generator) -> None:
    for ours, op in _single_process_cases(gen):
        assert torch.equal(ours, op)
    split = DomainSplit.even(5)
    assert (split.counts, split.rank, split.start, split.stop) == ((5,), 0, 0, 5)
    x = torch.randn(2, 5, 3, generator=gen, dtype=F64)
    assert torch.equal(split.gather(split.shard(x)), x)
    assert domain.sum_over_ranks(x) is x
    # DataLoader workers that are spawned get the dataset pickled (a process group cannot be)
    samples = [{"x": torch.arange(10.0).view(5, 2)}]
    shards = pickle.loads(pickle.dumps(domain.PointShards(_Samples(samples), split, {"x": 1})))
    assert torch.equal(shards[0]["x"], samples[0]["x"])
    torch.manual_seed(0)
    model = GKTransformer(d_model=8, n_head=2, num_layers=1, dim_feedforward=8,
                          decoder_hidden=8).double()
    converted = make_domain_parallel(copy.deepcopy(model))
    points = torch.rand(B, N, 2, generator=gen, dtype=F64)
    assert torch.equal(converted(points), model(points))
    converted(points).sum().backward()
    grads = [p.grad.clone() for p in converted.parameters()]
    sum_gradients(converted)  # nothing to sum over
    assert all(torch.equal(p.grad, g) for p, g in zip(converted.parameters(), grads,
                                                      strict=True))


def test_without_a_process_group_the_ops_run(gen: torch.Generator) -> None:
    assert not dist.is_initialized()
    _check_single_process(gen)


def test_a_group_of_one_process_runs_the_ops(gen: torch.Generator, tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    try:
        _check_single_process(gen)
    finally:
        dist.destroy_process_group()


def test_split_even_and_uneven() -> None:
    assert DomainSplit.even(0).counts == (0,)
    assert [_counts("uneven", 11, w) for w in (2, 3)] == [[3, 8], [1, 3, 7]]
    assert [_counts("empty", 11, w) for w in (2, 3)] == [[0, 11], [6, 0, 5]]
    split = DomainSplit([7])
    assert split.local_weight(dtype=F64).tolist() == [1 / 7] * 7
    w = torch.arange(14.0).view(2, 7)
    assert torch.equal(split.local_weight(w), w)
    assert "counts=(7,)" in repr(split)


class _UserBlock(nn.Module):
    """A container of the user's own: taken as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = EncoderLayer(8, 2, "galerkin", pos_dim=1)


def test_point_shards_flatten_the_grid_and_keep_the_named_entries() -> None:
    grid = torch.arange(2 * 3 * 4 * 2.0).view(2, 3, 4, 2)  # two samples of a 3 x 4 grid
    points = torch.arange(2 * 12.0).view(2, 12, 1)
    data = _Samples([{"x": grid[i], "target": points[i], "other": torch.zeros(3)}
                     for i in range(2)])
    shards = domain.PointShards(data, DomainSplit.even(12), {"x": 2, "target": 1})
    assert len(shards) == 2
    item = shards[1]
    assert set(item) == {"x", "target"}
    assert torch.equal(item["x"], grid[1].reshape(12, 2))
    assert torch.equal(item["target"], points[1])
    for args, error, match in [
        ((data, DomainSplit.even(12), {"x": 0}), ValueError, "point_dims: expected"),
        ((data, DomainSplit.even(12), {}), ValueError, "point_dims: expected"),
        ((data, (0, 12), {"x": 2}), TypeError, "split: expected a DomainSplit"),
        (([1, 2], DomainSplit.even(12), {"x": 2}), TypeError, "dataset: expected a torch"),
    ]:
        with pytest.raises(error, match=match):
            domain.PointShards(*args)
    with pytest.raises(KeyError, match="the samples have no 'coeff'"):
        domain.PointShards(data, DomainSplit.even(12), {"coeff": 2})[0]
    with pytest.raises(ValueError, match=r"\['x'\]: expected the split's n = 6 points"):
        domain.PointShards(data, DomainSplit.even(6), {"x": 2})[0]
    with pytest.raises(ValueError, match=r"\['target'\]: expected 2 grid axes"):
        domain.PointShards(data, DomainSplit.even(12), {"target": 2})[0]
    numpy_data = _Samples([{"x": grid[0].numpy()}])  # an AttributeError ('dim')
    with pytest.raises(TypeError, match=r"dataset\[0\]\['x'\]: expected a tensor, got ndarray"):
        domain.PointShards(numpy_data, DomainSplit.even(12), {"x": 2})[0]
    with pytest.raises(TypeError, match="x: expected a tensor"):
        domain.sum_over_ranks([1.0])


def test_make_domain_parallel_marks_the_attention_layers() -> None:
    model = make_domain_parallel(_UserBlock())
    assert model.layer.attn.domain_parallel and model.layer.attn.domain_group is None
    assert not SimpleAttention(8, 2).domain_parallel  # the class default is untouched
    gnot = make_domain_parallel(GNOT(space_dim=2, query_dim=2, input_dims=[3], out_dim=1,
                                     n_hidden=8, n_layers=1, n_head=2))
    assert gnot.blocks[0].cross.domain_parallel and gnot.blocks[0].self_attn.domain_parallel


def test_numpy_integers_are_axes() -> None:
    """An axis given as a numpy integer is the int it is (it was refused as 'not an axis')."""
    x = torch.arange(10.0).reshape(2, 5)
    split = DomainSplit([5])
    assert torch.equal(split.shard(x, dim=np.int64(1)), split.shard(x, dim=1))
    assert torch.equal(split.gather(x, dim=np.int64(-1)), split.gather(x, dim=-1))


def test_argument_errors(gen: torch.Generator) -> None:
    q, k, v = (torch.randn(B, H, N, D, generator=gen, dtype=F64) for _ in range(3))
    mionet = MIONet(space_dim=2, query_dim=2, input_dims=[3], input_points=[4], out_dim=1,
                    width=8, latent=4, n_layers=2)
    cases = [
        (lambda: domain.galerkin_attention(q, k, v, group="world"), TypeError,
         "group: expected a torch.distributed ProcessGroup"),
        (lambda: domain.normalized_attention(q, k, v, group=3), TypeError, "group: expected"),
        (lambda: domain.fourier_attention(q, k, v, path="quadratic"), ValueError,
         "path: 'quadratic' forms the N × M matrix"),
        (lambda: domain.fourier_attention(q, k, v, path="sideways"), ValueError,
         r"path: expected one of \['auto', 'factored', 'quadratic'\]"),
        (lambda: domain.fourier_attention(q, k, v, dropout_p=0.1), ValueError,
         "dropout_p: Fourier-type attention drops entries"),
        (lambda: domain.kernel_attention(q, k, v, path="quadratic"), ValueError,
         "path: 'quadratic'"),
        (lambda: domain.galerkin_attention(q, k, v, dropout_p=1.5), ValueError,
         r"dropout_p: expected a float in \[0, 1\)"),
        (lambda: domain.galerkin_attention(q, k[..., :2], v), ValueError, "k: expected shape"),
        (lambda: DomainSplit([3, 4]), ValueError,
         r"counts: expected one int >= 0 per rank of the group \(1 ranks\)"),
        (lambda: DomainSplit([-1]), ValueError, "counts: expected one int >= 0 per rank"),
        (lambda: DomainSplit("5"), ValueError, "counts: expected one int >= 0 per rank"),
        (lambda: DomainSplit.even(-1), ValueError, "n: expected an int >= 0"),
        (lambda: DomainSplit.even(2.5), TypeError, "n: expected an int >= 0"),
        (lambda: DomainSplit([5]).shard(torch.zeros(2, 4)), ValueError,
         "x: expected the split's n = 5 points on axis 1"),
        (lambda: DomainSplit([5]).shard(torch.zeros(5), dim=3), ValueError,
         "dim: expected an axis of x"),
        (lambda: DomainSplit([5]).shard(torch.zeros(2, 5), dim=True), ValueError,
         "dim: expected an axis of x, which has 2, got True"),
        (lambda: DomainSplit([5]).gather(torch.zeros(2, 5), dim=True), ValueError,
         "dim: expected an axis of x, which has 2, got True"),
        (lambda: DomainSplit([5]).shard("x"), TypeError, "x: expected a tensor"),
        (lambda: DomainSplit([0]).local_weight(), ValueError,
         "weight: uniform weights 1/n need n >= 1"),
        (lambda: DomainSplit([5]).local_weight(torch.zeros(2, 2, 5)), ValueError,
         r"weight: expected shape \(B, n\) or \(n,\) with n = 5, got \(2, 2, 5\)"),
        (lambda: DomainSplit([5]).local_weight(torch.ones(6)), ValueError,
         r"weight: expected shape \(B, n\) or \(n,\) with n = 5, got \(6,\)"),
        (lambda: DomainSplit([5]).local_weight([0.2] * 5), TypeError,
         "weight: expected a tensor .* got list"),
        (lambda: DomainSplit([5]).local_weight(device="gpu"), ValueError,
         "device: expected e.g. 'cpu'"),
        (lambda: DomainSplit([5]).local_weight(dtype=torch.int64), TypeError,
         "dtype: expected a floating torch.dtype"),  # (were zeros: 1/5 truncated)
        (lambda: DomainSplit([5]).gather(torch.zeros(2, 4)), ValueError,
         "x: expected this rank's local_n = 5"),
        (lambda: make_domain_parallel("model"), TypeError, "module: expected a torch.nn.Module"),
        (lambda: make_domain_parallel(nn.Linear(2, 2), group="g"), TypeError, "group:"),
        (lambda: make_domain_parallel(SimpleTransformer1d()), ValueError,
         r"module: decoder \(SpectralRegressor\) is not domain-parallel: its FFT needs the "
         "whole grid"),
        (lambda: make_domain_parallel(EncoderLayer(8, 2, "softmax")), ValueError,
         r"module: attn \(SimpleAttention\) is not domain-parallel: softmax attention"),
        (lambda: make_domain_parallel(EncoderLayer(8, 2, "linear")), ValueError,
         "linear attention's softmax runs over every point"),
        (lambda: make_domain_parallel(EncoderLayer(8, 2, norm="instance")), ValueError,
         "norm='instance' takes its moments"),
        (lambda: make_domain_parallel(EncoderLayer(8, 2, "fourier", attn_dropout=0.1)),
         ValueError, "Fourier-type attention's dropout acts on the N × N matrix"),
        (lambda: make_domain_parallel(mionet), ValueError,
         "module: MIONet is not domain-parallel: its branch nets"),
        (lambda: make_domain_parallel(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))),
         ValueError, r"module: 1 \(BatchNorm1d\) is not domain-parallel: it is not known"),
        (lambda: sum_gradients("model"), TypeError, "module: expected a torch.nn.Module"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
