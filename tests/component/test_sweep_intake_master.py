"""A real clustermaster serving a real sweep run (pushed with clusterpush.py --sweep) to a
scripted node over TCP: the node's bundles are taken, an invalid task is put back, every try
is in sweep-attempts.tsv; a master SIGKILLed mid-run is replaced by one that counts the
tries from that file, so the task's next invalid try is its last (docs/sweeps.md section 9).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from cluster.home import Home
from cluster.records import Job
from cluster.sweep.attempts import read_attempts
from cluster.wire import protocol
from tests.component.scripted_nodes import (
    listening,
    master_argv,
    request,
    signed_talk,
    wait_for_run,
)
from tests.helpers import REPO, free_port, reaped, wait_for

INSTANCE = "00112233aabbccdd"
SWEEP = """command = "echo {x}"
timeout = 10
retries = 1
[axes]
x = ["good1", "bad", "good2"]
[results]
log = "stdout"
[validate]
match = { log = "good" }
"""


def push_sweep(tmp_path: Path) -> Home:
    home = Home(tmp_path / "home")
    home.create()
    folder = tmp_path / "mysweep"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP)
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", "alice", "--copy", "--sweep",
                           str(folder / "sweep.toml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return home


class Node:
    """A scripted node ``n1`` that answers each task with ``echo <its x>``'s stdout."""

    def __init__(self, home: Home, port: int, run_id: str) -> None:
        self.home, self.port, self.run_id = home, port, run_id
        self.count = 0
        self.stdout: dict[str, bytes] = {}  # task id -> what its command prints

    def call(self, *lines: str) -> protocol.Reply:
        data = signed_talk(self.port, request("n1", self.run_id, "slots 4", "jobs 0 0",
                                              *lines))
        return protocol.parse_reply(data)

    def learn(self, reply: protocol.Reply) -> list[str]:
        """The tasks of a JOBS reply; what each prints, read off its command."""
        tasks = []
        for line in reply.jobs:
            job = Job.parse(line)
            word = next(w for w in ("good1", "good2", "bad") if w in job.command)
            self.stdout[job.name] = f"{word}\n".encode()
            tasks.append(job.name)
        return tasks

    def send(self, tasks: list[str]) -> protocol.Reply:
        """Upload a bundle of ``tasks``' results, then call with it."""
        self.count += 1
        name = f"n1.{INSTANCE}.{self.count}.tar"
        manifest = {"node": "n1", "tasks": [
            {"task": t, "start": 1700000000.0, "runtime": 0.1, "exit": 0, "failed": "",
             "files": {"log": [len(self.stdout[t]), hashlib.md5(self.stdout[t]).hexdigest()]}}
            for t in tasks]}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for member, data in [("tasks.json", json.dumps(manifest).encode()),
                                 *((f"{t}/log", self.stdout[t]) for t in tasks)]:
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        incoming = self.home.run_dir(self.run_id) / "results" / "incoming"
        (incoming / f".{name}.tmp").write_bytes(buffer.getvalue())
        os.rename(incoming / f".{name}.tmp", incoming / name)  # as a transport uploads
        return self.call(f"bundle {name}",
                         *(f"result {t} 0 0.10 0.00 0.00 {'a' * 32} sweep" for t in tasks))


def test_a_real_master_takes_bundles_retries_and_a_successor_counts_the_tries(
        tmp_path: Path) -> None:
    home = push_sweep(tmp_path)
    port = free_port(5)
    settings = ("connection_deadline=5", "heartbeat_timeout=60")
    with reaped(subprocess.Popen(master_argv(home, port, *settings, priority=0),
                                 stderr=subprocess.DEVNULL, text=True)) as master:
        run_id = wait_for_run(home, 0, port)
        node = Node(home, port, run_id)
        assert node.call().verb == protocol.BUILD
        tasks = node.learn(node.call())
        assert len(tasks) == 3
        bad = next(t for t in tasks if node.stdout[t] == b"bad\n")
        node.send(tasks)
        run_dir = home.run_dir(run_id)
        attempts = list(read_attempts(run_dir / "sweep-attempts.tsv"))
        assert sorted((a.task == bad, a.status, a.attempt, a.final) for a in attempts) == [
            (False, "ok", 1, True), (False, "ok", 1, True),
            (True, "invalid: result log has no match for 'good'", 1, False)]
        for task in tasks:
            placed = run_dir / "results" / task
            assert placed.is_dir() == (task != bad)
        assert os.listdir(run_dir / "results" / "incoming") == []
        master.kill()  # SIGKILL mid-run: the bad task has one try left
        master.wait()
    # The dead master's PID file: one invocation clears it, the next takes the run over.
    argv = master_argv(home, port, *settings, priority=0)
    assert subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    with reaped(subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)) as successor:
        wait_for(lambda: listening(port), 30, "the successor to listen")
        # The node rejoins (BUILD, then built): the one task left is handed out again.
        assert node.call().verb == protocol.BUILD
        assert node.learn(node.call()) == [bad]
        node.send([bad])
        attempts = list(read_attempts(home.run_dir(run_id) / "sweep-attempts.tsv"))
        assert [(a.attempt, a.final) for a in attempts if a.task == bad] == [
            (1, False), (2, True)]  # the successor counted the first try
        assert (home.run_dir(run_id) / "results" / bad / "log").read_bytes() == b"bad\n"
        # Every task has its result: the run ends (its end steps are another part's).
        assert node.call().verb in (protocol.UPLOAD, protocol.ABORT)
        successor.kill()
        _, err = successor.communicate(timeout=30)
    assert "3 tries of 3 tasks read from sweep-attempts.tsv" in err
