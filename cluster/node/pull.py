"""clusterpull: the node's resident loop (port of clusterpull.sh).

It sends heartbeats to the master's monitor, which answers with the runs waiting (one
job.start per lane: cluster.lanes).  When no run.py is running it starts one for the most
urgent run (lowest priority number) this node has not finished; among the runs of one
priority (priority 0 may have several, of different users), the first the monitor lists:
it lists them in the order new nodes should join them (docs/runoptions.md, "Fair share").

The heartbeats, at most one per ``heartbeat_interval`` when nothing happens:

* idle (no run.py): a long-poll -- the heartbeat asks the monitor to hold its answer up to
  ``heartbeat_interval`` (``wait``), naming the waiting runs it will not join (``skip``:
  finished, or in their rejoin backoff), so it learns of a new run within a fraction of a
  second instead of at its next heartbeat (that wait was most of a local run's
  start-up).  A monitor that predates the long-poll answers at once; then the node simply
  asks again after the interval, as before;
* running: a plain heartbeat every ``heartbeat_interval`` with its status, and run.py is
  reaped every :data:`REAP_POLL` seconds; when it exits the node heartbeats at once.
* failed (the monitor not listening yet, or down): tried again after :data:`FIRST_RETRY`
  seconds, doubling up to ``heartbeat_interval`` (an ephemeral node: ``connect_retry_delay``
  apart), so a node started a moment before its monitor does not miss a run by a whole
  interval.

A stop request ends a held heartbeat within :data:`cluster.node.heartbeat.STOP_POLL`.

A run is *finished* for this node when run.py exits 0 (the master said the run is over, or
that this node is unsuitable) or 1 (the node failed); it then never joins that run again.
Exit 3 (master unreachable) or 4 (aborted for a reason that may pass, e.g. the master was
replaced) lets it join again after ``rejoin_delay``.

Before each run.py starts, :meth:`ClusterPull.node_code` picks the copy of the node code it
runs from (:mod:`cluster.node.selfupdate`): with ``self_update`` (the default) the version
the master publishes in ``node-code/``, fetched into ``work_dir/code/<md5>/`` when its
manifest changed and checked file by file; else, or when nothing is published, the
installed copy.  A run.py already running keeps its copy.  clusterpull itself is never
replaced (its owner installs it; seed 000's clusterpull.sh re-pulled itself too).

A node runs one run at a time and picks the most urgent when it is free.  A more urgent
run does not wait for it to be free: the master of the node's run tells it to leave at its
next job boundary (docs/protocol.md, "Preemption at job boundaries"); run.py then exits 5
(moved), and the node starts the most urgent waiting run at once, with no backoff from the
run it left, to which it comes back as any new node when the urgent run lets it go.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster import lanes
from cluster.config import DEFAULTS, Config
from cluster.defaults import (
    EXIT_OK,
    NODE_EXIT_DONE,
    NODE_EXIT_FAILED,
    NODE_EXIT_MOVED,
    REPO_ROOT,
)
from cluster.node import heartbeat, moves
from cluster.node.liveness import Liveness
from cluster.node.selfupdate import CodeChoice, SelfUpdate
from cluster.node.transports import make_transport
from cluster.runtime import proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopFlag

log = logging.getLogger("cluster.pull")

RUN_SCRIPT = REPO_ROOT / "run.py"
#: run.py's exit codes after which this node never joins that run again.
FINISHED_CODES = (NODE_EXIT_DONE, NODE_EXIT_FAILED)
#: How long run.py has to leave its run after TERM before it is killed [seconds].
CHILD_STOP_WAIT = 30.0
#: Longest sleep between looks at run.py and the stop flag [seconds]: a stop (SIGTERM) and
#: the heartbeat after run.py's exit each wait up to this.  A look is a waitpid and a clock
#: read: 20 a second cost nothing.
REAP_POLL = 0.05
#: The first pause after a failed heartbeat of a resident node [seconds]; it doubles with
#: each failure in a row, up to heartbeat_interval (ClusterPull.heartbeat_retry).  Short:
#: a local cluster starts its nodes and its monitor at once, and a node whose first call
#: came a moment before the monitor listened joined the first run a quarter of a second
#: after the other (0.25 s before); a monitor that stays down costs a node nine calls in
#: its first 13 s, then one an interval.
FIRST_RETRY = 0.05
#: How long an exiting ephemeral node's goodbye may take [seconds].
GOODBYE_TIMEOUT = 5.0


@dataclass
class Child:
    lane: int
    run_id: str
    proc: subprocess.Popen[bytes]

    @property
    def priority(self) -> int:
        return lanes.priority_of(self.lane)


@dataclass
class ClusterPull:
    """The resident node loop.  Callers use tick(now) (tests) or run() (the daemon), and
    stop the daemon through :attr:`stop_flag` (``install_signal_handlers``).  ``clock``
    paces the loop."""

    cfg: Config
    caps: str
    config_args: list[str] = field(default_factory=list)
    rejoin_delay: float = DEFAULTS.rejoin_delay
    child: Child | None = None
    finished: set[str] = field(default_factory=set)
    retry_after: dict[str, float] = field(default_factory=dict)
    stop_flag: StopFlag = field(default_factory=StopFlag)
    clock: Clock = field(default_factory=SystemClock)

    #: The runs the monitor said were waiting, at the last heartbeat answered: (lane, id).
    waiting: list[tuple[int, str]] = field(default_factory=list)
    #: Heartbeats answered so far (the traffic the long-poll must not increase).
    heartbeats: int = 0
    #: Chooses the copy of the node code each run.py starts from (self_update; made on
    #: first use).
    updater: SelfUpdate | None = None
    #: Heartbeats failed in a row since the last one answered (the monitor unreachable, or
    #: this node's key unreadable): what an ephemeral node counts against connect_retries.
    failures: int = 0
    #: The pause after a failed heartbeat [seconds]; None = a resident node's backoff
    #: (:meth:`heartbeat_retry`).  An ephemeral node retries at connect_retry_delay.
    retry_delay: float | None = None
    #: The run a preempted run.py was sent to (:mod:`cluster.node.moves`): joined first
    #: while it waits, until the node starts a run.
    prefer: str | None = None

    @property
    def name(self) -> str:
        return self.cfg.effective_node_name()

    def skip_and_wait(self, now: float) -> tuple[frozenset[str], float]:
        """For an idle node: the waiting runs it will not join (finished, or backing off
        at ``now``), and how long the monitor may hold the answer -- the heartbeat interval,
        cut short so a hold ends when a backoff does."""
        wait = self.cfg.heartbeat_interval
        skip = set()
        for _, run_id in self.waiting:
            if run_id in self.finished:
                skip.add(run_id)
                continue
            until = self.retry_after.get(run_id, 0.0)
            if until > now:
                skip.add(run_id)
                wait = min(wait, until - now)
        return frozenset(skip), wait

    def has_work(self) -> bool:
        """Whether anything is wanted of this node: run.py is running, or a run waits
        that it has not finished (one it backs off from included: it joins it again)."""
        return self.child is not None or any(run_id not in self.finished
                                             for _, run_id in self.waiting)

    def status(self) -> str:
        if self.child is None:
            return "idle"
        return f"running run {self.child.run_id} (priority {self.child.priority})"

    def tick(self, now: float, *, hold: bool = False) -> float:
        """Reap a finished run.py; one heartbeat; start run.py if a run waits that this node
        may join.  With ``hold`` (the loop of :meth:`run`) an idle node's heartbeat is a
        long-poll; without it (``clusterpull.py --once``) it is answered at once.

        Returns when the next heartbeat is due, on the monotonic clock: ``now`` + the
        interval, or at once when the runs waiting changed so that the node now skips
        others than it asked to (one extra heartbeat per such change)."""
        self._reap(now)
        interval = self.cfg.heartbeat_interval
        idle = self.child is None
        skip, wait = self.skip_and_wait(now) if idle else (frozenset(), 0.0)
        if not hold:
            wait = 0.0
        try:
            waiting = heartbeat.send_heartbeat(self.cfg.master_host, self.cfg.monitor_port,
                                               self.name, self.status(), self.caps,
                                               wait=wait, skip=skip,
                                               stop=self.stop_flag.is_set,
                                               wakeup_fd=self.stop_flag.wakeup_fd,
                                               secret=heartbeat.node_secret(self.cfg))
        except heartbeat.HeartbeatStopped:
            return now  # the loop sees the stop flag
        except Exception as exc:  # the monitor may be down; keep trying next tick
            self.failures += 1
            log.warning("node %s: heartbeat failed (%d in a row): %s", self.name,
                        self.failures, exc)
            return now + self.heartbeat_retry(interval)
        self.heartbeats += 1
        self.failures = 0
        self.waiting = waiting
        if not idle or self.stop_flag.is_set():
            return now + interval
        later = self.clock.monotonic()
        if self._start_next(later):
            return now + interval
        if hold and self.skip_and_wait(later)[0] != skip:
            return later  # the monitor answered because of a run this node skips: re-ask
        return now + interval

    def say_goodbye(self) -> bool:
        """One heartbeat that says this node leaves for good (an ephemeral node that
        exits): the monitor removes its files, so it leaves the node lists at once.  One
        try, bounded; whether the monitor took it (a failure is one log line)."""
        try:
            heartbeat.send_heartbeat(self.cfg.master_host, self.cfg.monitor_port, self.name,
                                     timeout=GOODBYE_TIMEOUT,
                                     secret=heartbeat.node_secret(self.cfg), bye=True)
        except Exception as exc:  # leaving anyway; the provisioner sees its job end too
            log.info("node %s: goodbye not delivered: %s", self.name, exc)
            return False
        return True

    def heartbeat_retry(self, interval: float) -> float:
        """The pause after the last of :attr:`failures` failed heartbeats in a row:
        :attr:`retry_delay` when set, else :data:`FIRST_RETRY` doubled per failure up to
        ``interval``.  A node started a moment before its monitor listens (a machine's
        boot, localcluster.py starting every daemon at once: the first heartbeat was
        refused 18 ms before the monitor listened) then joins within a fraction of a
        second, not a whole heartbeat interval (10 s) later; a master that stays down is
        asked once an interval, as before, after a few quicker tries."""
        if self.retry_delay is not None:
            return self.retry_delay
        return min(interval, FIRST_RETRY * 2 ** min(max(self.failures - 1, 0), 30))

    def _start_next(self, now: float) -> bool:
        """Start run.py for the most urgent waiting run this node may join; whether one
        was started."""
        # Most urgent first; the monitor's order among the lanes of one priority (a stable
        # sort keeps it), except that the run this node was just sent to comes first
        # among the runs of its priority.
        def key(w: tuple[int, str]) -> tuple[int, bool]:
            return lanes.priority_of(w[0]), w[1] != self.prefer

        for lane, run_id in sorted(self.waiting, key=key):
            if run_id in self.finished or self.retry_after.get(run_id, 0.0) > now:
                continue
            self.prefer = None
            return self._start(lane, run_id)
        return False

    def _start(self, lane: int, run_id: str) -> bool:
        logs = self.cfg.work_dir / "log"
        logs.mkdir(parents=True, exist_ok=True)
        code = self.node_code()
        script = RUN_SCRIPT if code.version is None else code.run_script
        out = open(logs / "run.log", "ab")  # noqa: SIM115 - handed to the child
        priority = lanes.priority_of(lane)
        argv = [sys.executable, str(script), *self.config_args, "--priority", str(priority)]
        if lane != priority:
            argv += ["--lane", str(lane)]
        log.info("node %s: starting %s for run %s (%s)", self.name, script, run_id,
                 lanes.describe(lane))
        try:
            # Its own session: a terminal's ^C aimed at clusterpull does not reach it, and on
            # a hard stop its whole tree can be killed at once.
            child = proc.spawn(argv, stdout=out, stderr=proc.STDOUT, env=code.env())
        except proc.ProcessError as exc:
            log.error("node %s: %s", self.name, exc)
            return False
        finally:
            out.close()
        self.child = Child(lane, run_id, child)
        return True

    def node_code(self) -> CodeChoice:
        """The copy of the node code the next run.py starts from: the version the master
        published, fetched when its manifest changed (:mod:`cluster.node.selfupdate`), or
        the installed copy (``self_update = no``, nothing published, or an error)."""
        installed = CodeChoice(RUN_SCRIPT.parent)
        if not self.cfg.self_update:
            return installed
        if self.updater is None:
            cfg = self.cfg
            self.updater = SelfUpdate(lambda: make_transport(cfg), cfg.work_dir, installed)
        try:
            return self.updater.choose()
        except Exception as exc:  # a local disk problem: run the installed copy, keep going
            log.error("node %s: choosing the node code failed: %s; starting the installed "
                      "run.py", self.name, exc)
            return installed

    def _reap(self, now: float) -> bool:
        """Whether run.py has just exited (then it is recorded as finished or backing off)."""
        child = self.child
        if child is None:
            return False
        code = child.proc.poll()
        if code is None:
            return False
        self.child = None
        if code in FINISHED_CODES:
            self.finished.add(child.run_id)
        elif code == NODE_EXIT_MOVED:
            # Preempted: the run it was sent to (or the most urgent) is started next
            # (_start_next), and this one is open to the node again as soon as that one
            # lets it go.
            self.retry_after.pop(child.run_id, None)
            self.prefer = moves.take(self.cfg.work_dir)
        else:
            self.retry_after[child.run_id] = now + self.rejoin_delay
        log.info("node %s: run.py for run %s exited with %d", self.name, child.run_id, code)
        return True

    def run(self, until: Callable[[float], int | None] | None = None) -> int:
        """Heartbeat (see the module's docstring) until the stop flag is set, or until
        ``until(now)`` (asked at every pass, ``now`` on the monotonic clock) returns an exit
        status; then stop run.py and return that status (EXIT_OK after a stop request).
        Between heartbeats run.py is reaped every REAP_POLL seconds; its exit brings the
        next heartbeat forward to at once."""
        clock = self.clock
        next_at = clock.monotonic()
        alive = Liveness(self.cfg.work_dir)
        status = EXIT_OK
        while not self.stop_flag.is_set():
            now = clock.monotonic()
            alive.beat(now)  # a second clusterpull tells a hung one by this (liveness)
            if self._reap(now):
                next_at = now  # free again: say so, and learn what waits, at once
            verdict = None if until is None else until(now)
            if verdict is not None:
                status = verdict
                break
            if now >= next_at:
                # tick() returns a time after its own start, so missed periods are skipped
                # rather than sent in a burst.
                next_at = self.tick(now, hold=True)
                continue
            clock.sleep(min(REAP_POLL, next_at - now))
        if self.child is not None:
            self._stop_child(self.child.proc)
        return status

    def _stop_child(self, child: subprocess.Popen[bytes]) -> None:
        """TERM run.py (it leaves its run cleanly); kill its tree if it has not gone within
        CHILD_STOP_WAIT seconds, or at once on a second stop request (hard stop)."""
        child.terminate()
        deadline = self.clock.monotonic() + CHILD_STOP_WAIT
        while child.poll() is None:
            if self.stop_flag.hard or self.clock.monotonic() >= deadline:
                proc.kill_tree(child.pid, signal.SIGKILL)
                child.wait()
                return
            self.clock.sleep(REAP_POLL)
