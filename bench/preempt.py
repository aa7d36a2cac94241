#!/usr/bin/env python3
"""bench/preempt.py -- how long a developer's push waits behind a nightly run, with and
without preemption (docs/protocol.md, "Preemption at job boundaries").

Usage: python3 bench/preempt.py [--night 60] [--sleep 1.5] [--push 4] [--nodes 2]
                                [--cases on,off] [--keep DIR]

A local cluster of ``--nodes`` nodes of one slot, with the configuration's defaults (but
the ports, ``result_cache = no`` and ``speculate_tail = no``: without tail copies every
result past one per test would be a job run twice).  A nightly run at priority 2
(``auto nightly shell filter=night``) of ``--night`` shell jobs, each
``sleep <--sleep>; echo night <i>``; once both nodes are in it and 4 results are in, a
push at priority 0 (``user ann shell filter=push``, ``--push`` jobs of ``echo``).  Case
``on`` runs with ``preempt = yes`` (the default), ``off`` with ``preempt = no``.

Figures, per case:

  first_job_s   from the push to the push run's first JOBS reply (its audit trail)
  report_s      from the push to the push run's archive (its report written, its master
                gone: LocalCluster.wait_for_run)
  night_s       from the nightly run's enqueue to its archive
  moves         the preemption's move lines in the nightly run's audit trail
  correct       the nightly run's table has every test once, error 0 and the md5 of its
                text, and its nodes reported exactly --night results (none run twice)
"""

from __future__ import annotations

import argparse
import calendar
import hashlib
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import reported, run_cases, start  # noqa: E402
from cluster.demotree import write_demo_tree  # noqa: E402
from cluster.localcluster import LocalCluster  # noqa: E402
from cluster.queue import QueueFile  # noqa: E402
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402


def stamp(line: str) -> float:
    """The epoch of an audit line's time (``2026-11-28T14:31:06.123Z``)."""
    whole, _, millis = line.split(" ", 1)[0].rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


def holds_both(cluster: LocalCluster, nodes: int) -> bool:
    try:
        live = json.loads(cluster.home.live(2).read_text())
    except (OSError, ValueError):
        return False
    found = live.get("nodes", {})
    return (live["jobs"]["done"] >= 4 and len(found) == nodes
            and all(n["state"] == "ready" for n in found.values()))


def wait(what: str, test: object, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not test():  # type: ignore[operator]
        if time.monotonic() > end:
            raise TimeoutError(what)
        time.sleep(0.05)


def case(work: Path, name: str, args: argparse.Namespace) -> dict[str, object]:
    corpus = work / name / "pre"
    corpus.mkdir(parents=True)
    (corpus / "night.cmds").write_text("".join(f"sleep {args.sleep}; echo night {i}\n"
                                               for i in range(1, args.night + 1)))
    (corpus / "push.cmds").write_text("".join(f"echo push {i}\n"
                                              for i in range(1, args.push + 1)))
    settings = {"slots": "1", "result_cache": "no", "speculate_tail": "no",
                "preempt": "yes" if name == "on" else "no",
                "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                "status_port": str(free_port())}
    cluster = LocalCluster(work / name / "home", args.nodes, corpus, settings)
    cluster.prepare()
    write_demo_tree(cluster.home_dir / "shell", "shell", [])
    try:
        cluster.start()
        cluster.wait_for_nodes()
        before = cluster.archives()
        nightly = RunSpec.parse("auto nightly shell filter=night")
        queued = time.time()
        QueueFile.for_priority(cluster.home, 2).append(nightly)
        wait("the nightly run on every node", lambda: holds_both(cluster, args.nodes), 120)
        tree = write_demo_tree(cluster.home_dir / "ann" / "shell", "shell", [])
        pushed = time.time()
        push = cluster.push(tree, "ann", ["shell"], ["filter=push"])
        first = cluster.wait_for_run(push, before, 600, priority=0)
        report_s = time.time() - pushed
        night = cluster.wait_for_run(nightly, before, 600, priority=2)
        night_s = time.time() - queued
    finally:
        cluster.stop(grace=10)
    audit = (first / "audit.log").read_text().splitlines()
    first_job = min(stamp(line) for line in audit if " given JOBS " in line) - pushed
    table = read_tab(night / f"{night.name}.tab")
    expected = {f"pre__night.cmds.{i}": (0, hashlib.md5(f"night {i}\n".encode()).hexdigest())
                for i in range(1, args.night + 1)}
    lines = (night / "audit.log").read_text().splitlines()
    correct = ({n: (r.error, r.md5) for n, r in table.items()} == expected
               and reported(lines) == args.night)
    return {"case": name, "nodes": args.nodes, "night": args.night, "sleep": args.sleep,
            "push": args.push, "first_job_s": f"{first_job:.1f}", "report_s": f"{report_s:.1f}",
            "night_s": f"{night_s:.1f}", "moves": sum(1 for x in lines if " - move " in x),
            "correct": "yes" if correct else "no"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/preempt.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--night", type=int, default=60)
    parser.add_argument("--sleep", type=float, default=1.5)
    parser.add_argument("--push", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cases", default="on,off")
    parser.add_argument("--keep", type=Path)
    args = parser.parse_args(argv)
    work = start("preempt", ("sh",), args.keep)
    if work is None:
        return 2
    return run_cases(args.cases, lambda name: case(work, name, args))


if __name__ == "__main__":
    sys.exit(main())
