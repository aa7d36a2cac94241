"""The master's side of watching and steering a run, with a real clustermaster.py.

Scripted nodes serve the run over real TCP (tests/component/scripted_nodes.py):

* ``live.2.json`` appears while the run is served, its done count grows with the results,
  its node counts errors and timeouts, and it is gone once the run has ended; run.info
  then ends with the run's summary (nodes, differences, errors);
* an admin's ``runs/<id>/stop`` ends a running run of priority 2 (not only a user's) as
  aborted: the nodes are told so, the run leaves its queue, the report and the mail say
  who stopped it and why;
* a disabled node (``nodes/<name>.down``) is told ABORT at its first call and gets no job;
  those disabled while they hold jobs hand them back at their next call, and with more of
  them than ``max_failed_nodes`` the run still completes on the other node: a disabled
  node is not a lost one;
* a master that takes a run over rewrites the live file a killed one left, with the run's
  true start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    make_home,
    master_argv,
    request,
    run_to_the_end,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port, wait_for
from tests.smtp import smtp_server

MD5 = "0123456789abcdef0123456789abcdef"
OLD_MD5 = "fedcba9876543210fedcba9876543210"


def argv(home: Home, port: int, *settings: str) -> list[str]:
    return master_argv(home, port, "pid_check_interval=0.2", "heartbeat_timeout=60",
                       "batch_per_slot=1", *settings, suffixed=True)


def call(port: int, node: str, run_id: str, *lines: str, held: int = 0) -> protocol.Reply:
    """One call of a 1-slot node holding ``held`` jobs, carrying result ``lines``."""
    return protocol.parse_reply(signed_talk(port, request(
        node, run_id, "slots 1", f"jobs {held} {held}", *lines)))


def join(port: int, node: str, run_id: str) -> list[str]:
    """BUILD, then ready: return the first batch of job names."""
    assert call(port, node, run_id).verb == protocol.BUILD
    return [Job.parse(line).name for line in call(port, node, run_id).jobs]


def result(name: str, error: int = 0) -> str:
    return f"result {name} {error} 0.10 0.00 0.00 {MD5 if error == 0 else '0'} gs"


def live(home: Home) -> dict[str, Any] | None:
    try:
        return json.loads(home.live(2).read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def live_when(home: Home, check: Callable[[dict[str, Any]], bool], what: str,
              timeout: float = 10.0) -> dict[str, Any]:
    """The live file's content once ``check`` holds for it; fail naming ``what``."""
    found: list[dict[str, Any]] = []

    def look() -> bool:
        snap = live(home)
        if snap is not None and check(snap):
            found.append(snap)
            return True
        return False

    wait_for(look, timeout, what)
    return found[0]


def running_is(node: str, count: int, snap: dict[str, Any]) -> bool:
    """Whether ``snap`` shows ``node`` (and the whole run) holding ``count`` jobs."""
    return bool(snap["nodes"].get(node, {}).get("running") == count
                and snap["jobs"]["running"] == count)


def done_is(count: int, snap: dict[str, Any]) -> bool:
    return bool(snap["jobs"]["done"] == count)


def stop_master(master: subprocess.Popen[bytes]) -> None:
    if master.poll() is None:
        master.kill()
        master.wait()


def info_lines(home: Home, run_id: str) -> dict[str, str]:
    text = (home.archive / run_id / "run.info").read_text()
    return dict(line.partition(" ")[::2] for line in text.splitlines())


def test_live_status_grows_with_the_results_and_goes_at_the_end(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    # The baseline below is written once the run is served, for its report's differences.
    # Without confirm_differences=no, a master slowed between its first live.json and its
    # confirm phase's set-up (which looks for a baseline) would find it too and run the
    # differences again once the sixth result is in: the live file would then show the
    # confirm phase's counts instead of "done 6" (a CI failure under load).
    master = subprocess.Popen(argv(home, port, "confirm_differences=no"),
                              stderr=subprocess.PIPE)
    try:
        run_id = wait_for_run(home, 2, port)
        first = live_when(home, bool, "live.2.json", 30)  # once the job list is made
        names = [Job.parse(line).name for line in home.jobs(2).read_text().splitlines()]
        # A baseline in which 2 of the 6 tests had another output, and a third that now
        # times out: 3 differences.
        rows = [f"{n}\t0\t0.1\t0\t0\t0\t{OLD_MD5 if i < 2 else MD5}\tr0\tgs\told"
                for i, n in enumerate(sorted(names))]
        timed_out = sorted(names)[-1]
        (home.tables / "current.tab").write_text("\n".join(rows) + "\n")
        assert first["run"] == run_id and first["kind"] == "auto"
        assert first["jobs"]["total"] == len(names) == 6
        assert first["started"] <= time.time()
        todo = join(port, "n1", run_id)
        seen: list[int] = []
        for k in range(1, 7):
            # One result per call, the rest still held; one test timed out (error 3).
            name = todo.pop(0)
            reply = call(port, "n1", run_id, result(name, 3 if name == timed_out else 0),
                         held=len(todo))
            todo += [Job.parse(line).name for line in reply.jobs]
            snap = live_when(home, partial(done_is, k), f"done {k} in live.json")
            seen.append(snap["jobs"]["done"])
            assert snap["nodes"]["n1"]["done"] == k
            if k == 2:
                live_when(home, partial(running_is, "n1", len(todo)),
                          "n1's held jobs in live.json")
                time.sleep(1.2)  # another tick, so the rate spans time
        assert seen == [1, 2, 3, 4, 5, 6]
        last = live(home)
        assert last is not None
        node = last["nodes"]["n1"]
        assert node["done"] == 6 and node["errors"] == 1 and node["timeouts"] == 1
        assert abs(node["last_seen"] - time.time()) < 30
        assert last["rate"] > 0 and last["eta"] is not None
        assert last["jobs"]["left"] == 0
        assert run_to_the_end(port, "n1", run_id, [], MD5)[-1] == protocol.ABORT
        assert master.wait(timeout=60) == 0
    finally:
        stop_master(master)
    assert not home.live(2).exists()
    info = info_lines(home, run_id)
    assert info["outcome"] == "done" and info["nodes"] == "1"
    # The two changed tests, and the one that timed out (md5 0 now: it is listed both as
    # a difference and as having started to produce errors, as the report says).
    assert info["differences"] == "3" and info["errors"] == "1"
    report = (home.archive / run_id / "report.txt").read_text()
    assert "Differences in 3 of 6" in report and "1 regression file(s) have started" in report


def test_an_admin_stop_ends_a_priority_2_run_and_the_report_names_who(tmp_path: Path
                                                                         ) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    with smtp_server() as (collector, smtp_port):
        master = subprocess.Popen(argv(home, port, "smtp_host=127.0.0.1",
                                       f"smtp_port={smtp_port}"), stderr=subprocess.PIPE)
        try:
            run_id = wait_for_run(home, 2, port)
            held = join(port, "n1", run_id)
            call(port, "n1", run_id, result(held[0]))
            # What clusteradmin stop writes: who, then why.
            home.stop_request(run_id).write_text("alice@host\ndisk full on the master\n")
            deadline = time.monotonic() + 10
            reply = call(port, "n1", run_id, held=1)
            while reply.verb != protocol.ABORT and time.monotonic() < deadline:
                time.sleep(0.1)
                reply = call(port, "n1", run_id, held=1)
            assert reply.reason == \
                "run aborted: stopped by alice@host: disk full on the master"
            assert master.wait(timeout=60) == 0
        finally:
            stop_master(master)
        wait_for(lambda: collector.received, 10, "the report's mail")
    report = (home.archive / run_id / "report.txt").read_text()
    assert "The run was stopped by alice@host: disk full on the master." in report, report
    assert "after 1 of 6 tests" in report
    assert QueueFile(home.queue(2), home.queue_lock(2)).read() == []  # dequeued
    assert not home.run_dir(run_id).exists() and not home.live(2).exists()
    assert not home.job_start(2).exists()
    info = info_lines(home, run_id)
    assert info["outcome"] == "aborted" and info["nodes"] == "1"
    assert "differences" not in info and "errors" not in info
    message = collector.received[0].message
    assert message["Subject"].startswith("STOPPED: ")
    assert "stopped by alice@host" in message.get_payload()
    assert not (home.tables / "current.tab").exists()  # no table changed


def test_disabled_nodes_get_no_work_and_are_not_lost(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    home.node_down("n2").write_text("disabled by bob at 2026-11-23T10:00:00Z\nflaky disk\n")
    port = free_port(5) + 2
    master = subprocess.Popen(argv(home, port, "max_failed_nodes=1"), stderr=subprocess.PIPE)
    try:
        run_id = wait_for_run(home, 2, port)
        # Disabled before the run: ABORT at its first call, no BUILD, no job.
        first = call(port, "n2", run_id)
        assert (first.verb, first.reason) == (protocol.ABORT, "node n2 is disabled")
        assert call(port, "n2", run_id).verb == protocol.ABORT
        # n3 and n4 take a job each, then are disabled while they hold it: were they
        # counted as lost, 2 > max_failed_nodes would end the run for another attempt.
        n3_held = join(port, "n3", run_id)
        n4_held = join(port, "n4", run_id)
        n1_held = join(port, "n1", run_id)
        assert n3_held and n4_held and n1_held
        for name in ("n3", "n4"):
            home.node_down(name).write_text("disabled by bob at 2026-11-23T10:01:00Z\n")
        time.sleep(0.6)  # the master rereads nodes/ every pid_check_interval (0.2 s)
        for name in ("n3", "n4"):
            out = call(port, name, run_id, held=1)
            assert (out.verb, out.reason) == (protocol.ABORT, f"node {name} is disabled")
        # n1 runs everything, n3's job included.
        ran: list[str] = []
        held = n1_held
        for _ in range(20):
            ran += held
            reply = call(port, "n1", run_id, *(result(n) for n in held))
            if reply.verb != protocol.JOBS:
                break
            held = [Job.parse(line).name for line in reply.jobs]
        assert n3_held[0] in ran and n4_held[0] in ran and len(ran) == 6
        assert run_to_the_end(port, "n1", run_id, [], MD5)[-1] == protocol.ABORT
        assert master.wait(timeout=60) == 0
    finally:
        stop_master(master)
    info = info_lines(home, run_id)
    assert info["outcome"] == "done" and info["nodes"] == "1", info
    report = (home.archive / run_id / "report.txt").read_text()
    assert "on 1 nodes" in report and "n3" not in report and "n4" not in report


def test_a_master_taking_over_rewrites_live_status_with_the_runs_true_start(
        tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    settings = ("pid_stale=600",)
    first = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.DEVNULL)
    try:
        run_id = wait_for_run(home, 2, port)
        before = live_when(home, bool, "the first master's live.2.json", 30)
        join(port, "n1", run_id)
        time.sleep(2.5)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        stop_master(first)
    killed_at = time.time()
    stale = live(home)
    assert stale is not None and stale["run"] == run_id  # a killed master's file stays
    # One invocation clears the dead master's PID file, the next takes the run over.
    clear = subprocess.run(argv(home, port, *settings), capture_output=True, timeout=60)
    assert clear.returncode == 0
    second = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.DEVNULL)
    try:
        wait_for_run(home, 2, port)
        after = live_when(home, lambda s: bool(s["updated"] > killed_at),
                          "the successor's live.2.json", 30)
        assert after["run"] == run_id
        # The run's start as the first master saw it (the successor counts every
        # master's time and the gap), not the takeover's.
        assert abs(after["started"] - before["started"]) < 2.0, (before, after)
        assert after["updated"] - after["started"] >= 2.5
        home.stop_request(run_id).write_text("carol\n")
        assert second.wait(timeout=60) == 0
    finally:
        stop_master(second)
    assert not home.live(2).exists()
    assert "The run was stopped by carol." in (home.archive / run_id / "report.txt").read_text()
