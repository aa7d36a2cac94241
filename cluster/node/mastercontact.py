"""A node's conversation with its run's master: one TCP call to ``base_port + priority`` at a
time, each carrying the node's state and results and bringing back what to do (BUILD, JOBS,
UPLOAD, CONTINUE, ABORT: :mod:`cluster.wire.protocol`).

When a call is due (:meth:`MasterContact.due`): as soon as results wait longer than
``report_interval``, or at once when no job runs any more (nothing else could join them:
the last results of a run go without delay), when the local queue falls below one job per
slot (so the node never idles between batches), when a BUILD or UPLOAD ended or the node
failed, and at least every ``poll_interval`` seconds (the node's heartbeat).  A node with
free slots told CONTINUE (nothing for it now: the tail of a run, or the master deciding on
a confirm phase) asks again after :data:`CONTINUE_FIRST_WAIT`, doubling at each further
CONTINUE up to ``min(poll_interval, 0.5 s)``, and from the first wait again after a call
that got jobs or carried the node's last results (no job of its running): a short wait
(another node's last job) ends within a fraction of itself, a long one costs the master
two calls a second per node.

Every call is signed with this node's run key (:class:`cluster.node.runcontext.RunContext`
``key``: derived from the node's own key, ``node-keys/<name>.key`` in the master home, and
the run id, so no other node can sign for this name; see :mod:`cluster.nodekeys`), and the
master's reply is believed only once its signature, bound to the call's nonce, verifies
(:mod:`cluster.wire.signing`).  A reply that does not verify is not acted upon in any way --
no job line of it runs -- and counts as a failed call: retried after
``connect_retry_delay``, and after ``connect_retries`` the node exits 3 as for an
unreachable master (never failure -1, which would end everyone's run).  Except when the run
is over: a node cut off while its run ended finds on the port either another run's master,
which refuses this run's id unsigned, or no master at all (the connection is refused).
After such a reply or refusal the node reads job.start through its transport, and when
job.start is gone or names another run it leaves at once (exit 0: the run is over for it)
instead of retrying.  The reply itself decides nothing.

Results are dropped from the node's memory only after the master's reply has been read, so
a failed call sends them again (the master records the first copy and counts the rest).

Every call says ``features withdraw`` (:data:`FEATURES`): a reply of any verb but ABORT may
then end with ``withdraw <test>...`` lines, the jobs whose result came first from another
node's copy, which the node stops at once and sends no result for
(:meth:`cluster.node.nodejobs.NodeJobs.withdraw`; docs/results.md, "Withdrawn copies").
Since the node calls at least every ``poll_interval`` (its heartbeat to its master), a
withdrawn copy stops within one heartbeat of the other's result.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Callable

from cluster.defaults import (
    FAILURE_NETWORK,
    NODE_EXIT_ABORTED,
    NODE_EXIT_DONE,
    NODE_EXIT_FAILED,
    NODE_EXIT_MOVED,
    NODE_EXIT_UNREACHABLE,
)
from cluster.errors import ClusterError, ProtocolError, TransportError
from cluster.home import suffixed
from cluster.node import moves, sweepresults
from cluster.node.background import BackgroundWork
from cluster.node.nodebuild import BuildStopped, NodeBuild, build_failure
from cluster.node.nodejobs import NodeJobs
from cluster.node.nodeupload import NodeUpload
from cluster.node.runcontext import RunContext
from cluster.records import ERROR_INTERNAL, Job, JobResult
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.node")

#: ABORT reasons (prefixes) after which this node must not join the same run again.
FINAL_ABORTS = protocol.FINAL_ABORTS
#: ABORT reasons, matched whole, that are *not* final although they start with one of
#: FINAL_ABORTS: the run goes on elsewhere and this node should come back to it.  The master
#: answers ``run aborted: <RunState.fatal>``, and a master that finds the PID file no longer
#: its own sets fatal to protocol.REPLACED ("clustermaster replaced"): its
#: successor resumes the same run under the same id (seed 001: a node may start again from
#: scratch and rejoin), so the node exits NODE_EXIT_ABORTED and clusterpull rejoins it after
#: its rejoin_delay.  A user's abort ("run aborted: aborted by its user ..."), a failed or
#: stopped run and a finished one stay final.
REJOIN_ABORTS = protocol.REJOIN_ABORTS
#: After a CONTINUE, a node with free slots asks again this soon [seconds]; the wait doubles
#: at each further CONTINUE, up to :data:`CONTINUE_LONGEST_WAIT` (or ``poll_interval``).
CONTINUE_FIRST_WAIT = 0.05
CONTINUE_LONGEST_WAIT = 0.5
#: The optional reply lines this node understands (``features``): ``withdraw``.
FEATURES = (protocol.FEATURE_WITHDRAW,)


def is_final_abort(reason: str) -> bool:
    """Whether an ABORT with ``reason`` ends this run for the node for good (clusterpull never
    rejoins it) rather than for now (see :data:`FINAL_ABORTS` and :data:`REJOIN_ABORTS`)."""
    reason = reason.strip()
    if reason in REJOIN_ABORTS:
        return False
    return reason.startswith(FINAL_ABORTS)


class MasterContact:
    """The node's calls to its master, and what it does with the replies: the jobs go to
    ``jobs``, a BUILD and an UPLOAD run in ``background`` (``build``'s and ``upload``'s)."""

    def __init__(self, ctx: RunContext, caps: str, jobs: NodeJobs, build: NodeBuild,
                 upload: NodeUpload, background: BackgroundWork) -> None:
        self.ctx = ctx
        self.caps = caps
        self.jobs = jobs
        self.build = build
        self.upload = upload
        self.background = background
        self.nonces = signing.NonceSource()
        self.consecutive_failures = 0
        self.hungry_after = 0.0  # do not ask for work before this (after an empty answer)
        self.continue_wait = CONTINUE_FIRST_WAIT  # after the next CONTINUE (doubling)
        self.low_water = ctx.slots  # ask for more when fewer jobs than this wait
        #: Told to leave for a more urgent run (ABORT ``preempted: ...``): the reason; ""
        #: while it stays.  It then starts no job and leaves once its jobs ended
        #: (:meth:`leave_if_done`).
        self.leaving_for = ""

    # ------------------------------------------------------------------ when to call
    def due(self, now: float) -> bool:
        """Whether a call is due at ``now`` (see the module docstring)."""
        status, jobs = self.ctx.status, self.jobs
        if now >= status.next_contact:
            return True
        if self.consecutive_failures:
            return False  # retrying on the fixed schedule of run.pl (connect_retry_delay)
        if status.failure:
            return True
        if jobs.unsent and (now - jobs.first_unsent >= self.ctx.cfg.report_interval
                            or not jobs.pool.running()):
            return True
        if self.leaving_for:
            return False  # no more work wanted: it leaves once its jobs ended
        if self.background.current is not None:
            return self.background.current.done
        hungry = len(jobs.queue) < self.low_water and now >= self.hungry_after
        return hungry and self.build.built

    def next_wakeup(self, now: float) -> float:
        """When the loop looks again, at the latest: the next call, result or job
        deadline."""
        jobs = self.jobs
        wake = self.ctx.status.next_contact
        if jobs.unsent:
            wake = min(wake, jobs.first_unsent + self.ctx.cfg.report_interval)
        if len(jobs.queue) < self.low_water and self.build.built and not self.leaving_for:
            wake = min(wake, self.hungry_after)
        deadline = jobs.pool.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        if self.background.current is not None:
            wake = min(wake, now + 0.05)
        return max(wake, now)

    # ------------------------------------------------------------------ one call
    def request(self, leaving: bool) -> protocol.Request:
        """The call the node makes now (``leaving``: its last, the jobs it held go back)."""
        ctx, jobs, build = self.ctx, self.jobs, self.build
        busy = self.background.busy()
        running = jobs.pool.running()
        status = (f"{busy}ing" if busy else
                  f"{jobs.counters.finished} tests completed, {running} running")
        return protocol.Request(
            node=ctx.name, job_id=ctx.start.id, caps=self.caps, pending=len(jobs.queue),
            running=running, slots=ctx.slots, busy=busy,
            built=ctx.start.id if build.built else "",
            unbuilt=build.unbuilt if build.built else (),
            digests=build.digests if build.built else (),
            keychanges=build.keychanges if build.built else (), instance=ctx.instance,
            failure=ctx.status.failure, failure_reason=ctx.status.failure_reason,
            status=status, timeouts=jobs.counters.timeouts,
            max_timeouts=jobs.timeout_limit(), features=FEATURES,
            results=tuple(jobs.unsent[:self.upload.batch(jobs.unsent)]), leaving=leaving,
            moving=self.leaving_for)

    def call(self, now: float, leaving: bool = False) -> int | None:
        """One call to the master; returns an exit code when the node must stop."""
        self._settle_background()
        req = self.request(leaving)
        bundle = None
        if self.ctx.outbox is not None and req.results:
            try:
                bundle = self.upload.upload_bundle(req.results)
            except (ClusterError, OSError) as exc:
                log.error("node %s: could not upload the results of %d task(s): %s",
                          self.ctx.name, len(req.results), exc)
                return self._failed_call(now, leaving, exc)
            req = dataclasses.replace(req, bundle=bundle.name)
        try:
            reply = self._exchange(protocol.format_request(req))
        except signing.SignatureError as exc:
            # Not from a master holding this run's secret (or altered on the way): nothing
            # of it is acted upon, and it counts as a failed call (retried; in the end the
            # node gives up as for an unreachable master, never with failure -1).
            log.error("node %s: reply from %s:%d refused, nothing of it run: %s",
                      self.ctx.name, self.ctx.cfg.master_host,
                      self.ctx.cfg.port_for(self.ctx.lane), exc)
            self.upload.bundle_unsent(bundle)
            return self._failed_call(now, leaving, exc)
        except (OSError, ProtocolError) as exc:
            self.upload.bundle_unsent(bundle)
            return self._failed_call(now, leaving, exc)
        self._delivered(len(req.results), bundle)
        return self._obey(reply)

    def _delivered(self, sent: int, bundle: sweepresults.Bundle | None) -> None:
        """The master answered a call carrying the first ``sent`` results (and
        ``bundle``): they are dropped, and the next heartbeat is due a poll from now."""
        self.consecutive_failures = 0
        jobs = self.jobs
        if sent:
            del jobs.unsent[:sent]  # the master has them now
            jobs.first_unsent = self.ctx.clock.monotonic()
            if not jobs.pool.running():
                # Its last results: a CONTINUE now is the start of a new wait (for another
                # node's last job, which may end any moment), not one more of the waits
                # that grew while its own jobs ran.  (A node with jobs running calls again
                # when one ends anyway.)
                self.continue_wait = CONTINUE_FIRST_WAIT
        if bundle is not None and self.ctx.outbox is not None:
            self.upload.bundle_sent(bundle)  # and their files
        self.ctx.status.next_contact = self.ctx.clock.monotonic() + self.ctx.cfg.poll_interval

    def _exchange(self, data: bytes) -> protocol.Reply:
        """Sign ``data``, send it, and return the reply once its signature verified
        (SignatureError otherwise: no line of it is parsed before)."""
        cfg = self.ctx.cfg
        nonce = self.nonces.next()
        data = signing.sign_request(data, self.ctx.key, nonce)
        with socket.create_connection((cfg.master_host, cfg.port_for(self.ctx.lane)),
                                      timeout=cfg.io_timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(data)
            chunks = []
            while True:
                chunk = sock.recv(262144)
                if not chunk:
                    break
                chunks.append(chunk)
        return protocol.parse_reply(signing.verify_reply(b"".join(chunks), self.ctx.key,
                                                         nonce))

    # ------------------------------------------------------------------ failed calls
    def _failed_call(self, now: float, leaving: bool, exc: Exception) -> int | None:
        """Count a failed call: retry after ``connect_retry_delay``, or give up (exit 3)
        after ``connect_retries`` in a row (at once when leaving).

        Unless the run is over (:meth:`_run_ended`): then leave it at once (exit 0).  That
        is looked at only when the master's machine answered, but not as this run's master
        (a reply that does not verify, or a refused connection): the usual cause is that
        the run ended while this node was cut off, and the port now has another run's
        master (which refuses this run's id unsigned) or none.  Then job.start is cheap to
        read; after a timeout the transport would only wait out its own retries.
        """
        ctx = self.ctx
        if isinstance(exc, (signing.SignatureError, ConnectionRefusedError)):
            ended = self._run_ended()
            if ended is not None:
                log.info("node %s: leaving run %s: %s (%d results not sent)", ctx.name,
                         ctx.start.id, ended, len(self.jobs.unsent))
                self.jobs.kill_all()
                return NODE_EXIT_DONE
        self.consecutive_failures += 1
        if leaving or self.consecutive_failures >= ctx.cfg.connect_retries:
            log.error("node %s: master unreachable after %d tries: %s", ctx.name,
                      self.consecutive_failures, exc)
            return NODE_EXIT_UNREACHABLE
        log.warning("node %s: call to master failed (%s); retrying in %g s", ctx.name,
                    exc, ctx.cfg.connect_retry_delay)
        ctx.status.next_contact = now + ctx.cfg.connect_retry_delay
        return None

    def _run_ended(self) -> str | None:
        """Why this node's run is over, or None when job.start still names it (or cannot be
        read now).

        Read from the master's job.start through the transport (the master removes it when
        the run ends; the next run writes its own), never from a reply: an unverified reply
        may be anyone's, and must not be able to send nodes away from a run.
        """
        name = suffixed("job.start", self.ctx.lane)
        try:
            text = self.ctx.transport.read_text(name)
        except TransportError as exc:
            log.warning("node %s: cannot read %s to see whether its run goes on: %s",
                        self.ctx.name, name, exc)
            return None
        if text is None:
            return f"{name} is gone from the master (the run has ended)"
        try:
            current = JobStart.parse(text).id
        except ValueError:
            return None  # being rewritten, or damaged: the next failed call looks again
        if current != self.ctx.start.id:
            return f"{name} now describes run {current}"
        return None

    # ------------------------------------------------------------------ the replies
    def _obey(self, reply: protocol.Reply) -> int | None:
        """Do what ``reply`` says; an exit code when the node must stop (ABORT)."""
        verb = reply.verb
        if verb == protocol.ABORT:
            return self._aborted(reply.reason)
        if reply.withdraw:
            # Another node's copy of these jobs gave their results first: stop ours.
            self.jobs.withdraw(reply.withdraw)
        if verb == protocol.BUILD:
            if self.build.built:
                self.ctx.status.next_contact = 0.0  # already built (master took over)
            elif self.background.current is None:
                self._start_background("build", self.build.run)
        elif verb == protocol.UPLOAD:
            if self.background.current is None:
                self._start_background("upload", self.upload.run)
        elif verb == protocol.JOBS:
            self._take_jobs(reply.jobs)
        else:  # CONTINUE: nothing new; ask again soon, then less and less often
            self.hungry_after = self.ctx.clock.monotonic() + self.continue_wait
            self.continue_wait = min(self.continue_wait * 2, CONTINUE_LONGEST_WAIT,
                                     self.ctx.cfg.poll_interval)
        return None

    def _aborted(self, reason: str) -> int | None:
        """Told ABORT for ``reason``: everything running is killed and the node leaves;
        except when preempted (:meth:`_preempted`)."""
        if (reason.strip().startswith(protocol.ABORT_PREEMPTED)
                and not self.ctx.status.failure):
            self._preempted(reason.strip())
            return None
        self.jobs.kill_all()
        failure = self.ctx.status.failure
        final = is_final_abort(reason) or failure != 0
        log.info("node %s: told ABORT (%s)", self.ctx.name, reason or "no reason")
        if failure:
            return NODE_EXIT_FAILED
        return NODE_EXIT_DONE if final else NODE_EXIT_ABORTED

    def _preempted(self, reason: str) -> None:
        """Told to leave for a more urgent run: the jobs not started are dropped (the master
        put them back when it said so), those running finish and their results go as
        usual, then the node leaves (:meth:`leave_if_done`)."""
        if not self.leaving_for:
            # The job waiting in each slot's shell is not run either: killed as it starts,
            # it sends no result, and the master hands it out again when the node leaves.
            waiting = self.jobs.give_back_waiting()
            log.info("node %s: %s; %d jobs not started given back, leaving once the %d "
                     "running end", self.ctx.name, reason,
                     len(self.jobs.queue) + len(waiting),
                     self.jobs.pool.running() - len(waiting))
        self.leaving_for = reason
        self.jobs.queue.clear()

    def leave_if_done(self, now: float) -> int | None:
        """Preempted and no job running any more: the logs uploaded as at a run's end, the
        last results sent in the leaving call; returns the exit code
        (:data:`~cluster.defaults.NODE_EXIT_MOVED`: clusterpull then starts the most urgent
        run), or None while jobs run or results wait beyond one call."""
        jobs = self.jobs
        if not self.leaving_for or jobs.pool.running() or self.background.current is not None:
            return None
        if jobs.unsent and self.upload.batch(jobs.unsent) < len(jobs.unsent):
            return None  # more results than one call carries: the usual calls go first
        try:
            self.upload.run()  # the node's log, build log and bmpcmp sets, as at the end
        except (ClusterError, OSError) as exc:
            log.error("node %s: uploading its logs before leaving failed: %s", self.ctx.name,
                      exc)
        code = self.call(now, leaving=True)
        if code not in (None, NODE_EXIT_ABORTED):
            return code
        log.info("node %s: left run %s (%s)", self.ctx.name, self.ctx.start.id,
                 self.leaving_for)
        target = protocol.preempted_for(self.leaving_for)
        if target is not None:
            # clusterpull joins that run next, not the first of its priority it is told
            # of: a fair-share move would otherwise be undone at once.
            moves.note(self.ctx.cfg.work_dir, target)
        return NODE_EXIT_MOVED

    def _take_jobs(self, lines: tuple[str, ...]) -> None:
        """A JOBS reply's ``lines`` into the queue; a line that does not parse is answered
        with an internal error, so the run can still complete."""
        # Ask again when half of this batch is used up (at least one job per slot).
        self.low_water = max(self.ctx.slots, len(lines) // 2)
        for line in lines:
            try:
                self.jobs.queue.append(Job.parse(line))
            except ValueError as exc:
                name = line.split(" ", 1)[0]
                log.error("node %s: bad job line from master (%s): %r", self.ctx.name, exc,
                          line[:120])
                if protocol.TEST_ID.fullmatch(name):
                    self.jobs.add_result(JobResult(name, ERROR_INTERNAL, 0, 0, 0, "0",
                                                   "unknown", self.ctx.name))
        if not lines:
            self.hungry_after = (self.ctx.clock.monotonic()
                                 + min(self.ctx.cfg.poll_interval, 1.0))
        else:
            self.continue_wait = CONTINUE_FIRST_WAIT

    # ------------------------------------------------------------------ BUILD and UPLOAD
    def _start_background(self, what: str, target: Callable[[], None]) -> None:
        self.background.start(what, target)
        self.ctx.status.next_contact = 0.0  # report busy at once

    def _settle_background(self) -> None:
        """A BUILD or UPLOAD that ended: its outcome taken (the failure to report, or the
        build's binaries and programs)."""
        bg = self.background.take_finished()
        if bg is None:
            return
        status = self.ctx.status
        if bg.what == "build":
            if isinstance(bg.exception, BuildStopped):
                log.info("node %s: build stopped; leaving the run", self.ctx.name)
            elif bg.exception is not None:
                status.failure, status.failure_reason = build_failure(bg.exception)
                self.upload.upload_logs()  # seed 001: the failure logs are uploaded first
            else:
                self.build.succeeded()
        elif bg.what == "upload":
            if bg.error:
                status.failure = FAILURE_NETWORK
                status.failure_reason = f"upload failed: {bg.error}"
            else:
                status.failure = 0
