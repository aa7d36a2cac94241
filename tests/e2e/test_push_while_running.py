"""End to end: a developer pushes again while the first push runs ("no push is
lost").  A real local cluster, the real clusterpush.py, real gs jobs.

The break: the second push's dropping matched the running run, was taken as already queued
and deleted; there was one archive, and its report showed the second tree's source diff over
the first tree's results.  Now the second push waits its turn, and each report shows the
source its run built.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e


def clusterpush(cluster: LocalCluster, tree: Path, *words: str) -> list[str]:
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), *cluster.config_args(),
                           "--user", "ann", *words], cwd=tree, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def source_diff(archive: Path) -> str:
    return (archive / "report.txt").read_text().split("Source differences from trunk", 1)[1]


def test_a_push_while_the_same_push_runs_gets_its_own_run_and_report(
        make_cluster: MakeCluster) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0 ppmraw.72.1 pkmraw.72.0 pgmraw.72.1")
    slow_demo_tree(cluster.home_dir / "ghostpdl", "gs", [])  # the master's clean tree
    cluster.start()
    tree = slow_demo_tree(cluster.home_dir / "ann-tree" / "ghostpdl", "gs",
                           ["-dTextAlphaBits=4"])
    spec = RunSpec.parse("user ann gs")
    assert clusterpush(cluster, tree, "gs") == ["queueing: user ann gs"]
    results = cluster.home.results(0)
    wait_for(lambda: results.exists() and len(results.read_text().splitlines()) > 4, 120,
             "the first run under way")

    # The developer changes the tree and pushes again while the first run runs.
    slow_demo_tree(tree, "gs", ["-dGraphicsAlphaBits=4"])
    printed = clusterpush(cluster, tree, "gs")
    assert printed == ["queueing: user ann gs",
                       "your run 'user ann gs' is running (it keeps the tree it started "
                       "with); this push is queued after it"]
    queue = QueueFile.for_priority(cluster.home, 0)
    wait_for(lambda: queue.read() == [spec, spec], 60, "the second push queued after the first")

    first = cluster.wait_for_run(spec, set(), 300)
    second = cluster.wait_for_run(spec, {first.name}, 300)
    assert first.name != second.name
    diff1, diff2 = source_diff(first), source_diff(second)
    assert "+-dTextAlphaBits=4" in diff1 and "GraphicsAlphaBits" not in diff1
    assert "+-dGraphicsAlphaBits=4" in diff2 and "TextAlphaBits" not in diff2
    # Each run's results are its own tree's: the two tables differ.
    tables = [{n: r.md5 for n, r in read_tab(a / f"{a.name}.tab").items()}
              for a in (first, second)]
    assert len(tables[0]) == len(tables[1]) == 60 and tables[0] != tables[1]
    assert queue.read() == []
