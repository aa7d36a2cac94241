"""A run's own limits, enforced by the master (docs/runoptions.md section 3).

* :func:`run_options`: a run's effective options, made once when its serving starts and
  kept as ``RunState.options`` (the one place the master's parts read them from);
* :func:`with_task_timeout`: job.start carries the run's ``task_timeout`` as its
  ``job_timeout`` (each node kills a job of the run after that long, instead of after its
  own ``job_timeout``);
* :func:`limit_reached`: whether the run's ``job_timeout`` (whole wall time over every
  master that served it) or its ``max_failed_nodes`` ends it now, and how;
* :func:`expired` and :func:`drop_expired`: the waiting runs of a queue whose
  ``queue_timeout`` has passed leave it, each with a short report (mailed where reports
  go), through an end record (:mod:`cluster.master.files.ending`) so each is reported once even
  if the master dies meanwhile.  The enqueue times are the queue's own
  (:meth:`cluster.queue.QueueFile.waiting_since`).

``no_reschedule`` is the run state's (:meth:`cluster.master.state.runcore.RunCore._requeue`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from cluster.config import Config
from cluster.home import Home
from cluster.master.files import ending
from cluster.master.files.ending import EndRecord, Outcome
from cluster.queue import QueueFile
from cluster.runoptions import RunOptionError, RunOptions
from cluster.runspec import RunSpec
from cluster.wire.jobstart import MAX_JOB_TIMEOUT, JobStart

log = logging.getLogger("cluster.master")


def run_options(spec: RunSpec, cfg: Config) -> RunOptions:
    """The effective options of the run of queue line ``spec`` under ``cfg``.

    A queue line parsed by :mod:`cluster.queue` has valid options; one that does not (a
    line queued by an older release whose words meant something else) is logged and gets
    the global settings, so the run is still served."""
    try:
        return RunOptions.of(spec.options, cfg)
    except RunOptionError as exc:
        log.error("queue line %s: %s; the run gets the global settings", spec.line(), exc)
        return RunOptions.of((), cfg)


def own(options: RunOptions, key: str) -> bool:
    """Whether the run's queue line gave option ``key`` itself (not the global default)."""
    return any(word.partition("=")[0] == key for word in options.given)


def with_task_timeout(start: JobStart, options: RunOptions) -> JobStart:
    """``start`` carrying the run's ``task_timeout`` as job.start's ``job_timeout`` (a
    sweep's own node timeout included: the run's word wins); unchanged without one."""
    if options.task_timeout is None:
        return start
    return dataclasses.replace(start, job_timeout=min(options.task_timeout, MAX_JOB_TIMEOUT))


def limit_reached(options: RunOptions, elapsed: float, lost: int
                  ) -> tuple[Outcome, str] | None:
    """How the run ends now, and why, when it has run ``elapsed`` seconds (over every
    master) and lost ``lost`` nodes; None while neither limit is passed.

    Past its ``job_timeout``: timed out (the report lists the tests not run).  More lost
    nodes than ``max_failed_nodes``: queued again for another attempt when that is the
    global setting (seed 000), stopped and reported when the run gave its own."""
    if elapsed > options.job_timeout:
        what = "its job_timeout" if own(options, "job_timeout") else "max_run_time"
        return Outcome.TIMED_OUT, (f"it ran {elapsed:.1f} s, longer than {what} "
                                   f"{options.job_timeout:g} s")
    if lost > options.max_failed_nodes:
        if own(options, "max_failed_nodes"):
            return Outcome.NODES_LOST, (f"it lost {lost} nodes, more than its "
                                        f"max_failed_nodes {options.max_failed_nodes}")
        return Outcome.RETRY, (f"it lost {lost} nodes, more than max_failed_nodes "
                               f"{options.max_failed_nodes}")
    return None


@dataclass(frozen=True)
class Expired:
    """A waiting run whose ``queue_timeout`` has passed."""

    spec: RunSpec
    waited: float
    limit: float

    @property
    def reason(self) -> str:
        return (f"it waited {self.waited:.1f} s in its queue, longer than its queue_timeout "
                f"{self.limit:g} s")


def expired(runs: Iterable[RunSpec], since: Mapping[str, float], now: float,
            serving: Sequence[RunSpec], cfg: Config) -> list[Expired]:
    """The runs of ``runs`` (a queue, in order) that waited longer than their own
    ``queue_timeout``: queued at ``since[line]`` (epoch seconds; a line without a time
    has not waited), ``now`` being the same clock.  Never a run equal to one of
    ``serving`` (the runs being served or started by the priority's lanes: their copies
    too, since a dequeue removes the first equal line, which is the served one)."""
    found: list[Expired] = []
    for spec in runs:
        if spec in serving or spec.option("queue_timeout") is None:
            continue
        limit = run_options(spec, cfg).queue_timeout
        queued = since.get(spec.line())
        if limit is None or queued is None:
            continue
        waited = now - queued
        if waited > limit and all(e.spec != spec for e in found):
            found.append(Expired(spec, waited, limit))
    return found


def expired_start(spec: RunSpec, run_id: str, priority: int) -> JobStart:
    """The job.start (never written as one: it only names the run in its end record and
    report) of a run that leaves its queue unstarted."""
    return JobStart(id=run_id, priority=priority, queue=spec.line(), kind=spec.kind,
                    ref=spec.ref, products=spec.products, tree=spec.tree, source="",
                    build="", tests="", options=spec.options)


def drop_expired(home: Home, priority: int, queue: QueueFile, cfg: Config, now: float,
                 serving: Sequence[RunSpec], new_id: Callable[[], str],
                 end: Callable[[EndRecord], object]) -> list[str]:
    """Make every waiting run of ``queue`` whose ``queue_timeout`` has passed leave it:
    an end record with outcome ``queue-timeout`` and ``end`` (the master's end steps:
    report, mail, dequeue).  A run whose such record is there already (a master died
    while ending it, or its end step failed) is ended from that record, never given a
    second.  ``now`` is epoch seconds; ``new_id`` makes a run id.  Returns the ids of
    the runs ended."""
    runs = queue.read()
    if not any(spec.option("queue_timeout") is not None for spec in runs):
        return []
    ended: list[str] = []
    unfinished = {record.start.queue: record for record in ending.pending(home, priority)
                  if record.outcome is Outcome.QUEUE_TIMEOUT}
    for record in unfinished.values():
        end(record)
        ended.append(record.run_id)
    for gone in expired(queue.read(), queue.waiting_since(), now, serving, cfg):
        if gone.spec.line() in unfinished:
            continue
        run_id = new_id()
        log.warning("run %s (%s): %s; it leaves the queue", run_id, gone.spec.line(),
                    gone.reason)
        record = EndRecord.create(home.run_dir(run_id), expired_start(gone.spec, run_id,
                                                                      priority),
                                  Outcome.QUEUE_TIMEOUT, gone.reason)
        end(record)
        ended.append(run_id)
    return ended
