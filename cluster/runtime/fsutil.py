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

:func:`atomic_copy` copies a file under the same contract (the node's uploads to the master
home use it, so a half upload never carries its final name).

A process killed while it writes (SIGKILL, a power cut) cannot remove its temporary file.
Because the writer's pid is part of the name, :func:`remove_dead_temps` can tell such a
leftover from a write in progress: it removes the files named like ours whose writer is no
longer a live process, and nothing else.  The daemons call it on their directories at start.

:func:`swap_dir` puts a folder made under a temporary name at its final name, replacing
what is there, with its own crash contract (in its docstring).

:func:`flocked` holds an exclusive (or shared) ``flock`` on a lock file for the length of a
``with`` block; the lock file is created if missing and never written or unlinked (unlinking
a flock'ed file lets two processes lock two inodes of one name).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO

log = logging.getLogger("cluster.fsutil")

#: Permission bits of a file that did not exist before.
NEW_FILE_MODE = 0o644
#: Suffix of every temporary file the writers here make.
TEMP_SUFFIX = ".tmp"
#: The name of every temporary file made by :func:`temp_file`: ``.<target>.<pid>.<random>.tmp``
#: where ``<random>`` is mkstemp's eight characters.  Strict on purpose: a file that does not
#: match exactly is not ours and :func:`remove_dead_temps` leaves it alone.
TEMP_NAME = re.compile(r"\.(?P<target>.+)\.(?P<pid>[1-9][0-9]{0,9})\.[a-z0-9_]{8}"
                       + re.escape(TEMP_SUFFIX))
#: How deep :func:`remove_dead_temps` descends below its directory (a bound on the walk; no
#: home or work directory nests anywhere near this deep).
MAX_CLEAN_DEPTH = 64


def _mode_for(path: Path, mode: int | None) -> int:
    if mode is not None:
        return mode
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return NEW_FILE_MODE


def temp_file(target: Path | str) -> tuple[int, str]:
    """Create a new temporary file beside ``target`` and return ``(fd, path)``, as mkstemp.

    Its name is ``.<target name>.<our pid>.<random>.tmp`` (:data:`TEMP_NAME`): unique per
    writer, and it says which process may still be writing it.  Every temporary file that is
    later renamed over a file of the cluster is made here (or named the same way), so that
    :func:`remove_dead_temps` can clean what a killed writer leaves.  Mode 0600 until the
    caller sets another.
    """
    target = Path(target)
    return tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.",
                            suffix=TEMP_SUFFIX)


@contextlib.contextmanager
def _replacing(path: Path, binary: bool, fsync: bool, mode: int | None,
               encoding: str) -> Iterator[IO[Any]]:
    """Yield a temporary file beside ``path``; on a clean exit it replaces ``path``."""
    final_mode = _mode_for(path, mode)
    fd, tmp = temp_file(path)
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


@contextlib.contextmanager
def atomic_bytes_writer(path: Path | str, *, fsync: bool = True,
                        mode: int | None = None) -> Iterator[BinaryIO]:
    """:func:`atomic_writer` for bytes (a compressed stream written in pieces)."""
    with _replacing(Path(path), True, fsync, mode, "utf-8") as fh:
        yield fh  # type: ignore[misc]  # opened in binary mode above


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


def atomic_copy(src: Path | str, dst: Path | str, *, fsync: bool = True) -> None:
    """Replace ``dst`` with a copy of the regular file ``src`` (content, permission bits and
    times, as :func:`shutil.copy2`), atomically: under the contract of :func:`atomic_write`.

    ``dst``'s directory must exist.  A reader of ``dst`` sees the old file or the whole copy,
    never a part; a copier killed mid-way leaves only its temporary file (named by
    :func:`temp_file`, so :func:`remove_dead_temps` cleans it).  Before any temporary file
    is made, a missing ``src`` raises FileNotFoundError and one that is not a regular file
    (a directory, a FIFO a copy would block on) OSError EINVAL.
    """
    fd_in, st = open_regular(src)
    try:
        replace_by_copy(fd_in, st, dst, temp_file(dst), fsync=fsync)
    finally:
        os.close(fd_in)


def open_regular(src: Path | str) -> tuple[int, os.stat_result]:
    """``src`` opened for reading, and its fstat; OSError EINVAL (nothing left open) when it
    is not a regular file.  Opened non-blocking: a FIFO (one put in a listed file's place,
    say) would otherwise wait for a writer."""
    fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a copy would read it as a stream)",
                          str(src))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def replace_by_copy(fd_in: int, st: os.stat_result, dst: Path | str,
                    temp: tuple[int, str], *, fsync: bool) -> None:
    """Copy the open regular file ``fd_in`` (``st``: its fstat, from :func:`open_regular`)
    into the new temporary file ``temp`` (its descriptor and path, beside ``dst``; closed
    here) with :func:`copy_contents`, fsync it if asked, and rename it over ``dst``.  On any
    failure the temporary file is removed and ``dst`` is as it was."""
    fd, tmp = temp
    try:
        try:
            copy_contents(fd_in, fd, st)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def copy_contents(fd_in: int, fd_out: int, st: os.stat_result) -> None:
    """Copy all of the open file ``fd_in`` (just opened: read from its start) into the new,
    empty file ``fd_out``, then give ``fd_out`` ``st``'s permission bits and times (``st``:
    ``fd_in``'s fstat), as :func:`shutil.copy2` does by name.

    Each file is opened once: copy2 opens the target a second time and looks the source up
    three times, and a node's first fetch of the node code copies 150 files.  The bytes go
    in the kernel (sendfile) where it can, else by read and write; a file that grew since
    ``st`` was taken is copied to its end.
    """
    try:
        while os.sendfile(fd_out, fd_in, None, max(st.st_size, 1 << 20)):
            pass
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        # Nothing was written when sendfile refuses a pair of files: start over by hand.
        os.lseek(fd_out, 0, os.SEEK_SET)
        os.ftruncate(fd_out, 0)
        os.lseek(fd_in, 0, os.SEEK_SET)
        while chunk := os.read(fd_in, 1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd_out, view):]
    os.fchmod(fd_out, stat.S_IMODE(st.st_mode))
    os.utime(fd_out, ns=(st.st_atime_ns, st.st_mtime_ns))


def writer_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this machine, as far as a temp file cares.

    ``os.kill(pid, 0)``: ProcessLookupError means no such process (dead); success or
    PermissionError (another user's process) means it exists.  A zombie counts as dead: it
    can never write again, and its parent may reap it late.  A pid out of the system's range
    is dead (no process can have it).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    import psutil  # here: only the clean-up at start needs it

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # includes ZombieProcess
        return True
    except psutil.Error:
        return False  # cannot tell: keep the file


def remove_dead_temps(directory: Path, *, recursive: bool = False,
                      min_age: float = 0.0) -> list[Path]:
    """Remove the temporary files a killed writer left in ``directory``; return them.

    A file is removed only if all of these hold:

    * it is a regular file (not a symlink, not a directory) whose name matches
      :data:`TEMP_NAME` exactly, i.e. one :func:`temp_file` made;
    * the writer's pid in its name is not a live process (:func:`writer_alive`).  A live pid
      keeps its file even when the pid was reused by an unrelated process since: we cannot
      tell the two apart, and removing a file a live writer is about to rename would make
      its write fail; a reused pid only delays the clean-up to a later start;
    * it was last modified at least ``min_age`` seconds ago.  The pid is only meaningful on
      this machine: where writers on other machines share the directory (nodes uploading
      to the master home over a shared file system), pass a ``min_age`` larger than any
      upload takes, so a remote writer's file in progress is not taken for a dead one.

    With ``recursive`` the walk descends into subdirectories (at most
    :data:`MAX_CLEAN_DEPTH` levels); it never follows a symlink, to a file or a directory.
    ``directory`` itself is used as given (an admin's symlink naming it is trusted).  A
    missing ``directory`` yields ``[]``.  Failures to read a directory or to remove a file
    (another user's file, a file removed meanwhile) are logged and skipped: cleaning is
    best effort and never stops a start.
    """
    removed: list[Path] = []
    now = time.time()
    stack: list[tuple[Path, int]] = [(Path(directory), 0)]
    while stack:  # bounded: each directory of a finite tree is pushed once (no symlinks)
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listing = list(entries)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("temp clean-up: cannot list %s: %s", folder, exc.strerror or exc)
            continue
        for entry in listing:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if recursive and depth < MAX_CLEAN_DEPTH:
                        stack.append((Path(entry.path), depth + 1))
                    elif recursive:
                        log.warning("temp clean-up: not descending into %s, %d levels below "
                                    "%s", entry.path, depth + 1, directory)
                    continue
                match = TEMP_NAME.fullmatch(entry.name)
                if match is None or not entry.is_file(follow_symlinks=False):
                    continue
                if min_age > 0 and now - entry.stat(follow_symlinks=False).st_mtime < min_age:
                    continue
                if writer_alive(int(match["pid"])):
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue  # gone meanwhile (renamed by its writer, removed by another cleaner)
            except OSError as exc:
                log.warning("temp clean-up: cannot remove %s: %s", entry.path,
                            exc.strerror or exc)
                continue
            removed.append(Path(entry.path))
            log.info("removed %s, left by process %s, which is gone", entry.path,
                     match["pid"])
    return removed


def fsync_dir(directory: Path | str) -> None:
    """Make the names just created or renamed in ``directory`` durable.

    Best effort: some file systems refuse to open or fsync a directory, and there the
    rename is as durable as they make it.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def swap_dir(new: Path | str, dest: Path | str, *, aside: Path | str | None = None) -> None:
    """Put the folder ``new`` at ``dest``: rename what is at ``dest`` (a folder, a file, a
    link) aside, rename ``new`` in, remove the old.  ``new``, ``dest`` and ``aside`` are on
    one file system (renames); ``aside`` defaults to ``.<dest name>.old.<our pid>`` beside
    ``dest`` (a leftover there is removed first), and a caller that cleans up after a crash
    names its own.

    Contract:

    * nothing at ``dest``: one rename, ``new`` is ``dest``;
    * a reader of ``dest`` sees the old tree or the new one, or for an instant between the
      two renames nothing; never a mixture;
    * renaming ``new`` in fails (OSError): the old is renamed back and the error raised;
      ``dest`` is as it was and ``new`` is left to the caller;
    * what a crash (SIGKILL, a power cut) leaves: before the first rename, ``dest`` old and
      ``new`` whole; between the renames, nothing at ``dest``, the old tree at ``aside`` and
      ``new`` whole; after the second, ``dest`` new and the old at ``aside`` until removed.
      Nothing is ever half old and half new, and no tree is lost but the old one's removal.
    """
    new, dest = Path(new), Path(dest)
    if not os.path.lexists(dest):
        os.replace(new, dest)
        return
    if aside is None:
        aside = dest.with_name(f".{dest.name}.old.{os.getpid()}")
        _remove_any(aside)
    os.replace(dest, aside)
    try:
        os.replace(new, dest)
    except OSError:
        os.replace(aside, dest)  # the tree as it was: never none
        raise
    _remove_any(aside)


def _remove_any(path: Path | str) -> None:
    """Remove ``path`` whatever it is (a folder, whole; a file; a link, not its target);
    nothing when there is none.  Errors inside a folder are ignored (best effort)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


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
