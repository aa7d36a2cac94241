"""End to end: ``clusterpush.py --master HOST --sweep FILE`` from a developer's machine.

A real local cluster (supervisor, masters, monitor, two nodes) is reached only through a
private OpenSSH server on 127.0.0.1.  The sweep folder goes to the master by rsync over
ssh, the run is queued as ``user <user> sweep sweep=<file>`` and run: one row per task in
the run's table.  A second push after a one-line change sends only that file (rsync's
statistics).  ``--resume`` over ssh finds the run to resume on the master, and says so
when there is none, queueing nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.runtime.sshd import PrivateSshd
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load
from cluster.triggers.droppings import DROPPING
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "sweep"


def remote_clusterpush(sshd: PrivateSshd, cluster: LocalCluster, sweep: Path, user: str,
                       *words: str) -> subprocess.CompletedProcess[str]:
    """The real clusterpush.py --master --sweep, with no view of the master home but the
    ssh server (no --config, no --home)."""
    return subprocess.run(
        [sys.executable, str(REPO / "clusterpush.py"),
         "--master", f"{sshd.user}@{sshd.address}:{cluster.home_dir}",
         "--ssh-port", str(sshd.port), "--ssh-key", str(sshd.client_key),
         "--known-hosts", str(sshd.known_hosts), "--master-cache", str(sshd.root / "cache"),
         "--user", user, "--sweep", str(sweep), *words],
        cwd=sweep.parent, capture_output=True, text=True, timeout=300)


def test_a_sweep_pushed_over_ssh_is_queued_run_and_pushed_again_by_its_changes(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster()
    laptop = tmp_path / "laptop" / "sweep"
    shutil.copytree(EXAMPLE, laptop)
    (laptop / "bin").mkdir()
    (laptop / "bin" / "model").write_text("a build folder: a push leaves it out\n")
    sweep = laptop / "sweep.toml"
    with PrivateSshd(tmp_path / "sshd") as sshd:
        cluster.start()
        before = cluster.archives()
        first = remote_clusterpush(sshd, cluster, sweep, "alice")
        assert first.returncode == 0, first.stderr
        lines = first.stdout.splitlines()
        assert lines[0] == f"sweep: 64 task(s) from {sweep}"
        assert lines[1] == "queueing: user alice sweep sweep=sweep.toml"
        sent = int(lines[2].split()[1])
        assert lines[2].startswith("sent ") and "changed file(s)" in lines[2]
        assert sent == len([p for p in EXAMPLE.rglob("*") if p.is_file()
                            and "__pycache__" not in p.parts])
        pushed = cluster.home.users / "alice" / "sweep"
        assert (pushed / "model.py").read_bytes() == (EXAMPLE / "model.py").read_bytes()
        assert not (pushed / "bin").exists()
        archive = cluster.wait_for_run(RunSpec.parse("user alice sweep sweep=sweep.toml"),
                                       before, 240)
        table = read_tab(archive / f"{archive.name}.tab")
        assert sorted(table) == sorted(task.task_id for task in tasks(load(sweep)))
        assert all(row.error == 0 and row.product == "sweep" for row in table.values())

        # One changed line of the program: only that file travels the second time.
        model = laptop / "model.py"
        model.write_text(model.read_text() + "# tuned\n")
        second = remote_clusterpush(sshd, cluster, sweep, "alice")
        assert second.returncode == 0, second.stderr
        assert "sent 1 changed file(s)" in second.stdout
        assert (pushed / "model.py").read_text().endswith("# tuned\n")


def test_resume_over_ssh_names_the_run_or_refuses_queueing_nothing(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster()  # prepared, not started: the pushes are only queued
    laptop = tmp_path / "laptop" / "sweep"
    shutil.copytree(EXAMPLE, laptop)
    sweep = laptop / "sweep.toml"
    with PrivateSshd(tmp_path / "sshd") as sshd:
        refused = remote_clusterpush(sshd, cluster, sweep, "bob", "--resume")
        assert refused.returncode == 2
        assert (f"resume: user bob has no earlier run of the sweep file sweep.toml with a "
                f"results.tsv in {cluster.home.archive}") in refused.stderr
        assert not (cluster.home.users / "bob").exists()

        run = "20260102000000-p0-1111"
        archived = cluster.home.archive / run
        archived.mkdir(parents=True)
        (archived / "run.info").write_text(
            f"id {run}\npriority 0\nqueue user bob sweep sweep=sweep.toml\nkind user\n"
            "ref bob\nproducts sweep\ntree sweep\nsource runs/x/source/sweep\nbuild true\n"
            "tests tests\noptions sweep=sweep.toml\noutcome done\n")
        (archived / "results.tsv").write_text(
            "Seq\tHost\tStarttime\tJobRuntime\tSend\tReceive\tExitval\tSignal\tCommand\t"
            "r\tsteps\tx0\tstatus\tattempts\n")
        resumed = remote_clusterpush(sshd, cluster, sweep, "bob", "--resume")
        assert resumed.returncode == 0, resumed.stderr
        line = f"user bob sweep resume={run} sweep=sweep.toml"
        assert f"queueing: {line}" in resumed.stdout
        assert (cluster.home.users / "bob" / "sweep" / DROPPING).read_text() == line + "\n"
