"""data/darcy.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import os

import numpy as np
import pytest
import torch

from galerkin_ext.data import darcy
from galerkin_ext.data.darcy import default_workers, solve_darcy


def _a(k=9, b=None):
    rng = np.random.default_rng(0)
    shape = (k, k) if b is None else (b, k, k)
    return 1.0 + rng.random(shape)


def test_solve_darcy_checks_a_f_and_executor():
    with pytest.raises(TypeError, match="^a must hold real numbers, got dtype bool"):
        solve_darcy(np.ones((5, 5), dtype=bool))
    with pytest.raises(TypeError, match="^a must hold real numbers, got dtype complex128"):
        solve_darcy(np.ones((5, 5), dtype=complex))
    for shape in ((5,), (1, 2, 5, 5)):
        with pytest.raises(ValueError, match=r"^a must have shape \(K, K\) or \(B, K, K\), got"):
            solve_darcy(np.ones(shape))
    with pytest.raises(ValueError, match=r"^f must not have more dimensions than a, got shape "
                                         r"\(1, 5, 5\)"):
        solve_darcy(np.ones((5, 5)), np.ones((1, 5, 5)))
    with pytest.raises(TypeError, match="^executor must be a concurrent.futures.Executor, got 2"):
        solve_darcy(np.ones((5, 5)), executor=2)


def test_a_tensor_f_solves_like_its_array():
    a = _a()
    f = np.random.default_rng(1).random((9, 9))
    np.testing.assert_array_equal(solve_darcy(a, torch.from_numpy(f)), solve_darcy(a, f))


def test_one_usable_core_solves_a_batch_in_process(monkeypatch):
    a = _a(b=3)
    expected = np.stack([solve_darcy(x) for x in a])

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool was started for one core")

    monkeypatch.setattr(darcy, "default_workers", lambda: 1)
    monkeypatch.setattr(darcy, "darcy_executor", no_pool)
    np.testing.assert_allclose(solve_darcy(a), expected, rtol=0, atol=0)


def test_default_workers_without_sched_getaffinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert default_workers() == 7
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert default_workers() == 1
