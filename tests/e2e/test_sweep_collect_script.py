"""A sweep's collection script end to end (docs/sweeps.md, "The collection script"):
``localcluster.py --sweep`` on a real master and two real nodes runs a small sweep whose
script, run on the master at the run's end, writes a summary from every valid task's
parameters and result files; the archive's ``collected/`` holds it, beside the
``[collect]`` file.  A script path leading out of the sweep folder is refused by
``clusterpush.py --sweep`` on a real master home, and nothing is pushed or queued."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load
from tests.helpers import FAST, REPO, free_port

pytestmark = pytest.mark.e2e

#: b = 0 makes its command exit 1: the task is invalid and the script never sees it.
PARAMS = "a,b\n2,3\n4,0\n5,7\n1,1\n"
SWEEP = """\
command = "test {b} != 0 && expr {a} \\\\* {b} > out.txt && echo task {#}"
table = "params.csv"
timeout = 60
collect_script = "summarize.py"
[results]
out = "out.txt"
log = "stdout"
[collect]
"products.txt" = { from = "out" }
"""
SCRIPT = """\
#!/usr/bin/env python3
# One line a valid task, in task order, from its parameters and its result files.
import json, os, sys
lines = ["task a b product log"]
for line in sys.stdin:
    task = json.loads(line)
    folder = task["results"]
    product = open(os.path.join(folder, "out")).read().strip()
    log = open(os.path.join(folder, "log")).read().strip()
    lines.append(f"{task['task']} {task['params']['a']} {task['params']['b']} {product} {log}")
with open("summary.txt", "w") as out:
    out.write("\\n".join(lines) + "\\n")
print(f"summarised {len(lines) - 1} tasks")
"""


def write_sweep(folder: Path, sweep: str = SWEEP) -> Path:
    folder.mkdir()
    (folder / "params.csv").write_text(PARAMS)
    (folder / "summarize.py").write_text(SCRIPT)
    (folder / "summarize.py").chmod(0o755)
    (folder / "sweep.toml").write_text(sweep)
    return folder / "sweep.toml"


def test_the_collection_script_writes_a_summary_into_the_archives_collected(
        tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(tmp_path / "home"),
            "--sweep", str(sweep), "--set", f"base_port={free_port(5)}",
            "--set", f"monitor_port={free_port()}", "--set", "status_port=0"]
    for key, value in FAST.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    # Exit 1: task 2 ended invalid (docs/sweeps.md, "Exit statuses"); the run completed.
    assert done.returncode == 1, done.stderr[-3000:]
    assert "1 task(s) of the sweep did not end ok" in done.stderr, done.stderr[-3000:]
    archive = Path(done.stdout.splitlines()[-1])
    ids = [task.task_id for task in tasks(load(sweep))]
    collected = archive / "collected"
    assert (collected / "summary.txt").read_text() == (
        "task a b product log\n1 2 3 6 task 1\n3 5 7 35 task 3\n4 1 1 1 task 4\n")
    assert (collected / "products.txt").read_text() == "6\n35\n1\n"
    assert sorted(p.name for p in collected.iterdir()) == ["products.txt", "summary.txt"]
    assert "summarised 3 tasks" in (archive / "collect-script.log").read_text()
    # Its input stays in the archive, each task's folder named there.
    tasks_file = (archive / "collect-tasks.jsonl").read_text()
    assert [f"/results/{ids[n]}" in tasks_file for n in range(4)] == [True, False, True, True]
    assert "Sweep sweep.toml: 4 tasks: 3 ok, 1 invalid, 0 failed, 0 timed out." in done.stdout
    assert ("Collection script summarize.py: 3 task(s) given, made summary.txt in "
            "collected/.") in done.stdout


def test_a_script_path_out_of_the_sweep_folder_is_refused_nothing_queued(
        tmp_path: Path) -> None:
    (tmp_path / "outside.py").write_text("#!/bin/sh\n")
    sweep = write_sweep(tmp_path / "sweep",
                        SWEEP.replace('"summarize.py"', '"../outside.py"'))
    cluster = LocalCluster(tmp_path / "home", 1, overrides={
        **FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": "0"})
    cluster.prepare()
    pushed = subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"), *cluster.config_args(),
         "--user", "eve", "--sweep", str(sweep)],
        cwd=sweep.parent, capture_output=True, text=True, timeout=60)
    assert pushed.returncode == 2
    assert ("sweep.toml: key collect_script: the collection script '../outside.py' is "
            "refused: it has a '..' component") in pushed.stderr, pushed.stderr
    assert not (cluster.home.users / "eve").exists()
    queued = [p for p in cluster.home.root.glob("queue*.lst") if p.read_text().strip()]
    assert queued == []
