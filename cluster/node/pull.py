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
import subprocess
import sys
import time
from dataclasses import dataclass, field

from cluster.config import Config
from cluster.defaults import REPO_ROOT
from cluster.node import heartbeat

log = logging.getLogger("cluster.pull")

REPO = REPO_ROOT
RUN_SCRIPT = REPO / "run.py"
FINISHED_CODES = (0, 1)


@dataclass
class Child:
    priority: int
    run_id: str
    proc: subprocess.Popen[bytes]


@dataclass
class ClusterPull:
    """The resident node loop.  Callers use tick(now) (tests) or run() (the daemon)."""

    cfg: Config
    caps: str
    config_args: list[str] = field(default_factory=list)
    rejoin_delay: float = 30.0
    child: Child | None = None
    finished: set[str] = field(default_factory=set)
    retry_after: dict[str, float] = field(default_factory=dict)
    stopping: bool = False

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
        if self.child is not None or self.stopping:
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
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        finally:
            out.close()
        self.child = Child(priority, run_id, proc)

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
        """Tick every heartbeat_interval until stop() is called; then wait for run.py."""
        interval = self.cfg.heartbeat_interval
        next_at = time.monotonic()
        while not self.stopping:
            self.tick(time.monotonic())
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # skip missed periods instead of bursting
                next_at = now + interval
            while not self.stopping and time.monotonic() < next_at:
                time.sleep(min(0.2, max(next_at - time.monotonic(), 0)))
                self._reap(time.monotonic())
        if self.child is not None:
            self.child.proc.terminate()  # run.py leaves its run cleanly on TERM
            try:
                self.child.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.child.proc.kill()
                self.child.proc.wait()
        return 0

    def stop(self, *_: object) -> None:
        self.stopping = True
