"""A sweep's check scripts off the request path (docs/sweeps.md section 9, "The check
pool"): a real clustermaster serving a pushed sweep to a scripted node over TCP.  One task's
check is slow (it waits for a gate file, or one second); every other task's result is
journaled while it waits, the node's calls are answered at once, and the slow task is
recorded once its check ends.  A master SIGKILLed while a check is held is replaced by one
that judges the held try again."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
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

INSTANCE = "0011223344556677"
WORDS = ("slow", "a", "b", "c", "d", "e")
SWEEP = f"""command = "echo {{x}}"
timeout = 60
[axes]
x = {json.dumps(list(WORDS))}
[results]
log = "stdout"
[validate]
script = "check.sh"
"""
#: The slow task's check waits for the gate file named in GATE (at most 30 s), or, without
#: it, sleeps one second.
CHECK = """#!/bin/sh
if grep -q slow "$1/log"; then
    if [ -n "$GATE" ]; then
        i=0
        while [ ! -e "$GATE" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    else
        sleep 1
    fi
fi
exit 0
"""


def push_sweep(tmp_path: Path) -> Home:
    home = Home(tmp_path / "home")
    home.create()
    folder = tmp_path / "checked"
    folder.mkdir()
    (folder / "sweep.toml").write_text(SWEEP)
    (folder / "check.sh").write_text(CHECK)
    (folder / "check.sh").chmod(0o755)
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", "alice", "--copy", "--sweep",
                           str(folder / "sweep.toml")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return home


class Node:
    """A scripted node ``n1`` answering each task with ``echo <its x>``'s stdout, its
    bundles folders moved into the master home (as a local node's)."""

    def __init__(self, home: Home, port: int, run_id: str) -> None:
        self.home, self.port, self.run_id = home, port, run_id
        self.count = 0
        self.word: dict[str, str] = {}

    def call(self, *lines: str) -> tuple[protocol.Reply, float]:
        """A call; its reply and how long it took."""
        began = time.monotonic()
        data = signed_talk(self.port, request("n1", self.run_id, "slots 8", "jobs 0 0",
                                              *lines))
        return protocol.parse_reply(data), time.monotonic() - began

    def learn(self, reply: protocol.Reply) -> None:
        for line in reply.jobs:
            job = Job.parse(line)
            self.word[job.name] = next(w for w in WORDS if f"echo {w}" in job.command)

    def send(self, tasks: list[str]) -> tuple[protocol.Reply, float]:
        self.count += 1
        name = f"n1.{INSTANCE}.{self.count}.d"
        staging = self.home.root / f".{name}"
        staging.mkdir()
        manifest = []
        for task in tasks:
            data = f"{self.word[task]}\n".encode()
            (staging / task).mkdir()
            (staging / task / "log").write_bytes(data)
            manifest.append({"task": task, "start": 1700000000.0, "runtime": 0.1, "exit": 0,
                             "failed": "",
                             "files": {"log": [len(data), hashlib.md5(data).hexdigest()]}})
        (staging / "tasks.json").write_text(json.dumps({"node": "n1", "tasks": manifest}))
        os.rename(staging, self.home.run_dir(self.run_id) / "results" / "incoming" / name)
        return self.call(f"bundle {name}",
                         *(f"result {t} 0 0.10 0.00 0.00 {'a' * 32} sweep" for t in tasks))

    def by_word(self, word: str) -> str:
        return next(t for t, w in self.word.items() if w == word)


def journaled(home: Home) -> set[str]:
    """The tasks with a result in the running run's journal."""
    try:
        text = home.results(0).read_text()
    except FileNotFoundError:
        return set()
    return {line.split(" ")[2] for line in text.splitlines() if " result " in line}


def start_run(tmp_path: Path, gate: Path | None) -> tuple[Home, int, list[str], dict[str, str]]:
    home = push_sweep(tmp_path)
    port = free_port(3)
    env = dict(os.environ)
    if gate is not None:
        env["GATE"] = str(gate)  # the master's environment reaches its check scripts
    else:
        env.pop("GATE", None)
    settings = ("connection_deadline=10", "heartbeat_timeout=60", "sweep_check_workers=2")
    return home, port, master_argv(home, port, *settings, priority=0), env


def test_a_slow_check_delays_none_of_the_other_tasks(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    home, port, argv, env = start_run(tmp_path, gate)
    with reaped(subprocess.Popen(argv, stderr=subprocess.DEVNULL, env=env)) as master:
        run_id = wait_for_run(home, 0, port)
        node = Node(home, port, run_id)
        assert node.call()[0].verb == protocol.BUILD
        node.learn(node.call()[0])
        assert sorted(node.word.values()) == sorted(WORDS)
        slow = node.by_word("slow")
        others = [t for t in node.word if t != slow]
        # The slow task's result first, alone: the call is answered without its check.
        reply, took = node.send([slow])
        assert reply.verb != protocol.ABORT and took < 5
        reply, took = node.send(others)
        assert reply.verb != protocol.ABORT and took < 5
        # Every other task is judged and journaled while the slow check still waits.
        wait_for(lambda: set(others) <= journaled(home), 20, "the other tasks' results")
        assert slow not in journaled(home)
        run_dir = home.run_dir(run_id)
        assert (run_dir / "results" / ".pending").is_dir()
        assert [p for p in os.listdir(run_dir / "results" / ".pending")
                if p.startswith(slow)]  # held: its files and its facts
        # Nothing left to hand out, the slow task not done: the node is told to wait.
        assert node.call()[0].verb == protocol.CONTINUE
        gate.touch()
        wait_for(lambda: slow in journaled(home), 20, "the slow task's result")
        attempts = list(read_attempts(run_dir / "sweep-attempts.tsv"))
        assert sorted((a.task, a.status, a.attempt, a.final) for a in attempts) == sorted(
            (t, "ok", 1, True) for t in node.word)
        assert attempts[-1].task == slow  # settled last, after its check
        assert (run_dir / "results" / slow / "log").read_bytes() == b"slow\n"
        assert os.listdir(run_dir / "results" / ".pending") == []
        # Every task has its result: the run ends.
        assert node.call()[0].verb in (protocol.UPLOAD, protocol.ABORT)
        master.kill()


def test_a_one_second_check_on_one_task_and_a_successor_judges_a_held_try(
        tmp_path: Path) -> None:
    home, port, argv, env = start_run(tmp_path, None)
    with reaped(subprocess.Popen(argv, stderr=subprocess.DEVNULL, env=env)) as master:
        run_id = wait_for_run(home, 0, port)
        node = Node(home, port, run_id)
        assert node.call()[0].verb == protocol.BUILD
        node.learn(node.call()[0])
        slow = node.by_word("slow")
        others = [t for t in node.word if t != slow]
        sent = time.monotonic()
        node.send([slow])
        node.send(others)
        wait_for(lambda: set(others) <= journaled(home), 20, "the other tasks' results")
        # The one-second check is still running: the others did not wait for it.
        assert slow not in journaled(home) and time.monotonic() - sent < 1.0
        master.kill()  # SIGKILL with the slow try held
        master.wait()
    run_dir = home.run_dir(run_id)
    assert [p for p in os.listdir(run_dir / "results" / ".pending") if p.startswith(slow)]
    # The dead master's PID file: one invocation clears it, the next takes the run over.
    assert subprocess.run(argv, capture_output=True, timeout=60, env=env).returncode == 0
    with reaped(subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                                 env=env)) as successor:
        wait_for(lambda: listening(port), 30, "the successor to listen")
        # Judged again; every task has its result and no node is left: the run ends and
        # is archived with the held try's files and its one try.
        archive = home.archive / run_id
        wait_for(lambda: (archive / "results.tsv").exists(), 60, "the run's archive")
        _, err = successor.communicate(timeout=60)
    assert successor.returncode == 0, err
    attempts = list(read_attempts(archive / "sweep-attempts.tsv"))
    assert sorted((a.task, a.status, a.attempt) for a in attempts) == sorted(
        (t, "ok", 1) for t in node.word)
    assert (archive / "results" / slow / "log").read_bytes() == b"slow\n"
    assert not (archive / "results" / ".pending").exists() or \
        os.listdir(archive / "results" / ".pending") == []
    assert "1 tries held for their check script by an earlier master, judged again" in err
