"""Gaussian random fields for the Burgers initial conditions and the Darcy coefficients.

Every sample ``i`` of a set with seed ``s`` is drawn from its own generator,
``numpy.random.default_rng(SeedSequence(s, spawn_key=(stream, i)))``, so a sample does not depend
on the batch it is drawn in: chunked, resumed and parallel generation give identical data.

* 1-D periodic field (Burgers ``u0``): ``u0 ~ N(0, sigma^2 (-Delta + tau^2 I)^(-gamma))`` on
  ``[0, 1)``, i.e. ``u0(x) = sum_{k>=1} c_k (xi_k cos 2 pi k x + eta_k sin 2 pi k x)`` with
  ``c_k = sqrt(2) sigma ((2 pi k)^2 + tau^2)^(-gamma/2)``, ``xi, eta ~ N(0, 1)``, modes
  ``k < N/2`` on a grid of ``N`` points.  Defaults ``sigma=25, tau=5, gamma=2`` (SPEC §4).
* 2-D Neumann field (Darcy): ``f ~ N(0, (-Delta + tau^2 I)^(-alpha))`` on ``[0, 1]^2`` with
  the cosine eigenfunctions ``phi_k1(x) phi_k2(y)``, ``phi_0 = 1``, ``phi_k = sqrt(2) cos(pi k x)``,
  eigenvalues ``pi^2 (k1^2 + k2^2) + tau^2``, zero mean (mode ``(0, 0)`` dropped), modes
  ``0 <= k1, k2 < K`` evaluated at the nodes ``x_i = i / (K - 1)``.  Defaults ``alpha=2, tau=3``.
  :func:`threshold_coefficient` maps it to the piecewise-constant coefficient (12 where
  ``f >= 0``, else 3).  An amplitude ``sigma`` scales the field, ``g = sigma f ~ N(0, sigma^2
  (-Delta + tau^2 I)^(-alpha))``: the continuum-attention sets (SPEC-continuum §3) use
  ``sigma=12, tau=6, alpha=2`` with the lognormal coefficient ``exp(g)`` or the threshold of
  ``g`` (which does not depend on ``sigma``).
"""

from __future__ import annotations

import numpy as np
import scipy.fft

from .._checks import check_choice, check_float, check_int
from .storage import SolverError

__all__ = [
    "sample_periodic_grf_1d",
    "periodic_grf_1d_amplitudes",
    "sample_neumann_grf_2d",
    "neumann_grf_2d_amplitudes",
    "threshold_coefficient",
    "piecewise_levels",
    "sample_darcy_coefficient",
    "sample_rng",
]

# Independent random streams for each kind of sample (part of every sample's seed).  Stream 3 is
# the inverse problem's noise (datasets.py); the ODE sets of .ode use 4 and 5.
STREAM_BURGERS = 1
STREAM_DARCY = 2
STREAM_LORENZ63 = 4
STREAM_CDE = 5
DARCY_COEFFICIENTS = ("piecewise", "lognormal")


def sample_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """The generator of sample ``index`` of random stream ``stream`` for ``seed``."""
    check_int(seed, "seed", 0)
    check_int(stream, "stream", 0)
    check_int(index, "index", 0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, index)))


def periodic_grf_1d_amplitudes(
    n_modes: int, sigma: float = 25.0, tau: float = 5.0, gamma: float = 2.0
) -> np.ndarray:
    """Amplitudes ``c_k``, ``k = 1..n_modes``, of the cos/sin modes; shape ``(n_modes,)``."""
    n_modes = check_int(n_modes, "n_modes")
    sigma = check_float(sigma, "sigma")
    tau = check_float(tau, "tau", low_inclusive=True)
    gamma = check_float(gamma, "gamma")
    k = np.arange(1, n_modes + 1, dtype=np.float64)
    return np.sqrt(2.0) * sigma * ((2 * np.pi * k) ** 2 + tau**2) ** (-gamma / 2)


def _check_batch(n_samples: object, start: object) -> tuple[int, int]:
    return check_int(n_samples, "n_samples"), check_int(start, "start", 0)


def sample_periodic_grf_1d(
    n_samples: int,
    resolution: int = 8192,
    *,
    seed: int = 0,
    start: int = 0,
    sigma: float = 25.0,
    tau: float = 5.0,
    gamma: float = 2.0,
) -> np.ndarray:
    """Draw samples ``start .. start + n_samples - 1`` of the 1-D periodic field.

    Returns an array of shape ``(n_samples, resolution)``, float64, sampled at ``x_j = j / N``.
    A sample drawn on a coarser grid is the Fourier truncation of the same sample on a finer one
    (the modes are drawn in order of frequency).
    """
    n_samples, start = _check_batch(n_samples, start)
    resolution = check_int(resolution, "resolution", 4)
    seed = check_int(seed, "seed", 0)
    n_modes = (resolution - 1) // 2  # strictly below Nyquist: a sine there vanishes on the grid
    amp = periodic_grf_1d_amplitudes(n_modes, sigma, tau, gamma)
    spec = np.zeros((n_samples, resolution // 2 + 1), dtype=np.complex128)
    for row in range(n_samples):
        xi = sample_rng(seed, STREAM_BURGERS, start + row).standard_normal((n_modes, 2))
        # irfft(backward) of (N/2) c (xi - i eta) is c (xi cos + eta sin) on the grid.
        spec[row, 1 : n_modes + 1] = 0.5 * resolution * amp * (xi[:, 0] - 1j * xi[:, 1])
    return np.fft.irfft(spec, n=resolution, axis=-1)


def neumann_grf_2d_amplitudes(resolution: int, alpha: float = 2.0, tau: float = 3.0) -> np.ndarray:
    """Amplitudes ``(pi^2 (k1^2 + k2^2) + tau^2)^(-alpha/2)``; shape ``(K, K)``, ``[0, 0] = 0``."""
    resolution = check_int(resolution, "resolution", 2)
    alpha = check_float(alpha, "alpha")
    tau = check_float(tau, "tau", low_inclusive=True)
    k = np.arange(resolution, dtype=np.float64)
    lam = np.pi**2 * (k[:, None] ** 2 + k[None, :] ** 2) + tau**2
    lam[0, 0] = 1.0  # dropped below; avoids 0 ** negative for tau = 0
    amp = lam ** (-alpha / 2)
    amp[0, 0] = 0.0  # zero mean
    return amp


def _cosine_series_on_nodes(coef: np.ndarray) -> np.ndarray:
    """Evaluate ``sum_k coef[..., k1, k2] phi_k1(x_i) phi_k2(x_j)`` at ``x = i / (K - 1)``.

    DCT-I computes ``y_i = X_0 + (-1)^i X_{K-1} + 2 sum_{0<k<K-1} X_k cos(pi k i / (K-1))``,
    so the interior modes are halved and the ``sqrt(2)`` of ``phi_k`` (k >= 1) folded in.
    """
    k = coef.shape[-1]
    w = np.full(k, np.sqrt(2.0) / 2.0)
    w[0] = 1.0
    w[-1] = np.sqrt(2.0)
    x = coef * w[:, None] * w[None, :]
    return scipy.fft.dctn(x, type=1, axes=(-2, -1))


def sample_neumann_grf_2d(
    n_samples: int,
    resolution: int = 421,
    *,
    seed: int = 0,
    start: int = 0,
    alpha: float = 2.0,
    tau: float = 3.0,
    sigma: float = 1.0,
) -> np.ndarray:
    """Draw samples ``start .. start + n_samples - 1`` of the 2-D Neumann field times ``sigma``.

    Returns an array of shape ``(n_samples, K, K)``, float64, at the nodes ``x_i = i / (K - 1)``.
    """
    n_samples, start = _check_batch(n_samples, start)
    resolution = check_int(resolution, "resolution", 3)
    seed = check_int(seed, "seed", 0)
    # x * 1.0 == x exactly, so the default leaves the SPEC.md fields bit-identical.
    amp = neumann_grf_2d_amplitudes(resolution, alpha, tau) * check_float(sigma, "sigma")
    coef = np.empty((n_samples, resolution, resolution))
    for row in range(n_samples):
        rng = sample_rng(seed, STREAM_DARCY, start + row)
        coef[row] = amp * rng.standard_normal((resolution, resolution))
    return _cosine_series_on_nodes(coef)


#: SPEC.md's coefficient values: ``high`` where the field is >= 0, else ``low``.
PIECEWISE_HIGH, PIECEWISE_LOW = 12.0, 3.0


def piecewise_levels(kind: str | None, high: float | None,
                     low: float | None) -> tuple[float, float] | None:
    """``(high, low)`` of a piecewise coefficient (``kind`` ``'piecewise'``, or ``None`` for
    SPEC.md's), default 12 and 3; ``None`` for the lognormal one, which refuses them (they
    would be dropped without a word)."""
    if kind == "lognormal":
        for name, value in (("high", high), ("low", low)):
            if value is not None:
                raise ValueError(f"{name}: only the piecewise coefficients have it (the "
                                 f"lognormal one is exp(g)), got {value!r}")
        return None
    return (check_float(PIECEWISE_HIGH if high is None else high, "high"),
            check_float(PIECEWISE_LOW if low is None else low, "low"))


def threshold_coefficient(field: np.ndarray, high: float = PIECEWISE_HIGH,
                          low: float = PIECEWISE_LOW) -> np.ndarray:
    """Piecewise-constant coefficient: ``high`` where ``field >= 0``, else ``low``; same shape."""
    field = np.asarray(field)
    if not np.issubdtype(field.dtype, np.floating):
        raise TypeError(f"field must be a floating-point array, got dtype {field.dtype}")
    if not np.isfinite(field).all():  # NaN >= 0 is false: it became low
        raise ValueError("field: expected finite values")
    high = check_float(high, "high")
    low = check_float(low, "low")
    return np.where(field >= 0, high, low)


def sample_darcy_coefficient(
    n_samples: int,
    resolution: int = 421,
    *,
    seed: int = 0,
    start: int = 0,
    alpha: float = 2.0,
    tau: float = 3.0,
    high: float | None = None,
    low: float | None = None,
    kind: str = "piecewise",
    sigma: float = 1.0,
) -> np.ndarray:
    """The Darcy coefficient of the field ``g`` of :func:`sample_neumann_grf_2d`.

    ``kind="piecewise"``: ``high`` where ``g >= 0``, else ``low`` (default 12 and 3: the
    default arguments give SPEC.md's coefficient); ``kind="lognormal"``: ``exp(g)``, which
    refuses ``high`` and ``low``.
    Returns shape ``(n_samples, K, K)``, float64.

    Raises:
        SolverError: ``exp(g)`` over- or underflows float64 (``sigma`` too large), naming the
            first such sample.
    """
    check_choice(kind, "kind", DARCY_COEFFICIENTS)
    levels = piecewise_levels(kind, high, low)
    field = sample_neumann_grf_2d(
        n_samples, resolution, seed=seed, start=start, alpha=alpha, tau=tau, sigma=sigma
    )
    if levels is not None:
        return threshold_coefficient(field, *levels)
    with np.errstate(over="ignore", under="ignore"):
        a = np.exp(field)
    bad = ~(np.isfinite(a) & (a > 0)).reshape(len(a), -1).all(axis=1)
    if bad.any():
        raise SolverError(f"sample {start + int(np.argmax(bad))}: the coefficient exp(g) over- "
                          f"or underflows; sigma = {sigma} is too large")
    return a
