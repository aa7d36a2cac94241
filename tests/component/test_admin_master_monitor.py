"""The monitor gives a disabled node no run: a real monitor_port.py, the node's real
heartbeat client over real TCP.

A disabled node (``nodes/<name>.down``) is answered with no waiting run, at once or after a
held heartbeat's whole wait, even when a run appears meanwhile (its clusterpull then starts
no run.py); its heartbeat, status and caps are still recorded.  Enabled again, it is told
of the run at its next heartbeat.
"""

from __future__ import annotations

import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.node.heartbeat import send_heartbeat
from tests.helpers import REPO, give_key, wait_for

RUN0 = "20261123100000-p0-aaaa"
RUN1 = "20261123100001-p1-bbbb"


@pytest.fixture
def monitor(tmp_path: Path) -> Iterator[tuple[Home, int]]:
    """A monitor_port.py serving a fresh home; (home, port)."""
    home = Home(tmp_path / "home")
    home.create()
    proc = subprocess.Popen([sys.executable, str(REPO / "monitor_port.py"), "--set",
                             f"home={home.root}", "--set", "monitor_port=0"], cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = 0
        deadline = time.monotonic() + 20
        while not port and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                match = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stderr.readline())
                port = int(match.group(1)) if match else 0
        assert port, "monitor_port.py did not report its port"
        yield home, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def beat(home: Home, port: int, node: str, **kw: object) -> list[tuple[int, str]]:
    secret = give_key(home.root, node)  # the node's own key
    return send_heartbeat("127.0.0.1", port, node, secret=secret, **kw)  # type: ignore[arg-type]


def test_a_disabled_node_is_told_no_run_but_still_recorded(monitor: tuple[Home, int]
                                                          ) -> None:
    home, port = monitor
    home.job_start(0).write_text(f"id {RUN0}\n")
    home.node_down("n1").write_text("disabled by alice at 2026-11-23T10:00:00Z\nbad fan\n")
    before = time.time()
    assert beat(home, port, "n1", status="idle", caps="ram=1000") == []
    assert beat(home, port, "n2", status="idle") == [(0, RUN0)]
    # It is disabled, not down: its heartbeat, status and caps are on record.
    assert (home.nodes / "n1.status").read_text() == "idle\n"
    assert (home.nodes / "n1.caps").read_text() == "ram=1000\n"
    assert (home.nodes / "n1.up").stat().st_mtime >= before - 1
    home.node_down("n1").unlink()
    assert beat(home, port, "n1") == [(0, RUN0)]


def test_a_held_heartbeat_of_a_disabled_node_is_not_woken_by_a_new_run(
        monitor: tuple[Home, int]) -> None:
    home, port = monitor
    home.node_down("n1").write_text("disabled by alice at 2026-11-23T10:00:00Z\n")
    answers: dict[str, tuple[list[tuple[int, str]], float]] = {}

    def held(node: str) -> None:
        began = time.monotonic()
        got = beat(home, port, node, wait=3.0)
        answers[node] = (got, time.monotonic() - began)

    threads = [threading.Thread(target=held, args=(n,)) for n in ("n1", "n2")]
    for t in threads:
        t.start()
    # Both are held (their heartbeats are recorded first), then a run appears.
    wait_for(lambda: (home.nodes / "n1.up").exists() and (home.nodes / "n2.up").exists(),
             10, "both heartbeats")
    time.sleep(0.3)
    home.job_start(1).write_text(f"id {RUN1}\n")
    for t in threads:
        t.join(timeout=15)
    assert answers["n2"][0] == [(1, RUN1)] and answers["n2"][1] < 2.5  # woken by the run
    assert answers["n1"][0] == [] and answers["n1"][1] >= 2.5  # held to its end, no run
