"""Random fields: spectrum, variance, thresholding statistics, determinism."""

import numpy as np
import pytest

from galerkin_ext.data import random_fields as rf


def test_periodic_field_variance_and_spectrum():
    n = 1024
    u = rf.sample_periodic_grf_1d(400, n, seed=7)
    amp = rf.periodic_grf_1d_amplitudes((n - 1) // 2)
    expected_var = np.sum(amp**2)  # each cos/sin pair contributes c_k^2
    assert abs(u.var() / expected_var - 1) < 0.1
    assert 0.5 < np.sqrt(expected_var) < 0.65  # SPEC: std(u0) ~ 0.57
    assert abs(u.mean()) < 0.05
    power = (np.abs(np.fft.rfft(u, axis=-1)) ** 2).mean(axis=0)
    k = np.arange(20, 400)
    slope = np.polyfit(np.log(k), np.log(power[k]), 1)[0]
    assert abs(slope + 4) < 0.1  # |c_k|^2 ~ k^(-2 gamma), gamma = 2
    # Each mode's power matches its amplitude: E|U_k|^2 = (N/2)^2 * 2 c_k^2.
    ratio = power[1:50] / ((n / 2) ** 2 * 2 * amp[:49] ** 2)
    assert abs(ratio.mean() - 1) < 0.05


@pytest.mark.parametrize("n", [16, 17])
def test_periodic_field_has_every_mode_below_nyquist_and_none_at_it(n):
    """Modes 1 <= k < N/2 with power (N/2)^2 2 c_k^2 each; none at k = 0 or at Nyquist (a cosine
    alone there, its sine vanishing on the grid, would break the cos/sin pairs' isotropy)."""
    u = rf.sample_periodic_grf_1d(4000, n, seed=5)
    spectrum = np.fft.rfft(u, axis=-1)
    amp = rf.periodic_grf_1d_amplitudes((n - 1) // 2)
    assert np.abs(spectrum[:, 0]).max() < 1e-12
    if n % 2 == 0:
        assert np.abs(spectrum[:, n // 2]).max() < 1e-12
    power = (np.abs(spectrum[:, 1 : (n - 1) // 2 + 1]) ** 2).mean(axis=0)
    np.testing.assert_allclose(power / ((n / 2) ** 2 * 2 * amp**2), 1.0, atol=0.1)


def test_periodic_field_is_deterministic_and_chunk_independent():
    a = rf.sample_periodic_grf_1d(6, 64, seed=3)
    np.testing.assert_array_equal(a, rf.sample_periodic_grf_1d(6, 64, seed=3))
    np.testing.assert_array_equal(a[2:5], rf.sample_periodic_grf_1d(3, 64, seed=3, start=2))
    assert not np.allclose(a, rf.sample_periodic_grf_1d(6, 64, seed=4))
    fine = rf.sample_periodic_grf_1d(2, 256, seed=3)
    coarse_modes = np.fft.rfft(a[:2])[:, :31] / 64
    np.testing.assert_allclose(np.fft.rfft(fine)[:, :31] / 256, coarse_modes, atol=1e-14)


def test_neumann_field_matches_direct_cosine_sum():
    k = 11
    field = rf.sample_neumann_grf_2d(2, k, seed=1)
    amp = rf.neumann_grf_2d_amplitudes(k)
    x = np.arange(k) / (k - 1)
    phi = np.stack([np.ones(k)] + [np.sqrt(2) * np.cos(np.pi * m * x) for m in range(1, k)], 1)
    for i in range(2):
        xi = rf.sample_rng(1, rf.STREAM_DARCY, i).standard_normal((k, k))
        np.testing.assert_allclose(field[i], phi @ (amp * xi) @ phi.T, atol=1e-13)
    assert amp[0, 0] == 0


def test_darcy_coefficient_statistics():
    a = rf.sample_darcy_coefficient(64, 65, seed=0)
    assert set(np.unique(a)) == {3.0, 12.0}
    frac = (a == 12).mean()
    assert 0.4 < frac < 0.6  # SPEC: ~49%
    np.testing.assert_array_equal(a[5:9], rf.sample_darcy_coefficient(4, 65, seed=0, start=5))
    # Interfaces are irregular but not noise: most neighbours agree.
    assert (a[:, 1:, :] == a[:, :-1, :]).mean() > 0.9


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "match"),
    [
        (rf.sample_periodic_grf_1d, (0,), {}, "n_samples"),
        (rf.sample_periodic_grf_1d, (2, 3), {}, "resolution"),
        (rf.sample_periodic_grf_1d, (2,), {"seed": -1}, "seed"),
        (rf.sample_periodic_grf_1d, (2,), {"sigma": 0}, "sigma"),
        (rf.sample_neumann_grf_2d, (2, 2), {}, "resolution"),
        (rf.sample_neumann_grf_2d, (2.5,), {}, "n_samples"),
        (rf.sample_neumann_grf_2d, (1, 5), {"start": -2}, "start"),
        (rf.threshold_coefficient, (np.zeros(3, dtype=int),), {}, "floating"),
        # NaN >= 0 is false: a NaN became the low value
        (rf.threshold_coefficient, (np.array([np.nan, 1.0]),), {}, "field: expected finite"),
    ],
)
def test_bad_arguments(fn, args, kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        fn(*args, **kwargs)
