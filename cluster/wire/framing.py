"""The framing both socket protocols share: one bounded line reader, one header table.

Both the node protocol (:mod:`cluster.wire.protocol`) and the heartbeat protocol
(:mod:`cluster.wire.heartbeat`) send ``<name> <value>`` lines ended by a terminator line
(``OK``, or ``ABORT`` for a node leaving its run).  This module holds what they share:

* :class:`LineFramer` collects one message from a byte stream and enforces the limits as
  bytes arrive (a hostile peer cannot make a server buffer without bound);
* :func:`decode_lines` turns a complete message into text lines;
* :class:`Header` and :func:`parse_headers`: a protocol declares a table ``{name: Header}``
  saying which fields each header sets and how its value is read, and one parser walks
  the lines.  Unknown headers are ignored (the formats are made to grow, seed 001); a known
  header with a bad value is a :class:`~cluster.errors.ProtocolError` naming the line, its
  number and what the header expects.

Pure code: no sockets, no files, no clock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.errors import ProtocolError

#: Reads a header's value into the values of its fields (one per name in
#: :attr:`Header.fields`); raises ValueError whose text says what the header expects.
ValueParser = Callable[[str], tuple[Any, ...]]


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) folded to one space."""
    return " ".join(text.split())


def decode_lines(data: bytes, what: str = "request") -> list[str]:
    """``data`` as text lines (a final newline does not make an empty last line)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


# ----------------------------------------------------------------------------------------------
# The bounded reader

@functools.lru_cache(maxsize=8)
def _terminator_patterns(terminators: tuple[bytes, ...]
                         ) -> tuple[re.Pattern[bytes], re.Pattern[bytes], str]:
    """A terminator line at the start of the unread lines, one after a newline (whose
    literal first byte makes the search fast), and the terminators in words (for errors).
    Cached: a server makes a framer per connection."""
    words = b"|".join(re.escape(t) for t in terminators)
    return (re.compile(rb"(?:" + words + rb")\r?\n"),
            re.compile(rb"\n(?:" + words + rb")\r?\n"),
            " or ".join(t.decode() for t in terminators))


class LineFramer:
    """Collects one message from a byte stream, enforcing the limits as bytes arrive.

    ``feed(chunk)`` returns the complete message (up to and including its first terminator
    line, an optional CR before the newline allowed) once it has arrived, else None.  It
    raises ProtocolError as soon as a line grows past ``max_line`` bytes or the line count
    past ``max_lines`` (the terminator not counted), naming the line.  Bytes after the
    terminator are ignored.
    """

    __slots__ = ("buf", "line_start", "lines", "max_line", "max_lines", "_first", "_after_nl",
                 "_expected")

    def __init__(self, terminators: tuple[bytes, ...], max_line: int, max_lines: int) -> None:
        self.buf = bytearray()
        self.line_start = 0
        self.lines = 0
        self.max_line = max_line
        self.max_lines = max_lines
        self._first, self._after_nl, self._expected = _terminator_patterns(terminators)

    def feed(self, chunk: bytes) -> bytes | None:
        buf = self.buf
        buf += chunk
        start = self.line_start
        # The first terminator line (at start, or after a newline) among the complete lines.
        found = self._first.match(buf, start) or self._after_nl.search(buf, start)
        end = found.end() if found is not None else buf.rfind(b"\n") + 1
        if end > start:
            if end - start > self.max_line + 1:
                # Some complete line may be too long: look at each (names the first one).
                self._check_lines(start, end)
            lines = self.lines + buf.count(b"\n", start, end)
            if found is not None:
                if lines - 1 > self.max_lines:
                    raise self._too_many()
                return bytes(buf[:end])
            self.lines = lines
            self.line_start = start = end
            if lines > self.max_lines:
                raise self._too_many()
        if len(buf) - start > self.max_line:
            raise self._too_long(self.lines + 1)
        return None

    def _too_many(self) -> ProtocolError:
        return ProtocolError(f"request has more than {self.max_lines} lines before the "
                             f"{self._expected} line")

    def _too_long(self, lineno: int) -> ProtocolError:
        return ProtocolError(f"line longer than {self.max_line} bytes (expected a header "
                             f"line or {self._expected})", lineno=lineno)

    def _check_lines(self, start: int, end: int) -> None:
        buf = self.buf
        lineno = self.lines
        while start < end:
            nl = buf.find(b"\n", start, end)
            lineno += 1
            if nl - start > self.max_line:
                raise self._too_long(lineno)
            if lineno > self.max_lines + 1:
                return  # the caller reports the line count
            start = nl + 1


# ----------------------------------------------------------------------------------------------
# The header table

@dataclass(frozen=True)
class Header:
    """How one header's value becomes fields of the parsed message.

    ``parse`` returns one value per name in ``fields`` or raises ValueError saying what the
    header expects.  A header sent twice normally counts with its last value; a ``unique``
    one sent again with another value is an error.
    """

    fields: tuple[str, ...]
    parse: ValueParser
    unique: bool = False


def text(field: str) -> Header:
    """A free-text header (may be empty)."""
    return Header((field,), lambda value: (value,))


def integers(*fields: str, minimum: int | None = None) -> Header:
    """A header of ``len(fields)`` integers separated by spaces, each >= ``minimum``."""
    count = len(fields)
    expected = f"takes {count} integer(s)"
    if minimum == 0:
        expected += " that must not be negative"
    elif minimum is not None:
        expected += f" of at least {minimum}"

    def parse(value: str) -> tuple[int, ...]:
        words = value.split()
        if len(words) != count:
            raise ValueError(expected)
        try:
            numbers = tuple(int(w) for w in words)
        except ValueError:
            raise ValueError(f"{expected}; integers only") from None
        if minimum is not None and min(numbers) < minimum:
            raise ValueError(expected)
        return numbers

    return Header(fields, parse)


def matching(field: str, pattern: re.Pattern[str], expected: str, *,
             empty_ok: bool = False, unique: bool = False) -> Header:
    """A header whose whole value matches ``pattern`` (``expected`` says what it must be)."""
    def parse(value: str) -> tuple[str]:
        if (value or not empty_ok) and pattern.fullmatch(value) is None:
            raise ValueError(expected)
        return (value,)

    return Header((field,), parse, unique)


def parse_headers(lines: Sequence[str], table: Mapping[str, Header], *, max_line: int,
                  collect: str = "", first_lineno: int = 1, control_ok: bool = True
                  ) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    """The fields the header ``lines`` (terminator excluded) set, by ``table``.

    Returns ``(values, collected)``: ``values`` maps each field of a header that was sent to
    its value; ``collected`` holds ``(line number, value)`` of every ``collect`` header, in
    order, unparsed (a caller may have many, e.g. ``result`` lines, and read them its own
    way).  Empty lines and headers not in ``table`` are skipped.  A CR before the newline is
    dropped.  ProtocolError, naming the line and its number, for a line over ``max_line``
    bytes, a control character when not ``control_ok``, or a value its header refuses.
    """
    values: dict[str, Any] = {}
    collected: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines, first_lineno):
        # A character is at most 4 UTF-8 bytes: only a line that might be too long is encoded.
        if len(raw) * 4 > max_line and len(raw.encode("utf-8")) > max_line:
            raise ProtocolError(f"line longer than {max_line} bytes", raw, lineno)
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line:
            continue
        if not control_ok and any(ord(c) < 32 and c != "\t" for c in line):
            raise ProtocolError("control character in line (expected printable text)",
                                line, lineno)
        name, _, value = line.partition(" ")
        if name == collect:
            collected.append((lineno, value))
            continue
        header = table.get(name)
        if header is None:
            continue  # unknown: the format is meant to grow (seed 001)
        try:
            parsed = header.parse(value)
        except ValueError as exc:
            raise ProtocolError(f"header {name!r} {exc}", line, lineno) from None
        for field_name, field_value in zip(header.fields, parsed, strict=True):
            if header.unique and values.get(field_name, field_value) != field_value:
                raise ProtocolError(f"two different values for header {name!r} (expected "
                                    "it once)", line, lineno)
            values[field_name] = field_value
    return values, collected
