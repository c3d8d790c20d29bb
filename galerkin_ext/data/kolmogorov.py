"""Kolmogorov flow (SPEC-continuum §3): 2-D Navier-Stokes in vorticity form on the torus.

Equation, on ``[0, 2 pi]^2`` with periodic boundaries:

    d_t w + u . grad w = nu Lap w - A n cos(n y),   u = (d_y psi, -d_x psi),   -Lap psi = w,

``-A n cos(n y)`` being the curl ``d_x f_y - d_y f_x`` of the body force ``f = A sin(n y) x``.
Defaults ``n = 4``, ``nu = 1/70``, ``A = 1``.  Its laminar steady state is the shear flow
``w_s = -A cos(n y) / (n nu)`` (``u = A sin(n y) / (n^2 nu)``, ``v = 0``).

Grid and layout: a field is sampled at ``(x_i, y_j) = (2 pi i / s, 2 pi j / s)``, ``i, j = 0..s-1``,
and stored as ``field[..., i, j]``: axis -2 is ``x``, axis -1 is ``y`` ("ij" indexing).

Solver (:func:`solve_kolmogorov`): pseudo-spectral in ``torch`` (batched, CPU or CUDA), the
quadratic term de-aliased with the 2/3 rule, time stepping by the integrating-factor (Lawson)
RK4 scheme, which integrates the viscous term exactly through ``exp(-nu |k|^2 t)``.

Initial condition (:func:`sample_initial_vorticity`):
``w0 ~ N(0, sigma^2 (-Lap + tau^2)^(-alpha))``, mean zero; SPEC defaults ``sigma^2 = 7^(3/2)``,
``tau = 7``, ``alpha = 5/2``.  Normalisation: ``C = sigma^2 (-Lap + tau^2)^(-alpha)`` is the
covariance operator of the continuous field on ``L^2([0, 2 pi]^2)``.  Its eigenpairs are
``lambda_k = sigma^2 (|k|^2 + tau^2)^(-alpha)`` and ``e_k = exp(i k.x) / (2 pi)`` (orthonormal,
``k`` in ``Z^2``), so ``w0 = sum_{k != 0} sqrt(lambda_k) xi_k e_k`` with standard complex
Gaussians ``xi_k`` (``E |xi_k|^2 = 1``, ``xi_{-k} = conj(xi_k)``).  The Fourier coefficient of
``exp(i k.x)`` is therefore ``c_k = sqrt(lambda_k) xi_k / (2 pi)``, and the pointwise variance is
``E w0(x)^2 = sum_{k != 0} lambda_k / (2 pi)^2``: about ``2.84e-3`` for the defaults (std ~0.053;
the integral over ``R^2`` gives ``sigma^2 tau^(2 - 2 alpha) / (4 pi (alpha - 1))``).  On an
``s x s`` grid the modes ``|k_1|, |k_2| < s / 2`` are drawn (none at Nyquist, whose sine part is
not representable); the field is that band-limited trigonometric polynomial, evaluated exactly.

Seeding: sample ``i`` of a set with seed ``seed`` is drawn from
``random_fields.sample_rng(seed, STREAM_KOLMOGOROV, i)`` alone, so it does not depend on the batch.
The modes are drawn in a fixed order of square shells ``max(|k_1|, |k_2|) = 1, 2, ...``, so a
sample on an odd grid ``s`` is exactly the Fourier truncation of the same sample on any finer grid.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from .._checks import check_float, check_int, check_tensor
from .._scaling import fewest_steps
from .random_fields import sample_rng
from .storage import SolverError

__all__ = [
    "STREAM_KOLMOGOROV",
    "KOLMOGOROV_NU",
    "KOLMOGOROV_WAVENUMBER",
    "IC_SIGMA",
    "IC_TAU",
    "IC_ALPHA",
    "initial_vorticity_eigenvalues",
    "sample_initial_vorticity",
    "velocity_from_vorticity",
    "kolmogorov_tendency",
    "cfl_number",
    "persistence_errors",
    "solve_kolmogorov",
    "resample_periodic",
]

#: Random stream of the Kolmogorov initial vorticities; distinct from the streams 1-7 of
#: :mod:`.random_fields`, :mod:`.datasets`, :mod:`.heat` and :mod:`.elasticity`.
STREAM_KOLMOGOROV = 8
#: Viscosity and forcing wavenumber of SPEC-continuum §3.
KOLMOGOROV_NU = 1.0 / 70.0
KOLMOGOROV_WAVENUMBER = 4
#: Initial-condition covariance ``IC_SIGMA^2 (-Lap + IC_TAU^2)^(-IC_ALPHA)``, i.e.
#: ``7^(3/2) (-Lap + 49)^(-5/2)`` (SPEC-continuum §3).
IC_SIGMA = 7.0**0.75
IC_TAU = 7.0
IC_ALPHA = 2.5

_DTYPES = (torch.float32, torch.float64)


# ----------------------------------------------------------------------------------------------
# Initial condition
# ----------------------------------------------------------------------------------------------


def initial_vorticity_eigenvalues(
    resolution: int, *, sigma: float = IC_SIGMA, tau: float = IC_TAU, alpha: float = IC_ALPHA
) -> np.ndarray:
    """Covariance eigenvalues ``lambda_k = sigma^2 (|k|^2 + tau^2)^(-alpha)`` of the modes drawn.

    Returns shape ``(s, s)``, float64, in FFT order (entry ``[k_1 mod s, k_2 mod s]``), zero for
    ``k = 0`` (mean zero) and for ``|k_1|`` or ``|k_2| >= s / 2`` (not drawn).  The grid field's
    pointwise variance is ``lambda.sum() / (2 pi)^2``.
    """
    s = check_int(resolution, "resolution", 2)
    sigma = check_float(sigma, "sigma")
    tau = check_float(tau, "tau", low_inclusive=True)
    alpha = check_float(alpha, "alpha")
    k = np.fft.fftfreq(s, 1.0 / s)
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    k2[0, 0] = 1.0  # dropped below; avoids 0 ** negative for tau = 0
    lam = sigma**2 * (k2 + tau**2) ** (-alpha)
    below = 2 * np.abs(k) < s
    lam[~(below[:, None] & below[None, :])] = 0.0
    lam[0, 0] = 0.0
    return lam


def _half_plane_modes(k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """One of each pair ``+-k`` (``k_2 > 0``, or ``k_2 = 0 < k_1``) with ``|k_i| <= k_max``, in
    square shells ``max(|k_1|, |k_2|)`` and by ``(k_2, k_1)`` within a shell: the first modes
    do not depend on ``k_max``, which makes coarse samples truncations of fine ones."""
    r = np.arange(-k_max, k_max + 1)
    k1, k2 = (a.ravel() for a in np.meshgrid(r, r, indexing="ij"))
    half = (k2 > 0) | ((k2 == 0) & (k1 > 0))
    k1, k2 = k1[half], k2[half]
    order = np.lexsort((k1, k2, np.maximum(np.abs(k1), np.abs(k2))))
    return k1[order], k2[order]


def sample_initial_vorticity(
    n_samples: int,
    resolution: int,
    *,
    seed: int = 0,
    start: int = 0,
    sigma: float = IC_SIGMA,
    tau: float = IC_TAU,
    alpha: float = IC_ALPHA,
) -> np.ndarray:
    """Samples ``start .. start + n_samples - 1`` of ``w0 ~ N(0, sigma^2 (-Lap + tau^2)^-alpha)``.

    Returns shape ``(n_samples, s, s)``, float64, at ``(x_i, y_j) = 2 pi (i, j) / s`` (axis -2 is
    ``x``).  Each sample has exactly zero mean (up to rounding); see the module docstring for the
    normalisation (continuous covariance) and the seeding.
    """
    n_samples = check_int(n_samples, "n_samples")
    start = check_int(start, "start", 0)
    seed = check_int(seed, "seed", 0)
    s = check_int(resolution, "resolution", 3)
    lam = initial_vorticity_eigenvalues(s, sigma=sigma, tau=tau, alpha=alpha)
    k1, k2 = _half_plane_modes((s - 1) // 2)
    i1, i2 = k1 % s, k2 % s
    j1, j2 = (-k1) % s, (-k2) % s
    # c_k = sqrt(lambda_k) / (2 pi) * (z_1 + i z_2) / sqrt(2): E |c_k|^2 = lambda_k / (2 pi)^2.
    amp = np.sqrt(lam[i1, i2] / 2.0) / (2.0 * np.pi)
    coef = np.zeros((n_samples, s, s), dtype=np.complex128)
    for row in range(n_samples):
        z = sample_rng(seed, STREAM_KOLMOGOROV, start + row).standard_normal((k1.size, 2))
        c = amp * (z[:, 0] + 1j * z[:, 1])
        coef[row, i1, i2] = c
        coef[row, j1, j2] = np.conj(c)  # Hermitian: the field is real
    # norm="forward": the inverse transform is the plain sum  sum_k c_k exp(i k.x_ij).
    return np.fft.ifft2(coef, norm="forward").real


# ----------------------------------------------------------------------------------------------
# Spectral operators
# ----------------------------------------------------------------------------------------------


class _Spectral:
    """Wavenumber arrays of the ``rfft2`` spectrum ``(s, s // 2 + 1)`` of an ``s x s`` field."""

    def __init__(self, s: int, dtype: torch.dtype, device: torch.device) -> None:
        self.s = s
        kx = torch.fft.fftfreq(s, 1.0 / s, dtype=dtype, device=device)[:, None]
        ky = torch.fft.rfftfreq(s, 1.0 / s, dtype=dtype, device=device)[None, :]
        self.k2 = kx**2 + ky**2
        self.inv_k2 = torch.where(self.k2 > 0, 1.0 / torch.where(self.k2 > 0, self.k2, 1.0), 0.0)
        # First derivatives: the Nyquist mode of an even grid (a cosine on the grid, whose
        # derivative, a sine, vanishes there) is given derivative 0.
        nyq = s // 2 if s % 2 == 0 else None
        dkx, dky = kx.clone(), ky.clone()
        if nyq is not None:
            dkx[kx.abs() == nyq] = 0.0
            dky[ky == nyq] = 0.0
        self.dx = 1j * dkx
        self.dy = 1j * dky
        # 2/3 rule: products of modes |k_i| <= K with 3 K < s alias only onto modes above K.
        self.mask = ((3 * kx.abs() < s) & (3 * ky < s)).to(dtype)

    def rfft2(self, field: Tensor) -> Tensor:
        # (contiguous: torch 2.5's MKL FFT refuses expanded, stride-0 input)
        return torch.fft.rfft2(field.contiguous())

    def irfft2(self, spec: Tensor) -> Tensor:
        return torch.fft.irfft2(spec, s=(self.s, self.s))

    def velocity(self, w_hat: Tensor) -> tuple[Tensor, Tensor]:
        """``(u, v)^ = (d_y psi, -d_x psi)^`` with ``psi^ = w^ / |k|^2`` (mean of psi: 0)."""
        psi = w_hat * self.inv_k2
        return self.dy * psi, -self.dx * psi

    def advection(self, w_hat: Tensor) -> Tensor:
        """``-(u . grad w)^`` of the 2/3-truncated vorticity, itself 2/3-truncated: exact (no
        aliasing) on the kept modes.  ``w_hat (B, s, s//2+1)``."""
        w = w_hat * self.mask
        u, v = self.velocity(w)
        u, v, wx, wy = self.irfft2(torch.stack((u, v, self.dx * w, self.dy * w), dim=1)).unbind(1)
        return -self.mask * self.rfft2(u * wx + v * wy)

    def forcing(self, amplitude: float, n: int, dtype: torch.dtype,
                device: torch.device) -> Tensor:
        """Spectrum of ``-A n cos(n y)`` (axis -1 is y); shape ``(s, s//2+1)``."""
        y = 2 * math.pi * torch.arange(self.s, dtype=dtype, device=device) / self.s
        return self.rfft2((-amplitude * n * torch.cos(n * y)).expand(self.s, self.s))


def _check_vorticity(omega: object, name: str, min_size: int = 4) -> Tensor:
    """``omega`` as a finite real tensor of shape ``(B, s, s)``, ``B >= 1``, ``s >= min_size``."""
    omega = check_tensor(omega, name, 3, "(B, s, s)")
    if omega.dtype not in _DTYPES:  # torch.fft has no (CPU) half-precision transforms
        raise TypeError(f"{name}: expected float32 or float64, got {omega.dtype}")
    batch, s1, s2 = omega.shape
    if s1 != s2 or s1 < min_size or batch < 1:
        raise ValueError(f"{name}: expected shape (B, s, s) with B >= 1 and s >= {min_size}, "
                         f"got {tuple(omega.shape)}")
    if not bool(torch.isfinite(omega).all()):
        raise ValueError(f"{name}: expected finite values, found NaN or inf")
    return omega


def _check_dtype(dtype: object) -> torch.dtype:
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected torch.float32 or torch.float64, got {dtype!r}")
    assert isinstance(dtype, torch.dtype)
    return dtype


def _check_forcing(forcing: object) -> float:
    """``True``/``False`` -> amplitude 1/0; a real number is the amplitude ``A`` itself."""
    if isinstance(forcing, bool):
        return 1.0 if forcing else 0.0
    if not isinstance(forcing, numbers.Real) or not math.isfinite(forcing):
        raise TypeError(f"forcing: expected a bool or a finite float amplitude, got {forcing!r}")
    return float(forcing)


def _check_physics(nu: object, wavenumber: object, forcing: object, s: int
                   ) -> tuple[float, int, float]:
    nu = check_float(nu, "nu", low_inclusive=True)
    n = check_int(wavenumber, "wavenumber")
    amplitude = _check_forcing(forcing)
    if amplitude != 0.0 and s <= 2 * n:
        raise ValueError(f"wavenumber: the forcing cos({n} y) needs a grid of s > {2 * n} "
                         f"points, got s = {s}")
    return nu, n, amplitude


def velocity_from_vorticity(omega: Tensor) -> Tensor:
    """Velocity ``(u, v) = (d_y psi, -d_x psi)``, ``-Lap psi = omega`` (spectral, no truncation).

    ``omega``: shape ``(B, s, s)``, real floating point, any device.  Returns ``(B, 2, s, s)``
    (``[:, 0] = u``, ``[:, 1] = v``), ``omega``'s dtype and device.  The mean of ``omega`` (not
    the curl of a periodic velocity) is ignored.
    """
    omega = _check_vorticity(omega, "omega", 2)
    ops = _Spectral(omega.shape[-1], omega.dtype, omega.device)
    u, v = ops.velocity(ops.rfft2(omega))
    return ops.irfft2(torch.stack((u, v), dim=1))


def kolmogorov_tendency(
    omega: Tensor,
    *,
    nu: float = KOLMOGOROV_NU,
    wavenumber: int = KOLMOGOROV_WAVENUMBER,
    forcing: bool | float = True,
) -> Tensor:
    """The right-hand side ``d_t w = -u . grad w + nu Lap w - A n cos(n y)`` (``n`` =
    ``wavenumber``) the solver integrates (advection 2/3 de-aliased as in
    :func:`solve_kolmogorov`), on the grid.

    ``omega``: ``(B, s, s)``; returns ``(B, s, s)`` with its dtype and device.
    """
    omega = _check_vorticity(omega, "omega")
    s = omega.shape[-1]
    nu, n, amplitude = _check_physics(nu, wavenumber, forcing, s)
    ops = _Spectral(s, omega.dtype, omega.device)
    w_hat = ops.rfft2(omega)
    rhs = ops.advection(w_hat) - nu * ops.k2 * w_hat
    if amplitude != 0.0:
        rhs = rhs + ops.forcing(amplitude, n, omega.dtype, omega.device)
    return ops.irfft2(rhs)


def persistence_errors(w_in: Tensor, w_out: Tensor) -> Tensor:
    """Per-sample relative error ``||w_out - w_in|| / ||w_out||`` of the persistence forecast
    (predicting no change) over grids ``(B, ...)`` of the same shape; ``(B,)`` float64."""
    if not isinstance(w_in, Tensor) or not isinstance(w_out, Tensor) or w_in.shape != w_out.shape \
            or w_in.dim() < 2:
        raise ValueError(f"w_in, w_out: expected two tensors (B, ...) of one shape, got "
                         f"{getattr(w_in, 'shape', type(w_in).__name__)} and "
                         f"{getattr(w_out, 'shape', type(w_out).__name__)}")
    w_in, w_out = w_in.double().flatten(1), w_out.double().flatten(1)
    scale = w_out.norm(dim=1)
    if bool((scale == 0).any()):
        raise ValueError(f"w_out: sample {int((scale == 0).nonzero()[0])} is zero everywhere, so "
                         "an error relative to it is undefined")
    return (w_out - w_in).norm(dim=1) / scale


def cfl_number(omega: Tensor, dt: float) -> Tensor:
    """CFL number ``dt * max (|u| + |v|) / h`` of each state, ``h = 2 pi / s``; shape ``(B,)``.

    SPEC-continuum §3 asks for CFL <= 1 along the trajectories (``dt = 2.5e-3`` at 416^2).
    """
    dt = check_float(dt, "dt")
    vel = velocity_from_vorticity(omega)
    h = 2 * math.pi / omega.shape[-1]
    return dt * (vel[:, 0].abs() + vel[:, 1].abs()).amax(dim=(-2, -1)) / h


# ----------------------------------------------------------------------------------------------
# Solver
# ----------------------------------------------------------------------------------------------


def _check_snapshots(snapshots: object, t_end: float) -> list[float]:
    if isinstance(snapshots, (str, bytes)) or not isinstance(snapshots, (Sequence, np.ndarray)):
        raise TypeError(f"snapshots: expected None or a sequence of times, got "
                        f"{type(snapshots).__name__}")
    times = [check_float(t, f"snapshots[{i}]", low=0.0, low_inclusive=True, high=t_end)
             for i, t in enumerate(snapshots)]
    if not times:
        raise ValueError("snapshots: expected at least one time, got an empty sequence")
    if any(b <= a for a, b in zip(times[:-1], times[1:], strict=True)):
        raise ValueError(f"snapshots: expected strictly increasing times, got {times}")
    return times


def solve_kolmogorov(
    omega0: Tensor,
    t_end: float,
    *,
    max_step: float,
    nu: float = KOLMOGOROV_NU,
    wavenumber: int = KOLMOGOROV_WAVENUMBER,
    forcing: bool | float = True,
    snapshots: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Integrate the Kolmogorov flow from ``omega0`` (pseudo-spectral, 2/3 rule, IF-RK4).

    Args:
        omega0: initial vorticity, shape ``(B, s, s)`` (``B >= 1``, ``s >= 4``), at
            ``(x_i, y_j) = 2 pi (i, j) / s`` with axis -2 = ``x``; real, finite, any device (the
            computation runs there).
        t_end: final time ``> 0``.
        max_step: largest time step ``> 0`` (as :func:`.ode.rk4`'s).  The interval between
            consecutive output times (``0``, the snapshots, or ``t_end``) of length ``L`` is
            covered by ``m = ceil(L / max_step)`` equal steps ``L / m`` (a relative slack of 1e-9
            absorbs rounding), so every output time is hit exactly and the step is ``max_step``
            itself when the times are multiples of it.
        nu: viscosity ``>= 0`` (``0``: inviscid, the truncated Euler equations).
        wavenumber: ``n >= 1`` of the forcing; with forcing, ``s > 2 n`` is required.
        forcing: ``True`` (amplitude 1, SPEC), ``False`` (unforced) or the amplitude ``A`` of the
            body force ``A sin(n y) x``.
        snapshots: output times, strictly increasing, in ``[0, t_end]``; the integration stops at
            the last one.  ``None``: only ``t_end``.
        dtype: computation and output dtype, ``torch.float64`` (default) or ``torch.float32``.

    Returns:
        ``(B, s, s)`` at ``t_end`` if ``snapshots`` is None, else ``(B, len(snapshots), s, s)``;
        ``dtype`` on ``omega0``'s device.

    Raises:
        SolverError: the solution became non-finite (``max_step`` too large: check
            :func:`cfl_number`).
    """
    omega0 = _check_vorticity(omega0, "omega0")
    t_end = check_float(t_end, "t_end")
    max_step = check_float(max_step, "max_step")
    s = omega0.shape[-1]
    nu, n, amplitude = _check_physics(nu, wavenumber, forcing, s)
    dtype = _check_dtype(dtype)
    times = [t_end] if snapshots is None else _check_snapshots(snapshots, t_end)

    device = omega0.device
    ops = _Spectral(s, dtype, device)
    force = ops.forcing(amplitude, n, dtype, device) if amplitude != 0.0 else None

    def nonlinear(w_hat: Tensor) -> Tensor:  # everything but the viscous term
        adv = ops.advection(w_hat)
        return adv if force is None else adv + force

    def step(w: Tensor, h: float, e: Tensor, e2: Tensor) -> Tensor:
        # Lawson RK4: classical RK4 on exp(nu |k|^2 t) w^, written back in terms of w^.
        n1 = nonlinear(w)
        e2w = e2 * w
        n2 = nonlinear(e2w + (0.5 * h) * (e2 * n1))
        n3 = nonlinear(e2w + (0.5 * h) * n2)
        n4 = nonlinear(e * w + h * (e2 * n3))
        return e * (w + (h / 6) * n1) + (h / 3) * (e2 * (n2 + n3)) + (h / 6) * n4

    w = ops.rfft2(omega0.to(dtype))
    factors: dict[float, tuple[Tensor, Tensor]] = {}  # integrating factors by step length
    out = []
    t_prev = 0.0
    for t in times:
        length = t - t_prev
        if length > 0:
            m = fewest_steps(length, max_step)
            h = length / m
            if h not in factors:
                factors[h] = (torch.exp(-nu * h * ops.k2), torch.exp(-0.5 * nu * h * ops.k2))
            e, e2 = factors[h]
            for _ in range(m):
                w = step(w, h, e, e2)
        out.append(ops.irfft2(w))
        t_prev = t
    result = out[0] if snapshots is None else torch.stack(out, dim=1)
    if not bool(torch.isfinite(result).all()):
        raise SolverError(f"solve_kolmogorov: the solution became non-finite; max_step = "
                          f"{max_step:g} is too large (check cfl_number)")
    return result


# ----------------------------------------------------------------------------------------------
# Resampling
# ----------------------------------------------------------------------------------------------


def _resize_axis(c: Tensor, dim: int, size: int) -> Tensor:
    """Change the Fourier coefficients ``c`` (``norm="forward"``: those of the continuous field)
    along ``dim`` from ``c.shape[dim]`` points to ``size``.

    Modes ``|k| < m / 2`` (``m`` the smaller size) are copied.  For even ``m`` the Nyquist mode of
    the smaller grid holds the cosine ``cos(m x / 2)``: going down, it receives ``c_{m/2} +
    c_{-m/2}`` (the projection onto that cosine); going up, it is split evenly onto ``+-m/2``.
    So up-then-down is the identity, and both are exact for trigonometric polynomials that the
    smaller grid represents.
    """
    n = c.shape[dim]
    if n == size:
        return c
    m = min(n, size)
    half = (m - 1) // 2  # modes -half..half are kept as they are
    parts = [c.narrow(dim, 0, half + 1)]
    if m % 2 == 0:
        k = m // 2
        if size < n:
            parts.append(c.narrow(dim, k, 1) + c.narrow(dim, n - k, 1))
        else:
            nyq = c.narrow(dim, k, 1) / 2
            zeros = list(c.shape)
            zeros[dim] = size - 2 * half - 3  # between the two copies of the Nyquist
            parts += [nyq, c.new_zeros(zeros), nyq]
    else:
        zeros = list(c.shape)
        zeros[dim] = size - 2 * half - 1
        parts.append(c.new_zeros(zeros))
    if half > 0:
        parts.append(c.narrow(dim, n - half, half))
    return torch.cat(parts, dim=dim)


def resample_periodic(field: Tensor, size: int) -> Tensor:
    """Resample periodic fields on uniform grids to ``size x size`` points, spectrally.

    ``field``: shape ``(..., s_1, s_2)`` (samples at ``2 pi (i / s_1, j / s_2)``), real floating
    point.  Returns ``(..., size, size)`` with ``field``'s dtype and device: the trigonometric
    interpolant evaluated on the new grid, truncated to its modes when a size shrinks (see
    :func:`_resize_axis` for the Nyquist mode).  Exact for band-limited data the smaller grid
    represents; the same size returns ``field`` unchanged; up-then-down returns the input.
    """
    if not isinstance(field, Tensor):
        raise TypeError(f"field: expected a tensor of shape (..., s_1, s_2), got "
                        f"{type(field).__name__}")
    if field.dim() < 2 or 0 in field.shape[-2:]:
        raise ValueError(f"field: expected shape (..., s_1, s_2) with s_1, s_2 >= 1, got "
                         f"{tuple(field.shape)}")
    if field.dtype not in _DTYPES:
        raise TypeError(f"field: expected a real floating-point tensor (float32 or float64), "
                        f"got {field.dtype}")
    size = check_int(size, "size")
    if tuple(field.shape[-2:]) == (size, size):
        return field
    c = torch.fft.fft2(field, norm="forward")
    c = _resize_axis(_resize_axis(c, -2, size), -1, size)
    return torch.fft.ifft2(c, norm="forward").real.contiguous()
