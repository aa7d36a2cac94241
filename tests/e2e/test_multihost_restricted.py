"""A node restricted by ``bootstrap_node.py --restrict`` runs a whole run through the node gate,
and its login can neither read the master's secrets nor write outside its upload area.

A fresh node machine (a namespace with its own sshd, the master's directory hidden) is set
up by bootstrap_node.py with a key of its own for the master, first unrestricted: it runs
the demo run.  Then bootstrap_node.py --restrict puts the gate's line in place of that key's
line in the master's authorized_keys, the node's clusterpull is started again and the same
run is made: the table is the unrestricted run's, test by test, and the gate refused
nothing.  Last, from the node machine with its own node.conf and node code: cluster.secret,
another node's key and writes outside its upload area are refused, each in the gate's words.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.master.gate import gate
from cluster.report.tab import read_tab
from cluster.runtime import proc
from tests import netns
from tests.e2e.test_multihost_bootstrap import NodeSshd, bootstrap, ssh_to
from tests.helpers import wait_for
from tests.multihost import (
    MakeMultiHost,
    MultiHost,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    run_once,
)

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("crontab")]  # one worker: crontabs

#: What the node tries, with its own node.conf and node code, once restricted: each
#: attempt's outcome ("ok", or the error's text) by name, as JSON.
ATTEMPTS = r"""
import json, sys, tempfile
from pathlib import Path
from cluster import config
from cluster import configfile
from cluster.node.transports import make_transport
cfg = configfile.load(Path(sys.argv[1]))
t = make_transport(cfg)
payload = Path(tempfile.mkdtemp()) / "payload"
payload.write_text("written by the node\n")
tries = {
    "own key": lambda: t.read_secret("node-keys/fresh.key"),
    "cluster.secret": lambda: t.read_secret("cluster.secret"),
    "other key": lambda: t.read_secret("node-keys/other.key"),
    "job list": lambda: t.upload(payload, "tests/planted.pdf"),
    "other log": lambda: t.upload(payload, "runs/x/logs/other.log"),
    "queue": lambda: t.upload(payload, "queue.lst"),
}
out = {}
for name, attempt in tries.items():
    try:
        attempt()
        out[name] = "ok"
    except Exception as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def start_clusterpull(mh: MultiHost, node_sshd: NodeSshd, remote_dir: Path,
                      log: Path) -> subprocess.Popen[bytes]:
    """The node's clusterpull, started as its crontab entry would (through its sshd)."""
    line = (f"{sys.executable} {remote_dir / 'clusterpull.py'} --config "
            f"{remote_dir / 'node.conf'}")
    with open(log, "ab") as out:
        return subprocess.Popen(mh.topo.master.argv(ssh_to(node_sshd, line)), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(child: subprocess.Popen[bytes] | None) -> None:
    if child is not None and child.poll() is None:
        proc.kill_tree(child.pid, signal.SIGKILL)
        child.wait(timeout=30)


def results(archive: Path) -> dict[str, tuple[int, str]]:
    """Each test's outcome in a run's table: error code and md5 (times differ)."""
    return {name: (row.error, row.md5)
            for name, row in read_tab(archive / f"{archive.name}.tab").items()}


def test_a_restricted_node_runs_a_whole_run_and_reaches_nothing_else(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    mh = make_multihost(roles=("fresh",), gs_configs="ppmraw.72.0")
    mh.start_master()
    host = mh.topo.hosts["fresh"]
    node_sshd = NodeSshd(tmp_path / "fresh-sshd", host, [mh.master_root])
    remote_dir = tmp_path / "fresh" / "cluster-node"
    key = tmp_path / "fresh_master_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fresh", "-f",
                    str(key)], check=True, timeout=60)
    mh.sshd.authorize(key.with_suffix(".pub"))  # unrestricted, as before --restrict
    clusterpull: subprocess.Popen[bytes] | None = None
    log = tmp_path / "fresh-clusterpull.out"
    try:
        node_sshd.start(timeout=30)
        code, out = bootstrap(mh, node_sshd, remote_dir, key)
        assert code == 0, out
        clusterpull = start_clusterpull(mh, node_sshd, remote_dir, log)
        wait_for(lambda: (mh.home_dir / "nodes" / "fresh.up").exists(), 120,
                 "the fresh node's first heartbeat")
        open_run = results(run_once(mh.cluster))
        stop(clusterpull)

        code, out = bootstrap(mh, node_sshd, remote_dir, key, "--restrict",
                              "--authorized-keys", str(mh.sshd.authorized_keys))
        assert code == 0, out
        assert f"restricted login: replaced in {mh.sshd.authorized_keys}" in out, out
        public = key.with_suffix(".pub").read_text().split()[1]
        lines = [x for x in mh.sshd.authorized_keys.read_text().splitlines() if public in x]
        # The gate reads the master's configuration (its max_upload_bytes).
        assert lines == [gate.authorized_line(
            gate.gate_command(mh.home_dir, "fresh", config=mh.cluster.conf_path),
            key.with_suffix(".pub").read_text())], lines
        gate_log = mh.home_dir / "log" / gate.LOG_NAME
        clusterpull = start_clusterpull(mh, node_sshd, remote_dir, log)
        archive = run_once(mh.cluster)
        machines = Counter(r.machine for r in read_tab(archive / f"{archive.name}.tab")
                           .values())
        assert machines == Counter({"fresh": 15}), machines
        assert results(archive) == open_run
        assert not gate_log.exists() or "refused" not in gate_log.read_text(), \
            gate_log.read_text()
        # The run went through the gate: sshd started it for the node's sessions (SFTP,
        # the listings, the rsync fetches).
        gated = mh.sshd.log_path.read_text().count(
            "forced-command (key-option) "
            f"'{gate.gate_command(mh.home_dir, 'fresh', config=mh.cluster.conf_path)}'")
        assert gated >= 3, gated
        stop(clusterpull)
        clusterpull = None

        # What the restricted node reaches, with its own configuration and code.
        secret = mh.home_dir / "cluster.secret"  # a home from before node keys keeps one
        secret.write_text("ab" * 32 + "\n")
        secret.chmod(0o600)
        nodekeys.ensure_node_key(mh.home_dir, "other")
        (mh.home_dir / "runs" / "x" / "logs").mkdir(parents=True)
        done = host.run([sys.executable, "-c", ATTEMPTS, str(remote_dir / "node.conf")],
                        timeout=120, hide=[mh.master_root],
                        env={"PYTHONPATH": str(remote_dir)})
        assert done.returncode == 0, done.stderr.decode()
        outcome = json.loads(done.stdout.decode().splitlines()[-1])
        assert outcome.pop("own key") == "ok"
        for name, text in outcome.items():
            assert "nodegate" in text and "refused" in text, (name, text)
        assert "cluster.secret is one of the master's secrets" in outcome["cluster.secret"]
        assert "node-keys/other.key is one of the master's secrets" in outcome["other key"]
        for planted in ("tests/planted.pdf", "runs/x/logs/other.log"):
            assert not (mh.home_dir / planted).exists(), planted
        queue = mh.home_dir / "queue.lst"
        assert not queue.exists() or "written by the node" not in queue.read_text()
        # Any other command: one line naming it, exit 1.
        shell = mh.topo.hosts["fresh"].run(
            ["ssh", "-F", "none", "-p", str(mh.sshd.port), "-i", str(remote_dir / "master_key"),
             "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={remote_dir / 'known_hosts'}",
             f"{mh.sshd.user}@{netns.SERVICE_ADDRESS}", "cat", str(secret)],
            timeout=60, hide=[mh.master_root])
        assert shell.returncode == 1, shell.stderr.decode()
        assert f"nodegate: 'cat {secret}' refused for node fresh" in shell.stderr.decode()
        assert gate_log.read_text().count("refused") >= 6
    finally:
        stop(clusterpull)
        node_sshd.stop()
