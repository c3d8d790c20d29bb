"""Tensor checks and small helpers shared by the layers and models (the scalar checks are in
:mod:`galerkin_ext._checks`).

Every check raises with the argument's name and what was expected, so a bad configuration fails
at construction with a message a user can act on rather than deep inside a forward pass.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_choice

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU}


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
    given = tuple(grid.shape)  # the message reports what the caller passed
    if grid.dim() == len(points) + 1:
        grid = grid.unsqueeze(0)
    if grid.dim() != len(points) + 2 or tuple(grid.shape[1:]) != (*points, dim) or (
        grid.shape[0] not in (1, batch)
    ):
        raise ValueError(f"{name}: expected shape {doc} with B = {batch}, got {given}")
    return grid.expand(batch, *points, dim)
