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


def held_folders(results: Path) -> list[str]:
    """The task folders held under ``results/.pending/`` (its ``.holds`` file aside)."""
    pending = results / ".pending"
    return [e for e in os.listdir(pending) if not e.startswith(".")] \
        if pending.is_dir() else []


def journaled(home: Home) -> set[str]:
    """The tasks with a result in the running run's journal."""
    try:
        text = home.results(0).read_text()
    except FileNotFoundError:
        return set()
    return {line.split(" ")[2] for line in text.splitlines() if " result " in line}


def start_run(tmp_path: Path, gate: Path | None) -> tuple[Home, int, list[str], dict[str, str]]:
    home = push_sweep(tmp_path)
    port = free_port(5)
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
        assert held_folders(run_dir / "results") == [slow]  # held: its files
        assert f'"task": "{slow}"' in (run_dir / "results" / ".pending" / ".holds").read_text()
        # Nothing left to hand out, the slow task not done: the node is told to wait.
        assert node.call()[0].verb == protocol.CONTINUE
        gate.touch()
        wait_for(lambda: slow in journaled(home), 20, "the slow task's result")
        attempts = list(read_attempts(run_dir / "sweep-attempts.tsv"))
        assert sorted((a.task, a.status, a.attempt, a.final) for a in attempts) == sorted(
            (t, "ok", 1, True) for t in node.word)
        assert attempts[-1].task == slow  # settled last, after its check
        assert (run_dir / "results" / slow / "log").read_bytes() == b"slow\n"
        assert held_folders(run_dir / "results") == []
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
    assert held_folders(run_dir / "results") == [slow]
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
    assert held_folders(archive / "results") == []
    assert "1 tries held for their check script by an earlier master, judged again" in err


# ---------------------------------------------------------------------- the intake alone
SLOW_SWEEP = """command = "echo {x}"
timeout = 30
retries = 1
[axes]
x = ["one", "two"]
[results]
log = "stdout"
[validate]
script = "check.sh"
"""


def _intake_run(tmp_path: Path, check: str) -> tuple[object, object, list[str]]:
    """An intake with a check pool of two workers over a run state whose node n1 holds
    both tasks; the intake, the state and the tasks."""
    from cluster.master.serve.sweepintake import SweepIntake
    from cluster.master.state.runcore import Settings
    from cluster.master.state.runstate import RunState
    from cluster.sweep import spec as sweepspec

    folder = tmp_path / "snapshot" / "s"
    folder.mkdir(parents=True)
    (folder / "sweep.toml").write_text(SLOW_SWEEP)
    (folder / "check.sh").write_text(check)
    (folder / "check.sh").chmod(0o755)
    spec = sweepspec.load(folder / "sweep.toml")
    tasks = ["t1", "t2"]
    state = RunState("run-1", [Job(t, f"__temp__/{t}.log", "true") for t in tasks], 0.0,
                     Settings(batch_per_slot=1, speculate_tail=False))
    run_dir = tmp_path / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    intake = SweepIntake.open(run_dir, spec, 1 << 20, state, workers=2)
    assert state.handle(protocol.Request(node="n1", job_id="run-1", slots=2), 0.0
                        ).reply.verb == protocol.BUILD
    reply = state.handle(protocol.Request(node="n1", job_id="run-1", slots=2,
                                          built="run-1"), 0.0).reply
    assert [j.split(" ", 1)[0] for j in reply.jobs] == tasks
    return intake, state, tasks


def _send(intake, state, tmp_path: Path, node: str, tasks: list[str], n: int) -> bytes:
    """A folder bundle of ``tasks`` (each printing its name) through the intake and the
    state; the journal lines."""
    name = f"{node}.{INSTANCE}.{n}.d"
    incoming = tmp_path / "runs" / "run-1" / "results" / "incoming"
    folder = incoming / name
    folder.mkdir()
    entries = []
    for t in tasks:
        (folder / t).mkdir()
        (folder / t / "log").write_bytes(f"{t}\n".encode())
        entries.append({"task": t, "start": 1.0, "runtime": 0.1, "exit": 0, "failed": "",
                        "files": {"log": [len(t) + 1, hashlib.md5(f"{t}\n".encode())
                                          .hexdigest()]}})
    (folder / "tasks.json").write_text(json.dumps({"node": node, "tasks": entries}))
    req = protocol.Request(node=node, job_id="run-1", slots=2, built="run-1", bundle=name,
                           result_lines=tuple(f"{t} 0 0.10 0.00 0.00 {'a' * 32} sweep"
                                              for t in tasks))
    taken = intake.take(req, state)
    out = state.handle(taken, 1.0)
    intake.done(taken)
    return out.journal


def test_a_run_that_ends_with_a_try_held_records_it_failed_not_judged(
        tmp_path: Path) -> None:
    check = '#!/bin/sh\ncase "$1" in */t1) sleep 30;; esac\nexit 0\n'
    intake, state, tasks = _intake_run(tmp_path, check)
    try:
        assert _send(intake, state, tmp_path, "n1", tasks, 1) == b""  # both held
        assert state.nodes["n1"].held == {} and state.running == 0
        assert not state.all_results_in and state.pending == []  # not done, not handed out
        lines: list[bytes] = []
        wait_for(lambda: intake.settle(state, lines.append, 2.0) or lines, 10, "t2's check")
        assert b"".join(lines).decode() == \
            f"n1 result t2 0 0.10 0.00 0.00 {intake_md5('t2')} sweep\n"
        began = time.monotonic()
        assert intake.abandon(state, lines.append, 3.0, "aborted") == 1
        assert time.monotonic() - began < 5  # the sleeping check was ended, not waited for
        assert lines[-1].decode() == "n1 result t1 1 0.10 0.00 0.00 0 sweep\n"
        assert state.all_results_in
        run_dir = tmp_path / "runs" / "run-1"
        assert (run_dir / "results" / "t1" / "log").read_bytes() == b"t1\n"  # kept
        statuses = [(a.task, a.status, a.final) for a in
                    read_attempts(run_dir / "sweep-attempts.tsv")]
        assert statuses == [("t2", "ok", True),
                            ("t1", "failed: not judged (aborted)", True)]
        assert held_folders(run_dir / "results") == []
    finally:
        intake.close()


def test_an_invalid_held_try_is_tried_again_by_another_node(
        tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    check = (f'#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n'
             'grep -q t2 "$1/log"\n')  # t1 is invalid
    intake, state, tasks = _intake_run(tmp_path, check)
    try:
        assert _send(intake, state, tmp_path, "n1", ["t1"], 1) == b""
        # n2 joins; nothing is left to hand out, t1 is held (not held by n1 any more).
        state.handle(protocol.Request(node="n2", job_id="run-1", slots=1), 1.0)
        reply = state.handle(protocol.Request(node="n2", job_id="run-1", slots=1,
                                              built="run-1"), 1.0).reply
        assert reply.verb == protocol.CONTINUE
        gate.touch()
        lines: list[bytes] = []
        wait_for(lambda: intake.settle(state, lines.append, 2.0), 10, "t1's check")
        assert not lines  # invalid, a try left: nothing recorded
        assert state.tried_by("t1") == {"n1"} and state.pending[0] == "t1"
        reply = state.handle(protocol.Request(node="n2", job_id="run-1", slots=1,
                                              built="run-1"), 3.0).reply
        assert [j.split(" ", 1)[0] for j in reply.jobs] == ["t1"]  # another node's turn
        statuses = [(a.task, a.node, a.status, a.attempt, a.final) for a in read_attempts(
            tmp_path / "runs" / "run-1" / "sweep-attempts.tsv")]
        assert statuses == [("t1", "n1", "invalid: check.sh exited 1 (no output)", 1,
                             False)]
    finally:
        intake.close()


def intake_md5(task: str) -> str:
    from cluster.master.serve.sweepintake import files_md5
    return files_md5({"log": hashlib.md5(f"{task}\n".encode()).hexdigest()})
