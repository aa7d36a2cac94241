"""A sweep end to end (issue 23): ``localcluster.py --sweep`` with the repository's example
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
from cluster.sweep.spec import load
from tests.helpers import FAST, free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sweep" / "sweep.toml"


def _localcluster(home: Path, sweep: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--sweep", str(sweep), "--set", f"base_port={free_port(3)}",
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
    assert "ran 64 tests in" in done.stdout and "on 2 nodes" in done.stdout


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
