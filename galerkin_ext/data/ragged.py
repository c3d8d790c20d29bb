"""HDF5 storage of ragged data sets (SPEC-gnot §3): samples of different sizes, written chunk by
chunk and resumably, read back with checks.

Schema ``galerkin_ext.ragged/1``.  The samples are concatenated: sample ``b`` owns the rows
``offsets[b]:offsets[b + 1]`` of every dataset that its ``offsets`` index; float64 unless said.

* ``query/points`` ``(ΣN, d)``, ``query/offsets`` ``(n + 1,)`` int64, ``query/weights``
  ``(ΣN,)`` (lumped areas; optional), ``query/label`` ``(ΣN,)`` int8 (optional);
* ``target/values`` ``(ΣN, o)`` (rows indexed by ``query/offsets``);
* per input function ``<name>``: ``inputs/<name>/points`` ``(ΣM, d)``, ``inputs/<name>/values``
  ``(ΣM, c)`` (absent when ``c = 0``, e.g. a boundary shape), ``inputs/<name>/offsets``
  ``(n + 1,)`` int64, ``inputs/<name>/weights`` ``(ΣM,)`` (optional);
* ``theta`` ``(n, p)`` (optional), ``mesh/triangles`` ``(ΣT, 3)`` int32 (indices local to the
  sample's query points) and ``mesh/offsets`` ``(n + 1,)`` int64 (optional);
* ``completed`` ``(n_chunks,)`` uint8: 1 once chunk ``i`` (samples ``[i c, (i + 1) c)`` for the
  chunk size ``c``) is written and flushed;
* attributes as :mod:`.storage`'s files -- ``schema``, ``generator``, ``parameters`` (JSON),
  ``seed``, ``n_samples``, ``chunk_size``, ``package_version``, ``library_versions``,
  ``complete`` -- plus
  ``input_names`` and ``target_names`` (JSON lists; ``input_names`` is the models' input
  order), ``space_dim`` and ``layout`` (the :class:`RaggedLayout`, JSON; every read checks the
  datasets against it, so a deleted optional field is an error; files written before it was
  recorded are read by their datasets).

Every sample has the same layout (:class:`RaggedLayout`: which fields exist, their channel
counts); only the sizes ``N``, ``M_l``, ``T`` vary.  Ragged datasets are resizable and appended
per chunk; the ``offsets`` and ``theta`` have their final size from the start.  Every dataset
carries Fletcher-32 checksums, so a corrupted chunk fails to read instead of returning wrong
numbers.  As for :mod:`.storage`, a generation writes ``FILE.partial`` and renames it to
``FILE`` when complete; ``resume`` truncates the ragged datasets to the last completed chunk and
appends from there, so a resumed file holds exactly the datasets of an uninterrupted one
(sample ``i`` depends on ``(seed, i)`` only).

Per-sample interface (what a ``sample_fn(index)`` returns, and :meth:`RaggedArrays.sample`
gives back)::

    {"query": {"points": (N, d), "weights": (N,) | None, "label": int8 (N,) | None},
     "target": (N, o), "target_names": [o names],
     "inputs": {name: {"points": (M, d), "values": (M, c) | None, "weights": (M,) | None}},
     "theta": (p,) | None, "triangles": int32 (T, 3) | None}
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .._checks import check_bool, check_int, check_path, check_seed
from .storage import (
    _OVERWRITE,
    RAGGED_SCHEMA,
    DataFileError,
    PartialFileWriter,
    _allocated,
    _attr,
    _combine,
    _json_object,
    _new_partial_file,
    _open,
    _open_to_resume,
    _rebuild_beside,
    _room_to_copy,
    check_output,
    check_resumable_attributes,
    library_versions,
    parameters_json,
    prepare_output,
    record_resumption,
    run_chunks,
)

__all__ = [
    "RAGGED_SCHEMA",
    "InputSpec",
    "RaggedLayout",
    "RaggedInput",
    "RaggedArrays",
    "RaggedWriter",
    "validate_sample",
    "write_ragged",
    "read_ragged",
    "read_header",
    "inspect_ragged",
    "is_ragged_file",
]

#: Groups of fields that :func:`read_ragged` can read.
FIELDS = ("query", "target", "inputs", "theta", "mesh")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# HDF5 chunk of a ragged dataset: about 64 KiB, so one sample's rows span few chunks.
_CHUNK_BYTES = 1 << 16
_STAT_BLOCK = 1 << 20  # rows per block when inspect_ragged streams a dataset


# -- the layout and the per-sample checks -------------------------------------------------------


@dataclass(frozen=True)
class InputSpec:
    """One input function: its ``name``, value ``channels`` (0: coordinates only) and whether
    it has quadrature ``weights``."""

    name: str
    channels: int
    weights: bool

    def __post_init__(self) -> None:
        _check_names([self.name], "InputSpec.name")
        check_int(self.channels, f"InputSpec({self.name!r}).channels", 0)
        check_bool(self.weights, f"InputSpec({self.name!r}).weights")


@dataclass(frozen=True)
class RaggedLayout:
    """What every sample of a file holds (not the sizes, which vary).

    Attributes:
        space_dim: ``d``, columns of the query and input points.
        target_names: one name per target channel (``o`` of them).
        inputs: the input functions, in the models' order.
        theta_dim: ``p`` (0: no ``theta``).
        query_weights, query_label, mesh: whether the samples have query weights, subdomain
            labels and triangles.
    """

    space_dim: int
    target_names: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    theta_dim: int
    query_weights: bool
    query_label: bool
    mesh: bool

    def __post_init__(self) -> None:
        # the rules validate_sample applies, for a layout given to RaggedWriter.open or read
        # from a file's record
        check_int(self.space_dim, "layout.space_dim")
        if not _check_names(self.target_names, "layout.target_names"):
            raise ValueError("layout.target_names: expected at least one target channel")
        if isinstance(self.inputs, str) or not isinstance(self.inputs, Sequence) or not all(
                isinstance(spec, InputSpec) for spec in self.inputs):
            raise TypeError(f"layout.inputs: expected a sequence of InputSpec, got "
                            f"{self.inputs!r}")
        _check_names([spec.name for spec in self.inputs], "layout.inputs")
        # tuples, as a sample's layout holds them: lists would compare unequal to them
        object.__setattr__(self, "target_names", tuple(self.target_names))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        check_int(self.theta_dim, "layout.theta_dim", 0)
        for key in ("query_weights", "query_label", "mesh"):
            check_bool(getattr(self, key), f"layout.{key}")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def out_dim(self) -> int:
        return len(self.target_names)

    @classmethod
    def from_sample(cls, sample: object, where: str = "sample") -> RaggedLayout:
        """The layout of one sample (checked by :func:`validate_sample`)."""
        return _layout_of(validate_sample(sample, where=where))

    def to_json(self) -> str:
        """The layout as the JSON a file records (attribute ``layout``)."""
        fields = asdict(self)
        fields["inputs"] = [[spec.name, spec.channels, spec.weights] for spec in self.inputs]
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: str) -> RaggedLayout:
        fields = json.loads(text)
        fields["target_names"] = tuple(fields["target_names"])
        fields["inputs"] = tuple(InputSpec(*spec) for spec in fields["inputs"])
        return cls(**fields)

    @classmethod
    def from_file(cls, f: h5py.File, name: str = "file") -> RaggedLayout:
        """The layout of an open ragged file (``name`` for messages): the one it records
        (files written before the record: inferred from its datasets), checked against the
        datasets it holds, so a deleted field is an error, not a field the file never had."""
        try:
            input_names = json.loads(_attr(f, "input_names"))
            target_names = json.loads(_attr(f, "target_names"))
            space_dim = int(_attr(f, "space_dim"))
            inputs = []
            for key in input_names:
                group = f[f"inputs/{key}"]
                channels = group["values"].shape[1] if "values" in group else 0
                inputs.append(InputSpec(key, int(channels), "weights" in group))
            held = cls(
                space_dim=space_dim,
                target_names=tuple(target_names),
                inputs=tuple(inputs),
                theta_dim=int(f["theta"].shape[1]) if "theta" in f else 0,
                query_weights="query/weights" in f,
                query_label="query/label" in f,
                mesh="mesh/triangles" in f,
            )
            recorded = cls.from_json(f.attrs["layout"]) if "layout" in f.attrs else held
        except (KeyError, ValueError, TypeError, IndexError) as err:
            raise DataFileError(f"{name} lacks ragged schema fields or records a broken "
                                f"layout: {err}") from err
        missing = recorded.differences(held)
        if missing:
            raise DataFileError(f"{name}: its datasets do not hold the layout it records "
                                f"({'; '.join(missing)}, recorded vs held); the file is damaged")
        return recorded

    def differences(self, other: RaggedLayout) -> list[str]:
        """Human-readable differences from ``other`` (empty when equal)."""
        out = []
        for key in ("space_dim", "target_names", "theta_dim", "query_weights", "query_label",
                    "mesh"):
            a, b = getattr(self, key), getattr(other, key)
            if a != b:
                out.append(f"{key} {a!r} vs {b!r}")
        if self.input_names != other.input_names:
            out.append(f"input functions {list(self.input_names)} vs {list(other.input_names)}")
        else:
            for a, b in zip(self.inputs, other.inputs, strict=True):
                if a != b:
                    out.append(f"input {a.name!r}: {a.channels} channels, weights "
                               f"{a.weights} vs {b.channels} channels, weights {b.weights}")
        return out


def _real_array(value: object, where: str, shape_doc: str, ndim: int) -> np.ndarray:
    """``value`` as a finite float64 array of rank ``ndim`` (ints accepted, bools not)."""
    arr = np.asarray(value) if value is not None else None
    if arr is None or arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"{where}: expected a real array of shape {shape_doc}, got "
                        f"{getattr(arr, 'dtype', type(value).__name__)}")
    if arr.ndim != ndim:
        raise ValueError(f"{where}: expected shape {shape_doc}, got {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"{where}: contains NaN or inf")
    return arr


def _int_array(value: object, where: str, shape_doc: str, ndim: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iu" or arr.ndim != ndim:
        raise TypeError(f"{where}: expected an integer array of shape {shape_doc}, got "
                        f"{arr.dtype} {arr.shape}")
    return arr


def _check_names(names: object, where: str) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"{where}: expected a list of names, got {names!r}")
    for name in names:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: expected identifiers (letters, digits, '_'), got "
                             f"{name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: names must be unique, got {list(names)}")
    return tuple(names)


def _get(mapping: Mapping[str, Any], key: str, where: str, required: bool = True) -> Any:
    if key not in mapping:
        if required:
            raise KeyError(f"{where}: missing the key {key!r} (keys: {sorted(mapping)})")
        return None
    return mapping[key]


def _check_keys(mapping: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    """A key outside ``known`` is refused: a misspelt optional one (``value`` for ``values``)
    would be dropped from the file without a word."""
    unknown = sorted(str(k) for k in mapping if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (expected some of {list(known)})")


def _weights(value: object, n: int, where: str) -> np.ndarray | None:
    if value is None:
        return None
    w = _real_array(value, where, f"({n},)", 1)
    if w.shape != (n,):
        raise ValueError(f"{where}: expected shape ({n},), got {w.shape}")
    if (w < 0).any() or not w.sum() > 0:
        raise ValueError(f"{where}: expected non-negative weights with a positive sum")
    return w


def validate_sample(sample: object, *, where: str = "sample",
                    layout: RaggedLayout | None = None) -> dict[str, Any]:
    """Check one sample of the per-sample interface (module doc) and convert its arrays.

    Every sample needs ``N >= 1`` query points and ``M >= 1`` points per input function;
    values must be finite, weights non-negative with a positive sum, triangle indices in
    ``[0, N)``, labels in the int8 range; a key outside the interface is refused.  With
    ``layout``, the sample must also match it.

    Returns the same structure with float64 / int8 / int32 arrays (``None`` for absent
    optional fields; ``values`` with ``c = 0`` columns become ``None``).  Errors name
    ``where`` and the field, e.g. ``"sample_fn(7): inputs['g'].points: contains NaN or inf"``.
    """
    if not isinstance(sample, Mapping):
        raise TypeError(f"{where}: expected a dict with the keys query, target, target_names, "
                        f"inputs, theta, triangles; got {type(sample).__name__}")
    _check_keys(sample, ("query", "target", "target_names", "inputs", "theta", "triangles"),
                where)
    query = _get(sample, "query", where)
    if not isinstance(query, Mapping):
        raise TypeError(f"{where}: query: expected a dict with points, weights, label")
    _check_keys(query, ("points", "weights", "label"), f"{where}: query")
    points = _real_array(_get(query, "points", f"{where}: query"), f"{where}: query.points",
                         "(N, d)", 2)
    n, d = points.shape
    if n < 1 or d < 1:
        raise ValueError(f"{where}: query.points: expected N >= 1 points of d >= 1 "
                         f"coordinates, got shape {points.shape} (an empty sample)")
    weights = _weights(_get(query, "weights", f"{where}: query", False), n,
                       f"{where}: query.weights")
    label = _get(query, "label", f"{where}: query", False)
    if label is not None:
        label = _int_array(label, f"{where}: query.label", f"({n},)", 1)
        if label.shape != (n,):
            raise ValueError(f"{where}: query.label: expected shape ({n},), got {label.shape}")
        if label.size and (label.min() < -128 or label.max() > 127):
            raise ValueError(f"{where}: query.label: values must fit int8 ([-128, 127])")
        label = label.astype(np.int8)
    target = _real_array(_get(sample, "target", where), f"{where}: target", "(N, o)", 2)
    if target.shape[0] != n or target.shape[1] < 1:
        raise ValueError(f"{where}: target: expected shape ({n}, o) with o >= 1 (N from "
                         f"query.points), got {target.shape}")
    target_names = _check_names(_get(sample, "target_names", where), f"{where}: target_names")
    if len(target_names) != target.shape[1]:
        raise ValueError(f"{where}: target_names: expected {target.shape[1]} names (one per "
                         f"target channel), got {list(target_names)}")
    inputs_in = _get(sample, "inputs", where)
    if not isinstance(inputs_in, Mapping):
        raise TypeError(f"{where}: inputs: expected a dict {{name: {{points, values, "
                        f"weights}}}}, got {type(inputs_in).__name__}")
    _check_names(list(inputs_in), f"{where}: inputs")
    inputs: dict[str, dict[str, np.ndarray | None]] = {}
    for name, fn in inputs_in.items():
        at = f"{where}: inputs[{name!r}]"
        if not isinstance(fn, Mapping):
            raise TypeError(f"{at}: expected a dict with points, values, weights")
        _check_keys(fn, ("points", "values", "weights"), at)
        p = _real_array(_get(fn, "points", at), f"{at}.points", "(M, d)", 2)
        if p.shape[0] < 1 or p.shape[1] != d:
            raise ValueError(f"{at}.points: expected shape (M, {d}) with M >= 1 (an input "
                             f"function needs points), got {p.shape}")
        m = p.shape[0]
        values = _get(fn, "values", at, False)
        if values is not None:
            values = _real_array(values, f"{at}.values", f"({m}, c)", 2)
            if values.shape[0] != m:
                raise ValueError(f"{at}.values: expected shape ({m}, c), got {values.shape}")
            if values.shape[1] == 0:
                values = None
        inputs[name] = {"points": p, "values": values,
                        "weights": _weights(_get(fn, "weights", at, False), m, f"{at}.weights")}
    theta = _get(sample, "theta", where, False)
    if theta is not None:
        theta = _real_array(theta, f"{where}: theta", "(p,)", 1)
        if theta.size == 0:
            theta = None
    triangles = _get(sample, "triangles", where, False)
    if triangles is not None:
        triangles = _int_array(triangles, f"{where}: triangles", "(T, 3)", 2)
        if triangles.shape[1] != 3 or triangles.shape[0] < 1:
            raise ValueError(f"{where}: triangles: expected shape (T, 3) with T >= 1, got "
                             f"{triangles.shape}")
        if triangles.min() < 0 or triangles.max() >= n:
            raise ValueError(f"{where}: triangles: vertex indices must lie in [0, {n}) (local "
                             "to the sample's query points)")
        triangles = triangles.astype(np.int32)
    checked = {"points": points, "weights": weights, "label": label, "target": target,
               "target_names": target_names, "inputs": inputs, "theta": theta,
               "triangles": triangles}
    if layout is not None:
        diff = _layout_of(checked).differences(layout)
        if diff:
            raise ValueError(f"{where}: does not match the file's layout ({'; '.join(diff)}; "
                             "this sample's value first)")
    return checked


def _layout_of(checked: dict[str, Any]) -> RaggedLayout:
    inputs = tuple(
        InputSpec(name, 0 if fn["values"] is None else fn["values"].shape[1],
                  fn["weights"] is not None)
        for name, fn in checked["inputs"].items()
    )
    return RaggedLayout(
        space_dim=checked["points"].shape[1],
        target_names=checked["target_names"],
        inputs=inputs,
        theta_dim=0 if checked["theta"] is None else checked["theta"].shape[0],
        query_weights=checked["weights"] is not None,
        query_label=checked["label"] is not None,
        mesh=checked["triangles"] is not None,
    )


# -- writing ------------------------------------------------------------------------------------


def _ragged_groups(layout: RaggedLayout) -> dict[str, list[str]]:
    """``{offsets dataset: [the ragged datasets whose rows it indexes]}``."""
    query = ["query/points", "target/values"]
    if layout.query_weights:
        query.append("query/weights")
    if layout.query_label:
        query.append("query/label")
    groups = {"query/offsets": query}
    for spec in layout.inputs:
        g = f"inputs/{spec.name}"
        groups[f"{g}/offsets"] = [f"{g}/points"] + [f"{g}/values"] * (spec.channels > 0) + [
            f"{g}/weights"] * spec.weights
    if layout.mesh:
        groups["mesh/offsets"] = ["mesh/triangles"]
    return groups


def _member(layout: RaggedLayout, name: str) -> tuple[int | None, str]:
    """The columns (``None``: a 1-D dataset) and dtype of the ragged dataset ``name``."""
    leaf = name.rsplit("/", 1)[1]
    if name == "target/values":
        return layout.out_dim, "f8"
    if name == "query/label":
        return None, "i1"
    if name == "mesh/triangles":
        return 3, "i4"
    if leaf == "points":
        return layout.space_dim, "f8"
    if leaf == "values":
        return layout.inputs[layout.input_names.index(name.split("/")[1])].channels, "f8"
    return None, "f8"  # weights


def _create(f: h5py.File, layout: RaggedLayout, n_samples: int) -> None:
    """The datasets of an empty file of ``layout``."""
    for offsets, members in _ragged_groups(layout).items():
        f.create_dataset(offsets, shape=(n_samples + 1,), dtype="i8",
                         chunks=(min(n_samples + 1, 8192),), fletcher32=True, fillvalue=0)
        for name in members:
            cols, dtype = _member(layout, name)
            shape = (0,) if cols is None else (0, cols)
            rows = max(256, _CHUNK_BYTES // (np.dtype(dtype).itemsize * (cols or 1)))
            f.create_dataset(name, shape=shape, maxshape=(None, *shape[1:]), dtype=dtype,
                             chunks=(rows, *shape[1:]), fletcher32=True)
    if layout.theta_dim:
        f.create_dataset("theta", shape=(n_samples, layout.theta_dim), dtype="f8",
                         chunks=(min(n_samples, 4096), layout.theta_dim), fletcher32=True)
    f.attrs["input_names"] = json.dumps(list(layout.input_names))
    f.attrs["target_names"] = json.dumps(list(layout.target_names))
    f.attrs["space_dim"] = layout.space_dim
    f.attrs["layout"] = layout.to_json()


def _stored_rows(f: h5py.File, layout: RaggedLayout, start: int,
                 stop: int) -> dict[str, np.ndarray] | None:
    """What samples ``[start, stop)`` of the file ``f`` hold in each dataset (the offsets
    ``start + 1`` to ``stop``, each ragged dataset's rows between them, ``theta``), read and
    so checked against their checksums; ``None`` where HDF5 lost a chunk of them."""
    def whole(ds: h5py.Dataset, first: int, last: int) -> bool:
        """Whether every HDF5 chunk holding rows ``[first, last)`` of ``ds`` was stored."""
        step = ds.chunks[0]
        return 0 <= first <= last <= ds.shape[0] and all(
            _allocated(ds, row) for row in range(first - first % step, last, step))

    rows: dict[str, np.ndarray] = {}
    for offsets, members in _ragged_groups(layout).items():
        if not whole(f[offsets], start, stop + 1):
            return None
        bounds = f[offsets][start : stop + 1]
        rows[offsets] = bounds[1:]
        for name in members:
            if not whole(f[name], int(bounds[0]), int(bounds[-1])):
                return None
            rows[name] = f[name][int(bounds[0]) : int(bounds[-1])]
    if layout.theta_dim:
        if not whole(f["theta"], start, stop):
            return None
        rows["theta"] = f["theta"][start:stop]
    return rows


def _check_shapes(f: h5py.File, layout: RaggedLayout, n_samples: int, name: str) -> None:
    """Every dataset of ``layout`` has the shape ``n_samples`` and the layout give it (the
    rows of a ragged dataset aside, which its offsets check): ``DataFileError`` naming the
    first that does not (h5py reads past a short dataset's end without an error)."""
    expected: dict[str, tuple[int | None, ...]] = {}
    for offsets, members in _ragged_groups(layout).items():
        expected[offsets] = (n_samples + 1,)
        for member in members:
            cols = _member(layout, member)[0]
            expected[member] = (None,) if cols is None else (None, cols)
    if layout.theta_dim:
        expected["theta"] = (n_samples, layout.theta_dim)
    for key, shape in expected.items():
        held = f[key].shape
        if len(held) != len(shape) or any(a is not None and a != b for a, b in zip(
                shape, held, strict=False)):
            doc = ", ".join("rows" if a is None else str(a) for a in shape)
            raise DataFileError(f"{name}: {key} has shape {held}, expected ({doc}) for "
                                f"{n_samples} samples of its layout; the file is damaged")


def _completed_prefix(done: np.ndarray, name: str) -> int:
    """Number of leading completed chunks; chunks are appended in order, so a completed one
    after a pending one means a damaged record."""
    pending = np.flatnonzero(done == 0)
    k = int(pending[0]) if pending.size else int(done.shape[0])
    if done[k:].any():
        raise DataFileError(f"{name}: its completed-chunk record {done.tolist()} is not a "
                            "prefix (chunks are appended in order); the file is damaged")
    return k


class RaggedWriter(PartialFileWriter):
    """Append the chunks of ragged samples to ``FILE.partial``, then publish it as ``FILE``.

    Use :meth:`open`, then :meth:`write_chunk` for each of :meth:`pending_chunks` in order,
    then :meth:`finish` (or :func:`write_ragged`, which does all of it from a
    ``sample_fn``).
    """

    def __init__(self, path: Path, file: h5py.File, chunk_size: int, n_samples: int,
                 lock: contextlib.ExitStack, layout: RaggedLayout) -> None:
        super().__init__(path, file, chunk_size, n_samples, lock)
        self.layout = layout

    @property
    def slack_bytes(self) -> int:  # type: ignore[override]
        """A store may begin one HDF5 chunk of every data set (the first store of a heat set
        took 2.35 times its samples' bytes): one chunk's bytes of each, offsets and theta
        included, whatever their widths."""
        sizes: list[int] = []
        self.file.visititems(lambda name, obj: sizes.append(
            math.prod(obj.chunks) * obj.dtype.itemsize)
            if isinstance(obj, h5py.Dataset) and obj.chunks else None)
        return sum(sizes)

    @classmethod
    def open(
        cls,
        out: str | os.PathLike[str],
        *,
        generator: str,
        parameters: dict[str, Any],
        seed: int,
        n_samples: int,
        chunk_size: int,
        layout: RaggedLayout | Callable[[], RaggedLayout],
        libraries: Sequence[str] = (),
        resume: bool = False,
        overwrite: bool = False,
    ) -> RaggedWriter:
        """Create (or, with ``resume``, reopen and truncate to its completed chunks) the
        partial file of a generation.

        ``layout``: the samples' :class:`RaggedLayout`, or a function giving it, called only
        when a new file is created (e.g. from the first sample).  On resume the file's own
        layout holds (a given one must equal it) and the recorded ``generator``,
        ``parameters``, ``seed`` and ``n_samples`` must equal this run's. ``libraries``: as
        :meth:`~.storage.ChunkedWriter.open`'s.

        Raises ``FileExistsError`` (see :func:`~.storage.prepare_output`) and
        :class:`DataFileError` for a partial file that cannot be resumed.
        """
        from .. import __version__

        if not isinstance(generator, str) or not generator:
            raise TypeError(f"generator: expected a non-empty str, got {generator!r}")
        seed = check_seed(seed)
        n_samples = check_int(n_samples, "n_samples")
        chunk_size = check_int(chunk_size, "chunk_size")
        if not (isinstance(layout, RaggedLayout) or callable(layout)):
            raise TypeError(f"layout: expected a RaggedLayout or a function returning one, got "
                            f"{type(layout).__name__}")
        attrs = {
            "schema": RAGGED_SCHEMA,
            "generator": generator,
            "parameters": parameters_json(parameters),
            "seed": seed,
            "n_samples": n_samples,
            "package_version": __version__,
            "library_versions": library_versions(libraries),
        }
        final, part, lock = prepare_output(out, resume=resume, overwrite=overwrite)
        with lock:  # released if opening fails; else handed to the writer
            if resume and part.exists():
                chunk_size, stored, copied, changed = cls._rebuild(part, attrs, layout,
                                                                   n_samples)
                f = _open_to_resume(part)
                try:
                    if not copied:  # (no room for a copy: resumed in place, as before)
                        cls._truncate(f, part, stored, chunk_size, n_samples)
                    record_resumption(f, part, attrs, changed)
                except BaseException:
                    f.close()
                    raise
                return cls(final, f, chunk_size, n_samples, lock.pop_all(), stored)
            if not isinstance(layout, RaggedLayout):
                layout = layout()  # before the partial file exists: a failing sample leaves none
                if not isinstance(layout, RaggedLayout):
                    raise TypeError(f"layout: the function returned {type(layout).__name__}, not a "
                                    "RaggedLayout")
            f = _new_partial_file(part, attrs, chunk_size, n_samples,
                                 partial(_create, layout=layout, n_samples=n_samples))
            return cls(final, f, chunk_size, n_samples, lock.pop_all(), layout)

    @classmethod
    def _rebuild(cls, part: Path, attrs: dict[str, Any],
                 layout: RaggedLayout | Callable[[], RaggedLayout],
                 n_samples: int) -> tuple[int, RaggedLayout, bool, list[str]]:
        """Copy the completed chunks of the interrupted partial file ``part``, in order up to
        the first that cannot be read whole, into a new file that replaces it (as
        :class:`~.storage.ChunkedWriter` does, and why: HDF5 is not crash-safe). Returns the
        file's chunk size and layout, whether it was copied (not where the disk has no room
        for the copy), and the versions that changed (see
        :func:`~.storage.check_resumable_attributes`)."""
        with _open_to_resume(part, "r") as old:
            changed = check_resumable_attributes(old, part, attrs)
            stored = RaggedLayout.from_file(old, repr(str(part)))
            if isinstance(layout, RaggedLayout) and stored.differences(layout):
                raise DataFileError(f"cannot resume {str(part)!r}: its layout differs from "
                                    f"this run's ({'; '.join(stored.differences(layout))})")
            chunk_size = int(_attr(old, "chunk_size"))  # the record is per stored chunk size
            if not _room_to_copy(part):
                return chunk_size, stored, False, changed
            try:
                done = _completed_prefix(old["completed"][...], repr(str(part)))
            except OSError:  # (its checksum fails: every chunk is generated again)
                done = 0

            def copy(new: h5py.File) -> None:
                for chunk in range(done):
                    start, stop = chunk * chunk_size, min(n_samples, (chunk + 1) * chunk_size)
                    try:
                        rows = _stored_rows(old, stored, start, stop)
                    except OSError:  # a checksum that fails, a record that cannot be read
                        break
                    if rows is None:  # (data HDF5 lost: it would read them as zeros)
                        break
                    for name, value in rows.items():
                        if name.endswith("/offsets"):
                            new[name][start + 1 : stop + 1] = value
                        elif name == "theta":
                            new[name][start:stop] = value
                        else:  # appended, as write_chunk does
                            ds, held = new[name], new[name].shape[0]
                            ds.resize(held + value.shape[0], axis=0)
                            ds[held:] = value
                    new["completed"][chunk] = 1

            _rebuild_beside(part, lambda path: _new_partial_file(
                path, attrs, chunk_size, n_samples,
                partial(_create, layout=stored, n_samples=n_samples)), copy)
        return chunk_size, stored, True, changed

    @staticmethod
    def _truncate(f: h5py.File, part: Path, layout: RaggedLayout, chunk_size: int,
                  n_samples: int) -> None:
        """Cut every ragged dataset back to the rows of the completed chunks (an interrupted
        chunk may have appended some)."""
        n_done = min(n_samples, _completed_prefix(f["completed"][...], repr(str(part)))
                     * chunk_size)
        try:
            for offsets, members in _ragged_groups(layout).items():
                rows = int(f[offsets][n_done])
                for name in members:
                    if f[name].shape[0] < rows:
                        raise DataFileError(f"cannot resume {str(part)!r}: {name} has "
                                            f"{f[name].shape[0]} rows, its offsets say {rows}")
                    f[name].resize(rows, axis=0)
        except OSError as err:
            raise DataFileError(f"cannot resume {str(part)!r}: a stored chunk fails its "
                                f"checksum or cannot be read: {err}; {_OVERWRITE} starts "
                                "again") from err
        f.flush()

    def write_chunk(self, chunk: int, samples: Sequence[Mapping[str, Any]]) -> None:
        """Validate and append one chunk's samples (the next pending chunk: ragged data are
        appended in order), flush, then mark the chunk completed (and flush again)."""
        pending = self.pending_chunks()
        if not pending or pending[0][0] != chunk:
            expected = pending[0][0] if pending else None
            raise ValueError(f"chunk: chunks are appended in order; the next is {expected}, "
                             f"got {chunk!r}")
        _, start, stop = pending[0]
        if isinstance(samples, Mapping) or not isinstance(samples, Sequence) or (
            len(samples) != stop - start
        ):
            raise ValueError(f"samples: chunk {chunk} needs a list of {stop - start} samples "
                             f"({start} to {stop - 1})")
        checked = [validate_sample(s, where=f"sample {start + j}", layout=self.layout)
                   for j, s in enumerate(samples)]
        f = self.file

        def append(name: str, parts: list[np.ndarray]) -> None:
            ds = f[name]
            data = np.concatenate(parts)
            rows = ds.shape[0]
            ds.resize(rows + data.shape[0], axis=0)
            ds[rows:] = data

        def offsets(name: str, counts: list[int]) -> None:
            base = int(f[name][start])
            f[name][start + 1 : stop + 1] = base + np.cumsum(counts, dtype=np.int64)

        offsets("query/offsets", [c["points"].shape[0] for c in checked])
        append("query/points", [c["points"] for c in checked])
        append("target/values", [c["target"] for c in checked])
        if self.layout.query_weights:
            append("query/weights", [c["weights"] for c in checked])
        if self.layout.query_label:
            append("query/label", [c["label"] for c in checked])
        for spec in self.layout.inputs:
            g = f"inputs/{spec.name}"
            fns = [c["inputs"][spec.name] for c in checked]
            offsets(f"{g}/offsets", [fn["points"].shape[0] for fn in fns])
            append(f"{g}/points", [fn["points"] for fn in fns])
            if spec.channels:
                append(f"{g}/values", [fn["values"] for fn in fns])
            if spec.weights:
                append(f"{g}/weights", [fn["weights"] for fn in fns])
        if self.layout.theta_dim:
            f["theta"][start:stop] = np.stack([c["theta"] for c in checked])
        if self.layout.mesh:
            offsets("mesh/offsets", [c["triangles"].shape[0] for c in checked])
            append("mesh/triangles", [c["triangles"] for c in checked])
        f.flush()  # the data are on disk before the record says so
        f["completed"][chunk] = 1
        f.flush()


def write_ragged(
    out: str | os.PathLike[str],
    sample_fn: Callable[[int], Mapping[str, Any]],
    *,
    generator: str,
    parameters: dict[str, Any],
    seed: int,
    n_samples: int,
    chunk_size: int = 50,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    desc: str | None = None,
    executor: Executor | None = None,
    libraries: Sequence[str] = (),
) -> Path:
    """Write ``sample_fn(0), ..., sample_fn(n_samples - 1)`` to the ragged file ``out``.

    ``sample_fn(index)`` returns one sample of the per-sample interface (module doc) and must
    depend on ``index`` (and fixed settings such as ``seed``) only: then chunking and
    interruptions do not change the data.  The layout is taken from sample 0 when a new file
    is started (computed before the partial file exists, so a failing first sample leaves
    nothing behind).  ``generator``, ``parameters`` and ``seed`` are recorded (and checked on
    ``resume``).  Shows a progress bar unless ``progress`` is false.  With ``executor`` (e.g. a
    process pool; ``sample_fn`` must then pickle, e.g. a ``functools.partial`` of a module-level
    function) the samples of each chunk are computed in parallel; the file is the same.
    ``libraries``: as :meth:`~.storage.ChunkedWriter.open`'s. Returns the path of the finished
    file.
    """
    check_output(out, resume=resume, overwrite=overwrite, progress=progress)
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor: expected a concurrent.futures.Executor, got "
                        f"{type(executor).__name__}")
    if not callable(sample_fn):
        raise TypeError(f"sample_fn: expected a function index -> sample dict, got "
                        f"{type(sample_fn).__name__}")
    cache: dict[int, Mapping[str, Any]] = {}

    def first_layout() -> RaggedLayout:
        cache[0] = sample_fn(0)
        return RaggedLayout.from_sample(cache[0], where="sample_fn(0)")

    writer = RaggedWriter.open(out, generator=generator, parameters=parameters, seed=seed,
                               n_samples=n_samples, chunk_size=chunk_size, layout=first_layout,
                               libraries=libraries, resume=resume, overwrite=overwrite)

    def compute(start: int, stop: int) -> list[Mapping[str, Any]]:
        todo = [i for i in range(start, stop) if i not in cache]
        if executor is None:
            done = dict(zip(todo, map(sample_fn, todo), strict=True))
        else:
            futures = _submit_ignoring_sigint(executor, sample_fn, todo)
            done = {i: fut.result() for i, fut in zip(todo, futures, strict=True)}
        return [cache.pop(i) if i in cache else done[i] for i in range(start, stop)]

    return run_chunks(writer, compute, progress=progress, desc=desc or generator)


def _submit_ignoring_sigint(executor: Executor, fn: Callable[[int], Any],
                            items: list[int]) -> list[Future]:
    """Submit ``fn(i)`` for each item with SIGINT ignored meanwhile.

    A process pool starts its workers on submission, and a child keeps an ignored SIGINT (also
    across ``exec``, and Python leaves it ignored): so a Ctrl-C, which a terminal sends to the
    whole process group, interrupts only this process -- which cancels the pool and keeps the
    completed chunks -- instead of also printing a traceback from every worker.
    """
    if threading.current_thread() is not threading.main_thread():
        return [executor.submit(fn, i) for i in items]  # signal handlers are main-thread only
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return [executor.submit(fn, i) for i in items]
    finally:
        signal.signal(signal.SIGINT, previous)


# -- reading ------------------------------------------------------------------------------------


@dataclass
class RaggedInput:
    """One input function of the read samples: concatenated ``points`` ``(ΣM, d)``,
    ``values`` ``(ΣM, c)`` or ``None``, ``weights`` ``(ΣM,)`` or ``None``, and ``offsets``
    ``(n + 1,)`` from 0."""

    points: np.ndarray
    values: np.ndarray | None
    weights: np.ndarray | None
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class RaggedArrays:
    """Samples read by :func:`read_ragged`, concatenated like the file (offsets from 0).

    ``indices`` are the samples' indices in the file; fields not read are ``None`` (or, for
    ``inputs``, an empty dict).
    """

    indices: np.ndarray
    layout: RaggedLayout
    offsets: np.ndarray
    query_points: np.ndarray | None
    query_weights: np.ndarray | None
    query_label: np.ndarray | None
    target: np.ndarray | None
    inputs: dict[str, RaggedInput]
    theta: np.ndarray | None
    triangles: np.ndarray | None
    triangle_offsets: np.ndarray | None

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        """``N`` of each sample, ``(n,)`` int64."""
        return np.diff(self.offsets)

    def sample(self, j: int) -> dict[str, Any]:
        """Sample ``j`` (of the read ones) in the per-sample interface (module doc)."""
        j = check_int(j, "j", 0)
        if j >= len(self):
            raise IndexError(f"j: {j} is out of range for {len(self)} samples")

        def rows(a: np.ndarray | None, off: np.ndarray) -> np.ndarray | None:
            return None if a is None else a[off[j] : off[j + 1]]

        tri = None
        if self.triangles is not None and self.triangle_offsets is not None:
            tri = rows(self.triangles, self.triangle_offsets)
        return {
            "query": {"points": rows(self.query_points, self.offsets),
                      "weights": rows(self.query_weights, self.offsets),
                      "label": rows(self.query_label, self.offsets)},
            "target": rows(self.target, self.offsets),
            "target_names": list(self.layout.target_names),
            "inputs": {name: {"points": rows(fn.points, fn.offsets),
                              "values": rows(fn.values, fn.offsets),
                              "weights": rows(fn.weights, fn.offsets)}
                       for name, fn in self.inputs.items()},
            "theta": None if self.theta is None else self.theta[j],
            "triangles": tri,
        }


def is_ragged_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an HDF5 file of the ragged schema (:class:`DataFileError` if it is
    missing or not readable HDF5)."""
    p = Path(path)
    if not p.is_file():
        raise DataFileError(f"{str(p)!r} does not exist or is not a file")
    with _open(p, "r") as f:
        return f.attrs.get("schema") in (RAGGED_SCHEMA, RAGGED_SCHEMA.encode())


def _header(f: h5py.File, p: Path) -> dict[str, Any]:
    """Metadata and completeness of an open ragged file."""
    schema = f.attrs.get("schema")
    if schema not in (RAGGED_SCHEMA, RAGGED_SCHEMA.encode()):
        found = schema.decode() if isinstance(schema, bytes) else schema
        hint = f" (it holds {found} data)" if found else ""
        raise DataFileError(f"{str(p)!r} is not a galerkin_ext ragged data file (no schema "
                            f"{RAGGED_SCHEMA}){hint}")
    try:
        layout = RaggedLayout.from_file(f, repr(str(p)))
        done = f["completed"][...]
        chunk = int(_attr(f, "chunk_size"))
        n = int(_attr(f, "n_samples"))
        _check_shapes(f, layout, n, repr(str(p)))
        return {
            "schema": RAGGED_SCHEMA,
            "generator": _attr(f, "generator"),
            "parameters": json.loads(_attr(f, "parameters")),
            "seed": int(_attr(f, "seed")),
            "n_samples": n,
            "chunk_size": chunk,
            "package_version": _attr(f, "package_version"),
            "library_versions": _json_object(f.attrs.get("library_versions")),
            "complete": bool(_attr(f, "complete")) and bool(done.all()),
            "n_done": min(n, _completed_prefix(done, repr(str(p))) * chunk),
            "space_dim": layout.space_dim,
            "input_names": list(layout.input_names),
            "target_names": list(layout.target_names),
            "layout": layout,
        }
    except (KeyError, OSError, ValueError, TypeError) as err:
        raise DataFileError(f"{str(p)!r} is damaged or lacks schema fields: {err}") from err


def _offsets(f: h5py.File, name: str, n: int, p: Path, members: list[str]) -> np.ndarray:
    """The first ``n + 1`` entries of an offsets dataset, checked against its datasets."""
    off = f[name][: n + 1]
    counts = np.diff(off)
    if off[0] != 0 or (counts < 1 if name != "mesh/offsets" else counts < 0).any():
        raise DataFileError(f"{str(p)!r}: {name} is not increasing from 0 (an empty sample?); "
                            "the file is damaged")
    for member in members:
        if f[member].shape[0] < off[-1]:
            raise DataFileError(f"{str(p)!r}: {member} has {f[member].shape[0]} rows, fewer "
                                f"than its offsets need ({off[-1]}); the file is damaged")
    return off


def _gather(ds: h5py.Dataset, off: np.ndarray, idx: np.ndarray, p: Path) -> np.ndarray:
    """The rows of samples ``idx`` (in that order), read as few runs of consecutive samples."""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    try:
        parts = [ds[int(off[run[0]]) : int(off[run[-1] + 1])]
                 for run in np.split(idx, breaks) if run.size]
    except OSError as err:  # a chunk failing its checksum, or unreadable
        raise DataFileError(f"{str(p)!r}: dataset {ds.name!r} is corrupt (a stored chunk fails "
                            f"its checksum or cannot be read): {err}") from err
    if not parts:
        return np.empty((0, *ds.shape[1:]), dtype=ds.dtype)
    return np.concatenate(parts)


def _selected_offsets(off: np.ndarray, idx: np.ndarray) -> np.ndarray:
    counts = off[idx + 1] - off[idx]
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def read_ragged(
    path: str | os.PathLike[str],
    indices: Sequence[int] | np.ndarray | slice | None = None,
    *,
    fields: Sequence[str] | None = None,
) -> RaggedArrays:
    """Read samples of a complete ragged file.

    Args:
        path: a finished file (a ``.partial`` or incomplete file raises
            :class:`DataFileError`, as do damaged ones and files of another schema).
        indices: which samples (default all), in the order given, without repeats; a slice or
            integer indices.
        fields: groups to read among ``"query"`` (points, weights, label), ``"target"``,
            ``"inputs"``, ``"theta"``, ``"mesh"`` (default all).

    Returns:
        :class:`RaggedArrays` with offsets from 0 over the selected samples.
    """
    p = check_path(path)
    if not p.is_file():
        raise DataFileError(f"{str(p)!r} does not exist or is not a file")
    if isinstance(fields, str):  # (a string is a sequence of letters)
        raise TypeError(f"fields: expected a sequence of names among {FIELDS}, got {fields!r}")
    fields = FIELDS if fields is None else tuple(fields)
    for name in fields:
        if name not in FIELDS:
            raise ValueError(f"fields: expected names among {FIELDS}, got {name!r}")
    with _open(p, "r") as f:
        info = _header(f, p)
        if not info["complete"]:
            raise DataFileError(f"{str(p)!r} is incomplete ({info['n_done']} of "
                                f"{info['n_samples']} samples written); finish it with resume")
        n = info["n_samples"]
        idx = _check_indices(indices, n)
        layout: RaggedLayout = info["layout"]
        groups = _ragged_groups(layout)
        try:
            q_off = _offsets(f, "query/offsets", n, p, groups["query/offsets"])
            offsets = _selected_offsets(q_off, idx)

            def read(name: str, off: np.ndarray) -> np.ndarray:
                return _gather(f[name], off, idx, p)

            q = "query" in fields
            inputs = {}
            if "inputs" in fields:
                for spec in layout.inputs:
                    g = f"inputs/{spec.name}"
                    off = _offsets(f, f"{g}/offsets", n, p, groups[f"{g}/offsets"])
                    inputs[spec.name] = RaggedInput(
                        points=read(f"{g}/points", off),
                        values=read(f"{g}/values", off) if spec.channels else None,
                        weights=read(f"{g}/weights", off) if spec.weights else None,
                        offsets=_selected_offsets(off, idx),
                    )
            theta = None
            if "theta" in fields and layout.theta_dim:
                theta = _gather(f["theta"], np.arange(n + 1), idx, p)
            triangles = tri_off = None
            if "mesh" in fields and layout.mesh:
                m_off = _offsets(f, "mesh/offsets", n, p, groups["mesh/offsets"])
                triangles = read("mesh/triangles", m_off)
                tri_off = _selected_offsets(m_off, idx)
                local_n = np.repeat(np.diff(offsets), np.diff(tri_off))
                if triangles.size and ((triangles.min() < 0)
                                       or (triangles.max(axis=1) >= local_n).any()):
                    raise DataFileError(f"{str(p)!r}: mesh/triangles has vertex indices "
                                        "outside their samples; the file is damaged")
            return RaggedArrays(
                indices=idx,
                layout=layout,
                offsets=offsets,
                query_points=read("query/points", q_off) if q else None,
                query_weights=read("query/weights", q_off) if q and layout.query_weights
                else None,
                query_label=read("query/label", q_off) if q and layout.query_label else None,
                target=read("target/values", q_off) if "target" in fields else None,
                inputs=inputs,
                theta=theta,
                triangles=triangles,
                triangle_offsets=tri_off,
            )
        except (KeyError, OSError) as err:
            raise DataFileError(f"{str(p)!r} is damaged or lacks schema fields: {err}") from err


def _check_indices(indices: object, n: int) -> np.ndarray:
    if indices is None:
        return np.arange(n)
    if isinstance(indices, slice):
        return np.arange(n)[indices]
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and (idx.dtype == np.bool_ or idx.dtype.kind not in "iu")):
        raise ValueError("indices: expected a 1-D sequence of integers or a slice")
    idx = idx.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"indices: expected values in [0, {n}), got min {idx.min()} and max "
                         f"{idx.max()}")
    if np.unique(idx).size != idx.size:
        raise ValueError("indices: expected no repeated sample")
    return idx


# -- inspection ---------------------------------------------------------------------------------


def _column_statistics(ds: h5py.Dataset, rows: int) -> dict[str, Any]:
    """Count, and per column mean, population std, min and max of the first ``rows`` rows of
    ``ds``, streamed in blocks (Chan et al.'s pairwise update)."""
    cols = 1 if ds.ndim == 1 else ds.shape[1]
    moments = [np.zeros((0, 3)) for _ in range(cols)]
    lo = np.full(cols, np.inf)
    hi = np.full(cols, -np.inf)
    for start in range(0, rows, _STAT_BLOCK):
        block = ds[start : min(rows, start + _STAT_BLOCK)].astype(np.float64).reshape(-1, cols)
        mean = block.mean(axis=0)
        m2 = ((block - mean) ** 2).sum(axis=0)
        for c in range(cols):
            moments[c] = np.vstack([moments[c], [block.shape[0], mean[c], m2[c]]])
        lo, hi = np.minimum(lo, block.min(axis=0)), np.maximum(hi, block.max(axis=0))
    combined = [_combine(m) for m in moments]
    if rows == 0:
        return {"count": 0}
    return {
        "count": int(rows),
        "mean": [float(m) for _, m, _ in combined],
        "std": [float(np.sqrt(m2 / k)) for k, _, m2 in combined],
        "min": lo.tolist(),
        "max": hi.tolist(),
    }


def _size_range(counts: np.ndarray) -> dict[str, Any]:
    if counts.size == 0:
        return {"min": None, "max": None, "mean": None, "total": 0}
    return {"min": int(counts.min()), "max": int(counts.max()),
            "mean": float(counts.mean()), "total": int(counts.sum())}


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Metadata of a ragged file without reading its data: the keys of
    :func:`inspect_ragged` but ``theta_dim``, ``sizes`` and ``statistics``, plus ``layout``
    (:class:`RaggedLayout`).  Raises :class:`DataFileError` for a missing, unreadable or
    foreign file (incomplete ones are reported by ``complete``, not refused)."""
    p = Path(path)
    if not p.is_file():
        raise DataFileError(f"{str(p)!r} does not exist or is not a file")
    with _open(p, "r") as f:
        return _header(f, p)


def inspect_ragged(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Metadata, completeness, sizes and statistics of a ragged file (or its partial file).

    Returns a JSON-serialisable dict with ``schema``, ``generator``, ``parameters``, ``seed``,
    ``n_samples``, ``chunk_size``, ``package_version``, ``library_versions`` (``None`` where
    the file records none), ``complete``, ``n_done``, ``space_dim``, ``input_names``,
    ``target_names``, ``theta_dim``; ``sizes``: the range
    (min, max, mean, total) of ``N`` (query points), of ``M`` per input function and of ``T``
    (triangles) over the written samples; ``statistics``: per field (``"query/points"``,
    ``"target/values"`` with ``names``, ``"inputs/<name>/values"``, weights, ``"theta"``) the
    count and per column mean, population std, min and max over the written samples.
    """
    p = Path(path)
    if not p.is_file():
        raise DataFileError(f"{str(p)!r} does not exist or is not a file")
    with _open(p, "r") as f:
        info = _header(f, p)
        layout: RaggedLayout = info.pop("layout")
        k = info["n_done"]
        try:
            sizes: dict[str, Any] = {}
            stats: dict[str, Any] = {}
            for offsets, members in _ragged_groups(layout).items():
                off = f[offsets][: k + 1]
                counts = np.diff(off)
                if offsets == "query/offsets":
                    sizes["N"] = _size_range(counts)
                elif offsets == "mesh/offsets":
                    sizes["T"] = _size_range(counts)
                else:
                    sizes.setdefault("M", {})[offsets.split("/")[1]] = _size_range(counts)
                for name in members:
                    if name in ("query/label", "mesh/triangles"):
                        continue
                    stats[name] = _column_statistics(f[name], int(off[-1]))
            stats["target/values"]["names"] = list(layout.target_names)
            if "query/label" in f and k:
                labels = f["query/label"][: int(f["query/offsets"][k])]
                values, counts = np.unique(labels, return_counts=True)
                stats["query/label"] = {"count": int(labels.size), "values": {
                    str(v): int(c) for v, c in zip(values, counts, strict=True)}}
            if layout.theta_dim:
                stats["theta"] = _column_statistics(f["theta"], k)
        except (KeyError, OSError, ValueError) as err:
            raise DataFileError(f"{str(p)!r} is damaged or cannot be read: {err}") from err
    info["theta_dim"] = layout.theta_dim
    info["sizes"] = sizes
    info["statistics"] = stats
    return info
