"""A queue file's bad lines (not runs) reported once, across processes: :class:`BadLineLog`.

A line of a queue file that is not a run is skipped by the reader and kept byte for byte
(:mod:`cluster.queue`).  Each distinct bad line is logged once, ever: with file and line
number, its length and at most :data:`EXCERPT_CHARS` characters of it.  The sha256 of the
lines already logged is kept in ``<queue>.reported`` (:data:`REPORTED_SUFFIX`) beside the
queue, pruned to the bad lines still there, so a line that leaves the file and comes back
is new.  At most :data:`MAX_REPORTED` new lines are logged one by one in a pass.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

#: How much of a bad line a log message shows [characters]; its length is given besides.
EXCERPT_CHARS = 200
#: How many first bytes of a line are kept for a message (EXCERPT_CHARS of UTF-8).
EXCERPT_BYTES = 4 * EXCERPT_CHARS
#: At most this many distinct new bad lines are logged one by one in a pass; the others
#: are counted in one more line (a binary file appended to a queue must not flood the log).
MAX_REPORTED = 20
#: Suffix of the side file that remembers which bad lines were logged (``queue.lst.reported``).
REPORTED_SUFFIX = ".reported"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BadLine:
    """A line that is not a run, as it is reported."""

    lineno: int
    digest: str      # sha256 (hex) of the line's bytes
    length: int      # in bytes
    excerpt: bytes   # its first bytes
    problem: str     # what is wrong with it and what was expected


class BadLineLog:
    """The memory of which bad lines of the queue file ``queue_path`` were logged.

    :meth:`report` is called by every transaction with the bad lines it found; it logs
    through ``logger`` (the queue's) those not logged before, by this object or any other
    process.
    """

    def __init__(self, queue_path: Path, logger: logging.Logger) -> None:
        self.queue_path = queue_path
        self.path = queue_path.with_name(queue_path.name + REPORTED_SUFFIX)
        self._logger = logger
        # The digests of the bad lines this object has reported: it never logs one twice,
        # even if the side file is lost or cannot be written.
        self._warned: set[str] = set()

    def report(self, bad: list[BadLine]) -> None:
        """Log the bad lines not logged before (in any process), and remember them.

        The side file holds the digests of the bad lines present at the last look; it is
        read and rewritten under its own flock, so two readers holding the queue's shared
        lock do not both log a line.  It is a memory of what was said, not data: if it is
        lost, a bad line is logged once more; if it cannot be written (a reader without
        write access to the home), this object's own memory is used.
        """
        side = self.path
        if not bad:
            self._warned = set()
            if os.path.lexists(side):
                with contextlib.suppress(OSError):
                    os.unlink(side)
            return
        present: dict[str, BadLine] = {}
        for b in bad:
            present.setdefault(b.digest, b)
        try:
            fd = os.open(side, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o664)
        except OSError as exc:
            self._logger.debug("%s: cannot keep the reported bad lines (%s)", side, exc)
            self._log(present, set())
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            known = set(_read_all(fd).decode("ascii", errors="replace").split())
            self._log(present, known)
            if set(present) != known:
                data = "".join(d + "\n" for d in sorted(present)).encode("ascii")
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
        except OSError as exc:
            self._logger.debug("%s: cannot keep the reported bad lines (%s)", side, exc)
        finally:
            os.close(fd)

    def _log(self, present: dict[str, BadLine], known: set[str]) -> None:
        """Log the bad lines of ``present`` (digest -> line) that neither ``known`` nor
        this object has reported."""
        new = [b for d, b in present.items() if d not in known and d not in self._warned]
        for b in new[:MAX_REPORTED]:
            self._logger.warning("%s:%d: skipping a bad queue line of %d bytes (kept in the "
                                 "file, logged once): %s; it starts %s", self.queue_path,
                                 b.lineno, b.length, b.problem, _excerpt(b.excerpt))
        if len(new) > MAX_REPORTED:
            self._logger.warning("%s: %d more bad queue lines skipped (kept in the file, not "
                                 "logged one by one)", self.queue_path,
                                 len(new) - MAX_REPORTED)
        # Pruned like the side file: a line that leaves the file and comes back is new.
        self._warned = set(present)


def cut(text: str, limit: int = 2 * EXCERPT_CHARS) -> str:
    """``text`` cut to ``limit`` characters (a problem may quote a long word of the line)."""
    return text if len(text) <= limit else text[:limit] + "..."


def _excerpt(data: bytes) -> str:
    """The start of a bad line as a log shows it: at most EXCERPT_CHARS characters."""
    text = data.decode("utf-8", errors="replace")
    return repr(text[:EXCERPT_CHARS]) + ("..." if len(text) > EXCERPT_CHARS else "")


def _read_all(fd: int, limit: int = 64 << 20) -> bytes:
    """The content of the small file open at ``fd`` (at most ``limit`` bytes)."""
    parts: list[bytes] = []
    offset = 0
    while offset < limit:  # bounded by limit
        chunk = os.pread(fd, min(_CHUNK, limit - offset), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)
