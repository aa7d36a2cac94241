"""Runs are bounded: max_run_time across takeovers, lost nodes retried then reported.

A real clustermaster.py serves scripted nodes over real TCP; a node that "dies" stops
calling, as a killed one does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from cluster.home import Home
from cluster.master.files.attempts import Attempts
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    make_home,
    master_argv,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port, wait_for
from tests.smtp import smtp_server

MD5 = "0123456789abcdef0123456789abcdef"


def argv(home: Home, port: int, *settings: str) -> list[str]:
    return master_argv(home, port, "pid_check_interval=0.2", *settings, suffixed=True)


def join(port: int, node: str, run_id: str) -> list[str]:
    """BUILD, then ready: return the first batch of job names."""
    assert signed_talk(port, request(node, run_id)) == b"BUILD\n"
    reply = protocol.parse_reply(signed_talk(port, request(node, run_id, "slots 1", "jobs 0 0")))
    return [Job.parse(line).name for line in reply.jobs]


def keep_alive(port: int, node: str, run_id: str, held: int) -> bytes:
    """A call that sends no result: the node is busy with what it holds."""
    return signed_talk(port, request(node, run_id, "slots 1", f"jobs {held} {held}"))


def stay_until_exit(master: subprocess.Popen[bytes], port: int, node: str, run_id: str,
                    held: int, limit: float = 30.0) -> None:
    """Keep ``node`` alive in the run (a call every 0.3 s) until the master exits, for at
    most ``limit`` seconds; a call the master no longer answers is not an error."""
    deadline = time.monotonic() + limit
    while master.poll() is None and time.monotonic() < deadline:
        try:
            keep_alive(port, node, run_id, held)
        except OSError:
            pass
        time.sleep(0.3)


def test_a_run_past_max_run_time_ends_with_the_tests_not_run_listed(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    master = subprocess.Popen(argv(home, port, "max_run_time=3"), stderr=subprocess.PIPE)
    try:
        run_id = wait_for_run(home, 2, port)
        held = join(port, "n1", run_id)
        first = held[0]
        signed_talk(port, request("n1", run_id, "slots 1", "jobs 0 0",
                           f"result {first} 0 0.1 0 0 {MD5} gs"))
        stay_until_exit(master, port, "n1", run_id, 1)
        assert master.wait(timeout=30) == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    report = (home.archive / run_id / "report.txt").read_text()
    assert "ran out of time" in report and "max_run_time 3 s" in report, report
    assert "1 of 6 tests had a result" in report and "5 tests did not run:" in report
    assert first.replace("__", "/") not in report
    assert QueueFile(home.queue(2), home.queue_lock(2)).read() == []
    assert not (home.tables / "current.tab").exists()  # an incomplete run is no baseline


def test_max_run_time_counts_the_time_of_every_master(tmp_path: Path) -> None:
    """A master killed after 3.5 s of a 6 s run: its successor ends the run about 2.5 s
    later, not 6 s later."""
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    settings = ("max_run_time=6", "pid_stale=600")
    first = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.DEVNULL)
    try:
        run_id = wait_for_run(home, 2, port)
        join(port, "n1", run_id)
        started = time.monotonic()
        while time.monotonic() - started < 3.5:
            keep_alive(port, "n1", run_id, 1)
            time.sleep(0.3)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The dead master's PID file: one invocation clears it, the next resumes the run.
    clear = subprocess.run(argv(home, port, *settings), capture_output=True, timeout=60)
    assert clear.returncode == 0
    assert home.job_start(2).exists()
    resumed_at = time.monotonic()
    second = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.PIPE)
    try:
        wait_for_run(home, 2, port)
        stay_until_exit(second, port, "n1", run_id, 1)
        assert second.wait(timeout=30) == 0
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    took = time.monotonic() - resumed_at
    report = (home.archive / run_id / "report.txt").read_text()
    assert "ran out of time" in report, report
    assert took < 5.5, f"the successor served {took:.1f} s: it did not count the first's time"


def test_a_run_whose_nodes_all_die_is_retried_then_reported_failed(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    queue = QueueFile(home.queue(2), home.queue_lock(2))
    with smtp_server() as (collector, smtp_port):
        settings = ("no_node_timeout=2", "heartbeat_timeout=1", "max_tries=2",
                    "smtp_host=127.0.0.1", f"smtp_port={smtp_port}")
        master = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.PIPE)
        try:
            run_id = wait_for_run(home, 2, port)
            held = join(port, "n1", run_id)
            signed_talk(port, request("n1", run_id, "slots 1", "jobs 0 0",
                               f"result {held[0]} 0 0.1 0 0 {MD5} gs"))
            began = time.monotonic()  # the node now dies: it never calls again
            assert master.wait(timeout=30) == 0
            took = time.monotonic() - began
        finally:
            if master.poll() is None:
                master.kill()
                master.wait()
        assert took < 10, f"the run without nodes went on for {took:.1f} s"
        first = (home.archive / run_id / "report.txt").read_text()
        assert "lost its nodes; it is queued again" in first, first
        assert [s.line() for s in queue.read()] == ["auto nightly gs"]
        assert Attempts(home.per_priority("attempts", 2)).count("auto nightly gs") == 1
        assert collector.received == []  # a retry is not mailed
        # The second attempt: a new id, no node ever comes; it gives up and is reported.
        retry = subprocess.run(argv(home, port, *settings), capture_output=True, text=True,
                               timeout=60)
        assert retry.returncode == 0, retry.stderr
        archives = sorted(p.name for p in home.archive.iterdir())
        assert len(archives) == 2 and run_id in archives
        (second,) = [a for a in archives if a != run_id]
        text = (home.archive / second / "report.txt").read_text()
        assert "reported as failed" in text and "6 tests did not run" in text, text
        assert queue.read() == []
        assert not home.per_priority("attempts", 2).exists()
        wait_for(lambda: len(collector.received) == 1, 10, "the failure mail")
        assert collector.received[0].message["Subject"].startswith("FAILED:")


def test_a_run_that_loses_too_many_nodes_is_queued_again(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home")
    port = free_port(5) + 2
    settings = ("max_failed_nodes=1", "heartbeat_timeout=1", "no_node_timeout=600")
    master = subprocess.Popen(argv(home, port, *settings), stderr=subprocess.PIPE)
    try:
        run_id = wait_for_run(home, 2, port)
        for node in ("n1", "n2"):
            join(port, node, run_id)  # then silent: both are lost after 1 s
        stay_until_exit(master, port, "n3", run_id, 0)  # a live node: not a no-node retry
        assert master.wait(timeout=30) == 0
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    report = (home.archive / run_id / "report.txt").read_text()
    assert "lost 2 nodes, more than max_failed_nodes 1" in report, report
    assert "n1 (not heard from" in report and "n2 (not heard from" in report
    assert [s.line() for s in QueueFile(home.queue(2), home.queue_lock(2)).read()] == [
        "auto nightly gs"]
