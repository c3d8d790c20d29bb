"""A catalogue of faults a user meets and what the package does about them.

Here: a data generation killed (SIGKILL) or interrupted (SIGINT) at several points of its run
resumes to a file identical to an uninterrupted one, and an interrupt ends with one line.

Elsewhere, one test each (test_catalogue_points_to_existing_tests keeps this list true):

* training killed mid-epoch, resumed to the same numbers:
  test_examples.py::test_resume_after_sigkill_matches_uninterrupted_run
* training interrupted: one line, ``last.pt`` kept:
  test_examples.py::test_ctrl_c_ends_training_with_one_line
* resuming with a setting that changes the model, data or schedule is refused, naming it:
  test_examples.py::test_resume_refuses_changed_settings
* the temporary files a kill leaves are removed on resume:
  test_training.py::test_resume_removes_stray_temporary_files
* a failed write keeps the old file: test_training.py::test_atomic_write_keeps_old_file_on_failure
* a full disk (quota, file-size limit) while saving: an error naming the file, which keeps
  its content: test_training.py::test_a_full_disk_names_the_file_and_keeps_the_old_one
* a checkpoint with a flipped bit, truncated or not ours:
  test_training.py::test_checkpoint_checksum_finds_a_flipped_bit,
  test_training.py::test_corrupt_checkpoint_gives_clear_error
* a data file with a flipped bit (HDF5 checksums), truncated, or of another kind:
  test_data_storage.py::test_checksums_find_a_flipped_bit,
  test_data_storage.py::test_truncated_and_foreign_files_are_rejected,
  test_data_datasets.py::test_datasets_from_generated_files
* a ``.mat`` file that is missing, not MATLAB, or lacks a variable:
  test_data_mat.py::test_missing_keys_and_bad_files
* a partial file a kill left half-written: the resume copies the chunks it can read whole and
  generates the others again:
  test_data_storage.py::test_a_resume_keeps_only_the_chunks_stored_whole,
  test_data_ragged_edges.py::test_a_resume_generates_again_the_chunks_it_cannot_read_whole
* a generation interrupted inside the process, resumed, and refused with other parameters:
  test_data_storage.py::test_resume_after_interruption_gives_the_same_file
* files written with the user's umask: test_training.py::test_written_files_respect_the_umask
* two processes writing one data file (HDF5's locks on or off) or one training folder: the
  second is refused:
  test_data_storage_edges.py::test_a_second_writer_is_refused_with_hdf5_locking_off_too,
  test_training.py::test_a_folder_in_use_by_another_run_is_refused
* bad command lines fail before any work: test_examples.py::test_bad_command_lines_fail_clearly
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from galerkin_ext.data.storage import partial_path, read_h5

TESTS = Path(__file__).resolve().parent
# Small enough for seconds, long enough (per chunk of 2 samples) for kills to land mid-run.
GENERATE = ["generate", "burgers", "--n-samples", "16", "--chunk-size", "2", "--resolution",
            "128", "--solve-resolution", "128", "--n-steps", "400", "--seed", "5",
            "--no-progress"]


def default_sigint() -> None:
    """preexec_fn of a child that a test interrupts: SIGINT as a terminal gives it. A shell
    without job control starts background commands with SIGINT ignored, and Python keeps an
    inherited SIG_IGN (a CI run started that way once saw the interrupts have no effect)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _generate(out: Path, *extra: str) -> subprocess.Popen:
    # One torch thread: two stall 10-50x whenever another process takes a core (as the rest of
    # a parallel test run does), and the arrays do not depend on the thread count.
    return subprocess.Popen([sys.executable, "-m", "galerkin_ext.data", *GENERATE, "--out",
                             str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for(path: Path, proc: subprocess.Popen) -> float:
    """Waits until ``path`` exists (the generation has started its work); returns when."""
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.02)
    return time.monotonic()


def _wait_for_size(path: Path, proc: subprocess.Popen, size: int) -> None:
    """Waits until the partial file ``path`` has grown to ``size`` bytes (HDF5 allocates each
    sample's storage as it is written, so its size measures the work done), or the process
    ended."""
    while proc.poll() is None and (not path.exists() or path.stat().st_size < size):
        time.sleep(0.005)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, float, int, int]:
    """The reference file; when its generation started work (the partial file appeared), in
    seconds from the process's start; the partial file's size then and the final size."""
    out = tmp_path_factory.mktemp("faults") / "reference.h5"
    start = time.monotonic()
    proc = _generate(out)
    working = _wait_for(partial_path(out), proc) - start
    initial = partial_path(out).stat().st_size
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    return out, working, initial, out.stat().st_size


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.9])
def test_generation_stopped_anywhere_resumes_to_the_same_file(uninterrupted, sig, fraction,
                                                              tmp_path):
    """A signal at a point of the work measured by the partial file's growth (so that the
    point does not depend on how busy the machine is): SIGKILL at 20% of the start-up time,
    before the partial file exists, and at 50% and 90% of the data written; SIGINT at 20%,
    50% and 90% of the data written (an interrupt during Python's start-up, before any work,
    shows Python's own traceback). Then a resume: the same arrays as the uninterrupted run,
    and an interrupt ends with one line."""
    reference, working, initial, final = uninterrupted
    out = tmp_path / "data.h5"
    start = time.monotonic()
    proc = _generate(out)
    if sig == signal.SIGKILL and fraction < 0.5:
        time.sleep(max(0.0, start + fraction * working - time.monotonic()))
    else:
        _wait_for_size(partial_path(out), proc, initial + int(fraction * (final - initial)))
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=600)
    if out.is_file():  # finished before the signal came, or while the process ended
        assert fraction >= 0.9 and proc.returncode in (0, 130, -sig), (proc.returncode, stderr)
        if proc.returncode == 130:  # caught after the final rename: says so, no --resume
            assert "was finished; it is complete" in stderr and "--resume" not in stderr
    elif sig == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in stderr, stderr
        assert "interrupted" in stderr and "--resume" in stderr
    else:
        assert proc.returncode == -signal.SIGKILL
    if not out.is_file():
        assert not out.exists()  # never a half-written final file
        resumed = _generate(out, "--resume")
        _, stderr = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, stderr
    assert not partial_path(out).exists()
    a, b = read_h5(reference), read_h5(out)
    for key in ("a", "u"):
        np.testing.assert_array_equal(a[key], b[key])


def test_catalogue_points_to_existing_tests():
    named = re.findall(r"(test_\w+\.py)::(test_\w+)", __doc__)
    assert named
    for file, name in named:
        tree = ast.parse((TESTS / file).read_text())
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert name in functions, f"{file}::{name} is in the catalogue but not in {file}"


@pytest.mark.parametrize("when", ["before_writing", "with_chunks_kept", "after_publishing"])
def test_an_interrupt_says_what_it_left(tmp_path, monkeypatch, capsys, when):
    """The one line an interrupted generation ends with says what is on disk. An --overwrite
    interrupted before its partial file existed was said to have finished (the old file is
    there and no partial one), so the old file passed for the requested one."""
    from galerkin_ext.data import generate
    from galerkin_ext.data.__main__ import main

    out = tmp_path / "data.h5"
    out.write_bytes(b"the old file")

    def interrupted(path, **kwargs):
        if when == "with_chunks_kept":
            partial_path(path).write_bytes(b"chunks")
        if when == "after_publishing":
            new = tmp_path / "new"
            new.write_bytes(b"the new file")
            os.replace(new, path)
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "generate_burgers", interrupted)
    assert main([*GENERATE, "--out", str(out), "--overwrite"]) == 130
    said = capsys.readouterr().err.strip()
    assert said == {
        "before_writing": f"interrupted before anything was written; {out} is unchanged",
        "with_chunks_kept": "interrupted; completed chunks are kept, rerun with --resume to "
                            "continue",
        "after_publishing": f"interrupted after {out} was finished; it is complete",
    }[when]


def test_the_solver_workers_leave_ctrl_c_to_the_parent():
    """A terminal's Ctrl-C reaches every process of its group: a Darcy/GNOT solver worker
    interrupted inside the result queue's lock left the parent waiting for ever (1 Ctrl-C in
    8 hung `generate darcy --workers 2`), and the others printed their tracebacks. The workers
    ignore SIGINT; the parent cancels the pool and keeps the completed chunks."""
    from galerkin_ext.data.darcy import darcy_executor

    with darcy_executor(1) as pool:
        assert pool.submit(signal.getsignal, signal.SIGINT).result(timeout=120) == signal.SIG_IGN
