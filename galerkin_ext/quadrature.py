"""Quadrature weights for the key points of an attention layer (SPEC §2b, SPEC-continuum §1.3).

An attention layer of this package is a quadrature of a kernel integral over the key points,
``z(x) ≈ Σ_j w_j κ(x, y_j) v(y_j)``; these functions give the weights ``w`` for the usual
point sets, to pass as the ops' ``weight``:

* :func:`trapezoid_weights` — 1-D coordinates in any order, non-uniform allowed (second order);
* :func:`grid_weights` — a uniform tensor-product grid (trapezoid, or Riemann for periodic
  grids and patches);
* :func:`mesh_weights` — the vertices of a triangle or tetrahedron mesh, given or Delaunay
  (lumped: exact for functions linear on every cell);
* :func:`monte_carlo_weights` — points drawn uniformly from a domain (half order);
* :func:`curve_weights` — the vertices of a polyline or any set of segments (lumped: exact for
  functions linear on every segment).

Every set of weights sums to the length, area or volume of its domain. Softmax-normalised
attention (the continuum and normalised types) depends only on their ratios; the Galerkin and
Fourier types are linear in them, so their total sets the output's scale: divide by the sum to
keep the ops' default scale (weights ``1/M``, summing to 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ._checks import (
    check_choice,
    check_device,
    check_float,
    check_float_dtype,
    check_holds_values,
    check_int,
)
from ._scaling import largest_magnitude

__all__ = [
    "curve_weights",
    "grid_weights",
    "mesh_weights",
    "monte_carlo_weights",
    "trapezoid_weights",
]


def trapezoid_weights(x: Tensor) -> Tensor:
    """Trapezoid weights of 1-D coordinates in any order.

    On the sorted order, ``w_1 = (x_2 - x_1)/2``, ``w_j = (x_{j+1} - x_{j-1})/2``,
    ``w_N = (x_N - x_{N-1})/2``, scattered back to the given order: they sum to
    ``max x - min x`` and integrate smooth functions to second order on any grid. A repeated
    point shares its weight with its copy; ``N = 1`` gives weight 1 (see the module doc for
    the scale).

    Args:
        x: ``(..., N)`` finite floating-point coordinates, ``N >= 1``; a shape ``(n, 1)``,
            ``n > 1`` (the models' 1-D grids: ``n`` sets of one point), is refused.

    Returns:
        ``(..., N)`` weights, ``x``'s dtype and device.
    """
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 1:
        raise TypeError(f"x: expected a floating-point tensor of shape (..., N), got "
                        f"{getattr(x, 'dtype', type(x).__name__)} "
                        f"{tuple(getattr(x, 'shape', ()))}")
    if x.shape[-1] < 1:
        raise ValueError(f"x: expected at least 1 point along the last axis, got shape "
                         f"{tuple(x.shape)}")
    if x.ndim >= 2 and x.shape[-1] == 1 and x.shape[-2] > 1:
        # n sets of one point each (weight 1) is never meant: it is a grid (n, 1) of the models
        raise ValueError(f"x: expected the points along the last axis, got shape "
                         f"{tuple(x.shape)}, i.e. sets of 1 point each; for a grid of shape "
                         "(n, 1) pass x[..., 0]")
    check_holds_values(x, "x", "the weights are computed")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x: expected finite coordinates")
    if x.shape[-1] == 1:
        return torch.ones_like(x)
    ordered, order = x.sort(dim=-1, stable=True)
    half = ordered.diff(dim=-1) / 2
    zero = half.new_zeros((*half.shape[:-1], 1))
    sorted_weights = torch.cat([half, zero], dim=-1) + torch.cat([zero, half], dim=-1)
    return torch.empty_like(x).scatter_(-1, order, sorted_weights)


GRID_RULES = ("trapezoid", "riemann")


def grid_weights(
    shape: Sequence[int],
    lengths: Sequence[float] | None = None,
    *,
    rule: str = "trapezoid",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Tensor-product weights of a uniform grid of 1-D to 3-D, flattened in row-major order.

    Axis ``a`` has ``shape[a]`` points. ``rule="trapezoid"``: the nodes ``i L_a / (n_a - 1)``
    including both ends, the product of 1-D trapezoid weights (``h/2`` at the ends).
    ``rule="riemann"``: ``|D| / N`` at every point (periodic grids, where it is the trapezoid
    rule of a periodic function, and the cells of patched attention). The weights sum to the
    volume ``Π_a L_a``.

    Args:
        shape: points per axis (``>= 2`` for the trapezoid rule, ``>= 1`` for Riemann), 1 to 3
            axes, e.g. ``(141, 141)``.
        lengths: the domain's length per axis (default 1 each).
        rule: ``"trapezoid"`` or ``"riemann"``.
        dtype, device: of the result.

    Returns:
        ``(prod(shape),)`` weights; index ``i_0 * n_1 * ... + i_1 * ... + i_last`` is the node
        ``(i_0, i_1, ...)``, the order of ``torch.meshgrid(..., indexing="ij")`` flattened.
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not (
        1 <= len(shape) <= 3
    ):
        raise TypeError(f"shape: expected a sequence of 1 to 3 ints, got {shape!r}")
    check_choice(rule, "rule", GRID_RULES)
    minimum = 1 if rule == "riemann" else 2
    sizes = [check_int(n, f"shape[{a}]", minimum) for a, n in enumerate(shape)]
    if lengths is None:
        lengths = [1.0] * len(sizes)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise TypeError(f"lengths: expected a sequence of {len(sizes)} lengths (one per axis "
                        f"of shape), got {type(lengths).__name__}")
    if len(lengths) != len(sizes):
        raise ValueError(f"lengths: expected {len(sizes)} lengths (one per axis of shape), "
                         f"got {len(lengths)}: {list(lengths)!r}")
    lengths = [check_float(length, f"lengths[{a}]") for a, length in enumerate(lengths)]
    check_float_dtype(dtype)
    weights = torch.ones((), dtype=torch.float64)
    for n, length in zip(sizes, lengths, strict=True):
        if rule == "riemann":
            axis = torch.full((n,), length / n, dtype=torch.float64)
        else:
            axis = torch.full((n,), length / (n - 1), dtype=torch.float64)
            axis[[0, -1]] /= 2
        weights = torch.outer(weights.reshape(-1), axis)
    return weights.reshape(-1).to(dtype=dtype, device=check_device(device))


def monte_carlo_weights(
    n: int,
    volume: float = 1.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """``volume / n`` for each of ``n`` points drawn uniformly from a domain of that volume:
    the Monte Carlo rule, whose error falls as ``n^(-1/2)``. Returns ``(n,)``."""
    n = check_int(n, "n")
    volume = check_float(volume, "volume")
    check_float_dtype(dtype)
    return torch.full((n,), volume / n, dtype=dtype, device=check_device(device))


def mesh_weights(points: Tensor, cells: Tensor | None = None) -> Tensor:
    """Lumped vertex weights of a simplicial mesh: each cell's measure split equally among
    its vertices.

    Triangles (``cells (C, 3)``) in the plane or in space (a surface), tetrahedra
    (``cells (C, 4)``, 3-D points).  The weights sum to the mesh's area or volume and
    integrate every function that is linear on each cell exactly.  A vertex in no cell gets 0.
    Without ``cells``, the Delaunay triangulation of the points (scipy) is the mesh: it covers
    their convex hull.

    Args:
        points: ``(V, 2)`` or ``(V, 3)`` floating-point vertex coordinates.
        cells: ``(C, 3)`` or ``(C, 4)`` integer vertex indices, or ``None`` for Delaunay.

    Returns:
        ``(V,)`` weights, ``points``' dtype and device.

    Raises:
        ValueError: for an index out of range, a repeated vertex or a given cell of zero
            measure (up to round-off at the cell's size), naming the first such cell. Flat
            simplices of a Delaunay triangulation (from co-circular or co-spherical points,
            e.g. a regular grid) are dropped instead: they carry no weight. Also for weights
            that ``points``' dtype cannot hold (0 or inf where cells have a measure).
    """
    if not isinstance(points, Tensor) or not points.is_floating_point() or points.ndim != 2 or (
        points.shape[1] not in (2, 3)
    ):
        raise TypeError(f"points: expected a floating-point tensor of shape (V, 2) or (V, 3), "
                        f"got {getattr(points, 'dtype', type(points).__name__)} "
                        f"{tuple(getattr(points, 'shape', ()))}")
    check_holds_values(points, "points", "the weights are computed")
    delaunay = cells is None
    if delaunay:
        cells = _delaunay(points)
    if not isinstance(cells, Tensor) or cells.is_floating_point() or cells.is_complex() or (
        cells.dtype == torch.bool
    ) or cells.ndim != 2 or cells.shape[1] not in (3, 4):
        raise TypeError(f"cells: expected an integer tensor of shape (C, 3) or (C, 4), got "
                        f"{getattr(cells, 'dtype', type(cells).__name__)} "
                        f"{tuple(getattr(cells, 'shape', ()))}")
    dim, corners = points.shape[1], cells.shape[1]
    if corners == 4 and dim != 3:
        raise ValueError(f"cells: tetrahedra (C, 4) need 3-D points, got points of shape "
                         f"{tuple(points.shape)}")
    if not bool(torch.isfinite(points).all()):
        raise ValueError("points: expected finite coordinates")
    n_vertices = points.shape[0]
    cells = cells.to(device=points.device, dtype=torch.long)
    out_of_range = ((cells < 0) | (cells >= n_vertices)).any(dim=1)
    if bool(out_of_range.any()):
        c = int(out_of_range.nonzero()[0])
        raise ValueError(f"cells: cell {c} = {cells[c].tolist()} has a vertex index outside "
                         f"[0, {n_vertices})")
    ordered = cells.sort(dim=1).values
    repeated = (ordered.diff(dim=1) == 0).any(dim=1)
    if bool(repeated.any()):
        c = int(repeated.nonzero()[0])
        raise ValueError(f"cells: cell {c} = {cells[c].tolist()} repeats a vertex")
    # Measures in float64 whatever the points' dtype: a small cell of a float32 or half mesh is
    # still resolved, and only cells flat in the given coordinates are degenerate. Each cell is
    # measured on its edges over their largest component, then scaled back (_scaling).
    corner = points[cells].double()  # (C, corners, dim)
    edges = corner[:, 1:] - corner[:, :1]
    size = largest_magnitude(edges, (1, 2))
    unit, size = edges / size, size[:, 0, 0]
    if corners == 3 and dim == 2:
        measure = (unit[:, 0, 0] * unit[:, 1, 1] - unit[:, 0, 1] * unit[:, 1, 0]).abs() / 2
    elif corners == 3:
        measure = torch.linalg.cross(unit[:, 0], unit[:, 1]).norm(dim=1) / 2
    else:
        measure = torch.linalg.det(unit).abs() / 6
    # Zero up to round-off at the cell's own scale (its longest edge from the first vertex).
    longest = unit.norm(dim=2).amax(dim=1)
    degenerate = measure <= 16 * torch.finfo(torch.float64).eps * longest ** (corners - 1)
    measure = measure * size ** (corners - 1)
    if delaunay:  # flat simplices of co-circular/co-spherical points carry no weight: dropped
        cells, measure = cells[~degenerate], measure[~degenerate]
    elif bool(degenerate.any()):
        c = int(degenerate.nonzero()[0])
        kind = "area" if corners == 3 else "volume"
        raise ValueError(f"cells: cell {c} = {cells[c].tolist()} has zero {kind} (its "
                         "vertices are collinear or coplanar)")
    share = (measure / corners).repeat_interleave(corners)
    weights = torch.zeros(n_vertices, dtype=torch.float64, device=points.device)
    weights.index_add_(0, cells.reshape(-1), share)
    cast = weights.to(points.dtype)
    in_a_cell = torch.zeros(n_vertices, dtype=torch.bool, device=points.device)
    in_a_cell[cells.reshape(-1)] = True
    if not bool((torch.isfinite(cast) & ((cast > 0) | ~in_a_cell)).all()):
        hint = "" if points.dtype == torch.float64 else " or pass float64 points"
        raise ValueError(f"points: the cells' measures ({float(measure.min()):.3g} to "
                         f"{float(measure.max()):.3g}) give vertex weights that {points.dtype} "
                         f"cannot hold; scale the coordinates{hint}")
    return cast


def curve_weights(points: Tensor, segments: Tensor) -> Tensor:
    """Lumped vertex weights of a curve given as segments: each segment's length split equally
    between its two end points (SPEC-gnot §3).

    The segments need not form one chain (a closed loop, several pieces and branches are all
    fine): the weights sum to the total length and integrate every function that is linear on
    each segment exactly (the trapezoid rule along an open polyline).  A vertex on no segment
    gets 0.

    Args:
        points: ``(V, 2)`` or ``(V, 3)`` floating-point vertex coordinates.
        segments: ``(S, 2)`` integer vertex indices, ``S >= 0``.

    Returns:
        ``(V,)`` weights, ``points``' dtype and device.

    Raises:
        ValueError: for an index out of range or a segment from a vertex to itself, naming the
            first such segment.
    """
    if not isinstance(points, Tensor) or not points.is_floating_point() or points.ndim != 2 or (
        points.shape[1] not in (2, 3)
    ):
        raise TypeError(f"points: expected a floating-point tensor of shape (V, 2) or (V, 3), "
                        f"got {getattr(points, 'dtype', type(points).__name__)} "
                        f"{tuple(getattr(points, 'shape', ()))}")
    if not isinstance(segments, Tensor) or segments.is_floating_point() or (
        segments.is_complex()
    ) or segments.dtype == torch.bool or segments.ndim != 2 or segments.shape[1] != 2:
        raise TypeError(f"segments: expected an integer tensor of shape (S, 2), got "
                        f"{getattr(segments, 'dtype', type(segments).__name__)} "
                        f"{tuple(getattr(segments, 'shape', ()))}")
    check_holds_values(points, "points", "the weights are computed")
    if not bool(torch.isfinite(points).all()):
        raise ValueError("points: expected finite coordinates")
    n_vertices = points.shape[0]
    segments = segments.to(device=points.device, dtype=torch.long)
    out_of_range = ((segments < 0) | (segments >= n_vertices)).any(dim=1)
    if bool(out_of_range.any()):
        s = int(out_of_range.nonzero()[0])
        raise ValueError(f"segments: segment {s} = {segments[s].tolist()} has a vertex index "
                         f"outside [0, {n_vertices})")
    loop = segments[:, 0] == segments[:, 1]
    if bool(loop.any()):
        s = int(loop.nonzero()[0])
        raise ValueError(f"segments: segment {s} = {segments[s].tolist()} joins a vertex to "
                         "itself")
    step = points[segments[:, 1]] - points[segments[:, 0]]
    size = largest_magnitude(step, 1)  # (_scaling: squares of 1e-23 float32 components are 0)
    half = (step / size).norm(dim=1) * size[:, 0] / 2
    return points.new_zeros(n_vertices).index_add_(0, segments.reshape(-1),
                                                   half.repeat_interleave(2))


def _delaunay(points: Tensor) -> Tensor:
    """The simplices of the Delaunay triangulation of ``points (V, 2|3)``, ``(C, 3|4)``."""
    from scipy.spatial import Delaunay, QhullError

    if not bool(torch.isfinite(points).all()):
        raise ValueError("points: expected finite coordinates")
    # Qhull gets the coordinates scaled by a power of 2 to magnitudes near 1 (at 1e110 it
    # crashed the process): exact, so the triangulation, ties between the diagonals of a
    # regular grid's squares included, is the one of the points as given.
    coords = points.detach().cpu().double()
    top = float(coords.abs().max()) if coords.numel() else 0.0
    if top > 0:
        coords = torch.ldexp(coords, torch.tensor(-math.frexp(top)[1]))
    try:
        triangulation = Delaunay(coords.numpy())
    except (QhullError, ValueError) as error:
        raise ValueError(f"points: no Delaunay triangulation of these {points.shape[0]} points "
                         f"(fewer than {points.shape[1] + 1}, or all on a line or plane); "
                         "pass cells") from error
    return torch.from_numpy(np.asarray(triangulation.simplices, dtype=np.int64)).to(
        points.device)
