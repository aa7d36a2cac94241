"""Two priority-0 runs at once, in lane 0 and in user lane 3 (cluster.lanes): the console,
the status page, clusteradmin's stop and order, clusterpush and its abort see both.

The master home is written the way two clustermasters leave it (``job.start`` and
``job.3.start``, ``live.json`` and ``live.3.json``, ``status`` and ``status.3``, their
lines at the queue's front); clusteradmin.py and clusterpush.py run as real processes, the
status service over real TCP.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster import configfile, lanes
from cluster.config import Config
from cluster.console import httpd
from cluster.home import Home
from cluster.master.files import abort
from cluster.master.files.ending import EndRecord, Outcome
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import droppings
from cluster.wire.jobstart import JobStart
from tests.helpers import REPO, free_port, wait_for

ALICE = "20261128100000-p0-a1a1"  # lane 0
CAROL = "20261128100500-p0-c3c3"  # lane 3
LANE = lanes.FIRST_USER_LANE


def admin(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    """The real clusteradmin.py, as user "tester"."""
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(home.root), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "USER": "tester"})


def admin_json(home: Home, *args: str) -> Any:
    done = admin(home, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def clusterpush(home: Home, tree_dir: Path, user: str, *words: str) -> list[str]:
    """The real clusterpush.py (a local push); the lines it printed."""
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", user, "--copy", *words], cwd=tree_dir,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def tree(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "trees" / text / "ghostpdl"
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "a.c").write_text(f"int a = {text!r};\n")
    return root


def scan(home: Home) -> list[RunSpec]:
    """The master's scan of the droppings (priority 0's discoverer)."""
    return droppings.scan_user_droppings(home, Config(), QueueFile.for_priority(home, 0))


def queued(home: Home) -> list[str]:
    return [s.line() for s in QueueFile.for_priority(home, 0).read()]


def start(home: Home, lane: int, run_id: str, line: str, node: str) -> None:
    """What lane ``lane``'s master leaves while it serves ``line`` on ``node``."""
    spec = RunSpec.parse(line)
    begun = JobStart(id=run_id, priority=0, queue=spec.line(), kind=spec.kind, ref=spec.ref,
                     products=spec.products, tree=spec.tree,
                     source=f"runs/{run_id}/source", build="make", tests="tests",
                     lane_number=lane)
    assert begun.lane == lane
    home.job_start(lane).write_text(begun.format())
    now = time.time()
    live = {"version": 1, "run": run_id, "priority": 0, "kind": "user", "queue": line,
            "products": list(spec.products), "started": now - 30, "updated": now,
            "jobs": {"total": 10, "done": 4, "running": 1, "left": 5}, "rate": 0.5,
            "eta": now + 10,
            "nodes": {node: {"state": "ready", "slots": 1, "done": 4, "running": 1,
                             "errors": 0, "timeouts": 0, "last_seen": now - 1,
                             "caps": "os=Linux", "status": f"running {run_id}"}},
            "lost": [], "fatal": "", "stopping": ""}
    home.live(lane).write_text(json.dumps(live))
    home.status(lane).write_text(f"run {run_id} - 4/10 done\n")


@pytest.fixture
def home(tmp_path: Path) -> Home:
    """alice's run in lane 0, carol's in lane 3, bob's waiting behind them."""
    h = Home(tmp_path / "home")
    h.create()
    queue = QueueFile.for_priority(h, 0)
    for line in ("user alice gs", "user carol gs", "user bob gs lowres"):
        queue.append(RunSpec.parse(line))
    start(h, 0, ALICE, "user alice gs", "n1")
    start(h, LANE, CAROL, "user carol gs", "n3")
    return h


def test_stat_ls_and_info_see_the_run_of_lane_3(home: Home) -> None:
    stat = admin_json(home, "stat")
    running = {r["run"]: r for r in stat["running"]}
    assert set(running) == {ALICE, CAROL}
    assert (running[ALICE]["lane"], running[CAROL]["lane"]) == (0, LANE)
    assert running[CAROL]["priority"] == 0 and running[CAROL]["done"] == 4
    (p0,) = [q for q in stat["queues"] if q["priority"] == 0]
    assert [(r["id"], r["running"]) for r in p0["runs"]] == \
        [(ALICE, True), (CAROL, True), ("p0:3", False)]
    assert p0["waiting"] == 1
    text = admin(home, "stat").stdout
    assert f"p0 {CAROL} user carol gs: 4/10 done" in text
    assert f"[{lanes.describe(LANE)}]" in text and "priority 0 (lane 3)" in text
    # n3 is known only from lane 3's live file.
    nodes = {n["name"]: n for n in admin_json(home, "ls")["nodes"]}
    assert nodes["n3"]["run"] == CAROL and nodes["n1"]["run"] == ALICE
    info = admin_json(home, "info", CAROL)
    assert info["state"] == "running" and info["live"]["run"] == CAROL
    assert admin_json(home, "info", "p0:2")["run"] == CAROL
    assert admin_json(home, "info", "p0:3")["state"] == "queued"
    done = admin(home, "node", "disable", "n3", "--reason", "disk")
    assert done.returncode == 0, done.stderr
    assert home.node_down("n3").is_file()


def test_the_status_page_json_shows_both_runs(home: Home) -> None:
    cfg = configfile.load(None, {"home": str(home.root), "status_port": str(free_port())})
    stop = threading.Event()
    ready: list[object] = []
    thread = threading.Thread(target=httpd.run, args=(home, cfg, stop.is_set, 0.05,
                                                      ready.append), daemon=True)
    thread.start()
    try:
        wait_for(lambda: ready, 10, "the status server to listen")

        def get(path: str) -> Any:
            conn = http.client.HTTPConnection("127.0.0.1", cfg.status_port, timeout=10)
            try:
                conn.request("GET", path)
                answer = conn.getresponse()
                assert answer.status == 200
                return json.loads(answer.read())
            finally:
                conn.close()

        snap = get("/api/status")
        assert [(r["run"], r["lane"], r["lane_name"]) for r in snap["running"]] == \
            [(ALICE, 0, "priority 0"), (CAROL, LANE, "priority 0 (lane 3)")]
        assert {(s["lane"], s["line"]) for s in snap["status"]} == \
            {(0, f"run {ALICE} - 4/10 done"), (LANE, f"run {CAROL} - 4/10 done")}
        assert [r["running"] for r in snap["queues"][0]["runs"]] == [True, True, False]
        assert get(f"/api/runs/{CAROL}")["state"] == "running"
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_stop_and_order_reach_the_run_of_lane_3(home: Home) -> None:
    done = admin(home, "stop", CAROL, "--reason", "wrong tree")
    assert done.returncode == 0, done.stderr
    assert f"master of priority 0 (lane 3) to stop run {CAROL}" in done.stdout
    reason = abort.stop_reason(home, CAROL) or ""
    assert reason.startswith("stopped by tester@") and reason.endswith(": wrong tree")
    assert not home.stop_request(ALICE).exists()
    # By its place: p0:2 is carol's running line, never withdrawn.
    home.stop_request(CAROL).unlink()
    done = admin(home, "stop", "p0:2")
    assert done.returncode == 0, done.stderr
    assert home.stop_request(CAROL).is_file()
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs lowres"]
    # The waiting run goes; both running lines stay.
    done = admin(home, "stop", "p0:3")
    assert done.returncode == 0, done.stderr
    assert queued(home) == ["user alice gs", "user carol gs"]
    # order: recorded beside the running run of lane 3, its line unchanged.
    done = admin(home, "order", "p0:2", "5")
    assert done.returncode == 0, done.stderr
    assert home.run_order(CAROL).read_text().startswith("5\n")
    assert queued(home) == ["user alice gs", "user carol gs"]
    (carol,) = [r for r in admin_json(home, "stat")["running"] if r["run"] == CAROL]
    assert carol["order"] == 5


def test_a_push_replaces_neither_running_run(home: Home, tmp_path: Path) -> None:
    now = droppings.running(home)
    assert [s.line() for s in now.specs] == ["user alice gs", "user carol gs"]
    assert not now.unknown
    # bob's push replaces his own waiting run, in its place, behind both running runs.
    printed = clusterpush(home, tree(tmp_path, "bob2"), "bob", "gs")
    assert "replacing your waiting run 'user bob gs lowres' (position 3" in printed[1]
    scan(home)
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs"]
    # carol pushes while her run is running in lane 3: queued after it, not merged.
    printed = clusterpush(home, tree(tmp_path, "carol2"), "carol", "gs", "lowres")
    assert printed[1] == ("your run 'user carol gs' is running (it keeps the tree it "
                          "started with); this push is queued after it")
    scan(home)
    # alice too (lane 0), with the very line she runs.
    clusterpush(home, tree(tmp_path, "alice2"), "alice", "gs")
    scan(home)
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs",
                            "user carol gs lowres", "user alice gs"]
    # carol's next push replaces her waiting run, never the running one.
    clusterpush(home, tree(tmp_path, "carol3"), "carol", "gs", "highres")
    scan(home)
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs",
                            "user carol gs highres", "user alice gs"]
    # clusterpush abort: her waiting run goes, her run in lane 3 is asked to stop.
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", "carol", "abort"],
                          cwd=tree(tmp_path, "carol3"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"stopping the running run {CAROL}" in done.stdout
    assert abort.requested(home, CAROL) and not abort.requested(home, ALICE)
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs", "user alice gs"]


def test_a_run_ending_in_lane_3_still_holds_its_line(home: Home, tmp_path: Path) -> None:
    """Lane 3's job.start is gone (its serving ended) but its end record has not dequeued
    the line yet: carol's push is queued after it."""
    begun = JobStart.parse(home.job_start(LANE).read_text())
    EndRecord.create(home.run_dir(CAROL), begun, Outcome.DONE)
    home.job_start(LANE).unlink()
    now = droppings.running(home)
    assert [s.line() for s in now.specs] == ["user alice gs", "user carol gs"]
    home.job_start(0).write_text("garbage\n")  # lane 0 unreadable: the first other line
    now = droppings.running(home)
    assert now.unknown and [s.line() for s in now.specs] == ["user carol gs"]
    clusterpush(home, tree(tmp_path, "carol2"), "carol", "gs")
    scan(home)
    assert queued(home) == ["user alice gs", "user carol gs", "user bob gs lowres",
                            "user carol gs"]
