"""_checks.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""


import pytest
from test_training import _Linear1d, _PointMLP  # noqa: E402

from galerkin_ext.training import evaluate


def test_a_device_neither_cpu_nor_cuda_is_refused():
    with pytest.raises(ValueError, match="^device: expected a CPU or CUDA device, got 'meta'"):
        evaluate(_PointMLP(), _Linear1d(4), device="meta")
