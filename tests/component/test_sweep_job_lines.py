"""Sweep job lines (cluster.jobs.sweepjobs) run by the node's real slot shells
(cluster.node.slots, /bin/sh, base64, timeout): each task's stdout, folder and exit status
are what running its expanded command by hand in a folder of its own gives, hostile values
and names included, and nothing is written outside the task's folder."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from cluster.jobs.sweepjobs import sweep_jobs
from cluster.node.slots import Finished, SlotPool
from cluster.records import TEMP, TREE_DIR, Job
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sweep" / "sweep.toml"


def run_jobs(jobs: list[Job], temp: Path, tree: Path, slots: int = 2,
             timeout: float = 60.0) -> dict[str, Finished]:
    """Run ``jobs`` in a real SlotPool as a node does (placeholders replaced)."""
    pool = SlotPool(slots, dict(os.environ), timeout, kill_grace=1.0)
    done: dict[str, Finished] = {}
    pending = list(jobs)
    end = time.monotonic() + 120
    try:
        while (pending or pool.running()) and time.monotonic() < end:
            while pending and pool.free():
                job = pending[0]
                command = job.command.replace(TEMP, str(temp)).replace(TREE_DIR, str(tree))
                if not pool.start(job, command, time.monotonic()):
                    break
                pending.pop(0)
            for finished in pool.wait(0.2):
                done[finished.job.name] = finished
            pool.check_timeouts(time.monotonic())
    finally:
        pool.close()
    assert len(done) == len(jobs)
    return done


def by_hand(command: str, inputs: tuple[tuple[str, str], ...], folder: Path,
            tree: Path) -> tuple[bytes, int]:
    """Run ``command`` as a user would: in a fresh folder holding its inputs."""
    folder.mkdir(parents=True)
    for name, text in inputs:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(text.encode())
    done = subprocess.run(["sh", "-c", command], cwd=folder, capture_output=True,
                          env={**os.environ, "CLUSTER_SWEEP_DIR": str(tree)}, check=False)
    return done.stdout, done.returncode


def toml_str(text: str) -> str:
    """``text`` as a TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
    return f'"{escaped}"'


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_example_sweeps_tasks_give_what_running_them_by_hand_gives(tmp_path: Path
                                                                      ) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(EXAMPLE.parent, tree)
    spec = load(tree / "sweep.toml")
    temp = tmp_path / "temp"
    temp.mkdir()
    jobs = list(sweep_jobs(spec))
    done = run_jobs(jobs, temp, tree)
    expected = list(tasks(spec))
    assert len(expected) == len(jobs) >= 50
    for task in expected:
        stdout, status = by_hand(task.command, task.inputs, tmp_path / "hand" / task.task_id,
                                 tree)
        assert done[task.task_id].exit_status == status == 0
        out = temp / f"{task.task_id}.out"
        assert hashlib.md5(out.read_bytes()).hexdigest() == hashlib.md5(stdout).hexdigest()
        assert stdout.startswith(f"task {task.number}: ".encode())  # config.ini was read
        assert files(temp / task.task_id) == files(tmp_path / "hand" / task.task_id)
        assert (temp / f"{task.task_id}.log").read_text() == "sweep\n"


def test_hostile_values_and_names_stay_inside_the_task_folder(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    hostile = ["a b;touch ../../pwned1", "$(touch ../../pwned2)", "`touch pwned3`",
               "it's", '"q"', "__bin__ __temp__", "-n", "", "\\", "*", "{v}", "x\ty"]
    command = ("printf '%s|%s|%s\\n' {v} \"$CLUSTER_SLOT\" \"$(cat 'in put/$x')\"; "
               "ls -A | LC_ALL=C sort")
    (tree / "sweep.toml").write_text(
        f"command = {toml_str(command)}\n"
        "timeout = 20\n"
        "[axes]\n"
        f"v = [{', '.join(toml_str(v) for v in hostile)}]\n"
        "[inputs]\n"
        "\"in put/$x\" = \"{v} $(touch pwned4)\"\n"
        "\"$(touch pwned5)\" = \"\"\n")
    spec = load(tree / "sweep.toml")
    temp = tmp_path / "run" / "temp"
    temp.mkdir(parents=True)
    jobs = list(sweep_jobs(spec))
    done = run_jobs(jobs, temp, tree)
    for task in tasks(spec):
        value = task.row.values[0]
        out = (temp / f"{task.task_id}.out").read_text()
        shown, slot, content = out.split("\n", 1)[0].split("|")
        assert shown == value and slot in ("1", "2")
        assert content == f"{value} $(touch pwned4)"
        assert out.split("\n", 1)[1] == "$(touch pwned5)\nin put\n"
        assert done[task.task_id].exit_status == 0
    assert sorted(p.name for p in tmp_path.rglob("pwned*")) == []


def test_a_task_past_its_timeout_is_killed_and_says_so(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "sweep.toml").write_text("command = 'echo start; sleep {s}; echo end'\n"
                                     "timeout = 0.5\n[axes]\ns = ['0', '30']\n")
    spec = load(tree / "sweep.toml")
    temp = tmp_path / "temp"
    temp.mkdir()
    started = time.monotonic()
    done = run_jobs(list(sweep_jobs(spec)), temp, tree)
    assert time.monotonic() - started < 10
    quick, slow = tasks(spec)
    assert done[quick.task_id].exit_status == 0
    assert (temp / f"{quick.task_id}.out").read_text() == "start\nend\n"
    assert done[slow.task_id].exit_status == 124
    assert (temp / f"{slow.task_id}.out").read_text() == "start\n"
    assert (temp / f"{slow.task_id}.log").read_text() == "sweep\nkilled: timeout\n"
