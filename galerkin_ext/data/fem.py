"""Finite-element helpers of the GNOT data sets (SPEC-gnot §4): meshes, P2 assembly, solves.

* Meshes (Shewchuk's Triangle, the ``triangle`` package, an optional extra
  ``galerkin_ext[fem]``): :func:`triangulate` meshes a planar straight-line graph -- boundary
  and internal segments with markers, holes, labelled regions -- with the switches
  ``pq30a{√3h²/4}`` (angles >= 30°, no triangle larger than the equilateral one of side ``h``),
  plus ``Y`` to keep the boundary points as given (periodic sides) and ``A`` for region labels;
  :func:`refine_near` splits the triangles within a distance of some curves
  (:func:`near_triangles`) to about a quarter of their area (Triangle's ``r`` mode,
  :func:`refine_to_areas`), for the refined evaluation sets.  :class:`TriMesh` holds the
  result.
* Vertex quantities: :func:`lumped_weights` (``quadrature.mesh_weights``), :func:`marked_curve`
  (the vertices and segments of a marked curve, with ``quadrature.curve_weights``),
  :func:`vertex_average` (area-weighted mean of element values at the vertices),
  :func:`vertex_min_label`.
* P2 elements on scikit-fem: :func:`p2_basis`, :func:`assemble_diffusion`, :func:`assemble_load`,
  :func:`assemble_elasticity` (plane strain), :func:`assemble_traction`, :func:`corner_gradients`
  (the gradient of each element's polynomial at its corners), :func:`solve_constrained`
  (Dirichlet condensation, identified DOFs for periodicity, SuperLU) and :func:`error_norms`
  (L² and H¹-seminorm errors against an exact solution).

Everything is float64 NumPy; vertex indices are int32 as stored (SPEC-gnot §3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from .._checks import check_bool, check_float, check_int
from ..quadrature import curve_weights, mesh_weights

__all__ = [
    "TriMesh",
    "equilateral_area",
    "triangulate",
    "refine_near",
    "near_triangles",
    "refine_to_areas",
    "distance_to_polyline",
    "triangle_areas",
    "lumped_weights",
    "marked_curve",
    "vertex_average",
    "vertex_min_label",
    "skfem_mesh",
    "p2_basis",
    "assemble_diffusion",
    "assemble_load",
    "assemble_elasticity",
    "assemble_traction",
    "corner_gradients",
    "solve_constrained",
    "error_norms",
]

Field = Callable[[np.ndarray, np.ndarray], np.ndarray]
VectorField = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class TriMesh:
    """A triangle mesh with its constrained segments.

    Attributes:
        points: ``(V, 2)`` float64 vertex coordinates; every vertex is in some triangle.
        triangles: ``(T, 3)`` int32 vertex indices, counter-clockwise.
        labels: ``(T,)`` int8 region label of each triangle, or ``None`` (no regions given).
        segments: ``(S, 2)`` int32 the constrained edges (pieces of the input segments).
        segment_markers: ``(S,)`` int32 the marker of the input segment each one lies on.
    """

    points: np.ndarray
    triangles: np.ndarray
    labels: np.ndarray | None
    segments: np.ndarray
    segment_markers: np.ndarray


def equilateral_area(h: float) -> float:
    """``√3 h² / 4``, the area of the equilateral triangle of side ``h`` (Triangle's ``a``)."""
    h = check_float(h, "h")
    return math.sqrt(3.0) * h * h / 4.0


def _float_array(value: object, name: str, shape: str, columns: int) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2 or array.shape[1] != columns or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise ValueError(f"{name}: expected a real array of shape {shape}, got "
                         f"{array.dtype} {array.shape}")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: expected finite values")
    return array


def _index_array(value: object, name: str, shape: str, columns: int, bound: int) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != 2 or array.shape[1] != columns or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name}: expected an integer array of shape {shape}, got "
                         f"{array.dtype} {array.shape}")
    if array.size and (array.min() < 0 or array.max() >= bound):
        raise ValueError(f"{name}: expected vertex indices in [0, {bound})")
    return array.astype(np.int32)


def _switch_number(value: float) -> str:
    """A number for a Triangle switch: positional, shortest round-trip digits (no exponent)."""
    return np.format_float_positional(value, unique=True, trim="-")


def _from_triangle(out: dict, labelled: bool) -> TriMesh:
    """Triangle's output as a :class:`TriMesh`, dropping vertices in no triangle."""
    points = np.asarray(out["vertices"], dtype=np.float64)
    triangles = np.asarray(out["triangles"], dtype=np.int64)
    used = np.zeros(len(points), dtype=bool)
    used[triangles.ravel()] = True
    # Triangle keeps input vertices that a hole ate; they would be isolated query points.
    renumber = np.cumsum(used) - 1
    segments = np.asarray(out.get("segments", np.zeros((0, 2))), dtype=np.int64)
    markers = np.asarray(out.get("segment_markers", np.zeros((len(segments), 1))),
                         dtype=np.int64).reshape(-1)
    keep = used[segments].all(axis=1) if len(segments) else np.zeros(0, dtype=bool)
    labels = None
    if labelled:
        labels = np.rint(np.asarray(out["triangle_attributes"]).reshape(-1)).astype(np.int8)
    return TriMesh(
        points=np.ascontiguousarray(points[used]),
        triangles=renumber[triangles].astype(np.int32),
        labels=labels,
        segments=renumber[segments[keep]].astype(np.int32).reshape(-1, 2),
        segment_markers=markers[keep].astype(np.int32),
    )


def _triangle_module():
    try:
        import triangle
    except ImportError as error:  # an optional extra: its licence restricts commercial use
        raise ImportError("the GNOT data sets need Shewchuk's Triangle: pip install "
                          "'galerkin_ext[fem]' (or pip install triangle)") from error
    return triangle


def triangulate(
    vertices: np.ndarray,
    segments: np.ndarray,
    *,
    h: float,
    segment_markers: np.ndarray | None = None,
    holes: np.ndarray | None = None,
    regions: np.ndarray | None = None,
    boundary_steiner: bool = True,
    min_angle: float = 30.0,
) -> TriMesh:
    """Quality mesh of a planar straight-line graph (Triangle ``pq{min_angle}a{√3h²/4}``).

    Args:
        vertices: ``(P, 2)`` the graph's points (all kept as mesh vertices).
        segments: ``(S, 2)`` point indices of the edges to keep: the boundary, internal
            interfaces, hole boundaries.  Triangle may split them (not the boundary ones when
            ``boundary_steiner`` is False).
        h: mesh size; no triangle is larger than the equilateral triangle of side ``h``.
        segment_markers: ``(S,)`` ints ``>= 2`` (Triangle uses 0 and 1 itself), carried to the
            pieces of each segment; default 2 for all.
        holes: ``(H, 2)`` a point inside each hole (enclosed by segments).
        regions: ``(R, 3)`` rows ``(x, y, label)``: every triangle of the region around the
            point gets the label (switch ``A``); labels are small ints ``0..127``.
        boundary_steiner: False adds ``Y``: no points are added on the boundary segments, so
            the boundary vertices are exactly the given ones (matching periodic sides).
        min_angle: smallest angle in degrees (Triangle guarantees up to about 33.8).

    Returns:
        The :class:`TriMesh`; ``labels`` is ``None`` without ``regions``.
    """
    vertices = _float_array(vertices, "vertices", "(P, 2)", 2)
    # (Triangle itself crashes the process on repeated vertices, e.g. a polygon closed by
    # repeating its first point, and on vertices that are all one point)
    _, first, count = np.unique(vertices, axis=0, return_index=True, return_counts=True)
    if (count > 1).any():
        repeated = np.sort(first[count > 1])
        raise ValueError(f"vertices: expected distinct points, but the points of rows "
                         f"{repeated[:5].tolist()} appear more than once (e.g. "
                         f"{vertices[repeated[0]].tolist()})")
    if len(vertices) < 3 or np.linalg.matrix_rank(vertices - vertices.mean(axis=0)) < 2:
        raise ValueError(f"vertices: expected at least 3 points not all on one line, got "
                         f"{len(vertices)} points spanning no area")
    segments = _index_array(segments, "segments", "(S, 2)", 2, len(vertices))
    h = check_float(h, "h")
    min_angle = check_float(min_angle, "min_angle", high=34.0)
    if segment_markers is None:
        segment_markers = np.full(len(segments), 2, dtype=np.int32)
    segment_markers = np.asarray(segment_markers)
    if segment_markers.shape != (len(segments),) or not np.issubdtype(
        segment_markers.dtype, np.integer
    ) or (segment_markers.size and segment_markers.min() < 2):
        raise ValueError(f"segment_markers: expected {len(segments)} ints >= 2 (one per "
                         f"segment), got {segment_markers.dtype} {segment_markers.shape}")
    check_bool(boundary_steiner, "boundary_steiner")
    graph: dict[str, np.ndarray] = {
        "vertices": vertices,
        "segments": segments,
        "segment_markers": segment_markers.astype(np.int32).reshape(-1, 1),
    }
    if holes is not None and len(holes):
        graph["holes"] = _float_array(holes, "holes", "(H, 2)", 2)
    switches = f"pq{_switch_number(min_angle)}a{_switch_number(equilateral_area(h))}"
    if not boundary_steiner:
        switches += "Y"
    if regions is not None:
        regions = _float_array(regions, "regions", "(R, 3)", 3)
        if not np.array_equal(regions[:, 2], np.rint(regions[:, 2])) or (
            regions[:, 2].min(initial=0) < 0 or regions[:, 2].max(initial=0) > 127
        ):
            raise ValueError("regions: expected integer labels in [0, 127] in column 2")
        # Triangle's fourth column is a per-region area bound, unused with a global 'a'.
        graph["regions"] = np.column_stack([regions, np.zeros(len(regions))])
        switches += "A"
    out = _triangle_module().triangulate(graph, switches)
    if "triangles" not in out or len(out["triangles"]) == 0:
        raise ValueError("vertices, segments: Triangle produced no triangles (is every hole "
                         "enclosed by segments, and the domain non-empty?)")
    return _from_triangle(out, regions is not None)


def distance_to_polyline(points: np.ndarray, polyline: np.ndarray) -> np.ndarray:
    """Euclidean distance from each point to the polyline through ``polyline``'s rows in order.

    Args:
        points: ``(P, 2)``.
        polyline: ``(K, 2)``, ``K >= 1`` (repeat the first row at the end to close a loop).

    Returns:
        ``(P,)`` distances.
    """
    points = _float_array(points, "points", "(P, 2)", 2)
    polyline = _float_array(polyline, "polyline", "(K, 2)", 2)
    if len(polyline) == 0:
        raise ValueError("polyline: expected at least one point")
    if len(polyline) == 1:
        return np.linalg.norm(points - polyline[0], axis=1)
    start, edge = polyline[:-1], np.diff(polyline, axis=0)  # (K-1, 2)
    length2 = np.maximum((edge**2).sum(axis=1), np.finfo(np.float64).tiny)
    best = np.full(len(points), np.inf)
    # Blocks of points bound the (P, K) temporaries on fine meshes.
    for lo in range(0, len(points), 4096):
        rel = points[lo : lo + 4096, None, :] - start[None]  # (p, K-1, 2)
        t = np.clip((rel * edge).sum(axis=2) / length2, 0.0, 1.0)
        gap = rel - t[..., None] * edge
        best[lo : lo + 4096] = np.sqrt((gap**2).sum(axis=2).min(axis=1))
    return best


def _check_mesh(mesh: object) -> TriMesh:
    if not isinstance(mesh, TriMesh):
        raise TypeError(f"mesh: expected a TriMesh, got {type(mesh).__name__}")
    return mesh


#: Triangle runs of :func:`refine_to_areas`: the first, then again on the bounded triangles
#: it left whole (of 340 heat meshes at h = 1, 0.8 and 0.5, 3 needed a second, none a third).
_REFINE_PASSES = 3


def refine_near(
    mesh: TriMesh,
    curves: Sequence[np.ndarray],
    distance: float,
    *,
    boundary_steiner: bool = True,
    min_angle: float = 30.0,
) -> TriMesh:
    """Split the triangles within ``distance`` of the curves (:func:`near_triangles`) to about
    a quarter of their area: :func:`refine_to_areas` with the bound ``area / 4`` on those and
    none on the rest.

    Args:
        mesh: the mesh to refine.
        curves: polylines ``(K_c, 2)`` (close a loop by repeating its first point).
        distance: the distance, ``> 0``.
        boundary_steiner, min_angle: as in :func:`refine_to_areas` (``False``: ``Y``, the
            boundary vertices kept as in :func:`triangulate`).

    Returns:
        The refined :class:`TriMesh`.
    """
    near = near_triangles(mesh, curves, distance)
    bound = np.where(near, triangle_areas(mesh.points, mesh.triangles) / 4.0, 0.0)
    return refine_to_areas(mesh, bound, boundary_steiner=boundary_steiner, min_angle=min_angle)


def near_triangles(mesh: TriMesh, curves: Sequence[np.ndarray], distance: float) -> np.ndarray:
    """The triangles whose centroid is within ``distance`` of a curve.

    Args:
        mesh: the mesh.
        curves: polylines ``(K_c, 2)`` (close a loop by repeating its first point).
        distance: the distance, ``> 0``.

    Returns:
        ``(T,)`` bool, one per triangle of ``mesh``.
    """
    mesh = _check_mesh(mesh)
    distance = check_float(distance, "distance")
    if isinstance(curves, (np.ndarray, str)) or not isinstance(curves, Sequence) or not curves:
        raise TypeError("curves: expected a non-empty sequence of (K, 2) polylines")
    checked = []
    for i, curve in enumerate(curves):
        checked.append(_float_array(curve, f"curves[{i}]", "(K, 2)", 2))
        if not len(checked[-1]):
            raise ValueError(f"curves[{i}]: expected at least one point")
    centroids = mesh.points[mesh.triangles].mean(axis=1)
    near = np.zeros(len(mesh.triangles), dtype=bool)
    for curve in checked:
        near |= distance_to_polyline(centroids, curve) <= distance
    return near


def refine_to_areas(
    mesh: TriMesh,
    max_area: np.ndarray,
    *,
    boundary_steiner: bool = True,
    min_angle: float = 30.0,
) -> TriMesh:
    """Refine ``mesh`` with a bound on the area of each triangle's pieces (Triangle's ``r``
    mode), keeping the segments, markers and labels and the quality bound ``min_angle``.

    Triangle passes a triangle's bound to the pieces it splits it into; its edge flips then
    move some pieces across that triangle's edges, so a piece may exceed its bound, and a
    bounded triangle may even come out whole: such a triangle is refined again with its bound,
    up to :data:`_REFINE_PASSES` passes in all.

    Args:
        mesh: the mesh to refine.
        max_area: ``(T,)``, one bound per triangle; ``0`` for none.
        boundary_steiner: False adds ``Y``: no points on the boundary segments, so a triangle
            with a boundary edge that only a point on that edge would split stays whole.
        min_angle: smallest angle in degrees, as in :func:`triangulate`.

    Returns:
        The refined :class:`TriMesh`; the input vertices come first, in order.
    """
    mesh = _check_mesh(mesh)
    bound = np.asarray(max_area)
    if (bound.shape != (len(mesh.triangles),) or not np.issubdtype(bound.dtype, np.floating)
            or not (np.isfinite(bound) & (bound >= 0)).all()):
        raise ValueError(f"max_area: expected {len(mesh.triangles)} finite floats >= 0, one per "
                         f"triangle, got {bound.dtype} {bound.shape}")
    check_bool(boundary_steiner, "boundary_steiner")
    min_angle = check_float(min_angle, "min_angle", high=34.0)
    switches = f"rpq{_switch_number(min_angle)}a"
    if not boundary_steiner:
        switches += "Y"
    if mesh.labels is not None:
        switches += "A"
    for _ in range(_REFINE_PASSES):
        data: dict[str, np.ndarray] = {
            "vertices": mesh.points,
            "triangles": mesh.triangles,
            "segments": mesh.segments,
            "segment_markers": mesh.segment_markers.reshape(-1, 1),
            "triangle_max_area": np.where(bound > 0, bound, -1.0),  # Triangle: <= 0 is none
        }
        if mesh.labels is not None:
            data["triangle_attributes"] = mesh.labels.astype(np.float64).reshape(-1, 1)
        refined = _from_triangle(_triangle_module().triangulate(data, switches),
                                 mesh.labels is not None)
        # the bounded triangles that came out whole: the input vertices keep their numbers
        bounded = {tuple(t): b for t, b in zip(np.sort(mesh.triangles, axis=1).tolist(),
                                               bound.tolist(), strict=True) if b > 0}
        bound = np.array([bounded.get(tuple(t), 0.0)
                          for t in np.sort(refined.triangles, axis=1).tolist()])
        mesh = refined
        if not bound.any():
            break
    return mesh


def _check_triangles(triangles: object, n_vertices: int) -> np.ndarray:
    """``triangles`` as an integer array ``(T, 3)`` of indices in ``[0, n_vertices)`` (numpy
    would wrap a negative one round to another vertex)."""
    t = np.asarray(triangles)
    if t.ndim != 2 or t.shape[1] != 3 or t.dtype.kind not in "iu":
        raise ValueError(f"triangles: expected an integer array (T, 3), got {t.dtype} "
                         f"{t.shape}")
    if t.size and (t.min() < 0 or t.max() >= n_vertices):
        raise ValueError(f"triangles: expected vertex indices in [0, {n_vertices}), got "
                         f"{t.min()} to {t.max()}")
    return t


def triangle_areas(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Unsigned areas ``(T,)`` of the triangles ``(T, 3)`` of ``points (V, 2)``."""
    points = np.asarray(points)
    if points.ndim != 2 or points.shape[1] != 2 or points.dtype.kind != "f":
        raise ValueError(f"points: expected a floating-point array (V, 2), got {points.dtype} "
                         f"{points.shape}")
    triangles = _check_triangles(triangles, len(points))
    a, b, c = (points[triangles[:, k]] for k in range(3))
    return 0.5 * np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1])
                        - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0]))


def lumped_weights(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Lumped vertex weights ``(V,)`` (each triangle's area split among its corners), by
    :func:`galerkin_ext.quadrature.mesh_weights`; they sum to the mesh's area."""
    return mesh_weights(torch.from_numpy(np.asarray(points, dtype=np.float64)),
                        torch.from_numpy(np.asarray(triangles, dtype=np.int64))).numpy()


def marked_curve(
    mesh: TriMesh, marker: int, key: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vertices and segments of the mesh on the segments marked ``marker``.

    Args:
        mesh: the mesh.
        marker: the segment marker.
        key: maps the curve's points ``(M, 2)`` to ``(M,)`` sort keys (e.g. ``x`` along a
            graph, the angle about a centre around a loop): the order of the returned points.

    Returns:
        ``vertex (M,)`` int64 mesh indices of the curve's points in ``key`` order,
        ``segments (S, 2)`` int64 indices into ``vertex``, and ``weights (M,)`` their
        :func:`galerkin_ext.quadrature.curve_weights` (summing to the curve's length).
    """
    mesh = _check_mesh(mesh)
    marker = check_int(marker, "marker", 0)
    pieces = mesh.segments[mesh.segment_markers == marker].astype(np.int64)
    if len(pieces) == 0:
        raise ValueError(f"marker: no segment of the mesh has marker {marker}")
    vertex = np.unique(pieces)
    vertex = vertex[np.argsort(key(mesh.points[vertex]), kind="stable")]
    local = np.empty(len(mesh.points), dtype=np.int64)
    local[vertex] = np.arange(len(vertex))
    segments = local[pieces]
    weights = curve_weights(torch.from_numpy(mesh.points[vertex]),
                            torch.from_numpy(segments)).numpy()
    return vertex, segments, weights


def vertex_average(
    triangles: np.ndarray, values: np.ndarray, areas: np.ndarray, n_vertices: int
) -> np.ndarray:
    """Area-weighted mean at each vertex of the incident triangles' values there.

    Args:
        triangles: ``(T, 3)`` vertex indices.
        values: ``(T, 3, ...)`` each triangle's value at each of its corners (repeat an element
            constant along axis 1).
        areas: ``(T,)`` triangle areas.
        n_vertices: ``V``; every vertex must be in some triangle.

    Returns:
        ``(V, ...)`` float64.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.shape[:2] != triangles.shape or areas.shape != (len(triangles),):
        raise ValueError(f"values: expected shape (T, 3, ...) = ({len(triangles)}, 3, ...) and "
                         f"areas (T,), got {values.shape} and {areas.shape}")
    rest = values.shape[2:]
    weighted = (values * areas.reshape(-1, 1, *([1] * len(rest)))).reshape(-1, *rest)
    total = np.zeros((n_vertices, *rest))
    np.add.at(total, triangles.reshape(-1), weighted)
    mass = np.bincount(triangles.reshape(-1), weights=np.repeat(areas, 3), minlength=n_vertices)
    if not (mass > 0).all():
        raise ValueError("triangles: some vertex is in no triangle")
    return total / mass.reshape(-1, *([1] * len(rest)))


def vertex_min_label(triangles: np.ndarray, labels: np.ndarray, n_vertices: int) -> np.ndarray:
    """The smallest label among each vertex's triangles, ``(V,)`` int8 (a vertex on an
    interface belongs to the lower subdomain); ``labels`` ``(T,)`` integers in int8's range,
    and every vertex in some triangle."""
    n_vertices = check_int(n_vertices, "n_vertices")
    triangles = _check_triangles(triangles, n_vertices)
    labels = np.asarray(labels)
    int8 = np.iinfo(np.int8)
    if labels.shape != triangles.shape[:1] or labels.dtype.kind not in "iu" or (
        labels.size and (labels.min() < int8.min or labels.max() > int8.max)
    ):
        raise ValueError(f"labels: expected {len(triangles)} integers in [{int8.min}, "
                         f"{int8.max}] (one per triangle), got {labels.dtype} {labels.shape}")
    if np.unique(triangles).size != n_vertices:  # it would get no label but int8's largest
        orphan = np.setdiff1d(np.arange(n_vertices), triangles)[0]
        raise ValueError(f"triangles: vertex {orphan} is in no triangle")
    out = np.full(n_vertices, int8.max, dtype=np.int8)
    np.minimum.at(out, triangles.reshape(-1), np.repeat(labels.astype(np.int8), 3))
    return out


# ----------------------------------------------------------------------------- P2 on skfem


def skfem_mesh(mesh: TriMesh):
    """The scikit-fem ``MeshTri`` of ``mesh`` (same vertices and triangle order; skfem sorts
    each triangle's corners, so use its ``t`` with its bases)."""
    from skfem import MeshTri

    mesh = _check_mesh(mesh)
    return MeshTri(np.ascontiguousarray(mesh.points.T),
                   np.ascontiguousarray(mesh.triangles.T.astype(np.int64)))


def p2_basis(fem_mesh, *, vector: bool = False, intorder: int | None = None):
    """The P2 basis (vector-valued for ``vector``: DOFs of ``x`` and ``y`` interleaved) on a
    skfem mesh.  The first ``V`` scalar DOFs are the vertices in order."""
    from skfem import Basis, ElementTriP2, ElementVector

    element = ElementVector(ElementTriP2()) if vector else ElementTriP2()
    return Basis(fem_mesh, element, intorder=intorder)


def _per_element(basis, coefficient: np.ndarray, name: str) -> np.ndarray:
    """A constant per triangle ``(T,)`` at the basis' quadrature points, ``(T, q)``."""
    coefficient = np.asarray(coefficient, dtype=np.float64)
    if coefficient.shape != (basis.mesh.nelements,):
        raise ValueError(f"{name}: expected one value per triangle, shape "
                         f"({basis.mesh.nelements},), got {coefficient.shape}")
    if not np.isfinite(coefficient).all():
        raise ValueError(f"{name}: expected finite values")
    return np.repeat(coefficient[:, None], basis.X.shape[-1], axis=1)


def assemble_diffusion(basis, coefficient: np.ndarray) -> sp.csr_matrix:
    """Stiffness matrix ``∫ k ∇u·∇v`` of a scalar basis, ``k`` constant per triangle ``(T,)``."""
    from skfem import BilinearForm
    from skfem.helpers import dot, grad

    @BilinearForm
    def form(u, v, w):
        return w.k * dot(grad(u), grad(v))

    return form.assemble(basis, k=_per_element(basis, coefficient, "coefficient")).tocsr()


def assemble_load(basis, source: np.ndarray | Field | VectorField) -> np.ndarray:
    """Load vector ``∫ f·v``.

    ``source``: a constant per triangle ``(T,)`` (scalar basis), or a function ``f(x, y)`` of
    arrays returning ``f`` (scalar basis) or the pair ``(f_x, f_y)`` (vector basis).
    """
    from skfem import LinearForm
    from skfem.helpers import dot

    vector = basis.elem.__class__.__name__ == "ElementVector"
    if callable(source):
        if vector:
            @LinearForm
            def form(v, w):
                return dot(np.stack(source(w.x[0], w.x[1])), v)
        else:
            @LinearForm
            def form(v, w):
                return np.asarray(source(w.x[0], w.x[1])) * v
        return form.assemble(basis)
    if vector:
        raise TypeError("source: expected a function f(x, y) -> (f_x, f_y) for a vector basis")

    @LinearForm
    def constant(v, w):
        return w.f * v

    return constant.assemble(basis, f=_per_element(basis, source, "source"))


def assemble_elasticity(basis, young: float, poisson: float) -> sp.csr_matrix:
    """Plane-strain stiffness ``∫ σ(u):ε(v)`` of a vector basis (``skfem.models.elasticity``),
    Lamé ``λ = Eν/((1+ν)(1−2ν))``, ``μ = E/(2(1+ν))``."""
    from skfem import asm
    from skfem.models.elasticity import lame_parameters, linear_elasticity

    young = check_float(young, "young")
    poisson = check_float(poisson, "poisson", low=-1.0, high=0.4999)
    return asm(linear_elasticity(*lame_parameters(young, poisson)), basis).tocsr()


def assemble_traction(
    basis, where: Callable[[np.ndarray], np.ndarray], traction: Sequence[float] | VectorField
) -> np.ndarray:
    """Load vector ``∫_Γ t·v ds`` over the boundary facets whose midpoints satisfy ``where``.

    Args:
        basis: a vector basis.
        where: ``where(x)`` with ``x (2, n)`` facet midpoints -> ``(n,)`` bool.
        traction: the constant ``(t_x, t_y)``, or ``t(x, y) -> (t_x, t_y)``.

    Returns:
        ``(N,)`` over the basis' DOFs (zero if no facet satisfies ``where``).
    """
    from skfem import FacetBasis, LinearForm
    from skfem.helpers import dot

    facets = basis.mesh.facets_satisfying(where, boundaries_only=True)
    if len(facets) == 0:
        return np.zeros(basis.N)
    facet_basis = FacetBasis(basis.mesh, basis.elem, facets=facets)
    if callable(traction):
        field = traction
    else:
        constant = np.asarray(traction, dtype=np.float64)
        if constant.shape != (2,) or not np.isfinite(constant).all():
            raise ValueError(f"traction: expected a finite pair (t_x, t_y) or a function, got "
                             f"{traction!r}")

        def field(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return np.full_like(x, constant[0]), np.full_like(x, constant[1])

    @LinearForm
    def form(v, w):
        return dot(np.stack(field(w.x[0], w.x[1])), v)

    return form.assemble(facet_basis)


def corner_gradients(fem_mesh, element, u: np.ndarray) -> np.ndarray:
    """The gradient of each triangle's polynomial of ``u`` at its three corners.

    Args:
        fem_mesh: the skfem mesh (corners in the order of its ``t``).
        element: the skfem element of ``u``.
        u: ``(N,)`` DOF values.

    Returns:
        ``(T, 3, 2)`` for a scalar element (``[..., j] = ∂u/∂x_j``), ``(T, 3, 2, 2)`` for a
        vector one (``[..., i, j] = ∂u_i/∂x_j``); corner ``k`` is the vertex ``t[k]``.
    """
    from skfem import Basis

    # A "quadrature" at the reference corners (0,0), (1,0), (0,1) = the local vertices 0, 1, 2.
    corners = (np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), np.full(3, 1.0 / 6.0))
    grad = Basis(fem_mesh, element, quadrature=corners).interpolate(u).grad
    return np.moveaxis(np.moveaxis(grad, -2, 0), -1, 1)  # (..., T, 3) -> (T, 3, ...)


def solve_constrained(
    matrix: sp.spmatrix,
    rhs: np.ndarray,
    fixed: np.ndarray,
    values: np.ndarray,
    identify: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Solve ``A u = b`` with prescribed DOFs condensed out and pairs of DOFs identified.

    Identification (periodicity) maps each ``slave`` DOF to its ``master``: with the 0/1 matrix
    ``P (N, N_r)`` of the map, the system is ``PᵀAP u_r = Pᵀb``, ``u = P u_r``.  The prescribed
    DOFs (mapped to their masters; a master takes the value given for it or for any of its
    slaves, which must agree) are condensed out and the rest solved by SuperLU (minimum-degree
    ordering of ``Aᵀ + A``, symmetric mode: the matrices here are SPD).

    Args:
        matrix: ``(N, N)`` sparse.
        rhs: ``(N,)``.
        fixed: ``(F,)`` indices of prescribed DOFs.
        values: ``(F,)`` their values.
        identify: ``(slave (K,), master (K,))`` index pairs, or ``None``.

    Returns:
        ``u (N,)`` and ``reactions (N,)``: at each prescribed master, ``(Pᵀ(b − A u))``, the
        residual of its equation (the boundary flux or force); 0 elsewhere.  They sum to the
        total load wherever the constants are in the kernel (``Σ_i φ_i = 1``).
    """
    n = matrix.shape[0]
    rhs = np.asarray(rhs, dtype=np.float64)
    fixed = _dof_indices(fixed, "fixed", n)
    values = np.asarray(values, dtype=np.float64)
    if matrix.shape != (n, n) or rhs.shape != (n,):
        raise ValueError(f"matrix, rhs: expected (N, N) and (N,), got {matrix.shape} and "
                         f"{rhs.shape}")
    if fixed.shape != values.shape or fixed.ndim != 1:
        raise ValueError(f"fixed, values: expected two (F,) arrays, got {fixed.shape} and "
                         f"{values.shape}")
    entries = matrix.data if sp.issparse(matrix) else np.asarray(matrix)
    for name, array in (("matrix", entries), ("rhs", rhs), ("values", values)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name}: expected finite values, got NaN or inf")
    master = np.arange(n)
    if identify is not None:
        slave, target = (_dof_indices(a, "identify", n) for a in identify)
        if slave.shape != target.shape or np.intersect1d(slave, target).size:
            raise ValueError("identify: expected (slave, master) arrays of one shape, no DOF "
                             "both a slave and a master")
        master[slave] = target
    reduced, column = np.unique(master, return_inverse=True)
    n_r = len(reduced)
    p = sp.csr_matrix((np.ones(n), (np.arange(n), column)), shape=(n, n_r))
    a_r = (p.T @ matrix @ p).tocsr()
    b_r = p.T @ rhs
    u_r = np.zeros(n_r)
    is_fixed = np.zeros(n_r, dtype=bool)
    is_fixed[column[fixed]] = True
    u_r[column[fixed]] = values
    differ = ~np.isclose(u_r[column[fixed]], values, rtol=1e-9, atol=1e-12)
    if differ.any():
        i = int(np.argmax(differ))
        raise ValueError(f"values: DOF {fixed[i]} is given {float(values[i])} and, listed "
                         f"again or through identify, {float(u_r[column[fixed[i]]])}")
    free = ~is_fixed
    if free.any():
        a_ff = a_r[free][:, free].tocsc()
        try:
            lu = spla.splu(a_ff, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                           options={"SymmetricMode": True})
        except RuntimeError as err:  # SuperLU's "Factor is exactly singular"
            raise ValueError(f"fixed: the matrix is singular on the {int(free.sum())} DOFs "
                             "left free (too few DOFs fixed to determine u)") from err
        u_r[free] = lu.solve(b_r[free] - a_r[free][:, is_fixed] @ u_r[is_fixed])
    residual = np.where(is_fixed, b_r - a_r @ u_r, 0.0)
    reactions = np.zeros(n)
    reactions[reduced] = residual
    return p @ u_r, reactions


def _dof_indices(indices: object, name: str, n: int) -> np.ndarray:
    """``indices`` as an int64 array of DOFs of ``[0, n)``; floats and other values refused
    (numpy would truncate 1.7 to 1 and wrap -1 to the last DOF)."""
    array = np.asarray(indices)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name}: expected integer DOF indices, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= n):
        raise ValueError(f"{name}: expected DOF indices in [0, {n}), got values from "
                         f"{array.min()} to {array.max()}")
    return array


def error_norms(
    basis,
    u: np.ndarray,
    exact: Field,
    exact_grad: Field,
    intorder: int = 8,
) -> tuple[float, float]:
    """L² and H¹-seminorm errors ``‖u_h − u‖``, ``‖∇(u_h − u)‖`` by a quadrature of degree
    ``intorder`` (exact for the discrete part; the exact part's error is far below P2's).

    Args:
        basis: the (scalar or vector) basis of ``u``.
        u: ``(N,)`` DOF values.
        exact: ``u(x, y)``: an array (scalar) or a pair of arrays (vector).
        exact_grad: ``∇u(x, y)``: the pair ``(u_x, u_y)`` (scalar) or the nested pairs
            ``((∂_x u_1, ∂_y u_1), (∂_x u_2, ∂_y u_2))`` (vector).

    Returns:
        ``(l2, h1_seminorm)``.
    """
    from skfem import Basis

    fine = Basis(basis.mesh, basis.elem, intorder=check_int(intorder, "intorder"))
    field = fine.interpolate(np.asarray(u, dtype=np.float64))
    x, y = np.asarray(fine.global_coordinates())
    value = np.asarray(exact(x, y), dtype=np.float64)
    grad = np.asarray(exact_grad(x, y), dtype=np.float64)
    dx = fine.dx  # (T, q) quadrature weights times Jacobians
    l2 = np.sqrt(((np.asarray(field) - value) ** 2 * dx).sum())
    gap = (field.grad - grad) ** 2
    h1 = np.sqrt((gap.reshape(-1, *dx.shape) * dx).sum())
    return float(l2), float(h1)
