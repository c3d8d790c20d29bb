"""Edges of the data solvers (data/ode.py, data/burgers.py, data/kolmogorov.py) that their main
test files left open, each found by a mutant that those files let through: the frequency bound
of the controlled-ODE controls, the step bound of rk4, the batch rank of the Lorenz-63 solver,
and Burgers' default step for a flow moving left (all u < 0).  Solutions are checked against
exact ones (a Galilean-shifted Cole-Hopf solution), never against the solver's own output."""

import numpy as np
import pytest
from test_data_burgers import CASES, NU, cole_hopf

from galerkin_ext.data import ode
from galerkin_ext.data.burgers import default_n_steps, solve_burgers


def test_cde_frequencies_follow_freq_max():
    """n_j ~ U(0, freq_max): the draws reach both ends of [0, 2) and none lies above it (a
    sampler that kept the default 10 passed every other test, all of which use the default)."""
    _, freq = ode.sample_cde_control(200, seed=4, freq_max=2.0)
    assert 0 <= freq.min() < 0.02 and 1.98 < freq.max() < 2.0
    assert abs(freq.mean() - 1.0) < 0.05


def test_rk4_refuses_more_than_max_steps_steps():
    """A mistyped max_step would run for days: rk4 refuses 2e8 steps over [0, 1] at once, and
    1e8 (the bound) pass the check (checked alone: rk4 would run them)."""
    times = np.array([0.0, 1.0])
    with pytest.raises(ValueError, match=r"max_step: 5e-09 takes about 2e\+08 steps from 0 to 1, "
                                         r"more than 1e\+08"):
        ode.rk4(lambda t, y: -y, np.ones(1), times, max_step=5e-9)
    assert ode.check_max_step(1e-8, times) == 1e-8


def test_lorenz63_refuses_initial_states_of_rank_three():
    """initial is (B, 3) or (3,): a (2, 2, 3) batch is refused, not integrated into a
    (2, 2, T, 3) array that the writers would store under the wrong shape."""
    times = ode.time_grid(0.01, 0.02)
    with pytest.raises(ValueError, match=r"initial: expected shape \(B, 3\) or \(3,\), got "
                                         r"\(2, 2, 3\)"):
        ode.solve_lorenz63(np.ones((2, 2, 3)), times)


def test_burgers_flow_moving_left_against_shifted_cole_hopf():
    """u = c + v(x - c t, t) solves Burgers when v does (Galilean invariance).  With c = -5 every
    u0 < 0: the default step must follow max|u0| (about 6), not max u0 (negative, which
    default_n_steps refuses), and the solution matches the shifted exact one."""
    c, t_end = -5.0, 0.1
    x = np.arange(256) / 256
    u0 = c + cole_hopf(x, 0.0, CASES[0])
    exact = c + cole_hopf((x - c * t_end) % 1.0, t_end, CASES[0])
    assert u0.max() < 0
    u = solve_burgers(u0, NU, t_end)
    np.testing.assert_allclose(u, exact, rtol=0, atol=1e-8)  # (RK4 error: 2.4e-9)
    steps = default_n_steps(t_end, NU, float(np.abs(u0).max()))
    np.testing.assert_array_equal(u, solve_burgers(u0, NU, t_end, n_steps=steps))
