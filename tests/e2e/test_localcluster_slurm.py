"""``localcluster.py --provider slurm`` (docs/provisioning.md): no node is started by hand;
a private single-host Slurm (Debian's munged, slurmctld and slurmd) and the provisioner
start ephemeral nodes as the run waits.  The run completes with the same table, test by
test, as a run of the same corpus on a static local cluster, every result from a
Slurm-started node, ``clusteradmin stat`` shows the Slurm jobs of those nodes (the
provisioner's ``provision.json``), and nothing of Slurm is left running afterwards."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cluster.report.tab import read_tab
from tests.helpers import CORPUS, REPO, free_port

# One worker runs the Slurm modules one after the other (each starts a private Slurm
# and its pilots; tests/e2e/test_slurm_master_loss.py measures timings).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]


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


def test_a_run_gets_its_nodes_from_slurm_and_gives_the_static_clusters_table(
        tmp_path: Path) -> None:
    corpus = tmp_path / "mini"
    corpus.mkdir()
    for name in ("golfer.eps", "spots.ps", "spots2.pdf"):
        shutil.copyfile(CORPUS / name, corpus / name)
    from_slurm = _table(_localcluster(tmp_path / "slurm", corpus, "--provider", "slurm"))
    static = _table(_localcluster(tmp_path / "static", corpus))
    assert from_slurm and sorted(from_slurm) == sorted(static)
    assert {n: r[:2] for n, r in from_slurm.items()} == {n: r[:2] for n, r in static.items()}
    assert all(r[0] == 0 for r in from_slurm.values())
    # Every result came from a node Slurm started (named slurm-<job id>), none from node1/2.
    machines = {r[2] for r in from_slurm.values()}
    assert machines and all(m.startswith("slurm-") for m in machines), machines
    # The provisioner said what it did; nothing of the private Slurm is left running.
    log = (tmp_path / "slurm" / "log" / "clusterscale.out").read_text(errors="replace")
    assert "submitted" in log
    # Its last look, as clusteradmin stat shows it from provision.json: the Slurm jobs
    # that ran the nodes (named slurm-<job id>), and -- the provisioner stopped with the
    # cluster more than 3 resource intervals ago -- that it is not running.
    stat = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(tmp_path / "slurm"), "stat"], capture_output=True, text=True,
                          timeout=60)
    assert stat.returncode == 0, stat.stderr
    assert "\nfrom Slurm: wanted " in stat.stdout, stat.stdout
    assert any(f"  {m} (Slurm job {m.removeprefix('slurm-')}) " in stat.stdout
               for m in machines), stat.stdout
    assert "the provisioner is not running: provision.json was written" in stat.stdout
    home = str(tmp_path / "slurm")
    left = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(home in arg for arg in process.info["cmdline"] or []):
                left.append(process.info["cmdline"])
        except psutil.Error:
            continue
    assert left == []
