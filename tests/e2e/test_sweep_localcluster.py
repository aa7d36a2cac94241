"""A sweep end to end (docs/sweeps.md): ``localcluster.py --sweep`` with the repository's example
sweep on a real master and two real nodes; the run's .tab has one row per task, named by
its task id, each md5 that of the task's results (cluster.node.sweepresults.result_md5)
when its expanded command is run by hand in a folder of its own beside the sweep folder's
files (a task's md5 is made from what its node read into the bundle it sent)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from cluster.node.sweepresults import result_md5
from cluster.report.tab import read_tab
from cluster.sweep.expand import tasks
from cluster.sweep.joblog import JoblogRow, open_joblog
from cluster.sweep.spec import load
from tests.helpers import FAST, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sweep" / "sweep.toml"


def _localcluster(home: Path, sweep: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--sweep", str(sweep), *extra, "--set", f"base_port={free_port(5)}",
            "--set", f"monitor_port={free_port()}", "--set", "status_port=0"]
    for key, value in FAST.items():
        argv += ["--set", f"{key}={value}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _by_hand(command: str, inputs: tuple[tuple[str, str], ...], folder: Path) -> str:
    """The md5 of the results (``out`` = out.txt, ``log`` = stdout) of ``command`` run in
    a fresh ``folder`` holding ``inputs`` and links to the sweep folder's files."""
    folder.mkdir(parents=True)
    for entry in EXAMPLE.parent.iterdir():
        (folder / entry.name).symlink_to(entry)
    for name, text in inputs:
        (folder / name).write_text(text, encoding="utf-8")
    done = subprocess.run(["sh", "-c", command], cwd=folder, capture_output=True, check=True,
                          env={**os.environ, "CLUSTER_SWEEP_DIR": str(EXAMPLE.parent)})
    results = {"log": done.stdout, "out": (folder / "out.txt").read_bytes()}
    return result_md5({name: (len(data), hashlib.md5(data).hexdigest())
                       for name, data in results.items()})


def test_localcluster_runs_the_example_sweep_one_row_per_task_md5s_as_by_hand(
        tmp_path: Path) -> None:
    done = _localcluster(tmp_path / "home", EXAMPLE)
    assert done.returncode == 0, done.stderr[-3000:]
    archive = Path(done.stdout.splitlines()[-1])
    assert archive.is_dir() and archive.parent.name == "archive"
    spec = load(EXAMPLE)
    expected = {task.task_id: _by_hand(task.command, task.inputs,
                                       tmp_path / "hand" / task.task_id)
                for task in tasks(spec)}
    assert len(expected) == 64
    text = (archive / f"{archive.name}.tab").read_text()
    assert len(text.splitlines()) == len(expected)  # one row per task, none twice
    table = read_tab(archive / f"{archive.name}.tab")
    assert {name: row.md5 for name, row in table.items()} == expected
    assert all(row.error == 0 and row.product == "sweep" for row in table.values())
    # The sweep's report (cluster.report.sweepreport), not a test report.
    assert "Sweep sweep.toml: 64 tasks: " in done.stdout and " on 2 nodes." in done.stdout


def test_localcluster_refuses_a_bad_sweep_before_starting_anything(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "t.csv").write_text("a,b\n1,2\n")
    (folder / "sweep.toml").write_text("command = 'echo {a} {c}'\ntable = 't.csv'\n")
    done = _localcluster(tmp_path / "home", folder / "sweep.toml")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "localcluster.py: sweep.toml: key command: unknown placeholder {c}")
    assert not (tmp_path / "home").exists()


def test_localcluster_resume_runs_only_the_tasks_not_valid_in_the_previous_run(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    refused = _localcluster(home, EXAMPLE, "--resume")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"localcluster.py: resume: user local has no earlier run of the sweep file "
        f"sweep.toml with a results.tsv in {home / 'archive'}; expected one to resume "
        "(submit without --resume to run every task)")
    # An earlier run of the sweep in which every task but each fifth was valid, archived
    # as the end of a run archives it (run.info, results.tsv, results/<task id>/).
    run = "20260102000000-p0-1111"
    archived = home / "archive" / run
    (archived / "results").mkdir(parents=True)
    (archived / "run.info").write_text(
        f"id {run}\npriority 0\nqueue user local sweep sweep=sweep.toml\nkind user\n"
        "ref local\nproducts sweep\ntree sweep\nsource runs/x/source/sweep\nbuild true\n"
        "tests tests\noptions sweep=sweep.toml\noutcome done\n")
    everything = list(tasks(load(EXAMPLE)))
    header = ("r", "steps", "x0")
    with open_joblog(archived / "results.tsv", header) as joblog:
        for task in everything:
            ok = task.number % 5 != 0
            joblog.write(JoblogRow(task.number, "n1", 1764000000.0, 0.1, 0, 10, 0 if ok else 1,
                                   0, task.command, tuple(zip(header, task.row.values,
                                                              strict=True)),
                                   "ok" if ok else "failed: exit status 1", 1))
            if ok:
                (archived / "results" / task.task_id).mkdir()
    done = _localcluster(home, EXAMPLE, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resume: the tasks without a valid result in run {run}" in done.stdout
    archive = Path(done.stdout.splitlines()[-1])
    table = read_tab(archive / f"{archive.name}.tab")
    assert sorted(table) == sorted(t.task_id for t in everything if t.number % 5 == 0)
    assert len(table) == 12
    # The master's log says how many run (build.py's count, logged by the master).
    assert f"resume: 12 of 64 tasks to run, 52 valid in run {run}" in (
        home / "log" / "clustermaster.log").read_text()


def test_localcluster_exits_1_when_tasks_end_invalid(tmp_path: Path) -> None:
    """A run that completes with tasks not ok exits 1 (as GNU parallel exits non-zero when
    jobs failed), its report printed and a last line counting them; the check script that
    judges them runs in the master's check pool."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "sweep.toml").write_text(
        'command = "echo {x}"\ntimeout = 30\n[axes]\nx = [1, 2, 3, 4]\n'
        '[results]\nlog = "stdout"\n[validate]\nscript = "check.sh"\n')
    (folder / "check.sh").write_text('#!/bin/sh\n! grep -qx 3 "$1/log" || '
                                     '{ echo "three is refused"; exit 1; }\n')
    (folder / "check.sh").chmod(0o755)
    done = _localcluster(tmp_path / "home", folder / "sweep.toml")
    assert done.returncode == 1, done.stderr[-3000:]
    archive = Path(done.stdout.splitlines()[-1])
    assert "Sweep sweep.toml: 4 tasks: 3 ok, 1 invalid" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == (
        "localcluster.py: 1 task(s) of the sweep did not end ok: invalid, failed or timed "
        f"out (results.tsv: {archive / 'results.tsv'})")
    statuses = sorted(line.split("\t")[-2] for line in
                      (archive / "results.tsv").read_text().splitlines()[1:])
    assert statuses == ["invalid: check.sh exited 1: three is refused", "ok", "ok", "ok"]
