"""Advisory locks on small sidecar files: one writer per output folder or data file.

HDF5 locks the files it writes, but clusters often switch that off
(``HDF5_USE_FILE_LOCKING=FALSE``, for file systems whose locks fail), and a training folder is
not one file; so the package takes its own ``flock`` on a sidecar file beside what it writes.
The system releases it however the process ends, so a killed run leaves nothing that blocks the
next one.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

# What flock raises on a file system that has no locks (NFS without its lock daemon, Lustre
# mounted without "flock"): the file cannot be locked, which is not another holder.
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP",
                                                                     errno.EOPNOTSUPP)}

# The lock files this process holds open. A forked child (a DataLoader worker) inherits their
# descriptors, and flock holds while any copy is open: a run killed with SIGKILL stayed locked
# until its orphaned workers ended. The children close their copies at once.
_HELD: set[IO[str]] = set()


def _close_inherited() -> None:
    for handle in _HELD:
        handle.close()
    _HELD.clear()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no flock either)
    os.register_at_fork(after_in_child=_close_inherited)


@contextmanager
def file_lock(path: Path, *, wait: bool,
              on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """An advisory lock on the file ``path`` (created if missing) while the block runs,
    released by the system however the process ends. Yields whether it is held: ``False``
    where ``wait`` is off and another process holds it; with ``wait`` on, ``on_wait`` is called
    before waiting for another process's lock. Without ``fcntl`` (Windows) nothing is locked
    and it yields ``True``; so it does, with a ``RuntimeWarning``, on a file system without
    locks."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    try:
        handle = open(path, "a")
    except PermissionError:  # another user's lock file in a shared folder: flock reads only
        if not path.exists():
            raise
        handle = open(path)
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                raise
            warnings.warn(f"{str(path)!r}: this file system cannot lock files "
                          f"({err.strerror}); a second process writing the same output at "
                          "the same time would go undetected", RuntimeWarning, stacklevel=3)
            held = True
        if not held and wait:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
            held = True
        _HELD.add(handle)
        try:
            yield held
        finally:
            _HELD.discard(handle)
