"""Slowest tests first (issue 26): a run's jobs file put in the order the nodes get them.

The master hands jobs out from the head of its job list (:mod:`cluster.master.runstate`),
so the order of the jobs file is the order of the run.  A slow test handed out last binds
the run's end: every other node is idle while it runs.  So once, when the run's jobs file
is made, :func:`order_jobs_file` rewrites it with the longest tests first, by each test's
time in the baseline table (``tables/current.tab``: the latest time of each test in the
stream, ARTIFEX.md §2.8), and tests with no known time (new tests, a first run) ahead of
them all, since they may be slow.  Tests of equal time keep build.py's order.

Why the file and not the list in memory: the master reads a batch of jobs with one
``pread`` when they are consecutive lines of the file (:class:`~cluster.master.joblist.JobFile`),
so the per-request cost stays what it was; and a successor master that takes the run over
reuses the file, so it hands the jobs out in the same order.

A test's time is ``time1 + time2 + time3`` of its ``.tab`` row: the user CPU seconds of
its stages (a ``shell`` job's wall seconds, :func:`cluster.node.readlog.with_wall_time`).

Memory: one 8-byte time per job (an ``array``), filled while the baseline is streamed in
name order (:class:`cluster.report.tab.TabFile`), never a table of rows or a second dict
of names; the permutation is one list of ints.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.master.joblist import JobFile
from cluster.report import tab
from cluster.report.slowdowns import row_seconds
from cluster.runtime import fsutil

log = logging.getLogger("cluster.master")

#: The time of a test the baseline does not know: it sorts before every known time.
UNKNOWN = float("inf")
#: Job lines written to the ordered file at a time.
_WRITE_CHUNK = 8192


@dataclass(frozen=True)
class Ordering:
    """What :func:`order_jobs_file` did: jobs, how many had a known time, whether the
    file was rewritten (not when it was already in that order)."""

    jobs: int
    known: int
    rewritten: bool


def slowest_first(times: Sequence[float]) -> list[int]:
    """The job indexes in hand-out order: unknown times (:data:`UNKNOWN`) first, then the
    longest first; equal times keep their order (a stable sort).  Pure."""
    return sorted(range(len(times)), key=lambda i: -times[i])


def known_times(jobs: JobFile, baseline: Path) -> tuple[array[float], int]:
    """Each job's time in ``baseline`` (:data:`UNKNOWN` when it has no row), and how many
    were known.  The baseline is streamed; a missing file knows no time."""
    times = array("d", [UNKNOWN]) * len(jobs)
    known = 0
    if not baseline.is_file():
        return times, known
    index = jobs.index
    for entry in tab.TabFile(baseline).entries():
        i = index.get(entry.name)
        if i is not None:
            times[i] = row_seconds(entry)
            known += 1
    return times, known


def order_jobs_file(path: Path, baseline: Path) -> Ordering:
    """Rewrite the jobs file ``path`` slowest first by ``baseline``'s times (atomically:
    a reader sees the old order or the new one).  Bad lines build.py wrote are dropped
    from the rewritten file (:class:`JobFile` skips them anyway)."""
    jobs = JobFile(path)
    try:
        times, known = known_times(jobs, baseline)
        order = slowest_first(times)
        if not known or order == list(range(len(order))):
            return Ordering(len(jobs), known, rewritten=False)
        with fsutil.atomic_writer(path) as out:
            for start in range(0, len(order), _WRITE_CHUNK):
                chunk = order[start:start + _WRITE_CHUNK]
                out.write("\n".join(jobs.lines(chunk)))
                out.write("\n")
        return Ordering(len(jobs), known, rewritten=True)
    finally:
        jobs.close()


def baseline_of(tables: Path) -> Path:
    """The table whose times order a run: the stream's baseline, ``tables/current.tab``."""
    return tables / "current.tab"


def order_run_jobs(path: Path, tables: Path) -> None:
    """The master's one call, when it has made a run's jobs file: order it by the
    baseline in ``tables`` (:func:`order_jobs_file`) and log what was done."""
    done = order_jobs_file(path, baseline_of(tables))
    log.info("%s: %d jobs, %d with a known time; %s", path, done.jobs, done.known,
             "ordered slowest first" if done.rewritten else "left in build.py's order")
