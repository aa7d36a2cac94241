"""Reproducing one job on a node through the cluster's own protocol: a repro run
(docs/operating.md, "Reproducing one job: `clusteradmin repro`"), end to end.

A local cluster of two nodes runs real gs over two PostScript pages of text; a user's
second push is built with ``-dTextAlphaBits=4``.  ``clusteradmin repro RUN TEST --node
node2 --queue`` queues a one-job repro run that only node2 takes, built from the run's
archived snapshot: it prints the run's md5 as ``same``, with node2's log block of the job.
The repro run leaves the stream's tables as they were, sends no mail, and is not the
user's last run; one whose node never takes it ends by its own job_timeout (exit 3).  A
commit run's repro run exports the commit again and leaves the clean tree and the
baseline alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.master.end import culprit, finish
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.e2e.test_repro import TEXT_PS, commit, git
from tests.e2e.textpages import push_gs, text_cluster
from tests.helpers import REPO, wait_for
from tests.smtp import smtp_server

pytestmark = pytest.mark.e2e


def admin(cluster: LocalCluster, *args: str, timeout: float = 300
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), "repro", *args], capture_output=True,
                          text=True, timeout=timeout)


def tables(cluster: LocalCluster) -> dict[str, bytes]:
    """Every file of the stream's tables folder, by name (what a run's end may change)."""
    return {p.name: p.read_bytes() for p in sorted(cluster.home.tables.iterdir())
            if p.is_file() and not p.name.endswith(".lock")}


def repro_archive(cluster: LocalCluster, stdout: str) -> Path:
    """The repro run's archive, named by the output's ``repro run`` line, once its end is
    done (its run folder, removed last, gone)."""
    line = next(line for line in stdout.splitlines() if line.startswith("repro run "))
    run_id = line.split()[2]
    wait_for(lambda: not cluster.home.run_dir(run_id).exists(), 60, "the repro run's end")
    return cluster.home.archive / run_id


def test_repro_queued_on_node2_gives_the_runs_md5_outside_the_stream(
        tmp_path: Path, make_cluster: MakeCluster) -> None:
    with smtp_server() as (mails, port):
        cluster = text_cluster(tmp_path, make_cluster, TEXT_PS, smtp_host="127.0.0.1",
                               smtp_port=str(port), maintainer="maint@example.org")
        (cluster.home.root / "emails.tab").write_text("alice\talice@example.org\n",
                                                      encoding="utf-8")
        first = push_gs(cluster, [])
        second = push_gs(cluster, ["-dTextAlphaBits=4"])
        mailed = len(mails.wait_for(2, 60))
        test, row = sorted(read_tab(second / f"{second.name}.tab").items())[0]
        before = tables(cluster)
        assert before, "the pushes staged no tables"

        done = admin(cluster, second.name, test, "--node", "node2", "--queue",
                     "--wait-timeout", "240")
        out = done.stdout
        assert done.returncode == 0, out + done.stderr
        assert f"md5 {row.md5}  run {row.md5}  same" in out, out
        line = f"user alice gs nodes=node2 repro={second.name}:{test} reuse=no confirm=no"
        queued = next(q for q in out.splitlines() if q.startswith("queued "))
        assert all(word in queued.split() for word in line.split()), queued
        assert "where node node2, as a repro run (asked with --queue)" in out
        assert f"==={test}===" in out  # node2's log block of the job
        assert "output none kept: a node sends back its logs only" in out
        assert "build digest gs " in out and "environment digest " in out

        archive = repro_archive(cluster, out)
        (new_test, new_row), = read_tab(archive / f"{archive.name}.tab").items()
        assert new_test == test and new_row.machine == "node2" and new_row.md5 == row.md5
        assert sorted(p.name for p in (archive / "logs").glob("*.log")) == [
            "node2.build.log", "node2.log"]  # node2 only
        assert f"queue {RunSpec.parse(queued.split('  ')[0][len('queued '):]).line()}\n" \
            in (archive / "run.info").read_text()
        # Outside the stream: the tables as they were, no mail, not alice's last run.
        assert tables(cluster) == before
        assert not (archive / "mail.log").exists() and len(mails.received) == mailed
        assert finish.last_user_run(cluster.home, "alice") == second
        assert first.name < second.name < archive.name

        unknown = admin(cluster, second.name, test, "--node", "nosuchnode", "--queue")
        assert unknown.returncode == 2 and "unknown node 'nosuchnode'" in unknown.stderr

        # A node that never takes it (disabled): the run ends by its own job_timeout.
        disabled = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                                   *cluster.config_args(), "node", "disable", "node2"],
                                  capture_output=True, text=True, timeout=60)
        assert disabled.returncode == 0, disabled.stderr
        never = admin(cluster, second.name, test, "--node", "node2", "--queue",
                      "--wait-timeout", "3")
        assert never.returncode == 3, never.stdout + never.stderr
        assert "ended timed-out" in never.stderr and "(node node2 never took it)" in \
            never.stderr, never.stderr
        repro_archive(cluster, never.stdout)
        assert tables(cluster) == before and len(mails.received) == mailed  # no FAILED mail


def test_repro_queued_of_a_commit_run_leaves_the_clean_tree_and_baseline(
        tmp_path: Path, make_cluster: MakeCluster) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "text1.ps").write_text(TEXT_PS.format(n=1), encoding="ascii")
    upstream = tmp_path / "upstream"
    write_demo_tree(upstream, "gs", ["-dTextAlphaBits=4"])
    git(upstream, "init", "-q", "-b", "master")
    sha = commit(upstream, "Antialiased text")
    cluster = make_cluster(corpus=corpus, gs_configs="ppmraw.72.0", status_port="0",
                           repositories=f"ghostpdl={upstream}", path_products="=gs",
                           git_branch="master")
    cluster.start()
    run = cluster.wait_for_run(RunSpec("git", sha, ("gs",), ("tree=ghostpdl",)), set(), 120,
                               priority=1)
    later = commit(upstream, "Plain text again", [])
    last = cluster.wait_for_run(RunSpec("git", later, ("gs",), ("tree=ghostpdl",)),
                                {run.name}, 120, priority=1)
    (test, row), = read_tab(run / f"{run.name}.tab").items()
    clean = (cluster.home.root / "ghostpdl" / "options").read_bytes()
    before = tables(cluster)

    done = admin(cluster, run.name, test, "--node", "node2", "--queue", "--wait-timeout",
                 "240")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"md5 {row.md5}  run {row.md5}  same" in done.stdout
    archive = repro_archive(cluster, done.stdout)
    assert read_tab(archive / f"{archive.name}.tab")[test].machine == "node2"
    # The clean tree is still the later commit's, the baseline the later run's.
    assert (cluster.home.root / "ghostpdl" / "options").read_bytes() == clean
    assert tables(cluster) == before
    assert culprit.last_tested(cluster.home, archive.name + "z", "ghostpdl") == (
        last.name, later)
