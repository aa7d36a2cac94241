"""Differences confirmed, indeterminate tests named (docs/results.md, "Differences
confirmed, indeterminate tests named"), end to end.

A local cluster of two nodes running real gs over a corpus of three PostScript files
written here: one draws a rectangle whose size comes from ``realtime``, ``srand`` and
``rand`` (its output changes by itself), two draw text.  The first push is the baseline.  The second
push's build adds ``-dTextAlphaBits=4``: the text tests really change, and the random one
changes by itself.  The master runs the changed tests a second time before it reports:
the text tests' change is confirmed on the other node, the random test is reported
indeterminate (not as a difference) and ``clusteradmin flaky`` lists it.  A third push of
the same build with ``confirm=no`` differs only in the random test: its report says so in
its first lines, and the random test is recorded again: the same job (build, test file,
command) as the second run's gave another output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.console.status import run_detail
from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.compare import display_name
from cluster.report.tab import read_tab
from tests.helpers import FAST, REPO, free_port

pytestmark = pytest.mark.e2e

#: A page whose rectangle's size is random, seeded from ``realtime``.  Not ``realtime
#: srand`` alone: gs's realtime counts milliseconds from its own start, so that seed took a
#: dozen values (28-42 here) and two runs drew the same page about one time in ten (the
#: third run then "differed in nothing").  The seed is how often a loop ran in 30 ms of
#: realtime: 118,000-214,000 in six runs.
RANDOM_PS = """%!PS
/t realtime 30 add def /n 0 def { /n n 1 add def realtime t ge { exit } if } loop
n srand
/w rand 500 mod 20 add def /h rand 600 mod 20 add def
0 setgray 30 30 w h rectfill showpage
"""
#: A page of text: -dTextAlphaBits=4 changes its pixels, nothing else does.
TEXT_PS = """%!PS
/Helvetica findfont 36 scalefont setfont
72 600 moveto (Differences, {n}) show 72 500 moveto (confirmed twice) show showpage
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "random.ps").write_text(RANDOM_PS, encoding="ascii")
    for n in (1, 2):
        (corpus / f"text{n}.ps").write_text(TEXT_PS.format(n=n), encoding="ascii")
    overrides = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                 "status_port": "0", "gs_configs": "ppmraw.72.0",
                 # The first node's lone slot would take every job of a 3-job run.
                 "batch_per_slot": "1",
                 # On here: a complete run's results stored by job key (build, test file,
                 # command), so that a later run of the same job can be compared.
                 "result_cache": "yes"}
    local = LocalCluster(tmp_path / "home", 2, corpus, overrides)
    local.prepare()
    try:
        yield local
    finally:
        local.stop(grace=10)


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "USER": "tester"})


def test_a_random_test_is_indeterminate_and_a_real_difference_is_confirmed_elsewhere(
        cluster: LocalCluster) -> None:
    cluster.start()
    cluster.wait_for_nodes()

    def push(options: list[str], words: tuple[str, ...] = ()) -> Path:
        tree = write_demo_tree(cluster.home_dir / "alice" / "ghostpdl", "gs", options)
        before = cluster.archives()
        spec = cluster.push(tree, "alice", ["gs"], list(words))
        return cluster.wait_for_run(spec, before, 60)

    first = push([])
    assert "Differences run a second time" not in (first / "report.txt").read_text()
    assert not (first / "confirm.tsv").exists()  # nothing to compare with: no confirm

    second = push(["-dTextAlphaBits=4"])
    report = (second / "report.txt").read_text()
    table = read_tab(second / f"{second.name}.tab")
    random_test = display_name(next(n for n in table if "random.ps" in n))
    text_ids = sorted(n for n in table if "text" in n)
    text_tests = [display_name(n) for n in text_ids]
    assert len(text_tests) == 2, table

    # The random test: indeterminate, with its three md5s, and not a difference.
    assert "test(s) are indeterminate" in report, report
    flaky_line = next(line for line in report.splitlines()
                      if line.startswith(f"{random_test} md5s: "))
    assert flaky_line.count("(baseline)") == 1 and "node" in flaky_line
    diffs = report.split("Differences from previous clusterpush:")[1]
    assert random_test not in diffs.split("indeterminate")[0], report
    # The text tests: a real difference, still reported, confirmed on the other node.
    for test_id, name in zip(text_ids, text_tests, strict=True):
        assert f"\n{name} " in diffs, report
        confirmed = f"{name} confirmed on "
        line = next(line for line in report.splitlines() if line.startswith(confirmed))
        node = line[len(confirmed):]
        assert node in ("node1", "node2") and node != table[test_id].machine, report
    # run.info counts the two real differences only (the status page shows it).
    info = (second / "run.info").read_text()
    assert "differences 2\n" in info and "indeterminate 1\n" in info, info

    # Recorded: clusteradmin flaky lists it, history shows it.
    listed = admin(cluster, "flaky")
    assert listed.returncode == 0, listed.stderr
    assert random_test in listed.stdout and second.name in listed.stdout, listed.stdout
    data = json.loads(admin(cluster, "flaky", "--json").stdout)
    assert [f["test"] for f in data["flaky"]] == [random_test]
    assert len(data["flaky"][0]["digests"]) == 3 and len(data["flaky"][0]["nodes"]) == 2
    # The status model's view of the run (what the page's per-run view shows).
    detail = run_detail(cluster.home, second.name)
    kinds = {v["test"]: v["kind"] for v in detail["confirm"]}
    assert sorted(kinds.values()) == ["confirmed", "confirmed", "indeterminate"], kinds
    history = admin(cluster, "history", random_test)
    assert history.returncode == 0 and "indeterminate" in history.stdout, history.stdout

    # A later run of the same build, not confirmed (confirm=no) and run whole (reuse=no):
    # only the random test differs from the push before, and the report says so at its
    # top, not as an alarm.  Its job is the same as the second run's (same build, test
    # file, command) with another output: recorded as indeterminate across the two runs.
    third = push(["-dTextAlphaBits=4"], ("confirm=no", "reuse=no"))
    report = (third / "report.txt").read_text()
    assert not (third / "confirm.tsv").exists(), report
    assert f"\n\ndiffers only in known-indeterminate tests: {random_test}\n" in report, report
    assert "gave another output than an earlier run of the same build" in report, report
    assert f"\n{random_test} md5s: " in report.split("same build")[1], report
    data = json.loads(admin(cluster, "flaky", "--json").stdout)
    assert [(f["test"], f["run"]) for f in data["flaky"]] == \
        [(random_test, third.name), (random_test, second.name)], data
