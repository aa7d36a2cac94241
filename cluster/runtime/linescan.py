"""A file's lines of any length read in bounded memory: :func:`scan`.

A line up to ``keep`` bytes is held whole; past that only its sha256, its length, its
offset and its first bytes are kept, so a binary file or a runaway writer cannot make a
reader hold a huge line.  The queue files read their lines this way (:mod:`cluster.queue`):
a long line is never a run, but it is kept byte for byte, copied from its offset on a
rewrite.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

#: How much of a file one read takes [bytes].
CHUNK = 1 << 20


@dataclass(frozen=True)
class Line:
    """One physical line of a file as :func:`scan` finds it (without its newline)."""

    offset: int           # of its first byte
    length: int           # in bytes
    data: bytes | None    # its bytes, or None when longer than scan's ``keep``
    excerpt: bytes        # its first bytes (for messages)
    long_digest: str      # sha256 of a long line ("" for a short one: hash it on demand)

    def digest(self) -> str:
        """The sha256 (hex) of the line's bytes."""
        if self.data is None:
            return self.long_digest
        return hashlib.sha256(self.data).hexdigest()


def scan(fh: BinaryIO, *, keep: int, excerpt_bytes: int) -> Iterator[Line]:
    """Every line of ``fh`` from its current position, read in chunks of CHUNK bytes.

    A line of any length costs at most ``keep`` bytes of memory: past that only its sha256,
    its length and its first ``excerpt_bytes`` bytes are kept.  A last line without a
    newline is a line; an empty file has none.
    """
    offset = 0          # of the current line
    short = bytearray()  # the current line while it is short
    hasher: Any = None  # the current line's sha256 once it is long
    length = 0          # of the current line once it is long
    excerpt = b""

    def line() -> Line:
        if hasher is None:
            return Line(offset, len(short), bytes(short), bytes(short[:excerpt_bytes]), "")
        return Line(offset, length, None, excerpt, hasher.hexdigest())

    while chunk := fh.read(CHUNK):  # bounded by the file's size
        view = memoryview(chunk)
        start = 0
        while start < len(chunk):  # each pass consumes one line's piece of the chunk
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            piece = view[start:end]
            if hasher is None and len(short) + len(piece) <= keep:
                short += piece
            else:
                if hasher is None:  # the line just became long
                    hasher = hashlib.sha256(short)
                    excerpt = bytes(short[:excerpt_bytes])
                    length = len(short)
                    if len(excerpt) < excerpt_bytes:
                        excerpt += bytes(piece[:excerpt_bytes - len(excerpt)])
                    short = bytearray()
                hasher.update(piece)
                length += len(piece)
            if nl < 0:
                break
            found = line()
            yield found
            offset += found.length + 1
            short, hasher, length, excerpt = bytearray(), None, 0, b""
            start = nl + 1
    if short or hasher is not None:
        yield line()
