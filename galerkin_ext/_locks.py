"""Advisory locks on small sidecar files: one writer per output folder or data file.

HDF5 locks the files it writes, but clusters often switch that off
(``HDF5_USE_FILE_LOCKING=FALSE``, for file systems whose locks fail), and a training folder is
not one file; so the package takes its own ``flock`` on a sidecar file beside what it writes.
The system releases it however the process ends, so a killed run leaves nothing that blocks the
next one.
"""

from __future__ import annotations

import errno
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# What flock raises on a file system that has no locks (NFS without its lock daemon, Lustre
# mounted without "flock"): the file cannot be locked, which is not another holder.
_NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP",
                                                                     errno.EOPNOTSUPP)}


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
        yield held
