"""The provisioner's last look in the console (cluster.console.provisioning): a home with a
``provision.json`` as clusterscale writes it (cluster.wire.provision.format_status), read
by the status model, and what ``clusteradmin stat`` and ``clustermonitor`` print of it --
the real scripts too.  No file: nothing is said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from cluster.config import Config
from cluster.console import admin, provisioning, terminal
from cluster.console.status import StatusReader
from cluster.home import Home
from cluster.wire.provision import ProvisionJob, ProvisionStatus, format_status
from tests.helpers import REPO
from tests.unit.test_console_status import NOW, heartbeat, make_home

REFUSED = ("sbatch: exit status 1: sbatch: error: Batch job submission failed: Invalid "
           "partition name specified")
LOOK = ProvisionStatus(
    written=NOW - 4, pid=4242, engine="Slurm", interval=10.0, wanted=3, pending=1, running=1,
    jobs=(ProvisionJob("41", "slurm-node", "slurm-41", "running"),
          ProvisionJob("42", "slurm-node", "slurm-42", "pending", "PartitionDown")),
    action="wanted 3 pending 1 running 1: submitted 0 of 1 (...); submit failed: " + REFUSED,
    trouble=REFUSED)
SUMMARY = "from Slurm: wanted 3, pending 1, running 1"


def provisioned(tmp_path: Path, look: ProvisionStatus = LOOK) -> tuple[Home, Config]:
    """A home with a node that Slurm job 41 runs, a static node, and the file."""
    home, cfg = make_home(tmp_path)
    heartbeat(home, "slurm-41", NOW - 2)
    heartbeat(home, "static1", NOW - 2)
    home.provision_status.write_text(format_status(look), encoding="utf-8")
    return home, cfg


def test_without_the_file_nothing_is_said(tmp_path: Path) -> None:
    home, cfg = make_home(tmp_path)
    heartbeat(home, "slurm-41", NOW - 2)
    snap = StatusReader().snapshot(home, cfg, NOW)
    assert snap["provision"] is None and "batch_job" not in snap["nodes"][0]
    assert not any("Slurm" in line for line in terminal.render(snap))
    assert not any("Slurm" in line for line in admin.format_stat(admin.stat(home, cfg, NOW)))


def test_the_snapshot_has_the_counts_the_jobs_the_trouble_and_the_nodes_job_ids(
        tmp_path: Path) -> None:
    home, cfg = provisioned(tmp_path)
    snap = StatusReader().snapshot(home, cfg, NOW)
    p = snap["provision"]
    assert (p["summary"], p["wanted"], p["pending"], p["running"]) == (SUMMARY, 3, 1, 1)
    assert (p["stale"], p["stale_note"], p["trouble"], p["age"]) == (False, "", REFUSED, 4.0)
    assert [j["text"] for j in p["jobs"]] == ["slurm-41 (Slurm job 41) running",
                                              "slurm-42 (Slurm job 42) pending: PartitionDown"]
    assert p["lines"] == [SUMMARY, f"  trouble: {REFUSED}", "  slurm-41 (Slurm job 41) running",
                          "  slurm-42 (Slurm job 42) pending: PartitionDown"]
    nodes = {n["name"]: n for n in snap["nodes"]}
    assert nodes["slurm-41"]["batch_job"] == {"engine": "Slurm", "id": "41"}
    assert "batch_job" not in nodes["static1"]
    json.dumps(snap)  # the status page's API serves it


def test_failing_pilots_and_excluded_hosts_are_said(tmp_path: Path) -> None:
    """docs/provisioning.md, "Pilots that cannot start": the streak, the last failure with
    its lines, the wait, the excluded hosts -- on the page's entry and in the text views."""
    failing = replace(LOOK, trouble="", failing=3, next_submit=7.4, excluded=("n7",),
                      failure="job 3 (node slurm-3) on host n7 exited 2 after 0 s: "
                              "ModuleNotFoundError: No module named 'psutil'")
    home, cfg = provisioned(tmp_path, failing)
    p = StatusReader().snapshot(home, cfg, NOW)["provision"]
    notes = ["pilots failing: 3 in a row (the next submit in 7 s); the last: job 3 (node "
             "slurm-3) on host n7 exited 2 after 0 s: ModuleNotFoundError: No module named "
             "'psutil'",
             "hosts excluded from the submissions: n7 (clusterscale.py --clear-host HOST "
             "clears one)"]
    assert p["pilot_notes"] == notes and p["failing"] == 3 and p["excluded"] == ["n7"]
    assert p["lines"][1:3] == [f"  {n}" for n in notes]
    # A file an older provisioner wrote (without these keys) reads as all well.
    document = json.loads(format_status(LOOK))
    for key in ("failing", "failure", "next_submit", "excluded"):
        del document[key]
    home.provision_status.write_text(json.dumps(document), encoding="utf-8")
    p = StatusReader().snapshot(home, cfg, NOW)["provision"]
    assert p["pilot_notes"] == [] and p["failing"] == 0


def test_a_stale_file_says_the_provisioner_is_not_running(tmp_path: Path) -> None:
    home, cfg = provisioned(tmp_path)
    reader = StatusReader()
    assert not reader.snapshot(home, cfg, NOW - 4 + 30)["provision"]["stale"]
    late = reader.snapshot(home, cfg, NOW + 41)["provision"]  # written 45 s before
    assert late["stale"] and late["lines"][:2] == [
        SUMMARY, "  the provisioner is not running: provision.json was written 45 s ago "
                 "(more than 3 x 10 s)"]


def test_jobs_that_cannot_be_listed_and_a_broken_file_are_said(tmp_path: Path) -> None:
    down = ProvisionStatus(written=NOW, pid=7, engine="Slurm", interval=10.0, wanted=2,
                           pending=None, running=None,
                           trouble="squeue: exit status 1: slurm_load_jobs error: Unable to "
                                   "contact slurm controller")
    home, cfg = provisioned(tmp_path, down)
    reader = StatusReader()
    assert reader.snapshot(home, cfg, NOW)["provision"]["lines"] == [
        "from Slurm: wanted 2, pending ?, running ? (its jobs could not be listed)",
        "  trouble: squeue: exit status 1: slurm_load_jobs error: Unable to contact slurm "
        "controller"]
    home.provision_status.write_text('{"format": 1, "pid": "x"}', encoding="utf-8")
    broken = reader.snapshot(home, cfg, NOW)["provision"]
    assert broken["error"].startswith(f"{home.provision_status}: ")
    assert broken["lines"] == [f"provisioner status file unusable: {broken['error']}"]
    assert "interval missing: expected a finite number > 0" in broken["error"]


def test_texts_from_the_file_are_one_printable_line_each(tmp_path: Path) -> None:
    hostile = ProvisionStatus(
        written=NOW, pid=7, engine="Slurm", interval=10.0, wanted=1, pending=1, running=0,
        jobs=(ProvisionJob("9", "slurm-node", "slurm-9\x1b[2J", "pending",
                           "<b>Bad</b>\nline two"),),
        trouble="sbatch: error one\n  sbatch: error two\x07")
    home, cfg = provisioned(tmp_path, hostile)
    p = StatusReader().snapshot(home, cfg, NOW)["provision"]
    assert p["trouble"] == "sbatch: error one / sbatch: error two?"
    assert p["jobs"][0]["text"] == "slurm-9?[2J (Slurm job 9) pending: <b>Bad</b> / line two"
    assert all("\x1b" not in line and "\n" not in line for line in p["lines"])
    assert provisioning.clean("x" * 600).endswith("...") and len(provisioning.clean(
        "x" * 600)) == provisioning.TEXT_LIMIT


def test_many_jobs_are_listed_up_to_a_bound_in_the_text_views(tmp_path: Path) -> None:
    many = ProvisionStatus(
        written=NOW, pid=7, engine="Slurm", interval=10.0, wanted=1000, pending=1000,
        running=0, jobs=tuple(ProvisionJob(str(i), "slurm-node", f"slurm-{i}", "pending",
                                           "Resources") for i in range(1, 1001)))
    home, cfg = provisioned(tmp_path, many)
    p = StatusReader().snapshot(home, cfg, NOW)["provision"]
    assert len(p["jobs"]) == 1000
    assert len(p["lines"]) == 1 + provisioning.JOBS_SHOWN + 1
    assert p["lines"][-1] == f"  ... and {1000 - provisioning.JOBS_SHOWN} more jobs"


def test_clusteradmin_stat_and_clustermonitor_print_it(tmp_path: Path) -> None:
    home, cfg = provisioned(tmp_path)
    text = admin.format_stat(admin.stat(home, cfg, NOW))
    assert text[-4:] == [SUMMARY, f"  trouble: {REFUSED}", "  slurm-41 (Slurm job 41) running",
                         "  slurm-42 (Slurm job 42) pending: PartitionDown"]
    view = terminal.render(StatusReader().snapshot(home, cfg, NOW))
    start = view.index(SUMMARY)
    assert view[start + 3] == "  slurm-42 (Slurm job 42) pending: PartitionDown"
    assert view[start + 5] == "nodes (2):"
    assert "  slurm-41  (Slurm job 41)  idle" in view and "  static1   idle" in view
    # The real scripts (the file is fresh for them: written now).
    home.provision_status.write_text(format_status(replace(LOOK, written=time.time())),
                                     encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stat = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(home.root), "stat"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert stat.returncode == 0, stat.stderr
    assert f"{SUMMARY}\n  trouble: {REFUSED}\n  slurm-41 (Slurm job 41) running\n" \
        in stat.stdout
    as_json = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                              str(home.root), "stat", "--json"], capture_output=True,
                             text=True, timeout=60, env=env)
    assert json.loads(as_json.stdout)["provision"]["summary"] == SUMMARY
    monitor = subprocess.run([sys.executable, str(REPO / "clustermonitor.py"), "--home",
                              str(home.root), "--once"], capture_output=True, text=True,
                             timeout=60, env=env)
    assert monitor.returncode == 0, monitor.stderr
    assert f"{SUMMARY}\n" in monitor.stdout
    assert "slurm-42 (Slurm job 42) pending: PartitionDown" in monitor.stdout
    assert "slurm-41  (Slurm job 41)" in monitor.stdout
