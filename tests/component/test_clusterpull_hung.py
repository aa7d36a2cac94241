"""A second clusterpull takes the node over from a hung one, and leaves a live one alone
(clusterpull.sh "checks for timeouts"; cluster.node.liveness).

Real clusterpull.py processes against a monitor port where nothing listens (their
heartbeats fail and are retried, as when the master is down): the loop goes on, and so does
its liveness file.  A hung holder is made with SIGSTOP, its silence with the file's mtime
set back past the limit (instead of waiting five minutes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from cluster.node import liveness
from cluster.runtime import singleton
from tests.helpers import REPO, free_port, wait_for


def _argv(work: Path, home: Path) -> list[str]:
    return [sys.executable, str(REPO / "clusterpull.py"), "--set", f"work_dir={work}",
            "--set", f"master_home={home}", "--set", f"monitor_port={free_port()}",
            "--set", "node_name=hungnode", "--set", "heartbeat_interval=0.5",
            "--set", "io_timeout=1", "--quiet"]


def _start(work: Path, home: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(_argv(work, home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def test_a_hung_clusterpull_is_killed_and_replaced_a_live_one_is_left_alone(
        tmp_path: Path) -> None:
    work, home = tmp_path / "work", tmp_path / "home"
    home.mkdir()
    alive = work / liveness.ALIVE_FILE
    first = _start(work, home)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: alive.exists(), 20, "the first clusterpull's liveness file")
        # A live holder: a second start exits 0 at once and the first goes on.
        live = subprocess.run(_argv(work, home), capture_output=True, timeout=30)
        assert live.returncode == 0 and first.poll() is None
        # The holder hangs: stopped, and silent for longer than the limit.
        os.kill(first.pid, signal.SIGSTOP)
        limit = liveness.hung_after(0.5, 1.0)
        past = time.time() - limit - 60
        os.utime(alive, (past, past))
        second = _start(work, home)
        assert first.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: singleton.read_holder(work / "clusterpull.lock") == second.pid, 20,
                 "the second clusterpull to hold the lock")
        assert second.poll() is None
        wait_for(lambda: time.time() - alive.stat().st_mtime < 30, 20,
                 "the second clusterpull's loop to touch the liveness file")
        log = (work / "log" / "clusterpull.log").read_text()
        assert f"clusterpull pid {first.pid} holds" in log and "hung; killed it" in log
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(work) in " ".join(p.info["cmdline"] or [])]
