"""data/fem.py's argument checks and rarely taken branches: each check reached through the
public function, each branch with its result checked."""

import builtins

import numpy as np
import pytest
import scipy.sparse as sp

from galerkin_ext.data.fem import (
    assemble_diffusion,
    assemble_load,
    assemble_traction,
    distance_to_polyline,
    marked_curve,
    p2_basis,
    refine_near,
    refine_to_areas,
    skfem_mesh,
    solve_constrained,
    triangle_areas,
    triangulate,
    vertex_average,
)

SQUARE = np.array([[0.0, 0], [1, 0], [1, 1], [0, 1]])
EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 0]])


@pytest.fixture(scope="module")
def mesh():
    return triangulate(SQUARE, EDGES, h=0.5, segment_markers=np.array([2, 3, 4, 5]))


@pytest.mark.parametrize("kw, match", [
    ({"vertices": np.array([["a", "b"]])}, r"vertices: expected a real array of shape \(P, 2\)"),
    ({"vertices": SQUARE * np.array([1, np.nan])}, "vertices: expected finite values"),
    ({"segments": EDGES.astype(float)}, r"segments: expected an integer array of shape \(S, 2\)"),
    ({"segments": EDGES + 1}, r"segments: expected vertex indices in \[0, 4\)"),
    ({"segment_markers": np.array([2, 2, 1, 2])}, r"segment_markers: expected 4 ints >= 2"),
    ({"regions": np.array([[0.5, 0.5, 0.5]])}, r"regions: expected integer labels in \[0, 127\]"),
    ({"regions": np.array([[0.5, 0.5, 200]])}, r"regions: expected integer labels in \[0, 127\]"),
    # collinear, coincident or repeated vertices (Triangle crashed the process on the latter)
    ({"vertices": np.array([[0.0, 0], [1, 0], [2, 0], [3, 0]])}, "vertices: expected at least "
                                                                 "3 points not all on one line"),
    ({"vertices": np.zeros((4, 2))}, r"vertices: expected distinct points, but the points of "
                                     r"rows \[0\] appear more than once \(e.g. \[0.0, 0.0\]\)"),
    # a polygon closed by repeating its first point (Triangle crashed on it too)
    ({"vertices": np.vstack([SQUARE, SQUARE[:1]])}, r"rows \[0\] appear more than once"),
])
def test_triangulate_checks(kw, match):
    args = {"vertices": SQUARE, "segments": EDGES, **kw}
    with pytest.raises(ValueError, match=match):
        triangulate(args.pop("vertices"), args.pop("segments"), h=0.5, **args)


def test_missing_triangle_gives_the_install_hint(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "triangle":
            raise ImportError("no triangle")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"pip install 'galerkin_ext\[fem\]'"):
        triangulate(SQUARE, EDGES, h=0.5)


def test_distance_to_a_single_point_and_checks():
    pts = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(distance_to_polyline(pts, np.array([[0.0, 0.0]])), [5.0, 0.0],
                               rtol=1e-15)
    with pytest.raises(ValueError, match="polyline: expected at least one point"):
        distance_to_polyline(pts, np.zeros((0, 2)))


def test_distance_beyond_a_segments_ends_is_to_its_end_point():
    """Past a segment's ends the nearest point is the end point, not the foot on the segment's
    line: (2, 1) is sqrt(2) from the segment (0, 0)-(1, 0), not 1; on an L-shaped polyline
    (-1, 1.5) is sqrt(1.25) from its end (0, 1), not 1 (from the line x = 0 through its first
    segment), and points beside a segment keep their perpendicular distance. Without the clip
    the refined sets would split triangles far from the interfaces and the cavity, while the
    other tests, whose points lie beside their curves, still passed."""
    segment = np.array([[0.0, 0.0], [1.0, 0.0]])
    pts = np.array([[2.0, 1.0], [-3.0, -4.0], [0.5, 0.25]])
    np.testing.assert_allclose(distance_to_polyline(pts, segment), [np.sqrt(2), 5.0, 0.25],
                               rtol=1e-15)
    ell = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(distance_to_polyline(np.array([[-1.0, 1.5], [0.5, 0.5]]), ell),
                               [np.sqrt(1.25), 0.5], rtol=1e-15)


def test_refine_near_checks(mesh):
    with pytest.raises(TypeError, match="mesh: expected a TriMesh, got dict"):
        refine_near({}, [np.zeros((2, 2))], 0.1)
    for curves in ([], np.zeros((2, 2))):
        with pytest.raises(TypeError, match="curves: expected a non-empty sequence of"):
            refine_near(mesh, curves, 0.1)
    with pytest.raises(TypeError, match="curves: expected a non-empty sequence of"):
        refine_near(mesh, "ab", 0.1)  # (a str is a Sequence)
    # each curve is checked under its own name (distance_to_polyline's says "polyline")
    with pytest.raises(ValueError, match=r"^curves\[1\]: expected finite values$"):
        refine_near(mesh, [np.zeros((2, 2)), np.array([[0.0, 0.0], [np.inf, 1.0]])], 0.1)
    with pytest.raises(ValueError, match=r"^curves\[0\]: expected at least one point$"):
        refine_near(mesh, [np.zeros((0, 2))], 0.1)


def test_refine_to_areas_checks_and_bounds(mesh):
    n = len(mesh.triangles)
    for bad in (np.ones(n - 1), np.ones((n, 1)), np.full(n, -1.0), np.full(n, np.nan),
                np.ones(n, dtype=np.int64)):
        with pytest.raises(ValueError, match=rf"^max_area: expected {n} finite floats >= 0"):
            refine_to_areas(mesh, bad)
    with pytest.raises(TypeError, match="mesh: expected a TriMesh"):
        refine_to_areas({}, np.ones(n))
    # a bound on one triangle alone splits it (0 bounds nothing), keeping the vertices first
    areas = triangle_areas(mesh.points, mesh.triangles)
    bound = np.zeros(n)
    bound[0] = areas[0] / 4
    fine = refine_to_areas(mesh, bound)
    assert np.array_equal(fine.points[:len(mesh.points)], mesh.points)

    def corner_sets(m):
        return {frozenset(t) for t in m.triangles.tolist()}

    assert frozenset(mesh.triangles[0].tolist()) not in corner_sets(fine)
    assert abs(triangle_areas(fine.points, fine.triangles).sum() - areas.sum()) < 1e-12
    assert corner_sets(refine_to_areas(mesh, np.zeros(n))) == corner_sets(mesh)


def test_marked_curve_of_an_absent_marker(mesh):
    with pytest.raises(ValueError, match="marker: no segment of the mesh has marker 9"):
        marked_curve(mesh, 9, lambda p: p[:, 0])


def test_vertex_average_checks():
    tri = np.array([[0, 1, 2]])
    with pytest.raises(ValueError, match=r"values: expected shape \(T, 3, ...\) = \(1, 3, ...\)"):
        vertex_average(tri, np.zeros((1, 2)), np.ones(1), 3)
    with pytest.raises(ValueError, match="triangles: some vertex is in no triangle"):
        vertex_average(tri, np.zeros((1, 3)), np.ones(1), 4)


def test_assembly_checks_and_an_empty_boundary(mesh):
    scalar = p2_basis(skfem_mesh(mesh))
    t = len(mesh.triangles)
    with pytest.raises(ValueError, match=rf"coefficient: expected one value per triangle, shape "
                                         rf"\({t},\), got \(3,\)"):
        assemble_diffusion(scalar, np.ones(3))
    with pytest.raises(ValueError, match="coefficient: expected finite values"):
        assemble_diffusion(scalar, np.full(t, np.nan))
    vector = p2_basis(skfem_mesh(mesh), vector=True)
    with pytest.raises(TypeError, match="source: expected a function f.x, y. -> .f_x, f_y. for "
                                        "a vector basis"):
        assemble_load(vector, np.ones(t))
    nowhere = assemble_traction(vector, lambda x: x[0] > 5, (1.0, 0.0))
    assert nowhere.shape == (vector.N,) and not nowhere.any()
    with pytest.raises(ValueError, match=r"traction: expected a finite pair \(t_x, t_y\) or a "
                                         "function"):
        assemble_traction(vector, lambda x: x[0] > 0.99, (1.0, np.nan))
    # a traction function equals the same constant given as a pair
    right = lambda x: x[0] > 1 - 1e-9  # noqa: E731
    const = assemble_traction(vector, right, (2.0, -1.0))
    fn = assemble_traction(vector, right, lambda x, y: (2.0 + 0 * x, -1.0 + 0 * y))
    np.testing.assert_allclose(fn, const, rtol=1e-13, atol=1e-15)
    assert abs(const.sum() - 1.0) < 1e-12  # ∫ (t_x + t_y) ds over the unit side


def test_solve_constrained_checks_and_everything_fixed():
    a = sp.identity(3, format="csr") * 2.0
    with pytest.raises(ValueError, match=r"matrix, rhs: expected \(N, N\) and \(N,\), got "
                                         r"\(3, 3\) and \(2,\)"):
        solve_constrained(a, np.ones(2), np.array([0]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"fixed, values: expected two \(F,\) arrays"):
        solve_constrained(a, np.ones(3), np.array([0]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"identify: expected \(slave, master\) arrays of one "
                                         "shape"):
        solve_constrained(a, np.ones(3), np.array([0]), np.array([1.0]),
                          identify=(np.array([1, 2]), np.array([2, 0])))
    u, reactions = solve_constrained(a, np.array([1.0, 1, 1]), np.array([0, 1, 2]),
                                     np.array([1.0, 2, 3]))  # no free DOF: no solve
    np.testing.assert_array_equal(u, [1.0, 2, 3])
    np.testing.assert_allclose(reactions, [1.0 - 2, 1 - 4, 1 - 6])
