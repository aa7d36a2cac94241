"""The "seen before" list: a port of ``cachearchive.pl``'s ``md5sum.cache`` (ARTIFEX.md §2.8).

After a run that moves the baseline, the master rebuilds the cache from the newest
``window`` (50) archived ``.tab`` files, newest first.  For every (test, digest) pair that
occurs in an older table but not in the newest one, it records the newest run the pair was
seen in, that run's product and machine, and the pair's age.  :func:`cluster.report.compare.analyse`
looks up a test whose md5 changed: a hit means the new output is not new at all (a flaky
test, or a change that was reverted), and the report lists it under "had differences but
matched at least once in the previous 50 runs" instead of under Differences (§2.9).

File format (the Perl's, sorted as its ``sort keys``)::

    50
    <name> <digest> | <rev>\\t<product>\\t<machine>\\t<age>
    ...

* ``<name>`` is the test id as the ``.tab`` has it (with ``__``).  Departure from the Perl,
  which turned ``__`` into ``/`` first: keeping the table's name makes a lookup exact (the
  shown name of ``a__b`` and of a real ``a/b`` is the same).
* ``<digest>`` is :func:`digest_of` the row: the md5 of a test that ran, or the error code of
  one that errored (``8`` for a segfault), as cachearchive.pl stores it.  compare.pl looked an
  errored test up with md5 ``0``, a key the cache never holds, so an error that had been
  seen before was never matched; here report.py looks errored tests up by their code too.
* ``<age>`` is how many runs before the run being reported the pair was last seen, counted
  as the Perl counts it: the newest table given is 1 (the run just before the one the cache
  is consulted for), so ages in the file go from 2 to ``window``.  A pair seen only in a table
  past the window is not in the cache.

Usage::

    rebuild([(run_id, archive / run_id / f"{run_id}.tab") for run_id in newest_first],
            home.root / "md5sum.cache")
    seen = load(home.root / "md5sum.cache")
    hit = seen.lookup("tests__a.pdf.ppmraw.72.0", "0123...")   # Seen or None
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from cluster.report.tab import COLUMNS, MAX_LOGGED, write_tab_lines

logger = logging.getLogger("cluster.md5cache")

#: How many archived tables the cache covers, as cachearchive.pl's ``$previousValues``.
DEFAULT_WINDOW = 50

#: File name of the cache in the master home (the Perl's name).
CACHE_NAME = "md5sum.cache"


class Seen(NamedTuple):
    """Where a digest was last seen: the run label, its product and machine, and how many
    runs ago (see the module docstring for how ages count)."""

    rev: str
    product: str
    machine: str
    age: int


def digest_of(error: int, md5: str) -> str:
    """The digest a row is cached and looked up under: its md5, or its error code."""
    return md5 if error == 0 else str(error)


class SeenCache:
    """A loaded ``md5sum.cache``: :meth:`lookup` answers "was (name, digest) seen before?".

    ``window`` is the number of runs the cache covers (the file's first line); the report
    names it ("... in the previous 50 runs").  Entries are kept under the file's own key,
    ``"<name> <digest>"``: one string per entry is the smallest dict that answers a lookup.
    """

    def __init__(self, entries: dict[str, Seen] | None = None,
                 window: int = DEFAULT_WINDOW) -> None:
        self._entries: dict[str, Seen] = entries if entries is not None else {}
        self.window = window

    def lookup(self, name: str, digest: str) -> Seen | None:
        """The newest earlier run in which test *name* gave *digest* (:func:`digest_of`)."""
        return self._entries.get(f"{name} {digest}")

    def __len__(self) -> int:
        return len(self._entries)


def _bad_line(path: Path, lineno: int, problem: str, line: str, count: int) -> None:
    if count <= MAX_LOGGED:
        shown = line if len(line) <= 80 else line[:77] + "..."
        logger.warning("%s:%d: skipping malformed line: %s (got %r)", path, lineno, problem,
                       shown)


def _rows(path: Path, newest: Callable[[str], str | None] | None = None,
          ) -> Iterator[tuple[str, str, str, str]]:
    """(name, digest, product, machine) of every good line of the ``.tab`` *path*, streamed.

    Only the columns the cache needs are checked (no float parsing: a rebuild reads up to
    50 tables of a million lines).  A malformed line is logged with its line number and
    skipped, as :func:`cluster.report.tab.read_tab` does.  A missing file logs and yields nothing.

    *newest* (the newest table's digest of a name) leaves out, before any other work, the
    lines of tests that ran without error and gave the newest table's md5: almost every
    line of an older table, and never a pair the cache keeps.  (A malformed line that
    looks like one is skipped without a warning.)
    """
    bad = 0
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        logger.warning("%s: archived table is missing; treated as empty", path)
        return
    with fh:
        for lineno, line in enumerate(fh, start=1):
            if newest is not None:
                head = line.split("\t", 7)  # name, error, 4 times, md5, the rest
                if len(head) == 8 and head[1] == "0" and newest(head[0]) == head[6]:
                    continue
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) == COLUMNS - 1:  # empty machine column lost its TAB (see tab.py)
                fields.append("")
            if len(fields) != COLUMNS:
                if line.strip():
                    bad += 1
                    _bad_line(path, lineno, f"expected {COLUMNS} TAB-separated columns, got "
                              f"{len(fields)}", line.rstrip("\r\n"), bad)
                continue
            name, error, md5 = fields[0], fields[1], fields[6]
            if error == "0":
                digest = md5
            else:
                try:
                    digest = str(int(error))  # "08" and "8" are one code
                except ValueError:
                    digest = ""
            if not name or name.split() != [name] or not digest or digest.split() != [digest]:
                bad += 1
                _bad_line(path, lineno, "bad name, error or md5 column", line.rstrip("\r\n"),
                          bad)
                continue
            yield name, digest, fields[8], fields[9]
    if bad > MAX_LOGGED:
        logger.warning("%s: %d malformed lines skipped in all", path, bad)


def rebuild(tabs: Sequence[tuple[str, Path]], out: Path, window: int = DEFAULT_WINDOW) -> None:
    """Rebuild the cache file *out* from archived tables (cachearchive.pl).

    *tabs* are ``(run label, path of an archived .tab)``, **newest first**; only the first
    *window* are read.  The label is what the report shows as the revision the digest was
    last seen in.  The first table's pairs are left out, and every other pair is recorded
    with its newest occurrence and age (position in *tabs* + 1, see the module docstring).
    With fewer than two tables the cache is just the window line.

    Memory: the newest table is held as name -> digest, and only pairs that differ from it
    are kept, each as its key and the number of its "place" (run, product, machine: a few
    hundred at most, shared by all pairs); every older table is streamed.  The file is
    written to a temporary file and renamed over *out*, so the report never reads a
    half-written cache.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    chosen = list(tabs[:window])
    for label, _path in chosen:
        if "\t" in label or "\n" in label or not label.strip():
            raise ValueError(f"run label {label!r} must be non-empty, without TAB or newline")
    newest: dict[str, str] = {}
    # A name twice in the newest table with two digests: both pairs are "current" (the
    # Perl keyed its exclusion set by pair).  Rare; kept apart so `newest` stays str -> str.
    newest_extra: set[str] = set()
    entries: dict[str, int] = {}  # "<name> <digest>" -> its place's number
    places: dict[tuple[str, str, str, int], int] = {}  # (run label, product, machine, age)
    for position, (label, path) in enumerate(chosen):
        if position == 0:
            for name, digest, _product, _machine in _rows(path):
                old = newest.setdefault(name, digest)
                if old != digest:
                    newest_extra.add(f"{name} {digest}")
            continue
        age = position + 1
        get = newest.get
        for name, digest, product, machine in _rows(path, get):
            if get(name) == digest:
                continue  # the test gives today's output (an error code, say): no key built
            key = f"{name} {digest}"
            if key in entries or key in newest_extra:
                continue  # a newer table already has this pair
            place = (label, product, machine, age)
            entries[key] = places.setdefault(place, len(places))
        logger.debug("md5 cache: read %s (%s), %d pairs so far", path, label, len(entries))
    del newest  # the biggest object here; not needed while writing
    write_tab_lines(out, _cache_lines(window, entries, list(places)))
    logger.info("md5 cache: %d pairs from %d tables written to %s", len(entries), len(chosen),
                out)


def _cache_lines(window: int, entries: dict[str, int],
                 places: list[tuple[str, str, str, int]]) -> Iterator[str]:
    yield str(window)
    where = [f"{rev}\t{product}\t{machine}\t{age}" for rev, product, machine, age in places]
    for key in sorted(entries):
        yield f"{key} | {where[entries[key]]}"


def _parse_entry(line: str) -> tuple[str, Seen]:
    """``(key, Seen)`` of one cache line, or ValueError saying what is wrong."""
    left, sep, right = line.partition(" | ")
    if not sep:
        raise ValueError("no ' | ' between the test and where it was seen")
    name, _, digest = left.partition(" ")
    if not name or not digest or digest.split() != [digest]:
        raise ValueError("expected '<name> <digest>' before ' | '")
    fields = right.split("\t")
    if len(fields) != 4:
        raise ValueError(f"expected 4 TAB-separated fields after ' | ', got {len(fields)}")
    rev, product, machine, age_text = fields
    if not rev:
        raise ValueError("empty revision")
    try:
        age = int(age_text)
    except ValueError:
        raise ValueError(f"age {age_text!r} is not an integer") from None
    if age < 1:
        raise ValueError(f"age {age} is not positive")
    return left, Seen(rev, product, machine, age)


def load(path: Path) -> SeenCache:
    """Read the cache file *path*; a missing file is an empty cache.

    The first line is the window size; if it is not a number it is logged, the window is
    :data:`DEFAULT_WINDOW`, and the line is read as an entry.  A corrupt line is logged with
    its line number and skipped; blank lines are ignored.
    """
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return SeenCache()
    entries: dict[str, Seen] = {}
    window = DEFAULT_WINDOW
    bad = 0
    intern: dict[str, str] = {}  # rev/product/machine repeat: one copy each
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.rstrip("\r\n")
            if lineno == 1:
                if line.strip().isascii() and line.strip().isdigit() and int(line) > 0:
                    window = int(line)
                    continue
                logger.warning("%s:1: first line %r is not the window size; assuming %d",
                               path, line[:80], DEFAULT_WINDOW)
            if not line.strip():
                continue
            try:
                key, seen = _parse_entry(line)
            except ValueError as exc:
                bad += 1
                _bad_line(path, lineno, str(exc), line, bad)
                continue
            entries[key] = Seen(intern.setdefault(seen.rev, seen.rev),
                                intern.setdefault(seen.product, seen.product),
                                intern.setdefault(seen.machine, seen.machine), seen.age)
    if bad > MAX_LOGGED:
        logger.warning("%s: %d malformed lines skipped in all", path, bad)
    return SeenCache(entries, window)
