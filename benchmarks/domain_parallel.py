"""Domain-parallel attention on the CPU with gloo: what one attention layer communicates, how
long that takes next to its compute, and how far the result is from one process.

    python benchmarks/domain_parallel.py --out benchmarks/results/domain_parallel_cpu.json

Spawns ``--world`` gloo processes (one torch thread each). For each ``N`` of ``--n`` and each
op (Galerkin attention with its layer norms and coordinates, ``weight=None``: uniform over the
whole sample; GNOT's normalised attention with its skip), every rank holds an even share of the
``N`` points of one batch (``--batch`` samples, ``--heads`` heads of ``--head-dim`` features,
``--coordinates`` coordinates in every head) and runs the layer's forward and backward
(``--warmup`` untimed, then ``--repeats`` timed; medians reported):

* ``bytes_per_layer``: the bytes handed to ``all_reduce`` in one forward + backward (the
  ``B·H·d·d_v`` partial sums each way, plus, for Galerkin, its key count and, for both, a
  flag for whether this rank's keys have weights); a ring all-reduce
  sends ``2 (W − 1) / W`` times that over each link. Independent of ``N`` by construction:
  the record says so when it measured the same at every ``N``;
* ``comm_ms``: the time inside ``all_reduce`` (with the wait for the slower rank);
  ``comm_alone_ms``: two all-reduces of the same size with nothing else running;
* ``compute_ms``: the rest of the forward + backward;
* ``single_process_ms``: the same layer on the whole sample in one process, one thread;
* ``max_abs_diff_out``, ``max_abs_diff_grad``: the largest difference of the output and of the
  gradients of ``q``, ``k``, ``v`` (the ranks' shards put together) from that single process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from galerkin_ext import domain, ops
from galerkin_ext._cli import nonnegative_int, positive_int, writable_file
from galerkin_ext.domain import DomainSplit
from galerkin_ext.training import (
    DistributedContext,
    cleanup_distributed,
    command_line,
    describe_device,
    write_json,
)

OPS = ("galerkin", "normalized")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    p.add_argument("--n", default="16384,131072",
                   help="comma-separated point counts N of one sample (default 2^14, 2^17)")
    p.add_argument("--world", type=positive_int, default=2, help="gloo processes (default 2)")
    p.add_argument("--batch", type=positive_int, default=1, help="samples B (default 1)")
    p.add_argument("--heads", type=positive_int, default=4, help="heads H (default 4)")
    p.add_argument("--head-dim", type=positive_int, default=32,
                   help="features D per head (default 32)")
    p.add_argument("--coordinates", type=nonnegative_int, default=2,
                   help="coordinates P in every head (default 2)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float64")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="untimed runs (default 1)")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed runs, median (default 5)")
    args = p.parse_args(argv)
    try:
        args.n = [int(n) for n in args.n.split(",")]
    except ValueError:
        p.error(f"--n: expected comma-separated integers, got {args.n!r}")
    if not args.n or min(args.n) < args.world:
        p.error(f"--n: expected point counts of at least --world = {args.world}")
    return args


class _Meter:
    """Wraps ``torch.distributed.all_reduce``: the bytes it is handed and the seconds inside."""

    def __init__(self) -> None:
        self.bytes = 0
        self.seconds = 0.0
        self._original = dist.all_reduce
        dist.all_reduce = self._all_reduce

    def _all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._original(tensor, *args, **kwargs)
        self.seconds += time.perf_counter() - start
        self.bytes += tensor.numel() * tensor.element_size()
        return result

    def reset(self) -> None:
        self.bytes, self.seconds = 0, 0.0


def _layer(op: str, attention: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           pos: torch.Tensor, norms: tuple) -> torch.Tensor:
    """One attention layer of the benchmark: ``attention`` is ``ops`` or ``domain``."""
    if op == "galerkin":
        return attention.galerkin_attention(q, k, v, pos=pos, k_norm=norms[0], v_norm=norms[1])
    return attention.normalized_attention(q, k, v, pos=pos, skip=True)


def _inputs(args: argparse.Namespace, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[args.dtype]
    shape = (args.batch, args.heads, n, args.head_dim)
    return {"q": torch.randn(shape, generator=g, dtype=dtype),
            "k": torch.randn(shape, generator=g, dtype=dtype),
            "v": torch.randn(shape, generator=g, dtype=dtype),
            "pos": torch.rand(n, args.coordinates, generator=g, dtype=dtype),
            "cotangent": torch.randn(*shape[:3], args.coordinates + args.head_dim,
                                     generator=g, dtype=dtype)}


def _worker(rank: int, world: int, args: argparse.Namespace, init_file: str,
            result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    meter = _Meter()
    dtype = DTYPES[args.dtype]
    norms = tuple((torch.ones(args.heads, args.head_dim, dtype=dtype),
                   torch.zeros(args.heads, args.head_dim, dtype=dtype)) for _ in range(2))
    records = []
    try:
        for n in args.n:
            split = DomainSplit.even(n)
            for seed, op in enumerate(OPS):
                whole = _inputs(args, n, seed)
                local = {name: split.shard(t, 0 if name == "pos" else 2).clone()
                         for name, t in whole.items()}
                if rank:  # only rank 0 computes the single-process reference
                    whole.clear()
                for name in ("q", "k", "v"):
                    local[name].requires_grad_()
                totals, comms, sizes = [], [], set()
                for step in range(args.warmup + args.repeats):
                    for name in ("q", "k", "v"):
                        local[name].grad = None
                    dist.barrier()
                    meter.reset()
                    start = time.perf_counter()
                    out = _layer(op, domain, local["q"], local["k"], local["v"], local["pos"],
                                 norms)
                    (out * local["cotangent"]).sum().backward()
                    total = time.perf_counter() - start
                    sizes.add(meter.bytes)
                    if step >= args.warmup:
                        totals.append(total)
                        comms.append(meter.seconds)
                pieces = [split.gather(out.detach(), 2)] + [
                    split.gather(local[name].grad, 2) for name in ("q", "k", "v")]
                alone = _all_reduce_alone(meter, max(sizes), dtype, args)
                if rank == 0:
                    record = {
                        "op": op, "N": n, "world_size": world, "bytes_per_layer": max(sizes),
                        "comm_ms": 1e3 * statistics.median(comms),
                        "compute_ms": 1e3 * statistics.median(
                            t - c for t, c in zip(totals, comms, strict=True)),
                        **_reference(op, args, whole, norms, pieces),
                        "comm_alone_ms": alone, "all_reduces_per_layer": 2,
                        "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim,
                        "coordinates": args.coordinates, "dtype": args.dtype}
                    if len(sizes) != 1:
                        record["bytes_per_layer_varied"] = sorted(sizes)
                    records.append(record)
                dist.barrier()  # the other ranks wait while rank 0 times one process
        if rank == 0:
            Path(result_file).write_text(json.dumps(records))
        cleanup_distributed(DistributedContext(rank=rank, world_size=world))
    finally:
        if dist.is_initialized():  # failed on the way: leave without waiting for the others
            dist.destroy_process_group()


def _all_reduce_alone(meter: _Meter, size: int, dtype: torch.dtype,
                      args: argparse.Namespace) -> float:
    """Milliseconds of two all-reduces of ``size`` bytes in all, with nothing to wait for (the
    ranks start together, no compute between): the layer's communication on its own, median
    of the repeats."""
    buffer = torch.zeros(size // 2 // dtype.itemsize, dtype=dtype)
    times = []
    for step in range(args.warmup + args.repeats):
        dist.barrier()
        meter.reset()
        for _ in range(2):
            dist.all_reduce(buffer)
        if step >= args.warmup:
            times.append(meter.seconds)
    return 1e3 * statistics.median(times)


def _reference(op: str, args: argparse.Namespace, whole: dict[str, torch.Tensor],
               norms: tuple, pieces: list[torch.Tensor]) -> dict[str, Any]:
    """The layer on the whole sample in this process: its time (median of the repeats) and
    the largest differences from the gathered domain-parallel output and gradients."""
    leaves = {name: whole[name].clone().requires_grad_() for name in ("q", "k", "v")}
    times = []
    for step in range(args.warmup + args.repeats):
        for t in leaves.values():
            t.grad = None
        start = time.perf_counter()
        out = _layer(op, ops, leaves["q"], leaves["k"], leaves["v"], whole["pos"], norms)
        (out * whole["cotangent"]).sum().backward()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    grads = [leaves[name].grad for name in ("q", "k", "v")]
    return {"single_process_ms": 1e3 * statistics.median(times),
            "max_abs_diff_out": float((pieces[0] - out.detach()).abs().max()),
            "max_abs_diff_grad": max(float((a - b).abs().max())
                                     for a, b in zip(pieces[1:], grads, strict=True))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="domain_parallel_") as folder:
        result_file = Path(folder) / "records.json"
        mp.start_processes(_worker, args=(args.world, args, str(Path(folder) / "init"),
                                          str(result_file)),
                           nprocs=args.world, join=True, start_method="spawn")
        records = json.loads(result_file.read_text())
    for op in OPS:
        sizes = {r["bytes_per_layer"] for r in records if r["op"] == op}
        for r in records:
            if r["op"] == op:
                r["bytes_independent_of_N"] = len(sizes) == 1
    torch.set_num_threads(1)  # the workers' setting, which describe_device reports
    write_json(args.out, {"command": command_line(), "device": describe_device("cpu"),
                          "torch": torch.__version__, "threads_per_process": 1,
                          "records": records})
    print(f"{'op':>10} {'N':>8} {'W':>2} {'bytes/layer':>11} {'comm ms':>8} {'(alone)':>8} "
          f"{'compute ms':>10} {'1-proc ms':>9} {'diff out':>9} {'diff grad':>9}")
    for r in records:
        print(f"{r['op']:>10} {r['N']:8d} {r['world_size']:2d} {r['bytes_per_layer']:11d} "
              f"{r['comm_ms']:8.2f} {r['comm_alone_ms']:8.2f} {r['compute_ms']:10.2f} "
              f"{r['single_process_ms']:9.2f} {r['max_abs_diff_out']:9.2e} "
              f"{r['max_abs_diff_grad']:9.2e}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
