"""Faults that must never reach the table: a node restarted mid-build, two
processes under one node name, a node whose build lacks the product's binary.

One real local cluster (monitor, supervisor, clustermasters) serves every case, on real gs
over a few example files; the nodes are real clusterpull/run.py processes started per case,
each with its own environment.  The product tree's ``make`` writes ``bin/gs`` (a wrapper
around the installed gs), after ``TEST_SLOW_BUILD`` seconds when that is set, and not at all
when ``TEST_NO_BIN`` is set.  Every case's table is compared, test by test (error and md5),
with the table of a clean run of the same tree.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.demotree import WRAPPER_SCRIPT
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.runtime import proc
from tests.helpers import CORPUS, FAST, free_port, wait_for

pytestmark = pytest.mark.e2e

#: The example files of the run (8 jobs: 4 files x 2 configurations).
FILES = ("tiger.eps", "golfer.eps", "colorcir.ps", "escher.ps")
CONFIGS = "ppmraw.72.0 pbmraw.72.0"
MAKEFILE = """\
all:
\t@if [ -n "$$TEST_SLOW_BUILD" ]; then sleep "$$TEST_SLOW_BUILD"; fi
\t@if [ -z "$$TEST_NO_BIN" ]; then sh ./make_wrapper.sh; else mkdir -p bin; fi
"""
#: How long the slow builds take [s]: long enough to kill or join during them.
SLOW = "4"
RUN_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("faults")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    settings = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": "0", "gs_configs": CONFIGS, "rejoin_delay": "1",
                "heartbeat_timeout": "30"}
    local = LocalCluster(root / "home", 0, corpus, settings)
    local.prepare()
    tree = root / "tree"
    tree.mkdir()
    (tree / "Makefile").write_text(MAKEFILE, encoding="utf-8")
    (tree / "make_wrapper.sh").write_text(WRAPPER_SCRIPT["gs"], encoding="utf-8")
    try:
        local.start()  # the monitor and the supervisor; the nodes per case
        yield local
    finally:
        local.stop(grace=10)


def _tree(cluster: LocalCluster) -> Path:
    return cluster.home_dir.parent / "tree"


def _run(cluster: LocalCluster) -> tuple[RunSpec, set[str]]:
    before = cluster.archives()
    return cluster.push(_tree(cluster), "tester", ["gs"], []), before


def _stop_nodes(cluster: LocalCluster) -> None:
    for name, child in list(cluster.node_procs.items()):
        proc.kill_tree(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill_tree(child.pid)
            child.wait(timeout=10)
        del cluster.node_procs[name]


def _table(archive: Path) -> dict[str, tuple[int, str, str]]:
    return {name: (r.error, r.md5, r.machine)
            for name, r in read_tab(archive / f"{archive.name}.tab").items()}


def _outcomes(table: dict[str, tuple[int, str, str]]) -> dict[str, tuple[int, str]]:
    return {name: (error, md5) for name, (error, md5, _) in table.items()}


@pytest.fixture(scope="module")
def clean(cluster: LocalCluster) -> dict[str, tuple[int, str, str]]:
    """The table of a clean run on two healthy nodes."""
    cluster.start_node("node1")
    cluster.start_node("node2")
    try:
        spec, before = _run(cluster)
        table = _table(cluster.wait_for_run(spec, before, RUN_TIMEOUT))
    finally:
        _stop_nodes(cluster)
    assert len(table) == 2 * len(FILES)
    assert all(error == 0 for error, _, _ in table.values()), table
    return table


def _building(work: Path, earlier: set[Path], started: bool) -> bool:
    """Whether a build log of a run not in ``earlier`` exists (and has its build command
    started, with ``started``)."""
    return any(p.parent not in earlier and (not started or "$ " in p.read_text())
               for p in work.glob("runs/*/*.build.log"))


def _run_py(parent: int) -> list[psutil.Process]:
    """The run.py processes below ``parent``, without their own children: a child that
    run.py has forked and that has not yet exec'd its program (the build's shell, a slot)
    still shows run.py's command line for that moment."""
    try:
        found = [p for p in psutil.Process(parent).children(recursive=True)
                 if any(part.endswith("run.py") for part in p.cmdline())]
        pids = {p.pid for p in found}
        return [p for p in found if p.ppid() not in pids]
    except psutil.Error:
        return []


def _log(cluster: LocalCluster, pattern: str) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted(cluster.home.log_dir.glob(pattern)))


def test_a_node_killed_during_its_build_builds_again_and_the_table_is_clean(
        cluster: LocalCluster, clean: dict[str, tuple[int, str, str]]) -> None:
    work = cluster.home_dir / "node-work" / "node1"
    earlier = set(work.glob("runs/*"))
    cluster.start_node("node1", {"TEST_SLOW_BUILD": SLOW})
    try:
        spec, before = _run(cluster)
        wait_for(lambda: _building(work, earlier, True), 60, "node1's build to start")
        killed = _run_py(cluster.node_procs["node1"].pid)
        assert len(killed) == 1
        killed[0].send_signal(signal.SIGKILL)  # mid-make; clusterpull starts it again
        wait_for(lambda: (r := _run_py(cluster.node_procs["node1"].pid))
                 and r[0].pid != killed[0].pid, 30, "a new run.py of node1")
        archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    finally:
        _stop_nodes(cluster)
    table = _table(archive)
    assert _outcomes(table) == _outcomes(clean)
    assert {machine for _, _, machine in table.values()} == {"node1"}
    assert "node node1 dropped: restarted" in _log(cluster, "clustermaster*.log")


def test_a_second_process_under_a_name_in_use_is_refused_and_the_table_is_clean(
        cluster: LocalCluster, clean: dict[str, tuple[int, str, str]]) -> None:
    work = cluster.home_dir / "node-work" / "node1"
    earlier = set(work.glob("runs/*"))
    cluster.start_node("node1", {"TEST_SLOW_BUILD": SLOW})
    try:
        spec, before = _run(cluster)
        wait_for(lambda: _building(work, earlier, False), 60, "node1's build to start")
        cluster.start_node("node1", machine="twin")  # another machine, node1's name
        archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    finally:
        _stop_nodes(cluster)
    table = _table(archive)
    assert _outcomes(table) == _outcomes(clean)
    master_log = _log(cluster, "clustermaster*.log")
    assert "node name node1 is in use by another live process" in master_log, master_log[-3000:]
    twin_log = "".join(p.read_text(errors="replace")
                       for p in (cluster.home_dir / "node-work" / "twin").glob("log/*.log"))
    assert "node name node1 is in use" in twin_log, twin_log[-3000:]


def test_a_node_without_the_product_binary_fails_and_the_other_runs_its_jobs(
        cluster: LocalCluster, clean: dict[str, tuple[int, str, str]]) -> None:
    cluster.start_node("node1")
    cluster.start_node("node2", {"TEST_NO_BIN": "1"})
    try:
        spec, before = _run(cluster)
        archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    finally:
        _stop_nodes(cluster)
    table = _table(archive)
    assert _outcomes(table) == _outcomes(clean)
    assert {machine for _, _, machine in table.values()} == {"node1"}
    report = (archive / "report.txt").read_text()
    assert "Nodes lost during the run:" in report and "node2 (failure 1 cannot run jobs" \
        in report, report
