"""clusterpull: the node's resident loop (port of clusterpull.sh).

Every ``heartbeat_interval`` seconds it sends a heartbeat to the master's monitor, which
answers with the runs waiting (one job.start per priority).  When no run.py is running it
starts one for the most urgent run (lowest priority number) this node has not finished.

A run is *finished* for this node when run.py exits 0 (the master said the run is over, or
that this node is unsuitable) or 1 (the node failed); it then never joins that run again.
Exit 3 (master unreachable) or 4 (aborted for a reason that may pass, e.g. the master was
replaced) lets it join again after ``rejoin_delay``.

Deviation (docs/deviations.md): a node runs one run at a time and does not preempt a
lower-priority run when a higher one appears; it picks the most urgent when it is free.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from cluster.config import Config
from cluster.defaults import EXIT_OK, NODE_EXIT_DONE, NODE_EXIT_FAILED, REPO_ROOT
from cluster.node import heartbeat
from cluster.runtime import proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopFlag

log = logging.getLogger("cluster.pull")

RUN_SCRIPT = REPO_ROOT / "run.py"
#: run.py's exit codes after which this node never joins that run again.
FINISHED_CODES = (NODE_EXIT_DONE, NODE_EXIT_FAILED)
#: How long run.py has to leave its run after TERM before it is killed [seconds].
CHILD_STOP_WAIT = 30.0
#: Longest sleep between looks at run.py and the stop flag [seconds].
REAP_POLL = 0.2


@dataclass
class Child:
    priority: int
    run_id: str
    proc: subprocess.Popen[bytes]


@dataclass
class ClusterPull:
    """The resident node loop.  Callers use tick(now) (tests) or run() (the daemon), and
    stop the daemon through :attr:`stop_flag` (``install_signal_handlers``).  ``clock``
    paces the loop."""

    cfg: Config
    caps: str
    config_args: list[str] = field(default_factory=list)
    rejoin_delay: float = 30.0
    child: Child | None = None
    finished: set[str] = field(default_factory=set)
    retry_after: dict[str, float] = field(default_factory=dict)
    stop_flag: StopFlag = field(default_factory=StopFlag)
    clock: Clock = field(default_factory=SystemClock)

    @property
    def name(self) -> str:
        return self.cfg.effective_node_name()

    def status(self) -> str:
        if self.child is None:
            return "idle"
        return f"running run {self.child.run_id} (priority {self.child.priority})"

    def tick(self, now: float) -> None:
        """One heartbeat; reap a finished run.py; start run.py if a run waits."""
        self._reap(now)
        try:
            waiting = heartbeat.send_heartbeat(self.cfg.master_host, self.cfg.monitor_port,
                                               self.name, self.status(), self.caps)
        except Exception as exc:  # the monitor may be down; keep trying next tick
            log.warning("node %s: heartbeat failed: %s", self.name, exc)
            return
        if self.child is not None or self.stop_flag.is_set():
            return
        for priority, run_id in sorted(waiting):
            if run_id in self.finished or self.retry_after.get(run_id, 0.0) > now:
                continue
            self._start(priority, run_id)
            return

    def _start(self, priority: int, run_id: str) -> None:
        logs = self.cfg.work_dir / "log"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / "run.log", "ab")  # noqa: SIM115 - handed to the child
        argv = [sys.executable, str(RUN_SCRIPT), *self.config_args, "--priority", str(priority)]
        log.info("node %s: starting run.py for run %s (priority %d)", self.name, run_id, priority)
        try:
            # Its own session: a terminal's ^C aimed at clusterpull does not reach it, and on
            # a hard stop its whole tree can be killed at once.
            child = proc.spawn(argv, stdout=out, stderr=proc.STDOUT)
        except proc.ProcessError as exc:
            log.error("node %s: %s", self.name, exc)
            return
        finally:
            out.close()
        self.child = Child(priority, run_id, child)

    def _reap(self, now: float) -> None:
        child = self.child
        if child is None:
            return
        code = child.proc.poll()
        if code is None:
            return
        self.child = None
        if code in FINISHED_CODES:
            self.finished.add(child.run_id)
        else:
            self.retry_after[child.run_id] = now + self.rejoin_delay
        log.info("node %s: run.py for run %s exited with %d", self.name, child.run_id, code)

    def run(self) -> int:
        """Tick every heartbeat_interval until the stop flag is set; then stop run.py."""
        clock = self.clock
        interval = self.cfg.heartbeat_interval
        next_at = clock.monotonic()
        while not self.stop_flag.is_set():
            self.tick(clock.monotonic())
            next_at += interval
            now = clock.monotonic()
            if next_at < now:  # skip missed periods instead of bursting
                next_at = now + interval
            while not self.stop_flag.is_set() and clock.monotonic() < next_at:
                clock.sleep(min(REAP_POLL, max(next_at - clock.monotonic(), 0)))
                self._reap(clock.monotonic())
        if self.child is not None:
            self._stop_child(self.child.proc)
        return EXIT_OK

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
