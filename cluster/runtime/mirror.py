"""Copying a tree the way ``rsync -a --delete`` does: with rsync, or with a copy without it.

:func:`mirror` makes ``dst`` an exact copy of the directory ``src``: new and changed files
copied (with their mode and mtime), whatever ``src`` lacks deleted from ``dst``.  Two copiers
give the same result:

* ``method="copy"`` (:func:`copy_tree`): a Python walk; a file whose size and mtime match
  the copy is skipped (rsync's quick check), each copy goes through a temporary file
  (:data:`TEMP_PREFIX`) and a rename, so a reader never sees half a file;
* ``method="rsync"``: ``rsync -a --delete`` run through :mod:`cluster.runtime.proc` (own
  session, timeout, whole-tree kill), told to leave out exactly what the copy leaves out;
* ``method="auto"``: rsync when it is on PATH and the tree has more than
  :data:`AUTO_COPY_ENTRIES` entries (quick on a large tree that changed little; a small
  one the copy mirrors sooner than rsync starts), else the copy.

What a mirror holds (both copiers): every regular file and directory, less what the
``exclude`` predicate (:data:`Exclude`) names and files over ``max_size`` bytes (each logged
with its size).  Symlinks: one to a regular file inside the tree is copied as that file;
any other (leaving the tree, dangling, naming a directory) is left out, as are special
files and other copiers' in-flight temporary files.  What is left out is also deleted from
``dst`` (rsync's ``--delete-excluded``): a mirror never keeps a stale copy of what it no
longer sends.  :func:`left_out` lists it.

Failures raise :class:`~cluster.errors.TransportError` naming the tree (``label``) and the
reason.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from cluster.errors import TransportError
from cluster.runtime import fsutil, proc

# The logger of the node's transport, where these lines were first written (log filters
# and the people reading node logs know it by this name).
log = logging.getLogger("cluster.transport")

#: Prefix of the temp files a copy goes through; a leftover one (after a crash) is an
#: "extra" file the next mirror deletes, and one in a source is never copied.
TEMP_PREFIX = ".transport-tmp-"

#: An exclusion predicate: called with the POSIX path of an entry relative to the mirrored
#: root, a directory's with a trailing ``/`` (as rsync patterns tell directories apart), it
#: returns True for an entry to leave out (an excluded directory is not descended).
Exclude = Callable[[str], bool]

METHODS = ("auto", "rsync", "copy")
#: "auto" copies a tree of at most this many entries (files and folders, at any depth)
#: with the Python copy even where rsync is on PATH: rsync's start (two processes) costs
#: more than such a copy (a three-file tree: 80 ms against 1 ms on the test machine).
AUTO_COPY_ENTRIES = 100
#: rsync's exit status when source files vanished during the transfer (not an error here:
#: the copy skips those too).
RSYNC_VANISHED = 24

#: One directory level: files to copy (with their stats), directories to descend, names
#: left out for a reason other than ``exclude``, names ``exclude`` left out.
_Listing = tuple[dict[str, os.stat_result], list[str], list[str], list[str]]


def mirror(src: Path, dst: Path, *, exclude: Exclude | None = None,
           max_size: int | None = None, method: str = "auto", label: str | None = None,
           timeout: float | None = None) -> None:
    """Make ``dst`` an exact copy of the directory ``src`` (see the module docstring).

    ``method`` is "copy", "rsync" (TransportError if rsync is not on PATH) or "auto".
    ``label`` names the tree in messages (default: ``src``); ``timeout`` bounds rsync's run
    [seconds, None for none].
    """
    if method not in METHODS:
        raise ValueError(f"mirror method {method!r}: expected one of {', '.join(METHODS)}")
    label = label or str(src)
    if method == "auto":
        method = auto_method(src)
    if method == "copy":
        copy_tree(src, dst, exclude=exclude, max_size=max_size, label=label)
        return
    rsync = shutil.which("rsync")
    if rsync is None:
        raise TransportError("mirror", label, "rsync was asked for but is not on PATH")
    _rsync(rsync, src, dst, exclude, max_size, label, timeout)


def auto_method(src: Path) -> str:
    """What ``method="auto"`` does for the tree ``src``: "rsync" when rsync is on PATH and
    the tree has more than :data:`AUTO_COPY_ENTRIES` entries, else "copy"."""
    if shutil.which("rsync") is None or _at_most(src, AUTO_COPY_ENTRIES):
        return "copy"
    return "rsync"


def copy_tree(src: Path, dst: Path, *, exclude: Exclude | None = None,
              max_size: int | None = None, label: str | None = None) -> int:
    """:func:`mirror` by the Python copy; returns the number of files copied."""
    label = label or str(src)
    _check_source(src, label)
    try:
        dst.mkdir(parents=True, exist_ok=True)
        copied = _copy_level(src, Path(dst), src.resolve(), label, exclude, max_size, "")
    except TransportError:
        raise
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise TransportError("fetch", label, f"{exc.strerror or exc}{where}") from None
    log.debug("fetched %s into %s: %d file(s) copied", label, dst, copied)
    return copied


def left_out(src: Path, *, exclude: Exclude | None = None, max_size: int | None = None,
             label: str | None = None) -> list[str]:
    """What a mirror of ``src`` leaves out beyond what ``exclude`` names, sorted.

    The POSIX paths relative to ``src`` of: in-flight temp copies (:data:`TEMP_PREFIX`),
    symlinks that leave the tree, dangle or name a directory, entries that are neither
    regular files nor directories, and files over ``max_size``.  Directories ``exclude``
    names are not descended.  The same warnings are logged as by a mirror.
    """
    return sorted(_walk(src, exclude, max_size, label or str(src))[0])


def copy_file(src: Path, dst: Path) -> bool:
    """Copy ``src`` (contents, mode, times) to ``dst`` via a temp file and a rename.

    Returns False when ``src`` vanished before it could be read (logged; the next mirror
    settles it).  Other OSErrors propagate; the temp file never stays behind.  (Not
    :func:`cluster.runtime.fsutil.atomic_write`: that writes data held in memory, and a copy
    must keep the source's mtime, which the quick check compares, and its temp name must
    start with :data:`TEMP_PREFIX`, which every mirror skips.)

    Each file is opened once (:func:`~cluster.runtime.fsutil.copy_contents`): a node's first
    fetch of the node code, 150 files, takes 7 ms, against 33-50 ms with ``mkstemp`` and
    ``shutil.copy2`` on the test machine.  The temp name is unique without a random part:
    this process's pid and a counter.  A file of that name can only be left by a dead
    process that had the same pid; it is replaced.
    """
    try:
        fd_in, st = fsutil.open_regular(src)
    except FileNotFoundError:
        log.warning("copy %s: vanished on the master while copying; skipped", src)
        return False
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # A FIFO put in the file's place since the listing, say: never read as a stream.
        log.warning("copy %s: no longer a regular file; skipped", src)
        return False
    try:
        fsutil.replace_by_copy(fd_in, st, dst, _new_temp(dst), fsync=False)
    finally:
        os.close(fd_in)
    return True


def _new_temp(dst: Path) -> tuple[int, str]:
    """A new temporary file beside ``dst`` (its descriptor and path), named
    ``TEMP_PREFIX<pid>.<serial>``; one of that name left by a dead process that had our pid
    is replaced."""
    tmp = os.path.join(os.path.dirname(dst), f"{TEMP_PREFIX}{os.getpid()}.{next(_TEMP_SERIAL)}")
    try:
        return os.open(tmp, _CREATE, 0o600), tmp
    except FileExistsError:
        os.unlink(tmp)
        return os.open(tmp, _CREATE, 0o600), tmp


#: How copy_file creates its temp file: new, never through a link left in its place.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: The serial that makes copy_file's temp names unique within the process (thread-safe:
#: ``next`` on a count is atomic in CPython).
_TEMP_SERIAL = itertools.count()


# ----------------------------------------------------------------------------------------------
# The copy

def _check_source(src: Path, label: str) -> None:
    if not src.is_dir():
        raise TransportError("fetch", label, f"no such directory {src}")


def _copy_level(src: Path, dst: Path, src_root: Path, label: str, exclude: Exclude | None,
                max_size: int | None, prefix: str) -> int:
    """Mirror one directory level and recurse; returns the number of files copied.

    ``prefix`` is ``src`` relative to the mirrored root, with a trailing ``/`` (or "").
    """
    files, dirs, _skipped, _excluded = _listing(src, src_root, label, exclude, max_size,
                                                prefix)
    # Delete first what the source no longer has (or has as the other kind), so a file
    # turned directory (or back) can take its place.  What was left out is not in
    # ``files``/``dirs`` either, so it goes too (rsync --delete-excluded).
    with os.scandir(dst) as it:
        for entry in it:
            if entry.name in files:
                if entry.is_file(follow_symlinks=False):
                    continue
            elif entry.name in dirs:
                if entry.is_dir(follow_symlinks=False):
                    continue
            _remove(Path(entry.path))
    copied = 0
    for name, st in files.items():
        target = dst / name
        try:
            have = target.lstat()
        except FileNotFoundError:
            have = None
        if have is not None and have.st_size == st.st_size and \
                have.st_mtime_ns == st.st_mtime_ns and \
                stat.S_IMODE(have.st_mode) == stat.S_IMODE(st.st_mode):
            # Unchanged since the last mirror: rsync's quick check.  A mode of its own
            # (chmod +x) is mirrored as rsync -a does, by a new copy: never a chmod in
            # place, which would change a run's snapshot hard-linked to this file too.
            continue
        if copy_file(src / name, target):
            copied += 1
    for name in dirs:
        (dst / name).mkdir(exist_ok=True)
        copied += _copy_level(src / name, dst / name, src_root, label, exclude, max_size,
                              f"{prefix}{name}/")
    return copied


def _at_most(src: Path, limit: int) -> bool:
    """Whether the tree ``src`` has at most ``limit`` entries below it (what the mirror
    leaves out counted too); stops looking past the limit.  False when it cannot be read
    (rsync then says why)."""
    seen = 0
    pending = [str(src)]
    try:
        while pending:
            with os.scandir(pending.pop()) as it:
                for entry in it:
                    seen += 1
                    if seen > limit:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    except OSError:
        return False
    return True


def _walk(src: Path, exclude: Exclude | None, max_size: int | None, label: str
          ) -> tuple[list[str], list[str]]:
    """Every entry a mirror of ``src`` leaves out: (left out for a reason of the mirror's
    own, excluded by ``exclude``), as POSIX paths relative to ``src`` (an excluded
    directory's with a trailing ``/``)."""
    _check_source(src, label)
    skipped: list[str] = []
    excluded: list[str] = []
    src_root = src.resolve()
    pending = [(src, "")]
    try:
        while pending:
            here, prefix = pending.pop()
            _files, dirs, skip, excl = _listing(here, src_root, label, exclude, max_size, prefix)
            skipped += (prefix + name for name in skip)
            excluded += (prefix + name for name in excl)
            pending += ((here / name, f"{prefix}{name}/") for name in dirs)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise TransportError("fetch", label, f"{exc.strerror or exc}{where}") from None
    return skipped, excluded


def _listing(src: Path, src_root: Path, label: str, exclude: Exclude | None,
             max_size: int | None, prefix: str) -> _Listing:
    """One level of ``src`` (see :data:`_Listing`): the single place that decides what a
    mirror holds, shared by the copy, :func:`left_out` and the rsync route."""
    files: dict[str, os.stat_result] = {}
    dirs: list[str] = []
    skipped: list[str] = []
    excluded: list[str] = []
    with os.scandir(src) as it:
        for entry in it:
            kind = _kind(entry, src_root, label)
            if kind is None:
                skipped.append(entry.name)
            elif isinstance(kind, str):  # "dir"
                if exclude is None or not exclude(f"{prefix}{entry.name}/"):
                    dirs.append(entry.name)
                else:
                    excluded.append(entry.name + "/")
            elif exclude is not None and exclude(prefix + entry.name):
                excluded.append(entry.name)  # not listed, so the copy deletes it from dst
            elif max_size is not None and kind.st_size > max_size:
                # rsync --max-size: "larger than", so a file of exactly max_size goes.
                log.warning("fetch %s: not copying %s%s: %d bytes, over the %d-byte "
                            "limit", label, prefix, entry.name, kind.st_size, max_size)
                skipped.append(entry.name)
            else:
                files[entry.name] = kind
    return files, dirs, skipped, excluded


def _kind(entry: os.DirEntry[str], src_root: Path, label: str) -> str | os.stat_result | None:
    """"dir", the stat of a regular file to copy, or None for an entry to leave out."""
    if entry.name.startswith(TEMP_PREFIX):
        return None  # someone else's copy in flight
    if entry.is_symlink():
        # Follow a link only to a regular file inside the tree: never out of it, and
        # never to a directory (that could loop back on an ancestor).
        try:
            target = Path(entry.path).resolve(strict=True)
            target.relative_to(src_root)
            st = target.stat()
        except (OSError, ValueError, RuntimeError):
            log.warning("fetch %s: skipping symlink %s: it leaves the tree or dangles",
                        label, entry.path)
            return None
        if stat.S_ISREG(st.st_mode):
            return st
        log.warning("fetch %s: skipping symlink %s: not a regular file", label, entry.path)
        return None
    try:
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        if entry.is_file(follow_symlinks=False):
            return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None  # vanished while we looked; the next mirror settles it
    log.warning("fetch %s: skipping %s: not a regular file or directory", label, entry.path)
    return None


def _remove(path: Path) -> None:
    # lstat-based: a symlink in the mirror is removed itself, never what it points to.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# ----------------------------------------------------------------------------------------------
# rsync

def _rsync(rsync: str, src: Path, dst: Path, exclude: Exclude | None, max_size: int | None,
           label: str, timeout: float | None) -> None:
    """:func:`mirror` by rsync, leaving out exactly what the copy would.

    Everything the copy leaves out (listed by the same code, which also logs each) is passed
    as an anchored literal exclude, so ``--copy-links`` only ever dereferences a link to a
    file inside the tree, and ``--delete-excluded`` removes a stale copy just as the copy
    does.  ``--max-size`` stays as the backstop for a file that grows meanwhile.
    """
    skipped, excluded = _walk(src, exclude, max_size, label)
    dst.mkdir(parents=True, exist_ok=True)
    argv = [rsync, "-a", "--copy-links", "--no-D", "--delete", "--delete-excluded",
            *([f"--max-size={max_size}"] if max_size is not None else []),
            # NUL-separated from stdin: any byte but NUL may be in a file name.
            "--from0", "--exclude-from=-",
            # Absolute paths: no name is taken for an option or a host:path, and the
            # trailing slash syncs the tree's contents, not a directory inside dst.
            f"{src.resolve()}/", f"{dst.resolve()}/"]
    rules = b"".join(os.fsencode(anchored(path)) + b"\0" for path in skipped + excluded)
    log.debug("running %s", proc.command_text(argv))
    try:
        done = proc.run(argv, input=rules, timeout=timeout)
    except proc.ProcessError as exc:
        raise TransportError("mirror", label, str(exc)) from None
    if done.returncode == RSYNC_VANISHED and not done.timed_out:
        log.warning("rsync %s: some files vanished during the transfer: %s", label,
                    done.text("stderr").strip())
        return
    if not done.ok:
        # rsync's own last lines say what went wrong (disk full, permission denied, ...).
        tail = "\n".join(done.text("stderr").strip().splitlines()[-10:])
        raise TransportError("mirror", label, f"rsync of {src} to {dst} failed "
                                              f"({done.describe(timeout)}):\n{tail}")


def anchored(path: str) -> str:
    """An rsync pattern matching exactly the entry ``path`` (relative to the transfer root;
    a directory's with a trailing ``/``).

    The leading ``/`` anchors it at the root, and keeps a name starting with ``#``, ``;``,
    ``- `` or ``+ `` from being read as a comment or a rule prefix.  rsync treats a
    backslash as an escape only in a pattern with a wildcard character, so a path holding
    one of ``*?[`` has those and every backslash escaped, any other path is taken literally.
    """
    if any(c in path for c in "*?["):
        path = "".join("\\" + c if c in "\\*?[" else c for c in path)
    return "/" + path
