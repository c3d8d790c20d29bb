"""Generators of the Burgers and Darcy data sets (SPEC §4) into resumable HDF5 files.

Sample ``i`` of a set depends only on ``(seed, i)`` (see :mod:`.random_fields`), so chunk size,
worker count and interruptions do not change the data.  File schema: :mod:`.storage`.

Paper-sized defaults: Burgers 2048 samples at 8192 points (train = first 1024, evaluation = last
100); Darcy 2048 samples at 421 x 421, i.e. the paper's 1024 training samples followed by the
1024 of its second, independent set whose last 100 are the evaluation samples.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._checks import check_float, check_int, resolve_device
from . import darcy as _darcy
from .burgers import solve_burgers
from .darcy import sample_and_solve as _darcy_task
from .random_fields import sample_periodic_grf_1d
from .storage import ArraySpec, ChunkedWriter

__all__ = ["generate_burgers", "generate_darcy"]


def _run(
    writer: ChunkedWriter, compute: Any, progress: bool, desc: str
) -> Path:
    """Compute and store every pending chunk with a progress bar; publish the file at the end."""
    try:
        with tqdm(
            total=writer.n_samples,
            initial=writer.n_done(),
            unit="sample",
            desc=desc,
            disable=not progress,
            dynamic_ncols=True,
        ) as bar:
            for chunk, start, stop in writer.pending_chunks():
                writer.write_chunk(chunk, compute(start, stop))
                bar.update(stop - start)
        return writer.finish()
    finally:
        writer.close()


def generate_burgers(
    out: str | os.PathLike[str],
    n_samples: int = 2048,
    resolution: int = 8192,
    *,
    seed: int = 0,
    nu: float = 0.1,
    t_end: float = 1.0,
    solve_resolution: int | None = 1024,
    n_steps: int | None = None,
    chunk_size: int = 256,
    device: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Generate the Burgers set: ``a`` = ``u0`` (GRF, SPEC §4), ``u`` = ``u(., t_end)``.

    Both arrays have shape ``(n_samples, resolution)`` on ``x_j = j / resolution``.  The solver
    works on ``min(solve_resolution, resolution)`` points (``None``: the full grid) and
    zero-pads the result; ``n_steps`` ETDRK4 steps (default ``ceil(t_end / 1e-3)``) on
    ``device`` (default CPU; e.g. ``"cuda"``).  Returns the path of the finished file.
    """
    n_samples = check_int(n_samples, "n_samples")
    resolution = check_int(resolution, "resolution", 4)
    seed = check_int(seed, "seed", 0)
    nu = check_float(nu, "nu")
    t_end = check_float(t_end, "t_end")
    chunk_size = check_int(chunk_size, "chunk_size")
    m = resolution if solve_resolution is None else min(
        check_int(solve_resolution, "solve_resolution", 4), resolution
    )
    if n_steps is None:
        n_steps = max(1, int(np.ceil(t_end / 1e-3 - 1e-9)))
    n_steps = check_int(n_steps, "n_steps")
    import torch

    # checked before the partial file exists: a bad device must not leave one behind
    dev = resolve_device(device) if device is not None else torch.device("cpu")
    params = {
        "sigma": 25.0, "tau": 5.0, "gamma": 2.0, "nu": nu, "t_end": t_end,
        "resolution": resolution, "solve_resolution": m, "n_steps": n_steps,
        "method": "pseudo-spectral ETDRK4, 2/3 de-aliasing",
    }
    writer = ChunkedWriter.open(
        out, generator="burgers", parameters=params, seed=seed, n_samples=n_samples,
        chunk_size=chunk_size, resume=resume, overwrite=overwrite,
        arrays={"a": ArraySpec((resolution,), "f8"), "u": ArraySpec((resolution,), "f8")},
    )

    def compute(start: int, stop: int) -> dict[str, np.ndarray]:
        u0 = sample_periodic_grf_1d(stop - start, resolution, seed=seed, start=start)
        u1 = solve_burgers(
            torch.from_numpy(u0).to(dev), nu, t_end, n_steps=n_steps, solve_resolution=m
        )
        return {"a": u0, "u": u1.cpu().numpy()}

    return _run(writer, compute, progress, "burgers")


def generate_darcy(
    out: str | os.PathLike[str],
    n_samples: int = 2048,
    resolution: int = 421,
    *,
    seed: int = 0,
    alpha: float = 2.0,
    tau: float = 3.0,
    high: float = 12.0,
    low: float = 3.0,
    f: float = 1.0,
    chunk_size: int = 32,
    workers: int | None = None,
    executor: Executor | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Generate the Darcy set: ``a`` = thresholded Neumann GRF (``high``/``low``), ``u`` = solution.

    Arrays of shape ``(n_samples, resolution, resolution)`` on ``x_i = i / (resolution - 1)``;
    ``a`` is stored as float32 (exact for 3 and 12), ``u`` as float64.  Samples are computed in
    ``workers`` processes (default: all usable cores) or on a given ``executor``.  Scripts that
    call this must guard their top level with ``if __name__ == "__main__":`` (spawned workers).
    Returns the path of the finished file.
    """
    n_samples = check_int(n_samples, "n_samples")
    resolution = check_int(resolution, "resolution", 3)
    seed = check_int(seed, "seed", 0)
    params = {
        "alpha": check_float(alpha, "alpha"),
        "tau": check_float(tau, "tau", low_inclusive=True),
        "high": check_float(high, "high"),
        "low": check_float(low, "low"),
        "f": float(f),
    }
    if not np.isfinite(params["f"]):
        raise ValueError(f"f must be a finite number, got {f!r}")
    chunk_size = check_int(chunk_size, "chunk_size")
    if workers is not None:
        workers = check_int(workers, "workers")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {executor!r}")
    stored = dict(params, resolution=resolution,
                  method="5-point FD, arithmetic-mean faces, SuperLU (MMD, symmetric mode)")
    writer = ChunkedWriter.open(
        out, generator="darcy", parameters=stored, seed=seed, n_samples=n_samples,
        chunk_size=chunk_size, resume=resume, overwrite=overwrite,
        arrays={"a": ArraySpec((resolution,) * 2, "f4"), "u": ArraySpec((resolution,) * 2, "f8")},
    )
    own_pool = None

    pool: Executor | None = None

    def compute(start: int, stop: int) -> dict[str, np.ndarray]:
        tasks = [(seed, i, resolution, params) for i in range(start, stop)]
        results = list((pool.map if pool is not None else map)(_darcy_task, tasks))
        return {
            "a": np.stack([r[0] for r in results]).astype(np.float32),
            "u": np.stack([r[1] for r in results]),
        }

    try:
        if executor is None and (workers is None or workers > 1):
            own_pool = _darcy.darcy_executor(workers)
        pool = executor or own_pool
        return _run(writer, compute, progress, "darcy")
    finally:
        writer.close()
        if own_pool is not None:
            own_pool.shutdown(cancel_futures=True)
