"""Ephemeral nodes (docs/provisioning.md, "Ephemeral nodes"; ``clusterpull.py --ephemeral``)
on a real local cluster.

Real processes throughout: the monitor, the supervisor and the clustermaster of a
localcluster with no static node, and an ephemeral node started by hand as a batch job
would start it.  Each case checks the node's exit status, the one a batch system acts on:
0 when it is no longer wanted (idle for ``ephemeral_idle``, or the resource file says every
priority is finished), 3 when the master cannot be reached (Slurm's ``RequeueExit=3``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.defaults import PRIORITIES, REPO_ROOT
from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from cluster.runtime import proc
from cluster.wire.resources import (
    MasterInfo,
    NodeLaunch,
    PriorityInfo,
    Resources,
    format_resources,
    read_resources,
)
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS, wait_for

pytestmark = pytest.mark.e2e

#: The run's files (4 jobs: one configuration).
FILES = ("tiger.eps", "golfer.eps", "colorcir.ps", "escher.ps")
#: ephemeral_idle of these tests [seconds]: small, so the idle exit is seen quickly.
IDLE = 2.0


def _small_corpus(root: Path) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    return corpus


def _ephemeral(cluster: LocalCluster, out: Path, *options: str,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``clusterpull.py --ephemeral`` with the cluster's settings and ``options``."""
    argv = [sys.executable, str(REPO_ROOT / "clusterpull.py"), *cluster.config_args(),
            "--ephemeral", *options]
    with open(out, "ab") as log:
        return proc.spawn(argv, stdout=log, stderr=proc.STDOUT, cwd=cluster.home_dir,
                          env={**os.environ, **(env or {})})


def _exit_status(child: subprocess.Popen[bytes], timeout: float, out: Path) -> int:
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill_tree(child.pid)
        child.wait(timeout=10)
        pytest.fail(f"the ephemeral node did not exit within {timeout:.0f} s; its output:\n"
                    + out.read_text(errors="replace"))


def _resource_file(cluster: LocalCluster, written: float, status: str,
                   prefix: str = "pilot", first: str = "", path: Path | None = None) -> None:
    """A resource file as the master writes it (cluster.wire.resources): priority 0 in
    ``first`` (default ``status``), the others in ``status``; a running priority's run not
    started yet (no id), a finished one's run named."""
    priorities = {}
    for p in PRIORITIES:
        state = first if p == 0 and first else status
        priorities[p] = PriorityInfo(state, "earlier-run" if state == "finished" else "",
                                     jobs_left=4 * (state == "running"),
                                     nodes_wanted=int(state == "running"))
    text = format_resources(Resources(
        written=written, master=MasterInfo("localhost", "127.0.0.1", 1, 9000, 9010),
        priorities=priorities, nodes_wanted=sum(i.nodes_wanted for i in priorities.values()),
        node=NodeLaunch(("clusterpull.py", "--ephemeral"), 1, prefix, IDLE)))
    (path or cluster.home_dir / "resources.json").write_text(text, encoding="utf-8")


def _served_alone(cluster: LocalCluster, tmp_path: Path, name: str,
                  wait_for_offer: Callable[[], object], *options: str,
                  on_archive: Callable[[], None] | None = None
                  ) -> tuple[Path, int, float, Path]:
    """Push a run, start ephemeral node ``name`` once ``wait_for_offer()`` returns, and
    wait for the run's archive (then ``on_archive()``) and the node's exit: (archive, exit
    status, seconds from the archive to the exit, work folder).  The run's table must be the
    node's alone."""
    tree = write_demo_tree(tmp_path / "tree", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    wait_for_offer()
    out = tmp_path / f"{name}.out"
    work = tmp_path / f"{name}-work"
    child = _ephemeral(cluster, out, "--name", name, "--work", str(work), *options)
    try:
        archive = cluster.wait_for_run(spec, before, timeout=60)
        if on_archive is not None:
            on_archive()
        ended = time.monotonic()
        status = _exit_status(child, IDLE + 15, out)
    finally:
        if child.poll() is None:
            proc.kill_tree(child.pid)
            child.wait(timeout=10)
    table = read_tab(archive / f"{archive.name}.tab")
    assert len(table) == len(FILES), table
    assert {r.machine for r in table.values()} == {name}
    assert all(r.error == 0 for r in table.values()), table
    assert status == 0, out.read_text(errors="replace")
    # Leaving, it said goodbye: the monitor removed its files, so no list shows it (no
    # provisioner here to see its job end).
    assert not any((cluster.home.nodes / f"{name}{ext}").exists()
                   for ext in (".up", ".status", ".caps"))
    monitor_log = (cluster.home.log_dir / "monitor_port.log").read_text(errors="replace")
    assert re.search(rf"node {name} \(peer \S+\) said goodbye", monitor_log)
    # The node made its own key through its local transport, as a static node does.
    assert (cluster.home_dir / "node-keys" / f"{name}.key").is_file()
    assert (work / "runs").is_dir()  # run.py worked in the session's folder
    return archive, status, time.monotonic() - ended, work


def test_an_ephemeral_node_runs_a_queued_run_then_leaves_after_ephemeral_idle(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, corpus=_small_corpus(tmp_path),
                           gs_configs="ppmraw.72.0", ephemeral_idle="3",
                           resource_interval="1", status_port="0")
    cluster.start()  # the monitor and the supervisor (which writes the resource file)

    def wanted() -> object:
        """As a provisioner does: start the node once the master's file wants one."""
        def says() -> bool:
            try:
                found = read_resources(cluster.home_dir / "resources.json", time.time(), 1.0)
            except (OSError, ValueError):
                return False
            return found.nodes_wanted > 0
        return wait_for(says, 30, "the master's resource file wanting a node")

    _, _, after, work = _served_alone(cluster, tmp_path, "e1", wanted)
    # Having worked, it waited out ephemeral_idle (3 s) once the file said the run was
    # over (a run queued meanwhile would have taken it), then left.
    assert after < 15
    log = (work / "log" / "clusterpull.log").read_text(errors="replace")
    assert "nothing wanted of it for" in log


def test_an_ephemeral_node_without_the_resource_file_exits_0_after_ephemeral_idle(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, corpus=_small_corpus(tmp_path),
                           gs_configs="ppmraw.72.0", ephemeral_idle=str(IDLE),
                           resource_interval="1", status_port="0")
    cluster.start()
    view = cluster.home_dir / "node-view.json"  # the node's resource file: nobody writes it

    def queued() -> object:
        # While the run waits for its master (up to a supervisor tick, 10 s: five times
        # ephemeral_idle) the node's file says a run is on; dated a minute ahead, so that
        # it stays fresh (3 resource intervals) while nobody rewrites it.
        _resource_file(cluster, time.time() + 60, "idle", first="running", path=view)
        return True

    def gone() -> None:
        view.unlink(missing_ok=True)

    _, _, after, work = _served_alone(cluster, tmp_path, "e2", queued,
                                      "--set", f"resource_file={view.name}",
                                      on_archive=gone)
    assert after <= IDLE + 10
    log = (work / "log" / "clusterpull.log").read_text(errors="replace")
    assert f"nothing wanted of it for {IDLE:.0f} s" in log


def test_an_ephemeral_node_exits_3_when_the_master_cannot_be_reached(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, connect_retries="3", connect_retry_delay="0.2",
                           status_port="0")  # prepared, never started: every port closed
    out = tmp_path / "e2.out"
    work = tmp_path / "e2-work"
    started = time.monotonic()
    status = _exit_status(_ephemeral(cluster, out, "--name", "e2", "--work", str(work)),
                          20, out)
    assert status == 3, out.read_text(errors="replace")
    assert time.monotonic() - started >= 2 * 0.2  # it retried, with the pause between
    log = (work / "log" / "clusterpull.log").read_text(errors="replace")
    assert "could not be reached in 3 tries" in log
    assert log.count("heartbeat failed") == 3


def test_a_stale_resource_file_is_not_believed_and_the_node_exits_3(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, connect_retries="2", connect_retry_delay="0.2",
                           status_port="0")
    _resource_file(cluster, written=time.time() - 3600, status="finished")  # master dead
    out = tmp_path / "e3.out"
    status = _exit_status(_ephemeral(cluster, out, "--name", "e3", "--work",
                                     str(tmp_path / "e3-work")), 20, out)
    assert status == 3, out.read_text(errors="replace")


def test_an_ephemeral_node_exits_0_at_once_when_the_resource_file_says_finished(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, connect_retries="50", connect_retry_delay="0.2",
                           status_port="0")
    _resource_file(cluster, written=time.time(), status="finished", prefix="pilot")
    out = tmp_path / "slurm.out"
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    started = time.monotonic()
    # Named as a Slurm job is: <the resource file's prefix>-<SLURM_JOB_ID>, in $TMPDIR.
    status = _exit_status(_ephemeral(cluster, out, env={"SLURM_JOB_ID": "4711",
                                                        "TMPDIR": str(tmpdir)}), 20, out)
    assert status == 0, out.read_text(errors="replace")
    assert time.monotonic() - started < 5  # at once: 50 failed heartbeats would be 10 s
    log = (tmpdir / "pilot-4711" / "log" / "clusterpull.log").read_text(errors="replace")
    assert "every priority is idle or finished" in log
    assert "heartbeat" not in log  # it never called the master
    assert not (cluster.home_dir / "node-keys" / "pilot-4711.key").exists()


def test_an_ephemeral_node_without_a_name_or_a_job_id_is_a_usage_error(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=0, status_port="0")
    out = tmp_path / "noname.out"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    argv = [sys.executable, str(REPO_ROOT / "clusterpull.py"), *cluster.config_args(),
            "--ephemeral"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env,
                          cwd=cluster.home_dir, check=False)
    assert done.returncode == 2, done.stderr
    assert "SLURM_JOB_ID" in done.stderr and "--name" in done.stderr
    assert not out.exists()
