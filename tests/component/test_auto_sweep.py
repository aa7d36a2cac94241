"""A nightly sweep (``sweep <folder>`` in an auto jobdef, docs/sweeps.md section 8) with
real processes: enqueue_auto.py checks and queues it at priority 2, and a real priority-2
clustermaster copies the folder the jobdef names into the run's source and makes one job
per task from the copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cluster.queue import QueueFile
from cluster.records import Job
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load
from cluster.wire.jobstart import JobStart
from tests.component.scripted_nodes import make_home, master_argv
from tests.helpers import REPO, free_port, wait_for


def test_a_nightly_sweep_is_queued_and_its_run_builds_from_a_copy_of_the_folder(
        tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", "auto nightly-smoke gs")
    QueueFile(home.queue(2), home.queue_lock(2)).withdraw(lambda spec: True)
    folder = tmp_path / "team" / "model"
    folder.mkdir(parents=True)
    (folder / "params.csv").write_text("r,n\n" + "".join(f"{i / 10},{i}\n"
                                                         for i in range(1, 11)))
    (folder / "sweep.toml").write_text("command = 'echo {r} {n}'\ntable = 'params.csv'\n"
                                       "timeout = 5\n[results]\nout = 'stdout'\n")
    (folder / "bin").mkdir()
    (folder / "bin" / "tool").write_text("a build folder: a push leaves it out\n")
    job = home.root / "auto" / "nightly" / "model"
    job.mkdir(parents=True)
    (job / "jobdef.txt").write_text("# the team's model, every night\n"
                                    "sweep ../../../../team/model\n")

    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--home",
                           str(home.root), "nightly"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "queued: auto nightly-model sweep sweep=sweep.toml\n"

    port = free_port(5) + 2
    master = subprocess.Popen(master_argv(home, port, "pid_check_interval=0.2"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: home.jobs(2).is_file() and home.job_start(2).is_file(), 60,
                 "the run's job list")
        start = JobStart.parse(home.job_start(2).read_text())
        names = [Job.parse(x).name for x in home.jobs(2).read_text().splitlines()]
    finally:
        master.kill()
        _out, err = master.communicate(timeout=30)
    assert start.queue == "auto nightly-model sweep sweep=sweep.toml", err
    assert start.source == f"runs/{start.id}/source/sweep" and start.build == "true"
    copy = home.root / start.source
    assert sorted(p.name for p in copy.iterdir()) == ["params.csv", "sweep.toml"]
    assert names == [task.task_id for task in tasks(load(folder / "sweep.toml"))]
    assert len(names) == 10
