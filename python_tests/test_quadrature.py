"""galerkin_ext.quadrature against exact integrals (SPEC §2b): sums to the domain's measure,
second order of the trapezoid rule on non-uniform grids, exactness of the lumped mesh weights
for cell-wise linear functions, row-major grid order, clear errors for bad input."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial import Delaunay

from galerkin_ext.quadrature import (
    curve_weights,
    grid_weights,
    mesh_weights,
    monte_carlo_weights,
    trapezoid_weights,
)


def _nonuniform_grid(n: int) -> torch.Tensor:
    """Sorted points on [0, 2] with both ends and smoothly graded gaps (ratio ~1.6)."""
    s = torch.linspace(0, 1, n, dtype=torch.float64)
    return 2 * (s + 0.08 * torch.sin(math.pi * s))


def test_trapezoid_weights_sum_and_second_order():
    errors = []
    for n in (33, 65, 129):
        x = _nonuniform_grid(n)
        w = trapezoid_weights(x)
        assert w.shape == x.shape and w.dtype == torch.float64
        assert float(w.sum()) == pytest.approx(2.0, rel=1e-14)
        # an independent formula: the exact trapezoid rule written as a loop over intervals
        ref = torch.zeros_like(x)
        for j in range(n - 1):
            ref[j] += (x[j + 1] - x[j]) / 2
            ref[j + 1] += (x[j + 1] - x[j]) / 2
        torch.testing.assert_close(w, ref, rtol=1e-14, atol=0)
        errors.append(abs(float((w * torch.exp(torch.sin(3 * x))).sum()) - 2.0 * _mean_exp_sin()))
    # each halving of the grid divides the error by ~4
    assert 3.5 < errors[0] / errors[1] < 4.5 and 3.5 < errors[1] / errors[2] < 4.5


def _mean_exp_sin() -> float:
    """(1/2) ∫_0^2 exp(sin 3x) dx by a fine composite Simpson rule (independent of the code)."""
    x = np.linspace(0.0, 2.0, 200001)
    f = np.exp(np.sin(3 * x))
    h = x[1] - x[0]
    return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())) / 2


def test_trapezoid_weights_batched_and_repeated_points(gen):
    x = torch.sort(torch.rand(3, 5, 7, generator=gen), dim=-1).values
    w = trapezoid_weights(x)
    for i in range(3):
        for j in range(5):
            torch.testing.assert_close(w[i, j], trapezoid_weights(x[i, j]))
    torch.testing.assert_close(w.sum(-1), x[..., -1] - x[..., 0])
    # a repeated point (a zero-length gap) is allowed; two points give half the length each
    torch.testing.assert_close(trapezoid_weights(torch.tensor([0.0, 1.0, 1.0, 3.0])),
                               torch.tensor([0.5, 0.5, 1.0, 1.0]))
    torch.testing.assert_close(trapezoid_weights(torch.tensor([1.0, 4.0])),
                               torch.tensor([1.5, 1.5]))


def test_trapezoid_weights_give_the_copies_of_a_point_their_halves_in_given_order():
    """The docstring says a repeated point shares its weight with its copy, not which copy gets
    which half; this pins the current rule (a stable sort): the copies take their places in
    the sorted order in the order given, so the first given gets the half-gap below, the last
    the half-gap above, any between none. An unstable sort kept the sum and the weight of
    each value but, on large inputs, moved the halves between copies, silently."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (4000,), generator=g).double()
    values = sorted(set(x.tolist()))
    want = torch.zeros_like(x)
    for k, v in enumerate(values):
        copies = (x == v).nonzero()[:, 0]
        if k > 0:
            want[copies[0]] += (v - values[k - 1]) / 2
        if k + 1 < len(values):
            want[copies[-1]] += (values[k + 1] - v) / 2
    torch.testing.assert_close(trapezoid_weights(x), want, rtol=0, atol=0)
    assert float(want.sum()) == values[-1] - values[0]


def test_trapezoid_weights_any_order_and_one_point(gen):
    """Unsorted coordinates get the weights of their sorted order, scattered back; one point
    gets weight 1."""
    x = torch.rand(4, 9, generator=gen, dtype=torch.float64)
    order = x.argsort(dim=-1)
    want = torch.empty_like(x).scatter_(-1, order, trapezoid_weights(x.gather(-1, order)))
    torch.testing.assert_close(trapezoid_weights(x), want, rtol=0, atol=0)
    torch.testing.assert_close(trapezoid_weights(x).sum(-1), x.amax(-1) - x.amin(-1))
    assert trapezoid_weights(torch.tensor([0.3])).tolist() == [1.0]
    assert trapezoid_weights(torch.tensor([[0.3]])).tolist() == [[1.0]]


def test_trapezoid_weights_errors():
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        trapezoid_weights(torch.arange(4))
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        trapezoid_weights([0.0, 1.0])
    with pytest.raises(ValueError, match="at least 1 point"):
        trapezoid_weights(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="finite"):
        trapezoid_weights(torch.tensor([0.0, float("nan"), 1.0]))
    # the models' (n, 1) grid is n sets of one point each along the last axis: all weights 1,
    # never what was meant
    with pytest.raises(ValueError, match=r"shape \(3, 1\).*pass x\[\.\.\., 0\]"):
        trapezoid_weights(torch.tensor([[0.0], [0.5], [1.0]]))


def test_weights_from_values_refuse_meta_tensors():
    # (they were raw "Tensor.item() cannot be called on meta tensors" errors)
    points = torch.rand(5, 2, device="meta")
    for call, name in [(lambda: trapezoid_weights(torch.rand(5, device="meta")), "x"),
                       (lambda: mesh_weights(points), "points"),
                       (lambda: mesh_weights(points, torch.tensor([[0, 1, 2]])), "points"),
                       (lambda: curve_weights(points, torch.tensor([[0, 1]])), "points")]:
        with pytest.raises(ValueError, match=f"{name}: the weights are computed from its "
                                             "values, which a meta tensor does not hold"):
            call()


def test_grid_weights_volume_order_and_exactness():
    w = grid_weights((5, 3), lengths=(2.0, 0.5), dtype=torch.float64)
    assert w.shape == (15,) and float(w.sum()) == pytest.approx(1.0, rel=1e-15)
    x = torch.linspace(0, 2, 5, dtype=torch.float64)
    y = torch.linspace(0, 0.5, 3, dtype=torch.float64)
    # row-major: node (i, j) at index 3 i + j, the weight the product of the 1-D trapezoid ones
    expected = torch.outer(trapezoid_weights(x), trapezoid_weights(y)).reshape(-1)
    torch.testing.assert_close(w, expected, rtol=1e-15, atol=0)
    xx, yy = torch.meshgrid(x, y, indexing="ij")
    # bilinear functions are integrated exactly: ∫∫ (1 + x y) = 1 + (2²/2)(0.5²/2)
    f = (1 + xx * yy).reshape(-1)
    assert float((w * f).sum()) == pytest.approx(1 + 2.0 * 0.125, rel=1e-14)
    assert grid_weights((4,)).dtype == torch.float32
    torch.testing.assert_close(grid_weights((4,), dtype=torch.float64),
                               torch.tensor([1, 2, 2, 1], dtype=torch.float64) / 6)


def test_grid_weights_riemann_are_uniform():
    w = grid_weights((8, 6), rule="riemann", lengths=(1.0, 2 * math.pi), dtype=torch.float64)
    torch.testing.assert_close(w, torch.full((48,), 2 * math.pi / 48, dtype=torch.float64))
    # a trigonometric polynomial integrates exactly on a periodic grid
    x = torch.arange(8, dtype=torch.float64) / 8
    f = 1 + torch.cos(2 * math.pi * 3 * x)
    w1 = grid_weights((8,), rule="riemann", dtype=torch.float64)
    assert float((w1 * f).sum()) == pytest.approx(1.0, rel=1e-15)
    assert grid_weights((1,), rule="riemann").tolist() == [1.0]
    assert float(grid_weights((3, 4, 5), rule="riemann", dtype=torch.float64).sum()) == (
        pytest.approx(1.0, rel=1e-15))


def test_monte_carlo_weights_converge_at_half_order():
    """volume / n each; the error of ∫ over random points falls like n^(-1/2) (64 seeds)."""
    torch.testing.assert_close(monte_carlo_weights(4, 2.0, dtype=torch.float64),
                               torch.full((4,), 0.5, dtype=torch.float64))
    sizes = [2**e for e in range(6, 13)]
    errors = []
    for n in sizes:
        x = torch.rand(64, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        estimate = (monte_carlo_weights(n, dtype=torch.float64) * torch.exp(x)).sum(-1)
        errors.append(float((estimate - (math.e - 1)).pow(2).mean().sqrt()))
    slope = np.polyfit(np.log(sizes), np.log(errors), 1)[0]
    assert -0.6 < slope < -0.4, slope
    with pytest.raises(ValueError, match="volume: expected a finite float > 0"):
        monte_carlo_weights(3, 0.0)
    with pytest.raises(ValueError, match="n: expected an int >= 1"):
        monte_carlo_weights(0)
    with pytest.raises(ValueError, match="device: expected e.g. 'cpu'"):
        monte_carlo_weights(3, device="gpu")
    for dtype in (torch.int64, torch.bool):  # a rule of 0s (or Trues) would integrate nothing
        with pytest.raises(TypeError, match="dtype: expected a floating torch.dtype"):
            monte_carlo_weights(3, dtype=dtype)


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    (((),), {}, TypeError, "shape: expected a sequence of 1 to 3 ints"),
    (("12",), {}, TypeError, "shape: expected a sequence of 1 to 3 ints"),
    (((2, 2, 2, 2),), {}, TypeError, "shape: expected a sequence of 1 to 3 ints"),
    (((4, 1),), {}, ValueError, r"shape\[1\]: expected an int >= 2"),
    (((4, 2.0),), {}, TypeError, r"shape\[1\]: expected an int"),
    (((4, 3), (1.0,)), {}, ValueError, "lengths: expected 2 lengths"),
    (((4, 3), (1.0, -2.0)), {}, ValueError, r"lengths\[1\]: expected a finite float > 0"),
    (((4,),), {"rule": "simpson"}, ValueError, "rule: expected one of"),
    (((3,),), {"dtype": torch.int64}, TypeError, "dtype: expected a floating torch.dtype"),
    # torch's own messages named no argument
    (((3,),), {"device": "gpu"}, ValueError, "device: expected e.g. 'cpu'"),
    (((3,),), {"device": "cuda:0" if not torch.cuda.is_available() else "tpu"}, ValueError,
     "device: "),
])
def test_grid_weights_errors(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        grid_weights(*args, **kwargs)


def _random_mesh(dim: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Delaunay mesh of the unit square/cube's corners plus random interior points; its
    measure is 1 (the convex hull is the square/cube)."""
    rng = np.random.default_rng(seed)
    corners = np.array(np.meshgrid(*[[0.0, 1.0]] * dim, indexing="ij")).reshape(dim, -1).T
    points = np.concatenate([corners, rng.uniform(0.05, 0.95, (n, dim))])
    cells = Delaunay(points).simplices
    return torch.from_numpy(points), torch.from_numpy(cells.astype(np.int64)), 1.0


@pytest.mark.parametrize("dim", [2, 3])
def test_mesh_weights_exact_for_linear_functions(dim):
    points, cells, measure = _random_mesh(dim, 40, seed=dim)
    w = mesh_weights(points, cells)
    assert w.shape == (points.shape[0],) and w.dtype == torch.float64 and bool((w > 0).all())
    assert float(w.sum()) == pytest.approx(measure, rel=1e-13)
    # ∫ (1 + 2 x_0 - 3 x_1 [+ x_2]) over the unit square/cube = 1 + 1 - 1.5 [+ 0.5]
    coef = torch.tensor([2.0, -3.0, 1.0][:dim], dtype=torch.float64)
    f = 1 + points @ coef
    assert float((w * f).sum()) == pytest.approx(1 + float(coef.sum()) / 2, rel=1e-13)


def test_mesh_weights_by_hand_and_surface():
    # two triangles of the unit square: the diagonal's vertices get 1/3, the others 1/6
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    cells = torch.tensor([[0, 1, 2], [0, 2, 3]], dtype=torch.int32)
    torch.testing.assert_close(mesh_weights(points, cells),
                               torch.tensor([1 / 3, 1 / 6, 1 / 3, 1 / 6]))
    # the same square tilted into 3-D: a surface mesh keeps its area, and a vertex in no cell
    # gets weight 0
    tilt = torch.tensor([[0.0, 0.0, 0.0], [0.6, 0.0, 0.8], [0.6, 1.0, 0.8], [0.0, 1.0, 0.0],
                         [5.0, 5.0, 5.0]], dtype=torch.float64)
    w = mesh_weights(tilt, cells)
    torch.testing.assert_close(w, torch.tensor([1 / 3, 1 / 6, 1 / 3, 1 / 6, 0.0],
                                               dtype=torch.float64))
    # twice as large, four times the area (an area, not a volume, in 3-D)
    torch.testing.assert_close(mesh_weights(2 * tilt, cells), 4 * w)


def test_mesh_weights_of_the_delaunay_triangulation():
    """Without cells, the points' Delaunay triangulation is the mesh: the weights sum to the
    convex hull's area and integrate linear functions exactly there."""
    points, cells, area = _random_mesh(2, 40, seed=3)
    w = mesh_weights(points)
    torch.testing.assert_close(w, mesh_weights(points, cells), rtol=1e-14, atol=0)
    assert float(w.sum()) == pytest.approx(area, rel=1e-13)
    assert float((w * (1 + points[:, 0] - 2 * points[:, 1])).sum()) == pytest.approx(
        1 + 0.5 - 1.0, rel=1e-13)
    with pytest.raises(ValueError, match="points: no Delaunay triangulation"):
        mesh_weights(torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16,
                                   torch.bfloat16])
def test_mesh_weights_of_small_cells_in_every_dtype(dtype):
    """A cell far smaller than the mesh is a cell, not a degenerate one, in every dtype: a
    31 × 31 grid of the unit square, and a corner refined into triangles with legs 1e-3
    (float32, float64; half types cannot hold that refinement)."""
    n = 31
    x = torch.linspace(0, 1, n, dtype=torch.float64)
    points = torch.stack(torch.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    i, j = torch.meshgrid(torch.arange(n - 1), torch.arange(n - 1), indexing="ij")
    v = (i * n + j).reshape(-1)
    cells = torch.cat([torch.stack([v, v + n, v + n + 1], 1), torch.stack([v, v + n + 1, v + 1],
                                                                           1)])
    w = mesh_weights(points.to(dtype), cells)
    assert w.dtype == dtype
    exact = mesh_weights(points.to(dtype).double(), cells)  # the same coordinates, in float64
    torch.testing.assert_close(w, exact.to(dtype))
    assert float(w.double().sum()) == pytest.approx(1.0, rel=1e-2)
    if dtype in (torch.float32, torch.float64):
        fine = torch.tensor([[0.0, 0.0], [1e-3, 0.0], [0.0, 1e-3], [1.0, 1.0]], dtype=dtype)
        w = mesh_weights(fine, torch.tensor([[0, 1, 2], [1, 3, 2]]))
        # 0.5e-6 + 0.5 (0.999e-3 + 1e-3): the small triangle and the sliver to (1, 1)
        assert float(w.sum()) == pytest.approx(1e-3, rel=1e-5)


def test_mesh_weights_drop_flat_delaunay_simplices():
    """Qhull's triangulation of a regular 3-D grid holds flat tetrahedra (co-spherical
    points): they carry no weight and are dropped, not refused as the user's cells."""
    x = torch.linspace(0, 1, 3, dtype=torch.float64)
    points = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)
    w = mesh_weights(points)
    assert float(w.sum()) == pytest.approx(1.0, rel=1e-13)
    assert float((w * (1 + points @ torch.tensor([2.0, -3.0, 1.0], dtype=torch.float64))).sum()
                 ) == pytest.approx(1.0, rel=1e-13)
    empty = mesh_weights(torch.zeros(0, 2), torch.zeros(0, 3, dtype=torch.long))
    assert empty.shape == (0,)


@pytest.mark.parametrize("scale", [1e-100, 1e100])
def test_mesh_weights_at_extreme_scales(scale):
    """Weights scale as the coordinates do, given cells or Delaunay, in 2-D and 3-D (Qhull got
    the coordinates as they are and failed at 1e100, crashing the process at 1e110)."""
    for dim in (2, 3):
        points, cells, _ = _random_mesh(dim, 20, seed=5)
        for got, expected in ((mesh_weights(points * scale), mesh_weights(points)),
                              (mesh_weights(points * scale, cells), mesh_weights(points, cells))):
            torch.testing.assert_close(got / scale**dim, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float32, 1e-23), (torch.float32, 1e20),
                                           (torch.float64, 1e-162), (torch.float64, 1e155)],
                         ids=str)
def test_curve_weights_at_extreme_scales(dtype, scale):
    """Lengths are taken on the segments divided by their largest component: the squares of
    1e-23 float32 components underflowed (every weight 0) and of 1e20 overflowed."""
    points = torch.rand(6, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    segments = torch.tensor([[0, 1], [1, 2], [2, 3], [4, 5]])
    for mesh in (points[:, :2], points):
        got = curve_weights((mesh * scale).to(dtype), segments)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double() / scale, curve_weights(mesh, segments),
                                   rtol=1e-6, atol=0)


@pytest.mark.parametrize(("dtype", "scale"), [(torch.float32, 1e-23), (torch.float32, 1e20),
                                           (torch.float64, 1e-162), (torch.float64, 1e155)],
                         ids=str)
def test_mesh_weights_refuse_what_the_dtype_cannot_hold(dtype, scale):
    """Cell areas beyond the dtype's range are named, not returned as 0 or inf (the cells are
    not flat: they were called so)."""
    points, cells, _ = _random_mesh(2, 20, seed=5)
    with pytest.raises(ValueError, match=f"measures .* give vertex weights that {dtype} cannot"):
        mesh_weights((points * scale).to(dtype), cells)


def test_mesh_weights_call_flat_a_triangle_up_to_sixteen_epsilon():
    """A given cell is flat, and refused, where its area on its edges scaled to a longest
    component of 1 is at most 16 float64 epsilons (round-off of the scaled edges): a unit base
    and an apex at height h (area h / 2) is refused for h = 30 eps (area 15 eps) and kept for
    h = 34 eps (area 17 eps, vertex weights h / 6 each). A tighter tolerance accepted the
    near-flat triangle, whose weights are round-off, silently."""
    eps = torch.finfo(torch.float64).eps
    cells = torch.tensor([[0, 1, 2]])

    def triangle(h):
        return torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, h]], dtype=torch.float64)

    with pytest.raises(ValueError, match=r"cell 0 = \[0, 1, 2\] has zero area"):
        mesh_weights(triangle(30 * eps), cells)
    weights = mesh_weights(triangle(34 * eps), cells)
    torch.testing.assert_close(weights, torch.full((3,), 34 * eps / 6, dtype=torch.float64),
                               rtol=1e-12, atol=0)
    # the bound grows with the square of the longest scaled edge: edges (1, 1) and
    # (1, 1 + 54 eps), the longest √2 long, span 27 eps, under 16 eps · 2
    sliver = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0 + 54 * eps]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"cell 0 = \[0, 1, 2\] has zero area"):
        mesh_weights(sliver, cells)


@pytest.mark.parametrize(("points", "cells", "error", "match"), [
    (torch.zeros(4, 1), torch.zeros(1, 3, dtype=torch.long), TypeError, r"points: expected"),
    (torch.zeros(4, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), TypeError,
     "points: expected a floating-point"),
    (torch.rand(4, 2), torch.zeros(1, 3), TypeError, "cells: expected an integer tensor"),
    (torch.rand(4, 2), torch.zeros(1, 5, dtype=torch.long), TypeError, r"\(C, 3\) or \(C, 4\)"),
    (torch.rand(4, 2), torch.tensor([[0, 1, 2, 3]]), ValueError, "tetrahedra"),
    (torch.rand(4, 2), torch.tensor([[0, 1, 2], [1, 2, 4]]), ValueError,
     r"cell 1 = \[1, 2, 4\] has a vertex index outside \[0, 4\)"),
    (torch.rand(4, 2), torch.tensor([[0, 1, -1]]), ValueError, "outside"),
    (torch.rand(4, 2), torch.tensor([[0, 1, 2], [3, 1, 3]]), ValueError,
     r"cell 1 = \[3, 1, 3\] repeats a vertex"),
    (torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [0.0, 1.0]]),
     torch.tensor([[0, 1, 3], [0, 1, 2]]), ValueError, r"cell 1 = \[0, 1, 2\] has zero area"),
    (torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]]), torch.tensor([[0, 1, 2, 3]]),
     ValueError, "has zero volume"),
    (torch.tensor([[0.0, 0.0], [float("inf"), 0.0], [0.0, 1.0]]), torch.tensor([[0, 1, 2]]),
     ValueError, "points: expected finite"),
])
def test_mesh_weights_errors(points, cells, error, match):
    with pytest.raises(error, match=match):
        mesh_weights(points, cells)
