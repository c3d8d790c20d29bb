"""Interleaved timing of single ops on the CPU, shared by the benchmarks that compare two
implementations of one op (``spectral_cpu.py``, ``dropout_cpu.py``): their common flags, the
timing and the results file."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from galerkin_ext._cli import positive_int, writable_file
from galerkin_ext.training import command_line, describe_device, write_json

WARMUP = 2  # untimed rounds first


def forward_backward_medians(forwards: Mapping[str, Callable[[], Tensor]],
                             inputs: Sequence[Tensor], grad: Tensor,
                             reps: int) -> dict[str, tuple[float, float]]:
    """Median milliseconds of each forward alone (under ``no_grad``) and of the forward with the
    gradients of ``inputs`` against ``grad``, over ``reps`` rounds that run every forward in
    turn (so that drift hits all alike), after ``WARMUP`` untimed rounds."""
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in forwards}
    for rep in range(WARMUP + reps):
        for name, forward in forwards.items():
            start = time.perf_counter()
            with torch.no_grad():
                forward()
            middle = time.perf_counter()
            torch.autograd.grad(forward(), inputs, grad)
            end = time.perf_counter()
            if rep >= WARMUP:
                times[name][0].append((middle - start) * 1e3)
                times[name][1].append((end - middle) * 1e3)
    return {name: (statistics.median(f), statistics.median(fb))
            for name, (f, fb) in times.items()}


def op_parser(doc: str | None, reps: int) -> argparse.ArgumentParser:
    """A parser with ``--out`` (required), ``--reps`` (default ``reps``) and ``--threads``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=writable_file, required=True, help="JSON file to write")
    p.add_argument("--reps", type=positive_int, default=reps,
                   help="timed repetitions per measurement (default: %(default)s)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    return p


def write_results(args: argparse.Namespace, rows: list[dict[str, Any]], **more: Any) -> None:
    """``rows`` (and ``more``) into ``args.out`` with the command, the device, torch and the
    settings."""
    write_json(args.out, {"command": command_line(), "device": describe_device("cpu"),
                          "torch": torch.__version__, "threads": args.threads,
                          "reps": args.reps, "rows": rows, **more})
    print(f"wrote {args.out}")
