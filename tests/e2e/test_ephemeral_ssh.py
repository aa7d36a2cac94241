"""An ephemeral node that logs in over ssh (docs/provisioning.md "Its key").

Real processes: a localcluster's monitor and supervisor with no node, its private sshd on
loopback, and ``clusterpull.py --ephemeral`` started with the very ``node.command`` the
running master wrote into its resource file -- with ``node_config`` set, so the command
names the batch nodes' node.conf (``transport = ssh`` and the login) -- as Slurm job 77
would start it.  No Slurm: the key the node signs with is made by the provisioner's own
key step (:class:`cluster.provision.jobkeys.JobKeys`) for job id 77, as clusterscale makes
it right after sbatch gives the id.  The node's resource file is pointed at a file nobody
writes, so its heartbeats decide: it calls in, nothing is wanted of it for
``ephemeral_idle``, and it exits 0.  Without its key it is refused and exits 3.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.provision.jobkeys import JobKeys
from cluster.runtime import proc
from cluster.wire.resources import read_resources
from tests.e2e.conftest import MakeCluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

#: ephemeral_idle of the node [seconds]: small, so its idle exit comes quickly.
IDLE = 2.0


def _ssh_cluster(make_cluster: MakeCluster, tmp_path: Path) -> tuple[LocalCluster, Path]:
    """A started cluster (no node, its sshd) whose master has ``node_config`` set to a
    node.conf of ssh settings; (the cluster, that node.conf)."""
    node_conf = tmp_path / "batch-node.conf"
    cluster = make_cluster(nodes=0, status_port="0", resource_interval="1",
                           ephemeral_idle=f"{IDLE:g}", node_config=str(node_conf))
    cluster.transport = "ssh"
    cluster.start_sshd()
    sshd = cluster.sshd
    assert sshd is not None
    # As the batch nodes see the master: over ssh, with their own login key.  The retries
    # are few and quick so that a node without its key gives up within seconds.
    node_conf.write_text(
        "[node]\ntransport = ssh\n"
        f"ssh_port = {sshd.port}\nssh_user = {getpass.getuser()}\n"
        f"ssh_key = {sshd.client_key}\nssh_known_hosts = {sshd.known_hosts}\n"
        "connect_retries = 3\nconnect_retry_delay = 0.3\nheartbeat_interval = 0.5\n",
        encoding="utf-8")
    cluster.start()  # the monitor and the supervisor, which writes the resource file
    return cluster, node_conf


def _node_command(cluster: LocalCluster) -> list[str]:
    """The resource file's node.command, as the running master wrote it."""
    def written() -> tuple[str, ...] | None:
        try:
            found = read_resources(cluster.home_dir / "resources.json", time.time(), 1.0)
        except (OSError, ValueError):
            return None
        return found.node.command
    return list(wait_for(written, 30, "the master's resource file"))


def _run_node(cluster: LocalCluster, tmp_path: Path, command: list[str], name: str,
              timeout: float) -> tuple[int, str]:
    """Run ``command`` (python + the node command) as Slurm's job would, named ``name``,
    its resource file one nobody writes; (exit status, its log)."""
    work = tmp_path / f"{name}-work"
    out = tmp_path / f"{name}.out"
    argv = [sys.executable, *command, "--name", name, "--work", str(work),
            "--set", f"resource_file={cluster.home_dir / 'nobody-writes.json'}"]
    with open(out, "wb") as log:
        child = proc.spawn(argv, stdout=log, stderr=proc.STDOUT, cwd=tmp_path,
                           env={**os.environ, "SLURM_JOB_ID": name.rsplit("-", 1)[1]})
    try:
        status = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill_tree(child.pid)
        child.wait(timeout=10)
        pytest.fail(f"ephemeral node {name} did not exit within {timeout:.0f} s:\n"
                    + out.read_text(errors="replace"))
    return status, (work / "log" / "clusterpull.log").read_text(errors="replace")


def test_an_ephemeral_node_over_ssh_is_served_with_the_key_the_provisioner_made(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster, node_conf = _ssh_cluster(make_cluster, tmp_path)
    command = _node_command(cluster)
    assert command[1:4] == ["--ephemeral", "--config", str(node_conf)]
    made = JobKeys(cluster.home_dir, "slurm")(["77"])
    assert made == [cluster.home_dir / "node-keys" / "slurm-77.key"]

    status, log = _run_node(cluster, tmp_path, command, "slurm-77", timeout=IDLE + 30)
    assert status == 0, log
    assert f"nothing wanted of it for {IDLE:.0f} s" in log
    # It called in, signed with that key, and the monitor took it -- to the last
    # heartbeat, its goodbye, which took its files off the lists.
    monitor_log = (cluster.home.log_dir / "monitor_port.log").read_text(errors="replace")
    assert re.search(r"node slurm-77 \(peer \S+\) said goodbye", monitor_log)
    assert not (cluster.home.nodes / "slurm-77.up").exists()
    assert "heartbeat failed" not in log
    # Through the sshd, with the batch nodes' login key.
    sshd_log = (cluster.home_dir / "ssh" / "sshd.log").read_text(errors="replace")
    assert re.search(r"Accepted publickey for \S+ from 127\.0\.0\.1", sshd_log)


def test_without_its_key_an_ephemeral_node_over_ssh_is_refused_and_exits_3(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    """The key is what lets it in: a node over ssh never makes one itself."""
    cluster, _ = _ssh_cluster(make_cluster, tmp_path)
    status, log = _run_node(cluster, tmp_path, _node_command(cluster), "slurm-78",
                            timeout=30)
    assert status == 3, log
    assert log.count("the master holds no key for node slurm-78 (node-keys/slurm-78.key in "
                     "its home): bootstrap_node.py makes it for a node it sets up, the "
                     "provisioner (clusterscale.py) for an ephemeral node's job") == 3
    assert not (cluster.home_dir / "node-keys" / "slurm-78.key").exists()
    assert not (cluster.home.nodes / "slurm-78.up").exists()
