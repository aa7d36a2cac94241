"""Finding the culprit commit (docs/results.md, "Finding the culprit commit"), end to end.

A real git repository of the demo gs product gets 8 commits.  The first is run (the
baseline); commits 2 to 7 say CLUSTER_UNTESTED, so the poller never queues them, and the
5th adds ``-dTextAlphaBits=4`` to the product's options: the two text tests of the corpus
change there, the picture does not.  The 8th is run: its two differences are confirmed
on the other node, and 6 commits between it and the last tested one were never tested.
The master bisects them with priority-1 runs of only the two changed tests, and mails a
follow-up report naming the 5th commit, its author and the tests; ``clusteradmin culprit``
shows the search.  At most ceil(log2(7)) + 1 = 4 bisection runs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.master.files import culprits
from cluster.report.compare import display_name
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.e2e.test_commit_runs import commit, git, spec_of
from tests.helpers import REPO, wait_for
from tests.smtp import smtp_server

pytestmark = pytest.mark.e2e

LIST = "gs-regression@example.org"
SETTINGS = {"gs_configs": "ppmraw.72.0", "path_products": "=gs", "git_branch": "master",
            "list_address": LIST, "smtp_host": "127.0.0.1",
            # One result per job (a 3-job run would all go to the first node's lone slot).
            "batch_per_slot": "1"}
TEXT_PS = """%!PS
/Helvetica findfont 36 scalefont setfont
72 600 moveto (Culprit {n}) show showpage
"""
PICTURE_PS = """%!PS
0 setgray 30 30 200 300 rectfill showpage
"""


#: A build that fails as a compile error in the tree does (the run fails, not the node).
BROKEN_WRAPPER = "echo \"broken.c:1:1: error: expected ';'\" >&2\nexit 1\n"


def make_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in (1, 2):
        (corpus / f"text{n}.ps").write_text(TEXT_PS.format(n=n), encoding="ascii")
    (corpus / "picture.ps").write_text(PICTURE_PS, encoding="ascii")
    return corpus


def first_commit(tmp_path: Path) -> tuple[Path, str]:
    upstream = tmp_path / "upstream"
    write_demo_tree(upstream, "gs", [])
    git(upstream, "init", "-q", "-b", "master")
    return upstream, commit(upstream, "Demo product, plain gs")


def seven_more(upstream: Path, broken: int | None = None) -> list[str]:
    """Commits 2 to 8: 2..7 never queued (CLUSTER_UNTESTED), the 5th changes the text
    tests; the ``broken`` one's build fails (the next one mends it)."""
    shas = []
    script = upstream / "make_wrapper.sh"
    good_script = script.read_text(encoding="utf-8")
    for n in range(2, 9):
        (upstream / "NOTES").write_text(f"change {n}\n", encoding="utf-8")
        script.write_text(BROKEN_WRAPPER if n == broken else good_script, encoding="utf-8")
        options = ["-dTextAlphaBits=4"] if n == 5 else None
        mark = "" if n == 8 else " CLUSTER_UNTESTED"
        shas.append(commit(upstream, f"Change number {n}{mark}", options))
    return shas


def test_the_fifth_of_eight_commits_is_named_after_at_most_four_bisection_runs(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    upstream, sha = first_commit(tmp_path)
    shas = [sha]
    with smtp_server() as (mails, port):
        cluster = make_cluster(corpus=corpus, repositories=f"ghostpdl={upstream}",
                               smtp_port=str(port), **SETTINGS)
        cluster.start()
        first = cluster.wait_for_run(spec_of(shas[0]), set(), 180, priority=1)
        shas += seven_more(upstream)
        eighth = cluster.wait_for_run(spec_of(shas[7]), {first.name}, 180, priority=1)
        table = read_tab(eighth / f"{eighth.name}.tab")
        text_tests = sorted(n for n in table if "text" in n)
        assert len(table) == 3 and len(text_tests) == 2, table
        confirm = (eighth / "confirm.tsv").read_text()
        assert confirm.count("\tconfirmed\t") == 2, confirm

        # The search ends with its follow-up report, mailed after the two runs' reports.
        record = culprits.path(cluster.home, eighth.name)
        wait_for(lambda: record.exists(), 60, "the culprit search's record")
        received = mails.wait_for(3, 300)
        search = culprits.load(cluster.home, eighth.name)
        assert search is not None and search.state == culprits.DONE, record.read_text()
        assert search.commits == shas
        follow_up = received[2]
        report = (eighth / "culprit.txt").read_text()
        assert follow_up.body.strip() == report.strip()
        assert shas[4][:12] in follow_up.message["Subject"]
        assert f"commit {shas[4]}\nAuthor: Dev Eloper <dev@example.org>" in report, report
        assert "Change number 5 CLUSTER_UNTESTED" in report
        found = report.split(f"commit {shas[4]}", 1)[1]
        assert "first changed 2 test(s):" in found
        for name in text_tests:
            assert f"  {display_name(name)}\n" in found, report
        assert "picture" not in report

        # The bisection runs: at most ceil(log2(7)) + 1, each of only the two changed
        # tests, at priority 1, each a commit among the untested ones; not mailed.
        bisections = []
        for folder in cluster.home.archive.iterdir():
            info = (folder / "run.info").read_text()
            queue = next(line for line in info.splitlines() if line.startswith("queue "))
            spec = RunSpec.parse(queue[len("queue "):])
            if spec.culprit is not None:
                bisections.append((folder, spec))
                assert "priority 1\n" in info
        assert 1 <= len(bisections) <= math.ceil(math.log2(7)) + 1, bisections
        assert len(bisections) == len(search.steps)
        for folder, spec in bisections:
            assert spec.ref in shas[1:7] and spec.culprit[0] == eighth.name
            assert sorted(read_tab(folder / f"{folder.name}.tab")) == text_tests
            assert not (folder / "mail.log").exists()
            assert f"Bisection run (step {spec.culprit[1]}) of the culprit search for run " \
                f"{eighth.name}" in (folder / "report.txt").read_text()
        assert len(mails.received) == 3
        # The baseline is still the eighth commit's, and so is the clean tree.
        baseline = read_tab(cluster.home.tables / "current.tab")
        assert {n: r.md5 for n, r in baseline.items()} == {n: r.md5 for n, r in table.items()}
        assert (cluster.home.root / "ghostpdl" / "NOTES").read_text() == "change 8\n"

        # clusteradmin culprit shows the search.
        def admin(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                                   *cluster.config_args(), "culprit", *args],
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "USER": "tester"})

        shown = admin(eighth.name)
        assert shown.returncode == 0, shown.stderr
        assert f"culprit search for run {eighth.name}" in shown.stdout
        assert f"culprit {shas[4][:12]} (#5)" in shown.stdout, shown.stdout
        assert f"bisection runs: {len(bisections)}" in shown.stdout
        for folder, _ in bisections:
            assert f" run {folder.name} done" in shown.stdout, shown.stdout
        data = json.loads(admin(bisections[0][0].name, "--json").stdout)
        assert [t["culprit"] for t in data["tests"]] == [shas[4], shas[4]]
        assert data["good"] == shas[0] and data["bad"] == shas[7] and data["untested"] == 6
        missing = admin(first.name)
        assert missing.returncode == 1 and "no culprit search" in missing.stderr


def test_a_commit_whose_build_fails_is_skipped_and_named_among_the_suspects(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    upstream, sha = first_commit(tmp_path)
    shas = [sha]
    with smtp_server() as (mails, port):
        cluster = make_cluster(corpus=corpus, repositories=f"ghostpdl={upstream}",
                               smtp_port=str(port), **SETTINGS)
        cluster.start()
        first = cluster.wait_for_run(spec_of(shas[0]), set(), 180, priority=1)
        shas += seven_more(upstream, broken=4)
        eighth = cluster.wait_for_run(spec_of(shas[7]), {first.name}, 180, priority=1)
        wait_for(lambda: culprits.path(cluster.home, eighth.name).exists(), 60,
                 "the culprit search's record")
        received = mails.wait_for(3, 300)
        search = culprits.load(cluster.home, eighth.name)
        assert search is not None and search.state == culprits.DONE
        # The run at the 4th commit failed: skipped; the others ran.
        states = {search.commits[s.commit]: s.state for s in search.steps}
        assert states[shas[3]] == culprits.SKIPPED, states
        assert list(states.values()).count(culprits.SKIPPED) == 1
        skipped = next(s for s in search.steps if s.state == culprits.SKIPPED)
        assert skipped.why.startswith("failed"), skipped
        report = (eighth / "culprit.txt").read_text()
        assert received[2].body.strip() == report.strip()
        ambiguous = report.split("first changed in one of these commits", 1)[1]
        assert f"  {shas[3]} Dev Eloper <dev@example.org> Change number 4" in ambiguous
        assert f"  {shas[4]} Dev Eloper <dev@example.org> Change number 5" in ambiguous
        assert "culprit commit(s) found" in report and "0 culprit commit(s)" in report
        failed = cluster.home.archive / skipped.run
        assert "outcome failed" in (failed / "run.info").read_text()
        assert len(search.steps) <= math.ceil(math.log2(7)) + 1
        assert len(mails.received) == 3  # the failed bisection run mailed nothing
