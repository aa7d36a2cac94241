"""End to end: dependencies between runs (docs/runoptions.md, section 5) on a real local cluster.

* A graph of three runs queued by ``clusteradmin dag`` -- A (priority 1); B after A
  (priority 2); C after A and B (priority 1, queued right behind A) -- runs in that order;
  ``clusteradmin stat`` says what B and C wait for; the master serving B is SIGKILLed mid
  run, its successor takes B over, and C still starts only once B has ended.
* A graph whose A fails (its tree's build fails on the nodes): B and C leave their queues,
  each with a report naming A; a cycle is refused by ``clusteradmin dag`` naming it, and
  nothing of that graph is queued.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.wire.jobstart import JobStart
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS, REPO, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e

#: Four test files of the corpus, one configuration: four jobs a run.
FILES = ("alphabet.ps", "colorcir.ps", "golfer.eps", "snowflak.ps")


def small_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus" / CORPUS.name
    corpus.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(CORPUS / name, corpus / name)
    return corpus


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def queued(cluster: LocalCluster) -> dict[int, list[str]]:
    return {p: [s.line() for s in QueueFile.for_priority(cluster.home, p).read()]
            for p in (0, 1, 2)}


def archived(cluster: LocalCluster, line: str) -> Path | None:
    """The archive folder of the run of queue line ``line``, once its run.info is written."""
    for folder in sorted(cluster.home.archive.glob("*")):
        info = folder / "run.info"
        if info.exists() and f"queue {line}\n" in info.read_text():
            return folder
    return None


def stamp(log: str, text: str) -> str:
    """The time (``2026-11-26 11:35:45,835``, sortable) of the first log line with ``text``."""
    found = re.search(rf"^(\S+ \S+) .*{re.escape(text)}", log, re.M)
    assert found is not None, f"no log line with {text!r}"
    return found[1]


def master_log(cluster: LocalCluster) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted(cluster.home.log_dir.glob("clustermaster*.log")))


def test_a_dag_runs_in_order_across_priorities_and_a_master_restart(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=2, corpus=small_corpus(tmp_path), gs_configs="ppmraw.72.0",
                           pid_stale="3")
    shutil.rmtree(cluster.home_dir / "ghostpdl")  # the clean tree auto runs build: slowed
    slow_demo_tree(cluster.home_dir / "ghostpdl", "gs", [], delay=1.5)
    graph = tmp_path / "nightly.dag"
    graph.write_text("# A, then B, then C\n"
                     "auto A gs name=A priority=1\n"
                     "auto B gs name=B after=A\n"
                     "auto C gs name=C after=A,B priority=1\n")
    a, b, c = "auto A gs name=A", "auto B gs after=A name=B", "auto C gs after=A,B name=C"
    done = admin(cluster, "dag", str(graph))
    assert done.returncode == 0, done.stderr
    assert queued(cluster) == {0: [], 1: [a, c], 2: [b]}
    stat = admin(cluster, "stat")
    assert "waits for A (queued or running)" in stat.stdout, stat.stdout
    assert "waits for A (queued or running), B (queued or running)" in stat.stdout

    cluster.start()
    cluster.wait_for_nodes()
    # B starts once A has ended; the master serving it is killed mid run.
    wait_for(lambda: f"queue {b}\n" in _text(cluster.home.job_start(2)), 120, "B to start")
    b_id = JobStart.parse(cluster.home.job_start(2).read_text()).id
    pid = int(cluster.home.pid_file(2).read_text().split("\n", 1)[0])
    psutil.Process(pid).send_signal(signal.SIGKILL)
    wait_for(lambda: archived(cluster, c) is not None, 180, "C to end")
    folders = [archived(cluster, line) for line in (a, b, c)]
    assert all(f is not None and "outcome done" in (f / "run.info").read_text()
               for f in folders)
    ids = [f.name for f in folders if f is not None]
    # run.info is written before the master logs "done, archived": wait for the lines.
    wait_for(lambda: all(f"run {i}: done, archived" in master_log(cluster) for i in ids),
             30, "the master's 'done, archived' lines of A, B and C")
    log = master_log(cluster)
    # Each priority logs to its own file: the lines' times order them.
    started = [stamp(log, f"run {i}: {line},") for i, line in zip(ids, (a, b, c), strict=True)]
    ended = [stamp(log, f"run {i}: done, archived") for i in ids]
    assert ended[0] < started[1] and ended[1] < started[2], (started, ended)
    # B kept its id across the kill, and a successor served it to its end.
    assert ids[1] == b_id
    assert f"cluster.master[{pid}] INFO run {b_id}: done" not in log
    assert (cluster.home.run_names / "C").read_text() == f"{ids[2]} done\n"


def test_a_failed_run_drops_the_runs_after_it_and_a_cycle_is_refused(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=1, corpus=small_corpus(tmp_path), gs_configs="ppmraw.72.0")
    broken = cluster.home_dir / "broken"
    broken.mkdir()
    (broken / "Makefile").write_text("all:\n\t@echo 'broken.c:1: error: no' >&2; exit 2\n")
    cycle = tmp_path / "cycle.dag"
    cycle.write_text("auto X gs name=X after=Z\nauto Y gs name=Y after=X\n"
                     "user bob gs name=Z after=Y\n")
    refused = admin(cluster, "dag", str(cycle))
    assert refused.returncode == 2
    assert "cycle: X -> Z -> Y -> X" in refused.stderr and "nothing queued" in refused.stderr
    assert queued(cluster) == {0: [], 1: [], 2: []}

    graph = tmp_path / "graph.dag"
    graph.write_text("auto A gs name=A tree=broken priority=1\n"
                     "auto B gs name=B after=A\nauto C gs name=C after=A,B priority=1\n")
    assert admin(cluster, "dag", str(graph)).returncode == 0
    cluster.start()
    b, c = "auto B gs after=A name=B", "auto C gs after=A,B name=C"
    wait_for(lambda: archived(cluster, b) is not None and archived(cluster, c) is not None
             and queued(cluster) == {0: [], 1: [], 2: []}, 120, "B and C to leave")
    a_run = (cluster.home.run_names / "A").read_text().split()
    assert a_run[1] == "failed"
    for line in (b, c):
        folder = archived(cluster, line)
        assert folder is not None
        assert "outcome unstartable" in (folder / "run.info").read_text()
        report = (folder / "report.txt").read_text()
        assert f"it waits for A (run {a_run[0]}, outcome failed), which did not end well" \
            in report, report


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
