"""clustermaster: phase 3 of an invocation, the one run it serves (seed 000).

An invocation (:mod:`cluster.master.run.invocation`) does phase 1 -- the queue scan, through
:data:`cluster.triggers.discovery.DISCOVERERS` -- and phase 2 -- the PID-file dance
(:mod:`cluster.master.run.pidfile`) -- and loads this module only when it has work.  Phase 3,
here: first the end of any run of this lane whose end was cut short
(:mod:`cluster.master.files.ending`), then the next run (:mod:`cluster.master.run.nextrun`: the head
of the queue, or the first run whose dependencies are met, after dropping those whose
dependencies failed, each with a report): job.start,
build.py -> jobs (:mod:`cluster.master.run.runsetup`), serve nodes on base_port + lane
(:mod:`cluster.master.run.servedrun`: the run opened once, then stepped turn by turn)
until every job has a result and the nodes have uploaded, or the run is stopped (its
user, an admin's
``runs/<id>/stop``, a node's build failure, its ``job_timeout`` (default ``max_run_time``),
lost nodes); the waiting runs past their ``queue_timeout`` leave the queue meanwhile
(:mod:`cluster.master.model.runlimits`); the live
status ``live[.p].json`` is rewritten every second meanwhile; then the end steps
(:mod:`cluster.master.end.endrun`); the invocation then removes the PID file.

Told to stop (:attr:`ClusterMaster.stop`, the invocation's
:class:`~cluster.runtime.service.StopPoint`), the master finishes the step it is in when
that step is the set-up of a run (its source, its job list) or the end steps, and leaves its
serving loop (or its linger) within a poll, the journal synced; anywhere else it stops at
once.  In every case the run stays as a killed master would leave it, and the invocation
removes the PID file so that the next one takes the run over at once.

The master's state survives its own death: job.start keeps the run id, the jobs file is
reused, every accepted result is in the journal before the node hears back, and the run's
elapsed time and lost nodes are in its folder (:mod:`cluster.master.files.progress`).
The resource file (:mod:`cluster.master.files.resources`) is rewritten when the run starts being
served, when its serving ends and when this invocation's work is done.  A master
that takes over a run whose journal it finds serves only the jobs that have no result yet;
one that finds an end record does only the end steps left.
"""

from __future__ import annotations

import logging

from cluster import lanes
from cluster.config import Config
from cluster.errors import ClusterError
from cluster.home import Home, suffixed
from cluster.master.end.endrun import RunEnder, RunOutcome
from cluster.master.files import ending, groups, resources
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.model import placement, runlimits
from cluster.master.run import nextrun
from cluster.master.run.pidfile import PidFile
from cluster.master.run.runsetup import (
    JobListError,
    NotNow,
    RunSetup,
    RunSetupError,
    new_run_id,
)
from cluster.master.run.servedrun import Ended, RunHost, ServedRun
from cluster.master.serve.handler import RequestHandler
from cluster.master.serve.server import NodeServer
from cluster.master.state.runstate import RunState
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import forkrun, logonce
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopPoint
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: RunOutcome.failed of a run whose end steps could not all be done now.
END_FAILED = "its end steps could not all be done"
#: A port another program holds is logged at most this often [seconds] ...
PORT_LOG_EVERY = 60.0
#: ... remembered across invocations in this stamp file in the home's log/ (per priority).
PORT_STAMP = "port-taken.stamp"


class ClusterMaster:
    """Phase 3 of one clustermaster invocation of one lane (:mod:`cluster.lanes`: a
    priority's own lane is its number; priority 0 has more): the run ends left and the
    next run of the queue (:mod:`cluster.master.run.nextrun`).  Phases 1 and 2, and the
    choice of whether to load this module at all, are
    :mod:`cluster.master.run.invocation`'s; callers use its ``invoke``."""

    def __init__(self, cfg: Config, lane: int, config_args: list[str] | None = None,
                 clock: Clock | None = None,
                 job_list_main: forkrun.Main | None = None) -> None:
        self.cfg = cfg
        self.lane = lane
        priority = self.priority = lanes.priority_of(lane)
        self.clock = clock or SystemClock()
        self.home = Home(cfg.home)
        self.queue = QueueFile(self.home.queue(priority), self.home.queue_lock(priority))
        self.ender = RunEnder(cfg, self.home, lane, self.queue, self.clock)
        #: The set-up of a run: its job.start and source, its job list (``config_args``
        #: and ``job_list_main`` are build.py's, :class:`RunSetup`).
        self.setup = RunSetup(cfg, self.home, lane, self.queue, self.clock,
                              config_args or [], job_list_main)
        #: The invocation's stop request (cluster.master.run.invocation sets it); this one,
        #: never installed, is never set.
        self.stop = StopPoint()

    # ------------------------------------------------------------------ phase 3
    def work(self, pid: PidFile, pending: list[EndRecord]) -> None:
        """Phase 3, for an invocation holding the PID file (``pid``, kept fresh by the
        caller, :func:`cluster.master.run.invocation.invoke`): finish the runs whose end was
        cut short (``pending``, oldest first), then serve the run at the head of the queue.
        A run end that cannot be finished now keeps the queue waiting."""
        for record in pending:
            log.warning("run %s: its end was cut short (%s done); finishing it",
                        record.run_id, ", ".join(sorted(record.done)) or "nothing")
            if self._end(record).failed == END_FAILED:
                return  # the queue waits until this run's end is done
        try:
            self._expire_waiting(self._started())
            choice = nextrun.look(self.home, self.lane, self.queue)
            for spec, reason in choice.drop:  # a run it waits for did not end well
                if self._drop(spec, reason).failed == END_FAILED:
                    return
            # Claimed first (another lane may have chosen it too), and moved to the front.
            if choice.serve is not None and nextrun.claim(self.home, self.lane, self.queue,
                                                           choice.serve):
                self.run(choice.serve, pid)
        finally:
            nextrun.release(self.home, self.lane)
            # A run ended (or could not start): the resource file says so at once.
            resources.refresh(self.cfg, self.clock)

    def run(self, spec: RunSpec, pid: PidFile) -> RunOutcome:
        """Run ``spec`` to the end (or until another master replaces this one)."""
        p = self.lane
        # Listen before job.start exists: a node that reads job.start at once then finds
        # the port open (its call waits in the backlog while build.py makes the job list)
        # instead of being refused and retrying connect_retry_delay later.  The handler
        # only runs from _serve, once the run is opened (ServedRun.open binds it).
        handler = RequestHandler(self.cfg.max_line_bytes, self.cfg.max_request_lines,
                                 self.clock.monotonic)
        try:
            server = NodeServer((self.cfg.listen_address, self.cfg.port_for(p)), handler,
                                max_line=self.cfg.max_line_bytes,
                                max_lines=self.cfg.max_request_lines,
                                max_request=self.cfg.max_request_bytes,
                                max_buffered=self.cfg.max_buffered_bytes,
                                deadline=self.cfg.connection_deadline,
                                on_refusal=handler.server_refused)
            handler.refusals = server.refusals
        except OSError as exc:
            # Another program holds the port: leave everything as it is and try again at
            # the next invocation (a run in progress keeps its id and journal).  Said at
            # most once a minute: every tick's invocation meets it (logonce's stamp file).
            text = (f"{lanes.describe(p)}: cannot listen on {self.cfg.listen_address}:"
                    f"{self.cfg.port_for(p)}: {exc}")
            stamp = self.home.log_dir / suffixed(PORT_STAMP, p)
            if logonce.due(stamp, text, PORT_LOG_EVERY):
                log.error("%s (said at most once a minute while it lasts)", text)
            else:
                log.debug("%s", text)
            return RunOutcome("", None, replaced=True)
        try:
            return self._run(spec, pid, server, handler)
        finally:
            server.close()

    def _run(self, spec: RunSpec, pid: PidFile, server: NodeServer,
             handler: RequestHandler) -> RunOutcome:
        """Set ``spec`` up (its job.start and job list), serve it on ``server``, and do
        its end steps; a run that cannot start is abandoned with a report."""
        try:
            with self.stop.held(), pid.keep_fresh(self.cfg.pid_check_interval):
                start = self.setup.job_start(spec)
        except NotNow as exc:
            log.info("%s: %s; trying again at the next invocation", lanes.describe(self.lane),
                     exc)
            return RunOutcome("", None, replaced=True)
        except RunSetupError as exc:
            self.stop.check()  # a stop cut it short: the next master sets the run up
            log.error("run %s: %s", exc.start.id, exc)
            return self._abandon(exc.start, f"its source could not be made: {exc}")
        run_id = start.id
        for left in self.home.clean_temps(run_id):
            log.info("run %s: removed %s, left by a killed process", run_id, left)
        options = runlimits.run_options(spec, self.cfg)  # once, kept with the state
        policy = placement.RunPolicy.of(options)
        policy.set_groups(groups.all_groups(self.home))
        try:
            with self.stop.held(), pid.keep_fresh(self.cfg.pid_check_interval):
                jobs = self.setup.jobs(start, self.setup.every_node(policy))
        except JobListError as exc:
            # The supervisor's SIGTERM reaches build.py's fork too (one process group):
            # then the next master makes the job list, and the run is not abandoned.
            self.stop.check()
            # Retrying cannot help (bad corpus, bad configuration): report and dequeue,
            # or the run would block its queue forever.
            log.error("run %s: %s", run_id, exc)
            return self._abandon(start, f"its job list could not be made: {exc}")
        (self.home.run_dir(run_id) / "logs").mkdir(parents=True, exist_ok=True)
        try:
            sweep = self.setup.sweep(spec, start)
        except ClusterError as exc:
            log.error("run %s: %s", run_id, exc)
            return self._abandon(start, f"its sweep file could not be read: {exc}")
        host = RunHost(self.cfg, self.home, self.priority, self.lane, self.clock, self.stop,
                       pid.refresh,
                       self.ender.attempts, lambda: self._expire_waiting(spec))
        served = ServedRun.open(host, spec, start, jobs, options, policy, sweep, server,
                                handler)
        del jobs  # the run's state holds them, and the end steps drop it
        # A stop ends the serving loop (or the linger) at its next look; the journal and
        # its companions are closed below before the invocation exits.
        with self.stop.held(then_raise=False):
            try:
                record = served.end(self._serve(served))
            finally:
                served.close()
        if record is None:
            return RunOutcome(run_id, None, replaced=True)
        self.stop.check()  # asked during the linger: the next master does the end steps
        # The ender takes the only reference left to the run's state, and drops it once
        # the report is made.
        held = served.hand_over()
        del served
        with pid.keep_fresh(self.cfg.pid_check_interval):
            return self._end(record, held)

    def _serve(self, served: ServedRun) -> Ended:
        """Serve nodes until the run's serving ends (:meth:`ServedRun.tick`, turn after
        turn); return how (:class:`Ended`: its outcome None when another master replaced
        this one and the run goes on under it, or a stop was asked and the run goes on
        under the next)."""
        while True:
            ended = served.tick(self.clock.monotonic())
            if ended is not None:
                return ended

    def _end(self, record: EndRecord, held: list[RunState] | None = None) -> RunOutcome:
        """The end steps left of ``record``.  A step that fails (a full disk, a job list
        that cannot be read) is logged and leaves the record: the next clustermaster of
        this priority tries again, and nothing done so far is done twice.  A stop asked
        meanwhile waits for the end steps (they are bounded) and is raised after them."""
        try:
            with self.stop.held():
                return self.ender.end(record, held)
        except (OSError, ClusterError) as exc:
            log.error("run %s: its end stopped at a failed step (%s done so far): %s; the "
                      "next clustermaster finishes it", record.run_id,
                      ", ".join(s for s in ending.STEPS if record.is_done(s)) or "nothing",
                      exc)
            return RunOutcome(record.run_id, None, failed=END_FAILED)

    def _abandon(self, start: JobStart, reason: str) -> RunOutcome:
        """End a run that cannot start: a report saying why, then dequeue it."""
        record = EndRecord.create(self.home.run_dir(start.id), start, Outcome.UNSTARTABLE,
                                  reason)
        return self._end(record)

    def _drop(self, spec: RunSpec, reason: str) -> RunOutcome:
        """End a queued run that waits for a run that did not end well: a report saying so
        (mailed), as for a run that cannot start, then dequeue it (cluster.deps)."""
        start = JobStart(id=new_run_id(self.priority, self.clock), priority=self.priority,
                         queue=spec.line(), kind=spec.kind, ref=spec.ref,
                         products=spec.products, tree=spec.tree, source="", build="",
                         tests="", options=spec.options,
                         lane_number=self.lane if self.lane != self.priority else -1)
        log.warning("run %s: %s leaves queue %d: %s", start.id, spec.line(), self.priority,
                    reason)
        return self._abandon(start, reason)

    def _started(self) -> RunSpec | None:
        """The queue line of the run job.start describes (started, and not yet ended), or
        None."""
        try:
            return RunSpec.parse(JobStart.parse(
                self.home.job_start(self.lane).read_text(encoding="utf-8")).queue)
        except (OSError, ValueError):
            return None

    def _expire_waiting(self, serving: RunSpec | None) -> None:
        """The waiting runs whose ``queue_timeout`` passed leave the queue, each with its
        short report (:func:`cluster.master.model.runlimits.drop_expired`); ``serving`` (the run
        being served or started) stays, and so do the other lanes' runs.  Only the
        priority's own lane does this (two lanes would end one run twice).  A failed end is
        logged and left to the next try."""
        if self.lane != self.priority:
            return
        try:
            kept = [serving] if serving is not None else []
            runlimits.drop_expired(self.home, self.priority, self.queue, self.cfg,
                                   self.clock.time(),
                                   kept + nextrun.others_lines(self.home, self.lane),
                                   lambda: new_run_id(self.priority, self.clock), self._end)
        except (OSError, ClusterError) as exc:
            log.error("priority %d: the runs past their queue_timeout could not be "
                      "dropped now: %s", self.priority, exc)

