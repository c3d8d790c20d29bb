"""Kolmogorov flow (SPEC-continuum §3): the solver (exact solutions, convergence in dt,
invariants), the initial-condition sampler's covariance and seeding, spectral resampling, input
checks; the generated files (content, resampled storage, resume, command line, presets) and the
dataset (splits, normaliser, other grids, foreign files)."""

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import InterruptAt
from test_data_storage import _attrs

from galerkin_ext.data import generate as gen_mod
from galerkin_ext.data.__main__ import main
from galerkin_ext.data.datasets import KolmogorovDataset
from galerkin_ext.data.kolmogorov import (
    KOLMOGOROV_NU,
    cfl_number,
    initial_vorticity_eigenvalues,
    kolmogorov_tendency,
    persistence_errors,
    resample_periodic,
    sample_initial_vorticity,
    solve_kolmogorov,
    velocity_from_vorticity,
)
from galerkin_ext.data.storage import DataFileError, inspect_h5, partial_path, read_h5

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
    out = solve_kolmogorov(w0, 1.0, max_step=0.01, forcing=False, snapshots=[0.0, 0.25, 1.0])
    assert out.shape == (1, 3, 32, 32) and out.dtype == torch.float64
    for i, t in enumerate((0.0, 0.25, 1.0)):
        err = (out[:, i] - w0 * math.exp(-2 * NU * t)).abs().max().item()
        assert err <= 1e-10, (t, err)  # measured 9e-15


def test_output_times_not_multiples_of_dt_are_hit_exactly():
    # 0.105 and 0.37 are no multiples of dt = 0.01: the steps shrink to 0.105/11 and 0.265/27.
    x, y = grid(16)
    w0 = (torch.sin(x) * torch.sin(y) - 0.3 * torch.cos(x - y))[None]
    out = solve_kolmogorov(w0, 0.5, max_step=0.01, forcing=False, snapshots=[0.105, 0.37])
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
    out = solve_kolmogorov(w0, 1.0, max_step=0.01, nu=nu, wavenumber=n, forcing=forcing)
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


def test_nyquist_mode_has_zero_first_derivative():
    """On an even grid the Nyquist mode is the cosine (-1)^i, whose derivative (a sine)
    vanishes on the grid: w = (-1)^i cos y_j has psi = w / 17, u = d_y psi = -(-1)^i sin(y_j) / 17
    and v = -d_x psi = 0, and symmetrically for w = cos(x_i) (-1)^j. With the derivative
    i k_x (k_x = -4) kept, v picked up a Nyquist artefact, as large as u; the smooth fields of
    the other tests have no Nyquist content."""
    s = 8
    x, y = grid(s)
    sign = (-1.0) ** torch.arange(s, dtype=torch.float64)
    for w, u, v in (
        (sign[:, None] * torch.cos(y), -sign[:, None] * torch.sin(y) / 17, torch.zeros(s, s)),
        (torch.cos(x) * sign[None, :], torch.zeros(s, s), torch.sin(x) * sign[None, :] / 17),
    ):
        vel = velocity_from_vorticity(w[None])[0]
        assert (vel[0] - u).abs().max() <= 1e-15 and (vel[1] - v).abs().max() <= 1e-15
        # CFL = dt max(|u| + |v|) / h, h = 2 pi / s; max |sin| = 1 on the 8-point grid
        np.testing.assert_allclose(cfl_number(w[None], 0.1).numpy(),
                                   [0.1 / 17 / (2 * np.pi / s)], rtol=1e-12)


def test_two_thirds_rule_keeps_only_the_modes_it_computes_exactly():
    """SPEC-continuum §3's 2/3 rule keeps the modes 3 |k_x| < s and 3 |k_y| < s: on s = 12,
    |k| <= 3, whose products (|k| <= 6) alias onto none of the kept modes, so the advection is
    the exact -u . grad w of the kept field, projected on the kept modes: here against the
    product formed on a 4x finer grid. Keeping 3 |k| = s (k = 4) took the modes whose products
    alias back (4 + 4 = 8 = -4 on 12 points); a grid s not divisible by 3 never shows it."""
    s, fine = 12, 48
    gen = np.random.default_rng(7)
    w = gen.standard_normal((s, s))
    k = np.fft.fftfreq(s, 1 / s)
    kept = (3 * np.abs(k) < s)[:, None] & (3 * np.abs(k) < s)[None, :]  # |k| <= 3
    big = np.zeros((fine, fine), dtype=complex)
    idx = np.flatnonzero(3 * np.abs(k) < s)
    rows = k[idx].astype(int) % fine
    big[np.ix_(rows, rows)] = (np.fft.fft2(w) * kept)[np.ix_(idx, idx)] * (fine / s) ** 2
    kf = np.fft.fftfreq(fine, 1 / fine)
    kx, ky = kf[:, None], kf[None, :]
    k2 = np.where(kx**2 + ky**2 > 0, kx**2 + ky**2, 1.0)
    psi = big / k2
    u, v = np.fft.ifft2(1j * ky * psi).real, np.fft.ifft2(-1j * kx * psi).real
    wx, wy = np.fft.ifft2(1j * kx * big).real, np.fft.ifft2(1j * ky * big).real
    product = np.fft.fft2(-(u * wx + v * wy)) / (fine / s) ** 2
    exact = np.zeros((s, s), dtype=complex)
    exact[np.ix_(idx, idx)] = product[np.ix_(rows, rows)]
    exact = np.fft.ifft2(exact).real
    got = kolmogorov_tendency(torch.from_numpy(w)[None], nu=0.0, forcing=False)[0].numpy()
    assert np.abs(exact).max() > 0.1
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-12 * np.abs(exact).max())


# ----------------------------------------------------------------------------------------------
# Time stepping
# ----------------------------------------------------------------------------------------------


def test_dividing_dt_by_ten_changes_little():
    w0 = sampled(1, 64, seed=1)
    coarse = solve_kolmogorov(w0, 0.5, max_step=0.01)
    fine = solve_kolmogorov(w0, 0.5, max_step=0.001)
    assert cfl_number(fine, 0.01).max() < 1
    assert rel(coarse, fine) <= 1e-4  # measured 1.6e-5


def test_fourth_order_in_time():
    w0 = sampled(1, 32, seed=2)
    runs = [solve_kolmogorov(w0, 0.4, max_step=h) for h in (0.04, 0.02, 0.01)]
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
    out = solve_kolmogorov(w0, 0.2, max_step=h)
    assert rel(out, w) <= 1e-8  # measured 7.5e-10
    assert rel(out, w0) > 0.1  # the flow did change


def test_inviscid_truncated_euler_conserves_energy_and_enstrophy():
    # The 2/3-truncated advection conserves both quadratic invariants; RK4 adds O(dt^4) drift.
    w0 = sampled(2, 32, seed=4)
    out = solve_kolmogorov(w0, 0.5, max_step=0.005, nu=0.0, forcing=False, snapshots=[0.0, 0.5])
    assert rel(out[:, 1], out[:, 0]) > 0.5
    enstrophy = (out**2).mean(dim=(-2, -1))
    energy = torch.stack([(velocity_from_vorticity(out[:, i]) ** 2).sum(1).mean(dim=(-2, -1))
                          for i in range(2)], dim=1)
    assert (enstrophy[:, 1] / enstrophy[:, 0] - 1).abs().max() <= 1e-7  # measured 3e-9
    assert (energy[:, 1] / energy[:, 0] - 1).abs().max() <= 1e-7  # measured 2e-10


def test_snapshots_batches_and_dtype():
    w0 = sampled(3, 16, seed=5)
    both = solve_kolmogorov(w0, 1.0, max_step=0.02, snapshots=[0.5, 1.0])
    assert both.shape == (3, 2, 16, 16)
    # The same steps in one go or split at a snapshot.
    assert torch.equal(both[:, 1], solve_kolmogorov(w0, 1.0, max_step=0.02))
    assert torch.equal(both[:, 0], solve_kolmogorov(w0, 0.5, max_step=0.02))
    # Rows are independent of the batch.
    torch.testing.assert_close(solve_kolmogorov(w0[1:2], 1.0, max_step=0.02), both[1:2, 1],
                               rtol=0, atol=1e-12)
    # Snapshot 0 is the initial state; float32 in and out.
    first = solve_kolmogorov(w0.float(), 0.3, max_step=0.02, snapshots=[0.0, 0.3],
                             dtype=torch.float32)
    assert first.dtype == torch.float32
    torch.testing.assert_close(first[:, 0], w0.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(first[:, 1], solve_kolmogorov(w0, 0.3, max_step=0.02).float(),
                               rtol=1e-4, atol=1e-4)


def test_blow_up_is_reported():
    with pytest.raises(RuntimeError, match="non-finite"):
        solve_kolmogorov(1e3 * sampled(1, 32, seed=3), 50.0, max_step=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_matches_cpu():
    w0 = sampled(2, 64, seed=6)
    cpu = solve_kolmogorov(w0, 0.5, max_step=0.01, snapshots=[0.25, 0.5])
    gpu = solve_kolmogorov(w0.cuda(), 0.5, max_step=0.01, snapshots=[0.25, 0.5])
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
        ({"max_step": 0.0}, ValueError, "max_step: expected a finite float > 0"),
        ({"max_step": -0.1}, ValueError, "max_step"),
        ({"max_step": "0.1"}, TypeError, "max_step"),
        ({"nu": -0.01}, ValueError, "nu"),
        ({"wavenumber": 0}, ValueError, "wavenumber: expected an int >= 1"),
        ({"wavenumber": 4.0}, TypeError, "wavenumber: expected an int"),
        ({"wavenumber": 8}, ValueError,
         r"wavenumber: the forcing cos\(8 y\) needs a grid of s > 16"),
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
    args = {"omega0": W0, "t_end": 1.0, "max_step": 0.1} | kwargs
    with pytest.raises(err, match=match):
        solve_kolmogorov(args.pop("omega0"), args.pop("t_end"), **args)


def test_unforced_small_grid_and_helpers_bad_input():
    # Without forcing, s <= 2 n is fine.
    small = torch.zeros(1, 4, 4, dtype=torch.float64)
    assert solve_kolmogorov(small, 0.1, max_step=0.1, forcing=False).shape == (1, 4, 4)
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
        (torch.zeros(8), 8, ValueError, r"field: expected shape \(\.\.\., s_1, s_2\)"),
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


# ----------------------------------------------------------------------------------------------
# Data sets: generator, command line, dataset
# ----------------------------------------------------------------------------------------------

# Tiny sets: T = 0.3 (the flow has not left its initial state, which keeps the solves short;
# the physics is the solver's, tested above), 16^2 and 8^2 grids.
TINY = {"time": 0.3, "dt_out": 0.1, "progress": False}


def kolmo(path, n=5, s=16, chunk=2, **kw):
    return gen_mod.generate_kolmogorov(path, n, s, chunk_size=chunk, **{**TINY, **kw})


def reference_pairs(n, s_solve, chunk, *, seed=0, dtype=torch.float64, **kw):
    """The pairs solved chunk by chunk as the generator batches them: ``(n, 2, s, s)``."""
    parts = []
    for start in range(0, n, chunk):
        w0 = sample_initial_vorticity(min(chunk, n - start), s_solve, seed=seed, start=start)
        step = gen_mod.kolmogorov_time_step(s_solve, TINY["dt_out"])
        parts.append(solve_kolmogorov(torch.from_numpy(w0).to(dtype), 0.4, max_step=step,
                                      snapshots=[0.3, 0.4], dtype=dtype, **kw))
    return torch.cat(parts)


@pytest.fixture(scope="module")
def kolmo_file(tmp_path_factory):
    """7 pairs at 16^2 (seed 3), the dataset tests' source."""
    return kolmo(tmp_path_factory.mktemp("kolmo") / "k.h5", n=7, chunk=4, seed=3)


def test_time_step_rule():
    # SPEC-continuum: 2.5e-3 at 416^2 and 0.025 at 32^2 (§7's quick preset); dt divides dt_out.
    steps = {s: gen_mod.kolmogorov_time_step(s) for s in (16, 32, 64, 416, 832)}
    assert steps == {16: 0.05, 32: 0.025, 64: 0.1 / 7, 416: 0.1 / 40, 832: 0.1 / 80}
    assert steps[416] == 2.5e-3 and steps[832] == 1.25e-3
    assert gen_mod.kolmogorov_time_step(416, 0.05) == 2.5e-3
    assert gen_mod.kolmogorov_time_step(4, 1.0) == 0.25  # 2.5e-3 * 416 / 4 = 0.26 -> 1 / 4


def test_generated_file_and_resampled_file(tmp_path):
    fine = kolmo(tmp_path / "fine.h5", s=16, seed=3)
    info = inspect_h5(fine)
    p = info["parameters"]
    assert info["generator"] == "kolmogorov" and info["complete"] and info["seed"] == 3
    assert info["shapes"] == {"input": (5, 16, 16), "output": (5, 16, 16)}
    assert info["static"] == {"coords": (16, 16, 2)}
    assert (p["time"], p["dt_out"], p["nu"], p["wavenumber"], p["resolution"],
            p["solve_resolution"], p["max_step"], p["solve_dtype"]) == (
        0.3, 0.1, NU, 4, 16, 16, 0.05, "float64")
    assert p["domain_length"] == 2 * math.pi
    data = read_h5(fine, keys=("input", "output", "coords"))
    assert data["input"].dtype == np.float64
    ref = reference_pairs(5, 16, 2, seed=3)
    np.testing.assert_array_equal(data["input"], ref[:, 0].numpy())
    np.testing.assert_array_equal(data["output"], ref[:, 1].numpy())
    axis = np.arange(16) / 16
    np.testing.assert_array_equal(data["coords"][3, 5], [axis[3], axis[5]])
    np.testing.assert_array_equal(data["coords"][..., 0], np.broadcast_to(axis[:, None], (16, 16)))
    # statistics: those of the stored pairs, and of the solver's CFL numbers
    stats = info["statistics"]
    pers = (np.linalg.norm((data["output"] - data["input"]).reshape(5, -1), axis=1)
            / np.linalg.norm(data["output"].reshape(5, -1), axis=1))
    cfl = torch.maximum(cfl_number(ref[:, 0], 0.05), cfl_number(ref[:, 1], 0.05)).numpy()
    for name, values in (("omega_T", data["input"]), ("persistence", pers), ("cfl", cfl)):
        assert stats[name]["count"] == values.size
        # (atol: the vorticity's mean is zero up to rounding)
        np.testing.assert_allclose([stats[name]["mean"], stats[name]["std"]],
                                   [values.mean(), values.std()], rtol=1e-10, atol=1e-14)
    assert 0 < stats["cfl"]["mean"] < 1
    # Solved at 16^2, stored at 8^2: the spectral truncation of the fine file's pairs (equal
    # bit for bit here; a tolerance since the FFTs of another batch layout may round otherwise).
    coarse = kolmo(tmp_path / "coarse.h5", s=8, solve_resolution=16, seed=3)
    assert inspect_h5(coarse)["parameters"]["solve_resolution"] == 16
    small = read_h5(coarse)
    for key in ("input", "output"):
        expected = resample_periodic(torch.from_numpy(data[key]), 8).numpy()
        np.testing.assert_allclose(small[key], expected, rtol=0, atol=1e-13)
    # float32 solves are stored as float32
    single = read_h5(kolmo(tmp_path / "f32.h5", n=2, seed=3, solve_dtype="float32"))
    assert single["input"].dtype == np.float32
    np.testing.assert_allclose(single["output"], data["output"][:2], rtol=0, atol=1e-4)


def test_resume_after_interruption_gives_the_same_file(tmp_path, monkeypatch):
    reference = kolmo(tmp_path / "ref.h5", n=5, chunk=2)
    out = tmp_path / "x.h5"  # (interrupted in the second chunk)
    monkeypatch.setattr(gen_mod, "solve_kolmogorov", InterruptAt(gen_mod.solve_kolmogorov, 2))
    with pytest.raises(KeyboardInterrupt):
        kolmo(out, n=5, chunk=2)
    monkeypatch.undo()
    assert not out.exists()
    part = partial_path(out)
    info = inspect_h5(part)
    assert not info["complete"] and info["n_done"] == 2
    assert info["statistics"]["persistence"]["count"] == 2
    with pytest.raises(DataFileError, match="incomplete"):
        read_h5(part)
    with pytest.raises(FileExistsError, match="resume"):
        kolmo(out, n=5, chunk=2)
    with pytest.raises(DataFileError, match="parameters"):
        kolmo(out, n=5, chunk=2, solve_dtype="float32", resume=True)
    with pytest.raises(DataFileError, match="seed"):
        kolmo(out, n=5, chunk=2, seed=1, resume=True)
    kolmo(out, n=5, chunk=3, resume=True)  # the recorded chunk size wins
    assert not part.exists()
    keys = ("input", "output", "coords")
    a, b = read_h5(reference, keys=keys), read_h5(out, keys=keys)
    for key in keys:
        np.testing.assert_array_equal(a[key], b[key])
    assert _attrs(reference) == _attrs(out)
    with h5py.File(reference) as f, h5py.File(out) as g:
        np.testing.assert_array_equal(f["statistics"][...], g["statistics"][...])


def test_cli_generate_presets_and_errors(tmp_path, capsys, monkeypatch):
    out = tmp_path / "q.h5"
    assert main(["generate", "kolmogorov", "--preset", "quick", "--n-samples", "2",
                 "--resolution", "12", "--solve-resolution", "16", "--time", "0.3",
                 "--chunk-size", "1", "--seed", "2", "--out", str(out), "--no-progress"]) == 0
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    p = info["parameters"]
    assert info["shapes"]["input"] == [2, 12, 12] and info["seed"] == 2
    assert (p["solve_dtype"], p["solve_resolution"], p["max_step"], p["time"]) == (
        "float32", 16, 0.05, 0.3)  # the quick preset's dtype, the options given
    assert info["statistics"]["persistence"]["count"] == 2
    # what the presets and options hand to the generator
    seen = {}
    monkeypatch.setattr(gen_mod, "generate_kolmogorov",
                        lambda path, **kw: seen.update(kw) or Path(path))
    for argv, expected in (
        ([], {"n_samples": 10000, "resolution": 416, "solve_dtype": "float64", "seed": 0}),
        (["--preset", "quick"], {"n_samples": 1300, "resolution": 32, "solve_dtype": "float32"}),
        (["--preset", "zero-shot", "--resolution", "208"],
         {"n_samples": 100, "resolution": 208, "solve_resolution": 832, "seed": 1}),
        (["--preset", "zero-shot", "--seed", "5", "--max-step", "1e-3", "--nu", "0", "--device",
          "cpu", "--wavenumber", "2", "--dt-out", "0.2"],
         {"seed": 5, "max_step": 1e-3, "nu": 0.0, "device": "cpu", "wavenumber": 2, "dt_out": 0.2}),
    ):
        seen.clear()
        assert main(["generate", "kolmogorov", *argv, "--out", str(tmp_path / "m.h5")]) == 0
        assert expected.items() <= seen.items(), (argv, seen)
    monkeypatch.undo()
    capsys.readouterr()
    # a bad device fails before any file exists
    bad = tmp_path / "bad.h5"
    assert main(["generate", "kolmogorov", "--device", "foo", "--out", str(bad)]) == 1
    assert "device: expected" in capsys.readouterr().err
    assert main(["generate", "kolmogorov", "--resolution", "32", "--solve-resolution", "16",
                 "--out", str(bad)]) == 1
    assert "solve_resolution: expected >= resolution = 32" in capsys.readouterr().err
    assert not bad.exists() and not partial_path(bad).exists()
    for wrong in (["kolmogorov", "--coef", "lognormal"], ["kolmogorov", "--workers", "2"],
                  ["kolmogorov", "--t-end", "1"], ["darcy", "--time", "1"],
                  ["lorenz63", "--solve-dtype", "float32"], ["darcy", "--preset", "zero-shot"],
                  ["kolmogorov", "--solve-dtype", "float16"], ["kolmogorov", "--time", "-1"],
                  ["kolmogorov", "--dt-out", "0"], ["kolmogorov", "--preset", "tiny"],
                  # the solver's step is --max-step, as for lorenz63; --dt is a sample spacing
                  ["kolmogorov", "--dt", "1e-3"]):
        with pytest.raises(SystemExit):
            main(["generate", *wrong, "--out", str(bad)])
    assert not bad.exists() and not partial_path(bad).exists()


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"n_samples": 0}, ValueError, "n_samples"),
        ({"resolution": 3}, ValueError, "resolution: expected an int >= 4"),
        ({"resolution": 16.0}, TypeError, "resolution"),
        ({"solve_resolution": 12}, ValueError, "solve_resolution: expected >= resolution = 16"),
        ({"resolution": 6, "solve_resolution": 8}, ValueError,
         r"solve_resolution: the forcing cos\(4 y\) needs more than 8"),
        # the user gave no solve_resolution, which the message blamed
        ({"resolution": 8}, ValueError, r"^resolution: the forcing cos\(4 y\) needs more"),
        ({"solve_dtype": "float16"}, ValueError, "solve_dtype: expected 'float32' or 'float64'"),
        ({"solve_dtype": torch.float16}, ValueError, "solve_dtype"),
        ({"time": -1.0}, ValueError, "time: expected a finite float >= 0"),
        ({"dt_out": 0.0}, ValueError, "dt_out"),
        ({"max_step": math.inf}, ValueError, "max_step: expected a finite float > 0"),
        ({"nu": -0.1}, ValueError, "nu"),
        ({"wavenumber": 0}, ValueError, "wavenumber"),
        ({"seed": -1}, ValueError, "seed"),
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"device": "foo"}, ValueError, "device: expected e.g. 'cpu'"),
        ({"device": "tpu"}, ValueError, "device"),
    ],
)
def test_bad_generator_arguments_leave_no_file(tmp_path, kwargs, err, match):
    out = tmp_path / "x.h5"
    with pytest.raises(err, match=match):
        gen_mod.generate_kolmogorov(out, **{"n_samples": 2, "resolution": 16, **kwargs},
                                    progress=False)
    assert not out.exists() and not partial_path(out).exists()


def test_dataset_items_and_normaliser_fitted_on_train_only(kolmo_file):
    split = {"n_train": 4, "n_valid": 1, "n_test": 2}
    train = KolmogorovDataset(kolmo_file, "train", **split, dtype=torch.float64)
    raw = read_h5(kolmo_file)
    assert len(train) == 4 and train.resolution == 16 and train.parameters["time"] == 0.3
    item = train[1]
    assert set(item) == {"x", "grid", "target"}
    assert item["x"].shape == (16, 16, 1) and item["target"].shape == (16, 16, 1)
    np.testing.assert_array_equal(item["grid"].numpy(), read_h5(kolmo_file, keys=("coords",))
                                  ["coords"])
    # one scalar normaliser for both, over every training value of w(T) and w(T + dt_out)
    values = np.concatenate([raw["input"][:4].ravel(), raw["output"][:4].ravel()])
    for norm in (train.input_normalizer, train.target_normalizer):
        assert norm.mean.shape == ()
        np.testing.assert_allclose([norm.mean.item(), norm.std.item()],
                                   [values.mean(), values.std()], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(train.x[..., 0].numpy(),
                               (raw["input"][:4] - values.mean()) / (values.std() + 1e-5),
                               rtol=1e-12)
    # other splits fit on the training samples too (not on their own), or take the given ones
    test = KolmogorovDataset(kolmo_file, "test", **split, dtype=torch.float64)
    assert torch.equal(test.input_normalizer.mean, train.input_normalizer.mean)
    assert torch.equal(test.target_normalizer.std, train.target_normalizer.std)
    norms = {"input_normalizer": train.input_normalizer,
             "target_normalizer": train.target_normalizer}
    valid = KolmogorovDataset(kolmo_file, "valid", **split, **norms, dtype=torch.float64)
    assert len(valid) == 1 and valid.indices.tolist() == [4] and test.indices.tolist() == [5, 6]
    np.testing.assert_allclose(test.target_normalizer.decode(test.target)[..., 0].numpy(),
                               raw["output"][5:], rtol=1e-12, atol=1e-12)
    # persistence errors of the split, in physical units
    pers = test.persistence_errors()
    expected = (np.linalg.norm((raw["output"][5:] - raw["input"][5:]).reshape(2, -1), axis=1)
                / np.linalg.norm(raw["output"][5:].reshape(2, -1), axis=1))
    np.testing.assert_allclose(pers.numpy(), expected, rtol=1e-10)
    # another grid: the spectral resampling of the stored fields (a zero-shot reading)
    coarse = KolmogorovDataset(kolmo_file, "test", **split, **norms, resolution=8,
                               dtype=torch.float64)
    assert coarse[0]["x"].shape == (8, 8, 1) and coarse.grid[1, 0].tolist() == [1 / 8, 0.0]
    expected = resample_periodic(torch.from_numpy(raw["input"][5:]), 8)
    np.testing.assert_allclose(coarse.input_normalizer.decode(coarse.x)[..., 0].numpy(),
                               expected.numpy(), rtol=0, atol=1e-12)
    # a file of test samples only needs the training normalisers
    with pytest.raises(ValueError, match="fewer than n_train"):
        KolmogorovDataset(kolmo_file, "test", n_train=6, n_valid=1, n_test=2)
    # the last 7 of these samples would include training samples, normalisers given or not
    with pytest.raises(ValueError, match="so the splits would overlap"):
        KolmogorovDataset(kolmo_file, "test", n_train=6, n_valid=1, n_test=7, **norms)
    zero = KolmogorovDataset(kolmo_file, "test", n_train=0, n_valid=0, n_test=7, **norms)
    assert len(zero) == 7
    with pytest.raises(ValueError, match="n_train: 0 says the source holds test samples only"):
        KolmogorovDataset(kolmo_file, "test", n_train=0, n_valid=0, n_test=7)
    assert KolmogorovDataset(kolmo_file, "train", **split).x.dtype == torch.float32


def test_datasets_read_their_split_a_block_at_a_time(kolmo_file, monkeypatch):
    """A split is read and resampled a block of samples at a time, into arrays allocated once:
    it held every sample at the file's resolution (a paper-scale zero-shot set at 832² read at
    208 peaked at ~3.5 GB for 35 MB kept); the values are those of a whole read."""
    from galerkin_ext.data import datasets

    split = {"n_train": 5, "n_valid": 1, "n_test": 1, "resolution": 8, "dtype": torch.float64}
    whole = {name: KolmogorovDataset(kolmo_file, name, **split) for name in ("train", "test")}
    sizes = []

    def recording(path, indices=None, **kwargs):
        sizes.append(len(indices))
        return read_h5(path, indices, **kwargs)

    monkeypatch.setattr(datasets, "read_h5", recording)
    monkeypatch.setattr(datasets, "_READ_BLOCK", 2)
    for name, expected in whole.items():
        blocks = KolmogorovDataset(kolmo_file, name, **split)
        assert torch.equal(blocks.x, expected.x) and torch.equal(blocks.target, expected.target)
    assert sizes and max(sizes) == 2


def test_dataset_refuses_other_files(tmp_path, kolmo_file):
    darcy = gen_mod.generate_darcy(tmp_path / "d.h5", 2, 9, coef="lognormal", workers=1,
                                   progress=False)
    with pytest.raises(DataFileError, match="holds darcy data, expected kolmogorov"):
        KolmogorovDataset(darcy, "train", n_train=1, n_valid=0, n_test=1)
    with pytest.raises(FileNotFoundError, match="no such file"):
        KolmogorovDataset(tmp_path / "none.h5")
    with pytest.raises(ValueError, match="split"):
        KolmogorovDataset(kolmo_file, "training", n_train=4, n_valid=1, n_test=2)
    with pytest.raises(ValueError, match="resolution"):
        KolmogorovDataset(kolmo_file, n_train=4, n_valid=1, n_test=2, resolution=2)
    from galerkin_ext.data import ContinuumDarcyDataset

    with pytest.raises(DataFileError, match="holds kolmogorov data, expected darcy"):
        ContinuumDarcyDataset(kolmo_file, n_train=4, n_valid=1, n_test=2)


def test_reference_trajectories_continue_the_stored_pairs(kolmo_file, tmp_path):
    """Solved from the stored w(T) with the file's physics: step 1 is the stored w(T + dt_out)
    (the file was solved on its grid), step k the solver's k dt_out from there; a file solved
    on a finer grid than it stores is solved there again and resampled."""
    test = KolmogorovDataset(kolmo_file, "test", n_train=4, n_valid=1, n_test=2,
                             dtype=torch.float64)
    traj = test.reference_trajectories(3)
    assert traj.shape == (2, 3, 16, 16) and traj.dtype == torch.float64
    stored = test.target_normalizer.decode(test.target[..., 0])
    torch.testing.assert_close(traj[:, 0], stored, rtol=1e-10, atol=1e-10)
    w0 = test.input_normalizer.decode(test.x[..., 0])
    want = solve_kolmogorov(w0, 0.3, max_step=gen_mod.kolmogorov_time_step(16, TINY["dt_out"]),
                            snapshots=[0.1, 0.2, 0.3])
    torch.testing.assert_close(traj, want, rtol=1e-12, atol=1e-12)
    assert test.reference_trajectories(2, count=1).shape == (1, 2, 16, 16)
    with pytest.raises(ValueError, match="count: expected at most the 2 samples"):
        test.reference_trajectories(2, count=3)
    with pytest.raises(ValueError, match="steps: expected an int >= 1"):
        test.reference_trajectories(0)
    # stored at 8^2, solved at 16^2 (8^2 cannot hold the forcing cos(4y)): solved at 16^2
    coarse = kolmo(tmp_path / "c.h5", n=3, s=8, solve_resolution=16)
    ds = KolmogorovDataset(coarse, "test", n_train=0, n_valid=0, n_test=3,
                           **{k: getattr(test, k) for k in ("input_normalizer",
                                                            "target_normalizer")},
                           dtype=torch.float64)
    traj = ds.reference_trajectories(2)
    assert traj.shape == (3, 2, 8, 8)
    stored = ds.target_normalizer.decode(ds.target[..., 0])
    assert float((traj[:, 0] - stored).norm() / stored.norm()) < 1e-2  # the modes 8^2 lost


def test_reference_trajectories_on_a_finer_grid_take_a_proportionally_smaller_step(kolmo_file):
    """The recorded step keeps the CFL number below 1 on the file's 16^2 solver grid; read at
    32^2, the trajectories are solved there with half of it (recorded * 16 / 32). The recorded
    step on any grid (twice the CFL number on a grid twice as fine) keeps these small states
    stable: only the solution's time error shows it, 7e-9 here, far above the solver's
    round-off."""
    split = {"n_train": 4, "n_valid": 1, "n_test": 2, "dtype": torch.float64}
    fine = KolmogorovDataset(kolmo_file, "test", resolution=32, **split)
    traj = fine.reference_trajectories(2)
    assert traj.shape == (2, 2, 32, 32)
    w0 = fine.input_normalizer.decode(fine.x[..., 0])
    step = gen_mod.kolmogorov_time_step(16, TINY["dt_out"])  # the recorded one, 0.05
    assert fine.parameters["max_step"] == step == 0.05
    want = solve_kolmogorov(w0, 0.2, max_step=step / 2, snapshots=[0.1, 0.2])
    torch.testing.assert_close(traj, want, rtol=1e-12, atol=1e-12)
    coarse_step = solve_kolmogorov(w0, 0.2, max_step=step, snapshots=[0.1, 0.2])
    assert (coarse_step - want).abs().max() > 1e-9


def test_files_recording_dt_still_roll_out(kolmo_file, tmp_path):
    """Files written before the solver step was named max_step record it as 'dt'."""
    old = tmp_path / "old.h5"
    shutil.copy(kolmo_file, old)
    with h5py.File(old, "r+") as f:
        parameters = json.loads(f.attrs["parameters"])
        parameters["dt"] = parameters.pop("max_step")
        f.attrs["parameters"] = json.dumps(parameters, sort_keys=True)
    split = {"n_train": 4, "n_valid": 1, "n_test": 2, "dtype": torch.float64}
    assert torch.equal(KolmogorovDataset(old, "test", **split).reference_trajectories(2),
                       KolmogorovDataset(kolmo_file, "test", **split).reference_trajectories(2))


def test_persistence_errors():
    """||w_out - w_in|| / ||w_out|| per sample, in float64, from grids of any dtype."""
    w = torch.randn(3, 5, 4, dtype=torch.float32)
    errors = persistence_errors(w, 2 * w)
    assert errors.dtype == torch.float64 and errors.shape == (3,)
    torch.testing.assert_close(errors, torch.full((3,), 0.5, dtype=torch.float64))
    assert persistence_errors(w, w).abs().max() == 0
    with pytest.raises(ValueError, match="w_in, w_out: expected two tensors"):
        persistence_errors(w, w[:, :4])
    zero = w.clone()
    zero[1] = 0  # (was inf)
    with pytest.raises(ValueError, match="w_out: sample 1 is zero everywhere"):
        persistence_errors(w, zero)
