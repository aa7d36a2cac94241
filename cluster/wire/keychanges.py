"""The ``keychanges`` header of a node request (docs/protocol.md): for each program whose
build digest moved since the node last computed it, how many parts of its key changed and
the first few of them, percent-encoded.  Pure code; :mod:`cluster.wire.protocol` re-exports
it.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from cluster.wire.jobstart import MAX_PROGRAMS, PROGRAM

#: The most changed parts a ``keychanges`` header names per program (the count says how
#: many changed in all), and the longest part named [characters, encoded].
MAX_KEY_PARTS = 8
MAX_KEY_PART = 512
#: What a part may hold once percent-encoded (:func:`format_keychanges`).
_KEY_PART = re.compile(r"[A-Za-z0-9_.~/:@+%-]{1," + str(MAX_KEY_PART) + "}")

KeyChanges = tuple[tuple[str, int, tuple[str, ...]], ...]


def parse_keychanges(value: str) -> KeyChanges:
    """The ``keychanges`` header as (program, parts changed in all, the parts named)
    sorted by program; the parts decoded.  ValueError says what is wrong."""
    out: dict[str, tuple[int, tuple[str, ...]]] = {}
    words = value.split(";") if value.strip() else []
    if len(words) > MAX_PROGRAMS:
        raise ValueError(f"takes at most {MAX_PROGRAMS} <program>=<n>:<parts> words, got "
                         f"{len(words)}")
    for word in words:
        name, eq, rest = word.strip().partition("=")
        count, colon, joined = rest.partition(":")
        parts = joined.split("|") if joined else []
        if (not eq or not colon or not PROGRAM.fullmatch(name) or not count.isdigit()
                or len(count) > 9 or len(parts) > MAX_KEY_PARTS
                or not all(_KEY_PART.fullmatch(part) for part in parts)
                or int(count) < len(parts)):
            raise ValueError(f"takes <program>=<count>:<part>|<part>... words (at most "
                             f"{MAX_KEY_PARTS} percent-encoded parts of at most "
                             f"{MAX_KEY_PART} characters, no more than the count), got "
                             f"{word[:120]!r}")
        if name in out:
            raise ValueError(f"program {name!r} given twice")
        out[name] = (int(count), tuple(unquote(part, errors="surrogateescape")
                                       for part in parts))
    return tuple((name, count, parts) for name, (count, parts) in sorted(out.items()))


def _encode_part(part: str) -> str:
    """``part`` percent-encoded for a ``keychanges`` word, cut to :data:`MAX_KEY_PART`
    characters (never inside a ``%XX`` escape)."""
    encoded = quote(part, safe="/:@+~", errors="surrogateescape")
    if len(encoded) <= MAX_KEY_PART:
        return encoded
    cut = encoded[:MAX_KEY_PART]
    escape = cut.rfind("%", len(cut) - 2)
    return cut[:escape] if escape >= 0 else cut


def format_keychanges(changes: KeyChanges) -> str:
    """The ``keychanges`` header's value (the inverse of :func:`parse_keychanges`): at most
    :data:`MAX_KEY_PARTS` parts per program, each percent-encoded and cut to
    :data:`MAX_KEY_PART` characters."""
    words = []
    for name, count, parts in changes[:MAX_PROGRAMS]:
        encoded = [_encode_part(part) for part in parts[:MAX_KEY_PARTS] if part]
        words.append(f"{name}={max(count, len(encoded))}:{'|'.join(encoded)}")
    return ";".join(words)
