"""Reproducing one job (docs/operating.md, "Reproducing one job: `clusteradmin repro`"),
end to end.

A local cluster of two nodes runs real gs over two PostScript pages of text.  The first
push becomes the baseline; the second push's build adds ``-dTextAlphaBits=4``, so its
outputs differ from the baseline's.  ``clusteradmin repro`` on a test of the second run
gives the run's md5 on the node that ran it, on the other node and ``--here`` (the run's
archived snapshot built in a work folder of its own), keeps the raster and compares it
with the baseline's by bmpcmp.  After a third push rebuilds the node's build folder
without the option, the node gives another md5 (exit 1, and the build digest says it is
not the run's build), while ``--here`` still gives the run's.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.e2e.textpages import push_gs, text_cluster
from tests.helpers import REPO

pytestmark = pytest.mark.e2e

#: A page of text: -dTextAlphaBits=4 changes its pixels.
TEXT_PS = """%!PS
/Helvetica findfont 36 scalefont setfont
72 600 moveto (Again, {n}) show showpage
"""


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), "repro", *args], capture_output=True,
                          text=True, timeout=120)


def kept_output(stdout: str) -> Path:
    line = next(line for line in stdout.splitlines() if line.startswith("output "))
    return Path(line.split(" ", 1)[1])


def test_repro_gives_the_runs_md5_on_its_node_and_here(tmp_path: Path,
                                                       make_cluster: MakeCluster) -> None:
    cluster = text_cluster(tmp_path, make_cluster, TEXT_PS)

    def push(options: list[str]) -> Path:
        return push_gs(cluster, options)

    first = push([])
    shutil.copy(first / f"{first.name}.tab", cluster.home.tables / "current.tab")
    second = push(["-dTextAlphaBits=4"])
    rows = read_tab(second / f"{second.name}.tab")
    test, row = sorted(rows.items())[0]
    assert row.md5 != read_tab(first / f"{first.name}.tab")[test].md5
    work = tmp_path / "work"

    on_node = admin(cluster, second.name, test, "--work", str(work))
    assert on_node.returncode == 0, on_node.stdout + on_node.stderr
    out = on_node.stdout
    assert f"md5 {row.md5}  run {row.md5}  same" in out, out
    assert f"where node {row.machine}, work folder " in out
    assert f"made by node {row.machine}" in out and "build key user__alice__ghostpdl" in out
    assert "(the run's: same)" in out  # build and environment digests as the node said
    assert f"/{row.machine}/build/user__alice__ghostpdl/bin/gs -sOutputFile=" in out
    raster = kept_output(out)
    assert hashlib.md5(raster.read_bytes()).hexdigest() == row.md5
    # The baseline's raster, rendered from the master's clean tree, compared by bmpcmp.
    assert "bmpcmp: 1 page(s) compared, 1 image set(s) written" in out, out
    assert list(raster.parent.glob("bmpcmp.00000.*.png"))

    other = "node2" if row.machine == "node1" else "node1"
    if (second / "logs" / f"{other}.build.log").is_file():  # it built the run too
        there = admin(cluster, second.name, test, "--node", other, "--work", str(work))
        assert there.returncode == 0, there.stdout + there.stderr
        assert f"md5 {row.md5}  run {row.md5}  same" in there.stdout

    here = admin(cluster, second.name, test.replace("__", "/"), "--here", "--work", str(work))
    assert here.returncode == 0, here.stdout + here.stderr
    assert f"md5 {row.md5}  run {row.md5}  same" in here.stdout
    assert f"built from the run's snapshot {second}/source/ghostpdl" in here.stdout
    assert "build digest gs " in here.stdout and "(the run's: same)" in here.stdout
    assert (work / "build" / "user__alice__ghostpdl" / "bin" / "gs").is_file()

    # The node's build folder rebuilt without the option: another md5, and another build.
    push([])
    changed = admin(cluster, second.name, test, "--work", str(work))
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert f"run {row.md5}  DIFFERENT" in changed.stdout
    digest = next(line for line in changed.stdout.splitlines()
                  if line.startswith("build digest gs "))
    assert "(the run's: same)" not in digest, changed.stdout
    again = admin(cluster, second.name, test, "--here", "--work", str(work))
    assert again.returncode == 0 and f"md5 {row.md5}  run {row.md5}  same" in again.stdout

    unknown = admin(cluster, second.name, "nope.ps.ppmraw.72.0")
    assert unknown.returncode == 2 and "unknown test 'nope.ps.ppmraw.72.0'" in unknown.stderr
    unknown = admin(cluster, "20200101000000-p0-0000", test)
    assert unknown.returncode == 2 and "unknown run" in unknown.stderr


def test_repro_here_of_a_commit_run_exports_the_commit_again(
        tmp_path: Path, make_cluster: MakeCluster) -> None:
    """A commit run's exported tree is not archived (it becomes the clean tree): --here
    exports the commit again from the master's clone and builds it; the md5 is the run's,
    even after a later commit replaced the clean tree."""
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
    cluster.wait_for_run(RunSpec("git", later, ("gs",), ("tree=ghostpdl",)), {run.name}, 120,
                         priority=1)
    (test, row), = read_tab(run / f"{run.name}.tab").items()
    here = admin(cluster, run.name, test, "--here", "--work", str(tmp_path / "work"))
    assert here.returncode == 0, here.stdout + here.stderr
    assert f"built from commit {sha} of ghostpdl, exported again" in here.stdout
    assert f"md5 {row.md5}  run {row.md5}  same" in here.stdout
    assert "build digest gs " in here.stdout


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=Dev Eloper", "-c",
                           "user.email=dev@example.org", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def commit(repo: Path, message: str, options: list[str] | None = None) -> str:
    if options is not None:
        (repo / "options").write_text("".join(o + "\n" for o in options), encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")
