"""End to end over a network: the master in one namespace, two nodes each in their own.

Real OpenSSH server, real rsync and paramiko, real gs.  The nodes have transport ssh and
cannot see the master home (tests/netns.py hides it), so every file they use came through
the transport, every result through TCP over their veth link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.helpers import REPO, wait_for
from tests.multihost import (
    RUN_TIMEOUT,
    MakeMultiHost,
    MultiHost,
    journal_machines,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    run_once,
    start_all,
    tab_names,
)

pytestmark = pytest.mark.e2e

SMALL_GS = "ppmraw.72.0 pbmraw.72.0 pgmraw.300.1 pkmraw.72.0"
#: Fast configurations: the cut-link test runs the corpus twice.
CUT_GS = "ppmraw.72.0 pbmraw.72.0 pkmraw.72.0"

def test_two_remote_nodes_over_ssh_give_the_results_of_the_local_transport(
        make_multihost: MakeMultiHost, make_cluster: Callable[..., LocalCluster]) -> None:
    mh = make_multihost(gs_configs=SMALL_GS)
    start_all(mh)
    remote = run_once(mh.cluster)
    remote_tab = read_tab(remote / f"{remote.name}.tab")
    names = tab_names(remote)
    assert len(names) == len(set(names)) == 15 * 4
    assert {r.machine for r in remote_tab.values()} == {"node1", "node2"}
    # They came over ssh, from each node's own address.
    sshd_log = mh.sshd.log_path.read_text()
    for address in ("10.231.1.2", "10.231.2.2"):
        assert re.search(rf"Accepted publickey for \S+ from {re.escape(address)}", sshd_log)
    # The same run with the local transport, on loopback.
    mh.stop()
    local_cluster = make_cluster(gs_configs=SMALL_GS)
    local_cluster.start()
    local = run_once(local_cluster)
    local_tab = read_tab(local / f"{local.name}.tab")
    assert sorted(local_tab) == sorted(remote_tab)
    differ = {n: ((local_tab[n].error, local_tab[n].md5), (remote_tab[n].error, remote_tab[n].md5))
              for n in local_tab
              if (local_tab[n].error, local_tab[n].md5) != (remote_tab[n].error, remote_tab[n].md5)}
    assert differ == {}
    assert all(r.error == 0 for r in remote_tab.values())
    # The logs were uploaded over sftp into the archive.
    assert sorted(p.name for p in (remote / "logs").iterdir()) == [
        "node1.build.log", "node1.log", "node2.build.log", "node2.log"]


def test_a_cut_link_mid_run_its_jobs_go_elsewhere_and_the_node_rejoins_when_it_is_back(
        make_multihost: MakeMultiHost) -> None:
    mh = make_multihost(gs_configs=CUT_GS)
    start_all(mh)
    cluster, home = mh.cluster, mh.cluster.home
    tree = write_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    wait_for(lambda: journal_machines(home)["node1"] >= 3, RUN_TIMEOUT, "node1's results")
    mh.topo.cut("node1")
    cut_at = sum(journal_machines(home).values())
    assert cut_at < 15 * 3 - 10, "the run was nearly over before the cut"
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    names = tab_names(archive)
    assert len(names) == len(set(names)) == 15 * 3  # every test exactly once
    table = read_tab(archive / f"{archive.name}.tab")
    assert all(r.error == 0 for r in table.values())
    text = (archive / "report.txt").read_text()
    assert "Nodes lost during the run:" in text and "node1 (not heard from" in text
    # Back on the network: it heartbeats again and takes part in the next run.  Its run.py
    # of the run it was cut from must first be gone (given up while cut off, or, at its
    # first call refused since, finding job.start gone), and clusterpull must heartbeat.
    # So the next run is pushed once node1 says it is idle (else node2 alone may finish its
    # 45 small jobs before node1 comes).
    mh.topo.restore("node1")
    up, status = home.nodes / "node1.up", home.nodes / "node1.status"
    restored = up.stat().st_mtime

    def idle_again() -> bool:
        return up.stat().st_mtime > restored + 0.5 and \
            status.read_text(encoding="utf-8").strip() == "idle"
    wait_for(idle_again, 120, "node1's heartbeat, idle, after the link came back")
    second = run_once(cluster)
    machines = Counter(r.machine for r in read_tab(second / f"{second.name}.tab").values())
    assert machines["node1"] > 0 and machines["node2"] > 0, machines


#: Run on a node (its namespace, master hidden): fetch the tests tree as a BUILD does, into
#: argv[2], with the node's own configuration (argv[1] + the --set pairs after it), and
#: print what rsync moved.
FETCH_PROBE = """
import json, sys
from pathlib import Path
from cluster import config
from cluster import configfile
from cluster.node.sshtransport import SshTransport
cfg = configfile.load(Path(sys.argv[1]), configfile.parse_overrides(sys.argv[3:]))
t = SshTransport.from_config(cfg)
t.fetch_tree("tests", Path(sys.argv[2]))
s = t.last_fetch_stats
print(json.dumps({"sent": s.sent, "received": s.received, "total_size": s.total_size,
                  "files": s.files_transferred, "literal": s.literal}))
"""


def probe_fetch(mh: MultiHost, name: str, dest: Path) -> dict[str, int]:
    node = mh.nodes[name]
    sets = [f"{k}={v}" for k, v in mh.node_settings().items()]
    done = mh.run_on(name, [sys.executable, "-c", FETCH_PROBE, str(node.conf), str(dest),
                            *sets], timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    stats: dict[str, int] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return stats


def test_a_build_after_one_test_file_changed_moves_under_one_percent_of_the_corpus(
        make_multihost: MakeMultiHost) -> None:
    mh = make_multihost(roles=("node1",), gs_configs="ppmraw.72.0")
    start_all(mh)
    first = run_once(mh.cluster)
    assert len(tab_names(first)) == 15
    node = mh.nodes["node1"]
    mirror = node.work / "tests"
    corpus = mh.home_dir / "tests"
    corpus_bytes = sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file())
    assert sorted(p.name for p in mirror.rglob("*")) == sorted(p.name for p in corpus.rglob("*"))
    # The whole corpus, as the first BUILD fetched it (into an empty directory).
    full = probe_fetch(mh, "node1", mh.root / "node1" / "probe-full")
    assert full["sent"] + full["received"] >= corpus_bytes
    # One test file changes on the master.
    changed = corpus / "ghostpdl-examples" / "tiger.eps"
    changed.write_bytes(changed.read_bytes() + b"%% one changed line\n")
    # What the next BUILD's fetch moves: measured on a copy of the node's mirror as the
    # BUILD finds it (so the BUILD itself still has the change to fetch).
    probe = mh.root / "node1" / "probe-tests"
    shutil.copytree(mirror, probe, symlinks=True)
    stats = probe_fetch(mh, "node1", probe)
    moved = stats["sent"] + stats["received"]
    share = moved / corpus_bytes
    print(f"\nBUILD after one changed test file: moved {moved} bytes of a {corpus_bytes}-byte "
          f"corpus ({share:.2%}); the full fetch moved {full['sent'] + full['received']}")
    assert stats["files"] == 1
    assert share < 0.01, stats
    # The BUILD of the next run gets the change and the run goes on as ever.
    second = run_once(mh.cluster)
    assert len(tab_names(second)) == 15
    assert (mirror / "ghostpdl-examples" / "tiger.eps").read_bytes() == changed.read_bytes()
