"""Timeouts that fit each test (docs/results.md, "Timeouts that fit each test"): GNU
parallel's ``--timeout 200%`` for a run's jobs.

A node kills a job after its ``job_timeout`` (450 s by default), the same for a test of
0.1 s as for one of 300 s: a test that hangs after recorded runs of 0.1 s holds its slot
for the whole limit.  With ``adaptive_timeout = M`` (master.conf, or the run's
``adaptive_timeout=M``) each job with recorded times gets its own::

    max(adaptive_timeout_floor, M x the median of its recorded times)

never above the run's limit (the run's ``task_timeout``, else master.conf's ``job_timeout``;
the node caps it by its own limit too).  A test with no recorded time, ``M = 0``, a
``relaxtimeout`` run, a sweep run and an ``every_node`` run keep the node's limit.

The recorded times are those of the stream's last tables, ``tables/current.tab``,
``previous.tab`` and ``previous2.tab`` (:data:`TABLES`: the last three runs of the stream,
ARTIFEX.md §2.8): a test's time is ``time1 + time2 + time3`` of its row, as
:mod:`cluster.master.model.joborder` orders by.  Each table is read a line at a time and
only the run's tests are kept: three times per job in one ``array`` (24 bytes a job).

The timeouts are computed once, by the child that orders the run's jobs file
(:func:`cluster.master.model.joborder.order_jobs_file`), and written into the job lines as
the ``timeout=<seconds>`` word (:func:`cluster.records.timed_line`): the master hands the
lines out as it reads them (nothing per job while it serves), a successor master that takes
the run over reads them from the file, and the confirm phase's second runs keep them.  The
result cache keys a job without the word (:func:`cluster.records.untimed_line`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.master.model.joblist import JobList
from cluster.records import MAX_OWN_TIMEOUT
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart

#: The tables whose times are a test's recorded times, newest first.
TABLES = ("current.tab", "previous.tab", "previous2.tab")
#: A time not recorded (the test has no row in that table).
NONE = math.nan


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count); ValueError
    when there are none.  Pure."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the median of no values")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def fitted_timeout(recorded: Sequence[float], multiple: float, floor: float,
                   limit: float) -> float:
    """A test's own timeout from its ``recorded`` times (seconds; NaN entries are runs
    without it): ``max(floor, multiple x median)``, at most ``limit``.  0 means "the run's
    limit": ``multiple`` is 0 (off), no time is recorded, or the fitted value is not below
    ``limit`` (nothing to tell the node).  Pure."""
    times = [t for t in recorded if not math.isnan(t) and t >= 0]
    if multiple <= 0 or not times:
        return 0.0
    seconds = max(floor, multiple * median(times))
    return seconds if seconds < min(limit, MAX_OWN_TIMEOUT) else 0.0


def recorded_times(jobs: JobList, tables: Sequence[Path]) -> array[float]:
    """Each job's time in each of ``tables``: ``len(tables)`` entries per job, job *i*'s at
    ``i * len(tables) + k`` for table *k*, :data:`NONE` where the table has no row of it.
    A missing table records nothing; a malformed row is passed over."""
    width = len(tables)
    times = array("d", [NONE]) * (len(jobs) * width)
    index = jobs.index
    for k, table in enumerate(tables):
        try:
            fh = open(table, "rb")
        except FileNotFoundError:
            continue
        with fh:
            for line in fh:
                fields = line.split(b"\t", 5)
                i = index.get(fields[0].decode("utf-8", errors="replace"))
                if i is None:
                    continue
                try:
                    times[i * width + k] = float(fields[2]) + float(fields[3]) + float(fields[4])
                except (ValueError, IndexError):
                    continue
    return times


def job_timeouts(jobs: JobList, tables: Sequence[Path], multiple: float, floor: float,
                 limit: float) -> array[float] | None:
    """Each job's own timeout (:func:`fitted_timeout`, 0 = none) by its times in
    ``tables``; None when no job gets one (off, or nothing recorded)."""
    if multiple <= 0 or not len(jobs):
        return None
    times = recorded_times(jobs, tables)
    width = len(tables)
    timeouts = array("f", bytes(4 * len(jobs)))
    any_set = False
    # A time below this fits under the floor whatever the others: no median needed (the
    # most of a million jobs are such fast tests).
    quick = floor / multiple
    at_floor = fitted_timeout((0.0,), multiple, floor, limit)
    for i in range(len(jobs)):
        row = times[i * width:(i + 1) * width]
        if all(t <= quick for t in row):  # False for an unrecorded (NaN) entry
            seconds = at_floor
        else:
            seconds = fitted_timeout(row, multiple, floor, limit)
        if seconds:
            timeouts[i] = seconds
            any_set = True
    return timeouts if any_set else None


@dataclass(frozen=True)
class TimeoutFit:
    """How a run's own timeouts are fitted (:func:`fitted_timeout`): ``multiple`` x a test's
    median recorded time, at least ``floor``, below ``limit``."""

    multiple: float
    floor: float
    limit: float

    def argv(self) -> list[str]:
        """The three numbers as words (exactly: ``float(word)`` gives each back)."""
        return [repr(self.multiple), repr(self.floor), repr(self.limit)]


def fit_for_run(start: JobStart, options: RunOptions, cfg: Config) -> TimeoutFit | None:
    """How the jobs of the run ``start`` (its effective ``options``) get their own
    timeouts; None for a run that keeps the node's limit (see the module docstring)."""
    multiple = options.adaptive_timeout
    if (multiple <= 0 or "relaxtimeout" in start.options or options.every_node
            or RunSpec.parse(start.queue).sweep_file is not None):
        return None
    return TimeoutFit(multiple, cfg.adaptive_timeout_floor,
                      options.task_timeout or cfg.job_timeout)
