"""Shared argument checks for :mod:`galerkin_ext.data` (one place so every error reads alike)."""

from __future__ import annotations

import math
import numbers


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as an ``int`` or raise if it is not an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_positive_float(name: str, value: object, allow_zero: bool = False) -> float:
    """Return ``value`` as a finite ``float`` > 0 (or >= 0 with ``allow_zero``) or raise."""
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite real number {bound}, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite real number {bound}, got {value}")
    return value


def check_seed(name: str, value: object) -> int:
    """Seeds are non-negative integers (what :class:`numpy.random.SeedSequence` accepts)."""
    return check_positive_int(name, value, minimum=0)
