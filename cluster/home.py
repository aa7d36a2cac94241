"""Where every file of the master home lives.

Per-priority files carry the priority as a suffix: none for priority 0, ``.1`` and ``.2``
otherwise.  Names with an extension take the suffix before it, as seed 000 writes
``job.1.start``: ``queue`` -> ``queue.1``, ``job.start`` -> ``job.1.start``,
``clustermaster.pid`` -> ``clustermaster.1.pid``.  (Seed 000 also has one sentence in which
priority 0 appends to ``queue.1.lst``; we follow the suffix rule throughout, see
docs/deviations.md.)

Layout of a home::

    queue[.p]            runs waiting at priority p, one per line (lock: queue[.p].lck)
    job[.p].start        the running run: its id and what to build (nodes read it)
    jobs[.p]             build.py's job list for the running run
    results[.p]          journal of results received for the running run
    clustermaster[.p].pid   the PID-file semaphore of seed 000 phase 2
    status[.p]           one-line status for dashboards
    runs/<id>/           working files of a run (uploaded node logs)
    archive/<id>/        a finished run: .tab, report, logs
    tables/              the previous result table of each stream (baselines)
    users/<user>/<tree>/ trees pushed by clusterpush, with their cluster_command.run droppings
    nodes/<name>.up|.status|.caps   what the monitor learnt of each node
    tests/               the test corpus
    log/                 logs of the master processes
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def suffixed(name: str, priority: int) -> str:
    """``name`` with the priority suffix of seed 000 (none for priority 0)."""
    if priority == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}.{priority}.{ext}" if dot else f"{name}.{priority}"


@dataclass(frozen=True)
class Home:
    """The paths of one master home."""

    root: Path

    def per_priority(self, name: str, priority: int) -> Path:
        return self.root / suffixed(name, priority)

    def queue(self, priority: int) -> Path:
        return self.per_priority("queue", priority)

    def queue_lock(self, priority: int) -> Path:
        return self.per_priority("queue.lck", priority)

    def job_start(self, priority: int) -> Path:
        return self.per_priority("job.start", priority)

    def jobs(self, priority: int) -> Path:
        return self.per_priority("jobs", priority)

    def results(self, priority: int) -> Path:
        return self.per_priority("results", priority)

    def pid_file(self, priority: int) -> Path:
        return self.per_priority("clustermaster.pid", priority)

    def status(self, priority: int) -> Path:
        return self.per_priority("status", priority)

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def tables(self) -> Path:
        return self.root / "tables"

    @property
    def users(self) -> Path:
        return self.root / "users"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def create(self) -> None:
        """Make the directories of a home (idempotent)."""
        for d in (self.root, self.runs, self.archive, self.tables, self.users, self.nodes,
                  self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
