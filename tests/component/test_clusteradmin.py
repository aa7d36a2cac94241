"""clusteradmin.py against a real clustermaster serving scripted nodes over real TCP.

* stat, ls and info while a run is under way (its live file and journal), stop of a
  waiting run (withdrawn) and of the running one (the master ends it; the report names who
  stopped it and why), the messages and exit status for unknown runs;
* stopall: the running run stopped, every waiting run withdrawn;
* a failed build: what the run leaves, as the status model and info show it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import configfile
from cluster.console.status import StatusReader
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.runspec import RunSpec
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    make_home,
    master_argv,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import REPO, free_port, reaped, wait_for

MD5 = "0123456789abcdef0123456789abcdef"
WHO = f"tester@{socket.gethostname()}"


def admin(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real clusteradmin.py as user "tester"."""
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(home.root), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "USER": "tester"})


def admin_json(home: Home, *args: str) -> Any:
    done = admin(home, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[Home, int, subprocess.Popen[str]]]:
    """A real clustermaster about to serve "auto nightly gs" (6 jobs) at priority 2, with
    "auto weekly gs" waiting behind it."""
    home = make_home(tmp_path / "home")
    QueueFile.for_priority(home, 2).append(RunSpec.parse("auto weekly gs"))
    port = free_port(5) + 2
    argv = master_argv(home, port, "connection_deadline=5", "heartbeat_timeout=60",
                       "pid_check_interval=0.5")
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        yield home, port, proc


def join(port: int, node: str, run_id: str) -> None:
    """A scripted node's first call: it is told to build."""
    reply = protocol.parse_reply(signed_talk(port, request(node, run_id)))
    assert reply.verb == protocol.BUILD, reply


def take_jobs(port: int, node: str, run_id: str, results: list[str] | None = None
              ) -> list[str]:
    """One call of a scripted node: report ``results``, return the jobs it was given."""
    lines = [f"result {name} 0 0.10 0.00 0.00 {MD5} gs" for name in results or []]
    reply = protocol.parse_reply(signed_talk(port, request(node, run_id, "slots 2",
                                                           "jobs 0 0", *lines)))
    assert reply.verb == protocol.JOBS, reply
    return [Job.parse(line).name for line in reply.jobs]


def test_stat_ls_info_then_stop_a_waiting_run_and_the_running_one(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    home, port, proc = master
    run_id = wait_for_run(home, 2, port)
    join(port, "n1", run_id)
    join(port, "n2", run_id)
    n1 = take_jobs(port, "n1", run_id)
    n2 = take_jobs(port, "n2", run_id)
    assert n1 and n2
    take_jobs(port, "n1", run_id, n1[:1])  # one result in: the run is under way
    wait_for(lambda: home.live(2).exists() and
             json.loads(home.live(2).read_text())["jobs"]["done"] == 1, 30, "the live file")

    stat = admin_json(home, "stat")
    [running] = stat["running"]
    assert running["run"] == run_id and running["queue"] == "auto nightly gs"
    assert (running["done"], running["total"], running["nodes"]) == (1, 6, 2)
    assert stat["queues"][2]["waiting"] == 1
    assert [r["id"] for r in stat["queues"][2]["runs"]] == [run_id, "p2:2"]
    text = admin(home, "stat").stdout
    assert f"p2 {run_id} auto nightly gs: 1/6 done" in text and "p2:2" in text

    nodes = {n["name"]: n for n in admin_json(home, "ls")["nodes"]}
    assert set(nodes) == {"n1", "n2"} and nodes["n1"]["run"] == run_id
    assert nodes["n1"]["done"] == 1 and nodes["n2"]["done"] == 0

    info = admin_json(home, "info", run_id)
    assert info["state"] == "running" and info["by_node"] == {"n1": n1[:1]}
    assert info["info"]["queue"] == "auto nightly gs" and "secret" not in info["info"]
    assert admin_json(home, "info", "p2:2")["state"] == "queued"
    assert admin_json(home, "info", "auto weekly gs")["info"]["position"] == 2

    # The waiting run is withdrawn; the running one goes on.
    done = admin(home, "stop", "p2:2")
    assert done.returncode == 0, done.stderr
    assert "withdrew 'auto weekly gs' from queue 2" in done.stdout
    assert QueueFile.for_priority(home, 2).read() == [RunSpec.parse("auto nightly gs")]

    # The running one: the master ends it, the report says who stopped it and why.
    done = admin(home, "stop", run_id, "--reason", "testing the stop", "--wait", "60")
    assert done.returncode == 0, done.stderr
    assert f"asked the priority-2 master to stop run {run_id}" in done.stdout
    assert f"run {run_id} ended: aborted" in done.stdout
    report = (home.archive / run_id / "report.txt").read_text()
    assert f"stopped by {WHO}: testing the stop" in report, report
    assert proc.wait(timeout=60) == 0
    assert QueueFile.for_priority(home, 2).read() == []  # dequeued, like a user's abort
    assert not home.job_start(2).exists() and not home.live(2).exists()
    info = admin_json(home, "info", run_id)
    assert info["state"] == "finished" and info["info"]["outcome"] == "aborted"

    # Unknown or finished runs: a clear message naming the run, exit status 1.
    again = admin(home, "stop", run_id)
    assert again.returncode == 1 and f"run {run_id} has already finished" in again.stderr
    for args, said in ((("stop", "20990101000000-p0-0000"), "20990101000000-p0-0000"),
                       (("info", "20990101000000-p0-0000"), "20990101000000-p0-0000"),
                       (("stop", "p1:1"), "queue 1 holds 0 run(s)"),
                       (("info", "user nobody gs"), "no run 'user nobody gs' is queued"),
                       (("stop", "../x"), "'../x' is neither running nor waiting"),
                       (("history", "ex__nope.ps"), "test 'ex__nope.ps' is in none")):
        bad = admin(home, *args)
        assert bad.returncode == 1 and said in bad.stderr, (args, bad.stderr)
    assert admin(home, "stopall").stdout.strip() == "nothing runs or waits"
    usage = admin(home, "frobnicate")
    assert usage.returncode == 2


def test_stopall_stops_the_running_run_and_withdraws_every_waiting_one(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    home, port, proc = master
    QueueFile.for_priority(home, 0).append(RunSpec.parse("user alice gs"))
    QueueFile.for_priority(home, 1).append(RunSpec.parse("git 0123abcd gs"))
    run_id = wait_for_run(home, 2, port)
    join(port, "n1", run_id)
    take_jobs(port, "n1", run_id)
    done = admin(home, "stopall", "--reason", "maintenance")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"asked the priority-2 master to stop run {run_id} (auto nightly gs)" in lines
    assert "withdrew 'user alice gs' from queue 0 (p0)" in lines
    assert "withdrew 'git 0123abcd gs' from queue 1 (p1)" in lines
    assert "withdrew 'auto weekly gs' from queue 2 (p2)" in lines
    assert proc.wait(timeout=60) == 0
    report = (home.archive / run_id / "report.txt").read_text()
    assert f"stopped by {WHO}: maintenance" in report
    assert all(QueueFile.for_priority(home, p).read() == [] for p in (0, 1, 2))


def test_a_failed_build_as_the_status_model_and_info_show_it(
        master: tuple[Home, int, subprocess.Popen[str]]) -> None:
    home, port, proc = master
    run_id = wait_for_run(home, 2, port)
    join(port, "n1", run_id)
    reply = protocol.parse_reply(signed_talk(port, request(
        "n1", run_id, "slots 2", "jobs 0 0", "failure -1 build failed: make: *** [all] "
        "Error 2")))
    assert reply.verb == protocol.ABORT
    assert proc.wait(timeout=60) == 0
    cfg = configfile.load(None, {"home": str(home.root)})
    snap = StatusReader().snapshot(home, cfg)
    assert snap["running"] == []
    failed = snap["recent"][0]
    assert failed["run"] == run_id and failed["outcome"] == "failed"
    assert failed["differences"] is None and failed["errors"] is None
    assert failed["links"]["tab"] is None
    assert failed["links"]["report"] == f"/archive/{run_id}/report.txt"
    assert (home.root / failed["links"]["report"].lstrip("/")).is_file()
    # The run's queue line left the queue; the weekly run now heads it.
    assert [r["line"] for r in snap["queues"][2]["runs"]] == ["auto weekly gs"]
    info = admin(home, "info", run_id)
    assert info.returncode == 0, info.stderr
    assert "outcome: failed" in info.stdout and "build failed: make" in info.stdout
    detail = admin_json(home, "info", run_id)
    assert detail["by_node"] == {} and detail["counts"]["tests"] == 0
