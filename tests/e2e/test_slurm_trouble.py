"""Bad cases of the batch system (docs/provisioning.md): Slurm absent, or its controller down.

A localcluster with one static node (no provider) and, beside it, the provisioner
(``clusterscale.py --config <the cluster's>``) started as cron would, but against a
Slurm it cannot use: its PATH holds no Slurm command, or its ``SLURM_CONF`` names a
private Slurm whose slurmctld has been stopped.  Each case checks what an administrator
relies on: the provisioner's log has a WARNING naming the Slurm command and quoting what
it said, the provisioner keeps running (and stops cleanly on SIGTERM), and a run queued
once it is in that trouble is served by the static node, every test once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.defaults import REPO_ROOT
from cluster.demotree import write_demo_tree
from cluster.localcluster import PROVISIONER_SCRIPT, LocalCluster
from cluster.provision.slurmhost import PrivateSlurm
from cluster.report.tab import read_tab
from cluster.runtime import proc
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS, wait_for

pytestmark = pytest.mark.e2e

#: The run's files (4 jobs: one configuration).
FILES = ("tiger.eps", "golfer.eps", "colorcir.ps", "escher.ps")
#: How long a stopped provisioner may take: the current look ends first, and a Slurm
#: command against a dead controller takes about 9 s to give up [seconds].
STOP_TIMEOUT = 40.0


def _static_cluster(make_cluster: MakeCluster, tmp_path: Path) -> LocalCluster:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    cluster = make_cluster(nodes=1, corpus=corpus, gs_configs="ppmraw.72.0",
                           status_port="0", resource_interval="1")
    cluster.start()
    cluster.wait_for_nodes()
    return cluster


def _provisioner(cluster: LocalCluster, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """clusterscale.py with the cluster's configuration and ``env`` over this process's."""
    argv = [sys.executable, str(REPO_ROOT / PROVISIONER_SCRIPT), *cluster.config_args()]
    with open(cluster.home.log_dir / "clusterscale.out", "ab") as out:
        return proc.spawn(argv, stdout=out, stderr=proc.STDOUT, cwd=cluster.home_dir,
                          env={**os.environ, **env})


def _warning_then_run_served(cluster: LocalCluster, tmp_path: Path,
                             provisioner: subprocess.Popen[bytes], warning: str) -> str:
    """Wait for a WARNING line containing ``warning`` in the provisioner's log; then queue
    a run and wait for its archive; check the run and that the provisioner still runs,
    then stop it with SIGTERM (exit 0).  The provisioner's log."""
    log_path = cluster.home.log_dir / "clusterscale.log"

    def warned() -> bool:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return any(" WARNING " in line and warning in line for line in text.splitlines())
    try:
        wait_for(warned, 60, f"a WARNING with {warning!r} in {log_path}")
        tree = write_demo_tree(tmp_path / "tree", "gs", [])
        before = cluster.archives()
        spec = cluster.push(tree, "tester", ["gs"], [])
        archive = cluster.wait_for_run(spec, before, timeout=120)
        assert provisioner.poll() is None, "the provisioner exited: " + (
            cluster.home.log_dir / "clusterscale.out").read_text(errors="replace")
    finally:
        provisioner.send_signal(signal.SIGTERM)
        try:
            status = provisioner.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill_tree(provisioner.pid)
            provisioner.wait(timeout=10)
            raise
    assert status == 0
    text = (archive / f"{archive.name}.tab").read_text()
    names = [line.split("\t", 1)[0] for line in text.splitlines()]
    # Every test once: the corpus's four files in the one configuration.
    assert sorted(names) == sorted(f"corpus__{name}.ppmraw.72.0" for name in FILES), names
    table = read_tab(archive / f"{archive.name}.tab")
    assert {row.machine for row in table.values()} == {"node1"}
    assert all(row.error == 0 for row in table.values()), table
    log = log_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert "stopped by signal" in log
    return log


def test_slurm_absent_is_a_warning_naming_the_command_and_the_run_is_served_by_the_static_node(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = _static_cluster(make_cluster, tmp_path)
    no_slurm = tmp_path / "bin"  # a PATH with no Slurm command in it
    no_slurm.mkdir()
    provisioner = _provisioner(cluster, {"PATH": str(no_slurm)})
    _warning_then_run_served(
        cluster, tmp_path, provisioner,
        f"the jobs cannot be listed: squeue: not found on PATH ({no_slurm}); is Slurm's "
        "client (slurm-client) installed?")


def test_slurm_controller_down_is_a_warning_quoting_slurm_and_the_run_is_served_by_the_static_node(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = _static_cluster(make_cluster, tmp_path)
    with PrivateSlurm(tmp_path / "slurm", cpus=2) as slurm:
        ctld = slurm.pids["slurmctld"]
        proc.kill_tree(ctld, signal.SIGTERM)  # the controller down; munged, slurmd stay
        wait_for(lambda: "slurmctld" not in slurm.pids, 15, "slurmctld to exit")
        provisioner = _provisioner(cluster, slurm.env)
        _warning_then_run_served(
            cluster, tmp_path, provisioner,
            "the jobs cannot be listed: squeue: exit status 1: slurm_load_jobs error: "
            "Unable to contact slurm controller")
