"""Slowest tests first, and slowdowns named (docs/results.md, "Slowest tests first, and
slowdowns named"), on a real local cluster.

One node of one slot runs two nightly (``auto``) runs of product shell, whose tests sleep
given times and log their start.  The first run has no baseline: its jobs go out in the
corpus's order.  Between the runs one test is made slower (0.2 s -> 2.5 s) and one test is
added.  The second run's jobs reach the node slowest first by the first run's times, the
new test ahead of them (its time is unknown); its report lists the slower test under
"Slower tests" and not the test of equal time; ``clusteradmin history TEST --times`` shows
the slower test's two times.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from cluster.demotree import write_demo_tree
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO

NAME = "slow"
CMDS = "t.cmds"


def command(label: str, seconds: float, starts: Path) -> str:
    """A test that logs its start, sleeps ``seconds`` and prints ``label`` (its result)."""
    return f"echo {label} >> {shlex.quote(str(starts))}; sleep {seconds}; echo {label}"


def test_slowest_first_and_a_slower_test_named(make_cluster: MakeCluster,
                                               tmp_path: Path) -> None:
    corpus = tmp_path / NAME
    corpus.mkdir()
    starts = tmp_path / "starts.log"
    cmds = corpus / CMDS
    # Line 1 fast, line 2 the same time in both runs, line 3 made slower, line 4 added.
    first = [("fast", 0.1), ("steady", 1.2), ("grows", 0.2)]
    cmds.write_text("".join(command(label, s, starts) + "\n" for label, s in first))
    cluster = make_cluster(nodes=1, corpus=corpus, slots="1")
    write_demo_tree(cluster.home_dir / "shell", "shell", [])  # the tree the runs build
    cluster.start()
    cluster.wait_for_nodes()
    queue = QueueFile.for_priority(cluster.home, 2)
    spec = RunSpec.parse("auto nightly shell")

    def run() -> Path:
        before = cluster.archives()
        starts.write_text("")
        assert queue.append(spec)
        folder = cluster.wait_for_run(spec, before, 40, priority=2)
        assert "outcome done" in (folder / "run.info").read_text(), \
            (folder / "report.txt").read_text()
        return folder

    one = run()
    assert starts.read_text().split() == ["fast", "steady", "grows"]  # build.py's order
    times = {n: r.time1 for n, r in read_tab(one / f"{one.name}.tab").items()}
    test = f"{NAME}__{CMDS}"
    assert times[f"{test}.2"] >= 1.2 > times[f"{test}.3"] >= 0.2, times

    # The cluster's copy of the corpus (localcluster mirrors it into the home).
    (cluster.home.root / "tests" / NAME / CMDS).write_text(
        "".join(command(label, s, starts) + "\n" for label, s in
                [("fast", 0.1), ("steady", 1.2), ("grows", 2.5), ("new", 0.1)]))
    two = run()
    # Unknown first, then by the first run's times: steady 1.2, grows 0.2, fast 0.1.
    assert starts.read_text().split() == ["new", "steady", "grows", "fast"]
    report = (two / "report.txt").read_text()
    slower = report[report.index("Slower tests"):]
    assert f"{NAME}/{CMDS}.3 " in slower, report  # 0.2 s -> 2.5 s: listed
    assert f"{NAME}/{CMDS}.2 " not in slower, report  # the same 1.2 s: not
    assert "over the median of the last 1 baseline run)" in slower

    shown = subprocess.run(
        [sys.executable, str(REPO / "clusteradmin.py"), *cluster.config_args(),
         "history", f"{test}.3", "--times"], capture_output=True, text=True, timeout=30,
        check=False)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert len(lines) == 3 and "in 2 archived run(s)" in lines[0], shown.stdout
    assert lines[1].split()[0] == two.name and lines[2].split()[0] == one.name
