"""Atomic files and checked checkpoints.

Checkpoints are plain dicts of tensors, numbers, strings, lists and dicts, so they load with
``torch.load(path, weights_only=True)`` (no pickled code runs).  Every file here is written to a
temporary file in the same folder and renamed over the target with :func:`os.replace`, which is
atomic on POSIX file systems (the platforms the package builds on): a reader (or a run killed
mid-write) never sees a half-written file.

Checkpoint schema (``format`` = :data:`CHECKPOINT_FORMAT`):

* ``kind``: ``'last'`` (everything needed to resume) or ``'best'`` (the best model);
* ``epoch``: completed epochs; ``model``: the model's ``state_dict``; ``config``: JSON-like dict;
* ``'best'`` also: ``metric`` (evaluation relative L2 at that epoch);
* ``'last'`` also: ``optimizer``, ``scheduler``, ``rng`` (one dict of generator states per
  process: torch's, NumPy's and Python's, as tensors), ``best_metric``, ``best_epoch``,
  ``history`` (list of per-epoch dicts), ``train_seconds``, ``world_size`` and, from
  2026-11-30, ``seeding`` (2: the Trainer's seeds spread over the streams; absent: added),
  from 2026-12-01 ``torch_version`` (the torch that wrote it);
* ``sha256``: :func:`content_digest` of everything else, verified by :func:`load_checkpoint`
  (a flipped bit in a tensor is found, not loaded).
"""

from __future__ import annotations

import csv
import errno
import hashlib
import io
import json
import math
import os
import stat
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch

from .._checks import check_choice, check_path, refused_by_safe_load

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "atomic_write",
    "load_checkpoint",
    "save_checkpoint",
    "stray_temporary_files",
    "write_csv",
    "write_json",
]

CHECKPOINT_FORMAT = "galerkin_ext.training/1"
_REQUIRED = {
    "best": ("epoch", "model", "config", "metric"),
    "last": ("epoch", "model", "config", "optimizer", "scheduler", "rng", "best_metric",
             "best_epoch", "history", "train_seconds", "world_size"),
}


# a full disk, a quota, a file-size limit (ulimit -f)
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, not a galerkin_ext training checkpoint, or not
    resumable with the run's settings."""


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it to ``path``.

    The data are flushed and fsync-ed before the rename, so after a crash ``path`` holds either
    its old content or the complete new one. An ``OSError`` of its own steps (a folder not
    writable, say) or of a full disk, quota or file-size limit keeps its errno and names
    ``path``, not the temporary file; ``write``'s other errors pass as they are.  Returns
    ``path`` as a :class:`~pathlib.Path`.
    """
    p = check_path(path)
    if not p.name or p.is_dir():  # (the rename's own error names the temporary file)
        raise IsADirectoryError(f"path: expected a file name, got the folder {str(p)!r}")
    if not callable(write):
        raise TypeError(f"write: expected a callable taking a binary file, got {write!r}")
    p.parent.mkdir(parents=True, exist_ok=True)
    try:  # a file rewritten keeps its mode (e.g. 0600 its owner chose), as open() keeps it
        mode = stat.S_IMODE(os.stat(p).st_mode)
    except FileNotFoundError:  # a new one gets what open() would give it (umask)
        mode = 0o666 & ~_umask()
    tmp, writing = None, False
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        os.fchmod(fd, mode)  # mkstemp creates mode 0600
        with os.fdopen(fd, "wb") as f:
            writing = True
            write(f)
            writing = False
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as error:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno is not None and (
                not writing or error.errno in _NO_ROOM):
            why = error.strerror or os.strerror(error.errno)
            raise OSError(error.errno, f"{why} while writing {str(p)!r}, which is left as it "
                                       "was") from error
        raise
    return p


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; set it straight back
    os.umask(mask)
    return mask


def stray_temporary_files(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary files :func:`atomic_write` left beside ``path`` when its process was killed
    between creating and renaming them."""
    p = Path(path)
    return sorted(p.parent.glob(f".{p.name}.*.tmp"))


def _json_text(value: Any, name: str = "data", depth: int = 0) -> str:
    """Indented JSON in which arrays of numbers and strings stay on one line: a normaliser's
    thousands of statistics are one line of ``metrics.json``, not thousands. ``name`` says
    where ``value`` is, for the message about a value JSON cannot hold."""
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, Mapping) and value:
        items = [f"{inner}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: "
                 f"{_json_text(v, f'{name}[{k!r}]', depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple)
                                               for v in value):
        items = [f"{inner}{_json_text(v, f'{name}[{i}]', depth + 1)}"
                 for i, v in enumerate(value)]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    try:
        return json.dumps(value, allow_nan=True)
    except TypeError as err:  # e.g. a numpy integer: json names the type, not where it is
        raise TypeError(f"{name}: {err} (convert it, e.g. with int(), float() or "
                        ".tolist())") from None


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any] | list[Any]) -> Path:
    """Write ``data`` (a JSON object or array) as indented JSON, atomically."""
    if not isinstance(data, (Mapping, list)):
        raise TypeError(f"data: expected a mapping or a list, got {type(data).__name__}")
    text = _json_text(data) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_csv(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (dicts; the header is the union of their keys in order) as CSV, atomically."""
    expected = "rows: expected a sequence of mappings"
    if isinstance(rows, str | bytes) or not isinstance(rows, Iterable):
        raise TypeError(f"{expected}, got {type(rows).__name__}")
    rows = list(rows)  # read once: a generator checked here would be empty when written
    if not all(isinstance(r, Mapping) for r in rows):
        raise TypeError(expected)
    fields: dict[str, None] = {}
    for row in rows:
        fields.update(dict.fromkeys(row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return atomic_write(path, lambda f: f.write(buf.getvalue().encode()))


# What torch.load(weights_only=True) reads back besides tensors and containers, by exact type:
# numpy's float64 is a float, but is pickled as a numpy scalar, which it refuses.
_LOADABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
             torch.Size)
_JSON_LIKE = (type(None), bool, int, float, str)


def _check_loadable(value: Any, name: str, *, json_like: bool = False) -> None:
    """``value`` made of what ``torch.load(weights_only=True)`` reads back: tensors, numbers,
    strings, None, torch dtypes, devices and sizes, in dicts, lists, tuples and sets.

    ``json_like``: only None, bools, ints, finite floats and strings, in lists, tuples and
    dicts: a run's configuration, which a resumption compares setting by
    setting (a tensor has no single answer to ``==``, NaN never equals itself).
    Raises naming the offending entry, e.g. ``config['data']['path']``.
    """
    kind = type(value)
    if kind in (_JSON_LIKE if json_like else _LOADABLE):
        if json_like and kind is float and not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite float, got {value!r} (a resumption "
                             "compares the settings, and NaN never equals itself)")
        return
    if not json_like and kind in (torch.Tensor, torch.nn.Parameter):
        return
    if kind in (dict, OrderedDict):
        for key, item in value.items():
            _check_loadable(key, f"{name} key {key!r}", json_like=json_like)
            _check_loadable(item, f"{name}[{key!r}]", json_like=json_like)
        return
    if kind in ((list, tuple) if json_like else (list, tuple, set)):
        for i, item in enumerate(value):
            _check_loadable(item, f"{name}[{i}]", json_like=json_like)
        return
    what = ("None, a bool, int, finite float or str, or a list or dict of them (JSON-like)"
            if json_like else "a tensor, number, str, None, or a dict, list, tuple of them "
            "(what torch.load(weights_only=True) reads back)")
    raise TypeError(f"{name}: expected {what}, got {kind.__module__}.{kind.__qualname__} "
                    f"{value!r} (convert it, e.g. with float(), int() or str())")


def save_checkpoint(path: str | os.PathLike[str], kind: str, **content: Any) -> Path:
    """Save a checkpoint of ``kind`` ``'last'`` or ``'best'`` atomically (schema: module doc):
    ``content`` holds at least ``epoch``, ``model`` (a ``state_dict``), ``config`` and, for
    ``'best'``, ``metric``; for ``'last'``, ``optimizer``, ``scheduler``, ``rng``,
    ``best_metric``, ``best_epoch``, ``history``, ``train_seconds`` and ``world_size``.

    Content that ``torch.load(weights_only=True)`` would not read back (e.g. a numpy scalar or
    a ``Path``) is refused, naming it, before anything is written."""
    check_choice(kind, "kind", sorted(_REQUIRED))
    missing = [k for k in _REQUIRED[kind] if k not in content]
    if missing:
        raise ValueError(f"content: a {kind!r} checkpoint needs {missing}")
    state = {"format": CHECKPOINT_FORMAT, "kind": kind, **content}
    for key, value in state.items():
        _check_loadable(value, key)
    state["sha256"] = content_digest(state)
    # serialised in memory first: torch.save's own writer turns a full disk into "unexpected
    # pos" instead of the OSError atomic_write names the file with
    serialised = io.BytesIO()
    torch.save(state, serialised)
    return atomic_write(path, lambda f: f.write(serialised.getbuffer()))


def _load_weights(model: torch.nn.Module, weights: Mapping[str, Any], path: str | os.PathLike[str],
                  what: str) -> None:
    """``model.load_state_dict(weights)``, the weights of the checkpoint ``path``, or a
    ``CheckpointError`` naming ``path``, ``what`` the model is, and torch's first mismatch."""
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # torch's header, then one line per kind of mismatch
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise CheckpointError(f"{str(path)!r}: its weights do not fit {what}: "
                              f"{lines[min(1, len(lines) - 1)]}") from None


def content_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 of a checkpoint's content: every key, every tensor's dtype, shape and bytes,
    every other value's ``repr``, in a fixed order (independent of the device it is on)."""
    return _digest(state, skip_sha256_keys=False)


def _digest(state: Mapping[str, Any], skip_sha256_keys: bool) -> str:
    """:func:`content_digest`; ``skip_sha256_keys`` leaves out every key named ``sha256`` at
    any depth, as the digests of checkpoints written before 2026-11-25 did (they still load)."""
    h = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, Mapping):
            h.update(b"{")
            for key in sorted(value, key=repr):
                if not (skip_sha256_keys and key == "sha256"):
                    h.update(repr(key).encode())
                    visit(value[key])
            h.update(b"}")
        elif isinstance(value, (list, tuple)):
            h.update(b"[")
            for item in value:
                visit(item)
            h.update(b"]")
        elif isinstance(value, set):  # in an order of its own (pickling may change a set's)
            h.update(b"<")
            for item in sorted(value, key=repr):
                visit(item)
            h.update(b">")
        else:
            h.update(repr(value).encode())

    visit(state)
    return h.hexdigest()


def load_checkpoint(
    path: str | os.PathLike[str], kind: str | None = None, map_location: Any = "cpu"
) -> dict[str, Any]:
    """Load and check a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    Args:
        path: the ``.pt`` file.
        kind: ``'last'``, ``'best'`` or ``None`` (either).
        map_location: as for :func:`torch.load` (default: CPU).

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``map_location`` is a CUDA device on a machine without one.
        CheckpointError: the file is truncated/corrupt, not a galerkin_ext checkpoint, of another
            kind, or lacks a field of its kind.
    """
    p = check_path(path)
    check_choice(kind, "kind", [*sorted(_REQUIRED), None])
    if not p.is_file():
        raise FileNotFoundError(f"path: no checkpoint file {str(p)!r}")
    # a device this machine lacks, not a damaged file (torch.load's error reads alike)
    if (isinstance(map_location, str | torch.device) and str(map_location).startswith("cuda")
            and not torch.cuda.is_available()):
        raise ValueError(f"map_location: {str(map_location)!r}, but CUDA is not available here; "
                         "load with map_location='cpu'")
    try:
        # sets and complex numbers are loadable content (_check_loadable); torch 2.5 reads
        # them under weights_only only when allowed by name
        with torch.serialization.safe_globals([set, complex]):
            state = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for damaged files (zip, pickle, EOF)
        if map_location is None and "on a CUDA device" in str(err):  # (saved on a GPU)
            raise ValueError("map_location: None keeps the checkpoint's CUDA devices, but CUDA "
                             "is not available here; load with map_location='cpu'") from err
        if refused_by_safe_load(err):
            raise CheckpointError(f"{str(p)!r} is not a galerkin_ext training checkpoint: a "
                                  "safe load (torch.load(weights_only=True)) refuses its "
                                  "content") from None
        raise CheckpointError(
            f"{str(p)!r} is not a readable checkpoint (corrupt or truncated?): "
            f"{str(err) or type(err).__name__}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{str(p)!r} is not a galerkin_ext training checkpoint "
                              f"(expected format {CHECKPOINT_FORMAT!r})")
    found = state.get("kind")
    if found not in _REQUIRED or (kind is not None and found != kind):
        raise CheckpointError(f"{str(p)!r} is a {found!r} checkpoint, expected {kind!r}")
    missing = [k for k in _REQUIRED[found] if k not in state]
    if missing:
        raise CheckpointError(f"{str(p)!r} lacks the fields {missing} of a {found!r} checkpoint")
    stored = state.pop("sha256", None)
    if stored is None:
        warnings.warn(f"{str(p)!r} has no checksum (written by an older galerkin_ext): its "
                      "content cannot be verified", stacklevel=2)
    elif stored not in (content_digest(state), _digest(state, skip_sha256_keys=True)):
        raise CheckpointError(f"{str(p)!r} is corrupt: its content does not match the "
                              "checksum stored with it")
    return state
