"""End to end: a run's own limits on a real local cluster (docs/runoptions.md §3).

One cluster of two one-slot nodes serves both cases, on slow demo trees (each job waits a
stated delay before real gs renders it):

* a run with ``job_timeout`` ends timed out with its partial report (what finished, and
  the tests not run), while a run queued behind it with ``queue_timeout`` leaves the queue
  with its short report before the first run ends;
* a ``no_reschedule`` run whose node is SIGKILLed mid-run: the jobs the dead node held are
  rows of error -1 (lost) from it in the table and the report says so; no job is handed
  out twice (the audit trail's hand-outs add up to the job count).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.records import ERROR_LOST, LOST_PRODUCT
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.helpers import CORPUS, FAST, free_port, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e

#: 4 files x 2 configurations: 8 jobs a run.
FILES = ("tiger.eps", "golfer.eps", "colorcir.ps", "escher.ps")
CONFIGS = "ppmraw.72.0 pbmraw.72.0"
JOBS = 2 * len(FILES)
RUN_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("limits")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    settings = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": "0", "gs_configs": CONFIGS, "supervisor_interval": "2"}
    local = LocalCluster(root / "home", 2, corpus, settings)
    local.prepare()
    try:
        local.start()
        local.wait_for_nodes()
        yield local
    finally:
        local.stop(grace=10)


def _job_start(cluster: LocalCluster) -> str:
    try:
        return cluster.home.job_start(0).read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


def _run_info(archive: Path) -> dict[str, str]:
    return dict(line.partition(" ")[::2]
                for line in (archive / "run.info").read_text().splitlines())


def test_job_timeout_ends_a_run_with_its_partial_report_and_queue_timeout_drops_a_waiting_run(
        cluster: LocalCluster) -> None:
    # 8 jobs of 4 s on two one-slot nodes: 16 s of work, more than its job_timeout of 10.
    tree = slow_demo_tree(cluster.home_dir / "demo" / "slow", "gs", [], delay=4.0)
    before = cluster.archives()
    slow = cluster.push(tree, "slow", ["gs"], ["job_timeout=10"])
    wait_for(lambda: f"queue {slow.line()}\n" in _job_start(cluster), 60,
             "the slow run to start")
    # Queued behind it (as any writer of a queue line does), never to start: no tree.  The
    # same user's: a user lane serves only a user with no run served (docs/runoptions.md,
    # "Fair share"), so it waits for lane 0.
    waiting = RunSpec.parse("user slow gs tree=late queue_timeout=2")
    assert QueueFile.for_priority(cluster.home, 0).append(waiting)
    queue = cluster.home.queue(0)
    wait_for(lambda: waiting.line() not in queue.read_text(), 30,
             "the waiting run to leave its queue")
    assert f"queue {slow.line()}\n" in _job_start(cluster), "the slow run ended first"
    dropped = _wait_for_archive(cluster, before, "slow", 1)
    info = _run_info(dropped)
    assert info["outcome"] == "queue-timeout", info
    report = (dropped / "report.txt").read_text()
    assert re.search(r"The run did not start: it waited \d+\.\d s in its queue, longer than "
                     r"its queue_timeout 2 s\.", report), report
    assert slow.line() in queue.read_text()

    archive = cluster.wait_for_run(slow, before | {dropped.name}, RUN_TIMEOUT)
    info = _run_info(archive)
    assert info["outcome"] == "timed-out", info
    report = (archive / "report.txt").read_text()
    assert "The run ran out of time: it ran" in report and \
        "longer than its job_timeout 10 s." in report, report
    match = re.search(r"(\d+) of (\d+) tests had a result; no table was changed", report)
    assert match is not None and int(match[2]) == JOBS, report
    finished = int(match[1])
    missing = re.search(r"(\d+) tests did not run:\n((?:  .*\n)*)", report)
    assert missing is not None, report
    assert int(missing[1]) == JOBS - finished > 0
    assert len(missing[2].splitlines()) == JOBS - finished
    assert float(info["elapsed"]) < 10 + 8, info  # cut at its limit, not at the work's end


def test_no_reschedule_reports_a_killed_nodes_jobs_lost_and_runs_none_twice(
        cluster: LocalCluster) -> None:
    tree = slow_demo_tree(cluster.home_dir / "demo" / "once", "gs", [], delay=1.5)
    before = cluster.archives()
    spec = cluster.push(tree, "once", ["gs"], ["no_reschedule"])
    journal = cluster.home.results(0)

    def node1_reported() -> bool:
        try:
            return any(line.startswith("node1 ") for line in journal.read_text().splitlines())
        except FileNotFoundError:
            return False

    wait_for(lambda: f"queue {spec.line()}\n" in _job_start(cluster) and node1_reported(),
             90, "node1's first result of the no_reschedule run")
    node1 = cluster.node_procs.pop("node1")
    # SIGKILL to node1's clusterpull, its run.py and their jobs (run.py and the job slots
    # lead process groups of their own): the master hears no word from it.
    pids = [node1.pid, *(p.pid for p in psutil.Process(node1.pid).children(recursive=True))]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    node1.wait(timeout=10)
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)

    assert _run_info(archive)["outcome"] == "done"
    table = read_tab(archive / f"{archive.name}.tab")
    assert len(table) == JOBS
    lost = {name for name, row in table.items() if row.error == ERROR_LOST}
    assert lost, table
    assert all(table[name].machine == "node1" and table[name].product == LOST_PRODUCT
               for name in lost)
    assert all(row.error == 0 for name, row in table.items() if name not in lost), table
    report = (archive / "report.txt").read_text()
    assert re.search(rf"node1 \(not heard from for \d+ s; {len(lost)} unfinished jobs "
                     r"reported lost\)", report), report
    # Every job was handed out once: the hand-outs of the audit trail add up to the jobs.
    audit = (archive / "audit.log").read_text()
    given = sum(int(n) for n in re.findall(r" given JOBS (\d+)", audit))
    assert given == JOBS, audit


def _wait_for_archive(cluster: LocalCluster, before: set[str], user: str,
                      timeout: float) -> Path:
    """The new archive folder whose run.info is user ``user``'s run."""
    found: list[Path] = []

    def look() -> bool:
        for name in cluster.archives() - before:
            info = cluster.home.archive / name / "run.info"
            if info.exists() and f"ref {user}\n" in info.read_text():
                found.append(info.parent)
                return True
        return False

    wait_for(look, timeout, f"the archive of user {user}'s run")
    return found[0]
