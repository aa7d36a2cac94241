"""Blessed outputs: accepting an intended change once (``clusteradmin bless``;
docs/operating.md, "Accepting an intended change: ``clusteradmin bless``").

:func:`bless` takes an archived run and some of its tests (by default every test it
reported as changed) and makes their rows of that run -- md5 and error code -- the rows of
the tables the run was compared with, so a later run that reproduces them reports no
difference, and one that differs from them is reported again:

* a ``git`` or ``auto`` run: the baseline ``tables/current.tab``;
* a ``user`` run: the baseline (when there is one) and the user's previous-push table
  ``tables/user-<name>.tab``.

The tables are rewritten atomically under ``tables/``'s lock
(:data:`cluster.report.tab.TABLES_LOCK`), which the end of a run also takes to install
its tables; a run that ended meanwhile rebases on the rewrite
(:func:`cluster.master.end.streamtables.install_tables`).  Each blessed test gets a line in the
append-only audit record ``tables/blessings.tsv`` (:class:`Blessing`): when, who, which
run, which test and result, which tables, why.  ``clusteradmin history TEST`` shows a
test's blessings, and counts from each one on against the blessed result.

"Reported as changed": the tests of the run's ``changed.lst`` (a user run's), else the
tests whose md5 or error code differs from the baseline's row now (a commit run already
made its rows the baseline; a later run may have changed them back).
"""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cluster.console import history, runinfo
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files.ending import BASELINE_KINDS, Outcome
from cluster.report import tab
from cluster.runspec import RunSpec
from cluster.runtime import fsutil

#: The audit record of blessings, in the home's ``tables/``: one line per blessed test.
RECORD_NAME = "blessings.tsv"
#: The baseline table, in the home's ``tables/``.
BASELINE = "current.tab"
#: A user run's list of the tests that differed (cluster.master.end.finish.CHANGED_LIST).
CHANGED_LIST = "changed.lst"


@dataclass(frozen=True)
class Blessing:
    """One blessed test: at ``when`` (epoch seconds) ``who`` made its ``error``/``md5`` of
    run ``run`` the rows of ``tables`` (their names), because ``reason``.

    A line of the record: ``when who run test error md5 tables reason``, TAB-separated,
    ``when`` as ``YYYY-mm-dd HH:MM:SS`` UTC, ``tables`` comma-separated, ``reason`` last
    and folded to one line (it may hold anything but a TAB or a newline).
    """

    when: float
    who: str
    run: str
    test: str
    error: int
    md5: str
    tables: tuple[str, ...]
    reason: str

    def line(self) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.when))
        return "\t".join((stamp, _field(self.who), self.run, self.test, str(self.error),
                          self.md5, ",".join(self.tables), _field(self.reason)))

    @classmethod
    def parse(cls, line: str) -> Blessing:
        """ValueError for a line that is not a record's."""
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 8:
            raise ValueError(f"expected 8 TAB-separated fields, got {len(parts)}")
        stamp, who, run, test, error, md5, tables, reason = parts
        when = float(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")))
        return cls(when, who, run, test, int(error), md5, tuple(tables.split(",")), reason)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["when"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.when))
        data["tables"] = list(self.tables)
        return data


def _field(text: str) -> str:
    """``text`` on one line without TABs (a field of the record)."""
    return " ".join(text.split())


def read(tables: Path) -> list[Blessing]:
    """Every blessing of the record, oldest first (malformed lines skipped)."""
    try:
        text = (tables / RECORD_NAME).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    found: list[Blessing] = []
    for line in text.splitlines():
        try:
            found.append(Blessing.parse(line))
        except ValueError:
            continue
    return found


def of_test(tables: Path, test: str) -> list[Blessing]:
    """The blessings of test id ``test``, oldest first."""
    return [b for b in read(tables) if b.test == test]


def targets(home: Home, kind: str, ref: str) -> list[Path]:
    """The tables a run of ``kind`` by ``ref`` was compared with, that a blessing rewrites:
    the baseline (a user run's only when it exists) and a user run's previous push."""
    baseline = home.tables / BASELINE
    if kind in BASELINE_KINDS:
        return [baseline]
    if kind == "user":
        push = home.tables / f"user-{ref}.tab"
        return [baseline, push] if baseline.exists() else [push]
    raise ClusterError(f"a {kind} run is compared with no baseline: nothing to bless")


def bless(home: Home, run_id: str, tests: Sequence[str], reason: str, who: str,
          now: float | None = None) -> list[Blessing]:
    """Bless ``tests`` of archived run ``run_id`` (none: every test it reported as
    changed); return the blessings recorded, one per test.

    ClusterError, with nothing changed, for: an empty ``reason``; an unknown run; a run
    with no archived table (it did not complete, or is a bmpcmp run) or a sweep run; a
    named test that is not in the run's table; no test to bless.
    """
    reason = _field(reason)
    if not reason:
        raise ClusterError("a blessing needs a reason (--reason R): it is audited")
    folder = home.archive / run_id
    if not runinfo.is_run_id(run_id) or not (folder / "run.info").is_file():
        raise ClusterError(f"unknown run {run_id!r}: no archived run of that id in "
                           f"{home.archive}")
    info = runinfo.parse_info((folder / "run.info").read_text(encoding="utf-8",
                                                              errors="replace"))
    run_tab = folder / f"{run_id}.tab"
    if not run_tab.is_file():
        raise ClusterError(f"run {run_id} has no archived table (outcome "
                           f"{info.get('outcome', '?')}): only a completed run's results "
                           f"can be blessed")
    if info.get("outcome") != Outcome.DONE.value:
        raise ClusterError(f"run {run_id} did not complete (outcome {info.get('outcome')}):"
                           f" only a completed run's results can be blessed")
    kind, ref = info.get("kind", ""), info.get("ref", "")
    if RunSpec.parse(info.get("queue", f"{kind} {ref}")).sweep_file is not None:
        raise ClusterError(f"run {run_id} is a sweep run: compared with no baseline")
    paths = targets(home, kind, ref)
    names = [_test_id(t) for t in tests] if tests else _reported(home, folder, run_tab)
    if not names:
        raise ClusterError(f"run {run_id} reported no changed test: name the tests to bless")
    rows = _rows(run_tab, set(names))
    missing = sorted(set(names) - set(rows))
    if missing:
        raise ClusterError(f"not in run {run_id}'s table: {', '.join(missing[:10])}"
                           + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    when = time.time() if now is None else now
    blessings = [Blessing(when, _field(who), run_id, name, rows[name].error,
                          rows[name].md5 if rows[name].error == 0 else "0",
                          tuple(p.name for p in paths), reason) for name in sorted(rows)]
    home.tables.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(home.tables / tab.TABLES_LOCK):
        for path in paths:
            old = tab.TabFile(path) if path.exists() else None
            tab.write_tab_lines(path, tab.with_rows(old, rows))
        _append(home.tables / RECORD_NAME, blessings)
    return blessings


def _test_id(test: str) -> str:
    """A test named as the reports show it, or by id, as its id; ClusterError for a name
    with spaces."""
    name = history.test_id(test)
    if not name or any(c.isspace() for c in name):
        raise ClusterError(f"test name {test!r}: expected a test id without spaces")
    return name


def _append(path: Path, blessings: Iterable[Blessing]) -> None:
    """Append the blessings' lines in one write, fsync'ed (the record is the audit)."""
    data = "".join(b.line() + "\n" for b in blessings).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _rows(run_tab: Path, names: set[str]) -> dict[str, tab.TabRow]:
    """The rows of ``names`` in the run's table (streamed: a table may have a million)."""
    return {e.name: e.row() for e in tab.TabFile(run_tab).entries() if e.name in names}


def _reported(home: Home, folder: Path, run_tab: Path) -> list[str]:
    """The tests the run reported as changed: its ``changed.lst`` (a user run's), else
    those whose error or md5 differ from the baseline's row now."""
    listed = folder / CHANGED_LIST
    if listed.is_file():
        return [line.split()[0] for line in listed.read_text(encoding="utf-8",
                                                             errors="replace").splitlines()
                if line.strip()]
    baseline = home.tables / BASELINE
    if not baseline.exists():
        return []
    # Both tables in name order: one merged pass, neither held whole.
    found: list[str] = []
    old = tab.TabFile(baseline).entries()
    pending = next(old, None)
    for entry in tab.TabFile(run_tab).entries():
        while pending is not None and pending.name < entry.name:
            pending = next(old, None)
        if pending is not None and pending.name == entry.name \
                and (pending.error, pending.md5) != (entry.error, entry.md5):
            found.append(entry.name)
    return found
