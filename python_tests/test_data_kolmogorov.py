"""Kolmogorov-flow solver (SPEC-continuum §3): exact solutions, convergence in dt, invariants,
the initial-condition sampler's covariance and seeding, spectral resampling, input checks."""

import math

import numpy as np
import pytest
import torch

from galerkin_ext.data.kolmogorov import (
    KOLMOGOROV_NU,
    cfl_number,
    initial_vorticity_eigenvalues,
    kolmogorov_tendency,
    resample_periodic,
    sample_initial_vorticity,
    solve_kolmogorov,
    velocity_from_vorticity,
)

NU = KOLMOGOROV_NU
# The sampled initial vorticity has std ~0.053; the data's states have std ~3.4 (SPEC), so the
# nonlinear tests scale it up to that size to exercise the advection term.
SCALE = 64.0


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny FFTs: on a busy machine threading costs more than it gains (~10x slower here).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def grid(s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` at ``2 pi (i, j) / s``, each ``(s, s)``, axis 0 = x."""
    x = 2 * math.pi * torch.arange(s, dtype=torch.float64) / s
    return torch.meshgrid(x, x, indexing="ij")


def sampled(n: int, s: int, seed: int, scale: float = SCALE) -> torch.Tensor:
    return scale * torch.from_numpy(sample_initial_vorticity(n, s, seed=seed))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------------------------
# Exact solutions
# ----------------------------------------------------------------------------------------------


def test_unforced_taylor_green_decays_exactly():
    # Both modes have |k|^2 = 2: psi = w / 2, so u . grad w = 0 and w(t) = w0 exp(-2 nu t).
    x, y = grid(32)
    w0 = (2 * torch.cos(x) * torch.cos(y) + 0.5 * torch.sin(x + y))[None]
    out = solve_kolmogorov(w0, 1.0, dt=0.01, forcing=False, snapshots=[0.0, 0.25, 1.0])
    assert out.shape == (1, 3, 32, 32) and out.dtype == torch.float64
    for i, t in enumerate((0.0, 0.25, 1.0)):
        err = (out[:, i] - w0 * math.exp(-2 * NU * t)).abs().max().item()
        assert err <= 1e-10, (t, err)  # measured 9e-15


def test_output_times_not_multiples_of_dt_are_hit_exactly():
    # 0.105 and 0.37 are no multiples of dt = 0.01: the steps shrink to 0.105/11 and 0.265/27.
    x, y = grid(16)
    w0 = (torch.sin(x) * torch.sin(y) - 0.3 * torch.cos(x - y))[None]
    out = solve_kolmogorov(w0, 0.5, dt=0.01, forcing=False, snapshots=[0.105, 0.37])
    for i, t in enumerate((0.105, 0.37)):
        assert (out[:, i] - w0 * math.exp(-2 * NU * t)).abs().max() <= 1e-12


@pytest.mark.parametrize(("n", "nu", "forcing"), [(4, NU, True), (4, NU, 2.5), (3, 0.05, True)])
def test_forced_shell_relaxes_to_laminar_state(n, nu, forcing):
    # Modes with |k|^2 = n^2 only: no advection; w' = -nu n^2 w - A n cos(n y), so
    # w(t) = w_s + (w0 - w_s) exp(-n^2 nu t), w_s = -A cos(n y) / (n nu).
    amp = 1.0 if forcing is True else forcing
    x, y = grid(32)
    w_s = -amp * torch.cos(n * y) / (n * nu)
    rows = [(1.3, -0.7, 2.1), (0.0, 0.0, -amp / (n * nu)), (0.0, 0.0, 0.0), (-4.0, 3.0, 10.0)]
    w0 = torch.stack([a * torch.cos(n * x) + b * torch.sin(n * y) + c * torch.cos(n * y)
                      for a, b, c in rows])
    out = solve_kolmogorov(w0, 1.0, dt=0.01, nu=nu, n=n, forcing=forcing)
    exact = w_s + (w0 - w_s) * math.exp(-(n**2) * nu * 1.0)
    err = (out - exact).abs().max().item()
    assert err <= 1e-10, err  # measured 3.6e-14 (SPEC case)
    assert (out[1] - w_s).abs().max() <= 1e-10  # the laminar state is steady


def test_velocity_and_tendency_signs():
    x, y = grid(32)
    # Laminar state: w_s = -cos(4y)/(4 nu), psi = w_s / 16, u = d_y psi = sin(4y)/(16 nu), v = 0.
    w_s = (-torch.cos(4 * y) / (4 * NU))[None]
    vel = velocity_from_vorticity(w_s)
    assert vel.shape == (1, 2, 32, 32)
    assert (vel[0, 0] - torch.sin(4 * y) / (16 * NU)).abs().max() <= 1e-12
    assert vel[0, 1].abs().max() <= 1e-12
    assert kolmogorov_tendency(w_s).abs().max() <= 1e-12
    np.testing.assert_allclose(cfl_number(w_s, 0.01).numpy(), [0.01 / (16 * NU) * 32 / (2 * np.pi)],
                               rtol=1e-12)
    # w = cos x + cos 2y: psi = cos x + cos(2y)/4, u = -sin(2y)/2, v = sin x,
    # u . grad w = (-sin 2y / 2)(-sin x) + sin x (-2 sin 2y) = -1.5 sin x sin 2y.
    w = (torch.cos(x) + torch.cos(2 * y))[None]
    vel = velocity_from_vorticity(w)
    assert (vel[0, 0] + torch.sin(2 * y) / 2).abs().max() <= 1e-12
    assert (vel[0, 1] - torch.sin(x)).abs().max() <= 1e-12
    expected = (1.5 * torch.sin(x) * torch.sin(2 * y) - NU * (torch.cos(x) + 4 * torch.cos(2 * y))
                - 4 * torch.cos(4 * y))
    assert (kolmogorov_tendency(w)[0] - expected).abs().max() <= 1e-12
    unforced = kolmogorov_tendency(w, forcing=False)[0]
    assert (unforced - expected - 4 * torch.cos(4 * y)).abs().max() <= 1e-12


# ----------------------------------------------------------------------------------------------
# Time stepping
# ----------------------------------------------------------------------------------------------


def test_dividing_dt_by_ten_changes_little():
    w0 = sampled(1, 64, seed=1)
    coarse = solve_kolmogorov(w0, 0.5, dt=0.01)
    fine = solve_kolmogorov(w0, 0.5, dt=0.001)
    assert cfl_number(fine, 0.01).max() < 1
    assert rel(coarse, fine) <= 1e-4  # measured 1.6e-5


def test_fourth_order_in_time():
    w0 = sampled(1, 32, seed=2)
    runs = [solve_kolmogorov(w0, 0.4, dt=h) for h in (0.04, 0.02, 0.01)]
    ratio = (runs[0] - runs[1]).norm() / (runs[1] - runs[2]).norm()
    assert 12 < ratio < 20, ratio  # 2^4 = 16 (measured 15.97)


def test_integrating_factor_matches_classical_rk4_on_tendency():
    # An independent integrator of the (analytically checked) tendency: plain RK4.
    w0 = sampled(2, 32, seed=3)
    h, w = 0.002, w0.clone()
    for _ in range(100):
        k1 = kolmogorov_tendency(w)
        k2 = kolmogorov_tendency(w + h / 2 * k1)
        k3 = kolmogorov_tendency(w + h / 2 * k2)
        k4 = kolmogorov_tendency(w + h * k3)
        w = w + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    out = solve_kolmogorov(w0, 0.2, dt=h)
    assert rel(out, w) <= 1e-8  # measured 7.5e-10
    assert rel(out, w0) > 0.1  # the flow did change


def test_inviscid_truncated_euler_conserves_energy_and_enstrophy():
    # The 2/3-truncated advection conserves both quadratic invariants; RK4 adds O(dt^4) drift.
    w0 = sampled(2, 32, seed=4)
    out = solve_kolmogorov(w0, 0.5, dt=0.005, nu=0.0, forcing=False, snapshots=[0.0, 0.5])
    assert rel(out[:, 1], out[:, 0]) > 0.5
    enstrophy = (out**2).mean(dim=(-2, -1))
    energy = torch.stack([(velocity_from_vorticity(out[:, i]) ** 2).sum(1).mean(dim=(-2, -1))
                          for i in range(2)], dim=1)
    assert (enstrophy[:, 1] / enstrophy[:, 0] - 1).abs().max() <= 1e-7  # measured 3e-9
    assert (energy[:, 1] / energy[:, 0] - 1).abs().max() <= 1e-7  # measured 2e-10


def test_snapshots_batches_and_dtype():
    w0 = sampled(3, 16, seed=5)
    both = solve_kolmogorov(w0, 1.0, dt=0.02, snapshots=[0.5, 1.0])
    assert both.shape == (3, 2, 16, 16)
    # The same steps in one go or split at a snapshot.
    assert torch.equal(both[:, 1], solve_kolmogorov(w0, 1.0, dt=0.02))
    assert torch.equal(both[:, 0], solve_kolmogorov(w0, 0.5, dt=0.02))
    # Rows are independent of the batch.
    torch.testing.assert_close(solve_kolmogorov(w0[1:2], 1.0, dt=0.02), both[1:2, 1],
                               rtol=0, atol=1e-12)
    # Snapshot 0 is the initial state; float32 in and out.
    first = solve_kolmogorov(w0.float(), 0.3, dt=0.02, snapshots=[0.0, 0.3], dtype=torch.float32)
    assert first.dtype == torch.float32
    torch.testing.assert_close(first[:, 0], w0.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(first[:, 1], solve_kolmogorov(w0, 0.3, dt=0.02).float(),
                               rtol=1e-4, atol=1e-4)


def test_blow_up_is_reported():
    with pytest.raises(RuntimeError, match="non-finite"):
        solve_kolmogorov(1e3 * sampled(1, 32, seed=3), 50.0, dt=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matches_cpu():
    w0 = sampled(2, 64, seed=6)
    cpu = solve_kolmogorov(w0, 0.5, dt=0.01, snapshots=[0.25, 0.5])
    gpu = solve_kolmogorov(w0.cuda(), 0.5, dt=0.01, snapshots=[0.25, 0.5])
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=1e-10)
    torch.testing.assert_close(resample_periodic(gpu, 96).cpu(), resample_periodic(cpu, 96),
                               rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Initial condition sampler
# ----------------------------------------------------------------------------------------------


def test_sampler_zero_mean_real_and_seeded_per_sample():
    w = sample_initial_vorticity(6, 32, seed=3)
    assert w.shape == (6, 32, 32) and w.dtype == np.float64 and np.isfinite(w).all()
    assert np.abs(w.mean(axis=(1, 2))).max() <= 1e-16
    # Sample i depends on (seed, i) only, not on the batch it is drawn in.
    np.testing.assert_array_equal(sample_initial_vorticity(2, 32, seed=3, start=4), w[4:])
    np.testing.assert_array_equal(sample_initial_vorticity(1, 32, seed=3, start=0), w[:1])
    assert not np.allclose(sample_initial_vorticity(1, 32, seed=4), w[:1])
    # Modes in fixed shells: the odd-grid sample is the Fourier truncation of the fine one.
    fine = torch.from_numpy(sample_initial_vorticity(2, 64, seed=3))
    coarse = sample_initial_vorticity(2, 31, seed=3)
    np.testing.assert_allclose(resample_periodic(fine, 31).numpy(), coarse, rtol=0, atol=1e-15)


def test_sampler_pointwise_variance_matches_covariance():
    # E w(x)^2 = sum_k lambda_k / (2 pi)^2, lambda_k = 7^1.5 (|k|^2 + 49)^-2.5 (modes drawn).
    s, n = 32, 400
    lam = initial_vorticity_eigenvalues(s)
    a2 = lam / (2 * np.pi) ** 2  # E |c_k|^2
    expected = a2.sum()
    # Continuous field: the modes not drawn at s = 32 (|k_i| >= 16) hold 5.5% of its variance
    # (a tail ~ s^-3), and the lattice sum is within 1% (the missing k = 0) of the R^2 integral
    # 7^1.5 / (6 pi 7^3) = 2.86e-3.
    full = initial_vorticity_eigenvalues(1001).sum() / (2 * np.pi) ** 2
    assert 0.94 < expected / full < 0.95
    assert abs(full - 7**1.5 / (6 * np.pi * 7**3)) / full < 0.011
    # Per sample the grid mean of w^2 is sum_k |c_k|^2 = sum_{pairs} a2 chi^2_2 (Parseval), whose
    # variance is sum_{pairs} 4 a2^2 = 2 sum_k a2^2: the standard error of the mean of n samples
    # is sqrt(2 sum a2^2 / n) (0.45% of the mean); allow 4 of them (measured 0.2).
    w = sample_initial_vorticity(n, s, seed=11)
    estimate = (w**2).mean()
    stderr = np.sqrt(2 * (a2**2).sum() / n)
    assert abs(estimate - expected) <= 4 * stderr, (estimate, expected, stderr)
    # Spectral shape: E |c_k|^2 / a2_k = 1 for low and high modes alike (a ratio averaged over
    # n samples has sd 1/sqrt(n) = 0.05; over >= 50 independent +-k pairs, sd <= 0.007).  A wrong
    # exponent or tau moves one band against the other by far more.
    c2 = (np.abs(np.fft.fft2(w, norm="forward")) ** 2).mean(axis=0)
    k = np.fft.fftfreq(s, 1 / s)
    kk = np.sqrt(k[:, None] ** 2 + k[None, :] ** 2)
    drawn = lam > 0
    for band in (drawn & (kk < 6), drawn & (kk > 10)):
        assert band.sum() >= 100
        assert abs((c2[band] / a2[band]).mean() - 1) < 0.03
    assert (c2[~drawn] < 1e-28).all()  # k = 0 and the Nyquist modes


# ----------------------------------------------------------------------------------------------
# Resampling
# ----------------------------------------------------------------------------------------------


def test_resample_round_trips_and_identity(gen):
    for s, big in ((16, 48), (15, 33), (16, 17), (9, 64)):
        field = torch.randn(2, 3, s, s, generator=gen, dtype=torch.float64)  # any grid field
        up = resample_periodic(field, big)
        assert up.shape == (2, 3, big, big) and up.dtype == torch.float64
        assert (resample_periodic(up, s) - field).abs().max() <= 1e-12
        # Grid values are kept where the fine grid contains the coarse one.
        if big % s == 0:
            assert (up[..., :: big // s, :: big // s] - field).abs().max() <= 1e-12
    field = torch.randn(4, 24, 24, generator=gen)
    assert resample_periodic(field, 24) is field


def test_resample_is_exact_for_band_limited_fields():
    def poly(s: int) -> torch.Tensor:  # modes |k_i| <= 8 = Nyquist of 16 (cosine only there)
        x, y = grid(s)
        return (1.5 + torch.cos(3 * x - 7 * y) + 0.25 * torch.sin(x + 5 * y)
                + 0.5 * torch.cos(8 * x) * torch.cos(8 * y) - torch.sin(2 * x) * torch.cos(8 * y))

    for size in (17, 40, 64):
        assert (resample_periodic(poly(16), size) - poly(size)).abs().max() <= 1e-12
        # Down: projection onto the coarse modes. sin(8x) terms vanish on the 16-grid anyway.
        extra = torch.sin(8 * grid(size)[0]) * torch.cos(2 * grid(size)[1])
        assert (resample_periodic(poly(size) + extra, 16) - poly(16)).abs().max() <= 1e-12
    # Non-square grids and float32.
    x = 2 * math.pi * torch.arange(12) / 12
    y = 2 * math.pi * torch.arange(20) / 20
    rect = torch.cos(x[:, None] + 2 * y[None, :]).float()
    xs, ys = grid(24)
    assert (resample_periodic(rect, 24) - torch.cos(xs + 2 * ys).float()).abs().max() <= 1e-5
    assert resample_periodic(rect, 24).dtype == torch.float32


# ----------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------

W0 = torch.zeros(1, 16, 16, dtype=torch.float64)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"omega0": torch.zeros(16, 16)}, ValueError, r"omega0: expected shape \(B, s, s\)"),
        ({"omega0": torch.zeros(1, 16, 12)}, ValueError, "omega0: expected shape"),
        ({"omega0": torch.zeros(0, 16, 16)}, ValueError, "B >= 1"),
        ({"omega0": torch.zeros(1, 3, 3)}, ValueError, "s >= 4"),
        ({"omega0": np.zeros((1, 16, 16))}, TypeError, "omega0: expected a tensor"),
        ({"omega0": torch.zeros(1, 16, 16, dtype=torch.int64)}, TypeError, "floating-point"),
        ({"omega0": torch.zeros(1, 16, 16, dtype=torch.complex128)}, TypeError, "floating"),
        ({"omega0": torch.zeros(1, 16, 16, dtype=torch.float16)}, TypeError, "float32 or float64"),
        ({"omega0": torch.full((1, 16, 16), math.nan)}, ValueError, "omega0: expected finite"),
        ({"omega0": torch.full((1, 16, 16), math.inf)}, ValueError, "omega0: expected finite"),
        ({"t_end": 0.0}, ValueError, "t_end"),
        ({"t_end": math.inf}, ValueError, "t_end"),
        ({"dt": 0.0}, ValueError, "dt: expected a finite float > 0"),
        ({"dt": -0.1}, ValueError, "dt"),
        ({"dt": "0.1"}, TypeError, "dt"),
        ({"nu": -0.01}, ValueError, "nu"),
        ({"n": 0}, ValueError, "n: expected an int >= 1"),
        ({"n": 4.0}, TypeError, "n: expected an int"),
        ({"n": 8}, ValueError, "s > 16"),
        ({"forcing": "yes"}, TypeError, "forcing"),
        ({"forcing": math.nan}, TypeError, "forcing"),
        ({"snapshots": [0.5, 0.2]}, ValueError, "snapshots: expected strictly increasing"),
        ({"snapshots": [0.2, 0.2]}, ValueError, "strictly increasing"),
        ({"snapshots": [0.5, 1.5]}, ValueError, r"snapshots\[1\].*<= 1"),
        ({"snapshots": [-0.1]}, ValueError, r"snapshots\[0\]"),
        ({"snapshots": []}, ValueError, "at least one"),
        ({"snapshots": 0.5}, TypeError, "snapshots: expected None or a sequence"),
        ({"dtype": torch.float16}, TypeError, "dtype"),
    ],
)
def test_solver_bad_input(kwargs, err, match):
    args = {"omega0": W0, "t_end": 1.0, "dt": 0.1} | kwargs
    with pytest.raises(err, match=match):
        solve_kolmogorov(args.pop("omega0"), args.pop("t_end"), **args)


def test_unforced_small_grid_and_helpers_bad_input():
    # Without forcing, s <= 2 n is fine.
    small = torch.zeros(1, 4, 4, dtype=torch.float64)
    assert solve_kolmogorov(small, 0.1, dt=0.1, forcing=False).shape == (1, 4, 4)
    with pytest.raises(ValueError, match="omega: expected finite"):
        kolmogorov_tendency(torch.full((1, 8, 8), math.nan))
    with pytest.raises(ValueError, match="omega: expected shape"):
        velocity_from_vorticity(torch.zeros(8, 8))
    with pytest.raises(ValueError, match="dt"):
        cfl_number(W0, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"n_samples": 0}, ValueError, "n_samples"),
        ({"resolution": 2}, ValueError, "resolution: expected an int >= 3"),
        ({"resolution": 16.0}, TypeError, "resolution"),
        ({"seed": -1}, ValueError, "seed"),
        ({"start": -1}, ValueError, "start"),
        ({"sigma": 0.0}, ValueError, "sigma"),
        ({"tau": -1.0}, ValueError, "tau"),
        ({"alpha": 0.0}, ValueError, "alpha"),
    ],
)
def test_sampler_bad_input(kwargs, err, match):
    args = {"n_samples": 1, "resolution": 16} | kwargs
    with pytest.raises(err, match=match):
        sample_initial_vorticity(args.pop("n_samples"), args.pop("resolution"), **args)


@pytest.mark.parametrize(
    ("field", "size", "err", "match"),
    [
        (np.zeros((8, 8)), 8, TypeError, "field: expected a tensor"),
        (torch.zeros(8), 8, ValueError, r"field: expected shape \(\.\.\., s, s\)"),
        (torch.zeros(2, 0, 8), 8, ValueError, "field: expected shape"),
        (torch.zeros(8, 8, dtype=torch.complex64), 8, TypeError, "real floating-point"),
        (torch.zeros(8, 8, dtype=torch.float16), 8, TypeError, "float32 or float64"),
        (torch.zeros(8, 8), 0, ValueError, "size: expected an int >= 1"),
        (torch.zeros(8, 8), 8.0, TypeError, "size"),
    ],
)
def test_resample_bad_input(field, size, err, match):
    with pytest.raises(err, match=match):
        resample_periodic(field, size)
