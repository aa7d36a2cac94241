"""Sweep job lines (cluster.jobs.sweepjobs) run by the node's real slot shells
(cluster.node.slots, /bin/sh, ulimit), with the node's own steps around them (the task's
folder made by cluster.node.sweepresults.prepare_task, its results taken by an Outbox):
each task's results and exit status are what running its expanded command by hand in a
folder of its own gives, hostile values and names included; nothing is written outside
the task's folder, links are never taken, stdout and stderr stay apart, the sweep folder is
linked into the task's folder, and a command writing without end is stopped by the
file-size limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from cluster.jobs.sweepjobs import sweep_jobs
from cluster.node.slots import Finished, SlotPool
from cluster.node.sweepresults import (
    XFSZ_STATUS,
    Outbox,
    TaskResults,
    entries,
    prepare_task,
    stage,
)
from cluster.records import TEMP, TREE_DIR, Job
from cluster.sweep.expand import tasks
from cluster.sweep.spec import SweepSpec, load

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sweep" / "sweep.toml"
#: max_result_bytes of these runs (master.conf's default).
LIMIT = 64 << 20
INSTANCE = "0123456789abcdef"


def pairs(spec: SweepSpec) -> tuple[tuple[str, str], ...]:
    """The sweep's ``[results]`` as job.start's ``sweep_results`` carries them."""
    return tuple((r.name, r.source) for r in spec.results)


def run_jobs(jobs: list[Job], temp: Path, tree: Path, results: tuple[tuple[str, str], ...],
             slots: int = 2, timeout: float = 60.0, limit: int = LIMIT, take: bool = True
             ) -> tuple[dict[str, Finished], dict[str, TaskResults]]:
    """Run ``jobs`` in a real SlotPool as a node does: each task's folder made, the
    placeholders replaced, and when it ends its ``results`` taken into an Outbox (beside
    ``temp``) bounded by ``limit``.  Without ``take`` the results are only linked into
    ``<temp>/<id>.res/`` (what the node would take, before its limits) and the task's
    folder stays."""
    pool = SlotPool(slots, dict(os.environ), timeout, kill_grace=1.0)
    outbox = Outbox(temp.parent / "outbox", "n1", INSTANCE, limit)
    sweep_entries = entries(tree)
    done: dict[str, Finished] = {}
    taken: dict[str, TaskResults] = {}
    pending = list(jobs)
    end = time.monotonic() + 120
    try:
        while (pending or pool.running()) and time.monotonic() < end:
            while pending and pool.free():
                job = pending[0]
                command = job.command.replace(TEMP, str(temp)).replace(TREE_DIR, str(tree))
                prepare_task(temp / job.name, sweep_entries)
                if not pool.start(job, command, time.monotonic()):
                    break
                pending.pop(0)
            for finished in pool.wait(0.2):
                name = finished.job.name
                done[name] = finished
                if take:
                    taken[name] = outbox.take(name, temp / name, results,
                                              finished.exit_status, 0.0, 0.0)
                else:
                    (temp / f"{name}.res").mkdir()
                    for result, path in stage(temp / name, results):
                        os.link(path, temp / f"{name}.res" / result)
            pool.check_timeouts(time.monotonic())
    finally:
        pool.close()
    assert len(done) == len(jobs)
    return done, taken


def kept(result: TaskResults) -> dict[str, bytes]:
    """The files the node keeps of a task, by result name."""
    return {} if result.folder is None else files(result.folder)


def by_hand(command: str, inputs: tuple[tuple[str, str], ...], folder: Path,
            tree: Path) -> tuple[bytes, int]:
    """Run ``command`` as a user would: in a fresh folder holding its inputs and the
    sweep folder's files."""
    folder.mkdir(parents=True)
    for entry in tree.iterdir():
        (folder / entry.name).symlink_to(entry)
    for name, text in inputs:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(text.encode())
    done = subprocess.run(["sh", "-c", command], cwd=folder, capture_output=True,
                          env={**os.environ, "CLUSTER_SWEEP_DIR": str(tree)}, check=False)
    return done.stdout, done.returncode


def toml_str(text: str) -> str:
    """``text`` as a TOML basic string."""
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t")
               .replace("\n", "\\n"))
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
    jobs = list(sweep_jobs(spec, LIMIT))
    done, taken = run_jobs(jobs, temp, tree, pairs(spec))
    expected = list(tasks(spec))
    assert len(expected) == len(jobs) >= 50
    for task in expected:
        hand = tmp_path / "hand" / task.task_id
        stdout, status = by_hand(task.command, task.inputs, hand, tree)
        assert done[task.task_id].exit_status == status == 0
        assert stdout.startswith(f"task {task.number}: ".encode())  # config.ini was read
        # The results, taken under their names: the file and stdout, as by hand.
        assert kept(taken[task.task_id]) == {"log": stdout,
                                             "out": (hand / "out.txt").read_bytes()}
        assert not taken[task.task_id].failed
    # Nothing else is left: the task folders, stdout and stderr are gone, and no log was
    # written.
    assert list(temp.iterdir()) == []


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
        "\"$(touch pwned5)\" = \"\"\n"
        "[results]\nout = \"stdout\"\n")
    spec = load(tree / "sweep.toml")
    temp = tmp_path / "run" / "temp"
    temp.mkdir(parents=True)
    jobs = list(sweep_jobs(spec, LIMIT))
    done, taken = run_jobs(jobs, temp, tree, pairs(spec))
    for task in tasks(spec):
        value = task.row.values[0]
        out = kept(taken[task.task_id])["out"].decode()
        shown, slot, content = out.split("\n", 1)[0].split("|")
        assert shown == value and slot in ("1", "2")
        assert content == f"{value} $(touch pwned4)"
        # The inputs and the link to the sweep folder's one file.
        assert out.split("\n", 1)[1] == "$(touch pwned5)\nin put\nsweep.toml\n"
        assert done[task.task_id].exit_status == 0
    assert sorted(p.name for p in tmp_path.rglob("pwned*")) == []


def test_a_task_past_its_timeout_is_killed_and_says_so(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "sweep.toml").write_text("command = 'echo start; sleep {s}; echo end'\n"
                                     "timeout = 0.5\n[axes]\ns = ['0', '30']\n"
                                     "[results]\nout = 'stdout'\n")
    spec = load(tree / "sweep.toml")
    temp = tmp_path / "temp"
    temp.mkdir()
    started = time.monotonic()
    done, taken = run_jobs(list(sweep_jobs(spec, LIMIT)), temp, tree, pairs(spec),
                           timeout=0.5)  # the node's kill: job.start's job_timeout
    assert time.monotonic() - started < 10
    quick, slow = tasks(spec)
    assert done[quick.task_id].exit_status == 0 and not done[quick.task_id].killed
    assert kept(taken[quick.task_id]) == {"out": b"start\nend\n"}
    assert done[slow.task_id].killed  # readlog: a timeout (error 3)
    # What it wrote before it was killed is kept for reading.
    assert kept(taken[slow.task_id]) == {"out": b"start\n"}


def _one_task_sweep(tree: Path, command: str, results: dict[str, str],
                    inputs: dict[str, str] | None = None
                    ) -> tuple[list[Job], tuple[tuple[str, str], ...]]:
    """The jobs of a sweep of one task in ``tree``: ``command``, ``results``, ``inputs``."""
    tree.mkdir(parents=True, exist_ok=True)
    text = f"command = {toml_str(command)}\ntimeout = 20\n[axes]\nv = ['1']\n[results]\n"
    text += "".join(f"{toml_str(k)} = {toml_str(v)}\n" for k, v in results.items())
    if inputs:
        text += "[inputs]\n" + "".join(f"{toml_str(k)} = {toml_str(v)}\n"
                                        for k, v in inputs.items())
    (tree / "sweep.toml").write_text(text)
    spec = load(tree / "sweep.toml")
    return list(sweep_jobs(spec, LIMIT)), pairs(spec)


def test_stdout_and_stderr_stay_apart_and_files_come_from_the_task_folder(
        tmp_path: Path) -> None:
    tree, temp = tmp_path / "tree", tmp_path / "temp"
    temp.mkdir()
    jobs, results = _one_task_sweep(
        tree, "echo out; echo err >&2; mkdir -p d/e; echo f > d/e/f.txt; "
              "printf '' > empty; exit 3",
        {"o": "stdout", "e": "stderr", "f": "d/e/f.txt", "f2": "d/e/f.txt",
         "empty": "empty", "none": "missing.txt"})
    done, taken = run_jobs(jobs, temp, tree, results)
    assert done[jobs[0].name].exit_status == 3  # the command's, whatever was taken
    assert kept(taken[jobs[0].name]) == {"o": b"out\n", "e": b"err\n", "f": b"f\n",
                                         "f2": b"f\n", "empty": b""}


def test_links_and_non_files_are_never_staged_and_hostile_names_stay_inside(
        tmp_path: Path) -> None:
    tree, temp = tmp_path / "tree", tmp_path / "run" / "temp"
    temp.mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("outside\n")
    command = (f"ln -s {secret} link.txt; ln -s {outside} d; mkfifo fifo; mkdir dir; "
               f"ln {secret} hard.txt; "
               "mkdir -p 'a b'; echo ok > 'a b/$(touch pwned).txt'; echo sweep-dir "
               "> \"$CLUSTER_SWEEP_DIR/../written-through-variable\"")
    jobs, results = _one_task_sweep(tree, command, {
        "link": "link.txt", "through": "d/x.txt", "fifo": "fifo", "dir": "dir",
        "model": "model.py", "hard": "hard.txt", "hostile": "a b/$(touch pwned).txt"})
    (tree / "model.py").write_text("print(1)\n")  # linked into the task folder: refused
    done, taken = run_jobs(jobs, temp, tree, results)
    assert done[jobs[0].name].exit_status == 0
    # A hard link to another file of the machine is no result either.
    assert kept(taken[jobs[0].name]) == {"hostile": b"ok\n"}
    assert not list(tmp_path.rglob("pwned*"))
    # $CLUSTER_SWEEP_DIR still names the sweep folder.
    assert (tmp_path / "written-through-variable").read_text() == "sweep-dir\n"
    assert secret.read_text() == "not yours\n" and (outside / "x.txt").exists()


def test_the_task_folder_links_the_sweep_folder_except_what_the_inputs_write(
        tmp_path: Path) -> None:
    tree, temp = tmp_path / "tree", tmp_path / "temp"
    temp.mkdir()
    tree.mkdir()
    (tree / "model.py").write_text("print('model ran')\n")
    (tree / ".hidden").write_text("h\n")
    (tree / "data").mkdir()
    (tree / "data" / "table.txt").write_text("t\n")
    (tree / "conf").mkdir()
    (tree / "conf" / "keep.ini").write_text("sweep folder's\n")
    (tree / "a*b").write_text("glob\n")
    jobs, results = _one_task_sweep(
        tree, "python3 model.py; cat data/table.txt .hidden; ls -A conf; "
              "for f in * .hidden; do if [ -L \"$f\" ]; then echo \"link $f\"; "
              "else echo \"$f $(stat -c %h -- \"$f\")\"; fi; done",
        {"o": "stdout"}, inputs={"conf/new.ini": "input {v}\n", "a*b": "input wins\n"})
    done, taken = run_jobs(jobs, temp, tree, results)
    assert done[jobs[0].name].exit_status == 0
    assert kept(taken[jobs[0].name])["o"].decode() == (
        "model ran\nt\nh\nnew.ini\n"
        # The sweep folder's files are hard links to its own (two links each), its folder
        # a symbolic link; the inputs are files and a folder of the task's own.
        "a*b 1\nconf 2\nlink data\nmodel.py 2\nsweep.toml 2\n.hidden 2\n")
    # The inputs were written into the task folder, never through a link into the tree.
    assert (tree / "a*b").read_text() == "glob\n"
    assert sorted(p.name for p in (tree / "conf").iterdir()) == ["keep.ini"]


def test_a_command_writing_without_end_is_stopped_by_the_file_size_limit(
        tmp_path: Path) -> None:
    tree, temp = tmp_path / "tree", tmp_path / "temp"
    temp.mkdir()
    tree.mkdir()
    (tree / "sweep.toml").write_text(
        "command = 'sh -c {how}'\ntimeout = 60\n[axes]\nhow = ["
        "'yes > big.txt', 'head -c 10G /dev/zero', 'head -c 4096 /dev/zero > big.txt']\n"
        "[results]\nbig = 'big.txt'\nout = 'stdout'\n")
    spec = load(tree / "sweep.toml")
    started = time.monotonic()
    done, _ = run_jobs(list(sweep_jobs(spec, 4096)), temp, tree, pairs(spec), take=False)
    assert time.monotonic() - started < 30  # 10 GB were never written
    endless, ten_gb, exact = tasks(spec)
    assert done[endless.task_id].exit_status == XFSZ_STATUS
    # Stopped at the first 512-byte block past the limit: larger than max_result_bytes.
    assert (temp / f"{endless.task_id}.res" / "big").stat().st_size == 4608
    assert done[ten_gb.task_id].exit_status == XFSZ_STATUS
    assert (temp / f"{ten_gb.task_id}.res" / "out").stat().st_size == 4608
    assert done[exact.task_id].exit_status == 0  # exactly max_result_bytes is allowed
    assert (temp / f"{exact.task_id}.res" / "big").stat().st_size == 4096
    # What the node makes of them: the stopped ones failed and nothing of them kept.
    again = tmp_path / "again" / "temp"
    again.mkdir(parents=True)
    _, taken = run_jobs(list(sweep_jobs(spec, 4096)), again, tree, pairs(spec), limit=4096)
    assert [(taken[t.task_id].failed, kept(taken[t.task_id])) for t in (endless, ten_gb)] \
        == [("results over max_result_bytes (4096 bytes)", {})] * 2
    assert not taken[exact.task_id].failed
    assert kept(taken[exact.task_id]) == {"big": b"\0" * 4096, "out": b""}


def test_a_task_run_again_starts_from_nothing(tmp_path: Path) -> None:
    tree, temp = tmp_path / "tree", tmp_path / "temp"
    temp.mkdir()
    jobs, results = _one_task_sweep(tree, "ls -A; echo new > out.txt",
                                    {"o": "stdout", "e": "stderr", "out": "out.txt",
                                     "stale": "stale.txt"})
    name = jobs[0].name
    # What a run killed with its node would leave: its folder, stdout, stderr.
    (temp / name).mkdir()
    (temp / name / "junk").write_text("old\n")
    (temp / name / "stale.txt").write_text("old\n")
    (temp / f"{name}.err").write_text("old\n")
    (temp / f"{name}.out").write_text("old\n")
    done, taken = run_jobs(jobs, temp, tree, results)
    assert done[name].exit_status == 0
    assert kept(taken[name]) == {"o": b"sweep.toml\n", "e": b"", "out": b"new\n"}
    assert list(temp.iterdir()) == []
