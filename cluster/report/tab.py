"""The 10-column ``.tab`` result table of ARTIFEX.md §2.5, and the baseline merge of §2.8.

A ``.tab`` file has one line per test, TAB-separated, in this column order::

    name  error  time1  time2  time3  time4(=0)  md5  rev  product  machine

``md5`` is ``0`` whenever ``error`` is not 0; ``product`` is ``gs``, ``pcl``, ``xps``,
``mupdf``, ... or ``<p> pdfwrite`` / ``<p> ps2write`` / ``<p> xpswrite`` for the two-stage
tests.  Files are written sorted by
name (what the Perl's ``sort`` of whole lines gives, since TAB sorts before every name
character) and replaced atomically, so a dashboard or a concurrent ``compare`` never reads a
half-written table.

Usage::

    table = collate(results, rev="12345")
    baseline = merge_baseline(read_tab(current), table, tested_products=["gs", "pdfwrite"])
    write_tab(current, baseline.values())
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cluster.records import JobResult
from cluster.runtime import fsutil

logger = logging.getLogger("cluster.tab")

#: Number of TAB-separated columns of a line.
COLUMNS = 10

#: The lock, in the home's ``tables/``, held while a stream table there is replaced: by the
#: end of a run installing its staged tables
#: (:func:`cluster.master.end.streamtables.install_tables`) and by ``clusteradmin bless``
#: rewriting rows (:mod:`cluster.console.bless`), so neither undoes the other's write.
TABLES_LOCK = "tables.lock"

#: Malformed lines logged one by one per file; the rest are counted in one summary line, so
#: a mangled table of a million lines does not flood the master's log.
MAX_LOGGED = 20

#: Tested-product words that name a two-stage variant of gs rather than a product column of
#: their own.  Every other word is its own product column ("gs" -> "gs", "mupdf" -> "mupdf").
_VARIANT_COLUMNS = {"pdfwrite": "gs pdfwrite", "ps2write": "gs ps2write",
                    "xpswrite": "gs xpswrite"}
#: Products whose own configuration lists hold their two-stage tests (pcl's
#: ``pdf.ppmraw.75.0`` is a test of product pcl, labelled ``pcl pdfwrite``): those columns
#: belong to the product too.  gs's belong to the products pdfwrite, ps2write and xpswrite.
_OWN_TWO_STAGE_COLUMNS = {p: tuple(f"{p} {device}" for device in _VARIANT_COLUMNS)
                          for p in ("pcl", "xps")}


@dataclass(frozen=True, slots=True)
class TabRow:
    """One line of a ``.tab``: the result of one test at one revision.

    ``time4`` is not stored: the format always writes ``0`` there (ARTIFEX.md §2.5).
    """

    name: str
    error: int
    time1: float
    time2: float
    time3: float
    md5: str
    rev: str
    product: str
    machine: str

    def line(self) -> str:
        """The row as one ``.tab`` line, without the newline; md5 is ``0`` when error != 0."""
        md5 = self.md5 if self.error == 0 else "0"
        return "\t".join((self.name, str(self.error), f"{self.time1:.2f}", f"{self.time2:.2f}",
                          f"{self.time3:.2f}", "0", md5, self.rev, self.product, self.machine))

    @classmethod
    def from_result(cls, r: JobResult, rev: str) -> TabRow:
        """The row of a node's result at revision *rev*; its line equals ``r.tab_line(rev)``."""
        return cls(name=r.name, error=r.error, time1=r.time1, time2=r.time2, time3=r.time3,
                   md5=r.md5 if r.error == 0 else "0", rev=rev, product=r.product,
                   machine=r.machine)

    @classmethod
    def parse(cls, line: str) -> TabRow:
        """Parse one ``.tab`` line (a trailing newline is ignored).

        Raises ValueError saying what is wrong (see :func:`split_line`).
        """
        name, error, t1, t2, t3, _t4, md5, rev, product, machine = split_line(line)
        code = int(error)
        # The last three columns repeat from line to line: interned, a million-line table
        # keeps one copy of each.
        return cls(name, code, float(t1), float(t2), float(t3), md5 if code == 0 else "0",
                   sys.intern(rev), sys.intern(product), sys.intern(machine))


def split_line(line: str) -> list[str]:
    """The 10 columns of one ``.tab`` line, checked; ValueError says what is wrong.

    A trailing newline is ignored.  A line of 9 columns is accepted as one whose empty
    ``machine`` column lost its trailing TAB (Perl's ``split`` drops trailing empty fields,
    and editors strip trailing whitespace).  The name and md5 must be non-empty without
    whitespace, the error an integer, the four times numbers.
    """
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) == COLUMNS - 1:
        fields.append("")
    if len(fields) != COLUMNS:
        raise ValueError(f"expected {COLUMNS} TAB-separated columns, got {len(fields)}")
    name, error, md5 = fields[0], fields[1], fields[6]
    if not name or name.split() != [name]:  # empty, or has whitespace
        raise ValueError(f"test name {name!r} is empty or contains whitespace")
    try:
        int(error)
    except ValueError:
        raise ValueError(f"error column {error!r} is not an integer") from None
    for label, value in zip(("time1", "time2", "time3", "time4"), fields[2:6], strict=True):
        try:
            float(value)
        except ValueError:
            raise ValueError(f"{label} column {value!r} is not a number") from None
    if not md5 or md5.split() != [md5]:
        raise ValueError(f"md5 column {md5!r} is empty or contains whitespace")
    return fields


#: A result table keyed by test name.
Table = dict[str, TabRow]


def read_tab(path: Path) -> Table:
    """Read a ``.tab`` file into a table keyed by test name.

    A missing file is an empty table (the first run of a stream has no baseline).  A malformed
    line is logged with the file and line number and skipped; the other lines are kept, so one
    torn or hand-edited line does not cost the whole baseline.  Blank lines are ignored.  When
    a name occurs twice the later line wins, as in compare.pl's hash.  Small tables only: a
    master reads the big previous tables as :class:`TabFile`.
    """
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    with fh:
        return _table_of(path, fh)


def _table_of(path: Path, lines: Iterable[str], known_bad: frozenset[int] = frozenset(),
              ) -> Table:
    """The table of the ``.tab`` *lines* of *path*, as :func:`read_tab` describes.

    Lines numbered in *known_bad* were found malformed and logged already: skipped quietly.
    """
    table: Table = {}
    bad = 0
    for lineno, line in enumerate(lines, start=1):
        if lineno in known_bad or not line.strip():
            continue
        try:
            row = TabRow.parse(line)
        except ValueError as exc:
            bad += 1
            if bad <= MAX_LOGGED:
                _log_bad(path, lineno, exc, line)
            continue
        table[row.name] = row
    if bad > MAX_LOGGED:
        logger.warning("%s: %d malformed .tab lines skipped in all", path, bad)
    return table


def _log_bad(path: Path, lineno: int, exc: ValueError, line: str) -> None:
    line = line.rstrip("\r\n")
    shown = line if len(line) <= 80 else line[:77] + "..."
    logger.warning("%s:%d: skipping malformed .tab line: %s (got %r)", path, lineno, exc, shown)


class Entry(NamedTuple):
    """What a one-pass comparison needs of one row of a previous table.

    ``md5`` is the effective md5 (``"0"`` when ``error`` is not 0); ``source`` is the row
    itself, or its ``.tab`` line when the table is streamed from a file (:meth:`row` makes
    the row only for the few tests a report lists).
    """

    name: str
    error: int
    md5: str
    product: str
    source: TabRow | str

    def row(self) -> TabRow:
        return self.source if isinstance(self.source, TabRow) else TabRow.parse(self.source)

    def line(self) -> str:
        return self.source.line() if isinstance(self.source, TabRow) \
            else self.source.rstrip("\r\n")


class TabFile:
    """A ``.tab`` file read in name order, one row at a time, never held whole.

    The previous tables of a stream (the baseline, a user's previous push) hold a row per
    test: a million of them as TabRows would take about 400 MB of the master's 500 MB
    budget.  The comparison and the stream merge only need one pass in name order, which
    the file already has (:func:`write_tab` sorts), so they take a TabFile and merge it
    with the run's names (:func:`cluster.report.compare.analyse`, :func:`merged_lines`).

    Each pass re-reads the file.  The first pass over a file (one inode: a table replaced
    by a rename is a new file) checks every line first, as :func:`read_tab` does, logging
    malformed lines with their line numbers; the passes skip those lines and only split
    the others.  A file that is not in name order or names a test twice (edited by hand)
    is read whole, sorted and deduplicated (the later line wins, as in read_tab), with a
    warning: correct, at read_tab's memory cost.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._checked: tuple[int, int, int, int] | None = None  # the file that was checked
        self._bad: frozenset[int] = frozenset()  # its malformed lines (numbers)
        self._in_order = True

    def entries(self) -> Iterator[Entry]:
        """Every good row as an :class:`Entry`, in name order, each name once."""
        try:
            fh = open(self.path, encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return
        with fh:
            st = os.fstat(fh.fileno())
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if identity != self._checked:
                self._bad, self._in_order = _check_lines(self.path, fh)
                self._checked = identity
                fh.seek(0)
            if not self._in_order:
                yield from entries(_table_of(self.path, fh, self._bad))
                return
            bad = self._bad
            for lineno, line in enumerate(fh, start=1):
                if lineno in bad or not line.strip():
                    continue
                fields = line.rstrip("\r\n").split("\t", 9)
                error = int(fields[1])
                yield Entry(fields[0], error, fields[6] if error == 0 else "0",
                            sys.intern(fields[8]), line)


def _check_lines(path: Path, lines: Iterable[str]) -> tuple[frozenset[int], bool]:
    """(numbers of the malformed lines, whether the good ones are in strict name order)."""
    bad: list[int] = []
    last = ""
    in_order = True
    for lineno, line in enumerate(lines, start=1):
        try:
            name = split_line(line)[0]
        except ValueError as exc:
            if line.strip():
                bad.append(lineno)
                if len(bad) <= MAX_LOGGED:
                    _log_bad(path, lineno, exc, line)
            continue
        if in_order and name <= last:
            logger.warning("%s:%d: %s %s; reading the table whole to sort it", path, lineno,
                           name[:80], "repeats a test" if name == last else
                           "is out of name order")
            in_order = False
        last = name
    if len(bad) > MAX_LOGGED:
        logger.warning("%s: %d malformed .tab lines skipped in all", path, len(bad))
    return frozenset(bad), in_order


#: A previous table as the comparisons take it: in memory, or streamed from its file.
Previous = Mapping[str, TabRow] | TabFile


def entries(table: Previous) -> Iterator[Entry]:
    """The rows of *table* as :class:`Entry` in name order (a TabFile streams its file)."""
    if isinstance(table, TabFile):
        return table.entries()
    return (Entry(name, row.error, row.md5 if row.error == 0 else "0", row.product, row)
            for name, row in sorted(table.items()))


def write_tab(path: Path, rows: Iterable[TabRow]) -> None:
    """Write *rows* to *path* sorted by name, replacing the file atomically.

    Every row given is written (the caller dedupes; a :data:`Table` already is).  The write
    is :func:`cluster.runtime.fsutil.atomic_writer`'s, fsync'ed (a table is the baseline of
    later runs): readers see the old table or the new one, never a torn one, a failure
    leaves no temporary file behind, and the new file keeps the mode of the one it replaces
    (0644 for a new one, so dashboards and CGI readers can read it).
    """
    write_tab_lines(path, (row.line() for row in sorted(rows, key=lambda r: r.name)))


def write_tab_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``.tab`` *lines* (no newlines, already in name order) as :func:`write_tab` does.

    The lines are streamed to the temporary file, so a million of them never sit in memory
    as one text.
    """
    with fsutil.atomic_writer(path) as f:
        chunk: list[str] = []
        for line in lines:
            chunk.append(line)
            if len(chunk) >= 8192:
                chunk.append("")
                f.write("\n".join(chunk))
                chunk.clear()
        if chunk:
            chunk.append("")
            f.write("\n".join(chunk))


def collate(results: Iterable[JobResult], rev: str) -> Table:
    """The table of a run's results at revision *rev*.

    When a test has several results (a job handed out twice near the end of a run), the first
    one is kept: it is the one the master accepted, later copies are the "late duplicates"
    the report counts.
    """
    table: Table = {}
    for r in results:
        if r.name in table:
            logger.debug("ignoring duplicate result for %s from %s", r.name, r.machine or "?")
            continue
        table[r.name] = TabRow.from_result(r, rev)
    return table


def product_column(product: str) -> str:
    """The ``.tab`` product column a tested-product word stands for.

    ``pdfwrite`` -> ``gs pdfwrite``, ``ps2write`` -> ``gs ps2write``; every other word
    (``gs``, ``mupdf``, or an already spelled-out ``gs pdfwrite``) is the column itself.
    """
    return _VARIANT_COLUMNS.get(product, product)


def product_columns(products: Iterable[str]) -> frozenset[str]:
    """The set of product columns of the tested-product words *products*: each word's
    :func:`product_column`, and for pcl and xps also their two-stage columns (``pcl
    pdfwrite``, ...), which no other product word names."""
    columns: set[str] = set()
    for p in products:
        columns.add(product_column(p))
        columns.update(_OWN_TWO_STAGE_COLUMNS.get(p, ()))
    return frozenset(columns)


def merge_baseline(old: Table, new: Table, tested_products: Iterable[str]) -> Table:
    """The new baseline after a run of *tested_products* (ARTIFEX.md §2.8).

    Lines of *old* whose product column belongs to a tested product are dropped, even if the
    new run did not produce that test (a removed test must leave the baseline), then every line
    of *new* is added, overriding *old*.  Lines of untested products are kept, so the baseline
    stays complete across all products after a run that tested only some of them.
    """
    tested = product_columns(tested_products)
    merged: Table = {name: row for name, row in old.items() if row.product not in tested}
    merged.update(new)
    return merged


def merged_lines(old: Previous, new: Mapping[str, TabRow],
                 tested_products: Iterable[str],
                 not_run: AbstractSet[str] = frozenset()) -> Iterator[str]:
    """The lines of ``merge_baseline(old, new, tested_products)`` in name order.

    ``not_run``: tests of the run that were not run (their program was not built, issue
    22); their lines of *old* are kept as they were, whatever their product.

    A merge of two name-ordered streams: *old* (a :class:`TabFile` is read as it goes) and
    the names of *new*.  For a *new* of a million rows made on demand
    (:class:`cluster.master.model.results.ResultTable`) a table with a ``line(name)``
    method gives its lines without TabRows.  Neither table is ever held whole.
    """
    tested = product_columns(tested_products)
    line_of = getattr(new, "line", None)
    kept = (e for e in entries(old)
            if (e.product not in tested or e.name in not_run) and e.name not in new)
    pending = next(kept, None)
    for name in sorted(new):
        while pending is not None and pending.name < name:
            yield pending.line()
            pending = next(kept, None)
        yield line_of(name) if line_of is not None else new[name].line()
    while pending is not None:
        yield pending.line()
        pending = next(kept, None)


def with_rows(old: Previous | None, rows: Mapping[str, TabRow]) -> Iterator[str]:
    """The lines of *old* with the tests of *rows* replaced by (or added as) those rows,
    in name order: what ``clusteradmin bless`` makes of a stream table.  *old* is streamed
    (a :class:`TabFile`); None is an empty table."""
    return merged_lines(old if old is not None else {}, rows, ())


def rebased_lines(base: Previous, ours: Previous, theirs: Previous) -> Iterator[str]:
    """A three-way merge of name-ordered tables, in name order: each test's line of
    *ours* where *ours* changed it from *base*, else its line of *theirs*.

    The end of a run stages its new stream table (*ours*) from the table as it was
    (*base*); when the table was rewritten meanwhile (*theirs*, by ``clusteradmin
    bless``), the run's own rows win and the rewrite is kept for every other test.  A test
    absent from a table counts as a line of its own (so a removal is a change too).
    """
    streams = [entries(base), entries(ours), entries(theirs)]
    heads: list[Entry | None] = [next(s, None) for s in streams]
    while any(h is not None for h in heads):
        name = min(h.name for h in heads if h is not None)
        line: list[str | None] = [None, None, None]
        for i, head in enumerate(heads):
            if head is not None and head.name == name:
                line[i] = head.line()
                heads[i] = next(streams[i], None)
        chosen = line[1] if line[1] != line[0] else line[2]
        if chosen is not None:
            yield chosen
