"""``localcluster.py --provider gridengine`` (docs/provisioning.md): no node is started by
hand; a private single-host Grid Engine cell (Debian's sge_qmaster and sge_execd) and the
provisioner -- the same one, ``provision_engine = gridengine`` -- start ephemeral nodes as
array tasks as the run waits.  The run completes with the same table, test by test, as a
run of the same corpus on a static local cluster, every result from a node Grid Engine
started (``sge-<job>.<task>``), ``clusteradmin stat`` shows their Grid Engine jobs, and
nothing of Grid Engine is left running afterwards."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cluster.report.tab import read_tab
from tests.helpers import CORPUS, REPO, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("gridengine")]


def _localcluster(home: Path, corpus: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
            "--corpus", str(corpus), "--nodes", "2", *extra,
            "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
            "--set", "status_port=0"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def _table(done: subprocess.CompletedProcess[str]) -> dict[str, tuple[int, str, str]]:
    """(error, md5, machine) of each test of the run localcluster printed last."""
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    archive = Path(done.stdout.splitlines()[-1])
    return {name: (row.error, row.md5, row.machine)
            for name, row in read_tab(archive / f"{archive.name}.tab").items()}


def test_a_run_gets_its_nodes_from_grid_engine_and_gives_the_static_clusters_table(
        tmp_path: Path) -> None:
    corpus = tmp_path / "mini"
    corpus.mkdir()
    for name in ("golfer.eps", "spots.ps", "spots2.pdf"):
        shutil.copyfile(CORPUS / name, corpus / name)
    from_sge = _table(_localcluster(tmp_path / "sge", corpus, "--provider", "gridengine"))
    static = _table(_localcluster(tmp_path / "static", corpus))
    assert from_sge and sorted(from_sge) == sorted(static)
    assert {n: r[:2] for n, r in from_sge.items()} == {n: r[:2] for n, r in static.items()}
    assert all(r[0] == 0 for r in from_sge.values())
    # Every result came from a node Grid Engine started (sge-<job>.<task>), none from node1/2.
    machines = {r[2] for r in from_sge.values()}
    assert machines and all(re.fullmatch(r"sge-\d+\.\d+", m) for m in machines), machines
    # The provisioner said what it did; nothing of the private Grid Engine is left running.
    log = (tmp_path / "sge" / "log" / "clusterscale.out").read_text(errors="replace")
    assert "submitted" in log
    # Its last look, as clusteradmin stat shows it from provision.json: the Grid Engine
    # tasks that ran the nodes (named sge-<job>.<task>), and -- the provisioner stopped with the
    # cluster more than 3 resource intervals ago -- that it is not running.
    stat = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(tmp_path / "sge"), "stat"], capture_output=True, text=True,
                          timeout=60)
    assert stat.returncode == 0, stat.stderr
    assert "\nfrom Grid Engine: wanted " in stat.stdout, stat.stdout
    assert any(f"  {m} (Grid Engine job {m.removeprefix('sge-')}) " in stat.stdout
               for m in machines), stat.stdout
    assert "the provisioner is not running: provision.json was written" in stat.stdout
    home = str(tmp_path / "sge")
    left = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(home in arg for arg in process.info["cmdline"] or []):
                left.append(process.info["cmdline"])
        except psutil.Error:
            continue
    assert left == []
