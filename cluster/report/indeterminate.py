"""Differences confirmed and indeterminate tests (docs/results.md, "Differences confirmed,
indeterminate tests named"), as plain facts.

A test whose output changed against the baseline is run a second time before the run is
reported (:mod:`cluster.master.serve.confirm`).  Here, with no master code:

* :func:`judge`: a test's verdict from its digests -- the baseline's, the run's first and
  the second run's (a digest is the md5, or ``error <code>`` for a test that errored):
  the same new digest twice is a **confirmed** change; another one is **indeterminate**
  (the output changes by itself: not a difference); no second result (over the cap, its
  job failed, its node left) leaves the change **unconfirmed**, reported as changed;
* :func:`without`: a comparison with the indeterminate tests taken out of its differences
  and error transitions;
* :func:`section`: the report's own section for them (the indeterminate tests with their
  several digests, then each difference confirmed or not);
* the record of indeterminate tests, ``tables/indeterminate.tsv``: one line per test
  found indeterminate (``when run test nodes digests``), the newest ``keep`` kept,
  rewritten atomically under ``tables/indeterminate.lock`` (:func:`record`, :func:`read`
  newest first); ``clusteradmin flaky`` lists it, and :func:`known_only_line` is the line
  a later report starts with when it differs only in tests found there.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.report.compare import Comparison, display_name
from cluster.runtime import fsutil

#: The record of indeterminate tests in the home's ``tables/``, and its lock.
RECORD_NAME = "indeterminate.tsv"
LOCK_NAME = "indeterminate.lock"
#: The verdicts of a run, in its archive folder (``test kind nodes digests why``).
VERDICTS_NAME = "confirm.tsv"
#: Tests named one by one in the line of a report that differs only in known ones.
MAX_NAMED = 20


class Kind(enum.StrEnum):
    CONFIRMED = "confirmed"          # the same new digest twice: a real change
    INDETERMINATE = "indeterminate"  # a second run gave another digest: not a change
    UNCONFIRMED = "unconfirmed"      # no second result: reported as changed, saying so


def digest(error: int, md5: str) -> str:
    """What a result is compared by: its md5, or ``error <code>`` when it errored."""
    return md5 if error == 0 else f"error {error}"


@dataclass(frozen=True)
class Verdict:
    """One changed test's verdict.  ``digests``: the baseline's, the first run's and (when
    there is one) the second run's; ``nodes``: the node of the first result and of the
    second; ``why``: for an unconfirmed change, why there is no second result."""

    test: str
    kind: Kind
    digests: tuple[str, ...]
    nodes: tuple[str, ...]
    why: str = ""

    def line(self) -> str:
        """The verdict as a tab-separated line (:data:`VERDICTS_NAME`)."""
        return "\t".join((self.test, self.kind.value, ",".join(self.nodes),
                          ",".join(self.digests), self.why))

    @classmethod
    def parse(cls, line: str) -> Verdict:
        """A :meth:`line` back (ValueError if it is not one)."""
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 5:
            raise ValueError(f"expected 5 tab-separated fields, got {len(fields)}")
        test, kind, nodes, digests, why = fields
        return cls(test, Kind(kind), digests=tuple(d for d in digests.split(",") if d),
                   nodes=tuple(n for n in nodes.split(",") if n), why=why)


def judge(test: str, baseline: str, first: tuple[str, str],
          second: tuple[str, str] | None, why: str = "") -> Verdict:
    """The verdict of ``test`` whose digest went from ``baseline`` to ``first`` (digest,
    node); ``second`` is the confirm run's (digest, node), None when there is none (then
    ``why`` says why).  A second digest equal to the first confirms the change; any other
    (the baseline's included: the change did not reproduce) makes the test indeterminate."""
    if second is None:
        return Verdict(test, Kind.UNCONFIRMED, (baseline, first[0]), (first[1],),
                       why or "no second result")
    if second[0] != first[0] and second[0].startswith("error "):
        # The second run failed (a timeout, a lost node): it says nothing of the output.
        return Verdict(test, Kind.UNCONFIRMED, (baseline, first[0], second[0]),
                       (first[1], second[1]), f"its second run on {second[1]} ended with "
                                              f"{second[0]}")
    kind = Kind.CONFIRMED if second[0] == first[0] else Kind.INDETERMINATE
    return Verdict(test, kind, (baseline, first[0], second[0]), (first[1], second[1]))


def indeterminate(verdicts: Iterable[Verdict]) -> set[str]:
    """The tests found indeterminate."""
    return {v.test for v in verdicts if v.kind is Kind.INDETERMINATE}


def without(comparison: Comparison, tests: set[str]) -> Comparison:
    """``comparison`` with ``tests`` out of its differences and error transitions (the
    indeterminate tests: their change is not reported as one)."""
    if not tests:
        return comparison
    return dataclasses.replace(
        comparison,
        differences={g: [n for n in names if n not in tests]
                     for g, names in comparison.differences.items()},
        started_errors=[n for n in comparison.started_errors if n not in tests],
        stopped_errors=[n for n in comparison.stopped_errors if n not in tests])


def section(verdicts: Sequence[Verdict]) -> str:
    """The report's section on the tests run twice ('' when none was): the indeterminate
    tests first, each with its digests and nodes, then every difference with its verdict
    (``confirmed on node2``, or unconfirmed and why)."""
    if not verdicts:
        return ""
    out: list[str] = []
    flaky = [v for v in verdicts if v.kind is Kind.INDETERMINATE]
    if flaky:
        out.append(f"The following {len(flaky)} test(s) are indeterminate: their output "
                   "changed, but a second run gave another result; they are not reported "
                   "as differences:\n")
        for v in flaky:
            base, first, second = v.digests
            out.append(f"{display_name(v.test)} md5s: {base} (baseline), {first} "
                       f"({v.nodes[0]}), {second} ({v.nodes[1]})\n")
        out.append("\n")
    changes = [v for v in verdicts if v.kind is not Kind.INDETERMINATE]
    if changes:
        out.append(f"Differences run a second time ({len(changes)}):\n")
        for v in changes:
            if v.kind is Kind.CONFIRMED:
                out.append(f"{display_name(v.test)} confirmed on {v.nodes[1]}\n")
            else:
                out.append(f"{display_name(v.test)} changed, unconfirmed: {v.why}\n")
        out.append("\n")
    return "".join(out)


def same_build_section(found: Sequence[tuple[str, str, str, str]]) -> str:
    """The report's lines on the tests whose output differs from an earlier run's of the
    same job (same build, test file and command; ``found``: (test, node, earlier digest,
    this run's digest) each), '' when there is none."""
    if not found:
        return ""
    out = [f"The following {len(found)} test(s) gave another output than an earlier run of "
           "the same build, test file and command; they are recorded as indeterminate:\n"]
    out += [f"{display_name(test)} md5s: {old} (earlier run), {new} ({node})\n"
            for test, node, old, new in found]
    return "".join(out) + "\n"


def known_only_line(comparison: Comparison, known: set[str]) -> str:
    """``differs only in known-indeterminate tests: a, b`` when every test the comparison
    still reports as differing is one found indeterminate before; '' otherwise."""
    differing = comparison.differing()
    if not differing or any(name not in known for name in differing):
        return ""
    named = ", ".join(display_name(n) for n in differing[:MAX_NAMED])
    more = f" and {len(differing) - MAX_NAMED} more" if len(differing) > MAX_NAMED else ""
    return f"differs only in known-indeterminate tests: {named}{more}"


# ---------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class Flaky:
    """One record line: ``test`` was found indeterminate in run ``run`` at ``when`` (UTC
    seconds), on ``nodes``, with ``digests``."""

    when: float
    run: str
    test: str
    nodes: tuple[str, ...]
    digests: tuple[str, ...]

    def line(self) -> str:
        return "\t".join((f"{self.when:.0f}", self.run, self.test, ",".join(self.nodes),
                          ",".join(self.digests)))

    @classmethod
    def parse(cls, line: str) -> Flaky:
        fields = line.rstrip("\n").split("\t")
        if len(fields) != 5:
            raise ValueError(f"expected 5 tab-separated fields, got {len(fields)}")
        when, run, test, nodes, digests = fields
        return cls(float(when), run, test, tuple(n for n in nodes.split(",") if n),
                   tuple(d for d in digests.split(",") if d))

    def to_json(self) -> dict[str, object]:
        return {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.when)),
                "run": self.run, "test": display_name(self.test), "nodes": list(self.nodes),
                "digests": list(self.digests)}


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []


def read(tables: Path) -> list[Flaky]:
    """The records in ``tables/indeterminate.tsv``, newest first (bad lines skipped)."""
    found: list[Flaky] = []
    for line in _lines(tables / RECORD_NAME):
        try:
            found.append(Flaky.parse(line))
        except ValueError:
            continue
    found.sort(key=lambda f: (f.when, f.run), reverse=True)
    return found


def known(tables: Path) -> set[str]:
    """Every test of the record."""
    return {f.test for f in read(tables)}


def record(tables: Path, entries: Sequence[Flaky], keep: int) -> int:
    """Add ``entries`` to the record (one already there for the same run and test is not
    added twice: a redone end step), keep the newest ``keep``; return how many were added.
    Atomic, under the record's lock (runs of several priorities end at once)."""
    if not entries:
        return 0
    tables.mkdir(parents=True, exist_ok=True)
    path = tables / RECORD_NAME
    with fsutil.flocked(tables / LOCK_NAME):
        lines = _lines(path)
        have = {tuple(line.split("\t")[1:3]) for line in lines}
        new = [e for e in entries if (e.run, e.test) not in have]
        if not new:
            return 0
        lines += [e.line() for e in new]
        fsutil.atomic_write(path, "".join(line + "\n" for line in lines[-keep:]))
    return len(new)
