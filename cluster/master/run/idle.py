"""Whether a clustermaster invocation would surely find nothing to do, from a few stat
calls: the supervisor does not start one then (docs/deviations.md).

It is asked for each priority at every tick and for every wake, in the supervisor's own
loop, so it imports little: :mod:`cluster.master.run.pidfile` (and psutil) only once a PID file
exists.
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster import lanes
from cluster.config import Config
from cluster.home import Home
from cluster.master.files import ending
from cluster.runtime.clock import Clock, SystemClock
from cluster.triggers import discovery


def surely_idle(cfg: Config, home: Home, lane: int, clock: Clock | None = None) -> bool:
    """Whether an invocation of ``lane`` (:mod:`cluster.lanes`: a priority's own lane is its
    number) would surely find nothing to do, from a few stat calls; the supervisor does
    not start one then (docs/deviations.md).  A user lane: :func:`user_lane_idle`.

    True only when phase 1 could queue nothing (:func:`cluster.triggers.discovery.may_find`)
    and then either the PID file is held by a live clustermaster (:meth:`PidFile.
    held_by_live_master`: the invocation would exit busy), or there is no PID file at all,
    the queue file (under its name of today and of earlier releases) is absent or empty,
    and no run's end waits to be finished at any priority (an end record under ``runs/``).
    A PID file that is stale, names a dead process or holds garbage is work: phase 2 must
    judge it.  Anything that cannot be read counts as work: a wrong True would leave work
    undone until the next tick, a wrong False costs one short invocation.
    """
    priority = lanes.priority_of(lane)
    try:
        if lane == priority and discovery.may_find(home, cfg, priority):
            return False
        if os.path.lexists(home.pid_file(lane)):
            from cluster.master.run import pidfile
            owner = pidfile.for_priority(cfg, home, lane, clock or SystemClock())
            return owner.held_by_live_master()
        if lane != priority:
            return user_lane_idle(home, lane)
        if any(_size(q) for q in (home.queue(priority), home.legacy_queue(priority))):
            return False
        return not any(home.runs.glob(f"*/{ending.FILE_NAME}"))
    except OSError:
        return False


def _size(path: Path) -> int:
    """The size of file ``path``; 0 when there is none."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def user_lane_idle(home: Home, lane: int) -> bool:
    """Whether user lane ``lane``, with no PID file, has surely nothing to do: it serves
    or claimed no run, no run's end waits, and either a lower lane of its priority is free
    (that one takes the next run: the lanes fill in order) or its queue holds no run
    beyond those the other lanes serve (a line each; the queue is a small file).  Anything
    unreadable counts as work."""
    if home.job_start(lane).exists() or home.lane_claim(lane).exists():
        return False
    if any(home.runs.glob(f"*/{ending.FILE_NAME}")):
        return False
    priority = lanes.priority_of(lane)
    busy = [other for other in lanes.lanes_of(priority) if other != lane
            and (home.job_start(other).exists() or home.lane_claim(other).exists())]
    if any(other not in busy for other in lanes.lanes_of(priority) if other < lane):
        return True  # a lower lane is free: it takes the run, so the lanes fill in order
    try:
        with open(home.queue(priority), "rb") as fh:
            queued = sum(1 for line in fh if line.strip() and not line.startswith(b"#"))
    except FileNotFoundError:
        queued = 0
    return queued - len(busy) <= 0
