"""How a local cluster's run ended, read from its archive folder (the master home's
``archive/<run id>/run.info``): what localcluster.py's exit line and the end-to-end tests
look at once :meth:`cluster.localcluster.LocalCluster.wait_for_run` has returned the
folder; and, for a sweep run, how many of its tasks did not end ``ok``
(:func:`sweep_not_ok`: ``localcluster.py --sweep`` and ``clusterpush.py --sweep --wait``
exit 1 then, as GNU parallel exits with the number of jobs that failed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster.sweep import joblog

#: The sweep end step's summary in an archived run (cluster.master.end.sweepend's
#: SUMMARY_FILE): its presence says the run was a sweep.
SWEEP_SUMMARY = "sweep.json"
RESULTS_TSV = "results.tsv"


@dataclass(frozen=True)
class RunEnd:
    """How an archived run ended, from its ``run.info``: ``outcome`` (ending.Outcome's word:
    done, aborted, failed, timed-out, gave-up, ...) and ``reason`` (why, for a run that is
    not done; '' when run.info gives none)."""

    outcome: str
    reason: str = ""

    @property
    def complete(self) -> bool:
        """Whether every job of the run has a result (the only good end of a run)."""
        return self.outcome == "done"

    def describe(self) -> str:
        """``failed: node node1 failed with code -1: ...``: the outcome and why."""
        return f"{self.outcome}: {self.reason}" if self.reason else self.outcome


def run_end(archive: Path) -> RunEnd:
    """How the run archived in ``archive`` ended (its run.info's ``outcome`` and ``reason``
    lines); outcome "unknown" when run.info has no outcome line.  OSError if unreadable."""
    outcome = reason = ""
    for line in (archive / "run.info").read_text(encoding="utf-8",
                                                 errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "outcome" and not outcome:
            outcome = value.strip()
        elif key == "reason" and not reason:
            reason = value.strip()
    return RunEnd(outcome or "unknown", reason)


def sweep_not_ok(archive: Path) -> int | None:
    """How many tasks of the sweep run archived in ``archive`` did not end ``ok``
    (invalid, failed, timed out, never run), from its ``results.tsv``; None when the run
    is not a sweep's.  A sweep run without a readable ``results.tsv`` (its end step could
    not write it) counts as one task not ok: nothing says the tasks are."""
    path = archive / RESULTS_TSV
    if not (archive / SWEEP_SUMMARY).exists() and not path.exists():
        return None
    try:
        return sum(1 for row in joblog.read_joblog(path) if not row.ok)
    except (OSError, joblog.JoblogError):
        return 1
