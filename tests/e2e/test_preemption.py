"""End to end: a developer's push does not wait behind a nightly run (docs/protocol.md,
"Preemption at job boundaries").  A real local cluster of two nodes of one slot.

A nightly run at priority 2 of 40 shell jobs of ``sleep 1`` holds both nodes; a push at
priority 0 arrives.  The nightly run's master sends one node to it at that node's next job
boundary; the push's first job starts within seconds (one job boundary, the node's start in
the push's run and its build), the push completes, the node goes back, and the nightly run
completes with every test exactly once (the results its nodes reported add up to its
tests: none was run twice) and the table an undisturbed run has: each job prints a fixed
text, whose md5 is known here.  The moves are in the nightly run's audit trail, and the
status page's API shows them while the nightly run goes on.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
import urllib.request
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from tests.e2e.conftest import MakeCluster
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

NIGHT = 40
PUSH = 4


def corpus(root: Path) -> Path:
    """Two command files: the nightly run's (filter=night), the push's (filter=push)."""
    folder = root / "pre"
    folder.mkdir()
    (folder / "night.cmds").write_text("".join(f"sleep 1; echo night {i}\n"
                                               for i in range(1, NIGHT + 1)))
    (folder / "push.cmds").write_text("".join(f"echo push {i}\n" for i in range(1, PUSH + 1)))
    return folder


def stamp(line: str) -> float:
    """The epoch of an audit line's time (``2026-11-28T14:31:06.123Z``)."""
    text = line.split(" ", 1)[0].rstrip("Z")
    whole, _, millis = text.partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


def reported(audit: list[str]) -> int:
    """The results the nodes' calls carried, over a run's audit trail."""
    return sum(int(line.split(" reported results ", 1)[1].split(" ", 1)[0])
               for line in audit if " reported results " in line)


def nightly_holds_both_nodes(cluster: LocalCluster) -> bool:
    try:
        live = json.loads(cluster.home.live(2).read_text())
    except (OSError, ValueError):
        return False
    nodes = live.get("nodes", {})
    return (live["jobs"]["done"] >= 4 and len(nodes) == 2
            and all(n["state"] == "ready" for n in nodes.values()))


def test_a_push_takes_a_node_of_the_nightly_run_at_its_next_job_boundary(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    # No tail copies (a copy of another node's last job for an idle node, first result
    # wins): then every result past one per test would be a job run twice.
    cluster = make_cluster(nodes=2, corpus=corpus(tmp_path), slots="1", speculate_tail="no")
    write_demo_tree(cluster.home_dir / "shell", "shell", [])  # the tree the runs build
    cluster.start()
    cluster.wait_for_nodes()
    before = cluster.archives()
    nightly = RunSpec.parse("auto nightly shell filter=night")
    assert QueueFile.for_priority(cluster.home, 2).append(nightly)
    wait_for(lambda: nightly_holds_both_nodes(cluster), 90, "the nightly run on both nodes")

    tree = write_demo_tree(cluster.home_dir / "ann" / "shell", "shell", [])
    pushed = time.time()
    push = cluster.push(tree, "ann", ["shell"], ["filter=push"])
    first = cluster.wait_for_run(push, before, 120, priority=0)
    reported_at = time.time()
    # The status page shows the nightly run's moves while it goes on.
    url = cluster.wait_for_status_page()

    def moves_shown() -> list[str]:
        with urllib.request.urlopen(url + "api/status", timeout=10) as answer:
            running = json.load(answer)["running"]
        return [m["text"] for r in running if r["priority"] == 2 for m in r.get("moves", ())]

    wait_for(lambda: len(moves_shown()) == 3, 30, "the status page showing the moves")
    moves_seen = moves_shown()
    night = cluster.wait_for_run(nightly, before, 180, priority=2)

    # The push: complete, its first job handed out within a job boundary and a build.
    push_table = read_tab(first / f"{first.name}.tab")
    assert sorted(push_table) == sorted(f"pre__push.cmds.{i}" for i in range(1, PUSH + 1))
    push_audit = (first / "audit.log").read_text().splitlines()
    first_jobs = min(stamp(line) for line in push_audit if " given JOBS " in line)
    print(f"push to first job {first_jobs - pushed:.1f} s, "
          f"push to report {reported_at - pushed:.1f} s")
    assert first_jobs - pushed < 15, push_audit[:10]

    # The nightly run: every test exactly once, the table of an undisturbed run.
    table = read_tab(night / f"{night.name}.tab")
    expected = {f"pre__night.cmds.{i}": hashlib.md5(f"night {i}\n".encode()).hexdigest()
                for i in range(1, NIGHT + 1)}
    assert {name: (row.error, row.md5) for name, row in table.items()} == \
        {name: (0, md5) for name, md5 in expected.items()}
    audit = (night / "audit.log").read_text().splitlines()
    assert reported(audit) == NIGHT  # no test ran twice, none was lost
    moves = [line.split(" move ", 1)[1] for line in audit if " - move " in line]
    assert len(moves) == 3, moves
    assert moves_seen == moves  # the page showed what the audit trail has
    chosen, told, left = moves
    node = chosen.split(" ")[1]
    assert chosen.startswith(f"node {node} chosen to leave for run ") and \
        "(priority 0)" in chosen
    assert told.startswith(f"node {node} told to leave for run ")
    assert left.startswith(f"node {node} left for run ")
    # The node went back to the nightly run once the push let it go.
    after = [line for line in audit[audit.index(next(x for x in audit if x.endswith(left))):]
             if f" node {node} reported " in line]
    assert any(" given JOBS " in line for line in after), after[:5]
    info = (night / "run.info").read_text()
    assert "lost" not in info.lower() or f"{node} (" not in info
