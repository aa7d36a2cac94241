"""The node code's bytecode remembered across processes.

:func:`cluster.node.code.publish` ships each node module's bytecode, compiled once by the
master's Python.  A new supervisor publishes into a new home at its first tick, before its
first clustermaster starts, and so did every local cluster and every test cluster: compiling
the node side took a seventh of a second of CPU on the path to the first run's start.  The
bytes depend only on the source's bytes, the module's path in the package (the name written
into its code objects) and the Python (its cache tag and magic number), so they are kept
here under a key made of those four, and a later publish copies them instead of compiling.

Each entry is one file, ``<key>.<md5>.pyc``: the key (an md5 of the four), then the md5 of
the file's own content.  An entry is taken only when its content has the md5 its name says
(:meth:`BytecodeCache.fetch` hashes it, which :func:`~cluster.node.code.publish` needs for
the MANIFEST anyway), so a damaged entry is never published: it is removed and the module
compiled.  The folder is ``$CLUSTER_BYTECODE_CACHE``, or
``$XDG_CACHE_HOME/regression-cluster/node-bytecode`` (``~/.cache`` without it).  At most
:data:`MAX_FILES` entries are kept (a use renews an entry's mtime; the oldest go first).  It
is only a cache: a missing, unreadable or foreign entry means a compile, and a write that
fails (read-only home, full disk) is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

from cluster.node import scancache
from cluster.runtime import fsutil

log = logging.getLogger("cluster.nodecode")

#: The environment variable naming the cache folder (tests, or a site's own place).
ENV = "CLUSTER_BYTECODE_CACHE"
#: Entries kept at most (the node side has about 75 modules; ~14 KB each).
MAX_FILES = 1000
#: What every entry's name ends with.
SUFFIX = ".pyc"


def cache_dir() -> Path:
    """Where the cache lives (module docstring)."""
    explicit = os.environ.get(ENV)
    return Path(explicit) if explicit else scancache.cache_root() / "node-bytecode"


def entry_key(rel: str, source_md5: str) -> str:
    """The key of the bytecode of the module ``rel`` (its path in the package) whose source
    has the md5 ``source_md5``, compiled by this Python."""
    text = "\0".join((rel, source_md5, str(sys.implementation.cache_tag),
                      importlib.util.MAGIC_NUMBER.hex()))
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


class BytecodeCache:
    """The cache folder as one publish sees it: listed once, at the first :meth:`fetch`."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = cache_dir() if folder is None else Path(folder)
        self._entries: dict[str, str] | None = None  # key -> the md5 in the entry's name

    def _listing(self) -> dict[str, str]:
        if self._entries is None:
            self._entries = {}
            with contextlib.suppress(OSError):
                for name in os.listdir(self.folder):
                    key, dot, rest = name.partition(".")
                    md5 = rest.removesuffix(SUFFIX)
                    if dot and rest.endswith(SUFFIX) and len(key) == 32 and len(md5) == 32:
                        self._entries[key] = md5
        return self._entries

    def _path(self, key: str, md5: str) -> Path:
        return self.folder / f"{key}.{md5}{SUFFIX}"

    def fetch(self, rel: str, source_md5: str, dest: Path) -> str | None:
        """Copy the bytecode of ``rel`` with source md5 ``source_md5`` to ``dest``
        (atomically, its folder made if need be) and return its md5; None when there is no
        sound entry (nothing is written then).  An entry whose content does not have the
        md5 its name says is removed."""
        key = entry_key(rel, source_md5)
        md5 = self._listing().get(key)
        if md5 is None:
            return None
        path = self._path(key, md5)
        try:
            data = path.read_bytes()  # ~14 KB: hashed and written from one read
            if hashlib.md5(data, usedforsecurity=False).hexdigest() != md5:
                log.warning("node code: bytecode cache entry %s is damaged; removed", path)
                self._forget(key, path)
                return None
            dest.parent.mkdir(parents=True, exist_ok=True)  # __pycache__, new in a new home
            fsutil.atomic_write(dest, data, fsync=False)
            os.utime(path)  # used: the last to go
        except OSError:
            return None
        return md5

    def store(self, rel: str, source_md5: str, pyc: Path, pyc_md5: str) -> None:
        """Remember ``pyc`` (the bytecode of ``rel`` with source md5 ``source_md5``, whose
        own md5 is ``pyc_md5``); the oldest entries go past :data:`MAX_FILES`.  A failure
        is logged at debug level and otherwise ignored."""
        key = entry_key(rel, source_md5)
        entries = self._listing()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            old = entries.get(key)
            fsutil.atomic_copy(pyc, self._path(key, pyc_md5), fsync=False)
            entries[key] = pyc_md5
            if old is not None and old != pyc_md5:
                self._path(key, old).unlink(missing_ok=True)
            if len(entries) > MAX_FILES:
                self._prune()
        except OSError as exc:
            log.debug("node code: bytecode of %s not cached in %s (%s)", rel, self.folder,
                      exc)

    def _forget(self, key: str, path: Path) -> None:
        self._listing().pop(key, None)
        with contextlib.suppress(OSError):
            path.unlink()

    def _prune(self) -> None:
        """Remove the oldest entries (by mtime) until :data:`MAX_FILES` are left."""
        entries = self._listing()
        aged: list[tuple[float, str]] = []
        for key, md5 in entries.items():
            try:
                aged.append((self._path(key, md5).stat().st_mtime, key))
            except OSError:
                aged.append((0.0, key))
        aged.sort()
        for _, key in aged[:max(0, len(aged) - MAX_FILES)]:
            self._forget(key, self._path(key, entries[key]))
