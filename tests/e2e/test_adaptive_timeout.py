"""Timeouts that fit each test (docs/results.md, "Timeouts that fit each test"), on a real
local cluster.

One node of one slot runs two nightly (``auto``) runs of product shell.  In the first every
test takes some 0.2 s; between the runs one test is made to hang (``sleep 1000``).  With
``adaptive_timeout = 5`` and a floor of 2 s, the second run's hung test is killed after its
own 2 s, not after the node's ``job_timeout`` of 450 s: the run ends within seconds, the
test's row is a timeout (error 3), and the report names it as one.
"""

from __future__ import annotations

import time
from pathlib import Path

from cluster.demotree import write_demo_tree
from cluster.queue import QueueFile
from cluster.records import ERROR_TIMEOUT
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster

NAME = "hang"
CMDS = "t.cmds"


def test_a_hung_test_is_killed_after_its_own_timeout(make_cluster: MakeCluster,
                                                      tmp_path: Path) -> None:
    corpus = tmp_path / NAME
    corpus.mkdir()
    cmds = corpus / CMDS
    cmds.write_text("sleep 0.2; echo one\nsleep 0.2; echo two\n")
    cluster = make_cluster(nodes=1, corpus=corpus, slots="1", adaptive_timeout="5",
                           adaptive_timeout_floor="2", job_timeout="450")
    write_demo_tree(cluster.home_dir / "shell", "shell", [])  # the tree the runs build
    cluster.start()
    cluster.wait_for_nodes()
    queue = QueueFile.for_priority(cluster.home, 2)
    spec = RunSpec.parse("auto nightly shell")

    def run() -> Path:
        before = cluster.archives()
        assert queue.append(spec)
        return cluster.wait_for_run(spec, before, 60, priority=2)

    one = run()
    assert all(row.error == 0 for row in read_tab(one / f"{one.name}.tab").values())

    # The cluster's copy of the corpus (localcluster mirrors it into the home).
    (cluster.home.root / "tests" / NAME / CMDS).write_text(
        "sleep 0.2; echo one\nsleep 1000; echo two\n")
    began = time.monotonic()
    two = run()
    took = time.monotonic() - began
    assert took < 60, f"the second run took {took:.0f} s"
    table = read_tab(two / f"{two.name}.tab")
    hung = f"{NAME}__{CMDS}.2"
    assert table[hung].error == ERROR_TIMEOUT, table
    assert table[f"{NAME}__{CMDS}.1"].error == 0, table
    report = (two / "report.txt").read_text()
    named = [line for line in report.splitlines() if f"{NAME}/{CMDS}.2" in line]
    assert any("timeout" in line for line in named), report
