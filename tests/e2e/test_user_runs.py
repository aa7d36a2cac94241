"""End to end: a developer's pushes, their reports and mails, and a bmpcmp follow-up run.

The master's clean tree is the plain demo gs product; a nightly auto run of it makes the
baseline.  Alice pushes her tree twice (one option, then a second one): each report
compares with the baseline and with her previous push, ends with the source diff against
the clean tree, and is mailed to her (Cc the maintainer).  Then ``bmpcmp`` renders the
tests that differ with both builds and writes PNG difference images and an HTML page.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster import bmpcmp
from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO, slow_demo_tree, wait_for
from tests.smtp import smtp_server

pytestmark = pytest.mark.e2e

ALICE = "alice@example.org"
MAINTAINER = "keeper@example.org"
SETTINGS = {"gs_configs": "ppmraw.72.0", "smtp_host": "127.0.0.1", "maintainer": MAINTAINER}


def table_of(archive: Path) -> dict[str, str]:
    return {n: r.md5 for n, r in read_tab(archive / f"{archive.name}.tab").items()}


def section(text: str, title: str) -> list[str]:
    """The test names listed under the first ``title`` line (up to the blank line)."""
    body = text.split(title + "\n", 1)[1].split("\n\n", 1)[0]
    return sorted(line.split()[0] for line in body.splitlines())


def shown(names: list[str]) -> list[str]:
    return sorted(n.replace("__", "/") for n in names)


def clusterpush(cluster: LocalCluster, tree: Path, user: str, *words: str) -> str:
    """Run the real clusterpush.py from the top of ``tree``; return what it printed."""
    done = subprocess.run([sys.executable, str(REPO / "clusterpush.py"), *cluster.config_args(),
                           "--user", user, *words], cwd=tree, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def push(cluster: LocalCluster, options: list[str], flags: list[str] | None = None) -> Path:
    """Alice's demo tree with ``options``, pushed with clusterpush.py; its run's archive."""
    tree = write_demo_tree(cluster.home_dir / "alice-tree" / "ghostpdl", "gs", options)
    # A developer's tree has build outputs and history that must not travel.
    subprocess.run(["make"], cwd=tree, check=True, capture_output=True)
    (tree / ".git").mkdir(exist_ok=True)
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/master\n")
    before = cluster.archives()
    printed = clusterpush(cluster, tree, "alice", "gs", *(flags or []))
    spec = RunSpec.parse(printed.strip().removeprefix("queueing: "))
    assert spec.ref == "alice"
    pushed = cluster.home.users / "alice" / "ghostpdl"
    assert not (pushed / ".git").exists() and not (pushed / "bin").exists()
    return cluster.wait_for_run(spec, before, 240)


def test_user_reports_compare_with_baseline_and_previous_push_then_bmpcmp(
        make_cluster: MakeCluster) -> None:
    with smtp_server() as (mails, port):
        cluster = make_cluster(smtp_port=str(port), **SETTINGS)
        home = cluster.home_dir
        (home / "emails.tab").write_text(f"alice\t{ALICE}\n", encoding="utf-8")
        write_demo_tree(home / "ghostpdl", "gs", [])  # the master's clean tree
        jobdef = home / "auto" / "nightly" / "plain" / "jobdef.txt"
        jobdef.parent.mkdir(parents=True)
        jobdef.write_text("gs\n", encoding="utf-8")
        done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--config",
                               str(cluster.conf_path), "nightly"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        cluster.start()
        baseline_run = cluster.wait_for_run(RunSpec.parse("auto nightly-plain gs"), set(),
                                            240, priority=2)
        baseline = table_of(baseline_run)
        assert len(baseline) == 15

        # Push 1: text antialiasing.
        first = push(cluster, ["-dTextAlphaBits=4"])
        text1 = (first / "report.txt").read_text()
        after1 = table_of(first)
        changed1 = sorted(n for n in after1 if after1[n] != baseline[n])
        assert changed1 and len(changed1) < 15
        assert section(text1, f"Differences in {len(changed1)} of 15 non-pdfwrite/ps2write "
                              "test(s):") == shown(changed1)
        assert "Differences from previous clusterpush:" in text1
        assert "No previous clusterpush to compare with" in text1
        diff1 = text1.split("Source differences from trunk (first 2500 lines):", 1)[1]
        assert "+-dTextAlphaBits=4" in diff1 and "options" in diff1
        assert "cluster_command.run" not in diff1 and "bin/gs" not in diff1

        # Push 2: graphics antialiasing as well.
        second = push(cluster, ["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"])
        text2 = (second / "report.txt").read_text()
        after2 = table_of(second)
        vs_base = sorted(n for n in after2 if after2[n] != baseline[n])
        vs_push = sorted(n for n in after2 if after2[n] != after1[n])
        assert vs_push and vs_push != vs_base
        against_base, against_push = text2.split("Differences from previous clusterpush:", 1)
        assert section(against_base, f"Differences in {len(vs_base)} of 15 "
                                     "non-pdfwrite/ps2write test(s):") == shown(vs_base)
        assert section(against_push, f"Differences in {len(vs_push)} of 15 "
                                     "non-pdfwrite/ps2write test(s):") == shown(vs_push)
        assert "+-dGraphicsAlphaBits=4" in text2.split("Source differences from trunk")[1]

        # Both reports went to Alice, Cc the maintainer, and match the archived text.
        mails_now = mails.wait_for(3, 60)  # the nightly's, then Alice's two
        for received, archive in zip(mails_now[1:], (first, second), strict=True):
            assert sorted(received.rcpt_tos) == sorted([ALICE, MAINTAINER])
            assert received.message["To"] == ALICE and received.message["Cc"] == MAINTAINER
            assert received.body.strip() == (archive / "report.txt").read_text().strip()

        # bmpcmp: the tests that differ from the baseline, rendered by both builds.
        run = push(cluster, ["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"], ["bmpcmp"])
        page = run / "bmpcmp" / "index.html"
        html = page.read_text()
        diffs = sorted((run / "bmpcmp").glob("*.diff.png"))
        assert diffs
        drawn = {p.name.split(".0000")[0] for p in diffs}
        for name in drawn:
            assert name in vs_base  # only tests that changed have images
        for png in diffs:
            assert png.name in html
            image = bmpcmp.read_png(png)
            assert bmpcmp.changed_pixels(image) > 0  # the change is visible
        report = (run / "report.txt").read_text()
        assert "bmpcmp finished" in report and str(page) in report
        bmp_mail = mails.wait_for(4, 60)[3]
        assert "bmpcmp finished" in bmp_mail.message["Subject"]
        assert bmp_mail.rcpt_tos[0] == ALICE


def test_a_bmpcmp_without_an_earlier_run_is_reported_to_the_maintainer_for_an_unknown_user(
        make_cluster: MakeCluster) -> None:
    """The run cannot start: it is reported, mailed and dequeued; nothing waits forever."""
    with smtp_server() as (mails, port):
        cluster = make_cluster(smtp_port=str(port), **SETTINGS)
        cluster.start()
        tree = write_demo_tree(cluster.home_dir / "m" / "ghostpdl", "gs", [])
        spec = cluster.push(tree, "mallory", ["gs"], ["bmpcmp"])
        archive = cluster.wait_for_run(spec, set(), 120)
        text = (archive / "report.txt").read_text()
        assert "The run could not start" in text
        assert "user mallory has no earlier run to bmpcmp" in text
        received = mails.wait_for(1, 60)[0]
        assert received.rcpt_tos == [MAINTAINER]
        assert "bad username mallory" in received.message["Subject"]
        assert received.body.strip() == text.strip()
        assert "mailed" in (archive / "mail.log").read_text()


def test_clusterpush_abort_stops_the_running_run_and_withdraws_the_queued_one(
        make_cluster: MakeCluster) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0 ppmraw.72.1 pkmraw.72.0 pgmraw.72.1")
    cluster.start()
    tree = slow_demo_tree(cluster.home_dir / "ann" / "ghostpdl", "gs", [])
    before = cluster.archives()
    running = RunSpec.parse(clusterpush(cluster, tree, "ann", "gs").strip()
                            .removeprefix("queueing: "))
    wait_for(lambda: len(cluster.home.results(0).read_text().splitlines()) > 4
             if cluster.home.results(0).exists() else False, 120, "some results")
    queue = QueueFile(cluster.home.queue(0), cluster.home.queue_lock(0))
    assert queue.read() == [running]
    queue.append(RunSpec.parse("user ann gs filter=golfer"))  # waits behind the running one
    printed = clusterpush(cluster, tree, "ann", "abort")
    assert "removed 1 queued run(s)" in printed and "stopping the running run" in printed
    archive = cluster.wait_for_run(running, before, 60)
    text = (archive / "report.txt").read_text()
    assert "The run was aborted by its user (clusterpush abort) after" in text
    assert "of 60 tests; no table was changed." in text
    assert queue.read() == []
    assert not (cluster.home.tables / "user-ann.tab").exists()
    assert not (cluster.home_dir / "abort.job").exists()
    assert not cluster.home.job_start(0).exists()
