#!/usr/bin/env python3
"""bench/fairshare.py -- how long a second developer's push waits behind a first one's,
with priority 0's user lanes and without (docs/runoptions.md, "Fair share").

Usage: python3 bench/fairshare.py [--first 40] [--second 8] [--sleep 1.5] [--nodes 2]
                                  [--cases lanes,one] [--keep DIR]

A local cluster of ``--nodes`` nodes of one slot, with the configuration's defaults (but
the ports, ``result_cache = no`` and ``speculate_tail = no``: without tail copies every
result past one per test would be a job run twice).  Alice pushes ``--first`` shell jobs of
``sleep <--sleep>; echo alice <i>``; once her run holds every node and 2 results are in,
Bob pushes ``--second`` such jobs.  Case ``lanes`` runs with the default ``user_lanes = 3``,
``one`` with ``user_lanes = 1`` (one priority-0 run at a time, as seed 000).

Figures, per case:

  first_job_s   from Bob's push to his run's first JOBS reply (its audit trail)
  report_s      from Bob's push to his run's archive (LocalCluster.wait_for_run)
  alice_s       from Alice's push to her run's archive
  moves         the move lines in Alice's run's audit trail
  correct       both runs' tables have every test once, error 0 and the md5 of its text,
                and their nodes reported exactly that many results (none run twice)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import reported, run_cases, start  # noqa: E402
from bench.preempt import stamp, wait  # noqa: E402
from cluster.demotree import write_demo_tree  # noqa: E402
from cluster.localcluster import LocalCluster  # noqa: E402
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402


def holds_all(cluster: LocalCluster, nodes: int) -> bool:
    """Whether Alice's run (lane 0) has every node and 2 results."""
    try:
        live = json.loads(cluster.home.live(0).read_text())
    except (OSError, ValueError):
        return False
    return live["jobs"]["done"] >= 2 and len(live.get("nodes", {})) == nodes


def complete(folder: Path, user: str, count: int) -> bool:
    """Every test of ``user``'s run once, with its text's md5, and ``count`` results."""
    table = read_tab(folder / f"{folder.name}.tab")
    expected = {f"fair__{user}.cmds.{i}": (0, hashlib.md5(f"{user} {i}\n".encode()).hexdigest())
                for i in range(1, count + 1)}
    lines = (folder / "audit.log").read_text().splitlines()
    return {n: (r.error, r.md5) for n, r in table.items()} == expected and \
        reported(lines) == count


def case(work: Path, name: str, args: argparse.Namespace) -> dict[str, object]:
    corpus = work / name / "fair"
    corpus.mkdir(parents=True)
    for user, count in (("alice", args.first), ("bob", args.second)):
        (corpus / f"{user}.cmds").write_text("".join(f"sleep {args.sleep}; echo {user} {i}\n"
                                                     for i in range(1, count + 1)))
    settings = {"slots": "1", "result_cache": "no", "speculate_tail": "no",
                "user_lanes": "3" if name == "lanes" else "1",
                "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": str(free_port())}
    cluster = LocalCluster(work / name / "home", args.nodes, corpus, settings)
    cluster.prepare()
    try:
        cluster.start()
        cluster.wait_for_nodes()
        before = cluster.archives()
        trees = {user: write_demo_tree(cluster.home_dir / user / "shell", "shell", [])
                 for user in ("alice", "bob")}
        alice_at = time.time()
        alice = cluster.push(trees["alice"], "alice", ["shell"], ["filter=alice"])
        wait("alice's run on every node", lambda: holds_all(cluster, args.nodes), 120)
        bob_at = time.time()
        bob = cluster.push(trees["bob"], "bob", ["shell"], ["filter=bob"])
        bob_run = cluster.wait_for_run(bob, before, 900, priority=0)
        report_s = time.time() - bob_at
        alice_run = cluster.wait_for_run(alice, before, 900, priority=0)
        alice_s = time.time() - alice_at
    finally:
        cluster.stop(grace=10)
    bob_audit = (bob_run / "audit.log").read_text().splitlines()
    first_job = min(stamp(line) for line in bob_audit if " given JOBS " in line) - bob_at
    alice_audit = (alice_run / "audit.log").read_text().splitlines()
    correct = (complete(bob_run, "bob", args.second)
               and complete(alice_run, "alice", args.first))
    return {"case": name, "nodes": args.nodes, "first": args.first, "second": args.second,
            "sleep": args.sleep, "first_job_s": f"{first_job:.1f}",
            "report_s": f"{report_s:.1f}", "alice_s": f"{alice_s:.1f}",
            "moves": sum(1 for x in alice_audit if " - move " in x),
            "correct": "yes" if correct else "no"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/fairshare.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=40)
    parser.add_argument("--second", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=1.5)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cases", default="lanes,one")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    work = start("fairshare", ("sh",), args.keep)
    if work is None:
        return 2
    return run_cases(args.cases, lambda name: case(work, name, args))


if __name__ == "__main__":
    sys.exit(main())
