"""Slowdowns named (issue 26, Perfherder's alerts): the tests a run made slower.

A test is **slower** when its time in this run is more than ``factor`` times its median
time over the last ``runs`` baseline runs that have it, and at least ``min_seconds`` more
(a test of 0.01 s taking 0.03 s is noise, not news): :func:`is_slower`.  Only rows
without an error count, now and before (a test that timed out or crashed says nothing of
its speed).  A test that none of those runs has is new, not slower.

A test's time is ``time1 + time2 + time3`` of its ``.tab`` row (:func:`row_seconds`): the
user CPU seconds of its stages, or a ``shell`` job's wall seconds.

The tables are streamed side by side in name order (each ``.tab`` is written sorted,
:func:`cluster.report.tab.write_tab`), so a million-test run with five baseline runs
holds one row of each file at a time, never a table.  The report's section is
:func:`section`, ``Slower tests``, after the rest of the report.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.report.compare import display_name
from cluster.report.tab import Entry, TabFile

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


def row_seconds(entry: Entry) -> float:
    """A ``.tab`` row's time: the sum of its three stage times."""
    fields = entry.line().split("\t", 5)
    return float(fields[2]) + float(fields[3]) + float(fields[4])


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
    streams = [_Cursor(TabFile(p).entries()) for p in previous[:rule.runs]]
    found: list[Slowdown] = []
    if not streams:
        return found
    for entry in TabFile(current).entries():
        before = [s for s in (c.seconds_of(entry.name) for c in streams) if s is not None]
        if entry.error:
            continue
        seconds = row_seconds(entry)
        if is_slower(seconds, before, rule):
            found.append(Slowdown(entry.name, seconds, statistics.median(before),
                                  len(before)))
    return found


class _Cursor:
    """One previous table, read forward in name order as the current one is."""

    def __init__(self, entries: Iterator[Entry]) -> None:
        self._entries = entries
        self._pending: Entry | None = next(entries, None)

    def seconds_of(self, name: str) -> float | None:
        """The time of test ``name`` in this table (None: absent, or an error there).
        Names must be asked in increasing order."""
        pending = self._pending
        while pending is not None and pending.name < name:
            pending = next(self._entries, None)
        self._pending = pending
        if pending is None or pending.name != name or pending.error:
            return None
        return row_seconds(pending)


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
