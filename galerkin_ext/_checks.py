"""Argument checks shared by the whole package.

Each returns the value (converted) or raises with the argument's name and what was expected:
``"name: expected ..., got ..."``; ``TypeError`` for the wrong kind of value, ``ValueError`` for one
out of range. Bools are rejected where numbers are expected (``True`` is not a width).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``."""
    expected = f"{name}: expected an int >= {minimum}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(expected)
    if value < minimum:
        raise ValueError(expected)
    return int(value)


def check_float(value: object, name: str, *, low: float = 0.0, low_inclusive: bool = False,
                high: float = math.inf) -> float:
    """``value`` as a finite float above ``low`` (or equal to it if ``low_inclusive``) and at
    most ``high``."""
    bounds = f"{'>=' if low_inclusive else '>'} {low:g}" + (
        f" and <= {high:g}" if high < math.inf else "")
    expected = f"{name}: expected a finite float {bounds}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(expected)
    value = float(value)
    above = value >= low if low_inclusive else value > low
    if not (math.isfinite(value) and above and value <= high):
        raise ValueError(expected)
    return value


def check_probability(value: object, name: str) -> float:
    """``value`` as a dropout probability in ``[0, 1)``."""
    expected = f"{name}: expected a float in [0, 1), got {value!r}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(expected)
    if not 0.0 <= value < 1.0:
        raise ValueError(expected)
    return float(value)


def check_choice(value: object, name: str, choices: Sequence[object]) -> object:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value
