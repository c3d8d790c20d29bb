"""argparse types shared by the command lines (data generation, example scripts)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ._checks import cannot_write_in, check_seed

_N = TypeVar("_N", int, float)


def _number(text: str, kind: Callable[[str], _N], what: str) -> _N:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "a positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def data_seed(text: str) -> int:
    """A data generation's seed (:func:`~galerkin_ext._checks.check_seed`)."""
    try:
        return check_seed(_number(text, int, "an integer >= 0"))
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("seed: ")) from None


def grid_nodes(text: str) -> int:
    """Nodes per axis of a grid with nodes on its boundary (Darcy's): at least 3."""
    value = _number(text, int, "an integer >= 3")
    if value < 3:
        raise argparse.ArgumentTypeError(f"expected at least 3 nodes per axis, got {value}")
    return value


def periodic_points(text: str) -> int:
    """Points per axis of a periodic grid that a Kolmogorov data set is read at: at least 4
    (:class:`~galerkin_ext.data.KolmogorovDataset`)."""
    value = _number(text, int, "an integer >= 4")
    if value < 4:
        raise argparse.ArgumentTypeError(f"expected at least 4 points per axis, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float, "a number >= 0")
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(text, float, "a positive number")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {value}")
    return value


def usable_device(text: str) -> str:
    """A device the run can use (``auto``, ``cpu``, ``cuda``, ``cuda:1``), checked at once."""
    from ._checks import resolve_device  # imports torch: only when a command line needs it

    try:
        resolve_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def ode_time_step(text: str) -> float:
    """A step of the ODE sets' uniform time grid on [0, 2] (see
    :func:`galerkin_ext.data.ode.time_grid`), checked at once."""
    value = positive_float(text)
    from .data.ode import time_grid

    try:
        time_grid(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def writable_file(text: str) -> Path:
    """A file the command writes when it ends (a results JSON), checked at once: not a folder,
    and a file can be made in the nearest existing folder on its way (the missing ones are
    made). Tried, not judged from the permission bits, which root passes (and /proc, say,
    still refuses)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; expected a file to write")
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    why = cannot_write_in(folder)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write in {str(folder)!r} ({why})")
    return path
