"""clustermaster: phase 3 of an invocation, the one run it serves (seed 000).

An invocation (:mod:`cluster.master.run.invocation`) does phase 1 -- the queue scan, through
:data:`cluster.triggers.discovery.DISCOVERERS` -- and phase 2 -- the PID-file dance
(:mod:`cluster.master.run.pidfile`) -- and loads this module only when it has work.  Phase 3,
here: first the end of any run of this priority whose end was cut short
(:mod:`cluster.master.files.ending`), then the next run (:mod:`cluster.master.run.nextrun`: the head
of the queue, or the first run whose dependencies are met, after dropping those whose
dependencies failed, each with a report): job.start,
build.py -> jobs, serve nodes on base_port + priority until every job has a result and
the nodes have uploaded, or the run is stopped (its user, an admin's
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

import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from cluster import datatypes
from cluster.config import Config
from cluster.defaults import REPO_ROOT, USER_PRIORITY
from cluster.errors import ClusterError
from cluster.home import Home, suffixed
from cluster.jobs.generate import required_programs
from cluster.jobs.sweepjobs import node_job_timeout
from cluster.master.cache import reuse
from cluster.master.end import finish
from cluster.master.end.endrun import RunEnder, RunOutcome, exported_source, write_status
from cluster.master.files import abort, codelock, ending, groups, journal, nodefiles, resources
from cluster.master.files.audit import AuditLog
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.files.keycache import run_keys
from cluster.master.files.progress import RunProgress
from cluster.master.model import joborder, placement, runlimits
from cluster.master.model.joblist import JobFile
from cluster.master.model.leases import LEASES_FILE, LeaseLog, read_leases
from cluster.master.run import nextrun
from cluster.master.run.pidfile import PidFile
from cluster.master.serve import confirm
from cluster.master.serve.handler import NonceLog, RequestHandler, RunSession
from cluster.master.serve.server import NodeServer
from cluster.master.serve.sweepintake import SweepIntake
from cluster.master.state.livestatus import LiveStatus
from cluster.master.state.runstate import NodeState, RunState, Settings
from cluster.node import buildcmd
from cluster.queue import QueueFile
from cluster.runspec import SWEEP, RunSpec
from cluster.runtime import forkrun, fsutil, logonce, proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopPoint, signal_name
from cluster.sweep import spec as sweepspec
from cluster.triggers import auto, push
from cluster.triggers.git.export import export_commit
from cluster.wire import caps, protocol, signing
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: How often the master looks for nodes whose lease lapsed [seconds].
LIVENESS_INTERVAL = 0.25
BUILD_SCRIPT = REPO_ROOT / "build.py"
#: RunState.fatal of a run its user stopped with clusterpush abort.
USER_ABORT = "aborted by its user (clusterpush abort)"
#: RunState.fatal of a run another master took over (the nodes rejoin that one).
REPLACED = protocol.REPLACED
#: RunOutcome.failed of a run whose end steps could not all be done now.
END_FAILED = "its end steps could not all be done"
#: How often the serving master saves the run's progress [seconds].
PROGRESS_INTERVAL = 1.0
#: job.start's permission bits: the owner's (it names the run's source and build command).
JOB_START_MODE = 0o600
#: The run's accepted nonces (handler.NonceLog), in runs/<id>/.
NONCES_FILE = "nonces"
#: A port another program holds is logged at most this often [seconds] ...
PORT_LOG_EVERY = 60.0
#: ... remembered across invocations in this stamp file in the home's log/ (per priority).
PORT_STAMP = "port-taken.stamp"
#: build.py understands these queue options; the rest are for the node or the report.
BUILD_OPTIONS = ("lowres", "highres")
#: job.start's ``build`` of a sweep run: nothing to build (a sweep folder's own
#: ``cluster-build`` script still overrides it, cluster.node.buildcmd).
SWEEP_BUILD = "true"


def new_run_id(priority: int, clock: Clock) -> str:
    """A job id as seed 001 suggests (the start time), made unique across priorities."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(clock.time()))
    return f"{stamp}-p{priority}-{secrets.token_hex(2)}"


def _auto_sweep(spec: RunSpec) -> bool:
    """Whether ``spec`` is a nightly or weekly sweep (``sweep <folder>`` in its jobdef)."""
    return spec.kind == "auto" and spec.sweep_file is not None


def write_job_start(path: Path, start: JobStart) -> None:
    """Write ``start`` as job.start, readable by its owner only (0600).  It holds no
    secret: each node signs with its own key (:mod:`cluster.nodekeys`)."""
    fsutil.atomic_write(path, start.format(), mode=JOB_START_MODE)
    os.chmod(path, JOB_START_MODE)  # atomic_write keeps an older file's bits otherwise


class JobListError(ClusterError):
    """build.py could not make the run's job list."""


class NotNow(ClusterError):
    """A run cannot start at this invocation, but may at the next (a push is syncing its
    tree, or the queue's head changed); nothing was written."""


class RunSetupError(ClusterError):
    """A run's source could not be put in place; ``start`` is its (unwritten) job.start."""

    def __init__(self, start: JobStart, problem: str) -> None:
        super().__init__(problem)
        self.start = start


class ClusterMaster:
    """Phase 3 of one clustermaster invocation at one priority: the run ends left and the
    run at the head of the queue.  Phases 1 and 2, and the choice of whether to load this
    module at all, are :mod:`cluster.master.run.invocation`'s; callers use its ``invoke``."""

    def __init__(self, cfg: Config, priority: int, config_args: list[str] | None = None,
                 clock: Clock | None = None,
                 job_list_main: forkrun.Main | None = None) -> None:
        self.cfg = cfg
        self.priority = priority
        self.config_args = config_args or []
        #: build.py's main, run in a fork (:mod:`cluster.runtime.forkrun`); without it,
        #: build.py is run as a program of its own.
        self.job_list_main = job_list_main
        self.clock = clock or SystemClock()
        self.home = Home(cfg.home)
        self.queue = QueueFile(self.home.queue(priority), self.home.queue_lock(priority))
        self.ender = RunEnder(cfg, self.home, priority, self.queue, self.clock)
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
            choice = nextrun.look(self.home, self.priority, self.queue)
            for spec, reason in choice.drop:  # a run it waits for did not end well
                if self._drop(spec, reason).failed == END_FAILED:
                    return
            # Moved to the head first: the head of a queue is its running run.
            if choice.serve is not None and self.queue.promote(choice.serve):
                self.run(choice.serve, pid)
        finally:
            # A run ended (or could not start): the resource file says so at once.
            resources.refresh(self.cfg, self.clock)

    def run(self, spec: RunSpec, pid: PidFile) -> RunOutcome:
        """Run ``spec`` to the end (or until another master replaces this one)."""
        p = self.priority
        # Listen before job.start exists: a node that reads job.start at once then finds
        # the port open (its call waits in the backlog while build.py makes the job list)
        # instead of being refused and retrying connect_retry_delay later.  The handler
        # only runs from _serve, once ``state`` and ``jrnl`` below exist.
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
            text = (f"priority {p}: cannot listen on {self.cfg.listen_address}:"
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
        home, p = self.home, self.priority
        try:
            with self.stop.held(), pid.keep_fresh(self.cfg.pid_check_interval):
                start = self._job_start(spec)
        except NotNow as exc:
            log.info("priority %d: %s; trying again at the next invocation", p, exc)
            return RunOutcome("", None, replaced=True)
        except RunSetupError as exc:
            self.stop.check()  # a stop cut it short: the next master sets the run up
            log.error("run %s: %s", exc.start.id, exc)
            return self._abandon(exc.start, f"its source could not be made: {exc}")
        run_id = start.id
        for left in home.clean_temps(run_id):
            log.info("run %s: removed %s, left by a killed process", run_id, left)
        options = runlimits.run_options(spec, self.cfg)  # once, kept with the state
        policy = placement.RunPolicy.of(options)
        policy.set_groups(groups.all_groups(home))
        try:
            with self.stop.held(), pid.keep_fresh(self.cfg.pid_check_interval):
                jobs = self._jobs(start, self._every_node(policy))
        except JobListError as exc:
            # The supervisor's SIGTERM reaches build.py's fork too (one process group):
            # then the next master makes the job list, and the run is not abandoned.
            self.stop.check()
            # Retrying cannot help (bad corpus, bad configuration): report and dequeue,
            # or the run would block its queue forever.
            log.error("run %s: %s", run_id, exc)
            return self._abandon(start, f"its job list could not be made: {exc}")
        run_dir = home.run_dir(run_id)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        sweep = None
        if spec.sweep_file is not None:
            # The sweep file in the run's snapshot: its results, checks and retries.
            try:
                sweep = sweepspec.load(home.root / start.source / spec.sweep_file)
            except ClusterError as exc:
                log.error("run %s: %s", run_id, exc)
                return self._abandon(start, f"its sweep file could not be read: {exc}")
        jrnl = journal.Journal(home.results(p), run_id, self.cfg.journal_sync_interval)
        if jrnl.loaded:
            log.info("run %s: taking over, %d results already journaled", run_id,
                     len(jrnl.loaded))
        settings = Settings.from_config(self.cfg)
        needs = self.cfg.required_tools

        def suitable(caps_text: str) -> tuple[bool, str]:
            return caps.suitable(caps_text, needs, self.cfg.min_ram_mb)

        state = RunState(run_id, jobs, self.clock.monotonic(), settings, suitable,
                         done=jrnl.lines, policy=policy)
        state.options = options  # the run's own, once
        state.reuse = reuse.for_run(self.cfg, home, spec, start, options, jobs)
        jrnl.lines = []  # the state has them now
        intake = None
        if sweep is not None:
            # Before any request: the tries of earlier masters counted, their leftovers gone.
            intake = SweepIntake.open(run_dir, sweep, self.cfg.max_result_bytes, state)
            jrnl.attach(intake)
        # The time of every master that served the run, and the gap while none did (at
        # most the PID file's staleness and wait, and a minute of starting).
        progress = RunProgress.load(run_dir, self.clock,
                                    max_gap=self.cfg.pid_stale + self.cfg.pid_wait + 60.0)
        if state.results.count or self.ender.attempts.count(spec.line()):
            # A run with results had nodes, whoever served them; another attempt of a run
            # that lost its nodes waits no_node_timeout for one, then gives up.
            progress.had_nodes = True
        # Each node signs with its own key (docs/protocol.md, "Signed messages"); the nonces
        # accepted by the masters before this one are refused as replays here too.
        guard = signing.ReplayGuard()
        nonce_path = run_dir / NONCES_FILE
        loaded = NonceLog.load(nonce_path, guard)
        if loaded:
            log.info("run %s: %d nonces of earlier masters loaded into the replay guard",
                     run_id, loaded)
        # The leases of earlier masters: their nodes' results are taken here too.
        lease_path = run_dir / LEASES_FILE
        leased = state.leases.load(read_leases(lease_path, len(jobs)))
        if leased:
            log.info("run %s: %d leases of earlier masters loaded", run_id, leased)
        lease_log = LeaseLog(lease_path)
        state.leases.log = lease_log.append
        session = RunSession(run_keys(home.root, run_id, self.clock.monotonic), guard,
                             AuditLog(home.audit_log(run_id), self.clock),
                             NonceLog(nonce_path))
        # Its start as the first master saw it: now less the elapsed time of them all.
        live = LiveStatus(home.live(p), start, self.clock.time() - progress.elapsed(),
                          self.clock)
        state.set_disabled(nodefiles.disabled_nodes(home))
        handler.bind(state, jrnl, session, intake)
        log.info("run %s: %s, %d jobs (%d to do), port %d, %.0f s run so far", run_id,
                 spec.line(), len(jobs), state.remaining, self.cfg.port_for(p),
                 progress.elapsed())
        # The run is served from now on: its counts in the live file, and the resource
        # file saying so at once (provisioners start nodes for it).
        live.update(state, progress.lost + state.lost)
        resources.refresh(self.cfg, self.clock)
        # Differences run again before the run ends (docs/results.md, "Differences
        # confirmed, indeterminate tests named"): a second phase, same run.
        confirming = confirm.ConfirmPhase(self.cfg, home, spec, state, handler, session)
        # A stop ends the serving loop (or the linger) at its next look; the journal and
        # its companions are closed below before the invocation exits.
        with self.stop.held(then_raise=False):
            try:
                ended = self._serve(server, state, jrnl, pid, progress, session.audit, live,
                                    spec, confirming)
                if ended is None:
                    if self.stop.is_set():
                        log.warning("run %s: stop requested (%s); its journal is synced and "
                                    "the next clustermaster takes it over", run_id,
                                    signal_name(self.stop.flag.signum))
                    else:
                        log.warning("run %s: the PID file is no longer ours; aborting nodes, "
                                    "exiting", run_id)
                    progress.save(state.lost, bool(state.machines))
                    return RunOutcome(run_id, None, replaced=True)
                outcome, reason = ended
                if outcome is Outcome.RETRY and \
                        self.ender.attempts.count(spec.line()) + 1 >= self.cfg.max_tries:
                    outcome = Outcome.GAVE_UP
                    reason += f" (attempt {self.cfg.max_tries} of {self.cfg.max_tries})"
                jrnl.sync()  # every result is on disk before the run counts as ended
                confirming.sync()  # and every confirm result
                record = EndRecord.create(run_dir, start, outcome, reason,
                                          elapsed=progress.elapsed(),
                                          lost=tuple(progress.lost + state.lost))
                live.remove()
                # The run is over: nodes that call in now learn it and leave.
                self._unlink(home.job_start(p))
                resources.refresh(self.cfg, self.clock)  # finished: no more nodes wanted
                self._linger(server, confirming.state or state, audit=session.audit)
            finally:
                confirming.close()
                if intake is not None:
                    intake.close()
                jrnl.close()
                server.refusals.flush()  # the bursts' counts, into the log and the audit trail
                session.audit.flush(force=True)  # complete before the end steps archive it
                if session.nonces is not None:
                    session.nonces.close()
                lease_log.close()
        self.stop.check()  # asked during the linger: the next master does the end steps
        # From here on the server is not served, so its handler needs no state; the ender
        # takes the only reference left, and drops it once the report is made.
        handler.unbind()
        held = [state]
        del state, jobs
        with pid.keep_fresh(self.cfg.pid_check_interval):
            return self._end(record, held)

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
                         tests="", options=spec.options)
        log.warning("run %s: %s leaves queue %d: %s", start.id, spec.line(), self.priority,
                    reason)
        return self._abandon(start, reason)

    def _job_start(self, spec: RunSpec) -> JobStart:
        """Reuse job.start if it describes this queue line (takeover), else write a new one.

        Before job.start is written the run's source is in place: a commit run's tree is
        exported at its commit, a bmpcmp run's test list is taken from the user's last run.
        RunSetupError (carrying the unwritten JobStart) when that cannot be done.
        """
        path = self.home.job_start(self.priority)
        try:
            old = JobStart.parse(path.read_text(encoding="utf-8"))
            if old.queue == spec.line():
                self._prepare_source(spec, old)  # a takeover: redo what may be missing
                if old.secret:
                    # Written by a master that gave each run a shared secret: nodes sign
                    # with their own keys now, so the run keeps its id and loses the line.
                    old = dataclasses.replace(old, secret="")
                    write_job_start(path, old)
                return old
        except FileNotFoundError:
            pass
        except ValueError as exc:
            log.warning("%s is unreadable (%s); starting the run afresh", path, exc)
        run_id = new_run_id(self.priority, self.clock)
        # The programs the run's jobs call (``__bin__/<name>``): the build's make targets,
        # and job.start's ``programs`` each node checks after its build.
        programs = tuple(required_programs(self.cfg, spec.products))
        start = JobStart(
            id=run_id, priority=self.priority,
            queue=spec.line(), kind=spec.kind, ref=spec.ref, products=spec.products,
            tree=spec.tree, source=self._source_for(spec, run_id),
            # A sweep folder needs no build unless it brings its own (cluster-build).
            build=SWEEP_BUILD if spec.sweep_file is not None else self.cfg.build_command,
            build_ghostpdl=self.cfg.build_ghostpdl.replace(
                buildcmd.TARGETS, buildcmd.ghostpdl_targets(programs)),
            build_mupdf=self.cfg.build_mupdf,
            tests=self.cfg.tests_dir.as_posix() if not self.cfg.tests_dir.is_absolute()
            else os.path.relpath(self.cfg.tests_dir, self.home.root),
            options=spec.options,
            baseline=spec.tree if finish.is_bmpcmp(spec) else "",
            programs=programs)
        for stale in (self.home.jobs(self.priority), self.home.results(self.priority)):
            self._unlink(stale)

        def publish() -> None:
            nonlocal start
            # A push may have replaced the waiting line since we read the head: running the
            # old line now would run it twice (the new one stays queued).
            if self.queue.head() != spec:
                raise NotNow(f"the head of {self.queue.path.name} changed while run "
                             f"{run_id} was set up")
            start = self._sweep_limits(spec, start)  # the sweep file is in place now
            start = runlimits.with_task_timeout(start, runlimits.run_options(spec, self.cfg))
            write_job_start(path, start)

        # The nodes fetch the node code when they see job.start: the one this tick's
        # supervisor publishes, not the one before it (cluster.master.files.codelock).  Waited for
        # here, before the source is set up: a user run's job.start is written under the
        # pushed tree's lock, which the user's next push waits for.
        if not codelock.wait_for_publish(self.home.node_code_lock):
            log.warning("run %s: the node code's publish still holds %s after %.0f s; "
                        "announcing the run with what is published", run_id,
                        self.home.node_code_lock, codelock.WAIT_LIMIT)
        try:
            self._prepare_source(spec, start, publish)
        except NotNow:
            shutil.rmtree(self.home.run_dir(run_id), ignore_errors=True)
            raise
        return start

    def _sweep_limits(self, spec: RunSpec, start: JobStart) -> JobStart:
        """A sweep run's ``start`` with ``max_result_bytes`` (master.conf), the nodes'
        ``job_timeout`` (the sweep's ``timeout`` in the run's snapshot of the folder:
        :func:`cluster.jobs.sweepjobs.node_job_timeout`) and ``sweep_results`` (its
        ``[results]``, which the nodes take from each task's folder); other runs'
        unchanged.  A sweep file that cannot be read leaves the nodes their own
        job_timeout (build.py then refuses it, naming the key)."""
        if spec.sweep_file is None:
            return start
        try:
            sweep = sweepspec.load(self.home.root / start.source / spec.sweep_file)
        except ClusterError:
            return dataclasses.replace(start, max_result_bytes=self.cfg.max_result_bytes)
        return dataclasses.replace(
            start, max_result_bytes=self.cfg.max_result_bytes,
            job_timeout=node_job_timeout(sweep.timeout),
            sweep_results=tuple((r.name, r.source) for r in sweep.results))

    def _source_for(self, spec: RunSpec, run_id: str) -> str:
        """The tree the nodes build, relative to the home."""
        if spec.kind == "user" or _auto_sweep(spec):
            # A snapshot of the pushed tree (or of an auto sweep's folder), taken when the
            # run starts: a later push of the same tree (which waits its turn) cannot
            # change what this run builds and reports.
            return f"runs/{run_id}/source/{spec.tree}"
        if spec.kind == "git" and self._repository(spec.tree):
            return f"runs/{run_id}/source/{spec.tree}"  # the commit, exported
        return spec.tree  # the master's own clean tree of that product

    def _repository(self, tree: str) -> bool:
        """Whether the master keeps a git clone of ``tree`` (commit runs export from it)."""
        return tree in datatypes.parse_repositories(self.cfg.repositories)

    def _prepare_source(self, spec: RunSpec, start: JobStart,
                        publish: Callable[[], None] | None = None) -> None:
        """Write a bmpcmp run's test list; export a commit run's tree or snapshot a user
        run's; check the baseline; then ``publish`` (write job.start), if given.

        A user run's job.start is written while the pushed tree's lock is still held, so
        a push syncing just after the snapshot is queued as a run of its own, never merged
        into this one (:func:`cluster.triggers.push.snapshot_push`).  NotNow when the tree
        stays busy or the queue's head changed meanwhile: the next invocation tries again.
        """
        run_dir = self.home.run_dir(start.id)
        try:
            self._bmpcmp_listing(spec, start, run_dir)
            dest = self.home.root / start.source
            if exported_source(start):
                if not dest.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    export_commit(self.home, self.cfg, spec.tree, spec.ref, dest)
            elif spec.kind == "user":
                if not dest.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    push.snapshot_push(self.home, spec.ref, spec.tree, dest, then=publish)
                    publish = None  # done under the tree's lock
            elif _auto_sweep(spec):
                if not dest.is_dir():
                    auto.snapshot_sweep(self.home, spec, dest)  # the folder its jobdef names
            elif not dest.is_dir():
                raise ClusterError(f"the master has no tree {start.source!r} to build "
                                   f"(expected {dest})")
        except push.TreeBusy as exc:
            raise NotNow(f"the pushed tree is busy ({exc})") from None
        except NotNow:
            raise
        except ClusterError as exc:
            raise RunSetupError(start, str(exc)) from None
        if publish is not None:
            publish()

    def _bmpcmp_listing(self, spec: RunSpec, start: JobStart, run_dir: Path) -> None:
        """A bmpcmp run's tests: the user's last run's changed list (ClusterError if none)."""
        if not finish.is_bmpcmp(spec):
            return
        if not (self.home.root / start.baseline).is_dir():
            raise ClusterError(f"bmpcmp needs the master's clean tree "
                               f"{self.home.root / start.baseline} as its baseline")
        listing = run_dir / "bmpcmp.lst"
        if not listing.exists():
            previous = finish.last_user_run(self.home, spec.ref)
            if previous is None:
                raise ClusterError(f"user {spec.ref} has no earlier run to bmpcmp")
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(previous / finish.CHANGED_LIST, listing)

    def _every_node(self, policy: placement.RunPolicy) -> list[str] | None:
        """The nodes an every_node run's jobs are made for: up (heard from within
        ``heartbeat_timeout``), enabled and placed now (None: not an every_node run)."""
        if not policy.every_node:
            return None
        up = placement.nodes_up(self.home, self.cfg.heartbeat_timeout, self.clock.time(),
                                nodefiles.disabled_nodes(self.home))
        chosen = [n for n in up if policy.placement.may_take(n, policy.groups)]
        log.info("every_node: one copy of each job for each of %d nodes: %s", len(chosen),
                 ", ".join(chosen) or "none")
        return chosen

    def _placement_tick(self, state: RunState, live: LiveStatus, now: float) -> None:
        """Every ``pid_check_interval``: the groups read again; while no node serves the run,
        why (``live.waiting``: "no node of group win64 is up"); an every_node run's jobs
        pinned to a node that is not in the run and not up (or that left it) settled as
        not run, so the run's end does not wait for it."""
        policy = state.policy
        if not (policy.placement.restricted or policy.every_node):
            return
        policy.set_groups(groups.all_groups(self.home))
        up = placement.nodes_up(self.home, self.cfg.heartbeat_timeout, self.clock.time(),
                                state.disabled)
        live.waiting = "" if state.live_nodes() else placement.waiting_reason(
            policy.placement, up, policy.groups)
        if not policy.every_node or now - state.started < self.cfg.heartbeat_timeout:
            return  # every node up has had time to call
        for name in policy.pins:
            node = state.nodes.get(name)
            if node is not None and node.state is not NodeState.GONE:
                continue
            why = ("left the run" if node is not None
                   else "was refused" if name in state.culled
                   else None if name in up else "is not up")
            if why is not None:
                for note in state.settle_absent(name, why, now):
                    log.warning("run %s: %s", state.run_id, note)

    def _jobs(self, start: JobStart, every_node: list[str] | None = None) -> JobFile:
        """The run's job list: the jobs file if it is there (takeover), else build.py's
        (for an every_node run, each job once per node of ``every_node``:
        :func:`cluster.master.model.placement.expand_every_node`).

        build.py writes straight into the file (a million job lines are 200 MB or more: the
        master never holds them), which is then indexed (:class:`JobFile`).
        """
        path = self.home.jobs(self.priority)
        if not path.exists():
            argv = [*self.config_args, "--home", str(self.home.root)]
            queued = RunSpec.parse(start.queue)
            sweep_file = queued.sweep_file
            if "bmpcmp" in start.options:
                argv += ["bmpcmp", "--from", str(self.home.run_dir(start.id) / "bmpcmp.lst")]
            elif sweep_file is not None:
                # The sweep file in the run's snapshot of the pushed sweep folder.
                argv += [SWEEP, "--sweep", str(self.home.root / start.source / sweep_file)]
                if queued.resume is not None:
                    # A resume run: only the tasks not valid in the run it resumes.
                    argv += ["--resume", str(self.home.archive / queued.resume)]
            else:
                argv += [*start.products, *[o for o in start.options
                                            if o in BUILD_OPTIONS or o.startswith("filter=")]]
            timeout = self.cfg.build_timeout
            # Straight into the file, fsync'ed before the rename (a takeover reuses it); a
            # failure leaves no jobs file, and the temporary file is removed.
            with fsutil.atomic_writer(path) as out:
                problems, why = self._build_py(argv, out, timeout)
                if why:
                    raise JobListError(f"build.py failed: {why}"
                                       + (f": {problems}" if problems else ""))
            if problems:
                log.warning("build.py: %s", problems)
            if every_node is not None:
                with open(path, encoding="utf-8") as made, fsutil.atomic_writer(path) as out:
                    out.writelines(placement.expand_every_node(made, every_node))
            elif sweep_file is None:
                joborder.order_run_jobs(path, self.home.tables)  # slowest first
        try:
            jobs = JobFile(path)
        except ValueError as exc:
            raise JobListError(str(exc)) from None
        for problem in jobs.problems:
            log.warning("%s", problem)
        if jobs.skipped > len(jobs.problems):
            log.warning("%s: %d more bad job lines skipped", path,
                        jobs.skipped - len(jobs.problems))
        return jobs

    def _build_py(self, args: list[str], out: TextIO, timeout: float) -> tuple[str, str]:
        """build.py with ``args``, its stdout into ``out``: in a fork when the caller gave
        its main (:mod:`cluster.runtime.forkrun`), else as a program of its own.  Returns
        (its stderr, stripped; why it failed, '' when it did not)."""
        if self.job_list_main is not None:
            made = forkrun.run(self.job_list_main, args, out, timeout)
            problems, ok, timed_out = made.stderr, made.ok, made.timed_out
            why = made.describe(timeout)
        else:
            done = proc.run([sys.executable, str(BUILD_SCRIPT), *args], timeout=timeout,
                            stdout=out)
            problems, ok, timed_out = done.text("stderr"), done.ok, done.timed_out
            why = done.describe(timeout)
        if ok:
            return problems.strip(), ""
        if timed_out:
            why += " (config build_timeout); it was killed"
        return problems.strip(), why

    def _serve(self, server: NodeServer, state: RunState, jrnl: journal.Journal,
               pid: PidFile, progress: RunProgress, audit: AuditLog, live: LiveStatus,
               spec: RunSpec, confirming: confirm.ConfirmPhase | None = None
               ) -> tuple[Outcome, str] | None:
        """Serve nodes until the run ends; return how and why (None: another master
        replaced this one, and the run goes on under it; or a stop was asked, and the run
        goes on under the next).

        Besides every job having a result, a run ends when its user aborts it, an admin
        stops it (``runs/<id>/stop``), a node's build fails, it has run its ``job_timeout``
        (across masters), or it lost its nodes: none alive for ``no_node_timeout`` after
        it had some, or more than its ``max_failed_nodes`` lost.  Every progress tick the
        status line and ``live[.p].json`` are rewritten; every ``pid_check_interval`` the
        disabled nodes (``nodes/*.down``) are read again, and the runs waiting behind
        ``spec`` whose ``queue_timeout`` passed leave the queue.  ``confirming``: once
        every job has a result, the changed tests are run again (its state and journal are
        served from then on, :mod:`cluster.master.serve.confirm`).
        """
        cfg = self.cfg
        next_tick = next_live = next_pid = 0.0
        last_live = self.clock.monotonic()  # a successor's clock starts at the takeover
        while True:
            server.serve_once(LIVENESS_INTERVAL)
            audit.flush()  # one append per iteration, whatever the number of connections
            if self.stop.is_set():
                return None  # the caller says so; the journal is synced as it closes
            now = self.clock.monotonic()
            if confirming is not None:
                state, jrnl = confirming.serving(state, jrnl, now)
            if now >= next_live:
                # Often, so a dead node is dropped within heartbeat_timeout plus one poll;
                # a pass over 1,000 nodes costs a fraction of a millisecond.
                for note in state.tick(now):
                    log.warning("%s", note)
                jrnl.write(state.take_made_results())  # a no_reschedule run's lost jobs
                if state.live_nodes():
                    last_live = now
                    progress.had_nodes = True
                next_live = now + LIVENESS_INTERVAL
            if now >= next_tick:
                jrnl.sync_if_due(now)
                write_status(self.home.status(self.priority),
                             f"run {state.run_id} - {state.status_line()}")
                progress.save(state.lost, bool(state.live_nodes()))
                live.update(state, progress.lost + state.lost)
                next_tick = now + PROGRESS_INTERVAL
            if now >= next_pid:
                next_pid = now + cfg.pid_check_interval
                state.set_disabled(nodefiles.disabled_nodes(self.home))
                self._placement_tick(state, live, now)
                self._expire_waiting(spec)
                if self.priority == USER_PRIORITY and not state.fatal and \
                        abort.requested(self.home, state.run_id):
                    # clusterpush abort: every node is told ABORT at its next call, and
                    # the run ends now with an "aborted" report.
                    state.fatal = USER_ABORT
                    log.warning("run %s: aborted by its user", state.run_id)
                    return Outcome.ABORTED, USER_ABORT
                stopped = None if state.fatal else abort.stop_reason(self.home, state.run_id)
                if stopped is not None:
                    # clusteradmin stop, at any priority: ended like a user's abort.
                    state.fatal = live.stopping = stopped
                    live.update(state, progress.lost + state.lost)
                    log.warning("run %s: %s", state.run_id, stopped)
                    return Outcome.ABORTED, stopped
                if not pid.refresh():
                    state.fatal = REPLACED
                    self._linger(server, state, limit=min(cfg.linger, 5.0), audit=audit)
                    return None
            if state.finished(now):
                if state.fatal:
                    return Outcome.FAILED, state.fatal
                return Outcome.DONE, ""
            stop = self._cut_short(state, progress, now - last_live)
            if stop is not None:
                state.fatal = f"run stopped: {stop[1]}"
                log.warning("run %s: %s", state.run_id, stop[1])
                return stop

    def _cut_short(self, state: RunState, progress: RunProgress,
                   no_node_for: float) -> tuple[Outcome, str] | None:
        """Whether the run must stop before it is complete, and why (None: it goes on)."""
        cfg = self.cfg
        limit = runlimits.limit_reached(state.options, progress.elapsed(),
                                        len(progress.lost) + len(state.lost))
        if limit is not None:
            return limit
        if progress.had_nodes and no_node_for > cfg.no_node_timeout:
            return Outcome.RETRY, (f"no node was alive for {no_node_for:.0f} s "
                                   f"(no_node_timeout {cfg.no_node_timeout:.0f} s)")
        return None

    def _started(self) -> RunSpec | None:
        """The queue line of the run job.start describes (started, and not yet ended), or
        None."""
        try:
            return RunSpec.parse(JobStart.parse(
                self.home.job_start(self.priority).read_text(encoding="utf-8")).queue)
        except (OSError, ValueError):
            return None

    def _expire_waiting(self, serving: RunSpec | None) -> None:
        """The waiting runs whose ``queue_timeout`` passed leave the queue, each with its
        short report (:func:`cluster.master.model.runlimits.drop_expired`); ``serving`` (the run
        being served or started) stays.  A failed end is logged and left to the next try."""
        try:
            runlimits.drop_expired(self.home, self.priority, self.queue, self.cfg,
                                   self.clock.time(), serving,
                                   lambda: new_run_id(self.priority, self.clock), self._end)
        except (OSError, ClusterError) as exc:
            log.error("priority %d: the runs past their queue_timeout could not be "
                      "dropped now: %s", self.priority, exc)

    def _linger(self, server: NodeServer, state: RunState, limit: float | None = None,
                audit: AuditLog | None = None) -> None:
        """Keep answering (ABORT) until every live node has been told, or ``linger`` passes."""
        deadline = self.clock.monotonic() + (self.cfg.linger if limit is None else limit)
        while not state.everyone_told() and self.clock.monotonic() < deadline \
                and not self.stop.is_set():
            server.serve_once(0.25)
            if audit is not None:
                audit.flush()

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
