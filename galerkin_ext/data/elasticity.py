"""Elasticity data set of the GNOT experiments (SPEC-gnot §4.2): a plate with a random cavity.

``Ω = (0, 1)²`` minus the cavity ``r ≤ r(φ)`` about ``(½, ½)``,

    r(φ) = 0.2 + 0.2 / (1 + exp r̃(φ)),
    r̃(φ) = Σ_{m=0..8} 2 (m² + 9)^(−½) (ξ_m cos mφ + η_m sin mφ),

``ξ, η ~ N(0, 1)`` (so ``0.2 < r < 0.4``).  Linear elasticity in plane strain, ``E = 1``,
``ν = 0.45``; ``u = 0`` at ``y = 0``, traction ``(0, 1)`` at ``y = 1``, the rest free.

Mesh (:func:`elasticity_mesh`): Triangle ``pq30a{√3h²/4}``, outer boundary points every
``≈ h``, cavity points every ``≈ h/2`` of arc length (finer near the cavity), hole point
``(½, ½)``.  Solve (:func:`solve_elasticity`): P2 vector elements
(``skfem.models.elasticity``), Dirichlet DOFs condensed, SuperLU.  The stress of each
triangle's (linear) P2 gradient at its corners is averaged over the incident triangles,
weighted by area, at every vertex; von Mises uses ``σ_zz = ν (σ_xx + σ_yy)``.

:func:`elasticity_sample` gives one stored sample (SPEC-gnot §3): the vertices with the
chosen targets among ``u``, ``v`` (displacements) and ``vm`` (von Mises), lumped weights;
the input ``mesh`` (the vertices, no values, lumped weights) and optionally ``cavity`` (the
cavity's boundary vertices, curve weights); optionally ``θ`` = ``r`` at 42 angles (as
Geo-FNO).  Sample ``i`` depends only on ``(seed, i)``: ``numpy.random.default_rng([seed, i,
STREAM_ELASTICITY])``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .._checks import check_bool, check_float, check_int
from .fem import (
    TriMesh,
    assemble_elasticity,
    assemble_load,
    assemble_traction,
    corner_gradients,
    lumped_weights,
    marked_curve,
    p2_basis,
    refine_near,
    skfem_mesh,
    solve_constrained,
    triangle_areas,
    triangulate,
    vertex_average,
)

__all__ = [
    "STREAM_ELASTICITY",
    "ELASTICITY_YOUNG",
    "ELASTICITY_POISSON",
    "ELASTICITY_TARGETS",
    "ELASTICITY_THETA_ANGLES",
    "ELASTICITY_REFINE_DISTANCE",
    "CAVITY_CENTER",
    "ElasticitySolution",
    "sample_cavity",
    "cavity_radius",
    "cavity_polygon",
    "elasticity_mesh",
    "solve_elasticity",
    "von_mises",
    "elasticity_sample",
]

#: Random stream of the elasticity samples; distinct from :mod:`.heat`'s and
#: :mod:`.random_fields`'.
STREAM_ELASTICITY = 7
ELASTICITY_YOUNG = 1.0
ELASTICITY_POISSON = 0.45
ELASTICITY_TARGETS = ("u", "v", "vm")
#: θ: the cavity radius at ``2πk/42``, ``k = 0..41`` (Geo-FNO's ``rr``).
ELASTICITY_THETA_ANGLES = 42
#: Refined evaluation sets: triangles within this distance of the cavity are split.
ELASTICITY_REFINE_DISTANCE = 0.1
ELASTICITY_H_RANGE = (0.005, 0.25)
CAVITY_CENTER = (0.5, 0.5)
CAVITY_MODES = 9  # m = 0..8

# Segment markers (Triangle reserves 0 and 1).
_BOTTOM, _RIGHT, _TOP, _LEFT, _CAVITY = 2, 3, 4, 5, 6

# Dirichlet, traction and body-force data of solve_elasticity.
Where = Callable[[np.ndarray, np.ndarray], np.ndarray]
Value = float | Callable[[np.ndarray, np.ndarray], np.ndarray]


def sample_cavity(rng: np.random.Generator) -> np.ndarray:
    """Draw one cavity: ``(2, 9)`` = ``(ξ_0..ξ_8, η_0..η_8)``, standard normal (``η_0``, which
    multiplies ``sin 0``, is drawn too, keeping the layout regular)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    return rng.standard_normal((2, CAVITY_MODES))


def _check_cavity(coefficients: object) -> np.ndarray:
    array = np.asarray(coefficients, dtype=np.float64)
    if array.shape != (2, CAVITY_MODES) or not np.isfinite(array).all():
        raise ValueError(f"coefficients: expected finite (ξ, η) of shape (2, {CAVITY_MODES}), "
                         f"got shape {array.shape}")
    return array


def cavity_radius(phi: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
    """``r(φ)`` of the cavity ``coefficients (2, 9)``; ``phi`` any shape, returns its shape."""
    coefficients = _check_cavity(coefficients)
    phi = np.asarray(phi, dtype=np.float64)
    m = np.arange(CAVITY_MODES, dtype=np.float64)
    amplitude = 2.0 / np.sqrt(m**2 + 9.0)
    wave = amplitude * (coefficients[0] * np.cos(m * phi[..., None])
                        + coefficients[1] * np.sin(m * phi[..., None]))
    return 0.2 + 0.2 / (1.0 + np.exp(wave.sum(axis=-1)))


def cavity_polygon(coefficients: np.ndarray, spacing: float) -> np.ndarray:
    """Points ``(K, 2)`` on the cavity's boundary, counter-clockwise from ``φ = 0``, equally
    spaced in arc length at ``≈ spacing`` (the loop closes from the last back to the first)."""
    spacing = check_float(spacing, "spacing")
    fine = np.linspace(0.0, 2.0 * np.pi, 64 * max(16, math.ceil(2.6 / spacing)) + 1)
    r = cavity_radius(fine, coefficients)
    x = CAVITY_CENTER[0] + r * np.cos(fine)
    y = CAVITY_CENTER[1] + r * np.sin(fine)
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(np.diff(x), np.diff(y)))])
    n = max(8, math.ceil(arc[-1] / spacing - 1e-9))
    phi = np.interp(arc[-1] * np.arange(n) / n, arc, fine)
    radius = cavity_radius(phi, coefficients)
    return np.column_stack([CAVITY_CENTER[0] + radius * np.cos(phi),
                            CAVITY_CENTER[1] + radius * np.sin(phi)])


def _square_loop(h: float) -> tuple[np.ndarray, np.ndarray]:
    """Boundary points of the unit square every ``≈ h``, counter-clockwise from the origin, and
    the marker of the segment leaving each."""
    n = max(1, math.ceil(1.0 / h - 1e-9))
    t = np.arange(n) / n
    zero, one = np.zeros(n), np.ones(n)
    loop = np.concatenate([np.column_stack([t, zero]), np.column_stack([one, t]),
                           np.column_stack([1.0 - t, one]), np.column_stack([zero, 1.0 - t])])
    return loop, np.repeat([_BOTTOM, _RIGHT, _TOP, _LEFT], n)


def _loop_segments(start: int, n: int) -> np.ndarray:
    i = start + np.arange(n)
    return np.column_stack([i, start + (np.arange(n) + 1) % n])


def elasticity_mesh(coefficients: np.ndarray | None, h: float, *, refine: bool = False
                    ) -> TriMesh:
    """The mesh of the unit square minus the cavity ``coefficients (2, 9)`` (``None``: no
    cavity), size ``h``.

    Triangle ``pq30a{√3h²/4}``; outer points every ``≈ h``, cavity points every ``≈ h/2``,
    hole point ``(½, ½)``.  ``refine``: then the triangles within
    :data:`ELASTICITY_REFINE_DISTANCE` of the cavity are split to about a quarter of their
    area (:func:`.fem.refine_near`).

    Returns:
        The :class:`.fem.TriMesh`; segment markers 2 bottom, 3 right, 4 top, 5 left, 6 cavity.
    """
    h = check_float(h, "h", low=ELASTICITY_H_RANGE[0], low_inclusive=True,
                    high=ELASTICITY_H_RANGE[1])
    check_bool(refine, "refine")
    loop, markers = _square_loop(h)
    vertices, segments = [loop], [_loop_segments(0, len(loop))]
    holes = None
    cavity = None
    if coefficients is not None:
        cavity = cavity_polygon(_check_cavity(coefficients), h / 2)
        vertices.append(cavity)
        segments.append(_loop_segments(len(loop), len(cavity)))
        markers = np.concatenate([markers, np.full(len(cavity), _CAVITY)])
        holes = np.array([CAVITY_CENTER])
    elif refine:
        raise ValueError("refine: there is no cavity to refine near (coefficients is None)")
    mesh = triangulate(np.concatenate(vertices), np.concatenate(segments), h=h,
                       segment_markers=markers, holes=holes)
    if refine and cavity is not None:
        mesh = refine_near(mesh, [np.concatenate([cavity, cavity[:1]])],
                           ELASTICITY_REFINE_DISTANCE)
    return mesh


@dataclass(frozen=True)
class ElasticitySolution:
    """A P2 solution of plane-strain linear elasticity.

    Attributes:
        displacement: ``(V, 2)`` ``(u, v)`` at the vertices.
        stress: ``(V, 3)`` ``(σ_xx, σ_yy, σ_xy)`` at the vertices (area-weighted mean of the
            incident triangles' stress there).
        von_mises: ``(V,)`` of ``stress`` with ``σ_zz = ν (σ_xx + σ_yy)``.
        dofs: ``(N,)`` the P2 DOF values (``x`` and ``y`` interleaved per node).
        basis: the skfem vector basis of ``dofs``.
    """

    displacement: np.ndarray
    stress: np.ndarray
    von_mises: np.ndarray
    dofs: np.ndarray
    basis: object


def von_mises(stress: np.ndarray, poisson: float = ELASTICITY_POISSON) -> np.ndarray:
    """Plane-strain von Mises stress of ``stress (..., 3)`` = ``(σ_xx, σ_yy, σ_xy)``:
    ``sqrt(½((σ_xx−σ_yy)² + (σ_yy−σ_zz)² + (σ_zz−σ_xx)²) + 3σ_xy²)``, ``σ_zz = ν(σ_xx+σ_yy)``."""
    stress = np.asarray(stress, dtype=np.float64)
    if stress.shape[-1:] != (3,):
        raise ValueError(f"stress: expected shape (..., 3), got {stress.shape}")
    poisson = check_float(poisson, "poisson", low=-1.0, high=0.5)
    sxx, syy, sxy = stress[..., 0], stress[..., 1], stress[..., 2]
    szz = poisson * (sxx + syy)
    return np.sqrt(0.5 * ((sxx - syy) ** 2 + (syy - szz) ** 2 + (szz - sxx) ** 2)
                   + 3.0 * sxy**2)


def _field(value: Value, name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    if callable(value):
        return value
    constant = check_float(value, name, low=-math.inf)
    return lambda x, y: np.full_like(x, constant)


def _check_no_rigid_motion(fixed: np.ndarray, components: Sequence[np.ndarray],
                           x: np.ndarray, y: np.ndarray) -> None:
    """The fixed DOFs pin the plane's rigid motions (x and y translation, rotation): else a
    combination of them changes no fixed DOF, the condensed stiffness is singular and SuperLU
    returns an arbitrary one of the solutions without an error."""
    if fixed.size == 0:
        raise ValueError("dirichlet: no DOF is fixed; the problem would be singular")
    is_y = np.isin(fixed, components[1])
    # each fixed DOF's value under the unit rigid motions (1, 0), (0, 1) and the rotation
    # (-y, x) about the fixed DOFs' centroid, in units of the mesh's size: a rank test that a
    # shift or scale of the domain does not change (about the origin, a 1 mm part at x = 1000
    # had its rotation column 1e6 times the others)
    size = max(np.ptp(x), np.ptp(y))
    dx, dy = (x[fixed] - x[fixed].mean()) / size, (y[fixed] - y[fixed].mean()) / size
    motions = np.column_stack([~is_y, is_y, np.where(is_y, dx, -dy)]).astype(float)
    if np.linalg.matrix_rank(motions, tol=1e-9) < 3:
        raise ValueError("dirichlet: the fixed DOFs leave a rigid motion free (a translation or "
                         "rotation moves none of them), so the displacement is not determined; "
                         "fix both components at one point and one more at another")


def solve_elasticity(
    mesh: TriMesh,
    *,
    dirichlet: Sequence[tuple[Where, int | None, Value]],
    traction: Sequence[tuple[Where, Sequence[float]]] = (),
    body_force: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
    young: float = ELASTICITY_YOUNG,
    poisson: float = ELASTICITY_POISSON,
) -> ElasticitySolution:
    """Solve plane-strain linear elasticity on ``mesh`` with P2 vector elements.

    Args:
        mesh: the mesh.
        dirichlet: ``(where, component, value)`` triples: the displacement component (0 ``x``,
            1 ``y``, ``None`` both) is ``value`` (constant or ``value(x, y)``) at the DOFs whose
            location satisfies ``where(x, y)`` (arrays in, bool array out).
        traction: ``(where, (t_x, t_y))`` pairs: the traction on the boundary facets whose
            midpoints satisfy ``where``.
        body_force: ``f(x, y) -> (f_x, f_y)``, or ``None``.
        young, poisson: ``E > 0``, ``-1 < ν < ½``.

    Returns:
        The :class:`ElasticitySolution`.
    """
    if not isinstance(mesh, TriMesh):
        raise TypeError(f"mesh: expected a TriMesh, got {type(mesh).__name__}")
    if isinstance(dirichlet, tuple) and dirichlet and callable(dirichlet[0]):
        raise TypeError("dirichlet: expected a sequence of (where, component, value) triples")
    fem_mesh = skfem_mesh(mesh)
    basis = p2_basis(fem_mesh, vector=True)
    matrix = assemble_elasticity(basis, young, poisson)
    rhs = np.zeros(basis.N)
    if body_force is not None:
        rhs += assemble_load(basis, body_force)
        if not np.isfinite(rhs).all():
            raise ValueError("body_force: f(x, y) gave NaN or inf")
    item: object  # (both loops check the items they are given)
    for i, item in enumerate(traction):
        if not (isinstance(item, tuple) and len(item) == 2 and callable(item[0])):
            raise TypeError(f"traction[{i}]: expected a (where, (t_x, t_y)) pair")
        where = item[0]
        # (ignore: mypy infers no lambda with a default argument against a Callable)
        rhs += assemble_traction(basis, lambda x, w=where: w(x[0], x[1]),  # type: ignore[misc]
                                 item[1])
    components = basis.split_indices()
    x, y = basis.doflocs
    prescribed: dict[int, tuple[int, float]] = {}  # DOF: (the triple that fixed it, value)
    for i, item in enumerate(dirichlet):
        if not (isinstance(item, tuple) and len(item) == 3 and callable(item[0])):
            raise TypeError(f"dirichlet[{i}]: expected a (where, component, value) triple")
        where, component, value = item
        if component not in (0, 1, None):
            raise ValueError(f"dirichlet[{i}]: component must be 0, 1 or None, got "
                             f"{component!r}")
        field = _field(value, f"dirichlet[{i}] value")
        for c in (0, 1) if component is None else (component,):
            dofs = components[c]
            chosen = dofs[np.asarray(where(x[dofs], y[dofs]), dtype=bool)]
            given = np.broadcast_to(np.asarray(field(x[chosen], y[chosen]), dtype=np.float64),
                                    chosen.shape)
            if not np.isfinite(given).all():
                raise ValueError(f"dirichlet[{i}]: its value gave NaN or inf")
            for dof, now in zip(chosen.tolist(), given.tolist(), strict=True):
                j, before = prescribed.setdefault(dof, (i, now))
                if not np.isclose(before, now, rtol=1e-9, atol=1e-12):
                    raise ValueError(f"dirichlet[{j}] and dirichlet[{i}]: they fix DOF {dof} "
                                     f"at ({x[dof]:g}, {y[dof]:g}) to {before} and {now}")
    fixed_dofs = np.fromiter(prescribed, dtype=np.int64)
    _check_no_rigid_motion(fixed_dofs, components, x, y)
    u, _ = solve_constrained(matrix, rhs, fixed_dofs,
                             np.array([fixed for _, fixed in prescribed.values()]))
    n_vertices = len(mesh.points)
    nodal = basis.nodal_dofs  # (2, V): the vertex DOFs of x and y
    displacement = np.column_stack([u[nodal[0]], u[nodal[1]]])
    # Stress of each triangle's P2 field at its corners (linear inside the triangle).
    grad = corner_gradients(fem_mesh, basis.elem, u)  # (T, 3, 2, 2)
    strain = 0.5 * (grad + np.swapaxes(grad, -1, -2))
    lam = young * poisson / ((1.0 + poisson) * (1.0 - 2.0 * poisson))
    mu = young / (2.0 * (1.0 + poisson))
    trace = strain[..., 0, 0] + strain[..., 1, 1]
    corner_stress = np.stack([lam * trace + 2 * mu * strain[..., 0, 0],
                              lam * trace + 2 * mu * strain[..., 1, 1],
                              2 * mu * strain[..., 0, 1]], axis=-1)  # (T, 3, 3)
    t = fem_mesh.t.T  # skfem's corner order, which corner_gradients follows
    stress = vertex_average(t, corner_stress, triangle_areas(mesh.points, t), n_vertices)
    return ElasticitySolution(displacement=displacement, stress=stress,
                              von_mises=von_mises(stress, poisson), dofs=u, basis=basis)


def _check_targets(targets: object) -> tuple[str, ...]:
    message = (f"targets: expected a non-empty sequence of distinct names from "
               f"{list(ELASTICITY_TARGETS)}, e.g. ('vm',), got {targets!r}")
    if isinstance(targets, str) or not isinstance(targets, Sequence) or not targets:
        raise ValueError(message)
    if any(t not in ELASTICITY_TARGETS for t in targets) or len(set(targets)) != len(targets):
        raise ValueError(message)
    return tuple(targets)


def elasticity_sample(
    index: int,
    *,
    seed: int,
    h: float,
    targets: Sequence[str] = ("vm",),
    refine: bool = False,
    with_cavity: bool = False,
    with_theta: bool = False,
) -> dict:
    """Sample ``index`` of the elasticity set with ``seed``, meshed at size ``h``
    (SPEC-gnot §3, §4.2).

    Args:
        index: the sample's index, ``>= 0``; its randomness is
            ``default_rng([seed, index, STREAM_ELASTICITY])`` alone.
        seed: the set's seed, ``>= 0``.
        h: the mesh size, in ``[0.005, 0.25]`` (presets: ``generate.GNOT_PRESETS``).
        targets: names from ``("u", "v", "vm")``, in the order of the target's columns.
        refine: the refined evaluation version (:func:`elasticity_mesh`).
        with_cavity: add the input ``cavity`` (its boundary vertices, curve weights).
        with_theta: ``θ`` = ``r`` at the 42 angles ``2πk/42`` (else ``None``).

    Returns:
        ``{"query": {"points" (V, 2), "weights" (V,), "label": None}, "target" (V, o),
        "target_names", "inputs": {"mesh": {points (V, 2), values None, weights (V,)}[,
        "cavity": {points (M, 2), values None, weights (M,)}]}, "theta" (42,) or None,
        "triangles" (T, 3) int32}``: float64 but the triangles; the lumped weights sum to the
        area ``1 − |cavity polygon|``.
    """
    index, seed = check_int(index, "index", 0), check_int(seed, "seed", 0)
    h = check_float(h, "h", low=ELASTICITY_H_RANGE[0], low_inclusive=True,
                    high=ELASTICITY_H_RANGE[1])
    targets = _check_targets(targets)
    for name, flag in (("refine", refine), ("with_cavity", with_cavity),
                       ("with_theta", with_theta)):
        check_bool(flag, name)
    coefficients = sample_cavity(np.random.default_rng([seed, index, STREAM_ELASTICITY]))
    mesh = elasticity_mesh(coefficients, h, refine=refine)
    solution = solve_elasticity(
        mesh,
        dirichlet=[(lambda x, y: np.abs(y) <= 1e-12, None, 0.0)],
        traction=[(lambda x, y: np.abs(y - 1.0) <= 1e-12, (0.0, 1.0))],
    )
    columns = {"u": solution.displacement[:, 0], "v": solution.displacement[:, 1],
               "vm": solution.von_mises}
    points = mesh.points
    weights = lumped_weights(points, mesh.triangles)
    # Copies: the input and the queries are separate stored fields.
    inputs: dict[str, dict] = {
        "mesh": {"points": points.copy(), "values": None, "weights": weights.copy()}}
    if with_cavity:
        vertex, _, curve = marked_curve(mesh, _CAVITY, _angle)
        inputs["cavity"] = {"points": points[vertex], "values": None, "weights": curve}
    theta = None
    if with_theta:
        phi = 2.0 * np.pi * np.arange(ELASTICITY_THETA_ANGLES) / ELASTICITY_THETA_ANGLES
        theta = cavity_radius(phi, coefficients)
    return {
        "query": {"points": points, "weights": weights, "label": None},
        "target": np.column_stack([columns[t] for t in targets]),
        "target_names": list(targets),
        "inputs": inputs,
        "theta": theta,
        "triangles": mesh.triangles,
    }


def _angle(points: np.ndarray) -> np.ndarray:
    """Angle in ``[0, 2π)`` about the cavity's centre (the order of its boundary points)."""
    return np.mod(np.arctan2(points[:, 1] - CAVITY_CENTER[1], points[:, 0] - CAVITY_CENTER[0]),
                  2.0 * np.pi)
