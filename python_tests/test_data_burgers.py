"""Burgers solver: exact Cole-Hopf solutions, truncated solve, input handling."""

import math

import numpy as np
import pytest
import torch

from galerkin_ext.data.burgers import etdrk4_coefficients, solve_burgers
from galerkin_ext.data.random_fields import sample_periodic_grf_1d

NU = 0.1


def cole_hopf(x: np.ndarray, t: float, modes: list[tuple[float, float]], c0: float = 1.0):
    """u = -2 nu phi_x / phi with phi = c0 + sum_k b_k e^{-nu (2 pi k)^2 t} cos(2 pi k x + th_k)."""
    phi = np.full_like(x, c0)
    dphi = np.zeros_like(x)
    for k, (b, th) in enumerate(modes, start=1):
        decay = b * np.exp(-NU * (2 * np.pi * k) ** 2 * t)
        phi += decay * np.cos(2 * np.pi * k * x + th)
        dphi -= decay * 2 * np.pi * k * np.sin(2 * np.pi * k * x + th)
    assert phi.min() > 0
    return -2 * NU * dphi / phi


CASES = [
    [(0.6, 0.3), (0.25, 1.0), (0.1, 2.0)],
    [(0.9, 0.0)],  # steep: |u0| up to 2.6
    [(0.3, 0.1), (0.3, 2.0), (0.2, 0.5), (0.15, 1.0)],
]


def test_cole_hopf_exact_solutions_1024_points():
    x = np.arange(1024) / 1024
    u0 = np.stack([cole_hopf(x, 0.0, m) for m in CASES])
    exact = np.stack([cole_hopf(x, 1.0, m) for m in CASES])
    u = solve_burgers(u0, nu=NU, t_end=1.0)
    rel = np.linalg.norm(u - exact, axis=1) / np.linalg.norm(exact, axis=1)
    assert rel.max() <= 1e-8, rel


def test_fourth_order_in_time():
    x = np.arange(256) / 256
    u0 = cole_hopf(x, 0.0, CASES[0])
    exact = cole_hopf(x, 0.5, CASES[0])
    errs = [np.abs(solve_burgers(u0, NU, 0.5, n_steps=s) - exact).max() for s in (25, 50)]
    assert 12 < errs[0] / errs[1] < 20  # 2^4 = 16


def test_truncated_solve_matches_full_solve():
    """SPEC §4 at the data set's sizes: 8192 points solved on the generator's default 1024
    (512 modes) and zero-padded agree with the full solve to 1e-14 (inputs of size O(1))."""
    u0 = sample_periodic_grf_1d(2, 8192, seed=3)
    full = solve_burgers(u0)
    trunc = solve_burgers(u0, solve_resolution=1024)
    # Only the GRF's high modes (amplitude ~1e-6, damped within ~1e-5 time) differ.
    assert np.abs(u0).max() > 0.5 and np.abs(trunc - full).max() < 1e-14


def test_truncated_solve_drops_the_solve_grids_nyquist_mode():
    """solve_resolution = 8 on 16 points: the 8-point grid's Nyquist mode k = 4 is dropped
    (its sine part is not representable there; _truncate's docstring), so a field plus
    cos(2 pi 4 x) solves like the field alone. Keeping it (modes 0..4 instead of 0..3) carried
    the cosine through the solve and back at its full size: an O(1e-3) difference that the
    8192-point comparison cannot see (the GRF is negligible at the mode 512)."""
    x = np.arange(16) / 16
    low = 1e-3 * np.sin(2 * np.pi * x)
    nyquist = 1e-3 * np.cos(2 * np.pi * 4 * x)
    alone = solve_burgers(low, NU, 1e-3, n_steps=1, solve_resolution=8)
    with_nyquist = solve_burgers(low + nyquist, NU, 1e-3, n_steps=1, solve_resolution=8)
    np.testing.assert_allclose(with_nyquist, alone, rtol=0, atol=1e-15)
    assert np.abs(alone).max() > 9e-4  # the mode below the Nyquist one is kept
    assert np.abs(solve_burgers(nyquist, NU, 1e-3, n_steps=1, solve_resolution=8)).max() < 1e-15


def test_default_step_count_grows_with_the_initial_fields_size():
    """The default step is dt = 1e-3 * min(1, 2 / max|u0|) at nu = 0.1 (default_n_steps: the
    advective time scale shrinks like 1 / max|u0|): 1000 steps per unit time for |u0| <= 2,
    3000 for |u0| = 6. A solve_burgers that took the count for |u0| <= 2 whatever its input
    (not passing max|u0| on) would step 3x too long where the SPEC's data (|u0| <~ 2) never
    shows it."""
    from galerkin_ext.data.burgers import default_n_steps

    assert default_n_steps(1.0, 0.1, 1.0) == 1000 and default_n_steps(1.0, 0.1, 6.0) == 3000
    x = np.arange(64) / 64
    u0 = 6.0 * np.sin(2 * np.pi * x)
    np.testing.assert_array_equal(solve_burgers(u0, NU, 0.05),
                                  solve_burgers(u0, NU, 0.05, n_steps=150))


def test_torch_input_keeps_type_shape_dtype():
    x = np.arange(128) / 128
    u0 = cole_hopf(x, 0.0, CASES[0])
    ref = solve_burgers(u0[None], n_steps=200)
    out = solve_burgers(torch.tensor(u0, dtype=torch.float32), n_steps=200)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (128,)
    np.testing.assert_allclose(out.numpy(), ref[0], atol=1e-6)
    out64 = solve_burgers(torch.from_numpy(u0[None]), n_steps=200)
    assert out64.dtype == torch.float64
    np.testing.assert_allclose(out64.numpy(), ref, rtol=0, atol=1e-15)


def test_batch_rows_are_independent():
    u0 = sample_periodic_grf_1d(3, 256, seed=1)
    batch = solve_burgers(u0, n_steps=100)
    single = solve_burgers(u0[1:2], n_steps=100)
    np.testing.assert_allclose(batch[1:2], single, atol=1e-14)


def test_etdrk4_coefficients_limits():
    lin = torch.tensor([0.0, -1e-12, -1.0, -1e6], dtype=torch.float64)
    e, e2, q, f1, f2, f3 = etdrk4_coefficients(lin, 0.1)
    # At L = 0 the scheme is classical RK4: Q = h/2, f1 = h/6, f2 = h/6, f3 = h/6.
    np.testing.assert_allclose([q[0], f1[0], f2[0], f3[0]], [0.05, 0.1 / 6, 0.1 / 6, 0.1 / 6],
                               rtol=1e-13)
    np.testing.assert_allclose(q[1], 0.05, rtol=1e-10)
    z = -0.1
    np.testing.assert_allclose(q[2], 0.1 * (np.exp(z / 2) - 1) / z, rtol=1e-13)
    assert torch.isfinite(torch.stack([q, f1, f2, f3])).all() and e[3] == 0
    # an integer operator came back as integer zeros (computed in float64, cast back)
    with pytest.raises(TypeError, match="lin: expected a real floating-point 1-D tensor"):
        etdrk4_coefficients(torch.tensor([-1, -2]), 0.1)
    with pytest.raises(ValueError, match="lin: expected finite entries"):
        etdrk4_coefficients(torch.tensor([-1.0, math.nan]), 0.1)


@pytest.mark.parametrize("m", [96, 99])
def test_two_thirds_rule_keeps_no_mode_its_products_alias_onto(m):
    """cos(2 pi k x) with 3k = m: its square holds the modes 0 and 2k = m - k, which the grid
    of m points aliases onto k itself. With the mode kept (k <= m/3 was kept) it drove itself;
    de-aliased, it only decays, exp(-nu (2 pi k)^2 t)."""
    k, nu, t = m // 3, 0.1, 1e-4
    x = np.arange(m) / m
    u0 = 0.01 * np.cos(2 * np.pi * k * x)
    u = solve_burgers(u0[None], nu, t, n_steps=1)[0]
    decay = np.exp(-nu * (2 * np.pi * k) ** 2 * t)
    np.testing.assert_allclose(u, u0 * decay, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"u0": np.zeros((2, 2, 8))}, ValueError, "shape"),
        ({"u0": np.zeros((1, 2))}, ValueError, "at least 4"),
        ({"u0": np.full((1, 8), np.nan)}, ValueError, "finite"),
        ({"u0": [0.0] * 8}, TypeError, "numpy.ndarray or torch.Tensor"),
        ({"u0": np.zeros((1, 8)), "nu": 0.0}, ValueError, "nu"),
        ({"u0": np.zeros((1, 8)), "t_end": -1.0}, ValueError, "t_end"),
        ({"u0": np.zeros((1, 8)), "solve_resolution": 16}, ValueError, "solve_resolution"),
        ({"u0": np.zeros((1, 8)), "n_steps": 0}, ValueError, "n_steps"),
        ({"u0": np.zeros((1, 8), dtype=complex)}, TypeError, "real"),
    ],
)
def test_bad_input(kwargs, err, match):
    with pytest.raises(err, match=match):
        solve_burgers(**kwargs)


def test_a_diverging_solve_stops_its_generation(tmp_path):
    """Too few steps for a small viscosity: the solution was NaN, published as a complete file
    (the other solvers raise SolverError, which removes the partial file)."""
    from galerkin_ext.data.generate import generate_burgers
    from galerkin_ext.data.storage import SolverError, partial_path

    with pytest.raises(SolverError, match="n_steps = 5 is too few for nu = 0.001"):
        solve_burgers(sample_periodic_grf_1d(2, 256, seed=0), 1e-3, n_steps=5)
    out = tmp_path / "b.h5"
    with pytest.raises(SolverError):
        generate_burgers(out, n_samples=2, resolution=256, solve_resolution=256, nu=1e-3,
                         n_steps=5, progress=False)
    assert not out.exists() and not partial_path(out).exists()


def test_generated_sets_take_the_solvers_step_rule(tmp_path):
    """generate_burgers took dt = 1e-3 whatever nu: at nu = 0.01 its steps were those of nu =
    0.1. It takes default_n_steps for |u0| <= 2 (the same in every chunk); 1000 at the SPEC's
    nu = 0.1, t_end = 1, as before."""
    from galerkin_ext.data.burgers import default_n_steps
    from galerkin_ext.data.generate import generate_burgers
    from galerkin_ext.data.storage import inspect_h5, read_h5

    assert default_n_steps(1.0, 0.1) == 1000 and default_n_steps(0.7, 0.1) == 700
    assert default_n_steps(1.0, 0.01) == math.ceil(1000 * math.sqrt(10) - 1e-6)
    out = generate_burgers(tmp_path / "b.h5", n_samples=2, resolution=64, nu=0.01,
                           chunk_size=1, progress=False)
    assert inspect_h5(out)["parameters"]["n_steps"] == default_n_steps(1.0, 0.01)
    data = read_h5(out, np.arange(2))
    np.testing.assert_allclose(data["u"], solve_burgers(data["a"], 0.01, n_steps=3163),
                               rtol=0, atol=1e-13)


def test_a_zero_initial_condition_stays_zero():
    """u0 = 0 is the exact solution u = 0 (it was refused, naming u_max, which the caller never
    passed)."""
    np.testing.assert_array_equal(solve_burgers(np.zeros((2, 16))), np.zeros((2, 16)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matches_cpu():
    u0 = torch.from_numpy(sample_periodic_grf_1d(4, 1024, seed=0))
    cpu = solve_burgers(u0, n_steps=200)
    gpu = solve_burgers(u0.cuda(), n_steps=200)
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-12, rtol=0)
