"""The 10-column ``.tab`` result table of ARTIFEX.md §2.5, and the baseline merge of §2.8.

A ``.tab`` file has one line per test, TAB-separated, in this column order::

    name  error  time1  time2  time3  time4(=0)  md5  rev  product  machine

``md5`` is ``0`` whenever ``error`` is not 0; ``product`` is ``gs``, ``mupdf``, ... or
``<p> pdfwrite`` / ``<p> ps2write`` for the two-stage tests.  Files are written sorted by
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
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.records import JobResult

logger = logging.getLogger("cluster.tab")

#: Number of TAB-separated columns of a line.
COLUMNS = 10

#: Mode of a newly created table when there is no older file to take the mode from
#: (``tempfile`` creates 0600, which would hide the table from dashboards and CGI readers).
NEW_FILE_MODE = 0o644

#: Tested-product words that name a two-stage variant of gs rather than a product column of
#: their own.  Every other word is its own product column ("gs" -> "gs", "mupdf" -> "mupdf").
_VARIANT_COLUMNS = {"pdfwrite": "gs pdfwrite", "ps2write": "gs ps2write"}


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

        Raises ValueError saying what is wrong.  A line of 9 columns is accepted as one whose
        empty ``machine`` column lost its trailing TAB (Perl's ``split`` drops trailing empty
        fields, and editors strip trailing whitespace).
        """
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) == COLUMNS - 1:
            fields.append("")
        if len(fields) != COLUMNS:
            raise ValueError(f"expected {COLUMNS} TAB-separated columns, got {len(fields)}")
        name, error, t1, t2, t3, t4, md5, rev, product, machine = fields
        if not name or name.split() != [name]:  # empty, or has whitespace
            raise ValueError(f"test name {name!r} is empty or contains whitespace")
        try:
            code = int(error)
        except ValueError:
            raise ValueError(f"error column {error!r} is not an integer") from None
        try:
            times = [float(t1), float(t2), float(t3), float(t4)]
        except ValueError:
            for label, value in (("time1", t1), ("time2", t2), ("time3", t3), ("time4", t4)):
                try:
                    float(value)
                except ValueError:
                    raise ValueError(f"{label} column {value!r} is not a number") from None
            raise
        if not md5 or md5.split() != [md5]:
            raise ValueError(f"md5 column {md5!r} is empty or contains whitespace")
        # The last three columns repeat from line to line: interned, a million-line table
        # keeps one copy of each.
        return cls(name, code, times[0], times[1], times[2], md5 if code == 0 else "0",
                   sys.intern(rev), sys.intern(product), sys.intern(machine))


#: A result table keyed by test name.
Table = dict[str, TabRow]


def read_tab(path: Path) -> Table:
    """Read a ``.tab`` file into a table keyed by test name.

    A missing file is an empty table (the first run of a stream has no baseline).  A malformed
    line is logged with the file and line number and skipped; the other lines are kept, so one
    torn or hand-edited line does not cost the whole baseline.  Blank lines are ignored.  When
    a name occurs twice the later line wins, as in compare.pl's hash.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    table: Table = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = TabRow.parse(line)
        except ValueError as exc:
            shown = line if len(line) <= 80 else line[:77] + "..."
            logger.warning("%s:%d: skipping malformed .tab line: %s (got %r)",
                           path, lineno, exc, shown)
            continue
        table[row.name] = row
    return table


def write_tab(path: Path, rows: Iterable[TabRow]) -> None:
    """Write *rows* to *path* sorted by name, replacing the file atomically.

    Every row given is written (the caller dedupes; a :data:`Table` already is).  The text
    goes to a temporary file in the same directory, is fsync'ed, and is renamed over *path*
    with ``os.replace``: readers see the old table or the new one, never a torn one, and a
    crash leaves no temporary file behind.  The new file keeps the mode of the one it
    replaces, or gets :data:`NEW_FILE_MODE`.
    """
    write_tab_lines(path, (row.line() for row in sorted(rows, key=lambda r: r.name)))


def write_tab_lines(path: Path, lines: Iterable[str]) -> None:
    """Write ``.tab`` *lines* (no newlines, already in name order) as :func:`write_tab` does.

    The lines are streamed to the temporary file, so a million of them never sit in memory
    as one text.
    """
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = NEW_FILE_MODE
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
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
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        # BaseException so that a KeyboardInterrupt mid-write also removes the temp file.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


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
    """The set of product columns of the tested-product words *products*."""
    return frozenset(product_column(p) for p in products)


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


def merged_lines(old: Mapping[str, TabRow], new: Mapping[str, TabRow],
                 tested_products: Iterable[str]) -> Iterator[str]:
    """The lines of ``merge_baseline(old, new, tested_products)`` in name order.

    For a *new* of a million rows made on demand (:class:`cluster.runstate.ResultTable`),
    whose rows as one dict would not fit the master's memory budget: only the names are
    collected, and a table with a ``line(name)`` method gives its lines without TabRows.
    """
    tested = product_columns(tested_products)
    names = {name for name, row in old.items() if row.product not in tested}
    names.update(new)
    line_of = getattr(new, "line", None)
    for name in sorted(names):
        if name in new:
            yield line_of(name) if line_of is not None else new[name].line()
        else:
            yield old[name].line()
