"""data/elasticity.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import numpy as np
import pytest

from galerkin_ext.data.elasticity import elasticity_mesh, sample_cavity, solve_elasticity, von_mises


@pytest.fixture(scope="module")
def mesh():
    return elasticity_mesh(None, 0.25)


def _bottom(x, y):
    return np.abs(y) <= 1e-12


def test_sample_cavity_needs_a_generator():
    with pytest.raises(TypeError, match="^rng: expected a numpy.random.Generator, got "
                                        "RandomState"):
        sample_cavity(np.random.RandomState(0))


def test_refining_needs_a_cavity():
    with pytest.raises(ValueError, match=r"^refine: there is no cavity to refine near "
                                         r"\(coefficients is None\)"):
        elasticity_mesh(None, 0.25, refine=True)


def test_von_mises_needs_three_stress_components():
    with pytest.raises(ValueError, match=r"^stress: expected shape \(\.\.\., 3\), got \(4, 2\)"):
        von_mises(np.zeros((4, 2)))


def test_solve_elasticity_checks_its_arguments(mesh):
    fix = [(_bottom, None, 0.0)]
    with pytest.raises(TypeError, match="^mesh: expected a TriMesh, got ndarray"):
        solve_elasticity(mesh.points, dirichlet=fix)
    with pytest.raises(TypeError, match=r"^dirichlet: expected a sequence of \(where, component, "
                                        r"value\) triples"):
        solve_elasticity(mesh, dirichlet=(_bottom, None, 0.0))  # one triple, not a list of them
    with pytest.raises(TypeError, match=r"^traction\[1\]: expected a \(where, \(t_x, t_y\)\) "
                                        r"pair"):
        solve_elasticity(mesh, dirichlet=fix, traction=[(_bottom, (0.0, 1.0)), [_bottom, (0, 1)]])
    with pytest.raises(TypeError, match=r"^dirichlet\[1\]: expected a \(where, component, value\) "
                                        r"triple"):
        solve_elasticity(mesh, dirichlet=[*fix, (_bottom, 0)])
    with pytest.raises(ValueError, match=r"^dirichlet\[0\]: component must be 0, 1 or None, got "
                                         r"2"):
        solve_elasticity(mesh, dirichlet=[(_bottom, 2, 0.0)])
