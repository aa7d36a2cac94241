"""servedrun: the run a clustermaster serves, opened once and stepped turn by turn.

:meth:`ServedRun.open` creates, in one place, everything serving a run needs: its state
(the jobs, the results journaled by earlier masters, the leases they handed out), its
journal, a sweep run's intake, its progress across masters, the nodes' keys and the
replay guard (the nonces of earlier masters loaded), its audit trail, its live status, its
confirm phase; then binds the server's handler to them.  Its serving loop is then one call
of :meth:`ServedRun.tick` after another, each given the time of its turn: what is due at
that time is done, and the nodes' requests are served for a slice
(:meth:`cluster.master.run.clustermaster.ClusterMaster._serve` is that loop; tests call
``tick`` with times of their own).  ``tick`` says, once it is so, how the serving ended
(:class:`Ended`); :meth:`ServedRun.end` then records the run's end (or, when this master
leaves the run to another, only its progress), :meth:`ServedRun.close` closes the run's
files, and :meth:`ServedRun.hand_over` gives the run's state to the end steps.

Besides every job having a result, a run ends when its user aborts it, an admin stops it
(``runs/<id>/stop``), a node's build fails, it has run its ``job_timeout`` (across
masters), or it lost its nodes: none alive for ``no_node_timeout`` after it had some, or
more than its ``max_failed_nodes`` lost (:mod:`cluster.master.model.runlimits`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from cluster.config import Config
from cluster.defaults import USER_PRIORITY
from cluster.home import Home
from cluster.master.cache import reuse
from cluster.master.end.endrun import write_status
from cluster.master.files import abort, groups, journal, nodefiles, resources
from cluster.master.files.attempts import Attempts
from cluster.master.files.audit import AuditLog
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.files.keycache import run_keys
from cluster.master.files.progress import RunProgress
from cluster.master.model import placement, runlimits
from cluster.master.model.joblist import JobList
from cluster.master.model.leases import LEASES_FILE, LeaseLog, read_leases
from cluster.master.run.preemption import Preemption
from cluster.master.serve import confirm
from cluster.master.serve.handler import NonceLog, RequestHandler, RunSession
from cluster.master.serve.server import NodeServer
from cluster.master.serve.sweepintake import SweepIntake
from cluster.master.state.livestatus import LiveStatus
from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec
from cluster.runtime.clock import Clock
from cluster.runtime.service import StopPoint, signal_name
from cluster.sweep.spec import SweepSpec
from cluster.wire import caps, protocol, signing
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: How often the master looks for nodes whose lease lapsed [seconds]; also the slice for
#: which each turn serves the nodes' requests.
LIVENESS_INTERVAL = 0.25
#: How often the serving master saves the run's progress [seconds].
PROGRESS_INTERVAL = 1.0
#: RunState.fatal of a run its user stopped with clusterpush abort.
USER_ABORT = "aborted by its user (clusterpush abort)"
#: RunState.fatal of a run another master took over (the nodes rejoin that one).
REPLACED = protocol.REPLACED
#: The run's accepted nonces (handler.NonceLog), in runs/<id>/.
NONCES_FILE = "nonces"


@dataclasses.dataclass(frozen=True)
class Ended:
    """How the serving of a run ended: its ``outcome`` and why (``reason``), or ``outcome``
    None when this master left the run (another replaced it, or a stop was asked) and the
    run goes on under the next one."""

    outcome: Outcome | None
    reason: str = ""


#: The serving ended because this master leaves the run.
LEFT = Ended(None)


@dataclasses.dataclass(frozen=True)
class RunHost:
    """What a served run needs of the clustermaster serving it: its configuration, home,
    priority, lane (cluster.lanes) and clock; its stop request; ``still_ours`` (the PID
    file refreshed: False once another master took it); the tries of the run given up on so far; and
    ``expire_waiting`` (the runs waiting behind this one past their queue_timeout
    dropped)."""

    cfg: Config
    home: Home
    priority: int
    lane: int
    clock: Clock
    stop: StopPoint
    still_ours: Callable[[], bool]
    attempts: Attempts
    expire_waiting: Callable[[], None]


class ServedRun:
    """One run as its master serves it.  Callers use :meth:`open`, then :meth:`tick` until it
    returns an :class:`Ended`, then :meth:`end` and :meth:`close` (always), then
    :meth:`hand_over`.

    ``state`` and ``jrnl`` are the run's own; ``serving_state`` and ``serving_journal``
    those served now (the confirm phase's once it started, :mod:`cluster.master.serve.confirm`).
    """

    #: How long each turn serves the nodes' requests [seconds].
    serve_slice = LIVENESS_INTERVAL

    def __init__(self, host: RunHost, spec: RunSpec, start: JobStart, server: NodeServer,
                 handler: RequestHandler, state: RunState, jrnl: journal.Journal,
                 intake: SweepIntake | None, progress: RunProgress, session: RunSession,
                 lease_log: LeaseLog, live: LiveStatus,
                 confirming: confirm.ConfirmPhase) -> None:
        """Assemble a run's parts; :meth:`open` makes them."""
        self.host, self.spec, self.start = host, spec, start
        self.server, self.handler = server, handler
        self.state, self.jrnl, self.intake = state, jrnl, intake
        self.progress, self.session, self.lease_log = progress, session, lease_log
        self.live, self.confirming = live, confirming
        self.serving_state, self.serving_journal = state, jrnl
        self.next_tick = self.next_live = self.next_pid = 0.0
        #: Its nodes sent to more urgent runs (docs/protocol.md, "Preemption at job
        #: boundaries") and to the other lanes' runs of its priority short of their fair
        #: share (docs/runoptions.md, "Fair share"); the live file shows its moves.
        self.preemption = Preemption(host.cfg, host.home, host.priority, host.clock,
                                     lane=host.lane)
        live.moves = self.preemption.moves
        #: When a node of the run was last alive (a successor's clock starts at the takeover).
        self.last_live = host.clock.monotonic()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, host: RunHost, spec: RunSpec, start: JobStart, jobs: JobList,
             options: RunOptions, policy: placement.RunPolicy, sweep: SweepSpec | None,
             server: NodeServer, handler: RequestHandler) -> ServedRun:
        """Open run ``start`` (queue line ``spec``, its ``jobs``, its ``options`` and
        ``policy``, a sweep run's ``sweep``) for serving on ``server``, whose ``handler``
        serves it from now on; a takeover's journal, leases, nonces and progress are
        loaded.  The live status and the resource file say at once that it is served."""
        cfg, home, clock = host.cfg, host.home, host.clock
        run_id, run_dir = start.id, home.run_dir(start.id)
        jrnl = journal.Journal(home.results(host.lane), run_id, cfg.journal_sync_interval)
        if jrnl.loaded:
            log.info("run %s: taking over, %d results already journaled", run_id,
                     len(jrnl.loaded))
        state = _run_state(host, spec, start, jobs, options, policy, jrnl)
        intake = None
        if sweep is not None:
            # Before any request: the tries of earlier masters counted, their leftovers gone.
            intake = SweepIntake.open(run_dir, sweep, cfg.max_result_bytes, state,
                                      cfg.sweep_check_workers)
            jrnl.attach(intake)
        # The time of every master that served the run, and the gap while none did (at
        # most the PID file's staleness and wait, and a minute of starting).
        progress = RunProgress.load(run_dir, clock,
                                    max_gap=cfg.pid_stale + cfg.pid_wait + 60.0)
        if state.results.count or host.attempts.count(spec.line()):
            # A run with results had nodes, whoever served them; another attempt of a run
            # that lost its nodes waits no_node_timeout for one, then gives up.
            progress.had_nodes = True
        session, lease_log = _session(host, start, state, len(jobs))
        # Its start as the first master saw it: now less the elapsed time of them all.
        live = LiveStatus(home.live(host.lane), start, clock.time() - progress.elapsed(),
                          clock)
        state.set_disabled(nodefiles.disabled_nodes(home))
        handler.bind(state, jrnl, session, intake)
        if intake is not None and intake.pool is not None:
            # A check script's verdict is taken as soon as it is ready.
            server.watch_fd(intake.pool.wake_fd, handler.settle)
        log.info("run %s: %s, %d jobs (%d to do), port %d, %.0f s run so far", run_id,
                 spec.line(), len(jobs), state.remaining, cfg.port_for(host.lane),
                 progress.elapsed())
        # The run is served from now on: its counts in the live file, and the resource
        # file saying so at once (provisioners start nodes for it).
        live.update(state, progress.lost + state.lost)
        resources.refresh(cfg, clock)
        # Differences run again before the run ends (docs/results.md, "Differences
        # confirmed, indeterminate tests named"): a second phase, same run.
        confirming = confirm.ConfirmPhase(cfg, home, spec, state, handler, session)
        return cls(host, spec, start, server, handler, state, jrnl, intake, progress,
                   session, lease_log, live, confirming)

    # ------------------------------------------------------------------ serving
    def tick(self, now: float) -> Ended | None:
        """One turn of the serving loop at ``now`` (the clock's monotonic time): what is
        due at ``now`` is done, then the nodes' requests are served for
        :attr:`serve_slice`.  Returns how the serving ended, or None while it goes on.

        Due are: every :data:`LIVENESS_INTERVAL` the nodes whose lease lapsed (and
        preemption's steps into the audit trail); every
        :data:`~cluster.master.run.preemption.PREEMPT_INTERVAL` the more urgent runs
        (:mod:`cluster.master.run.preemption`); every
        :data:`PROGRESS_INTERVAL` the journal's sync, the status line, the progress and
        ``live[.p].json``; every ``pid_check_interval`` the disabled nodes
        (``nodes/*.down``), the placement, the waiting runs past their queue_timeout, a
        user's abort, an admin's stop and the PID file.  Then whether the run is over.
        """
        if self.host.stop.is_set():
            return LEFT  # the caller says so; the journal is synced as it closes
        self.serving_state, self.serving_journal = self.confirming.serving(
            self.serving_state, self.serving_journal, now)
        if now >= self.next_live:
            self._liveness(now)
        if now >= self.preemption.next_at:
            for note in self.preemption.tick(self.serving_state, now):
                log.info("%s", note)
        if now >= self.next_tick:
            self._progress(now)
        ended = self._pid_check(now) if now >= self.next_pid else None
        if ended is None:
            ended = self._over(now)
        if ended is None:
            self.server.serve_once(self.serve_slice)
            self.session.audit.flush()  # one append per turn, whatever the connections
        return ended

    def _liveness(self, now: float) -> None:
        # Often, so a dead node is dropped within heartbeat_timeout plus one poll; a pass
        # over 1,000 nodes costs a fraction of a millisecond.
        state = self.serving_state
        for note in state.tick(now):
            log.warning("%s", note)
        self.serving_journal.write(state.take_made_results())  # a no_reschedule run's lost
        for event in state.take_move_events():  # preemption's steps: the audit trail
            self.session.audit.move(event)
            self.preemption.note(event)
            log.info("run %s: %s", state.run_id, event)
        if state.live_nodes():
            self.last_live = now
            self.progress.had_nodes = True
        self.next_live = now + LIVENESS_INTERVAL

    def _progress(self, now: float) -> None:
        state, host = self.serving_state, self.host
        self.serving_journal.sync_if_due(now)
        write_status(host.home.status(host.lane),
                     f"run {state.run_id} - {state.status_line()}")
        self.progress.save(state.lost, bool(state.live_nodes()))
        self.live.update(state, self.progress.lost + state.lost)
        self.next_tick = now + PROGRESS_INTERVAL

    def _pid_check(self, now: float) -> Ended | None:
        """The checks of every ``pid_check_interval``; how the serving ended, if it did."""
        state, host = self.serving_state, self.host
        self.next_pid = now + host.cfg.pid_check_interval
        state.set_disabled(nodefiles.disabled_nodes(host.home))
        self._placement_tick(now)
        host.expire_waiting()
        if host.priority == USER_PRIORITY and not state.fatal and \
                abort.requested(host.home, state.run_id):
            # clusterpush abort: every node is told ABORT at its next call, and the run
            # ends now with an "aborted" report.
            state.fatal = USER_ABORT
            log.warning("run %s: aborted by its user", state.run_id)
            return Ended(Outcome.ABORTED, USER_ABORT)
        stopped = None if state.fatal else abort.stop_reason(host.home, state.run_id)
        if stopped is not None:
            # clusteradmin stop, at any priority: ended like a user's abort.
            state.fatal = self.live.stopping = stopped
            self.live.update(state, self.progress.lost + state.lost)
            log.warning("run %s: %s", state.run_id, stopped)
            return Ended(Outcome.ABORTED, stopped)
        if not host.still_ours():
            state.fatal = REPLACED
            self.linger(state, limit=min(host.cfg.linger, 5.0))
            return LEFT
        return None

    def _placement_tick(self, now: float) -> None:
        """The groups read again; while no node serves the run, why (``live.waiting``: "no
        node of group win64 is up"); an every_node run's jobs pinned to a node that is not
        in the run and not up (or that left it) settled as not run, so the run's end does
        not wait for it."""
        state, cfg, home = self.serving_state, self.host.cfg, self.host.home
        policy = state.policy
        if not (policy.placement.restricted or policy.every_node):
            return
        policy.set_groups(groups.all_groups(home))
        up = placement.nodes_up(home, cfg.heartbeat_timeout, self.host.clock.time(),
                                state.disabled)
        self.live.waiting = "" if state.live_nodes() else placement.waiting_reason(
            policy.placement, up, policy.groups)
        if not policy.every_node or now - state.started < cfg.heartbeat_timeout:
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

    def _over(self, now: float) -> Ended | None:
        """Whether the run is over at ``now``: complete, or cut short by its limits."""
        state, cfg, progress = self.serving_state, self.host.cfg, self.progress
        if state.finished(now):
            return Ended(Outcome.FAILED, state.fatal) if state.fatal else Ended(Outcome.DONE)
        stop = runlimits.limit_reached(state.options, progress.elapsed(),
                                       len(progress.lost) + len(state.lost))
        no_node_for = now - self.last_live
        if stop is None and progress.had_nodes and no_node_for > cfg.no_node_timeout:
            stop = Outcome.RETRY, (f"no node was alive for {no_node_for:.0f} s "
                                   f"(no_node_timeout {cfg.no_node_timeout:.0f} s)")
        if stop is None:
            return None
        state.fatal = f"run stopped: {stop[1]}"
        log.warning("run %s: %s", state.run_id, stop[1])
        return Ended(*stop)

    def linger(self, state: RunState, limit: float | None = None) -> None:
        """Keep answering (ABORT) until every live node of ``state`` has been told, or
        ``limit`` (default ``linger``) passes, or a stop is asked."""
        clock, stop = self.host.clock, self.host.stop
        deadline = clock.monotonic() + (self.host.cfg.linger if limit is None else limit)
        while not state.everyone_told() and clock.monotonic() < deadline \
                and not stop.is_set():
            self.server.serve_once(0.25)
            self.session.audit.flush()

    # ------------------------------------------------------------------ the end
    def end(self, ended: Ended) -> EndRecord | None:
        """After the last turn: a run this master leaves keeps its progress (None);
        another has every result on disk, then its end record (a run that lost its nodes
        ``max_tries`` times gave up), the live status and job.start removed (nodes that
        call now learn the run is over), the resource file refreshed, and the nodes told
        while they call within ``linger``.  Returns the end record."""
        host, state, cfg = self.host, self.state, self.host.cfg
        run_id = state.run_id
        if ended.outcome is None:
            if host.stop.is_set():
                log.warning("run %s: stop requested (%s); its journal is synced and the "
                            "next clustermaster takes it over", run_id,
                            signal_name(host.stop.flag.signum))
            else:
                log.warning("run %s: the PID file is no longer ours; aborting nodes, "
                            "exiting", run_id)
            self.progress.save(state.lost, bool(state.machines))
            return None
        outcome, reason = ended.outcome, ended.reason
        if outcome is Outcome.RETRY and \
                host.attempts.count(self.spec.line()) + 1 >= cfg.max_tries:
            outcome = Outcome.GAVE_UP
            reason += f" (attempt {cfg.max_tries} of {cfg.max_tries})"
        if self.intake is not None:
            # Tries still held for their check script are the tasks' last (their files
            # kept): the run's end does not wait for them.
            self._unwatch_checks()
            self.intake.abandon(state, self.jrnl.write, host.clock.monotonic(),
                                reason or outcome.value)
        self.jrnl.sync()  # every result is on disk before the run counts as ended
        self.confirming.sync()  # and every confirm result
        record = EndRecord.create(host.home.run_dir(run_id), self.start, outcome, reason,
                                  elapsed=self.progress.elapsed(),
                                  lost=tuple(self.progress.lost + state.lost))
        self.live.remove()
        # The run is over: nodes that call in now learn it and leave.
        host.home.job_start(host.lane).unlink(missing_ok=True)
        resources.refresh(cfg, host.clock)  # finished: no more nodes wanted
        self.linger(self.confirming.state or state)
        return record

    def close(self) -> None:
        """Close the run's files: the journals (synced), the sweep intake, the refusal
        counts and the audit trail flushed (complete before the end steps archive it), the
        nonce and lease logs."""
        self.confirming.close()
        if self.intake is not None:
            self._unwatch_checks()
            self.intake.close()
        self.jrnl.close()
        self.server.refusals.flush()  # the bursts' counts, into the log and the audit trail
        self.session.audit.flush(force=True)
        if self.session.nonces is not None:
            self.session.nonces.close()
        self.lease_log.close()

    def _unwatch_checks(self) -> None:
        """The server no longer watches the check pool (before the pool closes)."""
        if self.intake is not None and self.intake.pool is not None:
            self.server.unwatch_fd(self.intake.pool.wake_fd)

    def hand_over(self) -> list[RunState]:
        """For the end steps, once the serving is over: the handler unbound (the server is
        not served any more, so it needs no state), and the run's state in a list the end
        steps empty once the report is made.  The caller then drops this object, so the
        list holds the only reference left."""
        self.handler.unbind()
        return [self.state]


def _run_state(host: RunHost, spec: RunSpec, start: JobStart, jobs: JobList,
               options: RunOptions, policy: placement.RunPolicy,
               jrnl: journal.Journal) -> RunState:
    """The run's state: its jobs, the results ``jrnl`` loaded (taken from it), its options
    and its result cache."""
    cfg = host.cfg
    needs = cfg.required_tools

    def suitable(caps_text: str) -> tuple[bool, str]:
        return caps.suitable(caps_text, needs, cfg.min_ram_mb)

    state = RunState(start.id, jobs, host.clock.monotonic(), Settings.from_config(cfg),
                     suitable, done=jrnl.lines, policy=policy)
    state.options = options  # the run's own, once
    state.reuse = reuse.for_run(cfg, host.home, spec, start, options, jobs)
    jrnl.lines = []  # the state has them now
    return state


def _session(host: RunHost, start: JobStart, state: RunState,
             job_count: int) -> tuple[RunSession, LeaseLog]:
    """The run's session (its nodes' keys, the replay guard, the audit trail, the nonce
    log) and its lease log; the nonces and leases of earlier masters loaded."""
    run_id, run_dir, clock = start.id, host.home.run_dir(start.id), host.clock
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
    leased = state.leases.load(read_leases(lease_path, job_count))
    if leased:
        log.info("run %s: %d leases of earlier masters loaded", run_id, leased)
    lease_log = LeaseLog(lease_path)
    state.leases.log = lease_log.append
    session = RunSession(run_keys(host.home.root, run_id, clock.monotonic), guard,
                         AuditLog(host.home.audit_log(run_id), clock), NonceLog(nonce_path))
    return session, lease_log
