"""The advisory sidecar locks (_locks.file_lock) that keep a second writer out of a training
folder or a data file: held, refused, waited for, and what happens where nothing can lock."""

import errno
import fcntl
import sys
import threading

import pytest

from galerkin_ext._locks import file_lock


def test_file_lock_without_fcntl_locks_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)  # as on Windows: the import fails
    with file_lock(tmp_path / ".lock", wait=False) as held:
        assert held is True
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("callback", [True, False])
def test_file_lock_waits_for_another_holder(tmp_path, callback):
    path = tmp_path / ".lock"
    other = open(path, "a")  # another open file description: flock treats it as another holder
    fcntl.flock(other, fcntl.LOCK_EX)
    with file_lock(path, wait=False) as held:
        assert held is False
    calls = []
    released = threading.Event()

    def let_go():
        released.set()
        fcntl.flock(other, fcntl.LOCK_UN)

    release = threading.Timer(0.2, let_go)
    release.start()
    try:
        on_wait = (lambda: calls.append(released.is_set())) if callback else None
        with file_lock(path, wait=True, on_wait=on_wait) as held:
            assert held is True and released.is_set()  # only once the other holder let go
    finally:
        release.join()
        other.close()
    assert calls == ([False] if callback else [])


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_warns_and_goes_on(tmp_path, monkeypatch, code):
    """NFS without its lock daemon, Lustre without "flock": the run goes on (as HDF5 does with
    its locking off), but says what it cannot guard against."""
    def refuse(handle, operation):
        raise OSError(code, "no locks here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.warns(RuntimeWarning, match=r"\.lock'?: this file system cannot lock files "
                                            r"\(no locks here\); a second process"):
        with file_lock(tmp_path / ".lock", wait=False) as held:
            assert held is True


def test_other_lock_errors_are_raised(tmp_path, monkeypatch):
    def refuse(handle, operation):
        raise OSError(errno.EIO, "input/output error")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(OSError, match="input/output error"):
        with file_lock(tmp_path / ".lock", wait=False):
            pass


def test_another_users_lock_file_is_locked_read_only(tmp_path, monkeypatch):
    """A folder shared by a group: the lock file another user created is not writable here,
    and flock needs no write access."""
    from galerkin_ext import _locks

    path = tmp_path / ".lock"
    path.touch()
    modes = []

    def open_read_only(file, mode="r"):
        modes.append(mode)
        if mode != "r":
            raise PermissionError(13, "Permission denied", str(file))
        return open(file, mode)

    monkeypatch.setattr(_locks, "open", open_read_only, raising=False)
    other = open(path)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with file_lock(path, wait=False) as held:
            assert held is False
    finally:
        other.close()
    with file_lock(path, wait=False) as held:
        assert held is True
    assert modes == ["a", "r", "a", "r"]
    path.unlink()
    with pytest.raises(PermissionError):  # a folder not writable at all is the caller's error
        with file_lock(path, wait=False):
            pass


def _sleep(started, seconds):
    import time

    started.set()  # (after os.fork's callbacks)
    time.sleep(seconds)


# It forks on purpose, as a DataLoader does; the child only sleeps (Python 3.12+ warns of
# forking a multi-threaded process).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork")
def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    """A DataLoader worker is a forked child: it inherited the lock's descriptor, and a run
    killed with SIGKILL stayed locked (a --resume refused) until its orphaned workers ended."""
    import multiprocessing

    path = tmp_path / ".lock"
    fork = multiprocessing.get_context("fork")
    started = fork.Event()
    with file_lock(path, wait=False) as held:
        assert held
        child = fork.Process(target=_sleep, args=(started, 30))
        child.start()
        assert started.wait(30)
    try:
        with file_lock(path, wait=False) as held:  # the child lives on, the lock is free
            assert held is True
    finally:
        child.kill()
        child.join()
