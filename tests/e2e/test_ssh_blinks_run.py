"""A whole run over the ssh transport whose ssh sessions are cut: at the node's first
logins and during BUILD's fetches.

A real local cluster (monitor, supervisor, clustermasters, its private sshd) and one real
node, clusterpull/run.py, whose ssh connections go through a cutting proxy
(:mod:`tests.sshcut`): run.py's first login is cut, its next session once it is well under
way (in BUILD's listings of the trees), and BUILD's rsync of the corpus mid-transfer.
The node must ride out every blink: take part in the run (its name in every row of the
table), each test exactly once, none failed, the same outcomes as the same run without
cuts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.helpers import CORPUS, FAST, free_port
from tests.sshcut import Cut, CuttingProxy

pytestmark = pytest.mark.e2e

FILES = ("tiger.eps", "golfer.eps", "escher.ps")
CONFIGS = "ppmraw.72.0 pbmraw.72.0"
RUN_TIMEOUT = 180.0
#: Where run.py's second session is cut [bytes from the server]: past its login, its first
#: SFTP reads, into BUILD's listings (the whole session brings about 6.5 KB down).
LISTING_CUT = 4500


def _cluster(root: Path, transport: str) -> LocalCluster:
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for name in FILES:
        shutil.copy(CORPUS / name, corpus / name)
    settings = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": "0", "gs_configs": CONFIGS, "connect_retries": "20"}
    cluster = LocalCluster(root / "home", 0, corpus, settings, transport=transport)
    cluster.prepare()
    return cluster


def _run(cluster: LocalCluster, settings: dict[str, str] | None = None
         ) -> dict[str, tuple[int, str, str]]:
    """One demo gs run served to node1, started with ``settings`` over its usual ones; the
    run's table."""
    cluster.start_node("node1", settings=settings)
    tree = write_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    return {name: (r.error, r.md5, r.machine)
            for name, r in read_tab(archive / f"{archive.name}.tab").items()}


def test_a_node_whose_ssh_sessions_are_cut_takes_part_and_nothing_is_lost_or_doubled(
        tmp_path: Path) -> None:
    clean_cluster = _cluster(tmp_path / "clean", "local")
    try:
        clean_cluster.start()
        clean = _run(clean_cluster)
    finally:
        clean_cluster.stop(grace=10)

    cluster = _cluster(tmp_path / "cut", "ssh")
    # The node's connections, in order: paramiko 1 (clusterpull reads its key), paramiko 2
    # (the node code's MANIFEST), OpenSSH 1 (the node code), paramiko 3 (run.py: job.start,
    # its key, BUILD's listings, the uploads), OpenSSH 2 and 3 (BUILD's rsyncs of the corpus
    # and the source).  Cut: run.py's login, its next session well after its login (in
    # BUILD's listings), and the corpus's rsync mid-transfer.
    cuts = [Cut("paramiko", 3), Cut("paramiko", 4, after=LISTING_CUT),
            Cut("OpenSSH", 2, after=64 * 1024)]
    try:
        cluster.start()  # its private sshd first
        assert cluster.sshd is not None
        with CuttingProxy(cluster.sshd.port, cuts) as proxy:
            known = proxy.known_hosts(cluster.sshd.known_hosts, tmp_path / "proxy_known_hosts")
            table = _run(cluster, {"ssh_port": str(proxy.port), "ssh_known_hosts": str(known)})
            login_cuts = sorted(c.client.split("_")[0] for c in proxy.cut("login"))
            data_cuts = [c.client.split("_")[0] for c in proxy.cut("data")]
    finally:
        cluster.stop(grace=10)
    assert login_cuts == ["paramiko"] and sorted(data_cuts) == ["OpenSSH", "paramiko"], \
        (login_cuts, data_cuts)
    # Every test once (a table row per test), run by the node whose sessions were cut, with
    # the outcomes of the run without cuts.
    assert len(table) == len(FILES) * 2
    assert {name: (error, md5) for name, (error, md5, _) in table.items()} == \
        {name: (error, md5) for name, (error, md5, _) in clean.items()}
    assert {machine for _, _, machine in table.values()} == {"node1"}
    assert all(error == 0 for error, _, _ in table.values())
