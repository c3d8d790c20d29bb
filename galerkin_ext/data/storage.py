"""HDF5 storage of generated data sets: schema, resumable chunked writing, checked reading.

Schema (version 1) of a file written by :mod:`galerkin_ext.data.generate`:

* per-sample datasets, shape ``(n_samples, *grid, *components)``:

  - Burgers and Darcy: ``a``, the inputs -- Burgers ``u0`` ``(n, N)`` float64; Darcy coefficient
    ``(n, K, K)``, float32 when piecewise constant (3 and 12 are exact in float32), float64 when
    lognormal -- and ``u``, the solutions, ``(n_samples, *grid)`` float64;
  - Lorenz-63 and the controlled ODE (:mod:`.ode`): ``input`` ``(n, T, 1)`` and ``output``
    ``(n, T, d)``, float64.

  A dataset attribute ``grid_ndim`` says how many axes after the sample axis are grid axes
  (absent: all of them); the others hold components.
* static datasets (attribute ``static`` true), shared by all samples: ``coords`` ``(T, 1)``,
  the sample times of the ODE sets; ``grid_ndim`` = all axes but the last.
* dataset ``completed``: ``(n_chunks,)`` uint8, 1 once chunk ``i`` (samples
  ``[i * chunk_size, (i + 1) * chunk_size)``) has been written and flushed.
* optional dataset ``statistics``: ``(n_chunks, n_fields, 3)`` float64, the count, mean and sum
  of squared deviations of each summary field (attribute ``names``, a JSON list) over chunk
  ``i``, written with the chunk; :func:`inspect_h5` combines the completed chunks.
* attributes: ``schema`` (``"galerkin_ext.data/1"``), ``generator`` (``"burgers"``,
  ``"darcy"``, ``"lorenz63"``, ``"cde"``), ``parameters`` (JSON object of the generator's
  parameters), ``seed``, ``n_samples``, ``chunk_size``, ``package_version``,
  ``library_versions`` (JSON object: the versions of the libraries that computed the samples,
  each ``"old then new"`` where a resumption changed it; empty for a conversion, which copies)
  and ``complete`` (true only after every chunk is done).

A generation writes to ``FILE.partial`` and renames it to ``FILE`` only once it is complete, so
``FILE`` never exists half-written; an interrupted run leaves ``FILE.partial`` with its
``completed`` record, from which ``resume=True`` carries on.  Readers refuse files whose
``complete`` flag or ``completed`` record says otherwise, and report unreadable (e.g. truncated)
files as :class:`DataFileError`.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import json
import math
import numbers
import os
import shutil
import signal
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import h5py
import numpy as np
from tqdm.auto import tqdm

from .._checks import cannot_write_in, check_bool, check_int, check_path, check_seed
from .._locks import file_lock

if TYPE_CHECKING:
    from .ragged import RaggedWriter

__all__ = [
    "SCHEMA",
    "DataFileError",
    "DamagedPartialFileError",
    "InterruptedWhenFinished",
    "PartialFileWriter",
    "ChunkedWriter",
    "partial_path",
    "check_output_path",
    "check_output",
    "parameters_json",
    "prepare_output",
    "writer_lock_path",
    "check_resumable_attributes",
    "library_versions",
    "record_resumption",
    "pending_chunks",
    "publish",
    "run_chunks",
    "read_h5",
    "inspect_h5",
]

SCHEMA = "galerkin_ext.data/1"
#: The schema of the ragged files (:mod:`.ragged`), named here so each reader can refuse the other.
RAGGED_SCHEMA = "galerkin_ext.ragged/1"
_SUFFIXES = (".h5", ".hdf5")
# The generators' arguments as messages name them, for Python callers and the command line.
_OVERWRITE = "overwrite=True (--overwrite)"
_RESUME = "resume=True (--resume)"


class DataFileError(RuntimeError):
    """A data file is missing, unreadable, incomplete or not of the expected kind."""


class DamagedPartialFileError(DataFileError):
    """The partial file of an interrupted generation cannot be opened to resume it: only
    starting again (``overwrite``) makes the data."""


class SolverError(RuntimeError):
    """A solver's solution (or a sampled coefficient) became non-finite: its step (or the
    field's amplitude) is too large for the equation and its settings.  The generation stops and
    removes its partial file, which the same settings would only fail on again."""


class InterruptedWhenFinished(KeyboardInterrupt):
    """Ctrl-C came while a generation published its file: the file is complete."""


class DataMismatchError(DataFileError, ValueError):
    """A data source does not hold what the settings ask of it: fewer samples than the splits,
    a stored grid that the resolution does not divide, no stored quadrature weights.  Also a
    ``ValueError``, as the argument checks that raised it before."""


def partial_path(path: str | os.PathLike[str]) -> Path:
    """Where an unfinished generation of ``path`` lives: ``path`` + ``.partial``."""
    p = Path(path)
    return p.with_name(p.name + ".partial")


def check_output_path(path: object) -> Path:
    """Validate an output path: ``str``/``PathLike`` ending in .h5/.hdf5, in an existing folder."""
    p = check_path(path, "out")
    if p.suffix.lower() not in _SUFFIXES:
        raise ValueError(f"out must name an HDF5 file ending in .h5 or .hdf5, got {str(p)!r}")
    if p.is_dir():
        raise ValueError(f"out must be a file path, but {str(p)!r} is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"out: the folder {str(parent)!r} does not exist")
    why = cannot_write_in(parent)
    if why is not None:
        raise PermissionError(f"out: the folder {str(parent)!r} is not writable ({why})")
    return p


def _locked(err: OSError) -> bool:
    """Whether h5py could not open a file because another process holds HDF5's lock on it
    (EAGAIN; a file system without locks gives another errno)."""
    return "unable to lock file, errno = 11" in str(err)


def _open(path: Path, mode: str, advice: str = "",
          unreadable: type[DataFileError] = DataFileError) -> h5py.File:
    """``h5py.File(path, mode)``, its errors as :class:`DataFileError` (an unreadable file's
    as ``unreadable``); ``advice`` ends the message about an unreadable file."""
    try:
        return h5py.File(path, mode)
    except OSError as err:
        if _locked(err):
            raise DataFileError(f"{str(path)!r} is in use by another process (it holds the "
                                "file's lock): wait for it to end") from err
        raise unreadable(
            f"{str(path)!r} is not a readable HDF5 file (corrupt or truncated?): {err}{advice}"
        ) from err


def _open_to_resume(part: Path, mode: str = "r+") -> h5py.File:
    """The partial file ``part`` of an interrupted generation, opened for writing (``mode``
    ``"r"``: to copy from it)."""
    return _open(part, mode, f"; {_OVERWRITE} starts again", DamagedPartialFileError)


def _room_to_copy(part: Path) -> bool:
    """Whether the disk holds a second copy of the partial file ``part`` (and a margin), which
    a resume builds before it replaces ``part``."""
    return shutil.disk_usage(part.parent).free >= 2 * part.stat().st_size + (1 << 20)


def _in_use(path: Path) -> bool:
    """Whether another process holds ``path`` open for writing (HDF5's lock)."""
    try:
        h5py.File(path, "r").close()
    except OSError as err:
        return _locked(err)
    return False


def writer_lock_path(path: str | os.PathLike[str]) -> Path:
    """The sidecar file whose lock the one process writing ``path`` (through ``path.partial``)
    holds: ``.NAME.writer.lock`` beside it. It stays after the writer ends (removing it would
    let two processes hold locks on two files of one name)."""
    p = Path(path)
    return p.with_name(f".{p.name}.writer.lock")


def _being_written(final: Path) -> FileExistsError:
    return FileExistsError(f"{str(partial_path(final))!r} is being written by another "
                           "process: wait for it to end")


def _writer_running(final: Path) -> bool:
    """Whether another process writes ``final`` (it holds the lock of
    :func:`writer_lock_path`); creates no file."""
    lock = writer_lock_path(final)
    if not lock.exists():
        return False
    with file_lock(lock, wait=False) as held:
        return not held


def check_output(out: object, *, resume: bool, overwrite: bool,
                 progress: bool = True) -> tuple[Path, Path]:
    """The rules every generation and conversion follows before it writes, checked without
    touching any file (so before any work starts): ``(FILE, FILE.partial)``.

    Raises ``FileExistsError`` if ``out`` or its partial file exists and neither ``resume``
    nor ``overwrite`` is set (or ``out`` is finished, without a partial file, and ``resume`` is
    set: an interrupted ``overwrite`` leaves both, and ``resume`` continues it), and whatever
    the flags if another process is writing the partial file (it holds the writer's lock of
    :func:`writer_lock_path` or HDF5's lock: both are probed, nothing is changed).
    """
    final, part = _output_paths(out, resume=resume, overwrite=overwrite, held=False)
    check_bool(progress, "progress")
    return final, part


def _output_paths(out: object, *, resume: bool, overwrite: bool,
                  held: bool) -> tuple[Path, Path]:
    """:func:`check_output`'s rules; ``held``: this process holds the writer's lock (so no
    other process of this package writes ``out``)."""
    for name, flag in (("resume", resume), ("overwrite", overwrite)):
        check_bool(flag, name)
    if resume and overwrite:
        raise ValueError("resume and overwrite are mutually exclusive")
    final = check_output_path(out)
    part = partial_path(final)
    for path, what in ((part, "partial file"), (writer_lock_path(final), "writer's lock")):
        if path.is_dir():  # (a raw IsADirectoryError later)
            raise FileExistsError(f"out: {str(path)!r} is a folder, where the {what} of "
                                  f"{str(final)!r} goes: remove or rename it")
    if final.exists() and not overwrite and not (resume and part.exists()):
        if resume:
            raise FileExistsError(
                f"{str(final)!r} already exists and is finished; nothing to resume "
                f"({_OVERWRITE} regenerates it)"
            )
        raise FileExistsError(f"{str(final)!r} already exists ({_OVERWRITE} replaces it)")
    # A live generation, not an interrupted one: the package's own lock (HDF5's may be off,
    # HDF5_USE_FILE_LOCKING=FALSE), and HDF5's (another program's writer).
    if (not held and _writer_running(final)) or (part.exists() and _in_use(part)):
        raise _being_written(final)
    if part.exists() and not (resume or overwrite):
        raise FileExistsError(
            f"an interrupted generation exists at {str(part)!r}; {_RESUME} continues it, "
            f"{_OVERWRITE} starts again"
        )
    return final, part


def prepare_output(out: object, *, resume: bool,
                   overwrite: bool) -> tuple[Path, Path, contextlib.ExitStack]:
    """What a writer does before it writes: take the writer's lock on ``out``
    (:func:`writer_lock_path`), check :func:`check_output`'s rules, and, with ``overwrite``,
    remove a stale partial file (``FILE`` itself is replaced on publishing). Returns
    ``(FILE, FILE.partial, lock)``; closing ``lock`` releases it.

    Raises ``FileExistsError`` where another process writes ``out`` (with HDF5's own locking
    off too), besides :func:`check_output`'s errors."""
    final, _ = check_output(out, resume=resume, overwrite=overwrite)
    with contextlib.ExitStack() as lock:  # released if anything below fails
        if not lock.enter_context(file_lock(writer_lock_path(final), wait=False)):
            raise _being_written(final)
        # again, held: another writer may have started since the check
        final, part = _output_paths(final, resume=resume, overwrite=overwrite, held=True)
        if overwrite:
            part.unlink(missing_ok=True)
            _rebuilding_path(part).unlink(missing_ok=True)  # (a resume killed while rebuilding)
        return final, part, lock.pop_all()


def parameters_json(parameters: object) -> str:
    """A generation's ``parameters`` (a dict of JSON values) as the JSON text its file records,
    keys sorted."""
    if not isinstance(parameters, dict):
        raise TypeError(f"parameters: expected a dict of JSON values, got "
                        f"{type(parameters).__name__}")
    try:
        return json.dumps(parameters, sort_keys=True)
    except (TypeError, ValueError) as err:  # e.g. a numpy scalar
        raise TypeError(f"parameters: expected JSON values (str, int, float, bool, None, lists "
                        f"and dicts of them): {err}") from err


def _json_object(text: object) -> dict[str, Any] | None:
    """``text`` read as a JSON object, or ``None`` where it is none."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def library_versions(names: Sequence[str]) -> str:
    """The installed versions of the libraries ``names`` (distribution names; ``None`` for one
    that is not installed), as the JSON text a file records (``library_versions``)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return json.dumps(versions, sort_keys=True)


# What a resumption under other versions may change: the last bits of the samples still to come
# (torch's FFTs and exponentials, LAPACK's solves), not what the file is.
_SOFTWARE = ("package_version", "library_versions")
_THEN = " then "  # a file resumed under other versions records each as "old then new"


def check_resumable_attributes(f: h5py.File, part: Path, attrs: dict[str, Any]) -> list[str]:
    """Refuse to resume ``part`` if a recorded attribute (schema, generator, parameters, seed,
    sample count) differs from this run's ``attrs``, or if it has no completed-chunk record.

    Returns the package and library versions that differ from the ones the file's samples
    were computed with (or that it does not record), in words, for :func:`record_resumption`; and
    sets those records in ``attrs`` to the file's history ("2.5.1 then 2.13.0"), for the
    resumed file to keep."""
    changed = []
    for key, value in attrs.items():
        stored = f.attrs.get(key)
        if isinstance(stored, bytes):
            stored = stored.decode()
        if isinstance(stored, np.generic):
            stored = stored.item()
        if key in _SOFTWARE:
            attrs[key], changes = _version_history(key, stored, value)
            changed += changes
            continue
        if stored == value:
            continue
        old, new = (_json_object(stored), _json_object(value)) if key == "parameters" else (
            None, None)
        if old is not None and new is not None:  # JSON objects: name what differs
            names = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            raise DataFileError(
                f"cannot resume {str(part)!r}: its parameters {names} are "
                f"{ {k: old.get(k) for k in names} }, but this run asks for "
                f"{ {k: new.get(k) for k in names} } ({_OVERWRITE} starts again)")
        raise DataFileError(
            f"cannot resume {str(part)!r}: its {key} is {stored!r}, but this run asks "
            f"for {value!r} ({_OVERWRITE} starts again)"
        )
    if "completed" not in f or "chunk_size" not in f.attrs:
        raise DataFileError(f"cannot resume {str(part)!r}: it has no completed-chunk record")
    return changed


def _version_history(key: str, stored: object, value: str) -> tuple[str, list[str]]:
    """The record of ``key`` (the package version, or the JSON object of the library
    versions) for a file that recorded ``stored`` and is resumed under ``value``, and what
    differs, in words."""
    def then(old: object, new: object) -> tuple[object, bool]:
        last = old.rsplit(_THEN, 1)[-1] if isinstance(old, str) else old
        return (old, False) if last == new else (f"{old}{_THEN}{new}", True)

    if key == "package_version":
        record, differs = then("unrecorded" if stored is None else stored, value)
        return str(record), [f"galerkin_ext {stored} (now {value})"] if differs else []
    old, new = _json_object(stored) or {}, _json_object(value) or {}  # ({}: not recorded)
    history, changed = {}, []
    for name in sorted(old.keys() | new.keys()):
        history[name], differs = then(old.get(name, "unrecorded"), new.get(name, "unrecorded"))
        if differs:
            changed.append(f"{name} {old.get(name, 'unrecorded')} (now {new.get(name)})")
    return json.dumps(history, sort_keys=True), changed


def record_resumption(f: h5py.File, part: Path, attrs: dict[str, Any],
                      changed: Sequence[str]) -> None:
    """Write the version records of ``attrs`` (as :func:`check_resumable_attributes` left
    them) into the resumed file ``f`` (also where it was resumed in place), and warn of the
    versions that ``changed``, at the first caller outside the package."""
    for key in _SOFTWARE:
        f.attrs[key] = attrs[key]
    if not changed:
        return
    frame: types.FrameType | None = sys._getframe()
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("galerkin_ext"):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"resuming {str(part)!r} under other versions than it was begun with: "
                  f"{', '.join(changed)}; the samples still to come may differ from an "
                  f"uninterrupted run's in their last bits ({_OVERWRITE} starts again)",
                  stacklevel=level)


def pending_chunks(completed: np.ndarray, chunk_size: int,
                   n_samples: int) -> list[tuple[int, int, int]]:
    """``(chunk, start, stop)`` of every chunk whose ``completed`` flag is 0, in order."""
    return [
        (i, i * chunk_size, min(n_samples, (i + 1) * chunk_size))
        for i in range(completed.shape[0])
        if not completed[i]
    ]


def _n_written(completed: np.ndarray, chunk_size: int, n_samples: int) -> int:
    """Samples in the completed chunks."""
    # (cast: typeshed types min() of an int and a NumPy integer as a comparison protocol)
    return int(sum(cast(int, min(n_samples, (i + 1) * chunk_size)) - i * chunk_size
                   for i in np.flatnonzero(completed)))


def _unwritten_datasets(path: Path) -> list[str]:
    """The chunked data sets of the file ``path`` that lack some of their chunks."""
    missing: list[str] = []

    def check(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and obj.chunks is not None:
            chunks = math.prod(-(-n // c) for n, c in zip(obj.shape, obj.chunks, strict=True))
            if obj.id.get_num_chunks() != chunks:
                missing.append(name)

    with h5py.File(path, "r") as f:
        f.visititems(check)
    return missing


def publish(file: h5py.File, final: Path) -> Path:
    """Mark the open partial ``file`` complete, close it and atomically rename it to ``final``
    (so ``final`` never exists half-written): only once every chunk of every data set is
    stored and the file is on disk.

    A write the disk refused (full, a file-size limit) does not always raise: HDF5 reports it
    while closing, and h5py does not pass that on. The unwritten chunks would then read back
    as the fill value, zeros, which no checksum covers; so the chunks are counted."""
    file.attrs["complete"] = True
    part = Path(file.filename)
    file.flush()
    file.close()
    missing = _unwritten_datasets(part)
    if missing:
        raise DataFileError(f"{str(part)!r}: data sets {missing} were not all written (a full "
                            "disk or a file-size limit?); the file is kept unpublished")
    _replace_on_disk(part, final)
    return final


def _replace_on_disk(source: Path, target: Path) -> None:
    """Rename ``source`` over ``target`` once its content is on disk (a crash after the
    rename then finds the whole file, not an empty one)."""
    fd = os.open(source, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(source, target)


def run_chunks(
    writer: ChunkedWriter | RaggedWriter,
    compute: Callable[[int, int], Any],
    *,
    progress: bool,
    desc: str,
    statistics: Callable[[Any], Any] | None = None,
) -> Path:
    """Compute and store every pending chunk of ``writer`` with a progress bar, then publish.

    ``writer``: a :class:`ChunkedWriter` or :class:`~galerkin_ext.data.ragged.RaggedWriter`
    (a :class:`PartialFileWriter` with ``write_chunk``); ``compute(start, stop)`` gives what
    ``write_chunk`` stores for samples ``[start, stop)``; ``statistics(chunk_data)``, if given,
    the summary fields passed to ``write_chunk`` as its third argument.  The writer is closed
    however this ends (an interruption keeps the completed chunks for a resume; a
    :class:`SolverError` removes them).
    """
    try:
        with _sigint_recorded() as interrupted, tqdm(
            total=writer.n_samples,
            initial=writer.n_done(),
            unit="sample",
            desc=desc,
            disable=not progress,
            dynamic_ncols=True,
        ) as bar:
            for chunk, start, stop in writer.pending_chunks():
                with _memory_named(writer, start, stop):
                    data = compute(start, stop)
                extra = () if statistics is None else (statistics(data),)
                _check_room(writer, data, f"samples {start} to {stop - 1}")
                with _storing(writer, f"samples {start} to {stop - 1}"):
                    writer.write_chunk(chunk, data, *extra)
                bar.update(stop - start)
                if interrupted:
                    raise KeyboardInterrupt
            with _storing(writer, "the last chunks"):
                path = writer.finish()
        if interrupted:  # the file is complete: the data CLI says so
            raise InterruptedWhenFinished
        return path
    except SolverError:
        writer.discard()  # the same settings would fail again
        raise
    except BaseException:
        with contextlib.suppress(DataFileError):  # the first error says what happened
            writer.close()
        raise


def _nbytes(data: object) -> int:
    """The bytes of the arrays in ``data`` (nested dicts, lists and arrays)."""
    if isinstance(data, Mapping):
        return sum(_nbytes(v) for v in data.values())
    if isinstance(data, list | tuple):
        return sum(_nbytes(v) for v in data)
    return int(np.asarray(data).nbytes) if data is not None else 0


# What HDF5's own records may add to a store (chunk indexes, attributes, the superblock; the
# first store of a Burgers set took 7 KiB beyond its samples).
_HDF5_MARGIN = 1 << 18


def _check_room(writer: PartialFileWriter, data: object, what: str) -> None:
    """Refuse to store ``data`` where the disk or the file-size limit (``ulimit -f``) leaves no
    room for it, with a margin for HDF5's records and the chunks a store may begin
    (``writer.slack_bytes``). A write that fails inside HDF5 leaves the partial file
    unreadable, and HDF5 2.0 then crashes the process when it closes."""
    part = partial_path(writer.path)
    _check_space(part, _nbytes(data) + writer.slack_bytes + _HDF5_MARGIN, f"storing {what}",
                 f", then {_RESUME} continues from the samples stored so far")


def _check_space(part: Path, needed: int, what: str, then: str) -> None:
    """``DataFileError`` unless the folder of ``part`` has ``needed`` bytes free and the
    file-size limit (``ulimit -f``) lets ``part`` grow by as much; ``then`` ends the message,
    after its cure ("make room" or "raise it")."""
    free = shutil.disk_usage(part.parent).free
    if needed > free:
        raise DataFileError(f"{str(part)!r}: {what} needs about {needed / 2**20:.3g} MiB with "
                            f"a margin for HDF5's records, and {str(part.parent)!r} has "
                            f"{free / 2**20:.3g} MiB free; make room{then}")
    try:
        import resource
    except ImportError:  # (Windows)
        return
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    size = part.stat().st_size if part.exists() else 0
    if limit != resource.RLIM_INFINITY and size + needed > limit:
        raise DataFileError(f"{str(part)!r}: {what} needs about {needed / 2**20:.3g} MiB with "
                            f"a margin for HDF5's records, and the file-size limit (ulimit -f) "
                            f"of {limit / 2**20:.3g} MiB leaves {(limit - size) / 2**20:.3g} "
                            f"MiB; raise it{then}")


@contextlib.contextmanager
def _memory_named(writer: PartialFileWriter, start: int, stop: int) -> Iterator[None]:
    """Running out of memory while computing samples ``start`` to ``stop - 1`` (a
    ``MemoryError``, or torch's allocator's ``RuntimeError``) as a :class:`DataFileError` that
    says what bounds the memory: the chunk size, which a resumption keeps."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        if isinstance(err, RuntimeError) and not any(
                sign in str(err) for sign in ("can't allocate memory", "out of memory")):
            raise  # (the CPU allocator's message, and CUDA's OutOfMemoryError's)
        raise DataFileError(
            f"{str(partial_path(writer.path))!r}: computing samples {start} to {stop - 1} ran "
            f"out of memory ({type(err).__name__}: {str(err)[:200]}); the samples stored so far "
            f"are kept: with more memory free, {_RESUME} continues it, or {_OVERWRITE} starts "
            f"again with a smaller chunk_size (--chunk-size), the samples computed at "
            "once") from err


@contextlib.contextmanager
def _storing(writer: PartialFileWriter, what: str) -> Iterator[None]:
    """HDF5's errors while ``writer`` stores ``what`` (a full disk, a file-size limit, an I/O
    error: h5py raises them as ``OSError`` or ``RuntimeError``) as a :class:`DataFileError`
    that names the file and says what to do."""
    try:
        yield
    except DataFileError:  # the package's own, which says what happened
        raise
    except (OSError, RuntimeError) as err:
        part = partial_path(writer.path)
        if getattr(err, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            cause, cure = "no permission to write there?", "once it is writable"
        else:
            cause, cure = "a full disk or a file-size limit?", "once there is room"
        raise DataFileError(
            f"{str(part)!r}: storing {what} failed ({cause}): {err}. The partial file is "
            f"kept; {cure}, {_RESUME} continues it, or {_OVERWRITE} starts again if it is "
            "refused") from err


@contextlib.contextmanager
def _sigint_recorded() -> Iterator[list[int]]:
    """SIGINT raises ``KeyboardInterrupt`` as usual and is also recorded in the list yielded.

    Python only prints an exception raised inside a weakref callback or a ``__del__`` (as
    h5py's and torch's clean-ups run) and carries on: an interrupt landing there was lost, and
    the generation ran to its end.  The record lets :func:`run_chunks` raise it again at the
    next chunk boundary, and the "Exception ignored" traceback Python prints is left out.  A
    handler other than Python's default one is left alone.
    """
    interrupted: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield interrupted
        return

    def record(signum: int, frame: object) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    def quiet(unraisable: Any) -> None:  # recorded already: no "Exception ignored" traceback
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            previous_hook(unraisable)

    previous_hook = sys.unraisablehook
    signal.signal(signal.SIGINT, record)
    sys.unraisablehook = quiet
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = previous_hook


@dataclass(frozen=True)
class ArraySpec:
    """Shape (without the sample axis) and dtype of one stored array; the first ``grid_ndim``
    axes of ``shape`` are grid axes, the rest components (``None``: all are grid axes)."""

    shape: tuple[int, ...]
    dtype: str
    grid_ndim: int | None = None


_RESERVED = ("completed", "statistics")


def _moments(values: np.ndarray) -> tuple[float, float, float]:
    """Count, mean and sum of squared deviations of ``values`` (any shape), in float64."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return 0.0, 0.0, 0.0
    mean = float(v.mean())
    return float(v.size), mean, float(np.sum((v - mean) ** 2))


def _combine(rows: np.ndarray) -> tuple[float, float, float]:
    """Combine per-chunk ``(count, mean, M2)`` rows (Chan et al.'s pairwise update, stable)."""
    n, mean, m2 = 0.0, 0.0, 0.0
    for nb, mb, m2b in rows:
        if nb == 0:
            continue
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    return n, mean, m2


def _allocated(ds: h5py.Dataset, row: int | np.integer) -> bool:
    """Whether the HDF5 chunk that holds ``ds[row]`` was stored: HDF5 reads a chunk its index
    lost as the fill value, zeros, without an error."""
    origin = (row - row % ds.chunks[0], *(0 for _ in ds.shape[1:]))
    return ds.id.get_chunk_info_by_coord(origin).byte_offset is not None


def _rebuilding_path(part: Path) -> Path:
    """Where a resume rebuilds the partial file ``part`` before it replaces it."""
    return part.with_name(f".{part.name}.rebuilding")


def _rebuild_beside(part: Path, create: Callable[[Path], h5py.File],
                    copy: Callable[[h5py.File], None]) -> None:
    """Replace the partial file ``part`` by a new one built beside it: ``create(path)`` makes it
    empty, ``copy(file)`` fills it from the old one; it replaces ``part`` once on disk, and
    nothing is left of it where building fails."""
    rebuilt = _rebuilding_path(part)
    new = create(rebuilt)
    try:
        copy(new)
        new.close()
    except BaseException:
        new.close()
        rebuilt.unlink(missing_ok=True)
        raise
    _replace_on_disk(rebuilt, part)


def _new_partial_file(path: Path, attrs: dict[str, Any], chunk_size: int, n_samples: int,
                     create: Callable[[h5py.File], None]) -> h5py.File:
    """A new, empty partial file at ``path``, open for writing: the generation's ``attrs``,
    its ``chunk_size``, the ``completed`` record, and what ``create(file)`` adds (the data sets
    of a writer's layout). Nothing is left at ``path`` if creating it fails."""
    _check_space(path, _HDF5_MARGIN, "creating it", ", then run it again")
    f = None
    try:
        f = h5py.File(path, "w")
        for key, value in attrs.items():
            f.attrs[key] = value
        f.attrs["chunk_size"] = chunk_size
        f.attrs["complete"] = False
        create(f)
        f.create_dataset("completed", shape=(-(-n_samples // chunk_size),), dtype="u1",
                         fillvalue=0, fletcher32=True)
        f.flush()
    except BaseException as err:  # nothing is in it yet: a file left would block the next run
        if f is not None:
            with contextlib.suppress(Exception):  # (what HDF5 could not write fails again)
                f.close()
        path.unlink(missing_ok=True)
        if isinstance(err, OSError | RuntimeError):
            raise DataFileError(f"{str(path)!r}: creating it failed (a full disk, a file-size "
                                f"limit or no permission?): {err}") from err
        raise
    return f


def _create_chunked(path: Path, attrs: dict[str, Any], chunk_size: int, n_samples: int,
                    arrays: dict[str, ArraySpec], static: dict[str, np.ndarray],
                    statistics: list[str]) -> h5py.File:
    """A new, empty partial file of :class:`ChunkedWriter` at ``path``, open for writing."""
    def create(f: h5py.File) -> None:
        for name, spec in arrays.items():
            # One HDF5 chunk per sample (at most ~8 MB) keeps random access cheap; the
            # Fletcher-32 checksum of each chunk makes HDF5 refuse a corrupted one on read.
            ds = f.create_dataset(name, shape=(n_samples, *spec.shape), dtype=spec.dtype,
                                  chunks=(1, *spec.shape), fletcher32=True)
            if spec.grid_ndim is not None:
                ds.attrs["grid_ndim"] = spec.grid_ndim
        # The shared arrays and the bookkeeping carry checksums too (a flipped bit in the
        # coordinates read back silently).
        for name, value in static.items():
            ds = f.create_dataset(name, data=value, fletcher32=True)
            ds.attrs["static"] = True
            ds.attrs["grid_ndim"] = value.ndim - 1
        if statistics:
            ds = f.create_dataset("statistics",
                                  shape=(-(-n_samples // chunk_size), len(statistics), 3),
                                  dtype="f8", fillvalue=0.0, fletcher32=True)
            ds.attrs["names"] = json.dumps(statistics)

    return _new_partial_file(path, attrs, chunk_size, n_samples, create)


class PartialFileWriter:
    """What both writers share (:class:`ChunkedWriter`, :class:`~.ragged.RaggedWriter`):
    ``FILE.partial`` open for writing, its record of completed chunks, and the writer's lock
    (:func:`prepare_output`), held until :meth:`finish`, :meth:`close` or :meth:`discard`."""

    #: What storing a chunk may take beyond its samples' bytes and HDF5's records (none: each
    #: sample is one HDF5 chunk of its own).
    slack_bytes = 0

    def __init__(self, path: Path, file: h5py.File, chunk_size: int, n_samples: int,
                 lock: contextlib.ExitStack) -> None:
        self.path = path
        self.file = file
        self.chunk_size = chunk_size
        self.n_samples = n_samples
        self._lock = lock

    def pending_chunks(self) -> list[tuple[int, int, int]]:
        """``(chunk, start, stop)`` for every chunk not yet written, in order."""
        return pending_chunks(self.file["completed"][...], self.chunk_size, self.n_samples)

    def n_done(self) -> int:
        """Number of samples already written."""
        return _n_written(self.file["completed"][...], self.chunk_size, self.n_samples)

    def finish(self) -> Path:
        """Mark complete, close and atomically rename ``FILE.partial`` to ``FILE``."""
        if self.pending_chunks():
            raise DataFileError("cannot finish: some chunks have not been written")
        try:
            return publish(self.file, self.path)
        finally:
            self._lock.close()

    def close(self) -> None:
        """Close the partial file without publishing it (after an interruption)."""
        try:
            if self.file.id.valid:
                self.file.close()
        except (OSError, RuntimeError) as err:  # what HDF5 could not write before
            raise DataFileError(f"{str(partial_path(self.path))!r}: closing it failed: "
                                f"{err}") from err
        finally:
            self._lock.close()

    def discard(self) -> None:
        """Close and remove the partial file (what it holds is of no use), then release."""
        if self.file.id.valid:
            self.file.close()
        partial_path(self.path).unlink(missing_ok=True)
        self._lock.close()


class ChunkedWriter(PartialFileWriter):
    """Write the per-sample arrays chunk by chunk into ``FILE.partial``, then publish it as
    ``FILE``.

    Use :meth:`open`, then :meth:`pending_chunks`, :meth:`write_chunk` for each, :meth:`finish`.
    """

    def __init__(self, path: Path, file: h5py.File, chunk_size: int, n_samples: int,
                 lock: contextlib.ExitStack) -> None:
        super().__init__(path, file, chunk_size, n_samples, lock)
        self.statistics: list[str] = (
            json.loads(_attr(file["statistics"], "names")) if "statistics" in file else []
        )
        self.arrays = [name for name, ds in file.items()
                       if name not in _RESERVED and not ds.attrs.get("static", False)]

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
        arrays: dict[str, ArraySpec],
        static: dict[str, np.ndarray] | None = None,
        statistics: Sequence[str] = (),
        libraries: Sequence[str] = (),
        resume: bool = False,
        overwrite: bool = False,
    ) -> ChunkedWriter:
        """Create (or, with ``resume``, reopen) the partial file for a generation.

        ``arrays``: the per-sample arrays; ``static``: arrays shared by every sample, shape
        ``(*grid, d)`` (e.g. coordinates), written now; ``statistics``: names of the summary
        fields that every :meth:`write_chunk` gives; ``libraries``: the distributions that
        compute the samples (their versions are recorded, and a resumption under others
        warns: the rest may differ in the last bits).

        Raises ``FileExistsError`` if ``out`` or its partial file exists and neither ``resume``
        nor ``overwrite`` is set, and :class:`DataFileError` if a partial file to resume is
        unreadable or was made with other parameters.  With ``resume`` and no partial file, a
        new generation starts.
        """
        from .. import __version__

        seed = check_seed(seed)
        n_samples = check_int(n_samples, "n_samples")
        chunk_size = check_int(chunk_size, "chunk_size")
        if not arrays:
            raise ValueError("arrays: expected at least one per-sample array")
        static = {k: np.asarray(v) for k, v in (static or {}).items()}
        for name in (*arrays, *static):
            if name in _RESERVED:
                raise ValueError(f"arrays: {name!r} is reserved for the file's bookkeeping")
        for name, value in static.items():
            if value.ndim < 1:
                raise ValueError(f"static: {name!r} must have shape (*grid, d), got {value.shape}")
        statistics = list(statistics)
        attrs = {
            "schema": SCHEMA,
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
                chunk_size, changed = cls._rebuild(part, attrs, arrays, static, statistics,
                                                   n_samples)
                f = _open_to_resume(part)
                record_resumption(f, part, attrs, changed)
                return cls(final, f, chunk_size, n_samples, lock.pop_all())
            # a set larger than the disk fails up front, not as a MemoryError or a full disk
            # after its partial file exists
            needed = n_samples * sum(int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize
                                     for spec in arrays.values())
            _check_space(part, needed + _nbytes(static) + _HDF5_MARGIN,
                         f"storing its {n_samples} samples", ", or ask for fewer")
            f = _create_chunked(part, attrs, chunk_size, n_samples, arrays, static, statistics)
            return cls(final, f, chunk_size, n_samples, lock.pop_all())

    @classmethod
    def _rebuild(cls, part: Path, attrs: dict[str, Any], arrays: dict[str, ArraySpec],
                 static: dict[str, np.ndarray], statistics: list[str],
                 n_samples: int) -> tuple[int, list[str]]:
        """Copy the completed chunks of the interrupted partial file ``part`` into a new file
        that replaces it; returns its chunk size and the versions that changed (see
        :func:`check_resumable_attributes`).

        HDF5 is not crash-safe: a process killed while HDF5 wrote (SIGKILL, the OOM killer)
        can leave the file's last records half-written, and writing into it then failed
        ("addr overflow") or crashed the process. Read, such a file gives back the chunks
        whose data and checksums are whole, and a chunk that fails is generated again (its
        samples depend on ``(seed, i)`` alone). Where the disk has no room for the copy, the
        file is resumed in place, as before."""
        with _open_to_resume(part, "r") as old:
            changed = cls._check_resumable(old, part, attrs, arrays, static, statistics)
            chunk_size = int(old.attrs["chunk_size"])  # the record is per stored chunk size
            if not _room_to_copy(part):
                return chunk_size, changed
            try:
                done = np.flatnonzero(old["completed"][...])
            except OSError:  # (its checksum fails: every chunk is generated again)
                done = np.zeros(0, dtype=np.int64)

            def copy(new: h5py.File) -> None:
                for chunk in done:
                    # (cast: as in _n_written)
                    start, stop = chunk * chunk_size, cast(int, min(n_samples,
                                                                    (chunk + 1) * chunk_size))
                    rows: list[tuple[Any, int | np.integer]] = [
                        (old[name], i) for name in arrays for i in range(start, stop)]
                    if statistics:
                        rows.append((old["statistics"], chunk))
                    try:
                        if not all(_allocated(ds, i) for ds, i in rows):
                            continue
                        values = {name: old[name][start:stop] for name in arrays}
                        moments = old["statistics"][chunk] if statistics else None
                    except OSError:  # a checksum that fails, a record that cannot be read
                        continue
                    for name, value in values.items():
                        new[name][start:stop] = value
                    if moments is not None:
                        new["statistics"][chunk] = moments
                    new["completed"][chunk] = 1

            _rebuild_beside(part, lambda path: _create_chunked(
                path, attrs, chunk_size, n_samples, arrays, static, statistics), copy)
        return chunk_size, changed

    @staticmethod
    def _check_resumable(
        f: h5py.File, part: Path, attrs: dict[str, Any], arrays: dict[str, ArraySpec],
        static: dict[str, np.ndarray], statistics: list[str],
    ) -> list[str]:
        changed = check_resumable_attributes(f, part, attrs)
        for name, spec in arrays.items():
            if name not in f or f[name].shape[1:] != spec.shape:
                raise DataFileError(f"cannot resume {str(part)!r}: array {name!r} is missing or "
                                    f"has another shape than {spec.shape}")
        for name, value in static.items():
            if name not in f or f[name].shape != value.shape or not np.array_equal(
                f[name][...], value
            ):
                raise DataFileError(f"cannot resume {str(part)!r}: its {name!r} differs from "
                                    f"this run's ({_OVERWRITE} starts again)")
        stored = json.loads(_attr(f["statistics"], "names")) if "statistics" in f else []
        if stored != statistics:
            raise DataFileError(f"cannot resume {str(part)!r}: it records the statistics "
                                f"{stored}, this run {statistics}")
        return changed

    def write_chunk(
        self,
        chunk: int,
        arrays: dict[str, np.ndarray],
        statistics: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Store one chunk's arrays (and the moments of its summary fields ``statistics``, one
        entry per name given to :meth:`open`), flush, then mark it completed (and flush again).
        """
        n_chunks = self.file["completed"].shape[0]
        if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or not (
            0 <= chunk < n_chunks
        ):
            raise ValueError(f"chunk: expected an int in [0, {n_chunks}), got {chunk!r}")
        start = chunk * self.chunk_size
        stop = min(self.n_samples, start + self.chunk_size)
        # a chunk marked completed without one of its arrays would be published as zeros
        if not isinstance(arrays, dict) or sorted(arrays) != sorted(self.arrays):
            raise ValueError(f"arrays: expected the per-sample arrays {sorted(self.arrays)}, got "
                             f"{sorted(arrays) if isinstance(arrays, dict) else arrays!r}")
        given = sorted(statistics or {})
        if given != sorted(self.statistics):
            raise ValueError(f"statistics: expected the fields {self.statistics}, got {given}")
        for name, value in arrays.items():
            expected = (stop - start, *self.file[name].shape[1:])
            if np.shape(value) != expected:
                raise ValueError(f"arrays: chunk {chunk}'s {name!r} must have shape {expected} "
                                 f"(samples {start} to {stop - 1}), got {np.shape(value)}")
        for name, value in arrays.items():
            self.file[name][start:stop] = value
        if self.statistics:
            assert statistics is not None
            self.file["statistics"][chunk] = [_moments(statistics[k]) for k in self.statistics]
        self.file.flush()  # the data are on disk before the record says so
        self.file["completed"][chunk] = 1
        self.file.flush()


def data_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a data file holds, wherever it lies: a galerkin_ext file's generator, seed, sample
    count and parameters (a converted file's parameters hold its sources' SHA-256); any other
    file's name and size (also a damaged HDF5 file, which its reader reports)."""
    p = Path(path)
    try:
        if h5py.is_hdf5(p):
            with h5py.File(p, "r") as f:
                if "schema" in f.attrs:
                    return {key: _attr(f, key)
                            for key in ("generator", "seed", "n_samples", "parameters")}
    except OSError:
        pass
    return {"name": p.name, "bytes": p.stat().st_size}


def same_draws(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether the files of two :func:`data_identity` records hold the same random draws at
    each index: files of one of the package's generators with one seed, whose sample ``i``
    depends on ``(seed, i)`` alone, whatever their other parameters (on a finer grid: the same
    coefficients or geometries, or, for a Darcy field, whose ``K x K`` normals are drawn in
    row order, correlated ones); converted files (their parameters name a source) never."""
    if "seed" not in a or "seed" not in b or (a["generator"], a["seed"]) != (b["generator"],
                                                                             b["seed"]):
        return False
    parameters = [_json_object(record["parameters"]) for record in (a, b)]
    return all(p is not None and "source" not in p for p in parameters)


def _attr(f: h5py.File | h5py.Dataset, key: str) -> Any:
    value = f.attrs[key]
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _check_grid_ndim(ds: h5py.Dataset, most: int, *, required: bool) -> None:
    """``ds``'s ``grid_ndim`` attribute (see the schema): an int in ``[0, most]``."""
    if "grid_ndim" not in ds.attrs:
        if required:
            raise KeyError(f"array {ds.name[1:]!r} has no grid_ndim attribute")
        return
    value = _attr(ds, "grid_ndim")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"array {ds.name[1:]!r} records grid_ndim = {value!r}, expected an int "
                         f"in [0, {most}]")


def inspect_h5(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Metadata and completeness of a generated file (or its partial file), without the data.

    Returns a dict with ``generator``, ``parameters`` (dict), ``seed``, ``n_samples``,
    ``chunk_size``, ``package_version``, ``library_versions`` (dict; ``None`` where the file
    records none), ``complete`` (bool), ``n_done`` (samples written),
    ``shapes`` (``{name: shape}`` of the per-sample arrays), ``static`` (``{name: shape}`` of
    the shared arrays) and ``statistics`` (``{field: {"mean", "std", "count"}}`` over the
    samples written so far; population std; empty for files that record none).  Raises
    :class:`DataFileError` for a file that is missing, unreadable, or not written by this
    package.
    """
    p = check_path(path)
    if not p.is_file():
        raise DataFileError(f"{str(p)!r} does not exist or is not a file")
    with _open(p, "r") as f:
        schema = f.attrs.get("schema")
        if schema in (RAGGED_SCHEMA, RAGGED_SCHEMA.encode()):
            raise DataFileError(f"{str(p)!r} holds ragged data ({RAGGED_SCHEMA}, e.g. heat or "
                                "elasticity); read it with galerkin_ext.data.ragged")
        if schema not in (SCHEMA, SCHEMA.encode()):
            raise DataFileError(f"{str(p)!r} is not a galerkin_ext data file (no schema {SCHEMA})")
        try:
            done = f["completed"][...]
            chunk = int(_attr(f, "chunk_size"))
            n = int(_attr(f, "n_samples"))
            if n < 1 or chunk < 1 or done.shape != (-(-n // chunk),):
                raise ValueError(f"{n} samples in chunks of {chunk} do not match its "
                                 f"completed-chunk record of shape {done.shape}")
            n_done = _n_written(done, chunk, n)
            static = [k for k in f if k not in _RESERVED and f[k].attrs.get("static", False)]
            per_sample = [k for k in f if k not in _RESERVED and k not in static]
            if not per_sample:
                raise KeyError("no per-sample arrays")
            for k in per_sample:
                if f[k].ndim < 1 or f[k].shape[0] != n:
                    raise ValueError(f"array {k!r} has shape {f[k].shape}, not {n} samples")
                _check_grid_ndim(f[k], f[k].ndim - 1, required=False)
            for k in static:
                _check_grid_ndim(f[k], f[k].ndim, required=True)
            stats = {}
            if "statistics" in f:
                rows = f["statistics"][...][done.astype(bool)]
                for j, name in enumerate(json.loads(_attr(f["statistics"], "names"))):
                    count, mean, m2 = _combine(rows[:, j])
                    stats[name] = {"mean": mean if count else None,
                                   "std": float(np.sqrt(m2 / count)) if count else None,
                                   "count": int(count)}
            info = {
                "generator": _attr(f, "generator"),
                "parameters": json.loads(_attr(f, "parameters")),
                "seed": int(_attr(f, "seed")),
                "n_samples": n,
                "chunk_size": chunk,
                "package_version": _attr(f, "package_version"),
                "library_versions": _json_object(f.attrs.get("library_versions")),
                "complete": bool(_attr(f, "complete")) and bool(done.all()),
                "n_done": n_done,
                "shapes": {k: tuple(f[k].shape) for k in per_sample},
                "static": {k: tuple(f[k].shape) for k in static},
                "statistics": stats,
            }
        except (KeyError, OSError, ValueError) as err:
            raise DataFileError(f"{str(p)!r} is damaged or lacks schema fields: {err}") from err
    return info


def _as_selection(idx: np.ndarray) -> slice | np.ndarray:
    """A contiguous run of indices as a slice: h5py reads slices much faster than lists."""
    if idx[-1] - idx[0] + 1 == idx.size:
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def read_h5(
    path: str | os.PathLike[str],
    indices: Sequence[int] | np.ndarray | slice | None = None,
    *,
    stride: int = 1,
    keys: Sequence[str] | None = None,
    block: int = 64,
) -> dict[str, np.ndarray]:
    """Read samples of a complete generated file, optionally subsampling every grid axis.

    Args:
        path: a finished file (a ``.partial`` or incomplete file raises :class:`DataFileError`).
        indices: which samples (default all); a slice or increasing integer indices.
        stride: keep every ``stride``-th grid point along each grid axis (not component axes).
        keys: arrays to read (default: every per-sample array, e.g. ``"a"``, ``"u"``, or
            ``"input"``, ``"output"``); a static array such as ``"coords"`` comes whole (no
            sample axis), subsampled like the grid.
        block: samples read at once (bounds the memory of full-resolution reads).

    Returns:
        ``{key: array of shape (n_selected, *subsampled_grid, *components)}`` (static arrays:
        ``(*subsampled_grid, d)``) in the stored dtypes.
    """
    info = inspect_h5(path)
    if not info["complete"]:
        raise DataFileError(
            f"{str(path)!r} is incomplete ({info['n_done']} of {info['n_samples']} samples "
            "written); finish it with resume"
        )
    stride = check_int(stride, "stride")
    block = check_int(block, "block")
    names = (*info["shapes"], *info["static"])
    if keys is None:
        keys = tuple(info["shapes"])
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys: expected a sequence of names among {names}, got {keys!r}")
    for key in keys:
        if key not in names:
            raise ValueError(f"keys must be among {names}, got {key!r}")
    n = info["n_samples"]
    if indices is None:
        idx = np.arange(n)
    elif isinstance(indices, slice):
        idx = np.arange(n)[indices]
        if idx.size > 1 and idx[1] < idx[0]:
            raise ValueError(f"indices: expected a slice with a positive step, got {indices}")
    else:
        idx = np.asarray(indices)
        if idx.size == 0 and idx.ndim == 1:  # [] reads as float64: no samples, as read_ragged
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError("indices must be a 1-D sequence of integers or a slice")
        if idx.size and (idx.min() < 0 or idx.max() >= n or np.any(np.diff(idx) <= 0)):
            raise ValueError(f"indices must be increasing and within [0, {n}), got {idx}")
    out: dict[str, np.ndarray] = {}
    with _open(Path(path), "r") as f:
        for key in keys:
            ds = f[key]
            try:
                if key in info["static"]:
                    out[key] = ds[...][(slice(None, None, stride),) * int(ds.attrs["grid_ndim"])]
                    continue
                sub = (slice(None, None, stride),) * int(ds.attrs.get("grid_ndim", ds.ndim - 1))
                # `+ sub`, not `*sub`: mypy on Python 3.10 takes `x[(a, *sub)]` for 3.11 syntax
                parts = [ds[_as_selection(idx[i : i + block])][(slice(None),) + sub]
                         for i in range(0, idx.size, block)]
            except OSError as err:  # a chunk failing its checksum, or unreadable
                raise DataFileError(f"{str(path)!r}: array {key!r} is corrupt (a stored chunk "
                                    f"fails its checksum or cannot be read): {err}") from err
            if parts:
                out[key] = np.concatenate(parts)
            else:
                out[key] = np.empty((0, *ds[(0,) + sub].shape), dtype=ds.dtype)
    return out
