"""End to end: the run loop at its edges, with real gs runs on a local cluster.

* A healthy run longer than ``pid_stale`` completes with its nodes: the master refreshes
  its PID file while it works, so no successor evicts it.
* A developer's second push while the first runs is not lost: it waits its turn, and each
  report shows the source it actually ran.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import MakeCluster
from tests.helpers import slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e

#: With slow trees (slow_demo_tree): runs that last seconds and cost little CPU.
SLOW_GS = "ppmraw.72.0 pgmraw.72.0 pbmraw.72.0 pkmraw.72.0"


def test_a_run_longer_than_pid_stale_completes_with_its_nodes(
        make_cluster: MakeCluster) -> None:
    cluster = make_cluster(nodes=2, pid_stale="2", gs_configs=SLOW_GS)
    cluster.start()
    cluster.wait_for_nodes()
    tree = slow_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    archive = cluster.wait_for_run(spec, before, timeout=300)
    report = (archive / "report.txt").read_text()
    seconds = float(re.search(r"ran \d+ tests in ([\d.]+) seconds", report)[1])  # type: ignore[index]
    assert seconds > 2 * 2, f"the run took {seconds} s: not longer than pid_stale"
    assert "on 2 nodes" in report
    assert len(cluster.archives() - before) == 1
    logs = "".join(p.read_text(errors="replace") for p in cluster.home.log_dir.glob("*.log"))
    assert "takes over" not in logs and "no longer ours" not in logs


def test_a_second_push_while_the_first_runs_waits_its_turn(make_cluster: MakeCluster,
                                                           tmp_path: Path) -> None:
    cluster = make_cluster(nodes=1, gs_configs=SLOW_GS)
    cluster.start()
    cluster.wait_for_nodes()
    tree = slow_demo_tree(tmp_path / "push" / "gs", "gs", [])
    (tree / "README").write_text("first push\n")
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    wanted = f"queue {spec.line()}\n"
    wait_for(lambda: wanted in _text(cluster.home.job_start(0)), 120, "the first run to start")
    (tree / "README").write_text("second push\n")
    cluster.push(tree, "tester", ["gs"], [])
    first = cluster.wait_for_run(spec, before, timeout=300)
    second = cluster.wait_for_run(spec, before | {first.name}, timeout=300)
    assert first != second
    first_report = (first / "report.txt").read_text()
    second_report = (second / "report.txt").read_text()
    assert "+first push" in first_report and "second push" not in first_report
    assert "+second push" in second_report and "first push" not in second_report


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
