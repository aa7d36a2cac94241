"""Slowdowns named (docs/results.md, "Slowest tests first, and slowdowns named";
Perfherder's alerts): the tests a run made slower.

A test is **slower** when its time in this run is more than ``factor`` times its median
time over the last ``runs`` baseline runs that have it, and at least ``min_seconds`` more
(a test of 0.01 s taking 0.03 s is noise, not news): :func:`is_slower`.  Only rows
without an error count, now and before (a test that timed out or crashed says nothing of
its speed).  A test that none of those runs has is new, not slower.

A test's time is ``time1 + time2 + time3`` of its ``.tab`` row: the user CPU seconds of its
stages, or a ``shell`` job's wall seconds.

The tables are read side by side in name order (each ``.tab`` is written sorted,
:func:`cluster.report.tab.write_tab`), so a million-test run with five baseline runs
holds one line of each file at a time, never a table, and splits only the lines of the
tests that ran for at least ``min_seconds``.  The report's section is
:func:`section`, ``Slower tests``, after the rest of the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cluster.report.compare import display_name

#: The section's title in the report.
TITLE = "Slower tests"
#: Tests listed one by one; the rest are counted.
MAX_LISTED = 200


@dataclass(frozen=True)
class SlowdownRule:
    """The settings of the rule (master.conf ``slowdown_factor``, ``slowdown_min_seconds``,
    ``slowdown_runs``)."""

    factor: float = 2.0
    min_seconds: float = 1.0
    runs: int = 5


@dataclass(frozen=True)
class Slowdown:
    """A slower test: its time now, its median before and how many runs that median is of."""

    name: str
    seconds: float
    median: float
    runs: int

    @property
    def ratio(self) -> float:
        return self.seconds / self.median if self.median > 0 else float("inf")


def is_slower(seconds: float, before: Sequence[float], rule: SlowdownRule) -> bool:
    """Whether a test of ``seconds`` now is slower than its times ``before`` (at least one):
    more than ``rule.factor`` times their median, and at least ``rule.min_seconds`` more."""
    if not before:
        return False
    median = statistics.median(before)
    return seconds > rule.factor * median and seconds - median >= rule.min_seconds


def find(current: Path, previous: Sequence[Path], rule: SlowdownRule) -> list[Slowdown]:
    """The slower tests of the table ``current`` against the tables ``previous`` (the newest
    ``rule.runs`` are used), in name order."""
    found: list[Slowdown] = []
    with ExitStack() as stack:
        files: list[BinaryIO] = []
        for path in previous[:rule.runs]:
            with suppress(FileNotFoundError):
                files.append(stack.enter_context(open(path, "rb")))
        if not files:
            return found
        # Per previous table: its next line and that line's name (b"" at its end).
        lines = [fh.readline() for fh in files]
        names = [line[:line.find(b"\t")] for line in lines]
        readers = [fh.readline for fh in files]
        tables = range(len(files))
        least, factor = rule.min_seconds, rule.factor
        for name, error, seconds in _rows(current):
            wanted = not error and seconds >= least  # else it cannot be slower
            times: list[float] = []
            for k in tables:
                # Each table moves on to the name: one readline and one comparison a line.
                while lines[k] and names[k] < name:
                    line = lines[k] = readers[k]()
                    names[k] = line[:line.find(b"\t")]
                if wanted and names[k] == name and lines[k]:
                    seconds_then = _seconds(lines[k])
                    if seconds_then is not None:
                        times.append(seconds_then)
            if times and seconds > factor * min(times) and is_slower(seconds, times, rule):
                found.append(Slowdown(name.decode("utf-8", errors="replace"), seconds,
                                      statistics.median(times), len(times)))
    return found


def _seconds(line: bytes) -> float | None:
    """A ``.tab`` line's time (time1 + time2 + time3); None for a row with an error, or a
    malformed one."""
    fields = line.split(b"\t", 5)
    try:
        if fields[1] != b"0" and int(fields[1]):
            return None
        return float(fields[2]) + float(fields[3]) + float(fields[4])
    except (ValueError, IndexError):
        return None


def _rows(path: Path) -> Iterator[tuple[bytes, int, float]]:
    """(name, error, seconds) of each good row of the ``.tab`` at ``path``, as bytes, in
    the file's order (name order: :func:`cluster.report.tab.write_tab`); a malformed line
    is passed over (the comparison of the same tables reports it).  A table edited out of
    name order by hand may hide tests (as from ``clusteradmin history``)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            fields = line.split(b"\t", 5)
            try:
                yield fields[0], int(fields[1]), \
                    float(fields[2]) + float(fields[3]) + float(fields[4])
            except (ValueError, IndexError):
                continue


def section(slower: Sequence[Slowdown], rule: SlowdownRule, runs: int) -> str:
    """The report's ``Slower tests`` section: each slower test with its time now, its
    median over the ``runs`` baseline runs and the ratio; '' when no test is slower (a
    report says nothing more then, as compare.pl's lists of changes)."""
    if not slower:
        return ""
    lines = ["", TITLE, "-" * len(TITLE),
             f"(more than {rule.factor:g}x and at least {rule.min_seconds:g} s over the "
             f"median of the last {runs} baseline run{'s' if runs != 1 else ''})"]
    for s in slower[:MAX_LISTED]:
        lines.append(f"{display_name(s.name)} {s.seconds:.2f} s, median {s.median:.2f} s "
                     f"over {s.runs} run{'s' if s.runs != 1 else ''} ({s.ratio:.1f}x)")
    if len(slower) > MAX_LISTED:
        lines.append(f"... and {len(slower) - MAX_LISTED} more")
    return "\n".join(lines) + "\n"
