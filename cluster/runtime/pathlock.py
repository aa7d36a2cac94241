"""A lock that deleting a file cannot defeat: ``flock`` on a directory and on a lock file.

A plain lock file (:func:`cluster.runtime.fsutil.flocked`) belongs to its inode: if someone
deletes it while it is held, the next locker creates a new file of the same name, locks that
one at once, and two writers run side by side (a queue line appended meanwhile is lost).
:func:`locked` closes that hole.  It takes, in this order:

1. ``flock`` on the lock file's **directory**.  A directory that holds files cannot be
   removed (``rmdir`` fails, and ``rm`` does not remove directories), so no deletion of a
   file gives a second locker a fresh lock.  Every lock file of one directory shares this
   lock: holding two of them at once in one process would deadlock, so never nest two
   :func:`locked` blocks on files of the same directory; :func:`locked_together` holds
   several of them at once.
2. ``flock`` on the lock file itself, opened without following a symlink, checked after the
   lock is granted to still be the file at that path (else reopened, at most
   :data:`MAX_REOPEN` times).  On a local file system step 1 alone would do; the file lock
   keeps the old contract where a file system refuses to lock a directory (NFS refuses an
   exclusive ``flock`` on a descriptor opened read-only, and a directory can only be opened
   so): there the directory lock is skipped and the lock is as strong as a lock file is.

Both are released when the block ends (the descriptors are closed) or the process dies.
The lock file is created if missing (mode ``file_mode``) and never written or unlinked.

Usage::

    with locked(home / "queue.lck"):             # exclusive, waits as long as it takes
        ...
    with locked(lock, shared=True, timeout=60):  # LockTimeout after 60 s
        ...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from cluster.errors import ClusterError

log = logging.getLogger("cluster.lock")

#: How many times a lock file replaced between our open and our lock is reopened before
#: giving up: each retry means another process replaced the file meanwhile, which a
#: well-behaved process never does; a few in a row mean something is looping on it.
MAX_REOPEN = 50
#: Between two tries of a lock taken with a timeout [s].
POLL = 0.05
#: errno values meaning "this file system does not lock directories" (or not for us): the
#: directory lock is skipped, the lock file still holds.
_NO_DIRECTORY_LOCK = (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP,
                      errno.EACCES, errno.EPERM)


class LockTimeout(ClusterError):
    """A lock was not granted within its timeout."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(str(path), timeout)
        self.path = path
        self.timeout = timeout

    def __str__(self) -> str:
        return (f"lock {self.path} is still held by another process after {self.timeout:g} s; "
                "expected it to be released sooner")


def _flock(fd: int, shared: bool, deadline: float | None, path: Path,
           timeout: float | None) -> None:
    """flock ``fd``; wait until ``deadline`` (monotonic) or forever when it is None."""
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if deadline is None:
        fcntl.flock(fd, mode)
        return
    while True:  # bounded by the deadline
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(path, timeout if timeout is not None else 0.0) from None
            time.sleep(POLL)


def _lock_directory(directory: Path, shared: bool, deadline: float | None, path: Path,
                    timeout: float | None) -> int | None:
    """The locked descriptor of ``directory``, or None where directories cannot be locked."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _NO_DIRECTORY_LOCK:
            log.debug("cannot open %s to lock it (%s); the lock file alone guards %s",
                      directory, exc, path)
            return None
        raise
    try:
        _flock(fd, shared, deadline, path, timeout)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in _NO_DIRECTORY_LOCK:
            raise
        log.debug("%s cannot be locked here (%s); the lock file alone guards %s",
                  directory, exc, path)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_file(path: Path, shared: bool, deadline: float | None, timeout: float | None,
               file_mode: int) -> int:
    """The locked descriptor of the lock file that is at ``path`` while we hold it."""
    for _ in range(MAX_REOPEN):
        # O_NOFOLLOW: a symlink planted at the lock's name must not make us create or lock
        # a file elsewhere.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, file_mode)
        try:
            _flock(fd, shared, deadline, path, timeout)
            held = os.fstat(fd)
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        # Replaced or removed between our open and our lock: this lock guards nothing.
        os.close(fd)
    raise ClusterError(f"lock file {path} was replaced {MAX_REOPEN} times while we locked it; "
                       "expected it to stay in place (is something deleting it in a loop?)")


@contextlib.contextmanager
def locked(path: Path | str, *, shared: bool = False, timeout: float | None = None,
           file_mode: int = 0o664) -> Iterator[None]:
    """Hold the lock of lock file ``path`` for the block (see the module docstring).

    ``shared`` takes shared locks (readers), else exclusive ones.  ``timeout`` [s]: None
    waits as long as it takes; otherwise :class:`LockTimeout` when the lock is not granted
    in time.  The parent directory must exist.  ``file_mode`` 0664: a git hook may run as
    the git user and the master as its own, sharing a group.
    """
    path = Path(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    dir_fd = _lock_directory(path.parent, shared, deadline, path, timeout)
    try:
        file_fd = _lock_file(path, shared, deadline, timeout, file_mode)
        try:
            yield
        finally:
            os.close(file_fd)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


@contextlib.contextmanager
def locked_together(paths: list[Path], *, timeout: float | None = None,
                    file_mode: int = 0o664) -> Iterator[None]:
    """Hold the exclusive locks of several lock files of one directory for the block: the
    directory's lock once, then each file's in the order given (every caller gives them in
    one order: no deadlock).  ClusterError when they are not all in one directory."""
    folders = {Path(p).parent for p in paths}
    if len(folders) != 1:
        raise ClusterError(f"lock files {', '.join(map(str, paths))} are not in one "
                           "directory; expected lock files of one directory")
    folder = folders.pop()
    deadline = None if timeout is None else time.monotonic() + timeout
    dir_fd = _lock_directory(folder, False, deadline, Path(paths[0]), timeout)
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(_lock_file(Path(path), False, deadline, timeout, file_mode))
        yield
    finally:
        for fd in fds:
            os.close(fd)
        if dir_fd is not None:
            os.close(dir_fd)
