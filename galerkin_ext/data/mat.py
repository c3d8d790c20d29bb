"""Readers for the original benchmark ``.mat`` files (FNO's ``burgers_data_R10.mat``,
``piececonst_r421_N1024_smooth{1,2}.mat``).

MATLAB v5 files are read with :func:`scipy.io.loadmat`; v7.3 files are HDF5 and read with h5py,
whose axes come out reversed (MATLAB is column-major), so they are transposed back.  Keys:
Burgers ``a`` (initial conditions) and ``u`` (solutions at t = 1), shape ``(B, N)``; Darcy
``coeff`` and ``sol``, shape ``(B, K, K)``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import scipy.io

from .._checks import check_bool, check_path

__all__ = ["load_mat", "read_burgers_mat", "read_darcy_mat", "is_mat_v73"]


def _existing_file(path: object) -> Path:
    p = check_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: no such file {str(p)!r}")
    return p


def is_mat_v73(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is an HDF5-based (MATLAB v7.3) file."""
    return bool(h5py.is_hdf5(_existing_file(path)))


def load_mat(path: str | os.PathLike[str], keys: Sequence[str], *,
             stored_type: bool = False) -> dict[str, np.ndarray]:
    """Load the variables ``keys`` from a MATLAB v5 or v7.3 file as float64 arrays, or in the
    type they are stored in (``stored_type=True``; a MATLAB ``single`` stays float32).

    Raises ``KeyError`` naming the missing variables and the ones present.
    """
    p = _existing_file(path)
    if isinstance(keys, str) or not isinstance(keys, Sequence) or not all(
        isinstance(k, str) for k in keys
    ):
        raise TypeError(f"keys must be a sequence of variable names, got {keys!r}")
    check_bool(stored_type, "stored_type")
    dtype = None if stored_type else np.float64
    if is_mat_v73(p):
        try:
            with h5py.File(p, "r") as f:
                missing = [k for k in keys if k not in f]
                present = sorted(k for k in f if not k.startswith("#"))
                if missing:
                    raise KeyError(f"{str(p)!r} lacks {missing}; it holds {present}")
                for k in keys:
                    if not isinstance(f[k], h5py.Dataset):  # a struct or cell array
                        raise ValueError(f"{str(p)!r}: variable {k!r} is a MATLAB struct or "
                                         "cell array, expected a numeric array")
                    # text is stored as uint16 codes and [] as its dimensions: read as numbers
                    # they would pass for data
                    kind = f[k].attrs.get("MATLAB_class", b"")
                    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
                    empty = bool(f[k].attrs.get("MATLAB_empty", 0))
                    if empty or kind in ("char", "logical"):
                        what = "an empty array" if empty else f"{kind} data"
                        raise ValueError(f"{str(p)!r}: variable {k!r} is MATLAB {what}, "
                                         "expected a numeric array")
                return {k: numeric(p, k, f[k][...], dtype).transpose() for k in keys}
        except OSError as err:  # truncated or damaged
            raise ValueError(f"{str(p)!r} is not a readable MATLAB v7.3 file: {err}") from err
    try:
        data = scipy.io.loadmat(p, variable_names=list(keys))
    except Exception as err:  # scipy raises many types for damaged or foreign files
        raise ValueError(f"{str(p)!r} is not a readable MATLAB file: {err}") from err
    classes = {name: kind for name, _, kind in scipy.io.whosmat(p)}
    missing = [k for k in keys if k not in data]
    if missing:
        raise KeyError(f"{str(p)!r} lacks {missing}; it holds {sorted(classes)}")
    for k in keys:  # loadmat gives a logical array as uint8, which would pass for data
        if classes.get(k) == "logical":
            raise ValueError(f"{str(p)!r}: variable {k!r} is MATLAB logical data, expected a "
                             "numeric array")
    return {k: numeric(p, k, data[k], dtype) for k in keys}


def numeric(path: str | os.PathLike[str], key: str, value: object,
            dtype: type[np.floating] | None = np.float64) -> np.ndarray:
    """``value`` as a ``dtype`` array (``None``: its own numeric type), or a ValueError naming
    the file and the variable."""
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":  # bools are masks, not fields
        raise ValueError(f"{str(path)!r}: variable {key!r} holds {array.dtype} data "
                         f"({array.dtype.kind!r} kind), expected a numeric array")
    return array if dtype is None else array.astype(dtype, copy=False)


def finite_samples(path: str | os.PathLike[str], key: str, array: np.ndarray) -> None:
    """A ValueError naming the file, the variable and its samples (axis 0) that hold NaN or
    infinity, found before any training on them."""
    bad = np.flatnonzero(~np.isfinite(array).all(axis=tuple(range(1, array.ndim))))
    if bad.size:
        raise ValueError(f"{str(path)!r}: variable {key!r} has non-finite values in "
                         f"{bad.size} sample(s), the first is sample {bad[0]}")


def read_burgers_mat(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(a, u)`` of a Burgers ``.mat`` file, each of shape ``(B, N)``, finite."""
    d = load_mat(path, ("a", "u"))
    a, u = d["a"], d["u"]
    if a.ndim != 2 or a.shape != u.shape or a.shape[0] == 0:
        raise ValueError(
            f"{path!s}: expected a and u of equal shape (B, N) with B >= 1, got {a.shape}, "
            f"{u.shape}"
        )
    finite_samples(path, "a", a)
    finite_samples(path, "u", u)
    return a, u


def read_darcy_mat(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(coeff, sol)`` of a Darcy ``.mat`` file, each of shape ``(B, K, K)``, finite."""
    d = load_mat(path, ("coeff", "sol"))
    a, u = d["coeff"], d["sol"]
    if a.ndim != 3 or a.shape != u.shape or a.shape[1] != a.shape[2] or a.shape[0] == 0:
        raise ValueError(f"{path!s}: expected coeff and sol of equal shape (B, K, K) with B >= 1, "
                         f"got {a.shape}, {u.shape}")
    finite_samples(path, "coeff", a)
    finite_samples(path, "sol", u)
    return a, u
