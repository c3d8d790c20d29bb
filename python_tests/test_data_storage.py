"""Generators, HDF5 schema, resume after interruption, corrupt files, command line."""

import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import InterruptAt

from galerkin_ext.data import generate as gen
from galerkin_ext.data.__main__ import main
from galerkin_ext.data.burgers import solve_burgers
from galerkin_ext.data.darcy import solve_darcy
from galerkin_ext.data.datasets import BurgersDataset
from galerkin_ext.data.random_fields import sample_periodic_grf_1d
from galerkin_ext.data.storage import (
    ArraySpec,
    ChunkedWriter,
    DataFileError,
    InterruptedWhenFinished,
    inspect_h5,
    partial_path,
    read_h5,
)

SMALL = {"resolution": 128, "solve_resolution": 64, "n_steps": 50, "progress": False}


def burgers(path, n=10, chunk=4, **kw):
    return gen.generate_burgers(path, n, chunk_size=chunk, **{**SMALL, **kw})


def test_burgers_file_schema_and_content(tmp_path):
    out = burgers(tmp_path / "b.h5", seed=5)
    assert out == tmp_path / "b.h5" and not partial_path(out).exists()
    info = inspect_h5(out)
    assert info["complete"] and info["n_done"] == 10 and info["generator"] == "burgers"
    assert info["seed"] == 5 and info["parameters"]["nu"] == 0.1
    assert info["shapes"] == {"a": (10, 128), "u": (10, 128)}
    with h5py.File(out) as f:
        assert f.attrs["schema"] == "galerkin_ext.data/1"
        assert json.loads(f.attrs["parameters"])["solve_resolution"] == 64
        assert f.attrs["package_version"] == "0.1.0"
        assert f["completed"][...].tolist() == [1, 1, 1]
    data = read_h5(out)
    u0 = sample_periodic_grf_1d(10, 128, seed=5)
    np.testing.assert_array_equal(data["a"], u0)
    np.testing.assert_allclose(
        data["u"], solve_burgers(u0, n_steps=50, solve_resolution=64), atol=1e-15
    )
    sub = read_h5(out, [1, 4, 5], stride=4, keys=("u",))
    np.testing.assert_array_equal(sub["u"], data["u"][[1, 4, 5], ::4])


def test_determinism_independent_of_chunking(tmp_path):
    a = read_h5(burgers(tmp_path / "a.h5", chunk=4))
    b = read_h5(burgers(tmp_path / "b.h5", chunk=3))
    c = read_h5(burgers(tmp_path / "c.h5", chunk=4, seed=1))
    np.testing.assert_array_equal(a["a"], b["a"])
    np.testing.assert_array_equal(a["u"], b["u"])
    assert not np.array_equal(a["a"], c["a"])


def _attrs(path):
    with h5py.File(path) as f:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}


def test_resume_after_interruption_gives_the_same_file(tmp_path, monkeypatch):
    reference = burgers(tmp_path / "ref.h5")
    out = tmp_path / "x.h5"
    monkeypatch.setattr(gen, "solve_burgers", InterruptAt(solve_burgers, 2))
    with pytest.raises(KeyboardInterrupt):
        burgers(out)
    monkeypatch.undo()
    assert not out.exists()
    part = partial_path(out)
    info = inspect_h5(part)
    assert not info["complete"] and info["n_done"] == 4
    with pytest.raises(DataFileError, match="incomplete"):
        read_h5(part)
    with pytest.raises(FileExistsError, match="resume"):
        burgers(out)
    with pytest.raises(DataFileError, match="seed"):
        burgers(out, seed=9, resume=True)
    burgers(out, resume=True)
    assert not part.exists()
    a, b = read_h5(reference), read_h5(out)
    np.testing.assert_array_equal(a["a"], b["a"])
    np.testing.assert_array_equal(a["u"], b["u"])
    assert _attrs(reference) == _attrs(out)


@pytest.mark.parametrize("in_place", [False, True])
def test_a_resume_under_other_versions_warns_and_records_both(tmp_path, monkeypatch, in_place):
    """A file records the versions of the libraries that computed it (Burgers: numpy, torch)
    and of the package. A resumption under others (a partial file begun under torch 2.5.1; a
    record without torch; none, as files made before the record; another package version)
    warns, at the caller, that the samples still to come may differ from an uninterrupted
    run's in their last bits (Burgers' FFTs under torch 2.5.1 and 2.13 differ by up to 7e-18),
    goes on, and records each changed version as "old then new", whether the resumption copies
    the file or, without room for a copy, goes on in place; under the same versions it says
    nothing and records them as they were."""
    import importlib.metadata
    import warnings

    from galerkin_ext.data import storage

    if in_place:
        monkeypatch.setattr(storage, "_room_to_copy", lambda part: False)
    out = tmp_path / "x.h5"
    part = partial_path(out)
    here = {name: importlib.metadata.version(name) for name in ("numpy", "torch")}
    torch_now = re.escape(here["torch"])
    # (another torch than the one running: 2.5.1 was, on the oldest torch the package admits)
    other = "2.5.0" if here["torch"] == "2.5.1" else "2.5.1"
    cases = [  # (the partial file's record: key -> value or None to delete; warned; recorded)
        ({"library_versions": json.dumps({**here, "torch": other})},
         rf"torch {re.escape(other)} \(now {torch_now}\)",
         {**here, "torch": f"{other} then {here['torch']}"}),
        ({"library_versions": json.dumps({"numpy": here["numpy"]})},
         rf"torch unrecorded \(now {torch_now}\)",
         {**here, "torch": f"unrecorded then {here['torch']}"}),
        ({"library_versions": None}, "numpy unrecorded",
         {name: f"unrecorded then {v}" for name, v in here.items()}),
        ({"package_version": "0.0.9"}, r"galerkin_ext 0\.0\.9 \(now 0\.1\.0\)", here),
        ({}, None, here),
    ]
    for changes, warned, recorded in cases:
        monkeypatch.setattr(gen, "solve_burgers", InterruptAt(solve_burgers, 2))
        with pytest.raises(KeyboardInterrupt):
            burgers(out, n=4, chunk=2, overwrite=True)
        monkeypatch.setattr(gen, "solve_burgers", solve_burgers)
        assert inspect_h5(part)["library_versions"] == here
        with h5py.File(part, "r+") as f:
            for key, value in changes.items():
                if value is None:
                    del f.attrs[key]
                else:
                    f.attrs[key] = value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            burgers(out, n=4, chunk=2, resume=True)
        messages = [str(w.message) for w in caught]
        if warned is None:
            assert not messages
        else:
            assert len(messages) == 1 and re.match(
                f"resuming .* under other versions than it was begun with: .*{warned}.*; the "
                "samples still to come may differ", messages[0]), messages
            assert caught[0].filename == __file__  # the caller's line, not the package's
        info = inspect_h5(out)
        assert info["complete"] and info["library_versions"] == recorded
        package = "0.0.9 then 0.1.0" if "package_version" in changes else "0.1.0"
        assert info["package_version"] == package


class _Dying:
    """An object whose weakref callback runs when the test drops it."""


def test_an_interrupt_swallowed_by_a_callback_still_stops_the_generation(tmp_path, monkeypatch,
                                                                         request, capfd):
    """Python only prints a KeyboardInterrupt raised inside a weakref callback or a __del__;
    one that landed there once let a generation run to its end. It stops at the chunk's end."""
    import signal

    # Python's own handler, as a terminal's shell gives it (a background job inherits SIG_IGN)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    calls = {"n": 0}

    def swallowed(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second chunk (one call per chunk): Ctrl-C in a clean-up
            ref = weakref.ref(dying := _Dying(), lambda _: signal.raise_signal(signal.SIGINT))
            del dying
            assert ref() is None
        return solve_burgers(*args, **kwargs)

    out = tmp_path / "x.h5"
    monkeypatch.setattr(gen, "solve_burgers", swallowed)
    with pytest.raises(KeyboardInterrupt):
        burgers(out)
    assert calls["n"] == 2 and inspect_h5(partial_path(out))["n_done"] == 8
    assert "Exception ignored" not in capfd.readouterr().err  # one line from the CLI, no more
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupted_overwrite_is_resumed(tmp_path, monkeypatch, capsys):
    """An interrupted --overwrite leaves the old file and the new run's partial one: the CLI
    said the file was complete (it was the old one), and --resume refused the finished file."""
    out = burgers(tmp_path / "b.h5", n=2, chunk=2)
    monkeypatch.setattr(gen, "solve_burgers", InterruptAt(solve_burgers, 2))
    command = ["generate", "burgers", "--out", str(out), "--n-samples", "10", "--chunk-size",
               "4", "--resolution", str(SMALL["resolution"]), "--solve-resolution",
               str(SMALL["solve_resolution"]), "--n-steps", str(SMALL["n_steps"]),
               "--no-progress"]
    assert main([*command, "--overwrite"]) == 130
    assert "rerun with --resume" in capsys.readouterr().err
    assert inspect_h5(out)["n_samples"] == 2 and partial_path(out).exists()
    monkeypatch.setattr(gen, "solve_burgers", solve_burgers)
    assert main([*command, "--resume"]) == 0
    assert inspect_h5(out)["n_samples"] == 10 and not partial_path(out).exists()
    reference = burgers(tmp_path / "r.h5", n=10)
    np.testing.assert_array_equal(read_h5(reference)["u"], read_h5(out)["u"])


def test_existing_file_and_bad_paths(tmp_path):
    out = burgers(tmp_path / "b.h5", n=2, chunk=2)
    with pytest.raises(FileExistsError, match="overwrite"):
        burgers(out, n=2)
    with pytest.raises(FileExistsError, match="nothing to resume"):
        burgers(out, n=2, resume=True)
    burgers(out, n=3, chunk=2, overwrite=True)
    assert inspect_h5(out)["n_samples"] == 3
    with pytest.raises(FileNotFoundError, match="does not exist"):
        burgers(tmp_path / "missing" / "b.h5")
    with pytest.raises(ValueError, match=".h5"):
        burgers(tmp_path / "b.txt")
    with pytest.raises(ValueError, match="mutually exclusive"):
        burgers(tmp_path / "c.h5", resume=True, overwrite=True)


@pytest.mark.parametrize(
    ("make", "kwargs", "err", "match"),
    [
        # overwrite=1 replaced an existing file, resume="no" was taken as true
        (burgers, {"overwrite": 1}, TypeError, "overwrite: expected a bool"),
        (burgers, {"resume": "no"}, TypeError, "resume: expected a bool"),
        (burgers, {"progress": None}, TypeError, "progress: expected a bool"),
        # f=True and f="2" were taken as numbers by float(f)
        (gen.generate_darcy, {"f": True}, TypeError, "f: expected a finite float"),
        (gen.generate_darcy, {"f": "2"}, TypeError, "f: expected a finite float"),
        (gen.generate_darcy, {"f": 0.0}, ValueError, "f: expected a non-zero forcing"),
    ],
)
def test_bad_generator_flags_are_refused_before_any_work(tmp_path, make, kwargs, err, match):
    out = tmp_path / "x.h5"
    with pytest.raises(err, match=match):
        make(out, 2, **kwargs)
    assert not out.exists() and not partial_path(out).exists()


def test_dir_named_like_output(tmp_path):
    (tmp_path / "dir.h5").mkdir()
    with pytest.raises(ValueError, match="directory"):
        burgers(tmp_path / "dir.h5")


def test_checksums_find_a_flipped_bit(tmp_path):
    out = burgers(tmp_path / "b.h5")
    with h5py.File(out) as f:
        assert f["a"].fletcher32 and f["u"].fletcher32
        offset = f["u"].id.get_chunk_info(3).byte_offset  # sample 3 of u
    data = bytearray(out.read_bytes())
    data[offset + 100] ^= 0x10
    out.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match=r"b\.h5': array 'u' is corrupt"):
        read_h5(out)
    with pytest.raises(DataFileError, match="corrupt"):
        BurgersDataset(out, "train", 64, n_train=6, n_test=2)
    np.testing.assert_array_equal(read_h5(out, [0, 1, 2], keys=("u",))["u"].shape, (3, 128))


def test_checksums_cover_the_shared_arrays_and_the_bookkeeping(tmp_path):
    """The sample times of an ODE file were read back with a flipped bit, silently."""
    out = gen.generate_lorenz63(tmp_path / "l.h5", 4, dt=0.05, progress=False)
    with h5py.File(out) as f:
        assert all(f[k].fletcher32 for k in ("coords", "completed", "statistics"))
        offset = f["coords"].id.get_chunk_info(0).byte_offset
    data = bytearray(out.read_bytes())
    data[offset + 12] ^= 0x40
    out.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match=r"l\.h5': array 'coords' is corrupt"):
        read_h5(out, keys=("coords",))


def test_no_indices_read_no_samples(tmp_path):
    out = burgers(tmp_path / "b.h5", n=2, chunk=2)
    assert read_h5(out, [])["u"].shape == (0, 128)  # it was refused, unlike read_ragged's


def test_a_set_larger_than_the_disk_is_refused_up_front(tmp_path):
    """It ended in a MemoryError traceback and left a partial file that blocked the next run."""
    out = tmp_path / "huge.h5"
    with pytest.raises(DataFileError, match=r"huge\.h5\.partial'?: storing its 100000000000 "
                                            r"samples needs about .* MiB with a margin for "
                                            r"HDF5's records, and .* has .* MiB free; make "
                                            r"room, or ask for fewer"):
        gen.generate_lorenz63(out, 10**11, chunk_size=1, progress=False)
    assert not out.exists() and not partial_path(out).exists()


def test_truncated_and_foreign_files_are_rejected(tmp_path):
    out = burgers(tmp_path / "b.h5", n=8)
    size = os.path.getsize(out)
    with open(out, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(DataFileError, match="corrupt or truncated"):
        read_h5(out)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(DataFileError, match="corrupt or truncated"):
        inspect_h5(junk)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["a"] = np.zeros(3)
    with pytest.raises(DataFileError, match="not a galerkin_ext data file"):
        read_h5(other)
    with pytest.raises(DataFileError, match="does not exist"):
        read_h5(tmp_path / "nope.h5")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        # each used to be read as if nothing were wrong
        (lambda f: f.attrs.__setitem__("n_samples", 10), "do not match its completed-chunk"),
        (lambda f: f.attrs.__setitem__("chunk_size", 0), "do not match its completed-chunk"),
        (lambda f: (f.__delitem__("completed"), f.create_dataset("completed", data=[1])),
         "do not match its completed-chunk"),
        (lambda f: (f.__delitem__("u"), f.create_dataset("u", data=np.zeros((2, 128)))),
         r"array 'u' has shape \(2, 128\), not 4 samples"),
        (lambda f: f["u"].attrs.__setitem__("grid_ndim", 9), "records grid_ndim = 9"),
        (lambda f: f["u"].attrs.__setitem__("grid_ndim", "x"), "records grid_ndim = 'x'"),
    ],
)
def test_inconsistent_records_are_damaged_files(tmp_path, edit, match):
    out = burgers(tmp_path / "b.h5", n=4, chunk=2)
    with h5py.File(out, "r+") as f:
        edit(f)
    with pytest.raises(DataFileError, match=match):
        read_h5(out)


def test_read_h5_arguments(tmp_path):
    out = burgers(tmp_path / "b.h5", n=4, chunk=2)
    for kwargs, err, match in (
        ({"block": -1}, ValueError, "block: expected an int >= 1"),  # read nothing, silently
        ({"block": True}, TypeError, "block"),
        ({"keys": "au"}, TypeError, "keys: expected a sequence of names"),
        ({"indices": slice(None, None, -1)}, ValueError, "indices: expected a slice with a "
         "positive step"),
        ({"stride": 0}, ValueError, "stride"),
    ):
        with pytest.raises(err, match=match):
            read_h5(out, **kwargs)
    with pytest.raises(TypeError, match="path: expected a path"):
        read_h5(123)
    assert read_h5(out, slice(1, None, 2), keys=["u"])["u"].shape == (2, 128)


def _writer(path, **kw):
    return ChunkedWriter.open(path, **{"generator": "toy", "parameters": {}, "seed": 0,
                                       "n_samples": 4, "chunk_size": 2,
                                       "arrays": {"a": ArraySpec((3,), "f8"),
                                                  "b": ArraySpec((), "f8")}, **kw})


def test_a_generation_in_progress_elsewhere_is_named(tmp_path):
    """A second generation into a file another process is writing was told of an
    "interrupted generation" (and --overwrite then unlinked the live one's partial file), or,
    resuming, that the file was corrupt."""
    import subprocess
    import sys

    part = partial_path(tmp_path / "d.h5")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import h5py, sys, time; f = h5py.File(sys.argv[1], 'w'); "
         "print('open', flush=True); time.sleep(60)", str(part)],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert holder.stdout.readline().strip() == "open"
        for flags in ({}, {"overwrite": True}, {"resume": True}):
            with pytest.raises(FileExistsError, match="is being written by another process"):
                _writer(tmp_path / "d.h5", **flags)
        assert part.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_file_whose_data_writes_were_lost_is_not_published(tmp_path):
    """On a full disk HDF5 reports refused writes only while closing, and h5py drops that: the
    file was published complete with zeros (the fill value) for the lost chunks, which no
    checksum covers. Here the chunks' flags are set without their data."""
    w = _writer(tmp_path / "w.h5")
    w.file["completed"][...] = 1
    with pytest.raises(DataFileError, match=r"data sets \['a', 'b'\] were not all written"):
        w.finish()
    assert not (tmp_path / "w.h5").exists() and partial_path(tmp_path / "w.h5").exists()


def test_chunked_writer_refuses_what_it_would_store_wrongly(tmp_path):
    w = _writer(tmp_path / "w.h5")
    try:
        for chunk, arrays, match in (
            # a chunk marked completed without its data was published as zeros
            (0, {}, r"arrays: expected the per-sample arrays \['a', 'b'\]"),
            (0, {"a": np.ones((2, 3))}, "arrays: expected"),
            (0, {"a": np.ones((2, 3)), "b": np.ones(2), "c": np.ones(2)}, "arrays: expected"),
            (True, {"a": np.ones((2, 3)), "b": np.ones(2)}, r"chunk: expected an int in \[0, 2\)"),
            (2, {"a": np.ones((2, 3)), "b": np.ones(2)}, "chunk: expected"),
            (-1, {"a": np.ones((2, 3)), "b": np.ones(2)}, "chunk: expected"),
            (1, {"a": np.ones((2, 4)), "b": np.ones(2)},
             r"chunk 1's 'a' must have shape \(2, 3\) \(samples 2 to 3\), got \(2, 4\)"),
        ):
            with pytest.raises(ValueError, match=match):
                w.write_chunk(chunk, arrays)
        assert [c for c, _, _ in w.pending_chunks()] == [0, 1]
    finally:
        w.close()


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"n_samples": -3}, ValueError, "n_samples: expected an int >= 1"),
        ({"chunk_size": 0}, ValueError, "chunk_size: expected an int >= 1"),
        ({"seed": 1.5}, TypeError, "seed"),
        ({"arrays": {}}, ValueError, "arrays: expected at least one"),
        # h5py refuses the dtype only once the partial file exists: it used to stay, blocking
        # the next run with "an interrupted generation exists"
        ({"arrays": {"a": ArraySpec((3,), "no-such-dtype")}}, TypeError, "no-such-dtype"),
    ],
)
def test_chunked_writer_open_checks_and_leaves_no_partial_file(tmp_path, kwargs, err, match):
    out = tmp_path / "w.h5"
    with pytest.raises(err, match=match):
        _writer(out, **kwargs)
    assert not partial_path(out).exists()
    _writer(out).close()  # the next run is not blocked


def test_darcy_generation_with_workers(tmp_path):
    out = gen.generate_darcy(tmp_path / "d.h5", 5, 17, seed=2, chunk_size=2, workers=2,
                             progress=False)
    serial = gen.generate_darcy(tmp_path / "s.h5", 5, 17, seed=2, chunk_size=5, workers=1,
                                progress=False)
    d, s = read_h5(out), read_h5(serial)
    assert d["a"].dtype == np.float32 and d["u"].dtype == np.float64
    np.testing.assert_array_equal(d["a"], s["a"])
    np.testing.assert_array_equal(d["u"], s["u"])
    assert set(np.unique(d["a"])) <= {3.0, 12.0}
    np.testing.assert_allclose(d["u"], solve_darcy(d["a"].astype(np.float64), workers=1),
                               rtol=0, atol=1e-15)
    assert inspect_h5(out)["parameters"]["resolution"] == 17


def test_cli_generate_info_and_errors(tmp_path, capsys):
    out = tmp_path / "c.h5"
    args = ["generate", "burgers", "--n-samples", "3", "--resolution", "64",
            "--solve-resolution", "64", "--n-steps", "20", "--seed", "4", "--out", str(out)]
    assert main(args + ["--no-progress"]) == 0
    assert inspect_h5(out)["seed"] == 4
    assert main(args + ["--no-progress"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--no-progress", "--overwrite"]) == 0
    assert main(["info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.split("wrote")[-1].split("\n", 1)[1])["n_done"] == 3
    # a reader that closes the pipe early (| head -1): no BrokenPipeError traceback
    proc = subprocess.Popen([sys.executable, "-m", "galerkin_ext.data", "info", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0 and b"Traceback" not in proc.stderr.read()
    # the command line makes a missing folder (the README's data/ of a fresh clone), as the
    # training scripts make theirs; one it cannot make is named
    made = tmp_path / "new" / "deeper" / "b.h5"
    assert main(args[:-1] + [str(made), "--no-progress"]) == 0
    assert inspect_h5(made)["n_done"] == 3
    assert main(args[:-1] + [str(out / "x.h5"), "--no-progress"]) == 1
    assert f"error: out: cannot create the folder {str(out)!r}" in capsys.readouterr().err
    (tmp_path / "bad.h5").write_bytes(b"\0" * 100)
    assert main(["info", str(tmp_path / "bad.h5")]) == 1
    assert "corrupt" in capsys.readouterr().err
    # info prints strict JSON: a non-finite statistic (a file of diverged data, written before
    # the solvers refused them) is null, not NaN, which jq and other strict parsers reject
    import galerkin_ext.data.storage as storage

    real = storage.inspect_h5
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(storage, "inspect_h5", lambda path: {
            **real(path), "statistics": {"u": {"mean": float("nan"), "max": float("inf")}}})
        assert main(["info", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert printed["statistics"]["u"] == {"mean": None, "max": None} and printed["n_done"] == 3
    # burgers solves on at most its stored grid (the default 1024 is cut to it silently)
    with pytest.raises(SystemExit):
        main([*args, "--solve-resolution", "128"])
    assert "--solve-resolution: expected at most --resolution = 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "burgers", "--out", str(out), "--n-samples", "0"])
    with pytest.raises(SystemExit):
        main(["generate", "burgers", "--out", str(out), "--resume", "--overwrite"])
    # a seed the file cannot store (its attribute is 64 bits) is refused by name: it was
    # "Object dtype dtype('O') has no native HDF5 equivalent"
    with pytest.raises(SystemExit):
        main(["generate", "burgers", "--out", str(tmp_path / "s.h5"), "--seed", str(2**64)])
    assert "argument --seed: expected an int >= 0 and < 2**64" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^seed: expected an int >= 0 and < 2\*\*64"):
        gen.generate_burgers(tmp_path / "s.h5", n_samples=1, resolution=64, seed=2**64)
    assert not list(tmp_path.glob("s.h5*"))
    # an option the problem's generator does not take is refused, never silently ignored
    for problem, option in (("darcy", "--solve-resolution=32"), ("darcy", "--n-steps=5"),
                            ("darcy", "--device=cpu"), ("burgers", "--workers=7")):
        with pytest.raises(SystemExit):
            main(["generate", problem, "--out", str(tmp_path / "x.h5"), option])
        assert f"{option.split('=')[0]} does not apply to {problem}" in capsys.readouterr().err
    # a device that cannot be used fails before the partial file exists (it would block a rerun)
    fresh = tmp_path / "dev.h5"
    bad_devices = ["foo"] + ([] if torch.cuda.is_available() else ["cuda"])
    for device in bad_devices:
        assert main([*args[:-1], str(fresh), "--no-progress", "--device", device]) == 1
        assert "device:" in capsys.readouterr().err
        assert not fresh.exists() and not partial_path(fresh).exists()


def test_cli_interrupt_after_the_file_is_finished(tmp_path, capsys, monkeypatch):
    """Ctrl-C that lands after the final rename (the race the fault tests can hit) says the
    file is complete instead of pointing to --resume, which would have nothing to do."""
    import galerkin_ext.data.generate as generate

    def finished_then_interrupted(out, **kwargs):
        Path(out).write_bytes(b"done")
        raise InterruptedWhenFinished

    monkeypatch.setattr(generate, "generate_burgers", finished_then_interrupted)
    out = tmp_path / "b.h5"
    assert main(["generate", "burgers", "--out", str(out), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert f"interrupted after {out} was finished" in err and "--resume" not in err


def test_a_disk_filling_up_mid_run_stops_before_hdf5_fails(tmp_path, monkeypatch):
    """A write that fails inside HDF5 leaves the partial file unreadable (and HDF5 2.0 crashes
    the process on closing it); a disk that fills up mid-run is therefore found before each
    chunk, and the generation resumes once there is room."""
    import shutil
    from collections import namedtuple

    usage = shutil.disk_usage
    calls = []

    def filling(path):  # room for the whole set at the start, none from the third chunk on
        calls.append(path)  # (1: the whole set; 2: creating the partial file; 3-: the chunks)
        total, used, free = usage(path)
        return namedtuple("usage", "total used free")(total, used, free if len(calls) < 5
                                                      else 1000)

    monkeypatch.setattr(shutil, "disk_usage", filling)
    out = tmp_path / "b.h5"
    with pytest.raises(DataFileError, match=r"b\.h5\.partial'?: storing samples 8 to 9 needs "
                                            r"about 0\.2\d+ MiB with a margin for HDF5's "
                                            r"records, and .* has 0\.000954 MiB free; "
                                            r"make room, then resume=True \(--resume\) "
                                            r"continues from the samples stored so far"):
        burgers(out)
    monkeypatch.setattr(shutil, "disk_usage", usage)
    assert burgers(out, resume=True) == out
    reference = burgers(tmp_path / "reference.h5")
    for key in ("a", "u"):
        np.testing.assert_array_equal(read_h5(out)[key], read_h5(reference)[key])


def test_a_set_beyond_the_file_size_limit_is_refused_up_front(tmp_path):
    """``ulimit -f``: one line naming the limit, exit status 1 (it was a crash, exit 139, with
    pages of tracebacks from HDF5), before any work; a ragged set, whose size is not known
    beforehand, stops before the chunk that does not fit (test_data_ragged_edges.py)."""
    import resource

    out = tmp_path / "b.h5"
    command = [sys.executable, "-m", "galerkin_ext.data", "generate", "burgers", "--out",
               str(out), "--n-samples", "80", "--chunk-size", "4", "--resolution", "2048",
               "--solve-resolution", "64", "--n-steps", "50", "--no-progress"]

    def limit():  # 2 MiB, for 2.5 MiB of samples
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, resource.RLIM_INFINITY))

    run = subprocess.run(command, preexec_fn=limit, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1, run.stderr
    assert "b.h5.partial': storing its 80 samples needs about 2.75 MiB with a margin for HDF5's " \
           "records, and the file-size limit (ulimit -f) of 2 MiB leaves 2 MiB; raise it, or " \
           "ask for fewer" in run.stderr
    assert not partial_path(out).exists()


def test_a_file_size_limit_takes_the_samples_and_a_margin_not_twice_them(tmp_path):
    """The room checks asked for twice each chunk's bytes and 1 MiB: a 1 MiB set was refused
    under a 2 MiB limit, and could not be finished there. Now a set finishes under a limit of
    its size and a quarter MiB (and a little), and one that cannot start under a tiny limit
    leaves no partial file (it had left an unreadable one, which blocked the next run)."""
    import resource

    command = [sys.executable, "-m", "galerkin_ext.data", "generate", "burgers",
               "--n-samples", "16", "--chunk-size", "4", "--resolution", "4096",
               "--solve-resolution", "64", "--n-steps", "50", "--no-progress", "--out"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    free = subprocess.run([*command, str(tmp_path / "free.h5")], capture_output=True,
                          text=True, env=env)
    assert free.returncode == 0, free.stderr
    size = (tmp_path / "free.h5").stat().st_size  # 1 MiB of samples
    for limit, out in ((size + (3 << 20) // 8, "a.h5"), (1 << 10, "b.h5")):
        def limited(limit=limit):
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

        run = subprocess.run([*command, str(tmp_path / out)], preexec_fn=limited,
                             capture_output=True, text=True, env=env)
        if limit > size:
            assert run.returncode == 0, run.stderr
            assert inspect_h5(tmp_path / out)["n_done"] == 16
        else:
            assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
            assert "b.h5.partial': storing its 16 samples needs about" in run.stderr
            assert not partial_path(tmp_path / out).exists()


def test_a_partial_file_that_cannot_be_created_is_not_left(tmp_path, monkeypatch):
    """What the room checks cannot see (a quota, permissions): h5py's error while creating the
    partial file left it behind, unreadable, so that every later run was refused."""
    from galerkin_ext.data import storage

    def failing(f, *args):
        raise OSError("Unable to synchronously create dataset (file write failed)")

    monkeypatch.setattr(storage, "_create_chunked",
                        lambda path, *args: storage._new_partial_file(path, {}, 1, 1, failing))
    out = tmp_path / "b.h5"
    with pytest.raises(DataFileError, match=r"b\.h5\.partial'?: creating it failed \(a full "
                                            r"disk, a file-size limit or no permission\?\): "
                                            r"Unable to synchronously create"):
        burgers(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.h5.writer.lock"]
    monkeypatch.undo()
    assert burgers(out) == out


def test_running_out_of_memory_names_the_samples_and_the_chunk_size(tmp_path, monkeypatch):
    """torch's allocator failing inside a solver was a raw traceback from deep inside it."""
    from galerkin_ext.data import generate

    def exhausted(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 33562624 bytes.")

    monkeypatch.setattr(generate, "solve_burgers", exhausted)
    with pytest.raises(DataFileError, match=r"b\.h5\.partial'?: computing samples 0 to 3 ran "
                                            r"out of memory \(RuntimeError: .*can't allocate "
                                            r"memory.*\); the samples stored so far are kept: "
                                            r".* with a smaller chunk_size \(--chunk-size\)"):
        burgers(tmp_path / "b.h5")


def test_an_hdf5_write_error_names_the_file_and_what_to_do(tmp_path, monkeypatch):
    """What the room checks cannot see (a quota, an I/O error): h5py's raw RuntimeError from
    a flush, then a second one from closing, became one error that names the file."""
    def failing(self, chunk, arrays, statistics=None):
        raise RuntimeError("Unable to synchronously flush file (errno = 122, Disk quota "
                           "exceeded)")

    monkeypatch.setattr(ChunkedWriter, "write_chunk", failing)
    out = tmp_path / "b.h5"
    with pytest.raises(DataFileError, match=r"b\.h5\.partial'?: storing samples 0 to 3 failed "
                                            r"\(a full disk or a file-size limit\?\): Unable "
                                            r".*Disk quota exceeded\)\. The partial file is "
                                            r"kept; once there is room, resume=True"):
        burgers(out)
    monkeypatch.undo()
    assert burgers(out, resume=True) == out  # closed, and its lock released


def test_a_folder_made_read_only_during_a_generation_is_not_called_full(tmp_path, monkeypatch):
    """Publishing into a folder made read-only meanwhile was put down to a full disk."""
    import errno

    from galerkin_ext.data import storage

    def refused(file, path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(storage, "publish", refused)
    with pytest.raises(DataFileError, match=r"storing the last chunks failed \(no permission to "
                                            r"write there\?\): .*Permission denied.*; once it is "
                                            r"writable, resume=True"):
        burgers(tmp_path / "b.h5")


def test_a_refusal_to_publish_reaches_the_user_as_it_is(tmp_path, monkeypatch):
    """The package's own error while publishing is not wrapped in the one for HDF5's errors."""
    from galerkin_ext.data import storage

    monkeypatch.setattr(storage, "_unwritten_datasets", lambda path: ["u"])
    with pytest.raises(DataFileError, match=r"^'.*b\.h5\.partial': data sets \['u'\] were not "
                                            "all written"):
        burgers(tmp_path / "b.h5")


def test_a_resume_keeps_only_the_chunks_stored_whole(tmp_path, monkeypatch):
    """HDF5 is not crash-safe: a process killed while it wrote (SIGKILL, the OOM killer) can
    leave records half-written, and writing into such a file failed ("addr overflow") or
    crashed the resumed process. A resume copies the completed chunks into a new file, and
    generates again a chunk whose data HDF5 lost (it reads them as zeros, silently) or whose
    checksum fails."""
    out = tmp_path / "b.h5"
    monkeypatch.setattr(gen, "solve_burgers", InterruptAt(solve_burgers, 3))
    with pytest.raises(KeyboardInterrupt):
        burgers(out)  # chunks 0 and 1 (samples 0 to 7) stored
    monkeypatch.undo()
    part = partial_path(out)
    with h5py.File(part, "r+") as f:
        f["completed"][2] = 1  # marked, its data never written
        where = f["u"].id.get_chunk_info_by_coord((5, 0)).byte_offset  # sample 5's data
    data = bytearray(part.read_bytes())
    data[where + 8] ^= 0x10
    part.write_bytes(bytes(data))
    assert burgers(out, resume=True) == out
    reference = burgers(tmp_path / "reference.h5")
    for key in ("a", "u"):
        np.testing.assert_array_equal(read_h5(out)[key], read_h5(reference)[key])
    assert inspect_h5(out)["statistics"] == inspect_h5(reference)["statistics"]


def test_without_room_for_a_copy_a_resume_goes_on_in_place(tmp_path, monkeypatch):
    """(A copied file is a new one: os.replace gives it another inode.)"""
    import shutil
    from collections import namedtuple

    out = tmp_path / "b.h5"
    monkeypatch.setattr(gen, "solve_burgers", InterruptAt(solve_burgers, 3))
    with pytest.raises(KeyboardInterrupt):
        burgers(out)
    monkeypatch.undo()
    part = partial_path(out)
    inode = part.stat().st_ino
    free = (1 << 20) + part.stat().st_size  # room for a chunk (8 KiB), not for a copy
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: namedtuple("usage", "total used free")(1 << 30, 0, free))
    assert burgers(out, resume=True) == out
    assert out.stat().st_ino == inode  # the same file, written on and published
    reference = burgers(tmp_path / "reference.h5")
    for key in ("a", "u"):
        np.testing.assert_array_equal(read_h5(out)[key], read_h5(reference)[key])
