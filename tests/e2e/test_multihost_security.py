"""On a network: a stranger who knows the job id, and a node that meets a changed host key.

The master in one namespace, node1 in another (a proper node), node2 in a third with a
known_hosts file whose key for the master is not the master's (as after a man in the middle
took the address, or the master was reinstalled), and a stranger in a fourth: it can reach
the master's ports but has no account, no key and no secret.  It is told the job id (as
anyone who could read job.start's name off a screen would be).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.report.tab import read_tab
from cluster.runtime.sshd import fingerprint
from cluster.wire.jobstart import JobStart
from tests import netns
from tests.helpers import wait_for
from tests.multihost import (
    RUN_TIMEOUT,
    MakeMultiHost,
    journal_machines,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    tab_names,
)

pytestmark = pytest.mark.e2e

FAKE_MD5 = "f" * 32
#: The stranger: four requests posing as node1 (argv: host port run_id test_name); prints
#: the master's replies as JSON.
STRANGER = """
import json, secrets, socket, sys
host, port, run_id, test = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def talk(lines):
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(("\\n".join(lines) + "\\n").encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode(errors="replace")
me = ["node node1", "id " + run_id, "caps os=linux gs=yes", "slots 8"]
result = "result %s 0 0.10 0.10 0.10 %s gs" % (test, "f" * 32)
print(json.dumps({
    "take": talk(me + ["jobs 0 0", "OK"]),
    "result": talk(me + ["jobs 0 0", result, "OK"]),
    "forged": talk(me + ["jobs 0 0", "nonce " + secrets.token_hex(16), result,
                         "sig " + secrets.token_hex(32), "OK"]),
    "abort": talk(me + ["failure -1 stranger says stop", "OK"]),
}))
"""


def other_host_key(path: Path) -> str:
    """A fresh ed25519 public key line (not the master's)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, timeout=60)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def test_a_stranger_with_the_job_id_is_refused_and_audited_and_a_changed_host_key_is_refused(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    mh = make_multihost(roles=("node1", "node2", "stranger"),
                        gs_configs="ppmraw.72.0 pbmraw.72.0")
    mh.start_master()
    forged = tmp_path / "forged_known_hosts"
    forged.write_text(f"{netns.SERVICE_ADDRESS} {other_host_key(tmp_path / 'other')}\n")
    mh.make_node("node2", known_hosts=forged)
    mh.start_node("node1")
    mh.start_node("node2")
    cluster, home = mh.cluster, mh.cluster.home
    tree = write_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    wait_for(lambda: journal_machines(home)["node1"] >= 2, RUN_TIMEOUT, "node1's results")
    start = JobStart.parse((mh.home_dir / "job.start").read_text())
    test = "ghostpdl-examples__golfer.eps.ppmraw.72.0"
    done = mh.topo.hosts["stranger"].run(
        [sys.executable, "-c", STRANGER, netns.SERVICE_ADDRESS,
         str(cluster.config().port_for(0)), start.id, test], timeout=120,
        hide=[mh.master_root])
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    replies = json.loads(done.stdout.decode())
    for what, reply in replies.items():
        assert reply.startswith("ABORT"), (what, reply)
        assert "JOBS" not in reply and "\t" not in reply, (what, reply)  # no job line
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    # The run went on (the stranger's failure -1 aborted nothing), with true results only.
    names = tab_names(archive)
    assert len(names) == len(set(names)) == 30
    table = read_tab(archive / f"{archive.name}.tab")
    assert all(r.error == 0 for r in table.values())
    assert FAKE_MD5 not in {r.md5 for r in table.values()}
    assert {r.machine for r in table.values()} == {"node1"}
    assert "An error occurred" not in (archive / "report.txt").read_text()
    # Every refusal is in the run's audit trail, naming the stranger's address.
    audit = (archive / "audit.log").read_text()
    refused = [line for line in audit.splitlines()
               if " 10.231.3.2" in line and " refused " in line]
    assert len(refused) >= 4, audit[-3000:]
    assert re.search(r" 10\.231\.1\.2\S* node node1 reported ", audit)
    # node2 never got in: its transport refused the master's key, naming host and key.
    log = (mh.nodes["node2"].work / "log" / "clusterpull.log").read_text()
    real = fingerprint(mh.sshd.host_public)
    assert netns.SERVICE_ADDRESS in log and real in log, log[-3000:]
    assert not (mh.nodes["node2"].work / "tests").exists()
