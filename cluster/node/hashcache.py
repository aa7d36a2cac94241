"""File hashes a node remembers between runs, so that hashing what a program loads stays
cheap (docs/results.md, "A job's key").

A :class:`HashCache` gives the sha256 of a file's content, and optionally a short *note*
about it (what :mod:`cluster.node.loadset` needs to know of a file: ELF and its loader, or
a script's words), and remembers both under the file's path with its size, modification
time (ns), change time (ns) and inode.  Asked again for a file whose four are unchanged, it
answers from memory without opening the file; when any of them moved (an edit, a package
upgrade that replaces the file, a ``touch``) the file is read again.  The change time and
the inode are there because a package manager writes a new file with the package's mtime,
which can equal the old one.

The memory is a JSON file (:meth:`save`, written atomically, never fsynced: losing it costs
one full hash again, nothing else) holding exactly the files asked for since it was loaded,
so it never grows beyond what one computation touches.  A file that does not read back
(missing, torn, an old format) is an empty cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.runtime import fsutil

log = logging.getLogger("cluster.hashcache")

#: The format's first field; a file of another version is ignored.
VERSION = 1
#: Read size when hashing [bytes].
CHUNK = 1 << 20
#: How much of a file's beginning a note is made from [bytes].
HEAD = 256 * 1024

#: What a note is made from: the first :data:`HEAD` bytes of the file.
Describe = Callable[[bytes], str]
#: (size, mtime_ns, ctime_ns, inode): a file not rewritten keeps all four.
StatKey = tuple[int, int, int, int]
#: The key of a file that changed while it was read: never remembered.
_UNSTABLE: StatKey = (-1, -1, -1, -1)


@dataclass(frozen=True)
class Entry:
    """What is remembered of one file: its :data:`StatKey`, content sha256 and note (None
    when no caller asked for one yet)."""

    key: StatKey
    sha256: str
    note: str | None


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class HashCache:
    """File hashes by path, remembered by size, mtime, ctime and inode (module docstring).

    ``path``: the file kept between computations (None: remember nothing across them).
    :attr:`hashed` counts the files read since it was made: 0 on a second computation over
    unchanged files.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._old: dict[str, Entry] = self._load(path) if path is not None else {}
        self._used: dict[str, Entry] = {}
        self.hashed = 0

    @staticmethod
    def _load(path: Path) -> dict[str, Entry]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("file hash cache %s unreadable (%s): hashing everything again",
                        path, exc)
            return {}
        out: dict[str, Entry] = {}
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return out
        files = data.get("files")
        if not isinstance(files, dict):
            return out
        for name, row in files.items():
            try:
                size, mtime, ctime, ino, sha, note = row
            except (TypeError, ValueError):
                continue
            # A key field of another type never equals a stat key: such an entry is only
            # ever read again, never wrongly trusted; the answers must be strings.
            if type(sha) is str and (note is None or type(note) is str):
                out[name] = Entry((size, mtime, ctime, ino), sha, note)
        return out

    def lookup(self, path: str, describe: Describe | None = None) -> Entry:
        """The entry of the file ``path`` (followed if a link): from memory when its stat key
        is unchanged (and a note is there when ``describe`` is given), else read whole: its
        sha256, and ``describe(first bytes)`` as its note when ``describe`` is given.
        OSError when it cannot be read."""
        known = self._used.get(path)
        if known is not None and (describe is None or known.note is not None):
            return known  # asked twice in one computation: stat once
        st = os.stat(path)
        key = stat_key(st)
        old = known or self._old.get(path)
        if old is not None and old.key == key and (describe is None or old.note is not None):
            self._used[path] = old
            return old
        entry = self._read(path, describe)
        if entry.key != _UNSTABLE:
            self._used[path] = entry
        return entry

    def sha256(self, path: str) -> str:
        """The sha256 hex of the file ``path``'s content (:meth:`lookup`)."""
        return self.lookup(path).sha256

    def _read(self, path: str, describe: Describe | None) -> Entry:
        digest = hashlib.sha256()
        head = b""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            before = stat_key(os.fstat(fh.fileno()))
            while chunk := fh.read(CHUNK):
                if len(head) < HEAD:
                    head += chunk[:HEAD - len(head)]
                digest.update(chunk)
            after = stat_key(os.fstat(fh.fileno()))
        self.hashed += 1
        note = describe(head) if describe is not None else None
        # A file written while it was read: its hash is of no one version, so it is
        # answered but not remembered (read again next time).
        return Entry(after if before == after else _UNSTABLE, digest.hexdigest(), note)

    def save(self) -> None:
        """Write the files asked for since this cache was made (only those) to
        :attr:`path`, atomically (not at all when that is what it holds already); a
        failure is logged, never raised (the cache is a speed, not a truth)."""
        if self.path is None:
            return
        if not self.hashed and self._used.keys() == self._old.keys() and all(
                self._used[name] is self._old[name] for name in self._used):
            return  # nothing read, nothing dropped: the file on disk says the same
        files = {name: [*e.key, e.sha256, e.note] for name, e in sorted(self._used.items())}
        text = json.dumps({"version": VERSION, "files": files}, separators=(",", ":"))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fsutil.atomic_write(self.path, text, fsync=False)
        except OSError as exc:
            log.warning("cannot write the file hash cache %s: %s", self.path, exc)
