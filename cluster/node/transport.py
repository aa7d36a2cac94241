"""How a node reaches the master's files.

Seed 000's nodes use ssh/scp/rsync against the master (ARTIFEX.md §4.2: ``scp`` of the start
file, rsync of the source trees).  Everything the node does to the master home goes through
the small :class:`Transport` interface below, so the file-system default and a later ssh
implementation are interchangeable (STYLE.md guideline 9).

Paths on the master are ``rel``: relative to the master home, POSIX separators.  Every
method checks ``rel`` lexically and refuses an absolute path, a ``..`` component or a NUL
byte (TransportError naming the path and the rule).  Symlinks the master's admin placed in
the home itself (``tests -> /data/tests``) are trusted; symlinks found *inside* a fetched
tree are never followed out of it.

Usage::

    t = make_transport(cfg)
    text = t.read_text("job.start")             # None if absent
    t.fetch_tree("tests", work / "tests")        # like rsync -a --delete
    t.fetch_tree("ghostpdl", dest, exclude=lambda p: p.endswith(".o"), max_size=30_000_000)
    t.upload(local_log, "runs/20190408/node7.log.gz")
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from cluster.errors import ConfigError, TransportError

if TYPE_CHECKING:
    from cluster.config import Config

log = logging.getLogger("cluster.transport")

#: Prefix of the temp files a copy goes through; a leftover one (after a crash) is an
#: "extra" file the next fetch_tree deletes.
TEMP_PREFIX = ".transport-tmp-"

#: An exclusion predicate for :meth:`LocalTransport.fetch_tree`: called with the POSIX path
#: of an entry relative to the fetched root, a directory's with a trailing ``/`` (as rsync
#: patterns tell directories apart), it returns True for an entry to leave out.
Exclude = Callable[[str], bool]


class Transport(Protocol):
    """The node's view of the master home."""

    def read_text(self, rel: str) -> str | None:
        """The UTF-8 text of the master-home file ``rel``, or None if it does not exist."""
        ...

    def fetch_tree(self, rel: str, dest: Path) -> None:
        """Make ``dest`` an exact copy of the master-home directory ``rel``: new and changed
        files copied, files absent from the master deleted (rsync -a --delete)."""
        ...

    def upload(self, src: Path, rel: str) -> None:
        """Copy the local file ``src`` to the master home at ``rel``, creating parent
        directories; readers on the master never see a partial file."""
        ...


def check_rel(rel: str, action: str = "access") -> PurePosixPath:
    """``rel`` as a relative path that stays inside the master home, or TransportError."""
    if not isinstance(rel, str) or not rel:
        raise TransportError(action, repr(rel), "an empty path names no file in the master home")
    if "\0" in rel:
        raise TransportError(action, repr(rel), "a path must not contain a NUL byte")
    path = PurePosixPath(rel)
    if path.is_absolute():
        raise TransportError(action, rel, "the path must be relative to the master home, "
                                          "not absolute")
    if ".." in path.parts:
        raise TransportError(action, rel, "a '..' component would leave the master home")
    if not path.parts:
        raise TransportError(action, rel, "the path names the master home itself, not a file "
                                          "or directory in it")
    return path


class LocalTransport:
    """The master home is a local directory (shared file system, or the master itself)."""

    def __init__(self, master_home: Path) -> None:
        self.root = Path(master_home)

    def __repr__(self) -> str:
        return f"LocalTransport({str(self.root)!r})"

    def _path(self, rel: str, action: str) -> Path:
        return self.root.joinpath(*check_rel(rel, action).parts)

    # -- read ----------------------------------------------------------------------------------
    def read_text(self, rel: str) -> str | None:
        path = self._path(rel, "read")
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise TransportError("read", rel, "is a directory on the master, not a file") from None
        except UnicodeDecodeError as exc:
            raise TransportError("read", rel, f"not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise TransportError("read", rel, exc.strerror or str(exc)) from None

    # -- mirror --------------------------------------------------------------------------------
    def fetch_tree(self, rel: str, dest: Path, exclude: Exclude | None = None,
                   max_size: int | None = None) -> None:
        """Make ``dest`` an exact copy of the directory ``rel`` (rsync -a --delete).

        Without ``exclude`` and ``max_size`` every regular file and directory is mirrored
        (symlinks: see :meth:`left_out`).  ``exclude`` (see :data:`Exclude`) leaves out the
        entries it names, and an excluded directory is not descended; a file larger than
        ``max_size`` bytes is left out too, with a warning naming it and its size.  What is
        left out is also deleted from ``dest``, as rsync's ``--delete-excluded`` would: the
        mirror never keeps a stale copy of something it no longer sends.
        """
        src = self._source(rel, "fetch")
        try:
            dest.mkdir(parents=True, exist_ok=True)
            copied = self._mirror(src, Path(dest), src.resolve(), rel, exclude, max_size, "")
        except TransportError:
            raise
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise TransportError("fetch", rel, f"{exc.strerror or exc}{where}") from None
        log.debug("fetched %s into %s: %d file(s) copied", rel, dest, copied)

    def left_out(self, rel: str, exclude: Exclude | None = None,
                 max_size: int | None = None) -> list[str]:
        """What ``fetch_tree(rel, ..., exclude, max_size)`` would leave out beyond ``exclude``.

        The POSIX paths relative to ``rel`` of: in-flight temp copies (:data:`TEMP_PREFIX`),
        symlinks that leave the tree, dangle or name a directory (a symlink to a regular file
        inside the tree is copied as that file), entries that are neither regular files nor
        directories, and files over ``max_size``.  Directories ``exclude`` names are not
        descended.  This lets another copier (rsync ``--copy-links``, in cluster.push) leave
        out exactly what the mirror does; the same warnings are logged as by fetch_tree.
        """
        src = self._source(rel, "fetch")
        out: list[str] = []
        src_root = src.resolve()
        pending = [(src, "")]
        try:
            while pending:
                here, prefix = pending.pop()
                _files, dirs, skipped = self._listing(here, src_root, rel, exclude, max_size,
                                                      prefix)
                out += (prefix + name for name in skipped)
                pending += ((here / name, f"{prefix}{name}/") for name in dirs)
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise TransportError("fetch", rel, f"{exc.strerror or exc}{where}") from None
        return sorted(out)

    def _source(self, rel: str, action: str) -> Path:
        src = self._path(rel, action)
        if not src.is_dir():
            raise TransportError(action, rel,
                                 f"no such directory in the master home {self.root}")
        return src

    def _mirror(self, src: Path, dst: Path, src_root: Path, rel: str, exclude: Exclude | None,
                max_size: int | None, prefix: str) -> int:
        """Mirror one directory level and recurse; returns the number of files copied.

        ``prefix`` is ``src`` relative to the fetched root, with a trailing ``/`` (or "").
        """
        files, dirs, _skipped = self._listing(src, src_root, rel, exclude, max_size, prefix)
        # Delete first what the master no longer has (or has as the other kind), so a file
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
                    have.st_mtime_ns == st.st_mtime_ns:
                continue  # unchanged since the last fetch: rsync's quick check
            if _copy_atomic(src / name, target):
                copied += 1
        for name in dirs:
            (dst / name).mkdir(exist_ok=True)
            copied += self._mirror(src / name, dst / name, src_root, rel, exclude, max_size,
                                   f"{prefix}{name}/")
        return copied

    def _listing(self, src: Path, src_root: Path, rel: str, exclude: Exclude | None,
                 max_size: int | None, prefix: str
                 ) -> tuple[dict[str, os.stat_result], list[str], list[str]]:
        """One level of ``src``: (files to copy with their stats, directories to descend,
        names left out for a reason other than ``exclude``).  The single place that decides
        what a mirror holds, shared by :meth:`_mirror` and :meth:`left_out`."""
        files: dict[str, os.stat_result] = {}
        dirs: list[str] = []
        skipped: list[str] = []
        with os.scandir(src) as it:
            for entry in it:
                kind = self._kind(entry, src_root, rel)
                if kind is None:
                    skipped.append(entry.name)
                elif isinstance(kind, str):  # "dir"
                    if exclude is None or not exclude(f"{prefix}{entry.name}/"):
                        dirs.append(entry.name)
                elif exclude is not None and exclude(prefix + entry.name):
                    pass  # excluded: not listed, so _mirror deletes any copy in dest
                elif max_size is not None and kind.st_size > max_size:
                    # rsync --max-size: "larger than", so a file of exactly max_size goes.
                    log.warning("fetch %s: not copying %s%s: %d bytes, over the %d-byte "
                                "limit", rel, prefix, entry.name, kind.st_size, max_size)
                    skipped.append(entry.name)
                else:
                    files[entry.name] = kind
        return files, dirs, skipped

    @staticmethod
    def _kind(entry: os.DirEntry[str], src_root: Path, rel: str) -> str | os.stat_result | None:
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
                            rel, entry.path)
                return None
            if stat.S_ISREG(st.st_mode):
                return st
            log.warning("fetch %s: skipping symlink %s: not a regular file", rel, entry.path)
            return None
        try:
            if entry.is_dir(follow_symlinks=False):
                return "dir"
            if entry.is_file(follow_symlinks=False):
                return entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return None  # vanished while we looked; the next fetch settles it
        log.warning("fetch %s: skipping %s: not a regular file or directory", rel, entry.path)
        return None

    # -- write ---------------------------------------------------------------------------------
    def upload(self, src: Path, rel: str) -> None:
        target = self._path(rel, "upload")
        if not Path(src).is_file():
            raise TransportError("upload", rel, f"local file {src} does not exist or is not "
                                                "a regular file")
        if target.is_dir():
            raise TransportError("upload", rel, "is a directory on the master")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_atomic(Path(src), target)
        except OSError as exc:
            raise TransportError("upload", rel, exc.strerror or str(exc)) from None


def _copy_atomic(src: Path, dst: Path) -> bool:
    """Copy ``src`` (contents, mode, times) to ``dst`` via a temp file and a rename.

    Returns False when ``src`` vanished before it could be read (logged; the next fetch
    settles it).  Other OSErrors propagate; the temp file never stays behind.
    """
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=TEMP_PREFIX)
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except FileNotFoundError as exc:
        _unlink_quietly(tmp)
        if exc.filename == str(src) or not src.exists():
            log.warning("copy %s: vanished on the master while copying; skipped", src)
            return False
        raise
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return True


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _remove(path: Path) -> None:
    # lstat-based: a symlink in the mirror is removed itself, never what it points to.
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def make_transport(cfg: Config) -> Transport:
    """The transport ``cfg.transport`` names ("local": LocalTransport(cfg.master_home))."""
    if cfg.transport == "local":
        return LocalTransport(cfg.master_home)
    raise ConfigError("transport", cfg.transport, "'local'")
