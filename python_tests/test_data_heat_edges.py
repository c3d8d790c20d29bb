"""data/heat.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import dataclasses

import numpy as np
import pytest

from galerkin_ext.data.heat import (
    check_heat_theta,
    heat_mesh,
    sample_heat_parameters,
    solve_heat,
    top_temperature,
)

THETA = np.array([3.0] * 6 + [6.0] * 6)


@pytest.fixture(scope="module")
def mesh():
    return heat_mesh(THETA, 1.0)


def test_theta_that_is_no_array_of_finite_heights_is_refused():
    with pytest.raises(ValueError, match=r"^theta: expected 12 real knot heights, shape \(12,\), "
                                         r"got 'abc'"):
        check_heat_theta("abc")
    with pytest.raises(ValueError, match="^theta: expected 12 real knot heights"):
        check_heat_theta([[1.0, 2.0], [3.0]])  # ragged
    bad = THETA.copy()
    bad[4] = np.nan
    with pytest.raises(ValueError, match="^theta: expected finite knot heights$"):
        check_heat_theta(bad)


def test_sample_heat_parameters_needs_a_generator():
    with pytest.raises(TypeError, match="^rng: expected a numpy.random.Generator, got int"):
        sample_heat_parameters(0)


def test_top_temperature_needs_nine_coefficients():
    with pytest.raises(ValueError, match=r"^coefficients: expected shape \(9,\), got \(8,\)"):
        top_temperature(np.linspace(0, 9, 5), np.zeros(8))


def test_solve_heat_checks_the_mesh_and_conductivity(mesh):
    with pytest.raises(TypeError, match=r"^mesh: expected a labelled TriMesh \(from heat_mesh\)"):
        solve_heat(mesh.points, top=1.0)
    with pytest.raises(TypeError, match=r"^mesh: expected a labelled TriMesh"):
        solve_heat(dataclasses.replace(mesh, labels=None), top=1.0)
    labels = mesh.labels.copy()
    labels[0] = 3
    with pytest.raises(ValueError, match="^mesh: expected subdomain labels 0, 1, 2$"):
        solve_heat(dataclasses.replace(mesh, labels=labels), top=1.0)
    with pytest.raises(ValueError, match=r"^conductivity: expected positive values, got "
                                         r"\(1.0, 0.0, 10.0\)"):
        solve_heat(mesh, top=1.0, conductivity=(1.0, 0.0, 10.0))


def test_solve_heat_needs_matching_side_vertices(mesh):
    points = mesh.points.copy()
    left = np.flatnonzero((points[:, 0] == 0.0) & (points[:, 1] > 0.5) & (points[:, 1] < 8.5))
    points[left[0], 1] += 1e-3  # no longer at the height of its partner on x = 9
    with pytest.raises(ValueError, match=r"^mesh: the sides x = 0 and x = 9 must have the same "
                                         r"vertex heights"):
        solve_heat(dataclasses.replace(mesh, points=points), top=1.0)
