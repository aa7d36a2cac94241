"""Pilots that cannot start, and ended nodes, against a real private single-host Slurm
(docs/provisioning.md, "Pilots that cannot start").

The provisioner runs under a cron-like PATH whose first ``python3`` is a bare virtualenv's,
without the project's modules (no psutil): ``clusterpull.py``'s ``#!/usr/bin/env python3``
would die there.  The nodes still start (the pilot runs them under the provisioner's own
interpreter), serve the run, and -- once they have exited -- are gone from ``clusteradmin
stat`` and ``ls`` within one ``resource_interval``.  With ``node_python`` naming that bare
Python, every pilot dies: a handful of submissions with growing gaps, one WARNING quoting
the job's output, the host excluded after three, ``clusteradmin stat`` saying both, and
``clusterscale.py --clear-host`` taking the host back."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.provision.exclusions import FILE_NAME as EXCLUDED_FILE
from cluster.provision.slurm import SlurmEngine
from cluster.provision.slurmhost import short_hostname
from cluster.report.tab import read_tab
from tests.helpers import CORPUS, FAST, REPO, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv's bin folder whose python3 lacks the project's modules."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    lacks = subprocess.run([str(venv / "bin" / "python3"), "-c", "import psutil"],
                           capture_output=True, timeout=60)
    assert lacks.returncode != 0  # the point of it
    return venv / "bin"


@contextlib.contextmanager
def _cluster(home: Path, bare_bin: Path, **settings: str) -> Iterator[LocalCluster]:
    corpus = home.parent / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "golfer.eps").write_bytes((CORPUS / "golfer.eps").read_bytes())
    cluster = LocalCluster(home, 0, corpus, {
        **FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
        "status_port": "0", "node_slots": "1", "resource_interval": "1",
        "gs_configs": "ppmraw.72.0 pbmraw.72.0", **settings},
        provider="slurm", provider_env={"PATH": f"{bare_bin}:/usr/bin:/bin"})
    cluster.prepare()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop(grace=10)


def _admin(cluster: LocalCluster, *words: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "clusteradmin.py"), "--home",
                           str(cluster.home_dir), *words], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _slurm_nodes(cluster: LocalCluster) -> set[str]:
    """The slurm-* nodes clusteradmin ls --json lists."""
    nodes = json.loads(_admin(cluster, "ls", "--json"))
    names = {n["name"] for n in (nodes if isinstance(nodes, list) else nodes["nodes"])}
    return {n for n in names if n.startswith("slurm-")}


def test_nodes_start_under_a_cron_path_and_leave_the_lists_when_they_end(
        tmp_path: Path, bare_python: Path) -> None:
    with _cluster(tmp_path / "home", bare_python, max_nodes="2",
                  ephemeral_idle="3") as cluster:
        tree = write_demo_tree(tmp_path / "tree", "gs", [])
        before = cluster.archives()
        spec = cluster.push(tree, "tester", ["gs"], [])
        archive = cluster.wait_for_run(spec, before, 180)
        table = read_tab(archive / f"{archive.name}.tab")
        machines = {row.machine for row in table.values()}
        assert machines and all(m.startswith("slurm-") for m in machines), machines
        assert all(row.error == 0 for row in table.values())
        # The pilots ran the node under the provisioner's interpreter, not PATH's python3.
        logs = sorted((cluster.home_dir / "log" / "pilots").glob("slurm-*.log"))
        assert logs and all(f"python {sys.executable}" in p.read_text() for p in logs)
        assert machines <= _slurm_nodes(cluster)
        # The nodes exit (ephemeral_idle 3 s); once Slurm has no job of theirs, the
        # provisioner's next look (1 s) takes them off the lists, not node_down_after.
        assert cluster.slurm is not None
        engine = SlurmEngine(env=cluster.slurm.env)
        wait_for(lambda: engine.jobs("slurm") == [], 60, "the pilots to end")
        ended = time.monotonic()
        wait_for(lambda: not _slurm_nodes(cluster), 10, "the ended nodes off the list")
        assert time.monotonic() - ended <= 1.0 + 2.0  # one interval, and the commands' time
        stat = _admin(cluster, "stat")
        assert not re.search(r"^\s*slurm-\d+\s", stat, re.M), stat
        assert all(re.search(r"pilot: end \d+ exit 0$", p.read_text().strip())
                   for p in logs), [p.read_text() for p in logs]


def _times(log: str, pattern: str) -> list[float]:
    """When the log lines matching ``pattern`` were written."""
    return [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for line in log.splitlines() if re.search(pattern, line)]


def test_pilots_that_always_die_back_off_warn_once_and_exclude_the_host(
        tmp_path: Path, bare_python: Path) -> None:
    host = short_hostname()
    with _cluster(tmp_path / "home", bare_python, max_nodes="1",
                  node_python=str(bare_python / "python3"), pilot_backoff="3",
                  pilot_backoff_max="12", pilot_exclude_after="3") as cluster:
        tree = write_demo_tree(tmp_path / "tree", "gs", [])
        cluster.push(tree, "tester", ["gs"], [])
        log_path = cluster.home.log_dir / "clusterscale.log"
        excluded = cluster.home_dir / EXCLUDED_FILE
        wait_for(excluded.exists, 90, f"{excluded}")
        time.sleep(15)  # past the next pause (12 s): the back-off keeps the submissions few
        log = log_path.read_text(errors="replace")
        times = _times(log, r": submitted [1-9]")
        failed = _times(log, r" (WARNING|INFO) pilot failed")
        # A handful of submissions, not one a look (the look is every second): pauses of
        # 3, 6, 12 s after the failures (from each failure seen to the next submit), and
        # after the third the host is excluded, which on a one-host Slurm sbatch refuses
        # -- said once a pause, not once a look.
        assert len(times) == 3 and len(failed) == 3, log
        pauses = [next(t for t in times if t > f) - f for f in failed[:2]]
        assert 3 <= pauses[0] < 5 and 6 <= pauses[1] < 8, pauses
        refusals = log.count("submit failed: sbatch: exit status 1: sbatch: error: Batch job "
                             "submission failed: Requested node configuration is not available")
        assert 1 <= refusals <= 3, log
        warnings = [line for line in log.splitlines() if " WARNING pilot failed: " in line]
        assert len(warnings) == 1, log
        text = log[log.index(warnings[0]):]
        assert "No module named" in text
        assert "cannot import the node's modules; set node_python in master.conf" in text
        assert f"host {host} excluded from the submissions: 3 pilots failed there" in log
        assert host in json.loads(excluded.read_text())["hosts"]
        stat = _admin(cluster, "stat")
        assert re.search(r"pilots failing: \d+ in a row", stat), stat
        assert f"hosts excluded from the submissions: {host}" in stat
        assert "No module named" in stat
        # An administrator takes the host back: the next look says so.
        done = subprocess.run([sys.executable, str(REPO / "clusterscale.py"),
                               *cluster.config_args(), "--clear-host", host],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and f"cleared {host}" in done.stdout, done.stderr
        wait_for(lambda: "hosts excluded" not in _admin(cluster, "stat"), 10,
                 "the host off the excluded list in stat")
