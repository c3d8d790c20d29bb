"""Darcy solver: manufactured solutions (2nd order), SPD matrix, batching, input checks."""

import numpy as np
import pytest
import scipy.sparse.linalg as spla
import torch

from galerkin_ext.data.darcy import assemble_darcy_matrix, solve_darcy
from galerkin_ext.data.random_fields import sample_darcy_coefficient

PI = np.pi


def manufactured(k: int):
    """Exact u = e^x sin(pi x) sin(2 pi y), smooth a > 0, and f = -div(a grad u)."""
    x = np.linspace(0, 1, k)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    s, c = np.sin(PI * xx), np.cos(PI * xx)
    sy, cy = np.sin(2 * PI * yy), np.cos(2 * PI * yy)
    u = np.exp(xx) * s * sy
    ux = np.exp(xx) * (PI * c + s) * sy
    uxx = np.exp(xx) * (-(PI**2) * s + 2 * PI * c + s) * sy
    uy = np.exp(xx) * s * 2 * PI * cy
    uyy = -4 * PI**2 * u
    a = 1 + xx * yy + 0.5 * np.sin(2 * PI * xx) * np.cos(3 * PI * yy)
    ax = yy + PI * np.cos(2 * PI * xx) * np.cos(3 * PI * yy)
    ay = xx - 1.5 * PI * np.sin(2 * PI * xx) * np.sin(3 * PI * yy)
    f = -(ax * ux + a * uxx + ay * uy + a * uyy)
    return a, f, u


def test_manufactured_solution_second_order():
    errors = []
    for k in (17, 33, 65):
        a, f, u = manufactured(k)
        uh = solve_darcy(a, f)
        assert np.array_equal(uh[[0, -1], :], np.zeros((2, k)))
        assert np.array_equal(uh[:, [0, -1]], np.zeros((k, 2)))
        errors.append(np.abs(uh - u).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all((orders > 1.9) & (orders < 2.1)), (errors, orders)
    assert errors[-1] < 2e-3


def test_matrix_is_symmetric_positive_definite():
    a = sample_darcy_coefficient(1, 12, seed=5)[0]
    mat = assemble_darcy_matrix(a)
    assert mat.shape == (100, 100)
    dense = mat.toarray()
    assert np.array_equal(dense, dense.T)
    assert np.linalg.eigvalsh(dense).min() > 0
    np.linalg.cholesky(dense)
    # Row sums are zero away from the boundary: constants are in the kernel of the stencil.
    assert abs(dense[44].sum()) < 1e-9 * abs(dense[44, 44])


def test_constant_coefficient_matches_dense_solve_and_scaling():
    k = 15
    u1 = solve_darcy(np.ones((k, k)))
    u4 = solve_darcy(np.full((k, k), 4.0), f=np.full((k, k), 2.0))
    np.testing.assert_allclose(u4, u1 / 2, rtol=1e-12)
    mat = assemble_darcy_matrix(np.ones((k, k))).toarray()
    ref = np.linalg.solve(mat, np.ones((k - 2) ** 2)).reshape(k - 2, k - 2)
    np.testing.assert_allclose(u1[1:-1, 1:-1], ref, rtol=1e-12)
    # Symmetry of the square is kept, and the maximum of -lap u = 1 is ~0.0737.
    np.testing.assert_allclose(u1, u1.T, atol=1e-15)
    assert abs(u1.max() - 0.0737) < 2e-3


def test_batch_workers_and_torch_input(monkeypatch):
    a = sample_darcy_coefficient(3, 21, seed=2)
    # a batch solves in this process by default: it started a pool of spawned processes on
    # every call (seconds each), which a plain script without a __main__ guard cannot start
    import galerkin_ext.data.darcy as darcy_module

    with monkeypatch.context() as patched:
        patched.setattr(darcy_module, "darcy_executor", lambda *args: pytest.fail("a pool"))
        serial = solve_darcy(a)
    np.testing.assert_array_equal(serial, solve_darcy(a, workers=1))
    parallel = solve_darcy(a, workers=2)
    assert serial.shape == (3, 21, 21)
    np.testing.assert_array_equal(serial, parallel)
    single = solve_darcy(a[1])
    np.testing.assert_array_equal(single, serial[1])
    out = solve_darcy(torch.from_numpy(a[:2]), workers=1)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 21, 21)
    np.testing.assert_array_equal(out.numpy(), serial[:2])
    residual = assemble_darcy_matrix(a[0]) @ serial[0, 1:-1, 1:-1].ravel() - 1.0
    assert np.abs(residual).max() < 1e-10
    assert np.linalg.norm(residual) < 1e-12 * spla.norm(assemble_darcy_matrix(a[0])) * 21


def test_solution_magnitude_in_spec_range():
    a = sample_darcy_coefficient(8, 85, seed=0)
    u = solve_darcy(a, workers=1)
    peak = u.max(axis=(1, 2))
    assert 0.010 < peak.mean() < 0.018  # SPEC: max u ~ 0.014
    assert u.min() >= 0  # maximum principle for f = 1 >= 0


def test_generator_task_solves_with_the_recorded_source():
    """The generator's worker task (sample_and_solve) solves -div(a grad u) = f with the f its
    parameters record: with f = 2 the sample is solve_darcy(a, 2), twice the f = 1 one. A task
    that used f = 1 whatever generate_darcy(f=...) recorded passed the tests' files, all at
    the default f = 1."""
    from galerkin_ext.data.darcy import sample_and_solve

    params = {"alpha": 2.0, "tau": 3.0, "high": 12.0, "low": 3.0, "f": 2.0}
    a, u = sample_and_solve((0, 4, 17, params))
    np.testing.assert_array_equal(
        a, sample_darcy_coefficient(1, 17, seed=0, start=4, alpha=2.0, tau=3.0, high=12.0,
                                    low=3.0)[0])
    np.testing.assert_allclose(u, solve_darcy(a, 2.0), rtol=1e-12, atol=0)
    np.testing.assert_allclose(u, 2 * solve_darcy(a, 1.0), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "err", "match"),
    [
        ((np.ones((4, 5)),), {}, ValueError, r"\(K, K\)"),
        ((np.ones((2, 2)),), {}, ValueError, "K >= 3"),
        ((-np.ones((5, 5)),), {}, ValueError, "positive"),
        ((np.ones((5, 5)),), {"f": np.ones((4, 4))}, ValueError, "f must be"),
        ((np.ones((5, 5)),), {"f": np.nan}, ValueError, "f must be finite"),
        # named, not numpy's "could not convert string to float"
        ((np.ones((5, 5)),), {"f": "x"}, TypeError, "f must be a real scalar"),
        ((np.ones((5, 5)),), {"f": 1j}, TypeError, "f must be a real scalar"),
        ((np.ones((5, 5)),), {"f": None}, TypeError, "f must be a real scalar"),
        (([[1.0]],), {}, TypeError, "numpy.ndarray or torch.Tensor"),
        ((np.ones((2, 5, 5)),), {"workers": 0}, ValueError, "workers"),
        ((np.ones((0, 5, 5)),), {}, ValueError, "at least one sample"),
    ],
)
def test_bad_input(args, kwargs, err, match):
    with pytest.raises(err, match=match):
        solve_darcy(*args, **kwargs)


def test_bad_sample_is_named():
    a = np.ones((3, 5, 5))
    a[2, 1, 1] = 0.0
    with pytest.raises(ValueError, match=r"a\[2\]"):
        solve_darcy(a, workers=1)
