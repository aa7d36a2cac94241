"""Single-instance guard: a non-blocking ``flock`` on a lock file.

The port of "check whether another instance of runClustermaster.sh is already running; if it
is, just exit" (seed 000).  Unlike the clustermaster's PID file, nothing else reads this
file's content, so a kernel lock is the right tool: it is released when the holder dies,
however it dies, and there is no staleness to judge.

Contract:

* :meth:`SingleInstance.acquire` never blocks; it raises :class:`cluster.errors.AlreadyRunning`
  when another open file description holds the lock (another process, or another
  ``SingleInstance`` on the same path in this process);
* the holder's pid is written into the file for humans (``cat home/run_clustermaster.lock``);
  :func:`read_holder` reads it back for log messages;
* the lock descriptor is close-on-exec, so children started by the holder (the
  clustermasters) do not inherit the lock and cannot keep it after the holder exits;
* the lock file is never unlinked: unlinking a flock'ed file lets two processes hold locks
  on two different inodes of the same name.

Usage::

    try:
        with SingleInstance(home / "run_clustermaster.lock", "run_clustermaster"):
            loop()
    except AlreadyRunning:
        return 0
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from types import TracebackType

from cluster.errors import AlreadyRunning

logger = logging.getLogger("cluster.singleton")


def read_holder(path: Path) -> int | None:
    """The pid written in lock file ``path``, or None if it is missing or unreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class SingleInstance:
    """An exclusive, non-blocking flock on ``path``; a context manager."""

    def __init__(self, path: Path, program: str | None = None) -> None:
        self.path = Path(path)
        self.program = program or self.path.stem
        self._fd: int | None = None

    def __repr__(self) -> str:
        return f"SingleInstance({str(self.path)!r}, held={self.held})"

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise AlreadyRunning at once; idempotent while held."""
        if self._fd is not None:
            return
        # os.open descriptors are non-inheritable (PEP 446): children never hold the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(self.program, str(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            # For humans only; written while holding the lock, so it is never torn by a rival.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            logger.exception("%s: could not write our pid into %s", self.program, self.path)
        logger.debug("%s: holds %s", self.program, self.path)

    def release(self) -> None:
        """Drop the lock (and clear the pid written for humans); idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            logger.debug("%s: could not clear %s", self.program, self.path, exc_info=True)
        finally:
            os.close(fd)  # releases the lock

    def __enter__(self) -> SingleInstance:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
