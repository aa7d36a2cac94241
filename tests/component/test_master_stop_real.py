"""A real clustermaster told to stop (SIGTERM) in the middle of a run: it syncs its journal,
removes its PID file and exits 143, and the next invocation takes the run over at once,
with seed 000's five-minute wait (pid_wait 300) configured; only a master that died (SIGKILL)
leaves its PID file, and the next invocation waits for it saying so.  A taker stopped in
that wait puts the file back as it found it.  Real processes, real TCP, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from cluster import configfile
from cluster.config import Config
from cluster.home import Home
from cluster.master.files.pidformat import parse
from cluster.master.run import invocation
from cluster.records import Job
from cluster.runtime import proc
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    listening,
    make_home,
    master_argv,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import free_port, wait_for

PRIORITY = 2
MD5 = "0123456789abcdef0123456789abcdef"
#: Seed 000's takeover wait, as configured by default: the test would wait it out if the
#: next invocation waited for a master that stopped.
SEED_WAIT = "pid_wait=300"


def _master(home: Home, port: int, name: str) -> subprocess.Popen[bytes]:
    log = open(home.root / f"{name}.out", "ab")  # noqa: SIM115 -- closed below
    try:
        return proc.spawn(master_argv(home, port, SEED_WAIT, "pid_check_interval=0.2",
                                      "heartbeat_timeout=60"), stdout=log, stderr=log)
    finally:
        log.close()


def _pid_line(home: Home) -> str | None:
    try:
        return parse(home.pid_file(PRIORITY).read_text())[0]
    except FileNotFoundError:
        return None


def _log(home: Home) -> str:
    return (home.log_dir / f"clustermaster.{PRIORITY}.log").read_text()


def _journaled(home: Home) -> int:
    try:
        return len(home.results(PRIORITY).read_text().splitlines()[1:])
    except FileNotFoundError:
        return 0


def _report_some(port: int, run_id: str) -> int:
    """A scripted node takes a batch of jobs and reports them; how many it reported."""
    assert protocol.parse_reply(signed_talk(port, request(
        "n1", run_id, "slots 4", "jobs 0 0"))).verb == protocol.BUILD
    reply = protocol.parse_reply(signed_talk(port, request("n1", run_id, "slots 4",
                                                           "jobs 0 0")))
    held = [Job.parse(line).name for line in reply.jobs]
    assert held
    lines = [f"result {name} 0 0.10 0.00 0.00 {MD5} gs" for name in held]
    signed_talk(port, request("n1", run_id, "slots 4", "jobs 0 0", *lines))
    return len(held)


def _stop(child: subprocess.Popen[bytes], signum: int) -> int:
    child.send_signal(signum)
    return child.wait(timeout=30)


def test_a_stopped_master_frees_its_pid_file_and_the_next_takes_over_at_once(
        tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", priority=PRIORITY)
    port = free_port(5) + PRIORITY
    first = _master(home, port, "first")
    try:
        run_id = wait_for_run(home, PRIORITY, port)
        reported = _report_some(port, run_id)
        wait_for(lambda: _journaled(home) >= reported, 10, "the results journaled")
        assert _pid_line(home) == str(first.pid)
        assert _stop(first, signal.SIGTERM) == 128 + signal.SIGTERM
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # It removed its own PID file and left the run as it was: job.start, the job list,
    # the journal and the queue line.
    assert _pid_line(home) is None
    assert home.job_start(PRIORITY).exists() and home.jobs(PRIORITY).exists()
    assert _journaled(home) >= reported
    assert home.queue(PRIORITY).read_text().strip() == "auto nightly gs"
    log = _log(home)
    assert f"run {run_id}: stop requested (SIGTERM)" in log
    assert f"clustermaster {first.pid} stopped by SIGTERM, leaving no PID file" in log

    second = _master(home, port, "second")
    try:
        # At once, although pid_wait is 300 s: no master died.
        wait_for(lambda: f"run {run_id}: taking over" in _log(home), 30,
                 "the next invocation to take the run over")
        wait_for(lambda: listening(port), 30, "the next master to listen")
        assert "takes over, waits" not in _log(home)
        assert _pid_line(home) == str(second.pid)

        # Killed, it cannot remove its file: the next one must wait, and says why.
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert _pid_line(home) == str(second.pid)
    third = _master(home, port, "third")
    try:
        wait_for(lambda: f"clustermaster {second.pid} died without removing its PID file"
                 in _log(home), 30, "the takeover of the dead master's file")
        assert f"pid {third.pid} takes over, waits 300s" in _log(home)
        wait_for(lambda: _pid_line(home) == str(third.pid), 10, "the taker's pid in the file")
        # Stopped in its wait, the taker puts the file back: the master is as dead as before.
        assert _stop(third, signal.SIGTERM) == 128 + signal.SIGTERM
    finally:
        if third.poll() is None:
            third.kill()
            third.wait()
    assert _pid_line(home) == str(second.pid)
    assert f"pid {third.pid} stopped during its takeover" in _log(home)


def _config(home: Home, port: int) -> Config:
    """master_argv's settings, for an invocation in this process."""
    return configfile.load(None, {"home": str(home.root), "base_port": str(port - PRIORITY),
                              "gs_configs": "ppmraw.72.0 pbmraw.72.0", "pid_wait": "300",
                              "monitor_port": str(free_port())})


@pytest.mark.parametrize("fork_killed", [False, True],
                         ids=["list-finished", "fork-killed-too"])
def test_a_stop_during_the_job_list_leaves_the_run_to_the_next_master(
        tmp_path: Path, fork_killed: bool) -> None:
    """SIGTERM while build.py's fork makes the job list: the master finishes that step
    (or, when the same signal killed the fork -- the supervisor signals the master's whole
    process group -- does not take the failed step for a failed run), then exits 143
    leaving no PID file, the run unstarted but queued, and no report: the next invocation
    serves it.  In this process: invoke as clustermaster.py calls it, real signals."""
    home = make_home(tmp_path / "home", priority=PRIORITY)
    port = free_port(5) + PRIORITY
    cfg = _config(home, port)

    def job_list_main(args: list[str]) -> int:
        # The fork of the master: the stop reaches the master while the list is made.
        os.kill(os.getppid(), signal.SIGTERM)
        if fork_killed:
            os.kill(os.getpid(), signal.SIGTERM)  # as the group's signal kills the fork
        from cluster.cli import build
        return build.main(args)

    assert invocation.invoke(cfg, PRIORITY, job_list_main=job_list_main) == \
        128 + signal.SIGTERM
    assert _pid_line(home) is None
    assert home.queue(PRIORITY).read_text().strip() == "auto nightly gs"
    assert not (home.archive.exists() and any(home.archive.iterdir()))  # not abandoned
    assert home.job_start(PRIORITY).exists()
    assert home.jobs(PRIORITY).exists() is not fork_killed  # finished, or left to redo
    # The next invocation serves the run at once (pid_wait is 300 s).
    second = _master(home, port, "second")
    try:
        wait_for(lambda: listening(port) and home.jobs(PRIORITY).exists(), 30,
                 "the next master to serve the run")
        assert "takes over, waits" not in _log(home)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
