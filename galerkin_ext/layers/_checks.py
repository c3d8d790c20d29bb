"""Argument checks and small helpers shared by the layers and models.

Every check raises with the argument's name and what was expected, so a bad configuration fails
at construction with a message a user can act on rather than deep inside a forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}


def check_int(value: object, name: str, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum`` (bools are rejected: ``True`` is not a width)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def check_probability(value: object, name: str) -> float:
    """``value`` as a dropout probability in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a float in [0, 1), got {value!r}")
    return float(value)


def check_nonnegative_float(value: object, name: str, *, positive: bool = False) -> float:
    """``value`` as a finite float ``>= 0`` (``> 0`` when ``positive``)."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name}: expected a finite float {bound}, got {value!r}")
    return float(value)


def check_choice(value: object, name: str, choices: Sequence[object]) -> object:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, got {value!r}")
    return value


def make_activation(name: str, arg_name: str = "activation") -> nn.Module:
    """A fresh activation module from its name: ``'relu'``, ``'silu'`` or ``'gelu'``."""
    check_choice(name, arg_name, list(_ACTIVATIONS))
    return _ACTIVATIONS[name]()


def check_tensor(x: object, name: str, ndim: int, shape_doc: str) -> Tensor:
    """``x`` if it is a floating-point tensor of rank ``ndim``; ``shape_doc`` names the dims."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a tensor of shape {shape_doc}, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected shape {shape_doc}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    return x


def expand_grid(grid: object, name: str, batch: int, points: tuple[int, ...], dim: int) -> Tensor:
    """Accept a grid shared by the batch ``(*points, dim)`` or per sample ``(B, *points, dim)``.

    Returns the grid expanded (a view, no copy) to ``(B, *points, dim)``.
    """
    doc = f"({', '.join(map(str, points))}, {dim}) or (B, {', '.join(map(str, points))}, {dim})"
    if not isinstance(grid, Tensor):
        raise TypeError(f"{name}: expected a tensor of shape {doc}, got {type(grid).__name__}")
    if grid.dim() == len(points) + 1:
        grid = grid.unsqueeze(0)
    if grid.dim() != len(points) + 2 or tuple(grid.shape[1:]) != (*points, dim) or (
        grid.shape[0] not in (1, batch)
    ):
        raise ValueError(f"{name}: expected shape {doc} with B = {batch}, got {tuple(grid.shape)}")
    return grid.expand(batch, *points, dim)
