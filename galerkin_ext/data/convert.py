"""Original data sets converted to our files, for users who have them: the same models then
train on the papers' data (``examples/elasticity.py`` on Geo-FNO's elasticity set,
``examples/heat.py`` on GNOT's heat pickle, ``examples/darcy_continuum.py`` and
``examples/kolmogorov.py`` on the continuum paper's grids; GNOT's other pickles through
:class:`RaggedDataset` and the registry's GNOT).  The GNOT experiments' sets become ragged files
(SPEC-gnot §3, §4.2); the continuum-attention paper's grids (SPEC-continuum §3) become Darcy
and Kolmogorov files (:func:`convert_continuum_darcy`, :func:`convert_continuum_navier_stokes`).

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
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from .._checks import check_choice, check_float, check_int, check_path, refused_by_safe_load
from .ragged import RaggedLayout, validate_sample, write_ragged
from .storage import check_output

__all__ = ["GEOFNO_ELASTICITY", "GNOT_PICKLE", "convert_continuum_darcy",
           "convert_continuum_navier_stokes", "convert_geofno_elasticity", "convert_gnot_pickle"]

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


def _source_file(path: object, name: str) -> Path:
    """The source file ``path`` (argument ``name``), which must exist."""
    if not check_path(path, name).is_file():
        raise FileNotFoundError(f"{name}: no such file: {path!r}")
    return Path(cast("str | os.PathLike[str]", path))  # (cast: check_path accepted it)


def _load(path: str | os.PathLike[str], name: str, shape_doc: str, ndim: int) -> np.ndarray:
    """A finite real ``.npy`` array of ``ndim`` dimensions, memory-mapped."""
    _source_file(path, name)
    with open(path, "rb") as f:  # np.load reads anything else as a pickle (or a .npz archive)
        npy = f.read(6) == b"\x93NUMPY"
    if not npy:
        raise ValueError(f"{name}: {str(path)!r} is not a .npy array file (it lacks the format's "
                         "magic string)")
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
    check_output(out, resume=resume, overwrite=overwrite, progress=progress)
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


def _matrix(value: object, where: str) -> np.ndarray:
    """A finite real 2-D array with at least one row, as float64."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: expected a real array, got {type(value).__name__}") from err
    if array.ndim != 2 or array.shape[0] < 1:
        raise ValueError(f"{where}: expected shape (rows >= 1, columns), got {array.shape}")
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
    check_output(out, resume=resume, overwrite=overwrite, progress=progress)
    if trust_pickle is not True:
        raise ValueError("trust_pickle: unpickling runs code from the file; pass True "
                         "(--trust-pickle) only for a file you trust")
    _source_file(file, "file")
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


# -- the continuum-attention paper's grids (SPEC-continuum §3): chunked files ------------------

_FieldReader = Callable[[int, int], dict[str, np.ndarray]]


def _scan(read: _FieldReader, n_samples: int, chunk_size: int, names: dict[str, str],
          visit: Callable[[int, dict[str, np.ndarray]], None]) -> None:
    """Read every chunk once before anything is written: a non-finite sample is named (by the
    source's variable, ``names``) while no partial file exists, and ``visit(start, chunk)`` sees
    each chunk and its first sample's index (what the file's parameters record is found from
    the data)."""
    for start in range(0, n_samples, chunk_size):
        chunk = read(start, min(start + chunk_size, n_samples))
        for key, values in chunk.items():
            bad = np.flatnonzero(~np.isfinite(values).reshape(len(values), -1).all(axis=1))
            if bad.size:
                raise ValueError(f"{names[key]}: sample {start + int(bad[0])} has non-finite "
                                 "values")
        visit(start, chunk)


def _square_fields(shape: tuple[int, ...], dtype: np.dtype, where: str, least: int) -> int:
    """The side ``s`` of ``n`` real fields of shape ``shape`` = ``(n, s, s)``."""
    if len(shape) != 3 or shape[0] < 1 or shape[1] != shape[2] or shape[1] < least:
        raise ValueError(f"{where}: expected N >= 1 square fields of at least {least} x {least} "
                         f"points, got shape {shape}")
    if dtype.kind != "f":
        raise ValueError(f"{where}: expected real floating-point values, got {dtype}")
    return shape[1]


def convert_continuum_darcy(
    file: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    chunk_size: int = 256,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Convert the continuum-attention authors' Darcy ``.mat`` file into a Darcy file of ours,
    which :class:`~galerkin_ext.data.ContinuumDarcyDataset` and ``examples/darcy_continuum.py
    --data`` read like a generated one.

    The file (MATLAB v7.3, i.e. HDF5, read in slices; or v5, read whole) holds ``x``, the
    coefficients, and ``y``, the solutions, each of MATLAB shape ``(s, s, N)`` on the nodes
    ``i / (s - 1)`` of the unit square.  Sample ``n`` becomes ``a[n, i, j] = x(i, j, n)`` and
    ``u[n, i, j] = y(i, j, n)`` (the problem is symmetric in the two axes).  The coefficient's
    kind is read from the values: two distinct values (3 and 12 in the paper) make it
    ``'piecewise'``, more ``'lognormal'``; the file records it, with the source's SHA-256, and
    the same summary statistics as a generated file (``info``: the spread of ``log a``, or the
    fraction of cells at the high value).

    Args:
        file: the ``.mat`` file.
        out: the ``.h5`` file to write (via ``out.partial``, resumable).
        chunk_size: samples per stored chunk.
        resume, overwrite, progress: as for :func:`convert_geofno_elasticity`.

    Returns:
        The path of the finished file.

    Raises:
        ValueError: naming the variable whose array has the wrong shape, type or non-finite
            values (found before the output is begun).
    """
    check_output(out, resume=resume, overwrite=overwrite, progress=progress)
    import h5py

    from .generate import _darcy_statistics
    from .mat import is_mat_v73, load_mat
    from .storage import ArraySpec, ChunkedWriter, run_chunks

    path = _source_file(file, "file")
    chunk_size = check_int(chunk_size, "chunk_size")
    names = {"a": f"{str(path)!r}: variable 'x'", "u": f"{str(path)!r}: variable 'y'"}
    try:
        h5 = h5py.File(path, "r") if is_mat_v73(path) else None
    except OSError as err:  # a truncated or damaged HDF5 file
        raise ValueError(f"{str(path)!r} is not a readable MATLAB v7.3 file: {err}") from None
    try:
        if h5 is not None:  # HDF5 stores MATLAB's (s, s, N) as (N, s, s) with i and j swapped
            missing = [k for k in ("x", "y") if k not in h5 or not isinstance(h5[k], h5py.Dataset)]
            if missing:
                raise ValueError(f"{str(path)!r} lacks {missing}; it holds "
                                 f"{sorted(k for k in h5 if not k.startswith('#'))}")
            # MATLAB drops a trailing singleton axis: one sample is stored as (s, s)
            sources = {"a": h5["x"], "u": h5["y"]}
            shapes = {k: (1, *v.shape) if v.ndim == 2 else tuple(v.shape)
                      for k, v in sources.items()}
            dtypes = {k: v.dtype for k, v in sources.items()}

            def read(start: int, stop: int) -> dict[str, np.ndarray]:
                return {k: np.ascontiguousarray((v[()][None] if v.ndim == 2 else v[start:stop])
                                                .transpose(0, 2, 1))
                        for k, v in sources.items()}
        else:
            try:
                loaded = load_mat(path, ("x", "y"), stored_type=True)  # as the v7.3 branch
            except KeyError as err:  # a missing variable, named in the message
                raise ValueError(err.args[0]) from None
            fields = {"a": loaded["x"], "u": loaded["y"]}
            for key, value in fields.items():
                if value.ndim not in (2, 3):
                    raise ValueError(f"{names[key]}: expected shape (s, s, N), got "
                                     f"{value.shape}")
            fields = {k: np.moveaxis(v if v.ndim == 3 else v[..., None], -1, 0)
                      for k, v in fields.items()}
            shapes = {k: v.shape for k, v in fields.items()}
            dtypes = {k: v.dtype for k, v in fields.items()}

            def read(start: int, stop: int) -> dict[str, np.ndarray]:
                return {k: np.ascontiguousarray(v[start:stop]) for k, v in fields.items()}

        s = _square_fields(shapes["a"], dtypes["a"], names["a"] + " (samples first)", 3)
        _square_fields(shapes["u"], dtypes["u"], names["u"] + " (samples first)", 3)
        if shapes["u"] != shapes["a"]:
            raise ValueError(f"{names['u']}: expected the shape of 'x', {shapes['a']} (samples "
                             f"first), got {shapes['u']}")
        n_samples = shapes["a"][0]
        values: set[float] = set()

        def visit(start: int, chunk: dict[str, np.ndarray]) -> None:
            positive = (chunk["a"] > 0).reshape(len(chunk["a"]), -1).all(axis=1)
            if not positive.all():  # the equation needs a > 0; a log a statistic would be NaN
                raise ValueError(f"{names['a']}: sample {start + int(np.argmin(positive))} "
                                 "has a coefficient <= 0, expected a > 0")
            if len(values) <= 2:  # more than two: lognormal, nothing left to learn
                values.update(np.unique(chunk["a"]).tolist()[:3])

        _scan(read, n_samples, chunk_size, names, visit)
        if len(values) < 2:
            raise ValueError(f"{names['a']}: every coefficient is {values.pop():g}, expected a "
                             "piecewise-constant (two values) or lognormal coefficient")
        coef = "piecewise" if len(values) == 2 else "lognormal"
        statistic_names, statistics = _darcy_statistics(coef, max(values))
        parameters = {"source": "continuum-attention Darcy .mat", "sha256": _sha256(path),
                      "coef": coef, "resolution": s}
        writer = ChunkedWriter.open(
            out, generator="darcy", parameters=parameters, seed=0, n_samples=n_samples,
            chunk_size=chunk_size, resume=resume, overwrite=overwrite,
            arrays={k: ArraySpec((s, s), dtypes[k].str) for k in ("a", "u")},
            statistics=statistic_names)
        return run_chunks(writer, read, progress=progress, desc="convert continuum Darcy",
                          statistics=statistics)
    finally:
        if h5 is not None:
            h5.close()


def _forcing_axis(mean_field: np.ndarray, wavenumber: int) -> str:
    """Which axis of the sample-mean vorticity ``(s, s)`` carries the forcing's mode: the
    forcing ``-n cos(n y)`` leaves a mean profile ``~ cos(n y)`` along ``y``.  ``'xy'`` when it
    is axis 1 (ours: ``field[i, j]`` at ``(x_i, y_j)``), ``'yx'`` when axis 0, ``'unclear'`` when
    neither stands out (by a factor 3)."""
    along = [abs(np.fft.rfft(mean_field.mean(axis=other))[wavenumber])
             for other in (1, 0)]  # profile along axis 0, along axis 1
    if along[1] > 3 * along[0]:
        return "xy"
    if along[0] > 3 * along[1]:
        return "yx"
    return "unclear"


def convert_continuum_navier_stokes(
    file: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    axes: str = "auto",
    time: float = 11.0,
    dt_out: float = 0.1,
    nu: float = 1.0 / 70.0,
    wavenumber: int = 4,
    chunk_size: int = 256,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Convert the continuum-attention authors' Navier-Stokes (Kolmogorov flow) ``.pt`` file
    into a Kolmogorov file of ours, which :class:`~galerkin_ext.data.KolmogorovDataset` and
    ``examples/kolmogorov.py --data`` read like a generated one.

    The file holds one tensor ``(N, s, s, 2)``: the vorticity ``w(time)`` (``[..., 0]``, the
    input) and ``w(time + dt_out)`` (``[..., 1]``, the target) on the periodic grid ``2 pi (i,
    j) / s``.  Our files put ``x`` on axis 1 and ``y`` on axis 2, and the forcing ``-n cos(n y)``
    is not symmetric in them: ``axes='auto'`` finds ``y`` as the axis along which the
    sample-mean vorticity carries the forcing's mode ``n`` and transposes the fields if needed
    (refused when neither axis stands out); ``'xy'`` keeps, ``'yx'`` swaps the axes.  The
    physics (``time``, ``dt_out``, ``nu``, ``wavenumber``; the paper's by default) is not in
    the ``.pt``: the file records it, as what the rollout evaluation solves with.

    Args:
        file: the ``.pt`` file (read with ``torch.load(weights_only=True, mmap=True)``).
        out: the ``.h5`` file to write (via ``out.partial``, resumable).
        axes: ``'auto'``, ``'xy'`` or ``'yx'`` (see above).
        time, dt_out, nu, wavenumber: the flow the samples come from.
        chunk_size: samples per stored chunk.
        resume, overwrite, progress: as for :func:`convert_geofno_elasticity`.

    Returns:
        The path of the finished file.

    Raises:
        ValueError: the tensor has the wrong shape, type or non-finite values, or ``axes='auto'``
            cannot tell the axes apart (found before the output is begun).
    """
    check_output(out, resume=resume, overwrite=overwrite, progress=progress)
    import torch

    from .generate import _relative_change, kolmogorov_time_step, open_kolmogorov_file
    from .kolmogorov import cfl_number
    from .storage import run_chunks

    path = _source_file(file, "file")
    axes = check_choice(axes, "axes", ("auto", "xy", "yx"))
    time = check_float(time, "time", low_inclusive=True)
    dt_out = check_float(dt_out, "dt_out")
    nu = check_float(nu, "nu", low_inclusive=True)
    wavenumber = check_int(wavenumber, "wavenumber")
    chunk_size = check_int(chunk_size, "chunk_size")
    where = f"{str(path)!r}"
    with open(path, "rb") as fh:  # torch's message for these suggests unsafe loading instead
        if fh.read(8).startswith((b"MATLAB", b"\x89HDF")):
            raise ValueError(f"{where} is a MATLAB or HDF5 file, expected a .pt file holding a "
                             "tensor (N, s, s, 2), as torch.save writes it")
    try:
        try:  # mapped: read by chunks
            pairs = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (non-zip) format cannot be mapped
            pairs = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for files it cannot read
        if refused_by_safe_load(err):  # (torch's text advises unsafe loading)
            raise ValueError(f"{where}: a safe load (torch.load(weights_only=True)) refuses "
                             "its content; expected one tensor (N, s, s, 2), as torch.save "
                             "writes it") from None
        raise ValueError(f"{where} is not a readable .pt tensor file ({type(err).__name__}: "
                         f"{err})") from err
    if not isinstance(pairs, torch.Tensor):
        raise ValueError(f"{where}: expected one tensor (N, s, s, 2), got "
                         f"{type(pairs).__name__}")
    if pairs.dim() != 4 or pairs.shape[3] != 2:
        raise ValueError(f"{where}: expected a tensor (N, s, s, 2) of input and target "
                         f"vorticity, got shape {tuple(pairs.shape)}")
    if pairs.dtype not in (torch.float32, torch.float64):  # the solver's dtypes, for rollouts
        raise ValueError(f"{where}: expected float32 or float64 vorticity, got {pairs.dtype}")
    dtype = np.dtype(str(pairs.dtype).removeprefix("torch."))
    s = _square_fields(tuple(pairs.shape[:3]), dtype, where, 2 * wavenumber + 1)
    n_samples = pairs.shape[0]
    names = {"input": f"{where} [..., 0]", "output": f"{where} [..., 1]"}
    swap = axes == "yx"

    def read(start: int, stop: int) -> dict[str, np.ndarray]:
        chunk = pairs[start:stop].numpy()
        if swap:
            chunk = chunk.transpose(0, 2, 1, 3)
        return {"input": np.ascontiguousarray(chunk[..., 0]),
                "output": np.ascontiguousarray(chunk[..., 1])}

    total = np.zeros((s, s))

    def visit(_start: int, chunk: dict[str, np.ndarray]) -> None:
        total[...] += chunk["input"].sum(axis=0, dtype=np.float64)
        total[...] += chunk["output"].sum(axis=0, dtype=np.float64)

    _scan(read, n_samples, chunk_size, names, visit)
    found = _forcing_axis(total, wavenumber)
    if axes != "auto" and found == "yx":  # (found on the fields as read, axes applied)
        warnings.warn(f"{where}: axes={axes!r} given, but then the mean vorticity carries the "
                      f"forcing's mode {wavenumber} along x, not y; the rollout's reference "
                      "solves with the forcing on y", stacklevel=2)
    if axes == "auto":
        if found == "unclear":
            raise ValueError(f"{where}: axes='auto' cannot tell x from y (the mean vorticity "
                             f"shows the forcing's mode {wavenumber} along neither axis by a "
                             "factor 3); pass axes='xy' (--axes xy) or 'yx'")
        swap = found == "yx"
        axes = found
    max_step = kolmogorov_time_step(s, dt_out)  # the CFL numbers' step, and rollouts'
    writer = open_kolmogorov_file(
        out, {"source": "continuum-attention Navier-Stokes .pt", "sha256": _sha256(path),
              "axes": axes, "time": time, "dt_out": dt_out, "nu": nu, "wavenumber": wavenumber,
              "resolution": s, "solve_resolution": s, "max_step": max_step,
              "solve_dtype": dtype.name},
        seed=0, n_samples=n_samples, chunk_size=chunk_size, resume=resume, overwrite=overwrite)

    def statistics(chunk: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cfl = torch.maximum(*(cfl_number(torch.from_numpy(chunk[k]).double(), max_step)
                              for k in ("input", "output")))
        return {"omega_T": chunk["input"], "persistence": _relative_change(chunk),
                "cfl": cfl.numpy()}

    return run_chunks(writer, read, progress=progress, desc="convert continuum Navier-Stokes",
                      statistics=statistics)
