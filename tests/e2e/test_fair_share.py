"""End to end: two users' pushes at priority 0 run side by side on shares of the nodes
(docs/runoptions.md, "Fair share").  A real local cluster of two nodes of one slot.

Alice's push of 24 shell jobs of ``sleep 1`` holds both nodes; Bob pushes 8 while it runs.
Bob's run is served at once by priority 0's first user lane (``job.3.start``, its own
clustermaster and port: the lanes fill in order); Alice's master sends one of her nodes
there at its next job boundary (a ``move`` in her run's audit trail, "fair share"), so both
runs are served at the same time -- each run's audit trail shows jobs handed out while the
other's does -- and each completes with every test exactly once and the output an
undisturbed run gives.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.report.tab import read_tab
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart
from tests.e2e.conftest import MakeCluster
from tests.e2e.test_preemption import reported, stamp
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

ALICE = 24
BOB = 8


def corpus(root: Path) -> Path:
    """Two command files: Alice's (filter=alice), Bob's (filter=bob)."""
    folder = root / "fair"
    folder.mkdir()
    for user, count in (("alice", ALICE), ("bob", BOB)):
        (folder / f"{user}.cmds").write_text("".join(f"sleep 1; echo {user} {i}\n"
                                                     for i in range(1, count + 1)))
    return folder


def handed_out(audit: list[str]) -> list[float]:
    """When the run's master handed jobs out, over its audit trail."""
    return [stamp(line) for line in audit if " given JOBS " in line]


def check_run(folder: Path, user: str, count: int) -> list[str]:
    """Every test of ``user``'s run exactly once, each the md5 of its fixed text; the
    run's audit trail."""
    table = read_tab(folder / f"{folder.name}.tab")
    expected = {f"fair__{user}.cmds.{i}": hashlib.md5(f"{user} {i}\n".encode()).hexdigest()
                for i in range(1, count + 1)}
    assert {name: (row.error, row.md5) for name, row in table.items()} == \
        {name: (0, md5) for name, md5 in expected.items()}
    audit = (folder / "audit.log").read_text().splitlines()
    assert reported(audit) == count  # none ran twice, none was lost
    return audit


def test_two_users_pushes_are_served_side_by_side(make_cluster: MakeCluster,
                                                  tmp_path: Path) -> None:
    cluster = make_cluster(nodes=2, corpus=corpus(tmp_path), slots="1", speculate_tail="no")
    cluster.start()
    cluster.wait_for_nodes()
    before = cluster.archives()

    alice_tree = write_demo_tree(cluster.home_dir / "alice" / "shell", "shell", [])
    alice = cluster.push(alice_tree, "alice", ["shell"], ["filter=alice"])
    wait_for(lambda: cluster.home.job_start(0).exists(), 60, "alice's run to start")

    def alice_on_both() -> bool:
        try:
            live = json.loads(cluster.home.live(0).read_text())
        except (OSError, ValueError):
            return False
        nodes = live.get("nodes", {})
        return live["jobs"]["done"] >= 2 and len(nodes) == 2

    wait_for(alice_on_both, 90, "alice's run on both nodes")
    bob_tree = write_demo_tree(cluster.home_dir / "bob" / "shell", "shell", [])
    bob = cluster.push(bob_tree, "bob", ["shell"], ["filter=bob"])
    # Bob's run is served by the first user lane while Alice's goes on in lane 0.
    wait_for(lambda: cluster.home.job_start(3).exists(), 30, "bob's run in lane 3")
    in_lane_3 = JobStart.parse(cluster.home.job_start(3).read_text())
    assert RunSpec.parse(in_lane_3.queue) == bob and in_lane_3.lane == 3
    first = cluster.wait_for_run(bob, before, 180, priority=0)
    assert first.name == in_lane_3.id  # the run archived is the one lane 3 served
    second = cluster.wait_for_run(alice, before, 180, priority=0)

    bob_audit = check_run(first, "bob", BOB)
    alice_audit = check_run(second, "alice", ALICE)
    # Served at once: Bob's jobs were handed out between Alice's first and last handouts.
    alice_times, bob_times = handed_out(alice_audit), handed_out(bob_audit)
    assert min(alice_times) < min(bob_times) and max(bob_times) < max(alice_times), (
        alice_times, bob_times)
    moves = [line.split(" move ", 1)[1] for line in alice_audit if " - move " in line]
    print(f"moves {moves}; alice handouts {len(alice_times)}, bob {len(bob_times)}")
    assert moves and "fair share" in moves[0], moves
