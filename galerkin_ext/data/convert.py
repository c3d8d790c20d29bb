"""Original data sets of the GNOT experiments converted to our ragged files (SPEC-gnot §3, §4.2),
for users who have them: the same examples and models then train on the paper's data.

* Geo-FNO's elasticity set (its ``Random_UnitCell_*.npy`` files): ``XY`` ``(972, 2, S)`` the
  points of each sample, ``sigma`` ``(972, S)`` the stress there, ``rr`` ``(42, S)`` (optional)
  the cavity radius at 42 angles.  Every sample becomes the query points with target ``vm``,
  the input function ``mesh`` (its points, no values) and, with ``rr``, ``θ``.  The points come
  without a mesh, so the file has no weights: train with ``weights="uniform"`` (``--weights
  uniform``), as the original code does.  Geo-FNO trains on the first 1000 samples and evaluates
  the last 200.
* GNOT's own pickles: a list of samples ``[X, Y, θ, (f_1, ..., f_L)]`` with ``X`` ``(N, d)``
  the query points, ``Y`` ``(N, o)`` the targets, ``θ`` ``(p,)`` (empty or ``None``: none) and
  each input function ``f_l`` ``(M_l, d + c_l)``: its points' ``d`` coordinates, then its
  ``c_l`` values (the functions a list, or one array ``(L, M, d + c)`` of equal sizes).
  The inputs are named ``f1 ... fL``, the targets ``y1 ... yo``; no weights (uniform).
  Unpickling runs code from the file, so it needs ``trust_pickle=True`` (``--trust-pickle``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .ragged import RaggedLayout, validate_sample, write_ragged

__all__ = ["GEOFNO_ELASTICITY", "GNOT_PICKLE", "convert_geofno_elasticity",
           "convert_gnot_pickle"]

#: The generators recorded in converted files.
GEOFNO_ELASTICITY = "geofno_elasticity"
GNOT_PICKLE = "gnot_pickle"


def _write(out: str | os.PathLike[str], sample_fn: Callable[[int], dict[str, Any]],
           n_samples: int, **kwargs: Any) -> Path:
    """:func:`write_ragged` after every sample is converted and checked against sample 0's
    layout: the source is at hand, so a refused sample is named before the output is begun
    (no partial file, which a resume would only refuse again)."""
    layout = RaggedLayout.from_sample(sample_fn(0), where="sample 0")
    for i in range(1, n_samples):
        validate_sample(sample_fn(i), where=f"sample {i}", layout=layout)
    return write_ragged(out, sample_fn, n_samples=n_samples, **kwargs)


def _sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a source file's bytes: what a resumed conversion must read again (its
    path may be spelled otherwise, or name another file by now)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load(path: str | os.PathLike[str], name: str, shape_doc: str, ndim: int) -> np.ndarray:
    """A finite real ``.npy`` array of ``ndim`` dimensions, memory-mapped."""
    if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
        raise FileNotFoundError(f"{name}: no such file: {path!r}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"{name}: {str(path)!r} is not a .npy array file ({err})") from err
    if array.ndim != ndim or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{name}: expected a real array of shape {shape_doc}, got "
                         f"{array.dtype} {array.shape}")
    return array


def convert_geofno_elasticity(
    xy: str | os.PathLike[str],
    sigma: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    rr: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Convert Geo-FNO's elasticity arrays (module doc) into the ragged file ``out``.

    Args:
        xy: ``Random_UnitCell_XY_10.npy``, ``(N, 2, S)`` points per sample.
        sigma: ``Random_UnitCell_sigma_10.npy``, ``(N, S)`` stress at those points.
        out: the ``.h5`` file to write (written to ``out.partial`` and renamed when complete).
        rr: ``Random_UnitCell_rr_10.npy``, ``(42, S)``, stored as ``θ``; ``None`` for none.
        resume: continue a conversion that was interrupted (``out.partial`` exists), from
            sources of the same content (the file records their SHA-256).
        overwrite: replace an existing ``out`` (or ``out.partial``).
        progress: show a progress bar.

    Returns:
        The path of the finished file.

    Raises:
        ValueError: naming the argument whose array has the wrong shape or non-finite values.
    """
    points = _load(xy, "xy", "(N, 2, S)", 3)
    stress = _load(sigma, "sigma", "(N, S)", 2)
    radius = None if rr is None else _load(rr, "rr", "(42, S)", 2)
    n_points, dim, n_samples = points.shape
    if dim != 2 or n_points < 1 or n_samples < 1:
        raise ValueError(f"xy: expected shape (N, 2, S) with N, S >= 1, got {points.shape}")
    if stress.shape != (n_points, n_samples):
        raise ValueError(f"sigma: expected shape (N, S) = {(n_points, n_samples)} like xy, got "
                         f"{stress.shape}")
    if radius is not None and radius.shape[1] != n_samples:
        raise ValueError(f"rr: expected shape (p, S) with S = {n_samples} like xy, got "
                         f"{radius.shape}")

    def sample(i: int) -> dict[str, Any]:
        x = np.array(points[:, :, i], dtype=np.float64)
        target = np.array(stress[:, i], dtype=np.float64)[:, None]
        theta = None if radius is None else np.array(radius[:, i], dtype=np.float64)
        for name, value in (("xy", x), ("sigma", target), ("rr", theta)):
            if value is not None and not np.isfinite(value).all():
                raise ValueError(f"{name}: sample {i} has non-finite values")
        return {"query": {"points": x, "weights": None, "label": None},
                "target": target, "target_names": ["vm"],
                "inputs": {"mesh": {"points": x.copy(), "values": None, "weights": None}},
                "theta": theta, "triangles": None}

    parameters = {"source": "Geo-FNO elasticity", "xy_sha256": _sha256(xy),
                  "sigma_sha256": _sha256(sigma), "rr_sha256": None if rr is None else _sha256(rr)}
    return _write(out, sample, n_samples, generator=GEOFNO_ELASTICITY, parameters=parameters,
                  seed=0, resume=resume, overwrite=overwrite, progress=progress,
                  desc="convert Geo-FNO elasticity")


def _vector(value: object, where: str) -> np.ndarray:
    """A finite real array of any shape, flattened, as float64."""
    try:
        array = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: expected real numbers, got {type(value).__name__}") from err
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: has non-finite values")
    return array


def _matrix(value: object, where: str, columns: int | None = None) -> np.ndarray:
    """A finite real 2-D array (``columns`` columns where given) as float64."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: expected a real array, got {type(value).__name__}") from err
    if array.ndim != 2 or array.shape[0] < 1 or (columns is not None
                                                 and array.shape[1] != columns):
        expected = f"(rows >= 1, {columns})" if columns is not None else "(rows >= 1, columns)"
        raise ValueError(f"{where}: expected shape {expected}, got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: has non-finite values")
    return array


def convert_gnot_pickle(
    file: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    trust_pickle: bool = False,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Convert one of GNOT's pickled data sets (module doc) into the ragged file ``out``.

    Args:
        file: the pickle, a list of ``[X, Y, θ, (f_1, ..., f_L)]`` (θ empty or ``None``: none;
            the input functions a list, or one array ``(L, M, d + c)`` of equal sizes).
        out: the ``.h5`` file to write (written to ``out.partial`` and renamed when complete).
        trust_pickle: must be true: unpickling can run any code the file holds.
        resume, overwrite, progress: as :func:`convert_geofno_elasticity`.

    Returns:
        The path of the finished file.

    Raises:
        ValueError: without ``trust_pickle``, or naming the sample and field that does not fit
            the first sample's layout.
    """
    if trust_pickle is not True:
        raise ValueError("trust_pickle: unpickling runs code from the file; pass True "
                         "(--trust-pickle) only for a file you trust")
    if not isinstance(file, (str, os.PathLike)) or not Path(file).is_file():
        raise FileNotFoundError(f"file: no such file: {file!r}")
    with open(file, "rb") as f:
        try:
            samples = pickle.load(f)  # the caller trusts the file (trust_pickle)
        except Exception as err:  # unpickling can fail in any way its contents choose
            raise ValueError(f"file: {str(file)!r} is not a readable pickle: "
                             f"{type(err).__name__}: {err}") from err
    if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)) or not samples:
        raise ValueError(f"file: expected a non-empty list of samples, got "
                         f"{type(samples).__name__}")

    def sample(i: int) -> dict[str, Any]:
        item = samples[i]
        where = f"sample {i}"
        if not isinstance(item, Sequence) or len(item) != 4:
            raise ValueError(f"{where}: expected [X, Y, theta, (f_1, ..., f_L)], got "
                             f"{type(item).__name__}")
        x = _matrix(item[0], f"{where}: X")
        y = _matrix(item[1], f"{where}: Y")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"{where}: Y has {y.shape[0]} rows, X {x.shape[0]}")
        theta = np.zeros(0) if item[2] is None else _vector(item[2], f"{where}: theta")
        functions = item[3]
        if isinstance(functions, np.ndarray) and functions.ndim == 3:
            functions = list(functions)  # L functions of equal sizes in one array
        if not isinstance(functions, Sequence) or not functions:
            shape = (f" of shape {functions.shape}" if isinstance(functions, np.ndarray)
                     else "")
            raise ValueError(f"{where}: expected the input functions as a non-empty list "
                             f"(f_1, ...) of (M_l, d + c_l) arrays, or one (L, M, d + c) "
                             f"array, got {type(functions).__name__}{shape}")
        dim = x.shape[1]
        inputs = {}
        for number, fn in enumerate(functions, start=1):
            rows = _matrix(fn, f"{where}: f{number}")
            if rows.shape[1] < dim:
                raise ValueError(f"{where}: f{number} has {rows.shape[1]} columns, fewer than "
                                 f"the {dim} coordinates of X")
            inputs[f"f{number}"] = {"points": rows[:, :dim],
                               "values": rows[:, dim:] if rows.shape[1] > dim else None,
                               "weights": None}
        return {"query": {"points": x, "weights": None, "label": None}, "target": y,
                "target_names": [f"y{c + 1}" for c in range(y.shape[1])], "inputs": inputs,
                "theta": theta if theta.size else None, "triangles": None}

    return _write(out, sample, len(samples), generator=GNOT_PICKLE,
                  parameters={"source": "GNOT pickle", "sha256": _sha256(file)}, seed=0,
                  resume=resume, overwrite=overwrite, progress=progress,
                  desc="convert GNOT pickle")
