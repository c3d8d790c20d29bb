"""data/storage.py's argument checks and rarely taken branches: each check reached through the
public API, each branch with its result checked."""

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import record_fsyncs_and_renames

from galerkin_ext import __version__
from galerkin_ext.data import storage as S
from galerkin_ext.data.storage import (
    ArraySpec,
    ChunkedWriter,
    DataFileError,
    InterruptedWhenFinished,
    check_output_path,
    inspect_h5,
    partial_path,
    read_h5,
    run_chunks,
)

ARRAYS = {"a": ArraySpec((3,), "f8"), "b": ArraySpec((), "f8")}


def _writer(path, **kw):
    return ChunkedWriter.open(path, **{"generator": "toy", "parameters": {"k": 1}, "seed": 0,
                                       "n_samples": 4, "chunk_size": 2, "arrays": ARRAYS, **kw})


def _chunk(w, c, **kw):
    w.write_chunk(c, {"a": np.full((2, 3), c + 1.0), "b": np.full(2, c + 1.0)}, **kw)


def _partial(tmp_path, **kw):
    out = tmp_path / "p.h5"
    w = _writer(out, **kw)
    _chunk(w, 0, **({"statistics": {"s": np.ones(3)}} if kw.get("statistics") else {}))
    w.close()
    return out, partial_path(out)


def _full(tmp_path, name="f.h5", **kw):
    w = _writer(tmp_path / name, **kw)
    _chunk(w, 0)
    _chunk(w, 1)
    return w.finish()


def test_open_argument_checks(tmp_path):
    out = tmp_path / "o.h5"
    with pytest.raises(TypeError, match="parameters: expected a dict of JSON values, got list"):
        _writer(out, parameters=[1])
    with pytest.raises(ValueError, match="arrays: 'completed' is reserved for the file's "
                                         "bookkeeping"):
        _writer(out, arrays={"completed": ArraySpec((), "f8")})
    with pytest.raises(ValueError, match=r"static: 'x' must have shape \(\*grid, d\), got \(\)"):
        _writer(out, static={"x": np.float64(1.0)})
    assert not partial_path(out).exists()


def test_a_failure_while_creating_leaves_no_partial_file(tmp_path):
    out = tmp_path / "o.h5"
    with pytest.raises(TypeError):  # h5py cannot store an object array
        _writer(out, static={"x": np.array([1, None], dtype=object)})
    assert not partial_path(out).exists() and not out.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_unwritable_folder():
    """Tried, not judged from the permission bits: root passed os.access for /proc, where no
    file can be made, and the generation failed on its lock file without naming out."""
    with pytest.raises(PermissionError, match=r"out: the folder '/proc' is not writable \("):
        check_output_path("/proc/x.h5")


def test_a_resume_keeps_the_chunk_size_its_file_records(tmp_path):
    """The partial file records its completed chunks by the chunk size it was made with: a
    resumption asking for another writes in the recorded one (in its own, its chunks would
    land on other rows, and the file would never be complete)."""
    out, _ = _partial(tmp_path)  # chunk size 2, chunk 0 written
    w = _writer(out, chunk_size=3, resume=True)
    assert w.chunk_size == 2 and w.pending_chunks() == [(1, 2, 4)]
    _chunk(w, 1)
    np.testing.assert_array_equal(read_h5(w.finish())["b"], [1.0, 1.0, 2.0, 2.0])


def test_an_overwrite_removes_what_an_interrupted_rebuild_left(tmp_path):
    """A resumption killed while it rebuilt the partial file leaves '.NAME.partial.rebuilding'
    beside it: starting afresh removes it with the partial file (it stayed on disk, as large
    as the data)."""
    out, part = _partial(tmp_path)
    stale = part.with_name(f".{part.name}.rebuilding")
    stale.write_bytes(b"x" * 4096)
    w = _writer(out, overwrite=True)
    assert not stale.exists()
    _chunk(w, 0)
    _chunk(w, 1)
    w.finish()
    assert sorted(p.name for p in tmp_path.iterdir() if "rebuilding" in p.name) == []


def test_resume_refusals(tmp_path):
    out, part = _partial(tmp_path, static={"xy": np.zeros((3, 2))}, statistics=["s"])
    base = dict(static={"xy": np.zeros((3, 2))}, statistics=["s"], resume=True)
    with pytest.raises(DataFileError, match="cannot resume .*: array 'a' is missing or has "
                                            r"another shape than \(4,\)"):
        _writer(out, **{**base, "arrays": {**ARRAYS, "a": ArraySpec((4,), "f8")}})
    with pytest.raises(DataFileError, match="cannot resume .*: its 'xy' differs from this run's"):
        _writer(out, **{**base, "static": {"xy": np.ones((3, 2))}})
    with pytest.raises(DataFileError, match=r"cannot resume .*: it records the statistics "
                                            r"\['s'\], this run \['t'\]"):
        _writer(out, **{**base, "statistics": ["t"]})
    with h5py.File(part, "r+") as f:
        f.attrs["parameters"] = "{not json"
    with pytest.raises(DataFileError, match=r"cannot resume .*: its parameters is '\{not json', "
                                            r"but this run asks for '\{\"k\": 1\}'"):
        _writer(out, **base)
    with h5py.File(part, "r+") as f:
        f.attrs["parameters"] = '{"k": 1}'
        del f["completed"]
    with pytest.raises(DataFileError, match="cannot resume .*: it has no completed-chunk record"):
        _writer(out, **base)


def test_fixed_length_string_attributes_are_read_as_text(tmp_path):
    """A file whose string attributes are fixed-length (numpy bytes, as other tools write
    them): resumed and inspected as if they were str."""
    out, part = _partial(tmp_path)
    with h5py.File(part, "r+") as f:
        f.attrs["generator"] = np.bytes_(b"toy")
        f.attrs["parameters"] = np.bytes_(b'{"k": 1}')
    assert inspect_h5(part)["generator"] == "toy"
    w = _writer(out, resume=True)
    assert w.pending_chunks() == [(1, 2, 4)]
    _chunk(w, 1)
    w.finish()
    assert inspect_h5(out)["parameters"] == {"k": 1}
    np.testing.assert_array_equal(read_h5(out)["b"], [1, 1, 2, 2])


def test_write_chunk_and_finish_checks(tmp_path):
    w = _writer(tmp_path / "w.h5", statistics=["s"])
    with pytest.raises(ValueError, match=r"statistics: expected the fields \['s'\], got \[\]"):
        _chunk(w, 0)
    _chunk(w, 0, statistics={"s": np.ones(2)})
    with pytest.raises(DataFileError, match="cannot finish: some chunks have not been written"):
        w.finish()
    w.close()


def test_empty_statistics_of_a_chunk_are_skipped(tmp_path):
    w = _writer(tmp_path / "s.h5", statistics=["s"])
    _chunk(w, 0, statistics={"s": np.array([])})  # nothing to summarise in this chunk
    _chunk(w, 1, statistics={"s": np.array([1.0, 2.0, 6.0])})
    stats = inspect_h5(w.finish())["statistics"]["s"]
    assert stats["count"] == 3 and stats["mean"] == pytest.approx(3.0)
    assert stats["std"] == pytest.approx(np.std([1.0, 2.0, 6.0]), rel=1e-14)


def test_statistics_combine_chunks_of_different_means(tmp_path):
    """The per-chunk (count, mean, M2) rows combine into the statistics of all the values: the
    spread between the chunks' means counts too (a single non-empty chunk pinned none of it)."""
    w = _writer(tmp_path / "s.h5", statistics=["s"])
    _chunk(w, 0, statistics={"s": np.array([1.0, 2.0, 3.0])})
    _chunk(w, 1, statistics={"s": np.array([11.0, 12.0, 13.0, 20.0])})
    stats = inspect_h5(w.finish())["statistics"]["s"]
    values = [1.0, 2.0, 3.0, 11.0, 12.0, 13.0, 20.0]
    assert stats["count"] == 7 and stats["mean"] == pytest.approx(np.mean(values), rel=1e-14)
    assert stats["std"] == pytest.approx(np.std(values), rel=1e-14)


def test_damaged_files(tmp_path):
    f1 = _full(tmp_path, static={"xy": np.zeros((3, 2))})
    with h5py.File(f1, "r+") as f:
        del f["xy"].attrs["grid_ndim"]
    with pytest.raises(DataFileError, match="damaged or lacks schema fields: .*array 'xy' has no "
                                            "grid_ndim attribute"):
        inspect_h5(f1)
    f2 = _full(tmp_path, "g.h5")
    with h5py.File(f2, "r+") as f:
        del f["a"], f["b"]
    with pytest.raises(DataFileError, match="damaged or lacks schema fields: 'no per-sample "
                                            "arrays'"):
        inspect_h5(f2)


def test_a_file_marked_complete_with_a_chunk_missing_is_incomplete(tmp_path):
    """``complete`` needs the file's attribute and every chunk in its completed-chunk record:
    a file whose record lacks a chunk (its data never written) is incomplete, and read_h5
    refuses it, though the attribute says complete (trusting the attribute alone would read
    that chunk's samples as zeros, silently)."""
    path = _full(tmp_path)
    with h5py.File(path, "r+") as f:
        assert f.attrs["complete"]
        f["completed"][1] = 0
    info = inspect_h5(path)
    assert not info["complete"] and info["n_done"] == 2
    with pytest.raises(DataFileError, match=r"is incomplete \(2 of 4 samples written\)"):
        read_h5(path)


def test_grid_ndim_may_count_every_axis_after_the_sample_axis(tmp_path):
    """The schema's grid_ndim is an int in [0, ndim - 1] for a per-sample array: the largest,
    every axis after the sample axis a grid axis (no component axis), is valid, read and
    subsampled by ``stride`` along that axis (refusing it called a valid file damaged)."""
    arrays = {"a": ArraySpec((3,), "f8", grid_ndim=1), "b": ArraySpec((), "f8")}
    path = _full(tmp_path, arrays=arrays)
    with h5py.File(path) as f:
        assert f["a"].attrs["grid_ndim"] == 1 == f["a"].ndim - 1
    assert inspect_h5(path)["complete"]
    got = read_h5(path, stride=2)
    np.testing.assert_array_equal(got["a"], np.repeat([1.0, 1.0, 2.0, 2.0], 2).reshape(4, 2))
    np.testing.assert_array_equal(got["b"], [1.0, 1.0, 2.0, 2.0])


def test_read_index_checks(tmp_path):
    path = _full(tmp_path)
    with pytest.raises(ValueError, match="indices must be a 1-D sequence of integers or a slice"):
        read_h5(path, [0.5])
    for bad in ([2, 1], [0, 4], [-1]):
        with pytest.raises(ValueError, match=r"indices must be increasing and within \[0, 4\)"):
            read_h5(path, bad)


def test_a_repeated_index_is_refused(tmp_path):
    """Indices must be strictly increasing: a repeated one is refused, as read_ragged does,
    rather than read twice (a sample counted twice in a split or a metric, silently)."""
    path = _full(tmp_path)
    for bad in ([0, 2, 2], [1, 1]):
        with pytest.raises(ValueError, match=r"indices must be increasing and within \[0, 4\)"):
            read_h5(path, bad)
    assert read_h5(path, [0, 2, 3])["b"].tolist() == [1.0, 2.0, 2.0]


def test_data_identity_of_foreign_and_damaged_files(tmp_path):
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.zeros(3)
    assert S.data_identity(plain) == {"name": "plain.h5", "bytes": plain.stat().st_size}
    full = _full(tmp_path)
    trunc = tmp_path / "trunc.h5"
    trunc.write_bytes(full.read_bytes()[:1200])  # the HDF5 signature, then nothing readable
    assert h5py.is_hdf5(trunc)
    assert S.data_identity(trunc) == {"name": "trunc.h5", "bytes": 1200}
    assert S.data_identity(full) == {"generator": "toy", "seed": 0, "n_samples": 4,
                                     "parameters": '{"k": 1}'}


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE",
                    reason="HDF5's file locking is switched off")
def test_a_file_locked_by_another_process_is_named(tmp_path):
    out, part = _partial(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time; "
                               "f = h5py.File(sys.argv[1], 'r+'); print('ok', flush=True); "
                               "time.sleep(30)", str(part)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ok"
        with pytest.raises(DataFileError, match="is in use by another process"):
            inspect_h5(part)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("folder", ["p.h5.partial", ".p.h5.writer.lock"])
def test_a_folder_in_the_way_of_a_writers_files_is_named(tmp_path, folder):
    (tmp_path / folder).mkdir()
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(FileExistsError, match=rf"^out: '.*{folder}' is a folder, where the "
                                                  r".* of '.*p\.h5' goes: remove or rename "
                                                  "it$"):
            _writer(tmp_path / "p.h5", **flags)


def test_a_damaged_partial_file_says_how_to_start_again(tmp_path):
    out, part = _partial(tmp_path)
    part.write_bytes(part.read_bytes()[:1200])  # (what a failed write can leave)
    with pytest.raises(DataFileError, match=r"p\.h5\.partial' is not a readable HDF5 file "
                                            r"\(corrupt or truncated\?\): .*; overwrite=True "
                                            r"\(--overwrite\) starts again$"):
        _writer(out, resume=True)
    _writer(out, overwrite=True).close()


_HOLD_WRITER = """
import sys, time
import numpy as np
from galerkin_ext.data.storage import ArraySpec, ChunkedWriter
w = ChunkedWriter.open(sys.argv[1], generator="toy", parameters={"k": 1}, seed=0, n_samples=4,
                       chunk_size=2, arrays={"a": ArraySpec((3,), "f8"), "b": ArraySpec((), "f8")},
                       resume=True)
print("ok", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("hdf5_locking", ["TRUE", "FALSE"])
def test_a_second_writer_is_refused_with_hdf5_locking_off_too(tmp_path, hdf5_locking):
    """Clusters switch HDF5's locks off (HDF5_USE_FILE_LOCKING=FALSE); a second generation of
    the same file (a repeated job) then resumed into the live one's partial file and both wrote
    it. The package's own lock refuses it, before any work and when opening."""
    out, part = _partial(tmp_path)
    env = {**os.environ, "HDF5_USE_FILE_LOCKING": hdf5_locking}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_WRITER, str(out)], env=env,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ok"
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from galerkin_ext.data.storage import "
             "check_output; check_output(sys.argv[1], resume=True, overwrite=False)", str(out)],
            env=env, capture_output=True, text=True)
        assert probe.returncode == 1
        assert "is being written by another process: wait for it to end" in probe.stderr
        for flags in ({"resume": True}, {"overwrite": True}):
            with pytest.raises(FileExistsError, match=f"^'{part}' is being written by another "
                                                      "process: wait for it to end$"):
                _writer(out, **flags)
        assert part.exists()  # overwrite left the live writer's file alone
    finally:
        holder.kill()
        holder.wait()
    w = _writer(out, resume=True)  # the system released the killed process's lock
    assert w.n_done() == 2
    w.close()


def test_the_writer_lock_is_released_however_the_writer_ends(tmp_path):
    out = tmp_path / "p.h5"
    lock = S.writer_lock_path(out)
    assert lock == tmp_path / ".p.h5.writer.lock"
    w = _writer(out)
    with pytest.raises(FileExistsError, match="is being written by another process"):
        _writer(out, resume=True)  # (flock: another open file is another holder)
    _chunk(w, 0)
    w.close()
    with pytest.raises(DataFileError, match="cannot resume"):
        _writer(out, resume=True, seed=1)  # a failed open releases it
    w = _writer(out, resume=True)  # a closed writer did
    _chunk(w, 1)
    w.finish()
    w = _writer(out, overwrite=True)  # so did a finished one
    w.discard()
    assert not partial_path(out).exists()
    _writer(out, overwrite=True).close()  # and a discarded one
    assert lock.exists()  # kept: removing it could let two processes lock two files of one name


class _Writer:
    """A writer whose publishing swallows a Ctrl-C, as a clean-up (__del__) would."""

    slack_bytes = 0

    def __init__(self, path):
        self.path, self.n_samples, self.written = path, 2, []

    def n_done(self):
        return 0

    def pending_chunks(self):
        return [(0, 0, 2)]

    def write_chunk(self, chunk, data):
        self.written.append((chunk, data))

    def finish(self):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        except KeyboardInterrupt:
            pass  # lost, as an exception in a weakref callback is
        return self.path

    def close(self):
        pass


def test_an_interrupt_lost_while_publishing_is_reported(tmp_path):
    # Python's own handler, as in a terminal (a background job of a script starts with
    # SIGINT ignored, and so would this process)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        w = _Writer(tmp_path / "x.h5")
        with pytest.raises(InterruptedWhenFinished):
            run_chunks(w, lambda a, b: list(range(a, b)), progress=False, desc="t")
        assert w.written == [(0, [0, 1])]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, before)


class _RaisesInDel:
    def __del__(self):
        raise ValueError("from __del__")


def test_other_unraisable_exceptions_reach_the_previous_hook(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))

    def compute(a, b):
        obj = _RaisesInDel()
        del obj
        return list(range(a, b))
    w = _Writer(tmp_path / "y.h5")
    w.finish = lambda: w.path
    assert run_chunks(w, compute, progress=False, desc="t") == w.path
    assert seen == [ValueError]


def test_publishing_fsyncs_the_partial_file_before_the_rename(tmp_path, monkeypatch):
    """finish() renames the partial file under the data file's name once its content is on
    disk: the partial file, whole, is fsync-ed before os.replace (else a crash soon after the
    rename can leave the name on an empty or partial file; only a spy on the calls sees a
    missing fsync)."""
    out = tmp_path / "f.h5"
    w = _writer(out)
    _chunk(w, 0)
    _chunk(w, 1)
    events = record_fsyncs_and_renames(monkeypatch)
    assert w.finish() == out
    renames = [i for i, event in enumerate(events) if event[:1] == ("replace",)
               and event[2] == str(out)]
    assert len(renames) == 1
    inode = events[renames[0]][1]
    assert inode == out.stat().st_ino
    assert ("fsync", inode, out.stat().st_size) in events[:renames[0]]
    np.testing.assert_array_equal(read_h5(out)["b"], [1.0, 1.0, 2.0, 2.0])


def test_a_chunks_data_are_flushed_before_it_is_marked_completed(tmp_path, monkeypatch):
    """write_chunk stores the chunk's arrays and flushes them before its completed-chunk
    record says so (a crash between the two then leaves a chunk generated again, never one
    marked completed whose data are not on disk: read back as zeros)."""
    w = _writer(tmp_path / "o.h5")
    seen, flush = [], h5py.File.flush

    def spy_flush(self):
        seen.append((int(self["completed"][0]), self["a"][0].tolist(), float(self["b"][1])))
        return flush(self)

    monkeypatch.setattr(h5py.File, "flush", spy_flush)
    _chunk(w, 0)
    monkeypatch.undo()
    assert (0, [1.0, 1.0, 1.0], 1.0) in seen  # flushed: the data stored, not yet marked
    assert seen[-1] == (1, [1.0, 1.0, 1.0], 1.0)  # and the record flushed too
    w.close()


def test_a_second_resume_under_the_same_new_version_records_and_warns_nothing_more(tmp_path):
    """A file begun under 0.0.9 and resumed under this version records "0.0.9 then <this>"
    and warns; resumed again under this version, its last entry is this version: the record
    stays as it is ("... then <this>" once) and nothing is warned."""
    out, part = _partial(tmp_path)
    with h5py.File(part, "r+") as f:
        f.attrs["package_version"] = "0.0.9"
    with pytest.warns(UserWarning, match=r"under other versions than it was begun with: "
                                         r"galerkin_ext 0\.0\.9 \(now "):
        _writer(out, resume=True).close()
    assert inspect_h5(part)["package_version"] == f"0.0.9 then {__version__}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _writer(out, resume=True).close()
    assert [str(w.message) for w in caught] == []
    assert inspect_h5(part)["package_version"] == f"0.0.9 then {__version__}"


def test_a_resume_whose_copy_fails_leaves_no_rebuilding_file(tmp_path, monkeypatch):
    """A resume copies the completed chunks into '.NAME.partial.rebuilding' beside the partial
    file: interrupted while copying (Ctrl-C), it removes that copy (it would stay on disk, as
    large as the data) and leaves the partial file as it was, to be resumed again."""
    out, part = _partial(tmp_path)

    def interrupted(ds, row):
        raise KeyboardInterrupt

    monkeypatch.setattr(S, "_allocated", interrupted)  # (called while copying each chunk)
    with pytest.raises(KeyboardInterrupt):
        _writer(out, resume=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        part.name]
    w = _writer(out, resume=True)
    assert w.pending_chunks() == [(1, 2, 4)]
    _chunk(w, 1)
    np.testing.assert_array_equal(read_h5(w.finish())["b"], [1.0, 1.0, 2.0, 2.0])


def test_converted_files_with_one_seed_do_not_hold_the_same_draws(tmp_path):
    """Converted files record seed 0 and parameters naming their source: two of them (a
    training and a test set converted from two files) hold different samples, though their
    generator and seed agree; two files of one generator and seed hold the same draws whatever
    their other parameters."""
    sources = [{"source": "continuum-attention Darcy .mat", "sha256": c * 64} for c in "ab"]
    a, b = (S.data_identity(_full(tmp_path, f"{c}.h5", parameters=p))
            for c, p in zip("ab", sources, strict=True))
    assert a["seed"] == b["seed"] == 0 and a["generator"] == b["generator"]
    assert S.same_draws(a, b) is False
    c, d = (S.data_identity(_full(tmp_path, f"{c}.h5", parameters={"k": k}))
            for c, k in (("c", 1), ("d", 2)))
    assert S.same_draws(c, d) is True
