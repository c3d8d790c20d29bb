"""PyTorch datasets for the three experiments (SPEC §4-5) and their helpers.

Every item is a dict of float tensors (``dtype``, default float32); a ``DataLoader`` batches them
into a dict with a leading batch axis.  Layouts (``n`` fine points per axis, ``nc`` coarse):

* :class:`BurgersDataset` (grid ``x_j = j / n`` on the periodic ``[0, 1)``, subsampled by
  ``8192 / n``): ``x`` ``(n, 1)`` initial condition, ``grid`` ``(n, 1)``, ``target`` ``(n, 1)``
  solution at t = 1, ``target_grad`` ``(n, 1)`` its periodic central difference (for the H^1
  term).  Data are not normalised; ``target_normalizer`` (scalar, fitted on the training
  targets) is what the model uses to scale its output.
* :class:`DarcyDataset` (nodes ``x_i = i / (n - 1)``, subsampled by ``(K - 1) / (n - 1)``):
  ``x`` ``(n, n, 1)`` coefficient after the pointwise unit-Gaussian normaliser,
  ``coeff`` ``(n, n, 1)`` raw coefficient (weights the H^1 term), ``grid`` ``(n, n, 2)`` with
  ``grid[i, j] = (x_i, y_j)``, ``pos`` ``(nc, nc, 2)`` the coarse grid of the attention layers,
  ``target`` ``(n, n, 1)`` raw solution, ``target_grad`` ``(n, n, 2)`` its central differences
  ``(d/dx, d/dy)`` at interior nodes, zero on the boundary ring.  ``target_normalizer`` (fitted
  on the training targets) is what the model uses to de-normalise its output.
* :class:`DarcyInverseDataset`: ``x`` ``(n, n, 1)`` normalised solution plus static noise
  ``noise * N(0, 1)``, ``grid`` ``(n, n, 2)``, ``pos`` ``(nc, nc, 2)``, ``target`` ``(nc, nc, 1)``
  coefficient subsampled to the fine grid (or ``target_resolution``'s) and block-averaged from
  it to the coarse one (:func:`block_average`), as the original code does.

Continuum-attention sets (SPEC-continuum §3-4; our ``.h5`` files only), with inputs *and*
targets normalised by unit-Gaussian normalisers fitted on the training split (per component in
1-D, one global scalar in 2-D, so that they serve every grid), and three splits: ``"train"`` =
the first ``n_train`` samples, ``"valid"`` = the next ``n_valid``, ``"test"`` = the last
``n_test`` (a zero-shot file holds test samples only; pass the training set's normalisers):

* :class:`ODEDataset` (Lorenz-63, controlled ODE; ``T`` stored times): ``x`` ``(T, 1)``,
  ``grid`` ``(T, 1)`` the times, ``target`` ``(T, d_z)``, and for Lorenz-63 (a) ``token0``
  ``(4,)`` = ``[x(0), y(0), z(0), t_0]`` (normalised but ``t_0``).
* :class:`ContinuumDarcyDataset` (nodes ``x_i = i / (s - 1)`` of the stored ``s``): ``x``
  ``(s, s, 1)`` coefficient, ``coeff`` ``(s, s, 1)`` the raw coefficient, ``grid``
  ``(s, s, 2)``, ``target`` ``(s, s, 1)`` solution.
* :class:`KolmogorovDataset` (periodic grid ``(i / s, j / s)`` on ``[0, 1)^2`` of the stored or
  a spectrally resampled ``s``): ``x`` ``(s, s, 1)`` vorticity ``w(T)``, ``grid`` ``(s, s, 2)``,
  ``target`` ``(s, s, 1)`` vorticity ``w(T + dt_out)``; one scalar normaliser for both.

Splits: ``"train"`` = the first ``n_train`` samples, ``"test"`` = the last ``n_test``, never
overlapping (a source of test samples only is read with ``n_train=0``).  ``"test"`` is both
the set the paper's protocol picks the best epoch on (the original code calls it its
validation set) and the one it reports (the example scripts' ``--n-eval``); the continuum sets
keep the two apart, with a ``"valid"`` split between.  The
normalisers are fitted on the training samples of the same source unless given.  A source is a
file written by :mod:`.generate` (``.h5``), an original ``.mat`` file, or a pair ``(a, u)`` of
arrays.

Every dataset reads its split into memory when it is built (from ``.h5`` files 64 samples at a
time, keeping only the points it uses) and closes the file: items are then views of tensors,
and DataLoader workers open nothing. Workers started by spawn (the default on macOS and
Windows) each get a pickled copy of the split; fork shares it.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, cast, overload

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from .._checks import (
    check_bool,
    check_choice,
    check_float,
    check_float_dtype,
    check_index,
    check_int,
    check_statistics,
)
from .._scaling import largest_magnitude
from . import mat as _mat
from .random_fields import sample_rng
from .storage import DataFileError, DataMismatchError, inspect_h5, read_h5

__all__ = [
    "UnitGaussianNormalizer",
    "central_gradient_1d",
    "central_gradient_2d",
    "block_average",
    "check_darcy_grids",
    "uniform_grid_1d",
    "uniform_grid_2d",
    "BurgersDataset",
    "DarcyDataset",
    "DarcyInverseDataset",
    "ODEDataset",
    "ContinuumDarcyDataset",
    "KolmogorovDataset",
    "periodic_grid_2d",
    "ODE_TASKS",
    "DARCY_COARSE",
    "INVERSE_COARSE",
    "paired_coarse",
]

#: Coarse (attention) grid for each fine Darcy resolution (SPEC §3, CiNN sizes).
DARCY_COARSE = {211: 61, 141: 43, 85: 29}
#: Coarse target grid for each fine inverse-problem resolution (SPEC §4).
INVERSE_COARSE = {141: 36, 211: 71}

_STREAM_NOISE = 3  # random stream of the inverse problem's static noise

#: Tasks of :class:`ODEDataset`: the generator each reads and the output components it learns.
ODE_TASKS = {"cde": "cde", "l63_a": "lorenz63", "l63_b": "lorenz63"}

Source = str | os.PathLike[str] | tuple[np.ndarray, np.ndarray]
UNIT_GAUSSIAN_EPS = 1e-5  # SPEC §4's (the grid datasets' normalisers)


_STATISTICS_BLOCK = 1 << 20  # float64 elements of data a normaliser's fit takes at a time


def _sample_statistics(x: torch.Tensor, correction: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 mean and std over axis 0 of ``x`` ``(n, ...)``, each of shape ``x.shape[1:]``,
    taken over blocks of samples: float64 copies of a whole float32 training set took 4.7
    times its size on top of it (200 Darcy samples at 421², 135 MiB: 641 MiB more; the blocks
    take 32 MiB).

    The sums are of values over a power of two near their largest magnitude (exact; _scaling):
    squares of values beyond 1e154, and differences of values near 1e308, overflow float64
    (std or mean inf, every encoded value 0 or NaN). The mean's sums are of differences from
    the first sample, so that a constant entry has exactly its value as mean and 0 as std."""
    x = x.detach()
    rows = max(1, _STATISTICS_BLOCK // max(1, x[0].numel()))
    blocks = [slice(start, start + rows) for start in range(0, x.shape[0], rows)]
    first = x[0].to(torch.float64)
    peak = torch.zeros_like(first)
    for rows_of in blocks:  # (in x's dtype: its extremes and finiteness are exact there)
        block = x[rows_of]
        finite = block.isfinite().reshape(block.shape[0], -1).all(dim=1)
        if not bool(finite.all()):  # the statistics would be NaN for every sample
            raise ValueError(f"data: expected finite values, sample "
                             f"{rows_of.start + int((~finite).nonzero()[0])} has NaN or infinity")
        extreme = torch.maximum(block.amax(dim=0), block.amin(dim=0).neg())
        torch.maximum(peak, extreme.to(torch.float64), out=peak)
    # 2^(e - 1) <= peak < 2^e: scaled values within [-2, 2], and no rounding in the scaling
    exponent = torch.frexp(largest_magnitude(peak[None], 0)[0]).exponent
    size = torch.ldexp(torch.ones_like(peak), exponent - 1)
    scaled_first = first / size
    total = torch.zeros_like(peak)
    for rows_of in blocks:
        total += x[rows_of].to(torch.float64, copy=True).div_(size).sub_(scaled_first).sum(dim=0)
    scaled_mean = scaled_first + total / x.shape[0]
    mean = scaled_mean * size
    squares = torch.zeros_like(peak)
    for rows_of in blocks:
        block = x[rows_of].to(torch.float64, copy=True)
        squares += block.div_(size).sub_(scaled_mean).square_().sum(dim=0)
    return mean, (squares / (x.shape[0] - correction)).sqrt_().mul_(size)


class UnitGaussianNormalizer(torch.nn.Module):
    """Pointwise ``(x - mean) / (std + eps)`` with mean/std over the sample axis.

    ``mean`` and ``std`` are buffers of the per-sample shape, so the normaliser moves with
    ``.to(device)`` and is saved in a model's ``state_dict``.  ``correction=0`` (default): the
    population std of SPEC §4; ``correction=1``: the unbiased std of the GNOT reference
    (SPEC-gnot §3, there with ``eps=1e-8``).
    """

    mean: torch.Tensor  # (buffers)
    std: torch.Tensor

    def __init__(self, data: torch.Tensor | np.ndarray, eps: float = UNIT_GAUSSIAN_EPS, *,
                 correction: int = 0) -> None:
        super().__init__()
        x = torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor) else data)
        if correction not in (0, 1) or isinstance(correction, bool):
            raise ValueError(f"correction: expected 0 (population std) or 1 (unbiased), "
                             f"got {correction!r}")
        if x.ndim < 1 or x.shape[0] < 1 + correction or not x.is_floating_point():
            raise ValueError(
                f"data must be a floating array of shape (n_samples, ...) with n_samples >= "
                f"{1 + correction}, got shape {tuple(x.shape)} and dtype {x.dtype}"
            )
        self.eps = check_float(eps, "eps", low_inclusive=True)
        mean, std = _sample_statistics(x, correction)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    @classmethod
    def from_statistics(cls, mean: torch.Tensor, std: torch.Tensor,
                        eps: float = UNIT_GAUSSIAN_EPS) -> UnitGaussianNormalizer:
        """A normaliser with the given ``mean`` and ``std`` (same shape; e.g. from a
        checkpoint), in their dtype."""
        check_statistics(mean, std)
        norm = cls(torch.zeros((1, *mean.shape), dtype=mean.dtype), eps)
        norm.mean = mean.detach().clone()
        norm.std = std.detach().clone().to(mean.dtype)
        return norm

    def _check(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise TypeError(f"x: expected a floating-point tensor (the result keeps its dtype), "
                            f"got {got}")
        shape = tuple(self.mean.shape)
        if tuple(x.shape[x.ndim - len(shape) :]) != shape:
            raise ValueError(f"x must end with the fitted shape {shape}, got {tuple(x.shape)}")
        if x.device != self.mean.device:
            raise ValueError(f"x: expected a tensor on {self.mean.device}, where the statistics "
                             f"are (move the normaliser with .to()), got one on {x.device}")

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` of shape ``(..., *sample_shape)``; keeps ``x``'s dtype."""
        self._check(x)
        return ((x - self.mean) / (self.std + self.eps)).to(x.dtype)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Undo :meth:`encode`; keeps ``x``'s dtype."""
        self._check(x)
        return (x * (self.std + self.eps) + self.mean).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`encode`."""
        return self.encode(x)


def central_gradient_1d(u: torch.Tensor, h: float) -> torch.Tensor:
    """Periodic central difference ``(u[j+1] - u[j-1]) / (2h)`` along the last axis; same shape.

    ``u`` of shape ``(..., n)`` needs ``n >= 3`` (with 1 or 2 points both neighbours are the
    same point and the difference is 0 whatever ``u`` is).
    """
    if not isinstance(u, torch.Tensor):
        raise TypeError(f"u: expected a tensor of shape (..., n), got {type(u).__name__}")
    if u.ndim < 1 or u.shape[-1] < 3:
        raise ValueError(f"u: expected shape (..., n) with n >= 3, got {tuple(u.shape)}")
    if not u.is_floating_point():
        raise TypeError(f"u: expected a floating-point tensor, got {u.dtype}")
    h = check_float(h, "h")
    return (torch.roll(u, -1, dims=-1) - torch.roll(u, 1, dims=-1)) / (2 * h)


def central_gradient_2d(u: torch.Tensor, h: float, *, periodic: bool = False) -> torch.Tensor:
    """Central differences of ``u`` of shape ``(..., n, n)`` -> ``(..., n, n, 2)``.

    Component 0 is ``d/dx`` (first grid axis), 1 is ``d/dy``.  ``periodic=False``: interior
    nodes only, zero on the boundary ring (where a central difference does not exist);
    ``periodic=True``: at every point of a periodic grid (no repeated endpoint), wrapping
    around.
    """
    if not isinstance(u, torch.Tensor):
        raise TypeError(f"u: expected a tensor of shape (..., n, n), got {type(u).__name__}")
    if u.ndim < 2 or min(u.shape[-2:]) < 3:
        raise ValueError(f"u: expected shape (..., n1, n2) with n1, n2 >= 3, got "
                         f"{tuple(u.shape)}")
    if not u.is_floating_point():  # (an integer grid would be written into truncated)
        raise TypeError(f"u: expected a floating-point tensor, got {u.dtype}")
    h = check_float(h, "h")
    check_bool(periodic, "periodic")
    if periodic:
        return torch.stack([(u.roll(-1, dim) - u.roll(1, dim)) / (2 * h) for dim in (-2, -1)],
                           dim=-1)
    grad = u.new_zeros((*u.shape, 2))
    grad[..., 1:-1, 1:-1, 0] = (u[..., 2:, 1:-1] - u[..., :-2, 1:-1]) / (2 * h)
    grad[..., 1:-1, 1:-1, 1] = (u[..., 1:-1, 2:] - u[..., 1:-1, :-2]) / (2 * h)
    return grad


def _block_weights(k: int, nc: int) -> np.ndarray:
    """``(nc, k)`` averaging weights of :func:`block_average`: row ``J`` is ``1 / count`` on the
    fine nodes ``s J - (s - 1) // 2, …, s J - (s - 1) // 2 + s - 1`` that exist."""
    s = (k - 1) // (nc - 1)
    first = s * np.arange(nc)[:, None] - (s - 1) // 2
    offset = np.arange(k)[None, :] - first
    w = np.where((offset >= 0) & (offset < s), 1.0, 0.0)
    return w / w.sum(axis=1, keepdims=True)


@overload
def block_average(a: np.ndarray, coarse: int) -> np.ndarray: ...
@overload
def block_average(a: torch.Tensor, coarse: int) -> torch.Tensor: ...
def block_average(a: np.ndarray | torch.Tensor, coarse: int) -> np.ndarray | torch.Tensor:
    """Average ``a`` of shape ``(..., K, K)`` onto ``coarse`` nodes per axis, as the original
    code makes the inverse problem's targets (SPEC §4: 141 → 36, 211 → 71).

    ``s = (K - 1) / (coarse - 1)`` must be an integer. The nodes are cut into consecutive
    blocks of ``s``, the first starting ``(s - 1) // 2`` nodes before node 0 (a block of an odd
    ``s`` is centred on its coarse node ``s J``; of an even one, it reaches a node further to
    the right), and each coarse node takes the plain mean of its block's nodes that exist: the
    original's non-overlapping pooling of the NaN-padded field. Returns
    ``(..., coarse, coarse)``: an array for an array (float64), a tensor of ``a``'s dtype and
    device for a tensor (differentiable: the inverse problem's FNO averages its output as its
    target was averaged).
    """
    if isinstance(a, torch.Tensor) and not a.is_floating_point():
        # (the means are taken in the tensor's dtype: an integer one truncated them to 0)
        raise TypeError(f"a: expected a floating-point tensor, got {a.dtype}")
    is_tensor = isinstance(a, torch.Tensor)
    if not is_tensor:
        a = np.asarray(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"a must have shape (..., K, K), got {tuple(a.shape)}")
    coarse = check_int(coarse, "coarse", 2)
    k = a.shape[-1]
    if coarse > k or (k - 1) % (coarse - 1):
        raise ValueError(f"coarse - 1 must divide K - 1 = {k - 1}, got coarse = {coarse}")
    w = _block_weights(k, coarse)
    if is_tensor:
        # (ignore: mypy cannot narrow a through is_tensor, nor retype w as the tensor it becomes)
        w = torch.from_numpy(w).to(a)  # type: ignore[assignment, arg-type]
        return torch.einsum("Ii,...ij,Jj->...IJ", w, a, w)
    return np.einsum("Ii,...ij,Jj->...IJ", w, a, w)


def uniform_grid_1d(n: int) -> torch.Tensor:
    """Periodic grid ``x_j = j / n``, shape ``(n, 1)``, float64."""
    n = check_int(n, "n")
    return (torch.arange(n, dtype=torch.float64) / n)[:, None]


def uniform_grid_2d(n: int) -> torch.Tensor:
    """Nodes ``(x_i, y_j) = (i, j) / (n - 1)``, shape ``(n, n, 2)``, float64."""
    n = check_int(n, "n", 2)
    x = torch.linspace(0, 1, n, dtype=torch.float64)
    return torch.stack(torch.meshgrid(x, x, indexing="ij"), dim=-1)


# The generator of our files that each dataset reads, by the variable names of its .mat files.
_GENERATOR = {("a", "u"): "burgers", ("coeff", "sol"): "darcy"}


def _source_info(source: Source, mat_keys: tuple[str, str]) -> tuple[str, int, tuple[int, ...]]:
    """Kind (``"h5"``/``"mat"``/``"arrays"``), number of samples and grid shape of a source."""
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError("source must be a path or a pair (a, u) of arrays")
        a, u = (np.asarray(x) for x in source)
        if a.shape != u.shape or a.ndim < 2:
            raise ValueError(
                f"source arrays a and u must share a shape (B, ...), got {a.shape}, {u.shape}"
            )
        burgers = _GENERATOR[mat_keys] == "burgers"
        if a.ndim != (2 if burgers else 3) or not (burgers or a.shape[1] == a.shape[2]):
            raise ValueError(f"source arrays: expected {_GENERATOR[mat_keys]} data of shape "
                             f"{'(B, N)' if burgers else '(B, K, K)'}, got {a.shape}")
        return "arrays", a.shape[0], a.shape[1:]
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"source must be a path or a pair (a, u) of arrays, got {type(source).__name__}"
        )
    p = Path(source)
    if not p.is_file():
        raise FileNotFoundError(f"source: no such file {str(p)!r}")
    if h5py.is_hdf5(p):
        try:
            with h5py.File(p, "r") as f:
                ours = "schema" in f.attrs
        except OSError as err:  # e.g. truncated: h5py's own message names no file
            raise DataFileError(f"source {str(p)!r} is a damaged HDF5 file: {err}") from None
        if ours:
            info = inspect_h5(p)
            expected = _GENERATOR[mat_keys]
            if info["generator"] != expected:
                raise DataFileError(f"source {str(p)!r} holds {info['generator']} data, "
                                    f"expected {expected} data for this dataset")
            return "h5", info["n_samples"], info["shapes"]["a"][1:]
    if p.suffix.lower() == ".mat":
        return "mat", -1, ()
    raise DataFileError(f"source {str(p)!r} is neither a galerkin_ext .h5 file nor a .mat file")


def _read_mat(path: str | os.PathLike[str],
              keys: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """The readers' account of a bad file (a missing variable, a wrong shape, non-finite
    samples) as the datasets' DataFileError."""
    try:
        return _mat.read_burgers_mat(path) if keys == ("a", "u") else _mat.read_darcy_mat(path)
    except (KeyError, ValueError) as err:
        raise DataFileError(err.args[0]) from err


def _checked_source(source: Source, mat_keys: tuple[str, str]) -> Source:
    """``source`` ready for a dataset's several passes over it (sample count, first sample,
    split, normaliser fit): a ``.mat`` file read once into its ``(a, u)`` arrays (each pass
    would read the whole file again; an original Darcy file holds 2 × 1024 fields of 421²), and
    a pair of arrays checked once for real, finite values, as the file readers check theirs."""
    kind, _, _ = _source_info(source, mat_keys)
    if kind == "mat":
        return _read_mat(source, mat_keys)  # type: ignore[arg-type]
    if kind == "arrays":
        checked = []
        for key, x in zip(("a", "u"), source, strict=True):  # type: ignore[arg-type]
            x = _mat.numeric("source arrays", key, x)
            _mat.finite_samples("source arrays", key, x)
            checked.append(x)
        return cast("tuple[np.ndarray, np.ndarray]", tuple(checked))  # (zip(strict) of a pair)
    return source


def _load(
    source: Source,
    mat_keys: tuple[str, str],
    indices: np.ndarray,
    reduce: dict[str, Callable[[np.ndarray], np.ndarray]],
) -> dict[str, np.ndarray]:
    """Read ``a``/``u`` at ``indices`` of a source :func:`_checked_source` gave (an ``.h5`` file
    or arrays), applying ``reduce[key]`` block by block (bounded memory)."""
    kind, _, _ = _source_info(source, mat_keys)
    if kind == "h5":
        return _read_blocks(source, indices,  # type: ignore[arg-type]
                            {k: _in_float64(fn) for k, fn in reduce.items()})
    a, u = (np.asarray(x, dtype=np.float64) for x in source)  # type: ignore[union-attr]
    arrays = {"a": a, "u": u}
    return {k: fn(arrays[k][indices]) for k, fn in reduce.items()}


def _in_float64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: fn(x.astype(np.float64))


_READ_BLOCK = 64  # samples read from a file at once by the datasets


def _read_blocks(path: str | os.PathLike, indices: np.ndarray,
                 reduce: dict[str, Callable[[np.ndarray], np.ndarray]]) -> dict[str, np.ndarray]:
    """``reduce[key]`` of the data set ``key`` of an ``.h5`` file at ``indices``, read and reduced
    ``_READ_BLOCK`` samples at a time into arrays allocated once: the split is never held at the
    file's resolution, nor the result twice (a list of blocks, then their concatenation)."""
    out: dict[str, np.ndarray] = {}
    for lo in range(0, indices.size, _READ_BLOCK) or [0]:
        sel = indices[lo : lo + _READ_BLOCK]
        block = read_h5(path, sel, keys=tuple(reduce))
        for key, fn in reduce.items():
            part = fn(block.pop(key))
            if key not in out:
                out[key] = np.empty((indices.size, *part.shape[1:]), dtype=part.dtype)
            out[key][lo : lo + sel.size] = part  # (a copy: no view keeps the block alive)
            del part  # (a view of a full-resolution block, else alive until the next)
    return out


def _n_samples(source: Source, mat_keys: tuple[str, str]) -> int:
    """The samples of a source :func:`_checked_source` gave."""
    return _source_info(source, mat_keys)[1]


def evaluation_indices(n: int, before: dict[str, int], name: str, size: int) -> np.ndarray:
    """The last ``size`` of a source's ``n`` samples, the evaluation split ``name``, refused
    where they would reach into the splits the source holds before them (``before``: their
    sizes by argument name, the training split first). A source of evaluation samples only
    says so with sizes of 0 before (and the training set's normalisers)."""
    if sum(before.values()) + size > n:
        names = " + ".join([*before, name])
        sizes = " + ".join(str(v) for v in [*before.values(), size])
        zeros = ", ".join(f"{k}=0" for k in before)
        raise DataMismatchError(
            f"{name}: the source has {n} samples, fewer than {names} = {sizes}, so the splits "
            f"would overlap (a source that holds evaluation samples only is read with {zeros} "
            "and the training set's normalisers)")
    return np.arange(n - size, n)


def _split_indices(n: int, split: str, n_train: int, n_test: int) -> np.ndarray:
    """train = the first ``n_train`` samples, test = the last ``n_test``, disjoint
    (``n_train = 0``: a source of test samples only)."""
    check_choice(split, "split", ("train", "test"))
    n_train = check_int(n_train, "n_train", 0)
    n_test = check_int(n_test, "n_test")
    if split == "test":
        return evaluation_indices(n, {"n_train": n_train}, "n_test", n_test)
    if n_train < 1:
        raise ValueError("n_train: expected >= 1 for the 'train' split, got 0")
    if n_train > n:
        raise DataMismatchError(f"n_train: the source has {n} samples, fewer than {n_train}")
    return np.arange(n_train)


def _stride(k: int, n: int, periodic: bool) -> int:
    if periodic:
        if n > k or k % n:
            raise DataMismatchError(f"resolution must divide the stored {k} points, got {n}")
        return k // n
    if n > k or n < 3 or (k - 1) % (n - 1):
        raise DataMismatchError(f"resolution - 1 must divide the stored {k} - 1 intervals, got {n}")
    return (k - 1) // (n - 1)


class BurgersDataset(Dataset):
    """Burgers pairs ``u0 -> u(., 1)`` subsampled to ``resolution`` points (8192 -> 2048/512).

    ``target_normalizer`` holds one scalar mean and std over all values of the training
    targets (fitted here unless given): the fields are stationary, so a scalar serves every
    resolution.  The data stay raw; the model de-normalises its output with it.
    """

    def __init__(
        self,
        source: Source,
        split: str = "train",
        resolution: int = 2048,
        *,
        n_train: int = 1024,
        n_test: int = 100,
        target_normalizer: UnitGaussianNormalizer | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        resolution = check_int(resolution, "resolution", 3)
        check_float_dtype(dtype)
        source = _checked_source(source, ("a", "u"))
        n = _n_samples(source, ("a", "u"))
        idx = _split_indices(n, split, n_train, n_test)
        first = _load(source, ("a", "u"), idx[:1], {"a": lambda x: x})["a"]
        stride = _stride(first.shape[-1], resolution, periodic=True)
        sub = {"a": lambda x: x[:, ::stride], "u": lambda x: x[:, ::stride]}
        data = _load(source, ("a", "u"), idx, sub)
        if _needs_fit(n_train, target_normalizer, "target_normalizer", ()):  # scalar: any n
            train = data if split == "train" else _load(source, ("a", "u"), np.arange(n_train),
                                                        {"u": sub["u"]})
            target_normalizer = UnitGaussianNormalizer(train["u"].reshape(-1))
        # (cast: _needs_fit is True exactly where it was None, fitted above)
        self.target_normalizer = copy.deepcopy(cast(UnitGaussianNormalizer,
                                                    target_normalizer)).to(dtype)
        self.resolution = resolution
        self.x = torch.from_numpy(data["a"]).to(dtype)[..., None]
        self.target = torch.from_numpy(data["u"]).to(dtype)[..., None]
        self.grid = uniform_grid_1d(resolution).to(dtype)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        target = self.target[i]
        grad = central_gradient_1d(target[:, 0], 1.0 / self.resolution)[:, None]
        return {"x": self.x[i], "grid": self.grid, "target": target, "target_grad": grad}


def _needs_fit(n_train: int, given: Any, name: str,
               shape: tuple[int, ...] | None = None) -> bool:
    """Whether a normaliser must be fitted here (on the first ``n_train`` samples); a given
    one must be scalar or of the per-sample ``shape`` (``()``: scalar only)."""
    if given is not None:
        if not isinstance(given, UnitGaussianNormalizer):
            raise TypeError(f"{name} must be a UnitGaussianNormalizer, got {type(given).__name__}")
        fitted = tuple(given.mean.shape)
        if shape is not None and fitted not in ((), shape):
            wanted = f"{shape} (the resolution of this dataset) or " if shape else ""
            raise ValueError(f"{name}: fitted on samples of shape {fitted}, expected "
                             f"{wanted}a scalar one")
        return False
    if n_train == 0:  # e.g. an original evaluation .mat file
        raise ValueError(f"{name} must be given (from the training dataset) for a source of "
                         "test samples only (n_train=0)")
    if shape and n_train < 2:  # one sample's pointwise std is 0: test values (x - mean) / eps
        raise ValueError(f"n_train: fitting the pointwise {name} needs >= 2 training samples, "
                         f"got {n_train}")
    return True


class _DarcyLayout(NamedTuple):
    idx: np.ndarray  # indices of the split
    stored: int  # stored grid size
    stride: int  # from the stored grid to resolution
    resolution: int
    coarse: int


def paired_coarse(fine: int, preset: tuple[int, int], pairs: Mapping[int, int]) -> int:
    """The coarse grid of a script's ``--fine`` given without ``--coarse``: the ``preset``'s
    ``(fine, coarse)`` for its own fine grid, else the paper's pairing in ``pairs``
    (:data:`DARCY_COARSE`, :data:`INVERSE_COARSE`); ``ValueError`` for a grid neither pairs
    (a preset's coarse grid kept for another fine one is no setup of the paper)."""
    if fine == preset[0]:
        return preset[1]
    if fine not in pairs:
        raise ValueError(f"coarse_resolution: no default for resolution {fine} (the paper "
                         "pairs " + ", ".join(f"{f} with {c}" for f, c in pairs.items())
                         + "): give it")
    return pairs[fine]


def check_darcy_grids(resolution: int, coarse_resolution: int, stored: int | None = None, *,
                      target_resolution: int | None = None) -> None:
    """The Darcy datasets' grid rules: ``3 <= resolution`` and ``2 <= coarse_resolution <=
    resolution`` (the attention's grid is the coarse one); for the inverse problem, whose
    targets are averaged from the ``target_resolution`` grid onto the coarse one,
    ``coarse_resolution - 1`` dividing ``target_resolution - 1``; for ``stored`` nodes per axis,
    ``resolution - 1`` (and ``target_resolution - 1``) dividing ``stored - 1``.  ``ValueError`` (a
    :class:`DataMismatchError` for the stored grid) otherwise; scripts check them with the
    preset's resolution before they generate any data."""
    resolution = check_int(resolution, "resolution", 3)
    coarse_resolution = check_int(coarse_resolution, "coarse_resolution", 2)
    if coarse_resolution > resolution:
        raise ValueError(f"coarse_resolution: expected at most resolution = {resolution} (the "
                         f"attention's grid is the coarse one), got {coarse_resolution}")
    if target_resolution is not None:
        target_resolution = check_int(target_resolution, "target_resolution", 2)
        if target_resolution < coarse_resolution or (
            (target_resolution - 1) % (coarse_resolution - 1)
        ):
            raise ValueError(f"coarse_resolution: the targets are averaged from the "
                             f"{target_resolution}-node grid onto the coarse one, so "
                             f"coarse_resolution - 1 must divide {target_resolution - 1}, got "
                             f"{coarse_resolution}")
    if stored is not None:
        _stride(stored, resolution, periodic=False)
        if target_resolution is not None and (stored - 1) % (target_resolution - 1):
            raise DataMismatchError(f"target_resolution - 1 must divide the stored {stored} - 1 "
                                    f"intervals, got {target_resolution}")


def _darcy_layout(
    source: Source, split: str, resolution: int, coarse_resolution: int | None,
    defaults: dict[int, int], n_train: int, n_test: int, target_resolution: int | None = None,
) -> _DarcyLayout:
    """The checks and sizes both 2-D datasets start from (``target_resolution``: the inverse
    problem's grid of the targets before their average onto the coarse one)."""
    resolution = check_int(resolution, "resolution", 3)
    nc = coarse_resolution if coarse_resolution is not None else defaults.get(resolution)
    if nc is None:
        raise ValueError(
            f"coarse_resolution must be given for resolution {resolution} "
            f"(defaults exist for {sorted(defaults)})"
        )
    check_darcy_grids(resolution, nc)
    keys = ("coeff", "sol")
    n = _n_samples(source, keys)
    idx = _split_indices(n, split, n_train, n_test)
    k = _load(source, keys, idx[:1], {"a": lambda x: x})["a"].shape[-1]
    check_darcy_grids(resolution, nc, k, target_resolution=target_resolution)
    return _DarcyLayout(idx, k, (k - 1) // (resolution - 1), resolution, nc)


class DarcyDataset(Dataset):
    """Darcy forward problem ``a -> u`` at ``resolution`` (421 -> 211/141/85), see module doc."""

    def __init__(
        self,
        source: Source,
        split: str = "train",
        resolution: int = 141,
        *,
        coarse_resolution: int | None = None,
        n_train: int = 1024,
        n_test: int = 100,
        input_normalizer: UnitGaussianNormalizer | None = None,
        target_normalizer: UnitGaussianNormalizer | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        check_float_dtype(dtype)
        source = _checked_source(source, ("coeff", "sol"))
        idx, _, s, resolution, nc = _darcy_layout(
            source, split, resolution, coarse_resolution, DARCY_COARSE, n_train, n_test)
        keys = ("coeff", "sol")
        fit_in = _needs_fit(n_train, input_normalizer, "input_normalizer",
                            (resolution, resolution))
        fit_t = _needs_fit(n_train, target_normalizer, "target_normalizer",
                           (resolution, resolution))
        sub = {"a": lambda x: x[:, ::s, ::s], "u": lambda x: x[:, ::s, ::s]}
        data = _load(source, keys, idx, sub)
        if fit_in or fit_t:
            train = data if split == "train" else _load(source, keys, np.arange(n_train), sub)
            if input_normalizer is None:
                input_normalizer = UnitGaussianNormalizer(train["a"])
            if target_normalizer is None:
                target_normalizer = UnitGaussianNormalizer(train["u"])
        # A copy: Module.to() works in place and must not change the caller's normaliser.
        # (casts: _needs_fit is True exactly where one was None, fitted above)
        self.input_normalizer = copy.deepcopy(cast(UnitGaussianNormalizer,
                                                   input_normalizer)).to(dtype)
        self.target_normalizer = copy.deepcopy(cast(UnitGaussianNormalizer,
                                                    target_normalizer)).to(dtype)
        self.resolution = resolution
        self.coeff = torch.from_numpy(data["a"]).to(dtype)
        self.target = torch.from_numpy(data["u"]).to(dtype)
        self.x = self.input_normalizer.encode(self.coeff)
        self.grid = uniform_grid_2d(resolution).to(dtype)
        self.pos = uniform_grid_2d(nc).to(dtype)

    def __len__(self) -> int:
        return self.coeff.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        target = self.target[i]
        return {
            "x": self.x[i, ..., None],
            "coeff": self.coeff[i, ..., None],
            "grid": self.grid,
            "pos": self.pos,
            "target": target[..., None],
            "target_grad": central_gradient_2d(target, 1.0 / (self.resolution - 1)),
        }


class DarcyInverseDataset(Dataset):
    """Inverse problem ``u + noise -> a`` (coarse), see module doc; noise is fixed per sample,
    drawn from ``(noise_seed, the sample's index in the file)`` alone: give the samples of
    another file another ``noise_seed``, or its sample ``k`` carries this file's noise of ``k``.

    ``target_resolution``: the grid the coefficient is taken on before its average onto the
    coarse one (default ``resolution``). A model that reads its input on another grid than the
    paper's fine one (the FNO's "only n_c" row, on the coarse grid) passes that fine grid, so
    that it learns the same targets as the other rows."""

    def __init__(
        self,
        source: Source,
        split: str = "train",
        resolution: int = 141,
        *,
        coarse_resolution: int | None = None,
        noise: float = 0.0,
        noise_seed: int = 0,
        n_train: int = 1024,
        n_test: int = 100,
        input_normalizer: UnitGaussianNormalizer | None = None,
        target_resolution: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        check_float_dtype(dtype)
        source = _checked_source(source, ("coeff", "sol"))
        if target_resolution is None:
            target_resolution = resolution
        idx, k, s, resolution, nc = _darcy_layout(
            source, split, resolution, coarse_resolution, INVERSE_COARSE, n_train, n_test,
            target_resolution=target_resolution)
        t = (k - 1) // (target_resolution - 1)
        noise = check_float(noise, "noise", low_inclusive=True)
        noise_seed = check_int(noise_seed, "noise_seed", 0)
        keys = ("coeff", "sol")
        fit = _needs_fit(n_train, input_normalizer, "input_normalizer",
                         (resolution, resolution))
        sub_u = {"u": lambda x: x[:, ::s, ::s]}
        # the coefficient on the target grid, then averaged: the original's order
        average_a = {"a": lambda x: block_average(x[:, ::t, ::t], nc)}
        data = _load(source, keys, idx, {**sub_u, **average_a})
        if fit:
            if split == "train":
                train_u = data["u"]
            else:
                train_u = _load(source, keys, np.arange(n_train), sub_u)["u"]
            input_normalizer = UnitGaussianNormalizer(train_u)
        # A copy: Module.to() works in place and must not change the caller's normaliser.
        # (cast: _needs_fit is True exactly where it was None, fitted above)
        self.input_normalizer = copy.deepcopy(cast(UnitGaussianNormalizer,
                                                   input_normalizer)).to(dtype)
        x = self.input_normalizer.encode(torch.from_numpy(data["u"]))
        if noise > 0:
            # Static noise: drawn once per sample from (noise_seed, global index); added sample
            # by sample, in place (the whole split's noise was another two copies of it)
            for row, i in enumerate(idx):
                eps = sample_rng(noise_seed, _STREAM_NOISE, int(i)).standard_normal(x.shape[1:])
                x[row] += noise * torch.from_numpy(eps)
        self.noise = noise
        self.x = x.to(dtype)
        self.target = torch.from_numpy(data["a"]).to(dtype)
        self.grid = uniform_grid_2d(resolution).to(dtype)
        self.pos = uniform_grid_2d(nc).to(dtype)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        return {
            "x": self.x[i, ..., None],
            "grid": self.grid,
            "pos": self.pos,
            "target": self.target[i, ..., None],
        }


# -- continuum-attention sets (SPEC-continuum §3-4) ---------------------------------------------


def _three_way_split(n: int, split: str, n_train: int, n_valid: int, n_test: int,
                     fitted: bool) -> np.ndarray:
    """Indices of ``split``: train = ``[0, n_train)``, valid = the next ``n_valid``, test = the
    last ``n_test``, all three disjoint.  ``fitted``: the normalisers are given, so a file of
    test samples only (a zero-shot set, ``n_train = n_valid = 0``) is fine."""
    check_choice(split, "split", ("train", "valid", "test"))
    n_train = check_int(n_train, "n_train", 0)
    if n_train == 0 and not (split == "test" and fitted):
        raise ValueError("n_train: 0 says the source holds test samples only, which are read "
                         "as the 'test' split with the training set's normalisers"
                         if split == "test" else f"n_train: expected >= 1 for the {split!r} "
                         "split, got 0")
    n_valid = check_int(n_valid, "n_valid", 0)
    n_test = check_int(n_test, "n_test")
    last = evaluation_indices(n, {"n_train": n_train, "n_valid": n_valid}, "n_test", n_test)
    if split == "train":
        return np.arange(n_train)
    if split == "valid":
        if n_valid < 1:
            raise ValueError("n_valid: expected >= 1 for the 'valid' split, got 0")
        return np.arange(n_train, n_train + n_valid)
    return last


def _open_generated(source: object, generators: tuple[str, ...]) -> dict[str, Any]:
    """:func:`inspect_h5` of a complete file of ours written by one of ``generators``."""
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"source: expected the path of a generated .h5 file, got "
                        f"{type(source).__name__}")
    if not Path(source).is_file():
        raise FileNotFoundError(f"source: no such file {str(source)!r}")
    info = inspect_h5(source)
    if info["generator"] not in generators:
        raise DataFileError(f"source {str(source)!r} holds {info['generator']} data, expected "
                            f"{' or '.join(generators)} data for this dataset")
    if not info["complete"]:
        raise DataFileError(f"source {str(source)!r} is incomplete ({info['n_done']} of "
                            f"{info['n_samples']} samples); finish it with resume")
    return info


def _fit_normalizer(data: np.ndarray, how: str) -> UnitGaussianNormalizer:
    """Unit-Gaussian statistics of ``data (n, *grid, C)``: one mean and std per component
    (``'component'``) or over every value (``'scalar'``); either serves any grid."""
    flat = data.reshape(-1, data.shape[-1]) if how == "component" else data.reshape(-1)
    return UnitGaussianNormalizer(flat)


def _fit_scalar(*arrays: np.ndarray) -> UnitGaussianNormalizer:
    """One scalar unit-Gaussian normaliser over every value of ``arrays`` (population std,
    float64), without concatenating them."""
    count = sum(a.size for a in arrays)
    mean = sum(float(np.sum(a, dtype=np.float64)) for a in arrays) / count
    var = sum(float(np.sum((a.astype(np.float64) - mean) ** 2)) for a in arrays) / count
    return UnitGaussianNormalizer.from_statistics(
        torch.tensor(mean, dtype=torch.float64), torch.tensor(math.sqrt(var), dtype=torch.float64))


class _NormalizedFields(Dataset):
    """Shared part of the continuum datasets: reading a split of the input and target arrays
    (``keys``) and normalising both (see module doc)."""

    x: torch.Tensor  # (set by _encode)
    target: torch.Tensor

    def _setup(self, source: Source, split: str, keys: tuple[str, str], n_train: int,
               n_valid: int, n_test: int, input_normalizer: UnitGaussianNormalizer | None,
               target_normalizer: UnitGaussianNormalizer | None, how: str,
               dtype: torch.dtype, generators: tuple[str, ...],
               view: Callable[[np.ndarray], np.ndarray] = lambda t: t,
               transform: Callable[[np.ndarray], np.ndarray] = lambda t: t,
               shared: bool = False) -> dict[str, Any]:
        """Read the split; ``view`` selects the learned components of the targets, ``transform``
        maps both arrays (e.g. to another grid), each before the normalisers are fitted;
        ``shared``: when neither normaliser is given, fit one (``how = 'scalar'``) on inputs
        and targets together and use it for both; ``how``: the fitted normalisers' statistics,
        ``'component'`` (one per component) or ``'scalar'``.  Returns ``{key: array}`` of
        ``keys``.
        """
        info = _open_generated(source, generators)
        given = [norm is not None for norm in (input_normalizer, target_normalizer)]
        for name, norm in (("input_normalizer", input_normalizer),
                           ("target_normalizer", target_normalizer)):
            if norm is not None and not isinstance(norm, UnitGaussianNormalizer):
                raise TypeError(f"{name}: expected a UnitGaussianNormalizer, got "
                                f"{type(norm).__name__}")
        if any(given) and not all(given):  # fitting the other alone breaks a shared one
            raise ValueError(f"{'target' if given[0] else 'input'}_normalizer: expected both "
                             "normalisers (from the training set) or neither (fitted here)")
        check_float_dtype(dtype)
        idx = _three_way_split(info["n_samples"], split, n_train, n_valid, n_test, all(given))

        def load(indices: np.ndarray) -> dict[str, np.ndarray]:
            return _read_blocks(source, indices,  # type: ignore[arg-type]
                                {keys[0]: transform, keys[1]: lambda t: transform(view(t))})

        data = load(idx)
        if not any(given):
            train = data if split == "train" else load(np.arange(n_train))
            if shared:
                input_normalizer = target_normalizer = _fit_scalar(train[keys[0]],
                                                                   train[keys[1]])
            else:
                input_normalizer = _fit_normalizer(train[keys[0]], how)
                target_normalizer = _fit_normalizer(train[keys[1]], how)
        assert input_normalizer is not None and target_normalizer is not None
        # Copies: Module.to() works in place and must not change the caller's normalisers.
        self.input_normalizer = copy.deepcopy(input_normalizer).to(dtype)
        self.target_normalizer = copy.deepcopy(target_normalizer).to(dtype)
        self.info = info
        self.indices = idx
        return data

    def _encode(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """``self.x``, ``self.target``: the inputs ``x`` and targets ``y`` normalised; a given
        normaliser fitted on samples of another shape is named."""
        for name, raw, attribute in (("input_normalizer", x, "x"),
                                     ("target_normalizer", y, "target")):
            try:
                setattr(self, attribute, getattr(self, name).encode(raw))
            except ValueError as err:
                raise ValueError(f"{name}: {err} (given from data of another layout?)") from None


class ODEDataset(_NormalizedFields):
    """Lorenz-63 or controlled-ODE trajectories on the file's time grid (SPEC-continuum §3).

    Tasks (:data:`ODE_TASKS`): ``'cde'`` ``u -> z``; ``'l63_a'`` ``x`` and ``(y0, z0)`` ->
    ``(y, z)`` (``token0`` carries the initial state); ``'l63_b'`` ``x -> y``.  Items: ``x``
    ``(T, 1)``, ``grid`` ``(T, 1)`` (the stored times, uniform or not), ``target`` ``(T, d_z)``
    and for ``'l63_a'`` ``token0`` ``(4,)`` (see module doc).  Normalisers per component, fitted
    on the first ``n_train`` samples unless given (both or neither).

    Args:
        source: a file of :func:`~galerkin_ext.data.generate_lorenz63` /
            :func:`~galerkin_ext.data.generate_cde`.
        split: ``'train'``, ``'valid'`` or ``'test'``.
        task: see above.
        n_train, n_valid, n_test: split sizes.
        input_normalizer, target_normalizer: from the training set, for other splits of
            other files (e.g. zero-shot sets at another ``dt``).
        dtype: of the items.
    """

    def __init__(
        self,
        source: Source,
        split: str = "train",
        *,
        task: str = "cde",
        n_train: int = 8000,
        n_valid: int = 1000,
        n_test: int = 1000,
        input_normalizer: UnitGaussianNormalizer | None = None,
        target_normalizer: UnitGaussianNormalizer | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        check_choice(task, "task", list(ODE_TASKS))
        data = self._setup(source, split, ("input", "output"), n_train, n_valid, n_test,
                           input_normalizer, target_normalizer, "component", dtype,
                           (ODE_TASKS[task],),
                           view=(lambda out: out[..., :1]) if task == "l63_b" else (lambda t: t))
        times = read_h5(source, keys=("coords",))["coords"]  # type: ignore[arg-type]
        self.task = task
        self.grid = torch.from_numpy(times).to(dtype)
        raw_x = torch.from_numpy(data["input"])
        raw_y = torch.from_numpy(data["output"])
        self._encode(raw_x.to(dtype), raw_y.to(dtype))
        self.token0 = None
        if task == "l63_a":
            # [x(0), y(0), z(0)] normalised like the input and the targets, then t_0
            start = torch.cat([self.x[:, 0], self.target[:, 0]], dim=-1)
            t0 = self.grid[0].expand(start.shape[0], 1)
            self.token0 = torch.cat([start, t0], dim=-1)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        item = {"x": self.x[i], "grid": self.grid, "target": self.target[i]}
        if self.token0 is not None:
            item["token0"] = self.token0[i]
        return item


class ContinuumDarcyDataset(_NormalizedFields):
    """Darcy ``a -> u`` at the file's resolution ``s`` (lognormal or piecewise coefficient,
    SPEC-continuum §3), with one global scalar normaliser each for ``a`` and ``u`` (so a model
    trained at one resolution runs zero-shot at another).  Items: ``x`` ``(s, s, 1)``, ``coeff``
    ``(s, s, 1)``, ``grid`` ``(s, s, 2)``, ``target`` ``(s, s, 1)`` (see module doc).

    Args:
        source: a file of :func:`~galerkin_ext.data.generate_darcy` (any ``coef``).
        split, n_train, n_valid, n_test, input_normalizer, target_normalizer, dtype: as for
            :class:`ODEDataset`.
    """

    def __init__(
        self,
        source: Source,
        split: str = "train",
        *,
        n_train: int = 3600,
        n_valid: int = 200,
        n_test: int = 200,
        input_normalizer: UnitGaussianNormalizer | None = None,
        target_normalizer: UnitGaussianNormalizer | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        data = self._setup(source, split, ("a", "u"), n_train, n_valid, n_test,
                           input_normalizer, target_normalizer, "scalar", dtype, ("darcy",))
        self.coef = self.info["parameters"].get("coef")
        self.resolution = int(data["a"].shape[-1])
        self.grid = uniform_grid_2d(self.resolution).to(dtype)
        self.coeff = torch.from_numpy(data["a"]).to(dtype)[..., None]
        self._encode(self.coeff, torch.from_numpy(data["u"]).to(dtype)[..., None])

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        return {"x": self.x[i], "coeff": self.coeff[i], "grid": self.grid,
                "target": self.target[i]}


def periodic_grid_2d(n: int) -> torch.Tensor:
    """Periodic grid ``(x_i, y_j) = (i, j) / n`` on ``[0, 1)^2``, shape ``(n, n, 2)``, float64."""
    x = uniform_grid_1d(n)[:, 0]
    return torch.stack(torch.meshgrid(x, x, indexing="ij"), dim=-1)


class KolmogorovDataset(_NormalizedFields):
    """Kolmogorov-flow pairs ``w(T) -> w(T + dt_out)`` (SPEC-continuum §3) on a periodic grid.

    Items (``s`` = ``resolution``): ``x`` ``(s, s, 1)`` the normalised input ``w(T)``, ``grid``
    ``(s, s, 2)`` the periodic grid ``(i / s, j / s)`` on ``[0, 1)^2`` (the physical point divided
    by 2 pi; no repeated endpoint, so equal weights are the periodic trapezoid rule), ``target``
    ``(s, s, 1)`` the normalised output ``w(T + dt_out)``.  Both are vorticity, so one global
    scalar unit-Gaussian normaliser, fitted on every value of the training inputs and outputs,
    serves as ``input_normalizer`` and ``target_normalizer`` unless they are given: a model that
    returns its input is exactly the persistence forecast, and a model trained on one grid runs
    on any.

    Args:
        source: a file of :func:`~galerkin_ext.data.generate.generate_kolmogorov`; another
            generator's file (e.g. Darcy) raises :class:`DataFileError`.
        split: ``'train'`` (the first ``n_train`` samples), ``'valid'`` (the next ``n_valid``)
            or ``'test'`` (the last ``n_test``); examples/kolmogorov.py splits 1000/100/200
            (quick) and 9000/500/500 (paper).
        resolution: grid points per axis of the items; default the stored ``s``.  Another value
            resamples the stored fields spectrally (:func:`.kolmogorov.resample_periodic`, exact
            for the band-limited data when coarser) -- e.g. one zero-shot file at 832^2 read at
            208, 312, 624 or 832.
        n_train, n_valid, n_test: split sizes (default: the paper's 9000/500/500).
        input_normalizer, target_normalizer: from the training set, for other splits or files
            (both or neither; a file of test samples only needs them).
        dtype: of the items.
    """

    def __init__(
        self,
        source: Source,
        split: str = "train",
        *,
        resolution: int | None = None,
        n_train: int = 9000,
        n_valid: int = 500,
        n_test: int = 500,
        input_normalizer: UnitGaussianNormalizer | None = None,
        target_normalizer: UnitGaussianNormalizer | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if resolution is not None:
            resolution = check_int(resolution, "resolution", 4)

        def to_grid(fields: np.ndarray) -> np.ndarray:
            if resolution is None or fields.shape[-1] == resolution:
                return fields
            from .kolmogorov import resample_periodic

            return resample_periodic(torch.from_numpy(fields), resolution).numpy()

        data = self._setup(source, split, ("input", "output"), n_train, n_valid, n_test,
                           input_normalizer, target_normalizer, "scalar", dtype,
                           ("kolmogorov",), transform=to_grid, shared=True)
        self.parameters = self.info["parameters"]
        self.resolution = int(data["input"].shape[-1])
        self.grid = periodic_grid_2d(self.resolution).to(dtype)
        self._encode(torch.from_numpy(data["input"]).to(dtype)[..., None],
                     torch.from_numpy(data["output"]).to(dtype)[..., None])

    def persistence_errors(self) -> torch.Tensor:
        """Per-sample relative L^2 error ``||w(T + dt_out) - w(T)|| / ||w(T + dt_out)||`` of the
        persistence forecast, in physical units on this grid; shape ``(len(self),)``, float64."""
        from .kolmogorov import persistence_errors

        return persistence_errors(self.input_normalizer.decode(self.x),
                                  self.target_normalizer.decode(self.target))

    def reference_trajectories(self, steps: int, count: int | None = None) -> torch.Tensor:
        """The vorticity ``w(T + k dt_out)``, ``k = 1 .. steps``, of the first ``count`` samples
        (default: all), solved from their ``w(T)`` on this grid with the physics the file
        records (viscosity, forcing, time step, solver dtype) on the file's solver grid (or this
        one, if finer), then resampled to this grid: the truth a rollout of the model is
        compared with. Step 1 is the stored target up to the solver's round-off when the data
        were solved on this grid; a coarser grid has lost the modes it cannot hold, which step 1
        shows as its distance from the stored target.

        Returns ``(count, steps, s, s)`` float64 in physical units.
        """
        from .kolmogorov import resample_periodic, solve_kolmogorov

        steps = check_int(steps, "steps")
        count = len(self) if count is None else check_int(count, "count")
        if count > len(self):
            raise ValueError(f"count: expected at most the {len(self)} samples, got {count}")
        par = self.parameters
        solve_s = max(par["solve_resolution"], self.resolution)
        w0 = self.input_normalizer.decode(self.x[:count, ..., 0]).double()
        if solve_s != self.resolution:
            w0 = resample_periodic(w0, solve_s)
        # the recorded step keeps the CFL number below 1 on the solver's grid; a finer one
        # needs a proportionally smaller step
        recorded = par["max_step"] if "max_step" in par else par["dt"]  # (before 2026-11-25)
        max_step = recorded * par["solve_resolution"] / solve_s
        dtype = getattr(torch, par["solve_dtype"])
        times = [k * par["dt_out"] for k in range(1, steps + 1)]
        out = solve_kolmogorov(w0.to(dtype), times[-1], max_step=max_step, nu=par["nu"],
                               wavenumber=par["wavenumber"], forcing=par["forcing_amplitude"],
                               snapshots=times, dtype=dtype).double()
        return out if solve_s == self.resolution else resample_periodic(out, self.resolution)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = check_index(i, len(self))
        return {"x": self.x[i], "grid": self.grid, "target": self.target[i]}
