"""Viscous Burgers solver: pseudo-spectral in space, ETDRK4 in time, batched, CPU or GPU.

Solves ``u_t + (u^2 / 2)_x = nu * u_xx`` on the periodic unit interval ``[0, 1)``.  A state is
sampled on ``x_j = j / N`` (``j = 0..N-1``); it is advanced in Fourier space with the
exponential time differencing Runge-Kutta scheme of Cox & Matthews in the form of Kassam &
Trefethen (2005), whose phi-function coefficients are evaluated by a contour integral to
avoid cancellation for small ``h * L``.  The quadratic term is de-aliased with the 2/3 rule.

The solution at ``t = 1`` with ``nu = 0.1`` is analytic with a spectrum far below machine
precision beyond a few hundred modes, so :func:`solve_burgers` can advance a Fourier-truncated
copy (``solve_resolution``) and zero-pad the result back to the input grid; the test-suite
checks that this agrees with the full-resolution solve.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import torch

from .._checks import check_float, check_int
from .._scaling import fewest_steps
from .storage import SolverError

__all__ = ["solve_burgers", "etdrk4_coefficients", "default_n_steps"]

# Number of contour points for the phi-functions; 64 gives ~1e-15 relative accuracy.
_CONTOUR_POINTS = 64


def default_n_steps(t_end: float, nu: float, u_max: float = 2.0) -> int:
    """Default number of ETDRK4 steps: ``dt = 1e-3`` scaled down for large ``u_max`` or tiny ``nu``.

    ``dt = 1e-3`` gives errors ~1e-12 for the SPEC's data (``nu = 0.1``, ``|u0| <~ 2``); the
    advective time scale shrinks like ``1/u_max``, so the step does too.
    """
    t_end, nu = check_float(t_end, "t_end"), check_float(nu, "nu")
    u_max = check_float(u_max, "u_max", low_inclusive=True)  # 0: a zero initial condition
    dt = 1e-3 * min(1.0, 2.0 / max(u_max, 1e-12)) * min(1.0, (nu / 0.1) ** 0.5)
    return fewest_steps(t_end, dt)


def etdrk4_coefficients(
    lin: torch.Tensor, dt: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """ETDRK4 coefficients for the diagonal linear operator ``lin`` (real, shape ``(M,)``).

    Returns ``(E, E2, Q, f1, f2, f3)``, each of shape ``(M,)`` and ``lin``'s dtype/device, as in
    Kassam & Trefethen (2005), eq. (2.5) with the contour-integral evaluation of their §5.
    """
    if not isinstance(lin, torch.Tensor) or lin.ndim != 1 or not lin.is_floating_point():
        raise TypeError("lin: expected a real floating-point 1-D tensor of diagonal operator "
                        f"entries, got {getattr(lin, 'dtype', type(lin).__name__)} "
                        f"{tuple(getattr(lin, 'shape', ()))}")
    if not bool(torch.isfinite(lin).all()):
        raise ValueError("lin: expected finite entries, got NaN or inf")
    dt = check_float(dt, "dt")
    hl = (dt * lin).to(torch.float64)
    j = torch.arange(1, _CONTOUR_POINTS + 1, dtype=torch.float64, device=lin.device)
    roots = torch.exp(1j * math.pi * (j - 0.5) / _CONTOUR_POINTS)
    lr = hl[:, None].to(torch.complex128) + roots[None, :]
    elr = torch.exp(lr)
    q = dt * torch.mean((torch.exp(lr / 2) - 1) / lr, dim=1).real
    f1 = dt * torch.mean((-4 - lr + elr * (4 - 3 * lr + lr**2)) / lr**3, dim=1).real
    f2 = dt * torch.mean((2 + lr + elr * (lr - 2)) / lr**3, dim=1).real
    f3 = dt * torch.mean((-4 - 3 * lr - lr**2 + elr * (4 - lr)) / lr**3, dim=1).real
    out = (torch.exp(hl), torch.exp(hl / 2), q, f1, f2, f3)
    return tuple(t.to(lin.dtype) for t in out)  # type: ignore[return-value]


def _as_tensor(u0: object) -> tuple[torch.Tensor, bool]:
    if isinstance(u0, torch.Tensor):
        return u0, False
    if isinstance(u0, np.ndarray):
        return torch.from_numpy(np.asarray(u0)), True
    raise TypeError(f"u0 must be a numpy.ndarray or torch.Tensor, got {type(u0).__name__}")


def _truncate(u_hat: torch.Tensor, n_from: int, n_to: int) -> torch.Tensor:
    """Change the grid of an rfft spectrum from ``n_from`` to ``n_to`` points (truncate or pad).

    The Nyquist mode of the smaller grid is dropped: its sine part is not representable.
    """
    m_small = min(n_from, n_to)
    keep = (m_small + 1) // 2  # modes 0..keep-1 are unambiguous on both grids
    out = u_hat.new_zeros(u_hat.shape[:-1] + (n_to // 2 + 1,))
    out[..., :keep] = u_hat[..., :keep] * (n_to / n_from)
    return out


@overload
def solve_burgers(u0: np.ndarray, nu: float = ..., t_end: float = ..., *,
                  n_steps: int | None = ..., solve_resolution: int | None = ...) -> np.ndarray: ...
@overload
def solve_burgers(u0: torch.Tensor, nu: float = ..., t_end: float = ..., *,
                  n_steps: int | None = ...,
                  solve_resolution: int | None = ...) -> torch.Tensor: ...
def solve_burgers(
    u0: np.ndarray | torch.Tensor,
    nu: float = 0.1,
    t_end: float = 1.0,
    *,
    n_steps: int | None = None,
    solve_resolution: int | None = None,
) -> np.ndarray | torch.Tensor:
    """Solve periodic viscous Burgers from ``u0`` to ``t_end``.

    Args:
        u0: initial values, shape ``(B, N)`` or ``(N,)``, sampled at ``x_j = j / N``; NumPy array
            or torch tensor (any device).  Computation is in float64 (complex128 spectra).
        nu: viscosity ``> 0``.
        t_end: final time ``> 0``.
        n_steps: number of ETDRK4 steps (default :func:`default_n_steps`, ``dt <= 1e-3``).
        solve_resolution: if given (``4 <= M <= N``), advance only the first ``M // 2`` Fourier
            modes (a grid of ``M`` points) and zero-pad the result back to ``N`` points.
            Accurate when ``u(t_end)`` is resolved on ``M`` points (``M = 1024`` for SPEC data).

    Returns:
        ``u(., t_end)`` with the shape of ``u0``: a NumPy float64 array for NumPy input, else a
        tensor on ``u0``'s device with ``u0``'s floating dtype.

    Raises:
        SolverError: the solution became non-finite (too few ``n_steps`` for ``nu`` and the
            resolution).
    """
    u, from_numpy = _as_tensor(u0)
    if u.ndim not in (1, 2):
        raise ValueError(f"u0 must have shape (B, N) or (N,), got shape {tuple(u.shape)}")
    if u.is_complex() or not (u.is_floating_point() or u.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"u0 must hold real numbers, got dtype {u.dtype}")
    n = u.shape[-1]
    if n < 4:
        raise ValueError(f"u0 must have at least 4 points along its last axis, got {n}")
    if u.numel() == 0:
        raise ValueError(f"u0 must not be empty, got shape {tuple(u.shape)}")
    if not bool(torch.isfinite(u).all()):
        raise ValueError("u0 must be finite (found NaN or inf)")
    nu = check_float(nu, "nu")
    t_end = check_float(t_end, "t_end")
    m = n
    if solve_resolution is not None:
        m = check_int(solve_resolution, "solve_resolution", 4)
    if m > n:
        raise ValueError(f"solve_resolution must be <= the number of points N={n}, got {m}")
    if n_steps is None:
        n_steps = default_n_steps(t_end, nu, float(u.abs().max()))
    n_steps = check_int(n_steps, "n_steps")

    out_dtype = u.dtype if u.is_floating_point() else torch.float64
    squeeze = u.ndim == 1
    u64 = u.reshape(-1, n).to(torch.float64)
    v = torch.fft.rfft(u64, dim=-1)
    if m != n:
        v = _truncate(v, n, m)

    dt = t_end / n_steps
    modes = torch.arange(m // 2 + 1, device=u.device)
    wave = 2 * math.pi * modes.to(torch.float64)
    e, e2, q, f1, f2, f3 = etdrk4_coefficients(-nu * wave**2, dt)
    # Nonlinear term -(u^2/2)_x = -0.5 i k FFT(u^2); the 2/3 rule keeps the modes 3|k| < m, whose
    # products alias onto none of them (k = m/3 would alias onto itself), and removes the
    # (sine-less) Nyquist mode of an even grid.
    g = -0.5j * wave.to(torch.complex128)
    g[3 * modes >= m] = 0
    if m % 2 == 0:
        g[-1] = 0

    def nonlinear(w: torch.Tensor) -> torch.Tensor:
        phys = torch.fft.irfft(w, n=m, dim=-1)
        return g * torch.fft.rfft(phys * phys, dim=-1)

    for _ in range(n_steps):
        nv = nonlinear(v)
        a = e2 * v + q * nv
        na = nonlinear(a)
        b = e2 * v + q * na
        nb = nonlinear(b)
        c = e2 * a + q * (2 * nb - nv)
        nc = nonlinear(c)
        v = e * v + nv * f1 + 2 * (na + nb) * f2 + nc * f3

    if not bool(torch.isfinite(v).all()):
        raise SolverError(f"solve_burgers: the solution became non-finite; n_steps = {n_steps} "
                          f"is too few for nu = {nu:g} on {m} points")
    if m != n:
        v = _truncate(v, m, n)
    result = torch.fft.irfft(v, n=n, dim=-1)
    result = result.reshape(n) if squeeze else result.reshape(u.shape)
    if from_numpy:
        return result.cpu().numpy()
    return result.to(out_dtype)
