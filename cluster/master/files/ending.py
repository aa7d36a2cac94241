"""The durable record of a run's end: ``runs/<id>/end``, so a run finishes exactly once.

When a run's serving is over, the master writes this record before anything else: how the
run ended (:class:`Outcome`), why, its whole elapsed time, the nodes it lost, and its
job.start.  Then it does the end steps (:data:`STEPS`) in order, appending ``done <step>``
after each, and removes the run's folder, record included, as the last one.  A master that
is killed anywhere in between leaves the record; the next clustermaster of that priority
finds it (:func:`pending`) before it looks at the queue, and does only the steps not yet
done.  So a report is written once, the baseline rotates once, and a run whose job.start is
already gone is never started again under a new id.

Each step is idempotent up to its own ``done`` line: it is safe to redo a step that was
cut short.  Two windows remain where a step may run twice because the master died between
the step and its ``done`` line (microseconds wide): a mail sent just before the kill is
sent again, and the dequeue -- which removes one copy of the run's queue line -- is
checked against the queue head before it is redone (docs/deviations.md).

Format: ``key value`` lines; ``start <job.start line>`` lines hold the job.start; one
``done <step>`` line per finished step, each appended with one ``write()`` and fsync'ed.
A torn last line (a machine crash) is ignored: its step is done again.
"""

from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from cluster.home import Home
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

FILE_NAME = "end"

#: The end steps, in the order they are done.
SWEEP = "sweep"        # a sweep run's results.tsv, results/ and collected/ (sweepend.py)
REPORT = "report"      # archive: logs, the run's .tab, report.txt, run.info; tables staged
TABLES = "tables"      # the staged stream tables replace the old ones (baseline rotation)
CACHE = "cache"        # the "seen before" md5 cache rebuilt from the archive
MAIL = "mail"          # the report mailed
CULPRIT = "culprit"    # a culprit search started or narrowed (cluster/master/end/culprit.py)
TREE = "tree"          # a commit run's exported tree becomes the master's clean tree
DEQUEUE = "dequeue"    # the queue line removed (or kept for another attempt)
STEPS = (SWEEP, REPORT, TABLES, CACHE, MAIL, CULPRIT, TREE, DEQUEUE)

#: Kinds of run whose results make the baseline (and the cache) at their TABLES step.
BASELINE_KINDS = ("git", "auto")


class Outcome(enum.StrEnum):
    """How a run ended."""

    DONE = "done"                # every job has a result
    ABORTED = "aborted"          # its user stopped it (clusterpush abort)
    FAILED = "failed"            # a node's fatal failure (a build failure) stopped it
    TIMED_OUT = "timed-out"      # its job_timeout (max_run_time) passed: tests not run listed
    RETRY = "retry"              # lost its nodes: queued again for another attempt
    GAVE_UP = "gave-up"          # lost its nodes on its last attempt: reported as failed
    NODES_LOST = "nodes-lost"    # lost more nodes than its own max_failed_nodes: stopped
    UNSTARTABLE = "unstartable"  # its source or job list could not be made
    QUEUE_TIMEOUT = "queue-timeout"  # waited in its queue longer than its queue_timeout

    @property
    def started(self) -> bool:
        """Whether a run ending so was served (it has a job list and maybe results)."""
        return self not in (Outcome.UNSTARTABLE, Outcome.QUEUE_TIMEOUT)

    @property
    def changes_tables(self) -> bool:
        """Whether a run ending so updates its stream's tables (only a complete run)."""
        return self is Outcome.DONE

    @property
    def dequeues(self) -> bool:
        """Whether its queue line leaves the queue (every outcome but another attempt)."""
        return self is not Outcome.RETRY


@dataclass
class EndRecord:
    """The end record of one run.  Callers use :meth:`create` or :func:`pending`, then
    :meth:`is_done` and :meth:`mark` per step, and :meth:`remove` at the very end."""

    path: Path
    start: JobStart
    outcome: Outcome
    reason: str = ""
    elapsed: float = 0.0
    lost: tuple[str, ...] = ()
    done: set[str] = field(default_factory=set)

    @property
    def run_id(self) -> str:
        return self.start.id

    @classmethod
    def create(cls, run_dir: Path, start: JobStart, outcome: Outcome, reason: str = "",
               elapsed: float = 0.0, lost: tuple[str, ...] = ()) -> EndRecord:
        """Write the record (fsync'ed, atomically: it exists whole or not at all)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        record = cls(run_dir / FILE_NAME, start, outcome, _one_line(reason), elapsed, lost)
        lines = [f"outcome {outcome.value}", f"reason {record.reason}",
                 f"elapsed {elapsed:.3f}", *(f"lost {_one_line(n)}" for n in lost),
                 *(f"start {line}" for line in start.format().splitlines())]
        fsutil.atomic_write(record.path, "\n".join(lines) + "\n")
        fsutil.fsync_dir(run_dir)
        return record

    @classmethod
    def load(cls, path: Path) -> EndRecord:
        """Read a record; ValueError naming the file and what is wrong."""
        text = path.read_text(encoding="utf-8", errors="replace")
        values: dict[str, str] = {}
        lost: list[str] = []
        start_lines: list[str] = []
        done: set[str] = set()
        complete = text.endswith("\n")
        lines = text.splitlines()
        if not complete and lines:
            lines.pop()  # torn last line: its step is redone
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "start":
                start_lines.append(value)
            elif key == "lost":
                lost.append(value)
            elif key == "done":
                if value in STEPS:
                    done.add(value)
            else:
                values[key] = value
        try:
            outcome = Outcome(values.get("outcome", ""))
            elapsed = float(values.get("elapsed", "0"))
            start = JobStart.parse("\n".join(start_lines) + "\n")
        except ValueError as exc:
            raise ValueError(f"{path}: not an end record ({exc}); expected outcome, "
                             f"elapsed and start lines") from None
        return cls(path, start, outcome, values.get("reason", ""), elapsed, tuple(lost), done)

    def is_done(self, step: str) -> bool:
        return step in self.done

    def mark(self, step: str) -> None:
        """Record durably that ``step`` is done (one appended line, fsync'ed)."""
        assert step in STEPS, step
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, f"done {step}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.done.add(step)


def pending(home: Home, lane: int) -> list[EndRecord]:
    """The end records of the runs of ``lane`` (cluster.lanes: a priority's own lane is its
    number) whose end was not finished, oldest first.

    A record that cannot be read is logged and left where it is (nothing is deleted that a
    person may want to look at); its run is not ended by this master.
    """
    found: list[EndRecord] = []
    if not home.runs.is_dir():
        return found
    for path in sorted(home.runs.glob(f"*/{FILE_NAME}")):
        try:
            record = EndRecord.load(path)
        except FileNotFoundError:
            continue  # finished meanwhile by another master
        except (OSError, ValueError) as exc:
            log.error("%s", exc)
            continue
        if record.start.lane == lane and path.parent.name == record.run_id:
            found.append(record)
    return found


def _one_line(text: str) -> str:
    """``text`` on one line (a reason may come from a node's message)."""
    return " ".join(text.split())
