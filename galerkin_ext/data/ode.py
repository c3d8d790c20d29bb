"""Lorenz-63 and the controlled ODE of the continuum-attention experiments (SPEC-continuum §3).

* :func:`time_grid` -- the sample times: uniform ``t_n = n dt`` on ``[0, t_end]`` (default
  ``dt = 0.01``, ``t_end = 2``, 201 points) or the paper's non-uniform grid (41),
  ``{0.01 n, n <= 100} U {1 + 0.005 n, n = 1..200}`` (301 points).
* :func:`rk4` -- classical fourth-order Runge-Kutta in float64 that lands exactly on every
  sample time (equal sub-steps of at most ``max_step`` between consecutive times).
* Lorenz-63 (:func:`solve_lorenz63`): ``x' = sigma (y - x)``, ``y' = x (rho - z) - y``,
  ``z' = x y - beta z`` with ``sigma = 10, rho = 28, beta = 8/3``; initial conditions
  ``x0, y0 ~ U(-15, 15)``, ``z0 ~ U(0, 40)`` (:func:`sample_lorenz63_initial`).
* Controlled ODE (:func:`solve_cde`): ``dz = sin(z) du``, ``z(0) = z0 = 1``, driven by
  ``u(t) = sum_{j<=J} c_j xi_j sin(pi n_j t)``, ``xi_j ~ N(0, 1)``, ``n_j ~ U(0, 10)``, ``J = 10``,
  ``c_j = 1`` (the paper) or ``1/j`` (``decay=True``, the authors' code)
  (:func:`sample_cde_control`, :func:`cde_control`).  It is solved exactly: ``dz / sin z = du``
  integrates to ``log tan(z/2) = u + const``, so ``z = 2 arctan(tan(z0/2) e^{u(t) - u(0)})``.

Sample ``i`` of a set depends only on ``(seed, i)`` (:func:`.random_fields.sample_rng`, streams
``STREAM_LORENZ63`` and ``STREAM_CDE``), and every operation here is elementwise per sample (sums
over ``j`` are taken in a fixed order), so a sample is bit-identical in any batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import numpy as np

from .._checks import check_bool, check_choice, check_float, check_int
from .random_fields import STREAM_CDE, STREAM_LORENZ63, sample_rng
from .storage import SolverError

__all__ = [
    "GRIDS",
    "DEFAULT_DT",
    "DEFAULT_T_END",
    "LORENZ63_INITIAL_LOW",
    "LORENZ63_INITIAL_HIGH",
    "time_grid",
    "rk4",
    "solve_lorenz63",
    "sample_lorenz63_initial",
    "sample_cde_control",
    "cde_control",
    "solve_cde",
]

GRIDS = ("uniform", "nonuniform")
#: The uniform grid's default spacing and end, SPEC-continuum §3 (the nonuniform one is on
#: [0, 2] too).
DEFAULT_DT = 0.01
DEFAULT_T_END = 2.0
#: Bounds that stop a mistyped step before it fills the disk or runs for days: the most sample
#: times of a grid (the data sets have 41-401) and RK4 steps of a trajectory (2e3 by default).
MAX_TIMES = 2**20
MAX_STEPS = 10**8
#: Box of the Lorenz-63 initial conditions (x0, y0, z0), SPEC-continuum §3 (authors' code).
LORENZ63_INITIAL_LOW = (-15.0, -15.0, 0.0)
LORENZ63_INITIAL_HIGH = (15.0, 15.0, 40.0)


def _decimal(value: float) -> Fraction:
    """The shortest decimal that rounds to ``value`` (``0.0075`` -> ``3/400``), as a fraction."""
    return Fraction(repr(value))


def time_grid(
    dt: float | None = None, t_end: float | None = None, grid: str = "uniform"
) -> np.ndarray:
    """Sample times of the ODE sets, shape ``(T,)``, float64, increasing from ``t_0 = 0``.

    Args:
        dt: spacing of the uniform grid (default 0.01).
        t_end: end of the interval (default 2).
        grid: ``"uniform"``: ``t_n = n dt`` for every ``n >= 0`` with ``t_n <= t_end`` (``t_end``
            itself when ``dt`` divides it: 201 points for 0.01, 267 up to 1.995 for 0.0075);
            ``"nonuniform"``: the paper's grid (41) on ``[0, 2]``, which takes neither ``dt``
            nor ``t_end``.

    ``dt`` and ``t_end`` are read as the decimals they print as, and every time is the double
    nearest to its exact value (``t_n = n p / q`` for ``dt = p / q`` in lowest terms, rounded
    once): ``time_grid(0.01)[3] == 0.03``, ``time_grid(0.0075)[4] == 0.03``, and grids of
    different ``dt`` agree exactly wherever their times coincide.
    """
    check_choice(grid, "grid", GRIDS)
    if grid == "nonuniform":
        for name, value in (("dt", dt), ("t_end", t_end)):
            if value is not None:
                raise ValueError(f"{name}: the nonuniform grid (41) is fixed on [0, 2] and takes "
                                 f"no {name}, got {value!r}")
        first = np.arange(101, dtype=np.float64) / 100  # 0.01 n, n = 0..100
        second = (200 + np.arange(1, 201, dtype=np.float64)) / 200  # 1 + 0.005 n, n = 1..200
        return np.concatenate([first, second])
    dt = DEFAULT_DT if dt is None else check_float(dt, "dt")
    t_end = DEFAULT_T_END if t_end is None else check_float(t_end, "t_end")
    step = _decimal(dt)
    n = math.floor(_decimal(t_end) / step)
    if n < 1:
        raise ValueError(f"dt: expected a step <= t_end = {t_end!r}, got {dt!r}")
    if n + 1 > MAX_TIMES:
        count = str(n + 1) if n < 10**15 else f"{Decimal(n + 1):.3e}"  # not 300 digits
        raise ValueError(f"dt: {dt!r} gives {count} sample times up to t_end = {t_end!r}, "
                         f"more than {MAX_TIMES}; expected a coarser step")
    if step.numerator * n >= 2**53 or step.denominator >= 2**53:
        raise ValueError(f"dt: {dt!r} has too many digits to give exact times up to {t_end!r}")
    # n * p is an exact integer in float64 and q is exact, so the division rounds only once.
    return np.arange(n + 1, dtype=np.float64) * step.numerator / step.denominator


def _check_times(times: object) -> np.ndarray:
    t = np.asarray(times)  # (no dtype: numpy's own error for strings would not name times)
    if not isinstance(times, np.ndarray) and np.issubdtype(t.dtype, np.integer):
        t = t.astype(np.float64)  # a list such as [0, 1, 2]
    if t.ndim != 1 or t.size < 2 or not np.issubdtype(t.dtype, np.floating):
        raise ValueError(f"times: expected a 1-D float array of at least 2 times, got "
                         f"shape {t.shape} and dtype {t.dtype}")
    if not np.isfinite(t).all() or np.any(np.diff(t) <= 0):
        raise ValueError("times: expected finite, strictly increasing times")
    return t.astype(np.float64, copy=False)


def _check_state(y: object, name: str, d: int | None = None) -> np.ndarray:
    if not isinstance(y, np.ndarray) or not (
        np.issubdtype(y.dtype, np.floating) or np.issubdtype(y.dtype, np.integer)
    ):
        raise TypeError(f"{name}: expected a real numpy.ndarray, got {type(y).__name__}"
                        + (f" of dtype {y.dtype}" if isinstance(y, np.ndarray) else ""))
    if y.ndim < 1 or y.size == 0 or (d is not None and y.shape[-1] != d):
        shape = "(..., d)" if d is None else f"(B, {d}) or ({d},)"
        raise ValueError(f"{name}: expected a non-empty array of shape {shape}, got {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError(f"{name}: expected finite values")
    return y.astype(np.float64)


def check_max_step(max_step: object, times: np.ndarray) -> float:
    """``max_step`` as a float, refused where :func:`rk4` would take more than ``MAX_STEPS``
    steps over ``times``."""
    max_step = check_float(max_step, "max_step")
    steps = (times[-1] - times[0]) / max_step
    if steps > MAX_STEPS:
        raise ValueError(f"max_step: {max_step:g} takes about {steps:.3g} steps from "
                         f"{times[0]:g} to {times[-1]:g}, more than {MAX_STEPS:g}; expected a "
                         "larger step")
    return max_step


def rk4(
    rhs: Callable[[float, np.ndarray], np.ndarray],
    y0: np.ndarray,
    times: np.ndarray,
    max_step: float = 1e-3,
) -> np.ndarray:
    """Integrate ``y' = rhs(t, y)`` from ``y0`` at ``times[0]`` with classical RK4 in float64.

    Between consecutive times ``t_k < t_{k+1}`` it takes ``m = ceil(dt_k / max_step)`` equal
    steps of ``h = dt_k / m``, so every sample time is reached by steps, not interpolated: with
    ``max_step = 1e-3``, ``dt = 0.01`` gives ten steps of 1e-3 and ``dt = 0.0075`` eight of
    9.375e-4 (global error O(h^4) either way).

    Args:
        rhs: ``rhs(t, y)`` -> ``dy/dt``, an array of ``y``'s shape; elementwise over the batch.
        y0: initial state, shape ``(..., d)``.
        times: sample times, shape ``(T,)``, strictly increasing.
        max_step: largest step.

    Returns:
        ``(..., T, d)`` float64, ``[..., 0, :] = y0``.

    Raises:
        SolverError: the solution became non-finite (``max_step`` too large).
    """
    if not callable(rhs):
        raise TypeError(f"rhs: expected a callable rhs(t, y), got {type(rhs).__name__}")
    y = _check_state(y0, "y0")
    t = _check_times(times)
    max_step = check_max_step(max_step, t)
    out = np.empty((t.size, *y.shape))
    out[0] = y
    # An unstable step overflows: checked once at the end instead of numpy's warnings.
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(t.size - 1):
            span = t[k + 1] - t[k]
            # 1e-10 slack: a decimal spacing such as 0.01 is 10.000000000000002 steps of 1e-3.
            m = max(1, math.ceil(span / max_step * (1 - 1e-10)))
            h = span / m
            for j in range(m):
                s = t[k] + j * h
                k1 = rhs(s, y)
                if np.shape(k1) != y.shape:  # numpy would broadcast it into a wrong state
                    raise ValueError(f"rhs: expected dy/dt of the state's shape {y.shape}, got "
                                     f"{np.shape(k1)}")
                k2 = rhs(s + h / 2, y + (h / 2) * k1)
                k3 = rhs(s + h / 2, y + (h / 2) * k2)
                k4 = rhs(s + h, y + h * k3)
                y = y + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
            out[k + 1] = y
    if not np.isfinite(out).all():
        raise SolverError(f"rk4: the solution became non-finite; max_step = {max_step:g} is too "
                          "large for the equation (the data sets' default is 1e-3)")
    return np.moveaxis(out, 0, -2)


def solve_lorenz63(
    initial: np.ndarray,
    times: np.ndarray,
    *,
    sigma: float = 10.0,
    rho: float = 28.0,
    beta: float = 8.0 / 3.0,
    max_step: float = 1e-3,
) -> np.ndarray:
    """Lorenz-63 trajectories by :func:`rk4` (float64, steps of at most ``max_step``).

    Args:
        initial: ``(x0, y0, z0)`` at ``times[0]``, shape ``(B, 3)`` or ``(3,)``.
        times: sample times, shape ``(T,)``, strictly increasing (see :func:`time_grid`).
        sigma, rho, beta: the system's parameters ``x' = σ (y − x)``, ``y' = x (ρ − z) − y``,
            ``z' = x y − β z`` (defaults: the chaotic values 10, 28, 8/3, SPEC-continuum §3).
        max_step: the largest RK4 step; each interval between sample times is cut into
            equal steps no longer than it.

    Returns:
        ``(B, T, 3)`` (or ``(T, 3)``) float64: ``x, y, z`` at every time.
    """
    y0 = _check_state(initial, "initial", 3)
    if y0.ndim > 2:
        raise ValueError(f"initial: expected shape (B, 3) or (3,), got {y0.shape}")
    sigma = check_float(sigma, "sigma")
    rho = check_float(rho, "rho")
    beta = check_float(beta, "beta")

    def rhs(_t: float, s: np.ndarray) -> np.ndarray:
        x, y, z = s[..., 0], s[..., 1], s[..., 2]
        return np.stack([sigma * (y - x), x * (rho - z) - y, x * y - beta * z], axis=-1)

    return rk4(rhs, y0, times, max_step)


def _check_batch(n_samples: object, seed: object, start: object) -> tuple[int, int, int]:
    return (check_int(n_samples, "n_samples"), check_int(seed, "seed", 0),
            check_int(start, "start", 0))


def sample_lorenz63_initial(n_samples: int, *, seed: int = 0, start: int = 0) -> np.ndarray:
    """Initial conditions of samples ``start .. start + n_samples - 1``, shape ``(n, 3)``:
    ``x0, y0 ~ U(-15, 15)``, ``z0 ~ U(0, 40)``, float64."""
    n_samples, seed, start = _check_batch(n_samples, seed, start)
    return np.stack([
        sample_rng(seed, STREAM_LORENZ63, start + i).uniform(
            LORENZ63_INITIAL_LOW, LORENZ63_INITIAL_HIGH
        )
        for i in range(n_samples)
    ])


def sample_cde_control(
    n_samples: int,
    *,
    seed: int = 0,
    start: int = 0,
    n_terms: int = 10,
    freq_max: float = 10.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients ``xi_j ~ N(0, 1)`` and frequencies ``n_j ~ U(0, freq_max)`` of the controls of
    samples ``start .. start + n_samples - 1``; each of shape ``(n, n_terms)``, float64.

    The frequencies are real, not integers: the paper draws ``n_j ~ unif([0, J])`` with ``J = 10``
    (a continuous uniform law in its notation) and the authors' code ``uniform_(0, 10)``.
    """
    n_samples, seed, start = _check_batch(n_samples, seed, start)
    n_terms = check_int(n_terms, "n_terms")
    freq_max = check_float(freq_max, "freq_max")
    xi = np.empty((n_samples, n_terms))
    freq = np.empty((n_samples, n_terms))
    for i in range(n_samples):
        rng = sample_rng(seed, STREAM_CDE, start + i)
        xi[i] = rng.standard_normal(n_terms)
        freq[i] = rng.uniform(0.0, freq_max, n_terms)
    return xi, freq


def _check_control(xi: object, freq: object) -> tuple[np.ndarray, np.ndarray]:
    xi_a = _check_state(xi, "xi")
    freq_a = _check_state(freq, "freq")
    if xi_a.ndim != 2 or freq_a.shape != xi_a.shape:
        raise ValueError(f"xi, freq: expected two arrays of one shape (B, J), got {xi_a.shape} "
                         f"and {freq_a.shape}")
    return xi_a, freq_a


def cde_control(
    xi: np.ndarray, freq: np.ndarray, times: np.ndarray, *, decay: bool = False
) -> np.ndarray:
    """The control ``u(t) = sum_j c_j xi_j sin(pi n_j t)`` at ``times``.

    Args:
        xi, freq: ``(B, J)`` from :func:`sample_cde_control`.
        times: ``(T,)``.
        decay: ``c_j = 1/j`` (the authors' code) instead of 1 (the paper).

    Returns:
        ``(B, T)`` float64.
    """
    xi_a, freq_a = _check_control(xi, freq)
    t = _check_times(times)
    check_bool(decay, "decay")
    u = np.zeros((xi_a.shape[0], t.size))
    for j in range(xi_a.shape[1]):  # a fixed order of summation: the same bits in any batch
        c = xi_a[:, j : j + 1] / (j + 1) if decay else xi_a[:, j : j + 1]
        u = u + c * np.sin(np.pi * freq_a[:, j : j + 1] * t)
    return u


def solve_cde(u: np.ndarray, z0: float = 1.0) -> np.ndarray:
    """Exact solution of ``dz = sin(z) du``, ``z = z0`` at the first sample time.

    Args:
        u: the control along the sample times, shape ``(..., T)``.
        z0: initial value in ``(-pi, pi]`` (the branch of ``arctan`` the formula uses).

    Returns:
        ``z = 2 arctan(tan(z0 / 2) exp(u - u[..., :1]))``, shape of ``u``, float64.
    """
    u_a = _check_state(u, "u")
    z0 = check_float(z0, "z0", low=-math.pi, high=math.pi)
    z = 2.0 * np.arctan(math.tan(z0 / 2) * np.exp(u_a - u_a[..., :1]))
    z[..., :1] = z0  # exactly: a vectorised arctan may be an ulp off (numpy 1.26's AVX-512 one)
    return z
