"""Sweeps (docs/sweeps.md) over a network: the sweep of :mod:`tests.sweepcase` on a master in
one network namespace and two nodes each in their own, with transport ssh; the nodes cannot
see the master home (tests/multihost.py hides it), so the sweep folder reached them through
rsync over ssh and every result file came home in bundles over sftp.

One cluster, two runs:

1. the sweep as on the local cluster (tests/e2e/test_sweep_cluster.py): results.tsv, every
   valid task's files and the collected files are those made by hand, and each rejected
   row was tried on both nodes;
2. the same sweep with tasks of ~0.15 s, node2 SIGKILLed -- every process of its machine --
   once some of its results are in: every task is there exactly once (one row in the
   run's table, one row in results.tsv, one folder in results/), each valid result's files
   right, the collected files complete.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from cluster.report.tab import read_tab
from cluster.sweep.expand import tasks
from cluster.sweep.spec import load
from cluster.triggers.sweeppush import prepare_sweep
from tests import netns, sweepcase
from tests.multihost import (
    MakeMultiHost,
    journal_machines,
    multihost_fixture,  # noqa: F401 -- the fixture make_multihost
    start_all,
)

pytestmark = pytest.mark.e2e

ROWS = 56
REJECTED = tuple(range(9, ROWS + 1, 9))
USER = "carol"
RUN_TIMEOUT = 120.0
#: How long each task of the second run sleeps [s]: the run lasts a few seconds.
SLOW_TASK = 0.15


def test_a_sweep_over_ssh_its_results_as_by_hand_and_a_node_killed_loses_none(
        make_multihost: MakeMultiHost, tmp_path: Path) -> None:
    mh = make_multihost()
    start_all(mh)
    cluster = mh.cluster
    sweep = sweepcase.write_sweep(tmp_path / "sweep", ROWS, REJECTED)
    everything = list(tasks(load(sweep)))
    hand = {t.task_id: sweepcase.by_hand(t, sweep.parent, tmp_path / "hand" / t.task_id)
            for t in everything}

    first = sweepcase.submit(cluster, sweep, USER, timeout=RUN_TIMEOUT)
    tries = sweepcase.check_archive(first, everything, hand, REJECTED)
    for task in everything:
        nodes = [a.node for a in tries[task.task_id]]
        if int(task.row.values[0]) in REJECTED:
            assert sorted(nodes) == ["node1", "node2"], (task, nodes)
        else:
            assert len(nodes) == 1, (task, nodes)
    # Both nodes worked, over ssh from their own addresses.
    assert {a.node for ts in tries.values() for a in ts} == {"node1", "node2"}
    sshd_log = mh.sshd.log_path.read_text()
    for address in ("10.231.1.2", "10.231.2.2"):
        assert f"from {address}" in sshd_log

    # The second run: slower tasks, and node2's machine dies in the middle.
    sweepcase.write_sweep(tmp_path / "sweep", ROWS, REJECTED, sleep=SLOW_TASK)
    home = cluster.home
    journal_before = journal_machines(home)  # the first run's results, by node
    killed_at: list[int] = []  # how many results of the run were in at the kill

    def kill_node2_once_it_has_results() -> None:
        if killed_at:
            return
        counts = journal_machines(home) - journal_before
        if counts["node2"] < 6:
            return
        # SIGKILL, no warning, to every process of its machine: clusterpull, its run.py,
        # the slots and their tasks.
        for pid in netns.pids_in(mh.topo.hosts["node2"].netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed_at.append(sum(counts.values()))

    submission = prepare_sweep(sweep)
    before = cluster.archives()
    spec = cluster.push(submission.folder, USER, submission.words[:1],
                        submission.words[1:])
    second = cluster.wait_for_run(spec, before, RUN_TIMEOUT,
                                  on_poll=kill_node2_once_it_has_results)
    assert killed_at, "node2 was never killed: it sent too few results"
    assert killed_at[0] < ROWS - 15, f"the run was nearly over at the kill: {killed_at}"
    node2 = mh.nodes["node2"]
    if node2.proc is not None:
        try:
            node2.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        node2.proc = None
    # Every task once: in the run's table, in results.tsv, in results/; the files right.
    text = (second / f"{second.name}.tab").read_text()
    names = [line.split("\t", 1)[0] for line in text.splitlines()]
    assert sorted(names) == sorted(t.task_id for t in everything)
    table = read_tab(second / f"{second.name}.tab")
    assert {n for n, row in table.items() if row.error == 0} == {
        t.task_id for t in everything if int(t.row.values[0]) not in REJECTED}
    tries = sweepcase.check_archive(second, everything, hand, REJECTED)
    # node2 did some of them before it died, node1 the rest.
    assert {a.node for ts in tries.values() for a in ts} == {"node1", "node2"}
    report = (second / "report.txt").read_text()
    assert f"Sweep sweep.toml: {ROWS} tasks: {ROWS - len(REJECTED)} ok" in report
