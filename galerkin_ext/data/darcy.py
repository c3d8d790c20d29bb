"""Darcy flow solver: ``-div(a grad u) = f`` on ``(0, 1)^2``, ``u = 0`` on the boundary.

Discretisation (SPEC §4): nodes ``x_i = i / (K - 1)``, ``h = 1 / (K - 1)``, the 5-point stencil
with face coefficients equal to the arithmetic mean of the two nodal values,

    (1/h^2) sum_{faces F of node P} a_F (u_P - u_F) = f_P,     a_F = (a_P + a_F-neighbour) / 2,

for the ``(K - 2)^2`` interior nodes; boundary values are zero.  The matrix is symmetric (a face
coefficient enters both rows) and, for ``a > 0``, irreducibly diagonally dominant, hence SPD.

It is solved by a sparse LU factorisation (SuperLU) with the minimum-degree ordering of
``A^T + A`` in symmetric mode and no pivoting -- stable for SPD matrices, and measured the
fastest factorisation SciPy offers here (~0.8 s for K = 421 on one core, half COLAMD's fill).
Batches are spread over worker processes (one sample per task).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from functools import lru_cache
from multiprocessing import get_context
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from .._checks import check_int
from .random_fields import sample_darcy_coefficient

__all__ = [
    "SPEC_COEF",
    "assemble_darcy_matrix",
    "solve_darcy",
    "darcy_executor",
    "default_workers",
    "sample_and_solve",
]

#: The coefficient kind of SPEC.md's Darcy set (12 / 3 by the sign of a GRF), whose files and
#: parameters record no ``coef``.
SPEC_COEF = "piecewise"


def default_workers() -> int:
    """Number of CPU cores usable by this process (the default worker count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@lru_cache(maxsize=4)
def _pattern(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row/column indices of the interior 5-point matrix in COO order (cached per size)."""
    n = k - 2
    idx = np.arange(n * n).reshape(n, n)
    east = (idx[:-1, :].ravel(), idx[1:, :].ravel())
    north = (idx[:, :-1].ravel(), idx[:, 1:].ravel())
    rows = np.concatenate([idx.ravel(), east[0], east[1], north[0], north[1]])
    cols = np.concatenate([idx.ravel(), east[1], east[0], north[1], north[0]])
    return rows, cols


def _check_coefficient(a: np.ndarray, name: str = "a") -> None:
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 3:
        raise ValueError(f"{name} must have shape (K, K) with K >= 3, got {a.shape}")
    if not np.isfinite(a).all() or not (a > 0).all():
        raise ValueError(f"{name} must be finite and strictly positive everywhere")


def assemble_darcy_matrix(a: np.ndarray) -> sp.csc_matrix:
    """The SPD matrix of the scheme for a nodal coefficient ``a`` of shape ``(K, K)``.

    Returns a CSC matrix of shape ``((K-2)^2, (K-2)^2)`` acting on the interior nodes in
    row-major order (``u[1:-1, 1:-1].ravel()``), including the ``1/h^2`` factor.
    """
    a = np.asarray(a, dtype=np.float64)
    _check_coefficient(a)
    k = a.shape[0]
    face_x = 0.5 * (a[1:, :] + a[:-1, :])  # face between (i, j) and (i+1, j); shape (K-1, K)
    face_y = 0.5 * (a[:, 1:] + a[:, :-1])  # face between (i, j) and (i, j+1); shape (K, K-1)
    east, west = face_x[1:, 1:-1], face_x[:-1, 1:-1]
    north, south = face_y[1:-1, 1:], face_y[1:-1, :-1]
    diag = (east + west + north + south).ravel()
    off_x = -east[:-1, :].ravel()
    off_y = -north[:, :-1].ravel()
    vals = np.concatenate([diag, off_x, off_x, off_y, off_y]) * (k - 1) ** 2
    rows, cols = _pattern(k)
    n = (k - 2) ** 2
    return sp.csc_matrix((vals, (rows, cols)), shape=(n, n))


def _solve_one(a: np.ndarray, f: np.ndarray) -> np.ndarray:
    """Solve one sample: ``a`` and ``f`` of shape ``(K, K)`` -> ``u`` of shape ``(K, K)``."""
    k = a.shape[0]
    mat = assemble_darcy_matrix(a)
    lu = spla.splu(
        mat,
        permc_spec="MMD_AT_PLUS_A",
        diag_pivot_thresh=0.0,
        options={"SymmetricMode": True},
    )
    u = np.zeros((k, k))
    u[1:-1, 1:-1] = lu.solve(np.ascontiguousarray(f[1:-1, 1:-1]).ravel()).reshape(k - 2, k - 2)
    return u


def _solve_task(args: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    return _solve_one(*args)


def sample_and_solve(
    args: tuple[int, int, int, dict[str, Any]],
) -> tuple[np.ndarray, np.ndarray]:
    """Worker task of the generator: coefficient sample ``index`` and its solution.

    ``args = (seed, index, resolution, params)`` with ``params`` holding ``alpha``, ``tau``
    and ``f``, ``high`` and ``low`` (not for lognormal coefficients), and for the continuum
    sets ``coef`` (``"piecewise"`` or ``"lognormal"``) and ``sigma``; returns ``(a, u)``, each
    ``(K, K)``.  Sampling here, in the worker, spreads it over the cores too.
    """
    seed, index, resolution, p = args
    levels = {key: p[key] for key in ("high", "low") if key in p}  # (none: lognormal)
    a = sample_darcy_coefficient(
        1, resolution, seed=seed, start=index, alpha=p["alpha"], tau=p["tau"],
        kind=p.get("coef", SPEC_COEF), sigma=p.get("sigma", 1.0), **levels,
    )[0]
    return a, _solve_one(a, np.full(a.shape, p["f"]))


def _exit_with_parent(parent: int) -> None:
    """Worker initialiser: leave once the parent is gone (a killed parent would orphan us),
    and ignore SIGINT, which a terminal's Ctrl-C sends the whole process group: the parent
    handles it (it cancels the pool and keeps the completed chunks), while a worker
    interrupted inside the result queue's lock left the parent waiting on it for ever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def darcy_executor(workers: int | None = None) -> Executor:
    """A process pool for the solver (spawned, so it is safe after torch/threads are loaded)."""
    workers = default_workers() if workers is None else check_int(workers, "workers")
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context("spawn"),
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    )


def _map_solve(
    a: np.ndarray, f: np.ndarray, executor: Executor | None
) -> Iterator[np.ndarray]:
    tasks = ((a[i], f[i]) for i in range(a.shape[0]))
    if executor is None:
        return map(_solve_task, tasks)
    return executor.map(_solve_task, tasks)


def _as_batch(a: object, f: object) -> tuple[np.ndarray, np.ndarray, bool, torch.Tensor | None]:
    """Validate and broadcast ``a`` to ``(B, K, K)`` and ``f`` alike; remember the input kind."""
    like = None
    if isinstance(a, torch.Tensor):
        like = a
        a = a.detach().cpu().numpy()
    if isinstance(f, torch.Tensor):
        f = f.detach().cpu().numpy()
    if not isinstance(a, np.ndarray):
        raise TypeError(f"a must be a numpy.ndarray or torch.Tensor, got {type(a).__name__}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"a must hold real numbers, got dtype {a.dtype}")
    if a.ndim not in (2, 3):
        raise ValueError(f"a must have shape (K, K) or (B, K, K), got {a.shape}")
    single = a.ndim == 2
    batch = np.asarray(a, dtype=np.float64).reshape((-1,) + a.shape[-2:])
    if batch.shape[0] == 0:
        raise ValueError(f"a must contain at least one sample, got shape {a.shape}")
    for i in range(batch.shape[0]):
        _check_coefficient(batch[i], "a" if single else f"a[{i}]")
    f_arr = np.asarray(f)  # (no dtype: numpy's own error for strings would not name f)
    if not (np.issubdtype(f_arr.dtype, np.floating) or np.issubdtype(f_arr.dtype, np.integer)):
        raise TypeError(f"f must be a real scalar or array, got dtype {f_arr.dtype}")
    try:
        f_b = np.broadcast_to(np.asarray(f_arr, dtype=np.float64), batch.shape)
    except ValueError:
        raise ValueError(
            f"f must be a scalar or broadcast to a's shape {a.shape}, got shape {f_arr.shape}"
        ) from None
    if f_arr.ndim > a.ndim:
        raise ValueError(f"f must not have more dimensions than a, got shape {f_arr.shape}")
    if not np.isfinite(f_b).all():
        raise ValueError("f must be finite")
    return batch, f_b, single, like


def solve_darcy(
    a: np.ndarray | object,
    f: float | np.ndarray | object = 1.0,
    *,
    workers: int = 1,
    executor: Executor | None = None,
) -> np.ndarray | object:
    """Solve ``-div(a grad u) = f`` with ``u = 0`` on the boundary of the unit square.

    Args:
        a: nodal coefficient on ``x_i = i / (K - 1)``, shape ``(K, K)`` or ``(B, K, K)``,
            finite and ``> 0``; NumPy array or torch tensor.
        f: right-hand side, a scalar or an array broadcastable to ``a``'s shape (only interior
            values are used).
        workers: worker processes for a batch: ``1`` (default) solves in this process; more
            start a pool of spawned processes for the call, which takes seconds (reuse one
            over many calls through ``executor``), and a script that starts one must guard
            its top level with ``if __name__ == "__main__":``, as for any spawned process.
            Ignored for a single sample.
        executor: an existing executor to reuse (its workers must be processes or threads,
            e.g. :func:`darcy_executor`); overrides ``workers``.

    Returns:
        ``u`` of ``a``'s shape, float64, with an exact zero boundary ring; a tensor (on ``a``'s
        device) if ``a`` is a tensor.
    """
    batch, f_b, single, like = _as_batch(a, f)
    check_int(workers, "workers")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {executor!r}")
    n = batch.shape[0]
    if executor is None and n > 1 and workers > 1:
        with darcy_executor(min(n, workers)) as pool:
            u = np.stack(list(_map_solve(batch, f_b, pool)))
    else:
        u = np.stack(list(_map_solve(batch, f_b, executor)))
    if single:
        u = u[0]
    if like is not None:
        return torch.from_numpy(u).to(like.device)
    return u
