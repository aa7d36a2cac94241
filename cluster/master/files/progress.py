"""How long a run has run and what it has lost, counted across masters (``runs/<id>/progress``).

A run may be served by several clustermasters in turn: one is killed or frozen, a successor
takes it over (the PID dance) and goes on with the same journal.  ``max_run_time``,
``max_failed_nodes`` and the report's "N seconds on M nodes" are about the whole run, not
one master's share, so the master that serves a run saves these counters into the run's
folder about once a second, and a successor starts from them.

Elapsed time is accumulated from the monotonic clock while a master serves, so a step of
the wall clock neither ends a run early nor stretches it.  The gap between the last save
and a successor's start (the old master's death, the PID-file wait) is counted too: it is
taken from the wall clock, clamped to ``[0, max_gap]``, because that is the only clock two
processes across a reboot share.

File format, ``key value`` lines (rewritten atomically, not fsync'ed: losing the last
second of it in a machine crash costs a second of ``max_run_time``)::

    elapsed 1234.5
    saved 1763900000.0
    had_nodes 1
    lost node-a (not heard from for 181 s; 12 unfinished jobs put back)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from cluster.runtime import fsutil
from cluster.runtime.clock import Clock

log = logging.getLogger("cluster.master")

FILE_NAME = "progress"
#: Lost nodes kept for the report; a run losing more is cut short long before this.
MAX_LOST = 1000


@dataclass
class RunProgress:
    """The counters of one run.  Callers use :meth:`load`, :meth:`elapsed`, :meth:`save`.

    ``base`` is the time counted before this master began (earlier masters and the gap);
    ``began`` is this master's monotonic start.  ``lost`` holds the earlier masters' lost
    nodes; the caller adds its own when it saves.
    """

    path: Path
    clock: Clock
    base: float = 0.0
    began: float = 0.0
    had_nodes: bool = False
    lost: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path, clock: Clock, max_gap: float) -> RunProgress:
        """The run's counters as the last master saved them (zero for a new run).

        An unreadable file is logged and counted as a new run's: it only bounds the run.
        """
        path = run_dir / FILE_NAME
        progress = cls(path, clock, began=clock.monotonic())
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return progress
        try:
            values: dict[str, str] = {}
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "lost":
                    progress.lost.append(value)
                else:
                    values[key] = value
            elapsed = float(values.get("elapsed", "0"))
            saved = float(values.get("saved", "0"))
            progress.had_nodes = values.get("had_nodes", "0") == "1"
        except ValueError as exc:
            log.warning("%s: unreadable (%s); the run's time is counted from now", path, exc)
            return cls(path, clock, began=clock.monotonic())
        gap = min(max(clock.time() - saved, 0.0), max_gap) if saved else 0.0
        progress.base = max(elapsed, 0.0) + gap
        return progress

    def elapsed(self) -> float:
        """Seconds the run has run, this master's share included."""
        return self.base + (self.clock.monotonic() - self.began)

    def save(self, lost_now: list[str], had_nodes: bool) -> None:
        """Write the counters; ``lost_now`` are the nodes this master lost."""
        self.had_nodes = self.had_nodes or had_nodes
        lost = (self.lost + lost_now)[:MAX_LOST]
        lines = [f"elapsed {self.elapsed():.3f}", f"saved {self.clock.time():.3f}",
                 f"had_nodes {int(self.had_nodes)}",
                 *(f"lost {' '.join(entry.split())}" for entry in lost)]
        fsutil.atomic_write(self.path, "\n".join(lines) + "\n", fsync=False)
