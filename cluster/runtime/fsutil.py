"""Files that are never torn: one atomic write, one streamed atomic writer, one flock.

Contract of :func:`atomic_write` and :func:`atomic_writer`:

* the data goes to a temporary file in the target's directory whose name is unique per
  writer (``.<name>.<pid>.<random>.tmp``), so two processes or threads writing the same
  target never share a temporary file;
* with ``fsync=True`` (the default) the data is flushed to disk before the rename, for files
  whose loss after a crash would lose work (tables, queues, the journal's compaction); pass
  ``fsync=False`` only for files that are rewritten often and harmless to lose (status
  lines, heartbeat records);
* the temporary file is renamed over the target with :func:`os.replace`: a reader sees the
  old file or the new one, never a part of either;
* the new file keeps the permission bits of the file it replaces, or gets ``mode`` (default
  0644: dashboards and other users read the cluster's files; ``mkstemp`` alone would give
  0600);
* on any failure, including ``KeyboardInterrupt``, the temporary file is removed and the
  target is untouched.

:func:`flocked` holds an exclusive (or shared) ``flock`` on a lock file for the length of a
``with`` block; the lock file is created if missing and never written or unlinked (unlinking
a flock'ed file lets two processes lock two inodes of one name).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

#: Permission bits of a file that did not exist before.
NEW_FILE_MODE = 0o644
#: Suffix of every temporary file the writers here make.
TEMP_SUFFIX = ".tmp"


def _mode_for(path: Path, mode: int | None) -> int:
    if mode is not None:
        return mode
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return NEW_FILE_MODE


@contextlib.contextmanager
def _replacing(path: Path, binary: bool, fsync: bool, mode: int | None,
               encoding: str) -> Iterator[IO[Any]]:
    """Yield a temporary file beside ``path``; on a clean exit it replaces ``path``."""
    final_mode = _mode_for(path, mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.",
                               suffix=TEMP_SUFFIX)
    try:
        fh: IO[Any] = (os.fdopen(fd, "wb") if binary
                       else os.fdopen(fd, "w", encoding=encoding, newline="\n"))
        with fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), final_mode)
        os.replace(tmp, path)
    except BaseException:
        # BaseException: a KeyboardInterrupt mid-write must not leave the temp file behind.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_writer(path: Path | str, *, fsync: bool = True, mode: int | None = None,
                  encoding: str = "utf-8") -> Iterator[TextIO]:
    """Yield a text file whose content replaces ``path`` atomically when the block ends.

    For text too large to build in memory (a million-line table): write it in pieces.  An
    exception inside the block leaves ``path`` as it was and removes the temporary file.
    """
    with _replacing(Path(path), False, fsync, mode, encoding) as fh:
        yield fh  # type: ignore[misc]  # opened in text mode above


def atomic_write(path: Path | str, data: str | bytes | Iterable[str], *, fsync: bool = True,
                 mode: int | None = None, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` (text, bytes, or an iterable of text pieces) atomically.

    See the module docstring for the contract.  Bytes are written as they are; text is
    encoded with ``encoding`` and written with ``\\n`` line ends.
    """
    with _replacing(Path(path), isinstance(data, bytes), fsync, mode, encoding) as fh:
        if isinstance(data, (str, bytes)):
            fh.write(data)
        else:
            for piece in data:
                fh.write(piece)


@contextlib.contextmanager
def flocked(path: Path | str, *, shared: bool = False, file_mode: int = 0o664) -> Iterator[int]:
    """Hold a blocking ``flock`` on ``path`` (created with ``file_mode`` if missing).

    Yields the descriptor (callers that also read or write the file may use it); closing it
    at the end of the block releases the lock.  ``file_mode`` 0664: a git hook may run as
    the git user and the master as its own, sharing a group.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock
