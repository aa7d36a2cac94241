"""run.py's engine: one node taking part in one run (port of run.pl, on seed 001's protocol).

The node reads job.start (:func:`cluster.node.runcontext.open_run`: the run's
:class:`~cluster.node.runcontext.RunContext`, made whole once), then talks to the master
on base_port + priority (:mod:`cluster.node.mastercontact`), which tells it what to do:

* BUILD: fetch the corpus and the product's source, and build it, in a background thread
  (:mod:`cluster.node.nodebuild`, :mod:`cluster.node.background`); meanwhile every call
  says ``busy build``.  The run holds its build's key
  (:class:`cluster.node.workdir.UseHold`) from its start to its end.
* JOBS: run them in the node's slots and read their results (:mod:`cluster.node.nodejobs`);
  the results go back with the next calls.
* UPLOAD: the node's logs and bmpcmp images go to the master, busy meanwhile
  (:mod:`cluster.node.nodeupload`, which also sends a sweep run's result bundles).
* ABORT: everything running is killed and the node leaves.

:class:`NodeRun` opens the run and wires those parts over its context; :class:`RunLoop`
runs the loop: start what the queue holds, call the master when a call is due, else wait
for a job's end, a deadline or the BUILD's end.

A failed BUILD reports failure -1, which ends the run for every node, only when the build
*command* failed (the source is at fault: every node would fail alike); the reason quotes
the build log's deciding error line (:mod:`cluster.node.buildlog`).  A build command that
failed for a reason of this node's own, a BUILD that could not fetch, and anything else
that failed on this node around the command report failure 1 (FAILURE_NETWORK): the master
drops this node and the others go on (:func:`cluster.node.nodebuild.build_failure`).  A
build ended because the node was told to stop is no failure at all: the node leaves the
run.  However the node leaves a run (ABORT, a signal, a failure), a BUILD or UPLOAD still
running is stopped and waited for first, so its build log ends with how it ended ("...
stopped: the node was told to stop") and no build command outlives run.py.

Exit codes (cluster.defaults NODE_EXIT_*): 0 the run is over for this node, 1 failure, 3 the
master could not be reached, 4 aborted for a reason that may pass (the node may join again
later).  TERM, INT and HUP (:data:`cluster.node.runcontext.STOP_SIGNALS`) only set
:attr:`NodeRun.stop_flag`; the loop then leaves the run (STYLE §5).
"""

from __future__ import annotations

import logging

from cluster.config import Config
from cluster.defaults import NODE_EXIT_ABORTED, NODE_EXIT_FAILED, NODE_EXIT_UNREACHABLE
from cluster.errors import ClusterError, MasterUnreachable
from cluster.node import workdir
from cluster.node.background import BackgroundWork
from cluster.node.mastercontact import MasterContact
from cluster.node.nodebuild import NodeBuild
from cluster.node.nodejobs import NodeJobs
from cluster.node.nodeupload import NodeUpload
from cluster.node.runcontext import SLOT_HOMES, RunContext, job_environment, open_run
from cluster.node.slots import SlotPool
from cluster.node.transport import Transport
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopFlag

log = logging.getLogger("cluster.node")


class NodeRun:
    """One node in one run.  Callers use :meth:`run` (returns an exit code) and :meth:`stop`
    (or :attr:`stop_flag`, for ``cluster.runtime.service.install_signal_handlers``).

    ``clock`` gives the loop's time (deadlines, report and poll intervals, its idle sleep).
    """

    def __init__(self, cfg: Config, transport: Transport, lane: int, caps: str,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.transport = transport
        #: The lane of the run (cluster.lanes: a priority's own lane is its number).
        self.lane = lane
        self.caps = caps
        self.clock = clock or SystemClock()
        self.name = cfg.effective_node_name()
        self.stop_flag = StopFlag()
        self.in_use = workdir.UseHold()  # the key of the build this run uses, held

    def stop(self) -> None:
        """Signal-safe: ask the loop to leave the run at its next pass."""
        self.stop_flag.set()

    def run(self) -> int:
        """Take part in the run job.start describes, to its end; the exit code."""
        try:
            return self._run()
        finally:
            self.in_use.release()

    def _run(self) -> int:
        try:
            loop = self.open()
        except MasterUnreachable as exc:  # after the transport's own connect_retries
            log.error("node %s: cannot start: %s", self.name, exc)
            return NODE_EXIT_UNREACHABLE
        except (ClusterError, ValueError, OSError) as exc:
            log.error("node %s: cannot start: %s", self.name, exc)
            return NODE_EXIT_FAILED
        log.info("node %s: joining run %s with %d slots", self.name, loop.ctx.start.id,
                 loop.ctx.slots)
        try:
            return loop.run()
        finally:
            loop.close()

    def open(self) -> RunLoop:
        """The run opened (:func:`cluster.node.runcontext.open_run`) and its parts wired,
        its slot shells started; the caller closes it (:meth:`RunLoop.close`)."""
        ctx = open_run(self.cfg, self.transport, self.lane, self.clock, self.stop_flag,
                       self.in_use)
        pool = SlotPool(ctx.slots, job_environment(), ctx.job_timeout, ctx.cfg.kill_grace,
                        clock=ctx.clock.monotonic, account=ctx.account,
                        homes=ctx.run_dir / SLOT_HOMES)
        return RunLoop(ctx, self.caps, pool)


class RunLoop:
    """The parts of one opened run (see the module docstring), and the loop over them."""

    def __init__(self, ctx: RunContext, caps: str, pool: SlotPool) -> None:
        self.ctx = ctx
        self.background = BackgroundWork(ctx.name)
        self.build = NodeBuild(ctx)
        self.upload = NodeUpload(ctx)
        self.jobs = NodeJobs(ctx, pool, self.build)
        self.contact = MasterContact(ctx, caps, self.jobs, self.build, self.upload,
                                     self.background)

    def run(self) -> int:
        """The loop, until the run is over for this node: its exit code."""
        ctx, jobs, contact = self.ctx, self.jobs, self.contact
        while True:
            now = ctx.clock.monotonic()
            jobs.spawn(now)
            if ctx.stop_flag.is_set():
                jobs.kill_all()
                contact.call(now, leaving=True)
                return NODE_EXIT_ABORTED
            if contact.due(now):
                code = contact.call(now)
                if code is not None:
                    return code
                continue
            code = contact.leave_if_done(now)  # preempted: gone once its jobs ended
            if code is not None:
                return code
            self.wait(contact.next_wakeup(now) - now)
            jobs.check_timeouts(ctx.clock.monotonic())

    def wait(self, timeout: float) -> None:
        """Sleep until a job ends or ``timeout`` passes, collecting what ended; with no
        job running, at most half a second, and no longer than the BUILD or UPLOAD runs."""
        if not self.jobs.pool.running():
            self.background.idle_wait(self.ctx.clock, max(min(timeout, 0.5), 0))
            return
        self.jobs.wait(timeout)

    def close(self) -> None:
        """Leave the run: the BUILD or UPLOAD stopped and waited for, the slots closed, the
        jobs' folders and leftovers removed, the node's log closed."""
        self.background.end(self.ctx.stop_flag, self.ctx.cfg.kill_grace)
        self.jobs.pool.close()
        self.jobs.end()
        self.ctx.node_log.close()
