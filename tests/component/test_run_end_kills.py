"""A run finishes exactly once: a real SIGKILL of the master at every end-of-run step.

The master is the real clustermaster.py, in a process that kills itself (SIGKILL, no
clean-up) at one point of the end of a run: after the end record is written, and before
and after each step is noted as done.  Before a step is noted means the step's work is done
and not recorded, the worst case for doing it twice.  Scripted nodes serve the run over
real TCP.  Then plain clustermaster invocations finish what is left, and the test checks
the one archive, the one report with the right counts, the one baseline rotation, the one
mail (two when the kill falls between sending and noting it: the documented window) and
an empty queue.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.master.files import ending
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.report.tab import read_tab
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    CONFIGS,
    FILES,
    make_home,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import REPO, free_port, wait_for
from tests.smtp import smtp_server

NEW_MD5 = "0123456789abcdef0123456789abcdef"
OLD_MD5 = "fedcba9876543210fedcba9876543210"

#: Runs clustermaster.py with EndRecord.create/mark patched to SIGKILL the process.
KILLER = """
import os, signal, sys
from cluster.master.files import ending
point, when = os.environ["KILL_AT"], os.environ["KILL_WHEN"]
create, mark = ending.EndRecord.create, ending.EndRecord.mark

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def patched_create(*args, **kwargs):
    record = create(*args, **kwargs)
    if point == "created":
        die()
    return record

def patched_mark(self, step):
    if step == point and when == "before":
        die()
    mark(self, step)
    if step == point and when == "after":
        die()

ending.EndRecord.create = staticmethod(patched_create)
ending.EndRecord.mark = patched_mark
from cluster.cli.clustermaster import main
sys.argv[0] = "clustermaster2.py"
sys.exit(main())
"""

KILL_POINTS = [("created", "after")] + [(step, when) for step in ending.STEPS
                                        for when in ("before", "after")]


def seed_baseline(home: Home, names: list[str]) -> tuple[bytes, bytes]:
    rows = []
    for i, name in enumerate(sorted(names)):
        md5 = OLD_MD5 if i < 4 else NEW_MD5
        rows.append(f"{name}\t0\t0.1\t0\t0\t0\t{md5}\tr0\tgs\told")
    current = ("\n".join(rows) + "\n").encode()
    previous = b"ex__old.ps.ppmraw.72.0\t0\t0.1\t0\t0\t0\t" + OLD_MD5.encode() + \
        b"\tr-1\tgs\tolder\n"
    (home.tables / "current.tab").write_bytes(current)
    (home.tables / "previous.tab").write_bytes(previous)
    return current, previous


def master_argv(home: Home, port: int, smtp_port: int) -> list[str]:
    return ["--home", str(home.root), "--set", f"base_port={port - 2}",
            "--set", "gs_configs=" + " ".join(CONFIGS), "--set", "connection_deadline=3",
            "--set", "linger=1", "--set", "heartbeat_timeout=60", "--set", "pid_wait=0.2",
            "--set", "smtp_host=127.0.0.1", "--set", f"smtp_port={smtp_port}"]


def serve_as_nodes(home: Home, port: int) -> str:
    """Two scripted nodes run the whole run; return its id."""
    run_id = wait_for_run(home, 2, port)
    held: dict[str, list[str]] = {"n1": [], "n2": []}
    told: dict[str, str] = {}
    for node in held:
        signed_talk(port, request(node, run_id))
    for _ in range(60):
        for node in held:
            if told.get(node) == protocol.ABORT:
                continue
            lines = [f"result {name} 0 0.10 0.00 0.00 {NEW_MD5} gs" for name in held[node]]
            try:
                data = signed_talk(port, request(node, run_id, "slots 2", "jobs 0 0", *lines))
            except OSError:
                return run_id  # the master is gone (killed at the end of the run)
            reply = protocol.parse_reply(data)
            held[node] = [Job.parse(line).name for line in reply.jobs]
            told[node] = reply.verb
        if all(v == protocol.ABORT for v in told.values()) and len(told) == 2:
            break
    return run_id


@pytest.mark.parametrize(("point", "when"), KILL_POINTS,
                         ids=[f"{w}-{p}" for p, w in KILL_POINTS])
def test_a_master_killed_at_any_end_step_ends_the_run_exactly_once(
        tmp_path: Path, point: str, when: str) -> None:
    home = make_home(tmp_path / "home")
    names = [f"ex__{f}.{c}" for f in FILES for c in CONFIGS]
    old_current, old_previous = seed_baseline(home, names)
    port = free_port(5) + 2
    with smtp_server() as (collector, smtp_port):
        argv = master_argv(home, port, smtp_port)
        env = {**os.environ, "KILL_AT": point, "KILL_WHEN": when,
               "PYTHONPATH": str(REPO)}
        killed = subprocess.Popen([sys.executable, "-c", KILLER, *argv], env=env,
                                  stderr=subprocess.PIPE, cwd=REPO)
        try:
            run_id = serve_as_nodes(home, port)
            assert killed.wait(timeout=60) == -9, killed.stderr.read() if killed.stderr else ""
        finally:
            if killed.poll() is None:
                killed.kill()
                killed.wait()
        assert (home.run_dir(run_id) / ending.FILE_NAME).exists()
        # Plain masters now: the first may only clear the dead one's PID file.
        queue = QueueFile(home.queue(2), home.queue_lock(2))
        for _ in range(4):
            done = subprocess.run([sys.executable, str(REPO / "clustermaster2.py"), *argv],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            if not queue.read() and not home.run_dir(run_id).exists():
                break
        assert queue.read() == []
        assert not home.run_dir(run_id).exists() and not home.job_start(2).exists()
        assert not home.jobs(2).exists() and not home.results(2).exists()
        archives = sorted(p.name for p in home.archive.iterdir())
        assert archives == [run_id]
        table = read_tab(home.archive / run_id / f"{run_id}.tab")
        assert sorted(table) == sorted(names)
        report = (home.archive / run_id / "report.txt").read_text()
        assert "ran 6 tests" in report and "on 2 nodes" in report, report
        assert "Differences in 4 of 6" in report, report
        # One rotation: previous2 is the old previous, previous the old current.
        assert (home.tables / "previous2.tab").read_bytes() == old_previous
        assert (home.tables / "previous.tab").read_bytes() == old_current
        assert sorted(read_tab(home.tables / "current.tab")) == sorted(names)
        assert all(row.md5 == NEW_MD5 for row in read_tab(home.tables / "current.tab").values())
        wait_for(lambda: len(collector.received) >= 1, 10, "the report mail")
        expected_mails = 2 if (point, when) == (ending.MAIL, "before") else 1
        assert len(collector.received) == expected_mails
        assert not list(home.tables.glob(".*.tmp"))
