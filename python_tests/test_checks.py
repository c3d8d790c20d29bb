"""The package's shared argument checks: accepted values, and the kind and text of each error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from galerkin_ext._checks import check_choice, check_float, check_int, check_probability


def test_check_int():
    assert check_int(3, "n") == 3
    assert check_int(np.int64(0), "seed", 0) == 0 and type(check_int(np.int64(2), "n")) is int
    with pytest.raises(ValueError, match=r"^n: expected an int >= 1, got 0$"):
        check_int(0, "n")
    for bad in (True, 2.0, "3", None):
        with pytest.raises(TypeError, match="n: expected an int >= 1"):
            check_int(bad, "n")


def test_check_float():
    assert check_float(2, "lr") == 2.0 and type(check_float(np.float32(0.5), "lr")) is float
    assert check_float(0, "eps", low_inclusive=True) == 0.0
    assert check_float(1.0, "pct_start", high=1.0) == 1.0
    with pytest.raises(ValueError, match=r"^lr: expected a finite float > 0, got 0$"):
        check_float(0, "lr")
    with pytest.raises(ValueError, match=r"pct_start: expected a finite float > 0 and <= 1"):
        check_float(1.5, "pct_start", high=1.0)
    for bad in (math.inf, math.nan, -1e-9):
        with pytest.raises(ValueError, match="tau: expected a finite float >= 0"):
            check_float(bad, "tau", low_inclusive=True)
    for bad in (False, "1", None):
        with pytest.raises(TypeError, match="lr: expected a finite float"):
            check_float(bad, "lr")


def test_check_probability_and_choice():
    assert check_probability(0, "p") == 0.0 and check_probability(0.5, "p") == 0.5
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match=r"p: expected a float in \[0, 1\)"):
            check_probability(bad, "p")
    with pytest.raises(TypeError, match="p: expected a float in"):
        check_probability(True, "p")
    assert check_choice("relu", "activation", ["relu", "gelu"]) == "relu"
    with pytest.raises(ValueError, match=r"activation: expected one of \['relu'\], got 'tanh'"):
        check_choice("tanh", "activation", ["relu"])
