"""Nodes from a real single-host Slurm during runs (docs/provisioning.md): a Slurm job scancelled
mid-run has its jobs handed out again (every test once, none with an error: the jobs its
stop cut are given back, not reported); a second run queued while ephemeral nodes are idle
is served by them (the provisioner asks only for the nodes missing); the provisioner killed
and started again adopts the jobs it finds and submits nothing twice."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.localcluster import PROVISIONER_SCRIPT, LocalCluster
from cluster.provision.slurm import SlurmEngine
from cluster.report.tab import read_tab
from cluster.runtime import proc
from tests.helpers import CORPUS, FAST, free_port, slow_demo_tree, wait_for
from tests.multihost import journal_machines

# One worker runs the Slurm modules one after the other (each starts a private Slurm
# and its pilots; tests/e2e/test_slurm_master_loss.py measures timings).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]

RUN_TIMEOUT = 240.0


@pytest.fixture
def slurm_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path / "home", 0, CORPUS, {
        **FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": "0", "max_nodes": "2", "node_slots": "1", "resource_interval": "1",
        "ephemeral_idle": "30", "gs_configs": "ppmraw.72.0 pbmraw.72.0"},
        provider="slurm")
    cluster.prepare()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(grace=10)


def _jobs(cluster: LocalCluster) -> dict[str, str]:
    """The ephemeral nodes' Slurm jobs: job id -> state."""
    assert cluster.slurm is not None
    engine = SlurmEngine(env=cluster.slurm.env)
    return {job.job_id: job.state for job in engine.jobs("slurm")}


def _push(cluster: LocalCluster, name: str) -> tuple[Path, set[str]]:
    """A slow demo tree to push (its jobs take 0.1 s each) and the archives before."""
    tree = slow_demo_tree(cluster.home_dir / "demo" / name, "gs", [])
    before = cluster.archives()
    return tree, before


def test_scancel_mid_run_then_idle_nodes_reused_then_a_provisioner_restart(
        slurm_cluster: LocalCluster) -> None:
    cluster = slurm_cluster
    tree, before = _push(cluster, "first")
    spec = cluster.push(tree, "tester", ["gs"], [])
    # Both nodes came from Slurm and sent results: then one of their jobs is scancelled.
    wait_for(lambda: len([m for m, n in journal_machines(cluster.home).items() if n >= 3])
             >= 2, 120, "two Slurm-started nodes sending results")
    running = sorted(j for j, state in _jobs(cluster).items() if state == "running")
    assert len(running) == 2, running
    assert cluster.slurm is not None
    SlurmEngine(env=cluster.slurm.env).cancel(running[0])
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    text = (archive / f"{archive.name}.tab").read_text()
    names = [line.split("\t", 1)[0] for line in text.splitlines()]
    assert names and len(names) == len(set(names))  # every test once
    table = read_tab(archive / f"{archive.name}.tab")
    assert all(row.error == 0 for row in table.values())
    machines = {row.machine for row in table.values()}
    assert all(m.startswith("slurm-") for m in machines), machines
    log_path = cluster.home.log_dir / "clusterscale.out"

    def submitted() -> int:
        return log_path.read_text(errors="replace").count(": submitted ")

    # A second run while the nodes are idle (ephemeral_idle 30 s): the nodes still up
    # serve it (no new batch job for them), and the provisioner asks only for the rest.
    time.sleep(2)  # the provisioner's last looks of the first run
    alive = {j for j, state in _jobs(cluster).items() if state == "running"}
    assert alive
    count = submitted()
    tree, before = _push(cluster, "second")
    spec = cluster.push(tree, "tester", ["gs"], [])
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    machines = {row.machine for row in read_tab(archive / f"{archive.name}.tab").values()}
    assert {f"slurm-{j}" for j in alive} <= machines, (alive, machines)
    assert submitted() - count <= 2 - len(alive)

    # The provisioner killed and started again adopts the jobs it finds: while they run
    # and are all it needs, it submits nothing.
    time.sleep(2)
    alive = {j for j, state in _jobs(cluster).items() if state == "running"}
    count = submitted()
    daemon = cluster.daemons[PROVISIONER_SCRIPT]
    proc.kill_tree(daemon.child.pid, signal.SIGKILL)
    daemon.child.wait(timeout=10)
    del cluster.daemons[PROVISIONER_SCRIPT]
    tree, before = _push(cluster, "third")
    spec = cluster.push(tree, "tester", ["gs"], [])
    assert cluster.slurm is not None
    cluster._spawn(PROVISIONER_SCRIPT, [], "clusterscale.out",
                   env={**cluster.slurm.env, "TMPDIR": str(cluster.home_dir / "slurm" / "tmp")},
                   daemon=True, role="provisioner")
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    assert read_tab(archive / f"{archive.name}.tab")
    assert submitted() - count <= 2 - len(alive)
    assert len(_jobs(cluster)) <= 2  # never more than max_nodes jobs
