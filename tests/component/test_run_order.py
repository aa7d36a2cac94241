"""``order=N`` orders the waiting runs of a queue (docs/runoptions.md, "Order within a
queue"), with a real clustermaster.py serving scripted nodes over real TCP and the real
clusteradmin.py changing a run's order:

* three runs queued as ``order=5``, ``order=-3`` and none (0): the master starts the -3
  one first, though it is second in the file;
* ``clusteradmin order`` on the running run records the value (``stat`` shows it) and
  the audit log says who; on a waiting run it rewrites the run's queue line, and the next
  invocation starts that run before the one it now follows; a bad value changes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from tests.component.scripted_nodes import make_home, master_argv, run_to_the_end, wait_for_run
from tests.helpers import REPO, free_port

MD5 = "0123456789abcdef0123456789abcdef"
WHO = f"tester@{socket.gethostname()}"


def admin(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real clusteradmin.py as user "tester"."""
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(home.root), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "USER": "tester"})


def serve_one(home: Home, port: int, during: list[str] | None = None) -> str:
    """One master invocation: the queue line of the run it started, served to the end by a
    scripted node.  ``during``: a clusteradmin order to give while it runs (its RUN is
    filled in with the run id)."""
    master = subprocess.Popen(master_argv(home, port, "pid_check_interval=0.2",
                                          "confirm_differences=no"),
                              stderr=subprocess.DEVNULL)
    try:
        run_id = wait_for_run(home, 2, port)
        line = JobStart.parse(home.job_start(2).read_text()).queue
        if during is not None:
            done = admin(home, "order", run_id, *during)
            assert done.returncode == 0, done.stderr
            assert "runs already" in done.stdout
            stat = json.loads(admin(home, "stat", "--json").stdout)
            assert [r["order"] for r in stat["running"]] == [int(during[0])]
        assert run_to_the_end(port, "n1", run_id, [], MD5)[-1] == protocol.ABORT
        assert master.wait(timeout=60) == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    return line


def test_the_master_starts_runs_in_order_and_clusteradmin_reorders(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", "auto first gs order=5")
    queue = QueueFile.for_priority(home, 2)
    queue.append(RunSpec.parse("auto second gs order=-3"))
    queue.append(RunSpec.parse("auto third gs"))
    port = free_port(5) + 2

    # -3 first, though second in the file; a change to the running run is recorded.
    assert serve_one(home, port, during=["7"]) == "auto second gs order=-3"
    assert [s.line() for s in queue.read()] == ["auto first gs order=5", "auto third gs"]
    audit = home.admin_log.read_text()
    assert f"{WHO} order " in audit and "(running) -3 -> 7" in audit

    # A bad value is refused, and nothing changes.
    for bad in ("x", "101", "1.5"):
        done = admin(home, "order", "p2:1", bad)
        assert done.returncode == 2 and "order=" in done.stderr, done.stderr
        assert "nothing changed" in done.stderr
    assert [s.line() for s in queue.read()] == ["auto first gs order=5", "auto third gs"]

    # Untouched, "third" (0) would start next; the admin puts "first" ahead of it.
    done = admin(home, "order", "p2:1", "-10")
    assert done.returncode == 0, done.stderr
    assert "order 5 -> -10" in done.stdout
    assert [s.line() for s in queue.read()] == ["auto first gs order=-10", "auto third gs"]
    stat = json.loads(admin(home, "stat", "--json").stdout)
    assert [r["order"] for r in stat["queues"][2]["runs"]] == [-10, 0]
    assert "p2:1 'auto first gs order=5' 5 -> -10" in home.admin_log.read_text()

    assert serve_one(home, port) == "auto first gs order=-10"
    assert serve_one(home, port) == "auto third gs"
    assert queue.read() == []
