"""A test's history: every archived run in which its md5 or error code changed (the bisect
aid behind ``clusteradmin history TEST``).

What "changed" compares against follows how the end of a run compares tables
(:mod:`cluster.master.end.finish`):

* **git and auto runs** make the baseline stream (``tables/current.tab``, which each of them
  updates for the products it tested).  A run of that stream changed the test when its
  (error code, md5) differs from the previous archived run *of that stream that has the
  test* -- which is exactly the baseline row the run was compared with, since the baseline
  keeps a test's row until a run of its product replaces it.
* **user runs** are compared with the baseline as it stood when they ran (the newest
  earlier git or auto run that has the test); where the baseline lacked the test, with the
  user's own previous run that has it (``tables/user-<name>.tab``), as the run's
  ``changed.lst`` does.
* The first run of a stream that has the test counts as a change: ``"new"``.

Only complete runs count: outcome ``done``, with a ``<id>.tab`` in the archive (a failed,
aborted or incomplete run changed no table; a bmpcmp run has none).  Runs are taken in id
order (ids start with their UTC start time).

Speed: each archived ``.tab`` is sorted by test name (:func:`cluster.report.tab.write_tab`),
so the test's row is found by bisecting the file (a few reads of 8 KiB), never by reading
it whole: hundreds of archived runs of a million tests each take milliseconds.  A table
edited out of name order by hand may hide the test from that run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from cluster.console.runinfo import parse_info, run_started
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files.ending import BASELINE_KINDS, Outcome
from cluster.runspec import outside_stream

#: Below this many bytes between the bounds, the bisection reads lines in order.
_SCAN = 8192
#: Where a commit run's report names the author (cluster.master.end.endrun.run_header's lines).
_AUTHOR = re.compile(r"^Author: (.*)$", re.MULTILINE)
#: How much of a report is read for the author line [bytes].
_REPORT_HEAD = 4096


@dataclass(frozen=True)
class Result:
    """A test's result in one run."""

    error: int
    md5: str  # "0" when error is not 0 (compare.pl: an errored test "is" md5 0)
    product: str
    machine: str


@dataclass(frozen=True)
class Change:
    """One archived run in which the test's result changed.

    ``change``: ``new`` (the first run of its stream with the test), ``md5``, ``error``
    (the error code changed), ``error and md5``.  ``before`` is the result compared with
    (None for ``new``) and ``against`` the run it came from.  ``who`` is the commit (git),
    the user (user) or the schedule (auto): the run's queue ref.
    """

    run: str
    kind: str
    who: str
    what: str  # the queue line
    started: float | None
    stream: str  # "baseline" or "user <name>"
    change: str
    before: Result | None
    after: Result
    against: str | None
    author: str = ""  # a commit run's author, from its report

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Run:
    run_id: str
    info: dict[str, str]
    table: Path


def test_id(test: str) -> str:
    """The test id of a name as the report shows it (``/`` for the id's ``__``)."""
    return test.strip().replace("/", "__")


@dataclass(frozen=True)
class Blessed:
    """A blessing of the test (``clusteradmin bless``): from ``when`` (epoch seconds) on,
    the tables ``tables`` hold ``result``, the test's of run ``run``."""

    when: float
    run: str
    result: Result
    tables: tuple[str, ...]


def history(home: Home, test: str, blessings: Iterable[Blessed] = ()) -> list[Change]:
    """Every archived run in which ``test``'s md5 or error code changed, newest first.

    ``test``: a test id (``tests__ex__golfer.eps.ppmraw.72.0``) or its report form
    (``tests/ex/golfer.eps.ppmraw.72.0``).  ClusterError naming the test when no archived
    run's table has it.  ``blessings``: the test's, oldest first; a run that started after
    one is compared with the blessed result in the tables it rewrote (the baseline
    ``current.tab``, a user's ``user-<name>.tab``), as the end of that run was.
    """
    name, key = _test_key(test)
    baseline: tuple[Result, str] | None = None
    users: dict[str, tuple[Result, str]] = {}
    changes: list[Change] = []
    pending = list(blessings)
    searched = 0
    for run in complete_runs(home):
        searched += 1
        started = run_started(run.run_id)
        while pending and started is not None and pending[0].when <= started:
            blessed = pending.pop(0)
            for table in blessed.tables:
                if table == "current.tab":
                    baseline = (blessed.result, blessed.run)
                elif table.startswith("user-") and table.endswith(".tab"):
                    users[table[len("user-"):-len(".tab")]] = (blessed.result, blessed.run)
        found = lookup(run.table, key)
        if found is None:
            continue
        kind, ref = run.info.get("kind", ""), run.info.get("ref", "")
        if outside_stream(run.info.get("queue", "").split()):
            continue  # a bisection or repro run's results never made the baseline
        if kind in BASELINE_KINDS:
            stream, previous = "baseline", baseline
            baseline = (found, run.run_id)
        elif kind == "user":
            stream = f"user {ref}"
            previous = baseline if baseline is not None else users.get(ref)
            users[ref] = (found, run.run_id)
        else:
            continue
        what = _difference(previous[0] if previous else None, found)
        if what:
            changes.append(Change(
                run=run.run_id, kind=kind, who=ref, what=run.info.get("queue", ""),
                started=run_started(run.run_id), stream=stream, change=what,
                before=previous[0] if previous else None, after=found,
                against=previous[1] if previous else None,
                author=_author(run.table.parent) if kind == "git" else ""))
    if baseline is None and not users:
        raise _absent(home, name, searched)
    changes.reverse()
    return changes


@dataclass(frozen=True)
class Timing:
    """A test's times in one archived run (``clusteradmin history TEST --times``): its
    three stage times and their sum, its error code and the node that ran it."""

    run: str
    kind: str
    who: str
    started: float | None
    time1: float
    time2: float
    time3: float
    error: int
    machine: str

    @property
    def seconds(self) -> float:
        return self.time1 + self.time2 + self.time3

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 2)}


def times(home: Home, test: str) -> list[Timing]:
    """``test``'s times in every complete archived run whose table has it, newest first
    (docs/results.md).  ClusterError as :func:`history`'s when no archived run's table has it."""
    name, key = _test_key(test)
    found: list[Timing] = []
    searched = 0
    for run in complete_runs(home):
        searched += 1
        fields = lookup_fields(run.table, key)
        if fields is None:
            continue
        try:
            t1, t2, t3, error = (float(fields[2]), float(fields[3]), float(fields[4]),
                                 int(fields[1]))
        except (ValueError, IndexError):
            continue  # a malformed row: as if the test were not there
        found.append(Timing(run.run_id, run.info.get("kind", ""), run.info.get("ref", ""),
                            run_started(run.run_id), t1, t2, t3, error,
                            fields[9] if len(fields) > 9 else ""))
    if not found:
        raise _absent(home, name, searched)
    found.reverse()
    return found


def _test_key(test: str) -> tuple[str, bytes]:
    """``test`` as a test id and the key a table is searched with; ClusterError unless it
    is a test id (or its report form) without spaces."""
    name = test_id(test)
    if not name or any(c.isspace() for c in name):
        raise ClusterError(f"test name {test!r}: expected a test id without spaces")
    return name, name.encode("utf-8")


def _absent(home: Home, name: str, searched: int) -> ClusterError:
    """The error of a test that none of the ``searched`` archived tables has."""
    return ClusterError(f"test {name!r} is in none of the {searched} archived run tables "
                        f"in {home.archive} (expected a test id as the reports name it)")


def _difference(before: Result | None, after: Result) -> str:
    if before is None:
        return "new"
    error, md5 = before.error != after.error, before.md5 != after.md5
    if error and md5:
        return "error and md5"
    return "error" if error else "md5" if md5 else ""


def complete_runs(home: Home) -> Iterator[_Run]:
    """The archived runs that changed tables (outcome done, with a .tab), oldest first."""
    try:
        names = sorted(n for n in os.listdir(home.archive) if not n.startswith("."))
    except FileNotFoundError:
        return
    for run_id in names:
        folder = home.archive / run_id
        table = folder / f"{run_id}.tab"
        try:
            info = parse_info((folder / "run.info").read_text(encoding="utf-8",
                                                              errors="replace"))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if info.get("outcome") != Outcome.DONE.value or not table.is_file():
            continue
        yield _Run(run_id, info, table)


def lookup(path: Path, name: bytes) -> Result | None:
    """The row of test ``name`` in the name-ordered ``.tab`` at ``path``, by bisection."""
    fields = lookup_fields(path, name)
    if fields is None:
        return None
    try:
        error = int(fields[1])
        return Result(error, fields[6] if error == 0 else "0",
                      fields[8] if len(fields) > 8 else "",
                      fields[9] if len(fields) > 9 else "")
    except (ValueError, IndexError):
        return None  # a malformed row: as if the test were not there


def lookup_fields(path: Path, name: bytes) -> list[str] | None:
    """The columns of test ``name``'s row in the name-ordered ``.tab`` at ``path``, by
    bisection (None when the table has no such row)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return None
    with fh:
        found = _bisect(fh, name)
    return None if found is None else [f.decode("utf-8", errors="replace") for f in found]


def _bisect(fh: BinaryIO, name: bytes) -> list[bytes] | None:
    # Invariant: every line before ``lo`` (a line start) names a test below ``name``, and
    # the first line naming ``name`` or above starts at or before ``hi``.
    lo, hi = 0, fh.seek(0, os.SEEK_END)
    while hi - lo > _SCAN:
        mid = (lo + hi) // 2
        fh.seek(mid - 1)
        fh.readline()  # to the first line start at or after mid
        start = fh.tell()
        if start >= hi:
            break  # one long line: read on in order from lo
        if fh.readline().split(b"\t", 1)[0] < name:
            lo = fh.tell()
        else:
            hi = start
    fh.seek(lo)
    for line in fh:
        fields = line.rstrip(b"\r\n").split(b"\t")
        if fields[0] < name:
            continue
        if fields[0] != name:
            return None
        return fields
    return None


def _author(folder: Path) -> str:
    """The commit's author as the run's report names it ("" if it does not)."""
    try:
        with open(folder / "report.txt", encoding="utf-8", errors="replace") as fh:
            head = fh.read(_REPORT_HEAD)
    except OSError:
        return ""
    match = _AUTHOR.search(head)
    return match.group(1).strip() if match else ""
