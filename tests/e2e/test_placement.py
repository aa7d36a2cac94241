"""End to end: the placement options (docs/runoptions.md, section 4) on one real local
cluster of three nodes (real clustermasters, monitor, clusterpull and run.py processes, real
gs jobs from a slowed demo tree, real TCP).  One cluster start for every check, in four
steps:

1. ``clusteradmin group ...`` against the running master's home: groups made, listed,
   changed, bad names and nodes refused;
2. two runs at once: a priority-0 run with ``groups=pair`` (node1, node2) and, once both
   have joined it, a priority-2 run with ``exclusive max_worker_instances=1``.  The audit
   logs show that only node1 and node2 served the grouped run (node3 was never offered
   it), that node3 took the capped run meanwhile, that no node held two jobs of the capped
   run at once although each has 3 slots, and that no node served both runs at once;
3. a run whose group has no node up waits and says so (``clusteradmin stat`` and the status
   page's JSON), and ``clusteradmin stop --group`` stops it;
4. an ``every_node`` run of one shell command, with node3 disabled: one row per enabled node
   (``<test>@node1``, ``<test>@node2``), each run by its own node; a node that seemed up
   when the run started but never came (node4) does not hold the run up: its copy is not
   run, and the report names it.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.localrunend import run_end
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS, REPO, free_port, slow_demo_tree, wait_for

pytestmark = pytest.mark.e2e

FILES = ("golfer.eps", "tiger.eps", "escher.ps", "snowflak.ps", "vasarely.ps", "spots.ps")
COMMAND = "echo cleaned"


def corpus(tmp_path: Path) -> Path:
    """A few of the examples, and one shell command file of one line."""
    folder = tmp_path / "corpus" / "examples"
    folder.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(CORPUS / name, folder / name)
    (folder / "cleanup.cmds").write_text(COMMAND + "\n")
    return folder


def admin(cluster: LocalCluster, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *words],
                          capture_output=True, text=True, timeout=60)


def audit(archive: Path) -> list[tuple[datetime.datetime, str, str]]:
    """(time, node, rest of the line) of each node connection in a run's audit log."""
    rows = []
    for line in (archive / "audit.log").read_text().splitlines():
        when, _peer, word, node, rest = line.split(" ", 4)
        if word == "node" and not rest.startswith("refused"):
            rows.append((datetime.datetime.fromisoformat(when), node, rest))
    return rows


def most_held(rows: list[tuple[datetime.datetime, str, str]]) -> dict[str, int]:
    """The most jobs of the run each node held at once: given minus results reported, and
    what it said it had pending and running, after each of its calls."""
    held: dict[str, int] = {}
    most: dict[str, int] = {}
    for _, node, rest in rows:
        words = rest.split()
        results = int(words[words.index("results") + 1])
        jobs = words.index("jobs")
        pending, running = int(words[jobs + 1]), int(words[jobs + 2])
        given = rest.rpartition(" given ")[2].split()
        handed = int(given[1]) if given[0] == "JOBS" else 0
        held[node] = max(held.get(node, 0) - results, 0) + handed
        most[node] = max(most.get(node, 0), held[node], pending + running)
    return most


def live_nodes(cluster: LocalCluster, priority: int) -> set[str]:
    """The nodes in the run the priority's master serves now, from its live status."""
    try:
        live = json.loads(cluster.home.live(priority).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return set()
    return set(live.get("nodes", {}))


def span(rows: list[tuple[datetime.datetime, str, str]], node: str
         ) -> tuple[datetime.datetime, datetime.datetime] | None:
    times = [when for when, name, _ in rows if name == node]
    return (min(times), max(times)) if times else None


def test_groups_caps_exclusive_and_every_node_on_a_real_cluster(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(nodes=3, corpus=corpus(tmp_path), slots="3",
                           gs_configs="ppmraw.72.0 pgmraw.72.0", status_port=str(free_port()))
    slow_demo_tree(cluster.home_dir / "ghostpdl", "gs", [])  # the priority-2 run builds it
    cluster.start()
    cluster.wait_for_nodes()

    # 1. The groups, through clusteradmin, while the master runs.
    assert admin(cluster, "group", "create", "pair").stdout == "group pair created (empty)\n"
    assert admin(cluster, "group", "add", "pair", "node1", "node2").returncode == 0
    assert admin(cluster, "group", "create", "ghost").returncode == 0
    assert admin(cluster, "group", "add", "ghost", "node9").returncode == 0
    listed = admin(cluster, "group", "ls")
    assert listed.stdout == "ghost: node9\npair: node1 node2\n"
    wrong = admin(cluster, "group", "remove", "pair", "node3")
    assert wrong.returncode == 1 and "node3 not in group pair" in wrong.stderr
    slash = admin(cluster, "group", "create", "a/b")
    assert slash.returncode == 1 and "contains a '/'" in slash.stderr
    unknown = admin(cluster, "group", "ls", "mac")
    assert unknown.returncode == 1 and "no group 'mac'" in unknown.stderr
    assert (cluster.home_dir / "groups" / "pair").read_text() == "node1\nnode2\n"

    # 2. A grouped run at priority 0 and an exclusive, capped run at priority 2, together.
    # The grouped run goes first, and the capped one is queued once node1 and node2 have
    # joined it: a node serves one run until it ends, so a pair node that joined the capped
    # run first would (rightly) serve nothing of the grouped one.
    tree = slow_demo_tree(cluster.home_dir / "ann" / "ghostpdl", "gs", [])
    grouped = cluster.push(tree, "ann", ["gs"], ["groups=pair"])
    wait_for(lambda: live_nodes(cluster, 0) == {"node1", "node2"}, 120,
             "node1 and node2 in the grouped run")
    capped = RunSpec.parse("auto nightly-capped gs exclusive max_worker_instances=1")
    QueueFile.for_priority(cluster.home, 2).append(capped)
    first = cluster.wait_for_run(grouped, set(), 120)
    second = cluster.wait_for_run(capped, set(), 120, priority=2)
    assert run_end(first).complete and run_end(second).complete

    grouped_rows, capped_rows = audit(first), audit(second)
    assert {node for _, node, _ in grouped_rows} == {"node1", "node2"}
    assert {r.machine for r in read_tab(first / f"{first.name}.tab").values()} <= \
        {"node1", "node2"}
    # node3 took the capped run while the grouped one ran without it.
    assert span(capped_rows, "node3") is not None
    most = most_held(capped_rows)
    assert most and max(most.values()) == 1, most  # 3 slots each, never 2 jobs at once
    assert max(most_held(grouped_rows).values()) > 1  # the cap was the run's, not the nodes'
    for node in ("node1", "node2", "node3"):
        a, b = span(capped_rows, node), span(grouped_rows, node)
        if a is not None and b is not None:
            assert a[1] < b[0] or b[1] < a[0], f"{node} served both runs at once: {a} {b}"

    # 3. A run whose group has no node up waits, says why, and stop --group stops it.
    ghost = cluster.push(tree, "bob", ["gs"], ["groups=ghost"])
    reason = "no node of group ghost is up"
    wait_for(lambda: reason in admin(cluster, "stat").stdout, 60, "stat saying why it waits")
    url = cluster.wait_for_status_page()
    with urllib.request.urlopen(url + "api/status", timeout=10) as answer:
        running = json.load(answer)["running"]
    assert [r["waiting"] for r in running if r["priority"] == 0] == [reason]
    stopped = admin(cluster, "stop", "--group", "ghost", "--reason", "no such node")
    assert stopped.returncode == 0 and "asked the priority-0 master to stop run" in \
        stopped.stdout
    waited = cluster.wait_for_run(ghost, {first.name}, 60)
    assert run_end(waited).outcome == "aborted"
    trail = waited / "audit.log"
    assert not trail.exists() or " node " not in trail.read_text()  # no node ever called

    # 4. every_node, node3 disabled: the one command once on each enabled node.
    assert admin(cluster, "node", "disable", "node3").returncode == 0
    # node4 looks up when the run starts (a fresh heartbeat record) but never calls: after
    # heartbeat_timeout its copy is settled as not run, naming it, and the run ends.
    (cluster.home.nodes / "node4.up").touch()
    shell = write_demo_tree(cluster.home_dir / "carl" / "shell", "shell", [])
    every = cluster.push(shell, "carl", ["shell"], ["every_node"])
    before = {first.name, waited.name}
    done = cluster.wait_for_run(every, before, 120)
    assert run_end(done).complete
    rows = read_tab(done / f"{done.name}.tab")
    assert sorted(rows) == ["examples__cleanup.cmds.1@node1", "examples__cleanup.cmds.1@node2"]
    assert {name.rpartition("@")[2]: r.machine for name, r in rows.items()} == \
        {"node1": "node1", "node2": "node2"}
    assert all(r.error == 0 for r in rows.values())
    assert ("not run on node node4: not up or left the run (every_node; 1 test not run)"
            in (done / "report.txt").read_text())
