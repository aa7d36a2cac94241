"""One clustermaster invocation up to the point where it knows whether it has work.

The supervisor starts clustermaster 0, 1 and 2 every ``supervisor_interval`` seconds
(seed 000), and nearly every one of those invocations finds nothing to do: its queue is
empty, or another master serves it.  :func:`invoke` does phases 1 and 2 -- the queue scan
and the PID-file dance -- and looks for a cut-short run end and the queue's head with
the few light modules they need.  Only when there is a run to serve or an end to finish
does it load :mod:`cluster.master.clustermaster` (the server, the run state, the report,
the mail, bmpcmp: about two thirds of the invocation's start-up), so an idle invocation
costs a fraction of what one that serves a run does.  Taken together with the 10 s tick,
that is what the master machine pays all day for a cluster at rest.

The contract of an invocation is seed 000's, unchanged: at most one run, then exit; the
exit status is EXIT_OK unless the caller's configuration was unusable.
"""

from __future__ import annotations

import logging

from cluster.config import Config
from cluster.defaults import EXIT_OK
from cluster.home import Home
from cluster.master import ending
from cluster.master.pidfile import PidDecision, PidFile
from cluster.queue import QueueFile
from cluster.runtime.clock import Clock, SystemClock
from cluster.triggers import discovery

log = logging.getLogger("cluster.master")


def queue_scan(cfg: Config, home: Home, priority: int, queue: QueueFile) -> None:
    """Phase 1: let this priority's discoverers append new runs to the queue (one broken
    discoverer is logged and does not stop the others or the invocation)."""
    for discover in discovery.DISCOVERERS.get(priority, ()):
        try:
            for spec in discover(home, cfg, queue):
                log.info("priority %d: queued %s", priority, spec.line())
        except Exception:  # one broken discoverer must not stop the run
            log.exception("priority %d: discoverer %s failed", priority,
                          getattr(discover, "__name__", discover))


def invoke(cfg: Config, priority: int, config_args: list[str] | None = None,
           clock: Clock | None = None) -> int:
    """Phases 1 and 2 at ``priority``, then phase 3 if this invocation holds the PID file
    and has work: the end of any run whose end was cut short, then the run at the head of
    the queue (:meth:`cluster.master.clustermaster.ClusterMaster.work`).  The PID file is
    kept fresh meanwhile and released at the end."""
    clock = clock or SystemClock()
    home = Home(cfg.home)
    home.create()
    queue = QueueFile(home.queue(priority), home.queue_lock(priority))
    queue_scan(cfg, home, priority, queue)
    pid = PidFile(home.pid_file(priority), clock, stale_after=cfg.pid_stale,
                  wait=cfg.pid_wait, refresh_every=cfg.pid_check_interval)
    decision = pid.acquire()
    if decision is not PidDecision.RUN:
        log.debug("priority %d: %s, exiting", priority, decision.value)
        return EXIT_OK
    try:
        with pid.keep_fresh(cfg.pid_check_interval):
            pending = ending.pending(home, priority)
            if not pending and queue.head() is None:
                return EXIT_OK
            # Loaded only now, on purpose: see the module's docstring.
            from cluster.master.clustermaster import ClusterMaster
            ClusterMaster(cfg, priority, config_args, clock).work(pid, pending)
    finally:
        pid.release()
    return EXIT_OK
