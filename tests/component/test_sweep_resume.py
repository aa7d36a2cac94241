"""A sweep's ``resume`` on real files and real processes (docs/sweeps.md, section 8).

The resumed run's archive folder is made as the end of a run makes it: ``run.info`` is
job.start's text (:class:`cluster.wire.jobstart.JobStart`) with the outcome lines,
``results.tsv`` is written by :mod:`cluster.sweep.joblog`'s writer, and each task's
``results/<task id>/`` is a real folder.  Then build.py (a real process), clusterpush
(a real process) and a real priority-0 clustermaster pick the tasks left to run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.records import Job
from cluster.sweep.expand import Task, tasks
from cluster.sweep.joblog import JoblogRow, open_joblog
from cluster.sweep.resume import ResumeFilter
from cluster.sweep.spec import load
from cluster.triggers.droppings import DROPPING
from cluster.triggers.sweeppush import previous_sweep_run
from cluster.wire.jobstart import JobStart
from tests.component.scripted_nodes import make_home, master_argv
from tests.helpers import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
R0, R1, R2 = "20260101000000-p0-0000", "20260102000000-p0-1111", "20260103000000-p0-2222"
ROWS = [("1", "x"), ("2", "y"), ("3", "a b"), ("4", "it's"), ("5", "z"), ("6", "w"),
        ("7", "v"), ("8", "u")]


def _sweep(folder: Path, command: str = "echo {a} {b}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.csv").write_text(
        "a,b\n" + "".join(f'{a},"{b}"\n' for a, b in ROWS))
    (folder / "sweep.toml").write_text(f"command = {command!r}\ntable = 'params.csv'\n"
                                       "timeout = 9\n[results]\nout = 'stdout'\n")
    return folder / "sweep.toml"


def _row(task: Task, status: str, *, b: str | None = None) -> JoblogRow:
    a, b_now = task.row.values
    return JoblogRow(task.number, "n1", 1764000000.0 + task.number, 0.25, 0, 12, 0, 0,
                     task.command, (("a", a), ("b", b_now if b is None else b)), status, 1)


def _archive(home: Home, run_id: str, line: str, rows: Iterable[JoblogRow] | None = None,
             folders: Iterable[str] = ()) -> Path:
    """An archived run: its run.info for queue ``line``; its results.tsv of ``rows``
    (none: no results.tsv) and a result folder per task id of ``folders``."""
    folder = home.archive / run_id
    folder.mkdir(parents=True)
    kind, ref, products = line.split()[:3]
    start = JobStart(id=run_id, priority=0, queue=line, kind=kind, ref=ref,
                     products=tuple(products.split(",")), tree="sweep",
                     source=f"runs/{run_id}/source/sweep", build="true", tests="tests",
                     options=tuple(line.split()[3:]))
    (folder / "run.info").write_text(start.format() + "elapsed 3.0\noutcome done\n")
    if rows is not None:
        with open_joblog(folder / "results.tsv", ("a", "b")) as log:
            for row in rows:
                log.write(row)
    for task_id in folders:
        (folder / "results" / task_id).mkdir(parents=True)
        (folder / "results" / task_id / "out").write_text("result\n")
    return folder


def _previous_run(home: Home, sweep: Path) -> list[Task]:
    """R1: tasks 1, 2 and 7 valid there; 3 to 6 and 8 not, each for another reason."""
    t = list(tasks(load(sweep)))
    rows = [_row(t[0], "ok"), _row(t[1], "ok"),
            _row(t[2], "failed: exit status 1"),             # failed (its folder is kept)
            _row(t[3], "timeout"),
            _row(t[4], "ok"),                                # ok, but no result folder
            _row(t[5], "ok", b="old"),                       # ok for another row 6
            _row(t[6], "invalid: no out"), _row(t[6], "ok"),  # a later try was valid
            # task 8 has no row (the run was stopped before it); a row past the table:
            JoblogRow(9, "n2", 1764000009.0, 0.1, 0, 0, 0, 0, "echo 9", (("a", "9"),
                                                                         ("b", "q")), "ok", 1)]
    _archive(home, R1, "user alice sweep sweep=sweep.toml", rows,
             [t[i].task_id for i in (0, 1, 2, 5, 6)])
    return t


def test_resume_keeps_only_the_tasks_without_a_valid_result(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    sweep = _sweep(tmp_path / "s")
    t = _previous_run(home, sweep)
    spec = load(sweep)
    keep = ResumeFilter(home.archive / R1, spec.rows().header)
    kept = [task.number for task in tasks(spec) if keep(task)]
    assert kept == [3, 4, 5, 6, 8]
    assert keep.summary() == f"resume: 5 of 8 tasks to run, 3 valid in run {R1}"
    assert len(t) == 8


def test_build_py_resume_prints_the_jobs_left_and_says_how_many(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    sweep = _sweep(tmp_path / "s")
    t = _previous_run(home, sweep)
    done = subprocess.run([sys.executable, str(REPO / "build.py"), "--home", str(home.root),
                           "sweep", "--sweep", str(sweep), "--resume",
                           str(home.archive / R1)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = [Job.parse(line).name for line in done.stdout.splitlines()]
    assert names == [t[i].task_id for i in (2, 3, 4, 5, 7)]
    assert f"resume: 5 of 8 tasks to run, 3 valid in run {R1}" in done.stderr

    # The command changed: every task id is new, so no result folder is found: all run.
    changed = _sweep(tmp_path / "s2", command="echo {a}-{b}")
    again = subprocess.run([sys.executable, str(REPO / "build.py"), "--home",
                            str(home.root), "sweep", "--sweep", str(changed), "--resume",
                            str(home.archive / R1)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.splitlines()) == 8
    assert f"resume: 8 of 8 tasks to run, 0 valid in run {R1}" in again.stderr

    # No results.tsv there: a usage error naming the folder, no job list.
    (home.archive / R2).mkdir()
    missing = subprocess.run([sys.executable, str(REPO / "build.py"), "--home",
                              str(home.root), "sweep", "--sweep", str(sweep), "--resume",
                              str(home.archive / R2)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"--resume {home.archive / R2}: no results.tsv there" in missing.stderr


def test_the_previous_run_is_the_users_newest_of_that_sweep_file_with_results(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    home = Home(tmp_path / "home")
    rows = [JoblogRow(1, "n1", 1.0, 0.1, 0, 0, 0, 0, "echo", (("a", "1"), ("b", "x")),
                      "ok", 1)]
    _archive(home, R0, "user alice sweep sweep=sweep.toml", rows)
    _archive(home, R1, "user alice sweep sweep=sweep.toml", rows)
    # Newer, but none is alice's sweep.toml with a results.tsv:
    _archive(home, "20260103000000-p0-2222", "user alice sweep sweep=sweep.toml")  # none
    _archive(home, "20260104000000-p0-3333", "user bob sweep sweep=sweep.toml", rows)
    _archive(home, "20260105000000-p0-4444", "user alice sweep sweep=other.toml", rows)
    _archive(home, "20260106000000-p2-5555", "auto nightly-alice sweep sweep=sweep.toml",
             rows)
    _archive(home, "20260107000000-p0-6666", "user alice gs", rows)
    garbled = home.archive / "20260108000000-p0-7777"
    garbled.mkdir()
    (garbled / "results.tsv").write_text("x\n")
    (garbled / "run.info").write_text("not a run\n")
    assert previous_sweep_run(home, "alice", "sweep.toml") == R1
    assert "20260108000000-p0-7777/run.info: unreadable" in caplog.text
    assert previous_sweep_run(home, "alice", "other.toml") == "20260105000000-p0-4444"
    assert previous_sweep_run(home, "bob", "sweep.toml") == "20260104000000-p0-3333"


def _clusterpush(home: Home, user: str, sweep: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusterpush.py"), "--home",
                           str(home.root), "--user", user, "--copy", "--sweep", str(sweep),
                           "--resume"], capture_output=True, text=True, timeout=60)


def test_clusterpush_resume_without_a_previous_run_is_refused_and_queues_nothing(
        tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    sweep = _sweep(tmp_path / "s")
    _previous_run(home, sweep)  # alice's, not bob's
    done = _clusterpush(home, "bob", sweep)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"clusterpush.py: resume: user bob has no earlier run of the sweep file sweep.toml "
        f"with a results.tsv in {home.archive}; expected one to resume (submit without "
        "--resume to run every task)")
    assert not (home.users / "bob").exists()


def test_clusterpush_resume_queues_a_run_that_builds_only_the_tasks_left(
        tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", "auto nightly-x gs")  # a corpus, a priority-2 run
    sweep = _sweep(tmp_path / "s")
    t = _previous_run(home, sweep)
    done = _clusterpush(home, "alice", sweep)
    assert done.returncode == 0, done.stderr
    assert f"resume: the tasks without a valid result in your run {R1}" in done.stdout
    line = f"user alice sweep resume={R1} sweep=sweep.toml"
    assert f"queueing: {line}" in done.stdout
    assert (home.users / "alice" / "sweep" / DROPPING).read_text() == line + "\n"

    # The priority-0 master takes the dropping, snapshots the folder and asks build.py.
    # Its log in a file the test can read while it runs: the master is killed once the
    # job list is there, and build.py's line may be written a moment after the list.
    port = free_port(5)
    master_log = tmp_path / "master.err"
    said = f"resume: 5 of 8 tasks to run, 3 valid in run {R1}"
    with open(master_log, "w") as err:
        master = subprocess.Popen(master_argv(home, port, "pid_check_interval=0.2",
                                              priority=0),
                                  stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        wait_for(lambda: home.jobs(0).is_file() and home.job_start(0).is_file(), 60,
                 "the run's job list")
        names = [Job.parse(x).name for x in home.jobs(0).read_text().splitlines()]
        assert names == [t[i].task_id for i in (2, 3, 4, 5, 7)]
        assert JobStart.parse(home.job_start(0).read_text()).queue == line
        wait_for(lambda: said in master_log.read_text(), 30, "build.py's resume line")
    finally:
        master.kill()
        master.wait(timeout=30)
