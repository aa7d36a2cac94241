"""End to end: clusterpush --master from a developer's machine to a real running master.

The master (a local cluster: supervisor, monitor, nodes) is reached only through a private
OpenSSH server on 127.0.0.1: the developer's tree lives elsewhere, and the real
``clusterpush.py --master`` sends it with rsync over ssh.  A nightly run makes the baseline;
two remote pushes are run by the master, and each report compares with the baseline and
with the previous push, as a local push's does (tests/e2e/test_user_runs.py).  Then an
``abort`` over ssh stops a running remote push.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.runtime.sshd import PrivateSshd
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e


def table_of(archive: Path) -> dict[str, str]:
    return {n: r.md5 for n, r in read_tab(archive / f"{archive.name}.tab").items()}


def section(text: str, title: str) -> list[str]:
    body = text.split(title + "\n", 1)[1].split("\n\n", 1)[0]
    return sorted(line.split()[0] for line in body.splitlines())


def shown(names: list[str]) -> list[str]:
    return sorted(n.replace("__", "/") for n in names)


def remote_clusterpush(sshd: PrivateSshd, cluster: LocalCluster, tree: Path, user: str,
                       *words: str) -> str:
    """The real clusterpush.py --master, run from the top of ``tree``, with no view of the
    master home but the ssh server (no --config, no --home)."""
    done = subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"),
         "--master", f"{sshd.user}@{sshd.address}:{cluster.home_dir}",
         "--ssh-port", str(sshd.port), "--ssh-key", str(sshd.client_key),
         "--known-hosts", str(sshd.known_hosts), "--master-cache", str(sshd.root / "cache"),
         "--user", user, *words],
        cwd=tree, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_remote_pushes_are_run_and_reported_like_local_ones(make_cluster: MakeCluster,
                                                            tmp_path: Path) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0")
    home = cluster.home_dir
    write_demo_tree(home / "ghostpdl", "gs", [])  # the master's clean tree
    jobdef = home / "auto" / "nightly" / "plain" / "jobdef.txt"
    jobdef.parent.mkdir(parents=True)
    jobdef.write_text("gs\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(REPO / "enqueue_auto.py"), "--config",
                           str(cluster.conf_path), "nightly"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    with PrivateSshd(tmp_path / "sshd") as sshd:
        cluster.start()
        baseline = table_of(cluster.wait_for_run(RunSpec.parse("auto nightly-plain gs"), set(),
                                                 240, priority=2))
        assert len(baseline) == 15

        def push(options: list[str]) -> Path:
            tree = write_demo_tree(tmp_path / "laptop" / "ghostpdl", "gs", options)
            subprocess.run(["make"], cwd=tree, check=True, capture_output=True)
            (tree / ".git").mkdir(exist_ok=True)
            (tree / ".git" / "HEAD").write_text("ref: refs/heads/master\n")
            before = cluster.archives()
            printed = remote_clusterpush(sshd, cluster, tree, "alice", "gs")
            spec = RunSpec.parse(printed.splitlines()[0].removeprefix("queueing: "))
            assert spec.ref == "alice" and "changed file(s)" in printed
            pushed = cluster.home.users / "alice" / "ghostpdl"
            assert not (pushed / ".git").exists() and not (pushed / "bin").exists()
            return cluster.wait_for_run(spec, before, 240)

        first = push(["-dTextAlphaBits=4"])
        text1 = (first / "report.txt").read_text()
        after1 = table_of(first)
        changed1 = sorted(n for n in after1 if after1[n] != baseline[n])
        assert changed1 and len(changed1) < 15
        assert section(text1, f"Differences in {len(changed1)} of 15 non-pdfwrite/ps2write "
                              "test(s):") == shown(changed1)
        assert "No previous clusterpush to compare with" in text1
        diff1 = text1.split("Source differences from trunk (first 2500 lines):", 1)[1]
        assert "+-dTextAlphaBits=4" in diff1 and "cluster_command.run" not in diff1

        second = push(["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"])
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


def test_remote_abort_stops_the_running_run_and_withdraws_the_queued_one(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0 ppmraw.72.1 pkmraw.72.0 pgmraw.72.1")
    with PrivateSshd(tmp_path / "sshd") as sshd:
        cluster.start()
        tree = slow_demo_tree(tmp_path / "laptop" / "ghostpdl", "gs", [])
        before = cluster.archives()
        printed = remote_clusterpush(sshd, cluster, tree, "ann", "gs")
        running = RunSpec.parse(printed.splitlines()[0].removeprefix("queueing: "))
        wait_for(lambda: len(cluster.home.results(0).read_text().splitlines()) > 4
                 if cluster.home.results(0).exists() else False, 120, "some results")
        queue = QueueFile(cluster.home.queue(0), cluster.home.queue_lock(0))
        assert queue.read() == [running]
        queue.append(RunSpec.parse("user ann gs filter=golfer"))
        printed = remote_clusterpush(sshd, cluster, tree, "ann", "abort")
        assert "removed 1 queued run(s)" in printed and "stopping the running run" in printed
        archive = cluster.wait_for_run(running, before, 60)
        text = (archive / "report.txt").read_text()
        assert "The run was aborted by its user (clusterpush abort) after" in text
        assert queue.read() == []
