"""Slurm-started nodes when the master goes, when a pilot hits its time limit, and when the
queue empties (docs/provisioning.md, "The provisioner"), on one real single-host Slurm, in
one cluster:

a. the clustermaster SIGKILLed mid-run: the supervisor's successor takes the run over and
   the same ephemeral nodes (the same Slurm jobs, no new sbatch) finish it with it: every
   test once, no error row;
d. a pilot killed by Slurm's time limit mid-run (``scontrol update TimeLimit=1`` while it
   runs; Slurm's limits are whole minutes and slurmctld checks them every 30 s, so the kill
   lands 60-90 s after the pilot started -- measured: at a run time of 87 s -- and the
   wait overlaps case a; the run's jobs wait on a hold file until then, so the kill is
   surely mid-run): the jobs it held are handed out again, every test once, no error row;
c. after that run's queue empties, every Slurm job still there ends COMPLETED with exit 0
   within ``ephemeral_idle`` plus one ``resource_interval``;
b. no master at all (provisioner, monitor, supervisor and clustermaster SIGKILLed mid-run):
   the ephemeral nodes' heartbeats fail, after ``connect_retries`` they exit 3 and Slurm
   requeues them (``RequeueExit=3``: ``Restarts=1``, pending again with exit code 3).

The ephemeral nodes get their short retry settings through the master's ``node_config``
(a node.conf given to their ``clusterpull.py --ephemeral`` as ``--config``).  The module
takes 100-120 s, most of it the time limit's minute and slurmctld's 30 s check."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import MONITOR_SCRIPT, PROVISIONER_SCRIPT, SUPERVISOR_SCRIPT, LocalCluster
from cluster.master.files import pidformat
from cluster.master.files.resources import resource_path
from cluster.provision.slurm import SlurmEngine
from cluster.report.tab import read_tab
from cluster.runtime import proc
from cluster.wire.resources import read_resources
from tests.helpers import CORPUS, FAST, free_port, slow_demo_tree, wait_for
from tests.multihost import journal_machines

# One worker runs the Slurm modules one after the other: each starts a private Slurm and
# pilots, and case c's timing is measured.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]

log = logging.getLogger(__name__)

RUN_TIMEOUT = 180.0
EPHEMERAL_IDLE = 4.0
RESOURCE_INTERVAL = 1.0
#: Polls of scontrol and of the work folders are this far apart at most, and a node's exit
#: reaches slurmctld within about this: what the COMPLETED timing may exceed its bound by.
POLL_SLACK = 1.0
GS_CONFIGS = ("ppmraw.72.0", "pbmraw.72.0", "pgmraw.72.0", "pkmraw.72.0")
TESTS_PER_RUN = len(list(CORPUS.iterdir())) * len(GS_CONFIGS)
#: The ephemeral nodes' own settings (node_config): three failed heartbeats half a second
#: apart end a node with exit 3; a run.py that lost its master is tried again after 1 s.
NODE_CONF = """\
[node]
connect_retries = 3
connect_retry_delay = 0.5
rejoin_delay = 1
heartbeat_interval = 0.5
poll_interval = 0.5
"""
#: Slurm time limits are whole minutes, checked by slurmctld every 30 s.
TIME_LIMIT_MINUTES = 1
TIME_LIMIT_CHECK = 30.0


@pytest.fixture
def slurm_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    node_conf = tmp_path / "node.conf"
    node_conf.write_text(NODE_CONF, encoding="utf-8")
    cluster = LocalCluster(tmp_path / "home", 0, CORPUS, {
        **FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": "0", "max_nodes": "2", "node_slots": "1",
        "resource_interval": f"{RESOURCE_INTERVAL:g}",
        "ephemeral_idle": f"{EPHEMERAL_IDLE:g}", "node_config": str(node_conf),
        "gs_configs": " ".join(GS_CONFIGS)}, provider="slurm")
    cluster.prepare()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(grace=10)


def _slurm_env(cluster: LocalCluster) -> dict[str, str]:
    assert cluster.slurm is not None
    return cluster.slurm.env


def _jobs(cluster: LocalCluster) -> dict[str, str]:
    """The ephemeral nodes' Slurm jobs squeue lists: job id -> state."""
    engine = SlurmEngine(env=_slurm_env(cluster))
    return {job.job_id: job.state for job in engine.jobs("slurm")}


def _show(cluster: LocalCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job`` of ``job_id`` as its Key=Value words (finished jobs too, for
    MinJobAge, 300 s)."""
    done = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **_slurm_env(cluster)})
    assert done.returncode == 0, done.stderr
    return dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)


def _scontrol_update(cluster: LocalCluster, *words: str) -> None:
    done = subprocess.run(["scontrol", "update", *words], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **_slurm_env(cluster)})
    assert done.returncode == 0, done.stderr


def _submitted(cluster: LocalCluster) -> int:
    """How many sbatch the provisioner has made (its log's 'submitted N' words)."""
    text = (cluster.home.log_dir / "clusterscale.out").read_text(errors="replace")
    return sum(int(n) for n in re.findall(r": submitted (\d+)", text))


def _held_demo_tree(dest: Path, hold: Path) -> Path:
    """A demo gs tree whose every job waits while ``hold`` exists (bounded: 5 minutes), so
    that a run is sure to be in its middle when Slurm's time limit lands."""
    tree = write_demo_tree(dest, "gs", [])
    script = tree / "make_wrapper.sh"
    text = script.read_text(encoding="utf-8")
    wait = f"i=0; while [ -e {hold} ] && [ $i -lt 1500 ]; do sleep 0.2; i=$((i+1)); done"
    held = text.replace("printf '#!/bin/sh\\n", f"printf '#!/bin/sh\\n{wait}\\n", 1)
    assert held != text, f"{script}: no wrapper line to hold"
    script.write_text(held, encoding="utf-8")
    return tree


def _table_of(archive: Path) -> dict[str, tuple[int, str]]:
    """(error, machine) of each test of the archived run; every test once in its .tab."""
    tab = archive / f"{archive.name}.tab"
    names = [line.split("\t", 1)[0] for line in tab.read_text().splitlines()]
    assert len(names) == len(set(names)) == TESTS_PER_RUN, (len(names), len(set(names)))
    return {name: (row.error, row.machine) for name, row in read_tab(tab).items()}


def _master_pid(cluster: LocalCluster) -> int:
    """The PID priority 0's PID file names; 0 when there is none (or it is being written)."""
    try:
        return int(pidformat.parse(cluster.home.pid_file(0).read_text())[0])
    except (OSError, ValueError):
        return 0


def _kill_daemon(cluster: LocalCluster, script: str) -> None:
    """SIGKILL one of the cluster's daemons (no clean stop: it just goes) and forget it."""
    daemon = cluster.daemons.pop(script)
    proc.kill_tree(daemon.child.pid, signal.SIGKILL)
    daemon.child.wait(timeout=10)


def _epoch(stamp: str) -> float:
    """A Slurm time stamp (``2026-11-26T11:07:26``, local time) as epoch seconds."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()


def test_master_killed_time_limit_completed_and_no_master_requeue(
        slurm_cluster: LocalCluster) -> None:
    cluster = slurm_cluster
    home = cluster.home

    # --- a. the clustermaster SIGKILLed mid-run --------------------------------------------
    before = cluster.archives()
    spec = cluster.push(slow_demo_tree(cluster.home_dir / "demo" / "a", "gs", []),
                        "tester", ["gs"], [])
    wait_for(lambda: len([m for m, n in journal_machines(home).items() if n >= 2]) >= 2,
             120, "two Slurm-started nodes sending results")
    pilots = sorted(j for j, state in _jobs(cluster).items() if state == "running")
    assert len(pilots) == 2, pilots
    submits = _submitted(cluster)
    # Case d's pilot gets its time limit now: Slurm kills it 60-90 s after it started.
    timed, kept = pilots
    _scontrol_update(cluster, f"JobId={timed}", f"TimeLimit={TIME_LIMIT_MINUTES}")
    limit_set = time.monotonic()
    old_master = _master_pid(cluster)
    journaled = sum(journal_machines(home).values())
    psutil.Process(old_master).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert journaled < TESTS_PER_RUN, "the run ended before its master was killed"
    wait_for(lambda: _master_pid(cluster) not in (0, old_master), 30,
             "the supervisor's successor clustermaster")
    successor_after = time.monotonic() - killed
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    table = _table_of(archive)
    assert all(error == 0 for error, _ in table.values()), table
    machines = {machine for _, machine in table.values()}
    assert machines <= {f"slurm-{j}" for j in pilots}, (pilots, machines)
    master_log = (home.log_dir / "clustermaster.log").read_text(errors="replace")
    took = re.findall(r"taking over, (\d+) results already journaled", master_log)
    assert took and int(took[-1]) < TESTS_PER_RUN, took  # the successor got the rest
    assert _submitted(cluster) == submits  # the same pilots: no sbatch since
    assert sorted(j for j, s in _jobs(cluster).items() if s == "running") == pilots

    # --- d. a pilot killed by Slurm's time limit mid-run -----------------------------------
    hold = cluster.home_dir / "hold"
    hold.touch()
    before = cluster.archives()
    spec = cluster.push(_held_demo_tree(cluster.home_dir / "demo" / "d", hold),
                        "tester", ["gs"], [])
    resources = resource_path(cluster.config())

    def both_hold_a_job() -> bool:
        try:
            found = read_resources(resources, time.time(), RESOURCE_INTERVAL)
        except (OSError, ValueError):
            return False
        # Both nodes in the run, holding jobs (the master hands a node several at once).
        return found.priorities[0].nodes == 2 and found.priorities[0].jobs_running >= 2

    wait_for(both_hold_a_job, 60, "both pilots holding a job of the held run", interval=0.2)
    started = _epoch(_show(cluster, timed)["StartTime"])
    latest = started + TIME_LIMIT_MINUTES * 60 + TIME_LIMIT_CHECK + 15
    wait_for(lambda: _show(cluster, timed)["JobState"] != "RUNNING",
             max(latest - time.time(), 5), f"Slurm's time limit ending pilot {timed}",
             interval=0.2)
    ended = time.monotonic()
    shown = _show(cluster, timed)
    assert shown["JobState"] in ("TIMEOUT", "COMPLETING"), shown
    wait_for(lambda: _show(cluster, timed)["JobState"] == "TIMEOUT", 20,
             f"pilot {timed} TIMEOUT", interval=0.2)
    log.info("time limit: pilot %s ended %.1f s after TimeLimit=%d was set (ran %s)",
             timed, ended - limit_set, TIME_LIMIT_MINUTES, shown.get("RunTime"))
    hold.unlink()
    archive = cluster.wait_for_run(spec, before, RUN_TIMEOUT)
    emptied = time.monotonic()
    table = _table_of(archive)
    assert all(error == 0 for error, _ in table.values()), table
    machines = {machine for _, machine in table.values()}
    assert f"slurm-{timed}" not in machines, machines  # its held job went to another node
    assert f"slurm-{kept}" in machines, machines
    # The master saw it go and put its jobs back ("left the run; N unfinished jobs put
    # back" when its run.py said so before the SIGKILL, else "not heard from").
    report = (archive / "report.txt").read_text()
    assert "Nodes lost during the run:" in report, report
    assert re.search(rf"^slurm-{timed} \(", report, re.M), report

    # --- c. the jobs end COMPLETED, exit 0, within ephemeral_idle + resource_interval -------
    left = sorted(j for j in _jobs(cluster) if j != timed)
    assert kept in left, left
    ended_after: dict[str, float] = {}

    def all_ended() -> bool:
        for job_id in left:
            if job_id not in ended_after and \
                    _show(cluster, job_id)["JobState"] not in ("PENDING", "RUNNING",
                                                               "COMPLETING"):
                ended_after[job_id] = time.monotonic() - emptied
        return len(ended_after) == len(left)

    wait_for(all_ended, EPHEMERAL_IDLE + RESOURCE_INTERVAL + 30, "the pilots leaving",
             interval=0.2)
    for job_id in left:
        shown = _show(cluster, job_id)
        assert (shown["JobState"], shown["ExitCode"]) == ("COMPLETED", "0:0"), shown
    log.info("pilots %s ended %s s after the queue emptied", left, ended_after)
    assert max(ended_after.values()) <= EPHEMERAL_IDLE + RESOURCE_INTERVAL + POLL_SLACK, \
        ended_after

    # --- b. no master at all: the pilots exit 3 and Slurm requeues them --------------------
    old = set(_jobs(cluster)) | set(pilots) | set(left)
    cluster.push(slow_demo_tree(cluster.home_dir / "demo" / "b", "gs", []),
                 "tester", ["gs"], [])

    def new_pilots_working() -> list[str]:
        fresh = [j for j, s in _jobs(cluster).items() if s == "running" and j not in old]
        counts = journal_machines(home)
        return [j for j in fresh if counts[f"slurm-{j}"] >= 1]

    wait_for(lambda: len(new_pilots_working()) == 2, 120, "two new pilots sending results")
    orphans = sorted(new_pilots_working())
    _kill_daemon(cluster, PROVISIONER_SCRIPT)  # first: it would cancel them
    _kill_daemon(cluster, SUPERVISOR_SCRIPT)
    master = _master_pid(cluster)
    if master > 0:
        psutil.Process(master).send_signal(signal.SIGKILL)
    _kill_daemon(cluster, MONITOR_SCRIPT)
    gone = time.monotonic()

    def requeued(job_id: str) -> bool:
        shown = _show(cluster, job_id)
        return int(shown["Restarts"]) >= 1 and shown["JobState"] == "PENDING"

    wait_for(lambda: all(requeued(j) for j in orphans), 60,
             f"pilots {orphans} exiting 3 and requeued", interval=0.2)
    log.info("no master: pilots %s requeued %.1f s after it went", orphans,
             time.monotonic() - gone)
    for job_id in orphans:
        assert _show(cluster, job_id)["ExitCode"] == "3:0"
    log.info("a: a successor held the PID file %.1f s after the kill", successor_after)
