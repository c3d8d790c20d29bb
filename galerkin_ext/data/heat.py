"""Heat data set of the GNOT experiments (SPEC-gnot §4.1): three subdomains, three inputs + θ.

Steady conduction on ``Ω = [0, 9]²``, periodic in ``x``:

    −∇·(k ∇T) = Q,   T = 0 at y = 0,   T = g(x) at y = 9,   T(0, y) = T(9, y).

Two interfaces ``y = s_j(x)`` split ``Ω`` into bottom / middle / top (labels 0, 1, 2) with
``k = 1, 0.05, 10`` and ``Q = 1, 0, 0``; the convection term of the paper's equation is
dropped (SPEC-gnot [R]).  The interfaces are periodic cubic splines through the knots
``x_m = 1.5 m``, ``m = 0..6``, heights ``s_1 ~ U(2, 3.5)``, ``s_2 ~ U(5.5, 7)`` (``h_6 = h_0``),
redrawn while ``min(s_2 − s_1) < 1``, ``min s_1 < 0.5`` or ``max s_2 > 8.5``; the top
temperature is ``g(x) = g_0 + Σ_{m=1..4} (a_m cos(2πmx/9) + b_m sin(2πmx/9)) / m``,
``g_0 ~ U(0, 2)``, ``a_m, b_m ~ N(0, 0.5²)``.

Mesh (:func:`heat_mesh`): Triangle ``pq30a{√3h²/4}YA``; boundary points every ``≈ h``, one
list of heights (with ``s_j(0)``) on both ``x = 0`` and ``x = 9`` so the sides match, the
interfaces as internal segments through spline points every ``≈ h`` of arc length.  Solve
(:func:`solve_heat`): P2, ``k`` and ``Q`` per triangle, the ``x = 9`` DOFs identified with
their ``x = 0`` twins, Dirichlet rows condensed, SuperLU.

:func:`heat_sample` gives one stored sample (SPEC-gnot §3): the vertices with ``T``, lumped
weights and subdomain labels; the inputs ``top_temperature`` (the top boundary's vertices and
``g``), ``interface_1``, ``interface_2`` (their vertices, curve weights); ``θ`` = the 12 knot
heights.  Sample ``i`` depends only on ``(seed, i)``: ``numpy.random.default_rng([seed, i,
STREAM_HEAT])``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from scipy.interpolate import CubicSpline

from .._checks import check_bool, check_float, check_int
from .fem import (
    TriMesh,
    assemble_diffusion,
    assemble_load,
    lumped_weights,
    marked_curve,
    near_triangles,
    p2_basis,
    refine_to_areas,
    skfem_mesh,
    solve_constrained,
    triangle_areas,
    triangulate,
    vertex_min_label,
)

__all__ = [
    "STREAM_HEAT",
    "HEAT_SIZE",
    "HEAT_KNOTS",
    "HEAT_CONDUCTIVITY",
    "HEAT_SOURCE",
    "HEAT_INPUTS",
    "HEAT_REFINE_DISTANCE",
    "HeatSolution",
    "interface_splines",
    "check_heat_theta",
    "sample_heat_parameters",
    "top_temperature",
    "heat_mesh",
    "solve_heat",
    "heat_sample",
]

#: Random stream of the heat samples (``default_rng([seed, index, STREAM_HEAT])``); distinct
#: from the streams of :mod:`.random_fields` and :mod:`.elasticity`.
STREAM_HEAT = 6
HEAT_SIZE = 9.0
#: Spline knots ``x_m = 1.5 m``, ``m = 0..6`` (``x_6`` repeats ``x_0`` periodically).
HEAT_KNOTS = 1.5 * np.arange(7, dtype=np.float64)
HEAT_HEIGHT_RANGES = ((2.0, 3.5), (5.5, 7.0))
HEAT_MIN_GAP = 1.0
HEAT_MARGIN = 0.5
#: Conductivity and source of the bottom, middle and top subdomains.
HEAT_CONDUCTIVITY = (1.0, 0.05, 10.0)
HEAT_SOURCE = (1.0, 0.0, 0.0)
HEAT_MODES = 4
HEAT_MODE_STD = 0.5
HEAT_MEAN_RANGE = (0.0, 2.0)
HEAT_INPUTS = ("top_temperature", "interface_1", "interface_2")
#: Refined evaluation sets: triangles within this distance of an interface are split.
HEAT_REFINE_DISTANCE = 0.5
HEAT_H_RANGE = (0.01, 1.5)
HEAT_THETA_DIM = 12

# Segment markers (Triangle reserves 0 and 1).
_BOTTOM, _RIGHT, _TOP, _LEFT, _INTERFACE = 2, 3, 4, 5, 6


def check_heat_theta(theta: object) -> np.ndarray:
    """``theta`` as the ``(12,)`` float64 knot heights ``(s_1(x_0..x_5), s_2(x_0..x_5))``,
    checked to give interfaces with ``0 < s_1 < s_2 < 9`` everywhere."""
    try:
        array = np.asarray(theta, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.shape != (HEAT_THETA_DIM,):
        raise ValueError(f"theta: expected {HEAT_THETA_DIM} real knot heights, shape (12,), "
                         f"got {theta!r}")
    if not np.isfinite(array).all():
        raise ValueError("theta: expected finite knot heights")
    lower, upper = interface_splines(array, check=False)
    if (_spline_range(lower)[0] <= 0 or _spline_range(upper)[1] >= HEAT_SIZE
            or _spline_range(_gap_spline(array))[0] <= 0):
        raise ValueError("theta: the interfaces must satisfy 0 < s_1(x) < s_2(x) < 9 for all x")
    return array


def interface_splines(theta: np.ndarray, *, check: bool = True) -> tuple[CubicSpline, ...]:
    """The two periodic cubic splines ``s_1, s_2`` of the knot heights ``theta (12,)``."""
    if check:
        theta = check_heat_theta(theta)
    return tuple(
        CubicSpline(HEAT_KNOTS, np.append(theta[6 * j : 6 * j + 6], theta[6 * j]),
                    bc_type="periodic")
        for j in range(2)
    )


def _gap_spline(theta: np.ndarray) -> CubicSpline:
    """``s_2 − s_1`` as one spline (spline interpolation is linear in the heights)."""
    gap = theta[6:] - theta[:6]
    return CubicSpline(HEAT_KNOTS, np.append(gap, gap[0]), bc_type="periodic")


def _spline_range(spline: CubicSpline) -> tuple[float, float]:
    """Exact minimum and maximum of a periodic spline on ``[0, 9]`` (knots and critical
    points)."""
    critical = spline.derivative().roots(extrapolate=False)
    x = np.concatenate([HEAT_KNOTS, critical[np.isfinite(critical)]])
    values = spline(x)
    return float(values.min()), float(values.max())


def sample_heat_parameters(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw one sample's knot heights and top temperature.

    Returns:
        ``theta (12,)``: ``s_1`` then ``s_2`` at ``x_0..x_5``, redrawn (both) until
        ``min(s_2 − s_1) >= 1``, ``min s_1 >= 0.5``, ``max s_2 <= 8.5``; and
        ``coefficients (9,)``: ``(g_0, a_1..a_4, b_1..b_4)`` of :func:`top_temperature`.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    low = np.repeat([r[0] for r in HEAT_HEIGHT_RANGES], 6)
    high = np.repeat([r[1] for r in HEAT_HEIGHT_RANGES], 6)
    while True:
        theta = rng.uniform(low, high)
        lower, upper = interface_splines(theta, check=False)
        if (_spline_range(_gap_spline(theta))[0] >= HEAT_MIN_GAP
                and _spline_range(lower)[0] >= HEAT_MARGIN
                and _spline_range(upper)[1] <= HEAT_SIZE - HEAT_MARGIN):
            break
    mean = rng.uniform(*HEAT_MEAN_RANGE)
    modes = rng.normal(0.0, HEAT_MODE_STD, size=2 * HEAT_MODES)
    return theta, np.concatenate([[mean], modes])


def top_temperature(x: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``g(x) = g_0 + Σ_m (a_m cos(2πmx/9) + b_m sin(2πmx/9)) / m`` for ``coefficients =
    (g_0, a_1..a_4, b_1..b_4)``; ``x`` any shape, returns its shape."""
    coefficients = np.asarray(coefficients, dtype=np.float64)
    if coefficients.shape != (1 + 2 * HEAT_MODES,):
        raise ValueError(f"coefficients: expected shape ({1 + 2 * HEAT_MODES},), got "
                         f"{coefficients.shape}")
    x = np.asarray(x, dtype=np.float64)
    m = np.arange(1, HEAT_MODES + 1, dtype=np.float64)
    phase = 2.0 * np.pi * x[..., None] * m / HEAT_SIZE
    a, b = coefficients[1 : 1 + HEAT_MODES], coefficients[1 + HEAT_MODES :]
    return coefficients[0] + ((a * np.cos(phase) + b * np.sin(phase)) / m).sum(axis=-1)


def _even(start: float, stop: float, spacing: float) -> np.ndarray:
    """``ceil(|stop − start| / spacing) + 1`` equispaced points from ``start`` to ``stop``."""
    n = max(1, math.ceil(abs(stop - start) / spacing - 1e-9))
    return start + (stop - start) * np.arange(n + 1) / n


def _interface_points(spline: CubicSpline, spacing: float) -> np.ndarray:
    """Points ``(K, 2)`` on ``y = s(x)`` from ``x = 0`` to ``9``, equally spaced in arc length
    (``≈ spacing``); the end heights are both ``s(0)``, so they match the side lists."""
    fine = np.linspace(0.0, HEAT_SIZE, 64 * max(1, math.ceil(HEAT_SIZE / spacing)) + 1)
    speed = np.hypot(1.0, spline(fine, 1))
    arc = np.concatenate([[0.0], np.cumsum((speed[1:] + speed[:-1]) / 2 * np.diff(fine))])
    n = max(2, math.ceil(arc[-1] / spacing - 1e-9))
    x = np.interp(arc[-1] * np.arange(n + 1) / n, arc, fine)
    x[0], x[-1] = 0.0, HEAT_SIZE
    y = spline(x)
    y[-1] = y[0]  # s(9) = s(0) up to round-off; the periodic sides need it bit-equal
    return np.column_stack([x, y])


def heat_mesh(theta: np.ndarray, h: float, *, refine: bool = False) -> TriMesh:
    """The mesh of the heat domain for the knot heights ``theta (12,)`` and size ``h``.

    Triangle ``pq30a{√3h²/4}YA``: the bottom and top get points every ``≈ h``; the sides
    ``x = 0`` and ``x = 9`` one shared list of heights, each of ``[0, s_1(0)]``,
    ``[s_1(0), s_2(0)]``, ``[s_2(0), 9]`` split evenly at spacing ``≈ h``; the interfaces are
    internal segments through spline points every ``≈ h`` of arc length.  ``Y`` keeps the
    boundary as given, so each ``x = 9`` vertex has a twin at ``x = 0``.  Labels: 0 bottom,
    1 middle, 2 top.  ``refine``: then the triangles within :data:`HEAT_REFINE_DISTANCE` of an
    interface are split to about a quarter of their area (:func:`.fem.refine_to_areas`, again
    ``Y``; a near triangle with an edge on a side is first cut at that edge's midpoint, on both
    sides, see :func:`_cut_side_edges`).

    Returns:
        The :class:`.fem.TriMesh`; segment markers 2 bottom, 3 right, 4 top, 5 left, 6 and 7
        the interfaces.
    """
    theta = check_heat_theta(theta)
    h = check_float(h, "h", low=HEAT_H_RANGE[0], low_inclusive=True, high=HEAT_H_RANGE[1])
    check_bool(refine, "refine")
    splines = interface_splines(theta, check=False)
    curves = [_interface_points(s, h) for s in splines]
    ends = [c[0, 1] for c in curves]
    side = np.concatenate([_even(0.0, ends[0], h)[:-1], _even(ends[0], ends[1], h)[:-1],
                           _even(ends[1], HEAT_SIZE, h)])  # heights 0..9 incl. s_j(0)
    row = _even(0.0, HEAT_SIZE, h)
    n_row, n_side = len(row), len(side)
    # Boundary loop, counter-clockwise: bottom, right side, top (right to left), left side.
    bottom = np.column_stack([row, np.zeros(n_row)])
    right = np.column_stack([np.full(n_side - 2, HEAT_SIZE), side[1:-1]])
    top = np.column_stack([row[::-1], np.full(n_row, HEAT_SIZE)])
    left = np.column_stack([np.zeros(n_side - 2), side[-2:0:-1]])
    loop = np.concatenate([bottom, right, top, left])
    n_loop = len(loop)
    markers = np.concatenate([np.full(n_row - 1, _BOTTOM), np.full(n_side - 1, _RIGHT),
                              np.full(n_row - 1, _TOP), np.full(n_side - 1, _LEFT)])
    segments = np.column_stack([np.arange(n_loop), (np.arange(n_loop) + 1) % n_loop])
    vertices, all_segments, all_markers = [loop], [segments], [markers]
    start = n_loop
    for j, curve in enumerate(curves):
        # The interface's end points are side vertices: the side list holds s_j(0).
        k_side = int(np.flatnonzero(side == ends[j])[0])
        first = n_row + k_side - 1  # on the right side
        last = n_loop - k_side  # on the left side
        inner = curve[1:-1]
        chain = np.concatenate([[last], start + np.arange(len(inner)), [first]])
        vertices.append(inner)
        all_segments.append(np.column_stack([chain[:-1], chain[1:]]))
        all_markers.append(np.full(len(chain) - 1, _INTERFACE + j))
        start += len(inner)
    mid = HEAT_SIZE / 2
    s1, s2 = (float(s(mid)) for s in splines)
    regions = np.array([[mid, s1 / 2, 0], [mid, (s1 + s2) / 2, 1],
                        [mid, (s2 + HEAT_SIZE) / 2, 2]])
    mesh = triangulate(np.concatenate(vertices), np.concatenate(all_segments), h=h,
                       segment_markers=np.concatenate(all_markers), regions=regions,
                       boundary_steiner=False)
    if refine:
        near = near_triangles(mesh, curves, HEAT_REFINE_DISTANCE)
        quarter = np.where(near, triangle_areas(mesh.points, mesh.triangles) / 4.0, 0.0)
        mesh, quarter = _cut_side_edges(mesh, quarter)
        mesh = refine_to_areas(mesh, quarter, boundary_steiner=False)
    return mesh


def _cut_side_edges(mesh: TriMesh, max_area: np.ndarray) -> tuple[TriMesh, np.ndarray]:
    """Cut each triangle that has a bound in ``max_area`` and an edge on a side at that edge's
    midpoint, and the twin edge's triangle on the other side too (so that every ``x = 9``
    vertex keeps its twin); each half takes its triangle's bound.

    Triangle under ``Y`` adds no point on the sides, and a flat triangle on one (an edge of
    ``≈ h`` with the opposite vertex close to it) has no interior point that would split it:
    it stayed whole, 7 of 1433 near triangles in 5 meshes at h = 0.5.  A half takes the bound
    of its parent, a quarter of the parent's area, so it is split once more."""
    points, triangles = mesh.points, mesh.triangles
    on_side = np.isin(mesh.segment_markers, (_LEFT, _RIGHT))
    side_segment = {frozenset(map(int, mesh.segments[i])): i for i in np.flatnonzero(on_side)}
    side_vertex = np.isin(points[:, 0], (0.0, HEAT_SIZE))
    heights = set()  # (lower, upper) y of the side edges to cut, on both sides
    owner: dict[frozenset[int], int] = {}  # side edge -> its (only) triangle
    for t in np.flatnonzero(side_vertex[triangles].sum(axis=1) >= 2).tolist():  # a side edge?
        tri = triangles[t]
        for k in range(3):
            edge = frozenset((int(tri[k]), int(tri[k - 1])))
            if edge in side_segment:
                owner[edge] = t
                if max_area[t] > 0:
                    heights.add(tuple(sorted(float(points[v, 1]) for v in edge)))
    if not heights:
        return mesh, max_area
    vertex = {(float(points[v, 0]), float(points[v, 1])): int(v)
              for v in np.flatnonzero(side_vertex)}
    triangles, segments = triangles.tolist(), mesh.segments.tolist()
    markers, bounds = mesh.segment_markers.tolist(), max_area.tolist()
    labels = None if mesh.labels is None else mesh.labels.tolist()
    new_points: list[tuple[float, float]] = []
    for lower, upper in sorted(heights):
        for x in (0.0, HEAT_SIZE):
            a, b = vertex[(x, lower)], vertex[(x, upper)]
            edge = frozenset((a, b))
            t, s = owner[edge], side_segment[edge]
            middle = len(points) + len(new_points)
            new_points.append((x, (lower + upper) / 2))
            tri = triangles[t]
            k = next(k for k in range(3) if {tri[k], tri[(k + 1) % 3]} == edge)
            p, q, opposite = tri[k], tri[(k + 1) % 3], tri[(k + 2) % 3]
            triangles[t] = [p, middle, opposite]  # counter-clockwise as the parent
            triangles.append([middle, q, opposite])
            bounds.append(bounds[t])
            if labels is not None:
                labels.append(labels[t])
            first, second = segments[s]
            segments[s] = [first, middle]
            segments.append([middle, second])
            markers.append(markers[s])
    cut = TriMesh(
        points=np.concatenate([points, np.array(new_points)]),
        triangles=np.array(triangles, dtype=np.int32),
        labels=None if labels is None else np.array(labels, dtype=np.int8),
        segments=np.array(segments, dtype=np.int32),
        segment_markers=np.array(markers, dtype=np.int32),
    )
    return cut, np.array(bounds)


@dataclass(frozen=True)
class HeatSolution:
    """A P2 solution of the heat problem.

    Attributes:
        temperature: ``(V,)`` ``T`` at the mesh vertices.
        dofs: ``(N,)`` all P2 DOF values (vertices first, then edge midpoints).
        basis: the skfem P2 basis of ``dofs``.
        reactions: ``(N,)`` the Dirichlet reactions ``b − A T`` (heat leaving through
            ``y = 0`` and ``y = 9``) at the prescribed DOFs, 0 elsewhere; they sum to ``∫Q``.
        source_integral: ``∫Q`` by the load vector's quadrature.
    """

    temperature: np.ndarray
    dofs: np.ndarray
    basis: object
    reactions: np.ndarray
    source_integral: float


def _boundary_field(value: float | Callable[[np.ndarray], np.ndarray], name: str
                    ) -> Callable[[np.ndarray], np.ndarray]:
    if callable(value):
        return value
    constant = check_float(value, name, low=-math.inf)
    return lambda x: np.full_like(x, constant)


def _per_label(values: Sequence[float], name: str, labels: np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (3,) or not np.isfinite(array).all():
        raise ValueError(f"{name}: expected 3 finite values (bottom, middle, top), got "
                         f"{values!r}")
    return array[labels]


def solve_heat(
    mesh: TriMesh,
    *,
    top: float | Callable[[np.ndarray], np.ndarray],
    bottom: float | Callable[[np.ndarray], np.ndarray] = 0.0,
    conductivity: Sequence[float] = HEAT_CONDUCTIVITY,
    source: Sequence[float] | Callable[[np.ndarray, np.ndarray], np.ndarray] = HEAT_SOURCE,
) -> HeatSolution:
    """Solve ``−∇·(k∇T) = Q`` on a :func:`heat_mesh`, periodic in ``x``, with P2 elements.

    Args:
        mesh: a labelled mesh of ``[0, 9]²`` whose sides ``x = 0`` and ``x = 9`` carry the same
            heights (as :func:`heat_mesh` makes).
        top, bottom: ``T`` at ``y = 9`` and ``y = 0``: a constant or a function of ``x`` (its
            values at ``x = 0`` and ``9`` must agree).
        conductivity: ``k`` of the subdomains labelled 0, 1, 2, each ``> 0``.
        source: ``Q`` of the subdomains, or a function ``Q(x, y)``.

    Returns:
        The :class:`HeatSolution`.
    """
    if not isinstance(mesh, TriMesh) or mesh.labels is None:
        raise TypeError("mesh: expected a labelled TriMesh (from heat_mesh)")
    if mesh.labels.min() < 0 or mesh.labels.max() > 2:
        raise ValueError("mesh: expected subdomain labels 0, 1, 2")
    k = _per_label(conductivity, "conductivity", mesh.labels)
    if not (k > 0).all():
        raise ValueError(f"conductivity: expected positive values, got {conductivity!r}")
    top_field, bottom_field = _boundary_field(top, "top"), _boundary_field(bottom, "bottom")
    fem_mesh = skfem_mesh(mesh)
    basis = p2_basis(fem_mesh)
    matrix = assemble_diffusion(basis, k)
    if callable(source):
        rhs = assemble_load(basis, source)
    else:
        rhs = assemble_load(basis, _per_label(source, "source", mesh.labels))
    x, y = basis.doflocs
    tol = 1e-12 * HEAT_SIZE
    low, high = np.abs(y) <= tol, np.abs(y - HEAT_SIZE) <= tol
    fixed = np.flatnonzero(low | high)
    values = np.where(high[fixed], top_field(x[fixed]), bottom_field(x[fixed]))
    left, right = np.flatnonzero(np.abs(x) <= tol), np.flatnonzero(np.abs(x - HEAT_SIZE) <= tol)
    left, right = left[np.argsort(y[left])], right[np.argsort(y[right])]
    if len(left) != len(right) or np.abs(y[left] - y[right]).max(initial=0) > tol:
        raise ValueError("mesh: the sides x = 0 and x = 9 must have the same vertex heights "
                         "(mesh it with heat_mesh)")
    u, reactions = solve_constrained(matrix, rhs, fixed, values, identify=(right, left))
    return HeatSolution(temperature=u[: len(mesh.points)], dofs=u, basis=basis,
                        reactions=reactions, source_integral=float(rhs.sum()))


def heat_sample(index: int, *, seed: int, h: float, refine: bool = False) -> dict:
    """Sample ``index`` of the heat set with ``seed``, meshed at size ``h`` (SPEC-gnot §3, §4.1).

    Args:
        index: the sample's index, ``>= 0``; its randomness is
            ``default_rng([seed, index, STREAM_HEAT])`` alone.
        seed: the set's seed, ``>= 0``.
        h: the mesh size, in ``[0.01, 1.5]`` (presets: ``generate.GNOT_PRESETS``).
        refine: the refined evaluation version (:func:`heat_mesh`).

    Returns:
        ``{"query": {"points" (V, 2), "weights" (V,), "label" (V,) int8}, "target" (V, 1),
        "target_names": ["T"], "inputs": {"top_temperature": {points (M, 2), values (M, 1),
        weights (M,)}, "interface_1"/"interface_2": {points, values None, weights}},
        "theta" (12,), "triangles" (T, 3) int32}``: float64 but for the labels and triangles;
        the lumped weights sum to 81, the curve weights to each curve's length.
    """
    index, seed = check_int(index, "index", 0), check_int(seed, "seed", 0)
    h = check_float(h, "h", low=HEAT_H_RANGE[0], low_inclusive=True, high=HEAT_H_RANGE[1])
    check_bool(refine, "refine")
    theta, coefficients = sample_heat_parameters(np.random.default_rng([seed, index,
                                                                         STREAM_HEAT]))
    mesh = heat_mesh(theta, h, refine=refine)
    solution = solve_heat(mesh, top=lambda x: top_temperature(x, coefficients))
    points = mesh.points

    def by_x(p: np.ndarray) -> np.ndarray:
        return p[:, 0]

    inputs: dict[str, dict] = {}
    vertex, _, weights = marked_curve(mesh, _TOP, by_x)
    inputs["top_temperature"] = {
        "points": points[vertex],
        "values": top_temperature(points[vertex, 0], coefficients)[:, None],
        "weights": weights,
    }
    for j in range(2):
        vertex, _, weights = marked_curve(mesh, _INTERFACE + j, by_x)
        inputs[HEAT_INPUTS[1 + j]] = {"points": points[vertex], "values": None,
                                      "weights": weights}
    return {
        "query": {
            "points": points,
            "weights": lumped_weights(points, mesh.triangles),
            # (cast: heat_mesh triangulates with regions, so every triangle has a label)
            "label": vertex_min_label(mesh.triangles, cast(np.ndarray, mesh.labels),
                                      len(points)),
        },
        "target": solution.temperature[:, None].copy(),
        "target_names": ["T"],
        "inputs": inputs,
        "theta": theta,
        "triangles": mesh.triangles,
    }
