"""A running run's live status, ``live[.p].json``: what the status page and the console show.

The master that serves a run rewrites this file at every progress tick (once a second):
atomically, so a reader never sees half of it, and without fsync, since it is rewritten
every second and harmless to lose in a crash.  It is removed when the run's end record is
written (:meth:`LiveStatus.remove`, and :func:`remove_if_run` by whoever ends a run), so a
live file names a run that is being served; one left by a killed master names a run that
job.start no longer names (readers ignore it) or the run its successor takes over and
rewrites.

Schema, version 1 (all times wall-clock epoch seconds)::

    {"version": 1, "run": "<id>", "priority": 0, "kind": "user", "queue": "<queue line>",
     "products": ["gs"], "started": 1763900000.0, "updated": 1763900042.0,
     "jobs": {"total": 225, "done": 120, "running": 8, "left": 97},
     "rate": 3.4, "eta": 1763900070.5,
     "nodes": {"n1": {"state": "ready", "slots": 2, "done": 60, "running": 4, "errors": 1,
                      "timeouts": 0, "last_seen": 1763900041.7, "caps": "...",
                      "status": "..."}},
     "lost": ["n3 (not heard from for 60 s; 4 unfinished jobs put back)"],
     "fatal": "", "stopping": "", "waiting": ""}

* ``started``: when the run began, across takeovers: now less the run's elapsed time as
  :class:`~cluster.master.files.progress.RunProgress` counts it (every master's share and the
  gaps between them), so a run taken over shows its true start.
* ``jobs``: ``done`` have a result, ``running`` are held by some node without one, ``left``
  are neither (not handed out yet, or put back).
* ``rate``: results per second over the last :data:`RATE_WINDOW` seconds (0.0 before two
  samples, or when nothing arrived); ``eta``: now + (total - done) / rate, null while the
  rate is 0 (a run all of whose jobs have a result has eta = now: it waits for uploads).
* ``nodes``: every node that took part in this master's share of the run, gone ones
  included (``state`` "gone"); ``done`` counts the first results it delivered,
  ``running`` the jobs it holds, ``errors`` those results with an error code,
  ``timeouts`` those that timed out (codes 3 and 4).
* ``moves``: the run's last preemption moves (docs/protocol.md, "Preemption at job
  boundaries"), newest last, each ``{"at": <epoch>, "text": "node n1 chosen to leave for
  run X (priority 0)"}``; a node told to leave has ``moving`` (where to) in its entry.
* ``lost``: the nodes the run lost (every master's); ``fatal``: why the run is stopping
  (RunState.fatal); ``stopping``: set when an admin's stop request was seen; ``waiting``:
  why no node serves the run while none may take it (``no node of group win64 is up``,
  :func:`cluster.master.model.placement.waiting_reason`), else "".

The cost is one pass over the nodes and one small write per second; nothing per job.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

from cluster.master.state.runstate import RunState
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

VERSION = 1
#: The span the rate is measured over [seconds].
RATE_WINDOW = 30.0

Sample = tuple[float, int]  # (monotonic time, results done then)


def rate(samples: deque[Sample] | list[Sample]) -> float:
    """Results per second between the oldest and the newest of ``samples`` (0.0 when there
    are fewer than two, no time passed between them, or the count did not grow)."""
    if len(samples) < 2:
        return 0.0
    (t0, d0), (t1, d1) = samples[0], samples[-1]
    if t1 <= t0 or d1 <= d0:
        return 0.0
    return (d1 - d0) / (t1 - t0)


def eta(now: float, remaining: int, per_second: float) -> float | None:
    """When ``remaining`` results will be in at ``per_second`` (wall clock, from ``now``);
    ``now`` when none remain; None when the rate is unknown (0)."""
    if remaining <= 0:
        return now
    if per_second <= 0:
        return None
    return now + remaining / per_second


class RateMeter:
    """A small ring of (time, done) samples covering the last ``window`` seconds."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self.samples: deque[Sample] = deque()

    def add(self, now: float, done: int) -> float:
        """Record ``done`` at monotonic time ``now``; return the rate over the window.

        The oldest sample kept is the newest one at least ``window`` old, so the rate spans
        the whole window once the run has lasted that long."""
        samples = self.samples
        samples.append((now, done))
        while len(samples) > 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        return rate(samples)


class LiveStatus:
    """The live file of one run served by this master.  Callers use :meth:`update` at each
    progress tick and :meth:`remove` when the run's end record is written."""

    def __init__(self, path: Path, start: JobStart, started: float, clock: Clock,
                 window: float = RATE_WINDOW) -> None:
        """``started``: the run's wall-clock start (across takeovers)."""
        self.path = path
        self.start = start
        self.started = started
        self.clock = clock
        self.meter = RateMeter(window)
        #: Set when an admin's stop request was seen (``stopped by <who>[: reason]``).
        self.stopping = ""
        #: Why no node serves the run, when none may (docs/runoptions.md, section 4; "no
        #: node of group win64 is up"); set by the master's placement tick.
        self.waiting = ""
        #: The run's last preemption moves, newest last (docs/protocol.md, "Preemption at
        #: job boundaries"): ``{"at": <epoch>, "text": "node n1 left for run X ..."}``.
        self.moves: list[dict[str, Any]] = []
        self.failing = False  # the last write failed (logged once)

    def snapshot(self, state: RunState, lost: list[str]) -> dict[str, Any]:
        """The live dict of ``state`` now; ``lost``: every node the run lost."""
        mono = self.clock.monotonic()
        wall = self.clock.time()
        total = len(state.jobs)
        done = state.results.count
        running = state.running
        per_second = self.meter.add(mono, done)
        skew = wall - mono  # a node's last_seen is monotonic
        nodes = {
            n.name: {"state": n.state.value, "slots": n.slots, "done": n.results,
                     "running": len(n.held), "errors": n.errors, "timeouts": n.timeouts,
                     "last_seen": round(n.last_seen + skew, 3), "caps": n.caps,
                     "status": n.status, **({"moving": n.moving_to} if n.moving_to else {})}
            for n in state.nodes.values()}
        when = eta(wall, total - done, per_second)
        start = self.start
        return {
            "version": VERSION, "run": start.id, "priority": start.priority,
            "kind": start.kind, "queue": start.queue, "products": list(start.products),
            "started": round(self.started, 3), "updated": round(wall, 3),
            "jobs": {"total": total, "done": done, "running": running,
                     "left": max(total - done - running, 0)},
            "rate": round(per_second, 3), "eta": None if when is None else round(when, 3),
            "nodes": nodes, "lost": list(lost), "fatal": state.fatal,
            "stopping": self.stopping, "waiting": self.waiting, "moves": self.moves,
        }

    def update(self, state: RunState, lost: list[str]) -> dict[str, Any]:
        """Rewrite the live file from ``state``; return what was written.

        A write that fails (a full disk) is logged once per streak of failures and does
        not stop the run: the file is only a view of it."""
        live = self.snapshot(state, lost)
        try:
            fsutil.atomic_write(self.path, json.dumps(live, separators=(",", ":")) + "\n",
                                fsync=False)
        except OSError as exc:
            if not self.failing:
                log.warning("run %s: cannot write %s: %s", self.start.id, self.path, exc)
            self.failing = True
        else:
            self.failing = False
        return live

    def remove(self) -> None:
        """The run's end record is written: the run is no longer live."""
        remove_if_run(self.path, self.start.id)


def remove_if_run(path: Path, run_id: str) -> None:
    """Remove the live file ``path`` if it is ``run_id``'s, or unreadable (a torn or
    foreign file cannot describe a later run); one of another run is left alone."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except OSError:
        text = ""
    try:
        owner = json.loads(text).get("run")
    except (ValueError, AttributeError):
        owner = run_id
    if owner == run_id:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
