"""The benchmarks keep working: small runs that must complete with correct results.

CI checks that they run and that their results are right, never how fast they are.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CORPUS, REPO

pytestmark = pytest.mark.e2e


def figures(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.split())


def run_bench(*argv: str, timeout: float = 600) -> list[str]:
    done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert lines[0].startswith("machine=")  # every benchmark says what it ran on
    return lines


def test_dispatch_small() -> None:
    """Three repetitions: each cluster contender starts its cluster again in the same home
    for each, so a stop that left a PID file would stall the next start (docs/architecture.md,
    "Stopping")."""
    lines = run_bench("bench/dispatch.py", "--jobs", "100", "--slots", "2", "--reps", "3")
    rows = {f["contender"]: f for f in map(figures, lines) if "contender" in f}
    assert set(rows) == {"xargs", "parallel", "cluster-1node", "cluster-2node"}
    for row in rows.values():
        assert row["ok"] == "yes" and float(row["median_s"]) > 0
    assert rows["xargs"]["ratio"] == "1.00"



def test_sweep_small() -> None:
    """bench/sweep.py: the same small sweep through xargs, GNU parallel and the cluster; the
    benchmark itself checks every task's result file (and the cluster's results.tsv) and
    says ok=no, exiting 1, when one is wrong."""
    lines = run_bench("bench/sweep.py", "--tasks", "60", "--slots", "2", "--reps", "1")
    rows = {f["contender"]: f for f in map(figures, lines) if "contender" in f}
    assert set(rows) == {"xargs", "parallel", "cluster"}
    for row in rows.values():
        assert row["ok"] == "yes" and float(row["median_s"]) > 0
    assert rows["xargs"]["ratio"] == "1.00"

def test_dispatch_one_command(tmp_path: Path) -> None:
    """--localcluster: the README's main job against xargs over its own gs jobs (on three
    files of the corpus: the benchmark's working is checked here, not its figures)."""
    corpus = tmp_path / "mini"
    corpus.mkdir()
    for name in ("golfer.eps", "spots.ps", "spots2.pdf"):
        shutil.copyfile(CORPUS / name, corpus / name)
    lines = run_bench("bench/dispatch.py", "--localcluster", "--reps", "1",
                      "--corpus", str(corpus))
    rows = {f["contender"]: f for f in map(figures, lines) if "contender" in f}
    assert set(rows) == {"gs-xargs", "localcluster"}
    for row in rows.values():
        assert row["ok"] == "yes" and float(row["median_s"]) > 0
    assert rows["gs-xargs"]["ratio"] == "1.00"


def test_tail_small() -> None:
    """bench/tail.py: a few seconds of work per case; every job once in each .tab."""
    done = subprocess.run([sys.executable, "bench/tail.py", "--work", "6",
                           "--durations", "0.1,0.2", "--heartbeat-timeout", "3",
                           "--cases", "equal,one-slow,dead-node"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    # The exit status also says whether the dead node's jobs went out within the limit:
    # a matter of timing, which CI does not judge.  Correctness it does.
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert lines[0].startswith("machine=")
    rows = {f["case"]: f for f in map(figures, lines) if "case" in f}
    assert set(rows) == {"equal", "one-slow-5x", "dead-node"}, done.stdout
    for row in rows.values():
        assert row["correct"] == "yes", done.stdout + done.stderr[-3000:]
        assert float(row["makespan_s"]) > 0
    assert float(rows["equal"]["ratio"]) > 0 and rows["one-slow-5x"]["slowdowns"] == "5,1,1"
    assert float(rows["dead-node"]["drop_s"]) > 0 and rows["dead-node"]["limit_s"] == "4"


def test_tail_slow_last_small() -> None:
    """bench/tail.py's slow-last case (docs/results.md), small: two nightly runs of one cluster,
    the second ordered slowest first, both with every job once and the right md5.  Their
    times are the benchmark's figures, not asserted here (a loaded CI machine moves them:
    the slow tests were once seen to start later in the ordered run); the order itself is
    checked by tests/e2e/test_slow_tests.py from the order a node started the jobs."""
    done = subprocess.run([sys.executable, "bench/tail.py", "--work", "4",
                           "--durations", "0.1,0.2", "--slow-factor", "8", "--slow-tests", "2",
                           "--cases", "slow-last"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    rows = {f["case"]: f for f in map(figures, lines) if "case" in f}
    assert set(rows) == {"slow-last-corpus-order", "slow-last-slowest-first"}, done.stdout
    corpus, first = rows["slow-last-corpus-order"], rows["slow-last-slowest-first"]
    assert corpus["correct"] == first["correct"] == "yes", done.stdout + done.stderr[-3000:]
    assert first["slow_tests"] == "2x1.6s" and first["max_ratio"] == "1.05"
    assert float(first["slow_started_s"]) >= 0 and float(corpus["slow_started_s"]) >= 0


def test_real_build_on_a_small_ghostpdl_shaped_tree(tmp_path: Path) -> None:
    """bench/real_build.py: first, no-op, one-line rebuild and cached builds of a tree of
    ghostpdl's kind (the small one of test_real_tree_builds: two C files)."""
    from tests.e2e.test_real_tree_builds import write_small_ghostpdl

    tree = write_small_ghostpdl(tmp_path / "ghostpdl")
    lines = run_bench("bench/real_build.py", "--tree", str(tree), "--slots", "2",
                      "--edit", "psi/b.c:return 1;:return 2;")
    row = figures(lines[1])
    assert row["ok"] == "yes", row
    assert row["compiled"] == "1"  # the rebuild compiled the changed file only
    assert int(row["cache_hits"]) >= 1  # the second copy found a.c's object in the cache
    assert float(row["first_s"]) > 0
    assert all(float(row[k]) >= 0 for k in ("noop_s", "rebuild_s", "cached_s"))
