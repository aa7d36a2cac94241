"""bootstrap_node.py sets up a fresh node machine over ssh; the node then takes part in a run.

The fresh node is a namespace with nothing of the cluster in it but its own sshd (the way
in for the master's admin) and the tools; it cannot see the master home, and its crontab
is a private one (a tmpfs over /var/spool/cron in its mount namespace), so nothing is
written to this machine's real crontab.  bootstrap_node.py runs on the master; the node's
clusterpull is then started exactly as the crontab line it installed says.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cluster.report.tab import read_tab
from cluster.runtime.sshd import PrivateSshd
from tests import netns
from tests.helpers import command, wait_for
from tests.multihost import (
    MakeMultiHost,
    MultiHost,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    run_once,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("crontab")]  # one worker: crontabs

#: The fresh node's own crontab spool (its cron is not running: the test runs the entry).
CRON_SPOOL = Path("/var/spool/cron")
PRIVATE_SPOOL = ("mkdir -m 1730 /var/spool/cron/crontabs && "
                 "chgrp crontab /var/spool/cron/crontabs")


class NodeSshd(PrivateSshd):
    """The fresh node's sshd: in its namespace, with the master's directory hidden and a
    private cron spool, so every session (bootstrap's commands, clusterpull) lives there."""

    def __init__(self, root: Path, host: netns.Host, hide: list[Path]) -> None:
        super().__init__(root, address=host.address, port=22, netns=host.netns)
        self.host = host
        self.hide = [*hide, CRON_SPOOL]

    def _netns_prefix(self) -> list[str]:
        return self.host.argv([], hide=self.hide, setup=PRIVATE_SPOOL)


def ssh_to(sshd: PrivateSshd, command: str) -> list[str]:
    """The OpenSSH client argv running ``command`` on ``sshd``'s machine as its user."""
    return ["ssh", "-F", "none", "-p", str(sshd.port), "-i", str(sshd.client_key),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={sshd.known_hosts}", "-o", "ConnectTimeout=15",
            f"{sshd.user}@{sshd.address}", command]


def bootstrap(mh: MultiHost, node_sshd: PrivateSshd, remote_dir: Path,
              key: Path | None = None, *extra: str) -> tuple[int, str]:
    """bootstrap-node (the PATH command) run on the master (its namespace) for the fresh
    node, with ``key`` (default: the master sshd's client key) as the node's own key for
    the master, and ``extra`` options."""
    argv = [*command("bootstrap-node"), node_sshd.address,
            "--name", "fresh", "--user", node_sshd.user, "--key", str(node_sshd.client_key),
            "--known-hosts", str(node_sshd.known_hosts), "--dir", str(remote_dir),
            "--python", sys.executable, "--master-host", netns.SERVICE_ADDRESS,
            "--master-home", str(mh.home_dir), "--master-user", mh.sshd.user,
            "--master-port", str(mh.sshd.port),
            "--send-master-key", str(key or mh.sshd.client_key),
            "--send-master-known-hosts", str(mh.sshd.known_hosts),
            "--config", str(mh.cluster.conf_path), "--node-set", "slots=1",
            # Jobs as the node's account, root (job_user's own test: test_job_user.py).
            "--job-user", "", *extra]
    for name, value in mh.node_settings().items():
        argv += ["--node-set", f"{name}={value}"]
    done = mh.topo.master.run(argv, timeout=600)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def test_bootstrap_node_sets_up_a_fresh_node_that_joins_a_run_and_a_second_call_changes_nothing(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    mh = make_multihost(roles=("fresh",), gs_configs="ppmraw.72.0")
    mh.start_master()
    host = mh.topo.hosts["fresh"]
    node_sshd = NodeSshd(tmp_path / "fresh-sshd", host, [mh.master_root])
    remote_dir = tmp_path / "fresh" / "cluster-node"
    clusterpull: subprocess.Popen[bytes] | None = None
    try:
        node_sshd.start(timeout=30)
        code, out = bootstrap(mh, node_sshd, remote_dir)
        assert code == 0, out
        assert "capabilities: " in out and "changed: " in out, out
        for what in ("node.conf", "crontab", "master_key", "known_hosts"):
            assert what in out.split("changed: ", 1)[1], (what, out)
        assert (remote_dir / "clusterpull.py").is_file()
        assert (remote_dir / "master_key").stat().st_mode & 0o077 == 0
        # Again: nothing to change.
        code, again = bootstrap(mh, node_sshd, remote_dir)
        assert code == 0, again
        assert "nothing changed: the node was already set up" in again, again
        # The node's crontab (its own) holds the entry; run what it says.
        # (From the master's namespace: the node's address exists nowhere else.)
        crontab = mh.topo.master.run(ssh_to(node_sshd, "crontab -l"), timeout=60)
        assert crontab.returncode == 0, crontab.stderr
        entries = [line for line in crontab.stdout.decode().splitlines()
                   if "clusterpull.py" in line and not line.startswith("#")]
        assert len(entries) == 1, crontab.stdout.decode()
        command = entries[0].split(None, 5)[5].rsplit(" # ", 1)[0]
        assert str(remote_dir / "node.conf") in command
        log = tmp_path / "fresh-clusterpull.out"
        with open(log, "ab") as out_file:
            clusterpull = subprocess.Popen(mh.topo.master.argv(ssh_to(node_sshd, command)),
                                           stdout=out_file, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        wait_for(lambda: (mh.home_dir / "nodes" / "fresh.up").exists(), 120,
                 "the fresh node's first heartbeat")
        archive = run_once(mh.cluster)
        machines = Counter(r.machine for r in read_tab(archive / f"{archive.name}.tab").values())
        assert machines == Counter({"fresh": 15}), machines
    finally:
        if clusterpull is not None:
            clusterpull.kill()
            clusterpull.wait(timeout=30)
        node_sshd.stop()
