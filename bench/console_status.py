#!/usr/bin/env python3
"""bench/console_status.py -- how long the status model takes on a big master home.

Usage: python3 bench/console_status.py [--archives 200] [--nodes 1000] [--reps 50]
                                       [--keep DIR]

Builds a master home with ``--archives`` archived runs (run.info with summary lines, a
report, a small .tab) and ``--nodes`` nodes (``.up``, ``.status``, ``.caps``), one run under
way (job.start, live.json naming every node, a journal) and a few queued runs, then times
:func:`cluster.console.status.snapshot` (one reader, as the status server keeps one):

  first_ms      the first snapshot (every file read)
  steady_ms     median of --reps snapshots within the nodes listing's ttl (the caches hit)
  live_ms       median of --reps snapshots each after the run's live.json was rewritten
                (what a page poll costs during a run: the master rewrites it every second)
  relist_ms     median of --reps snapshots that list nodes/ again (nodes_ttl = 0)
  p95_steady_ms, p95_live_ms, p95_relist_ms   their 95th percentiles

The target (docs/operating.md, "Watching and steering the cluster"): a snapshot well under
20 ms.  steady_ms is what a page poll costs; relist_ms is the worst case, once per nodes_ttl
(1 s).  Prints the machine, then one line of figures; exit status 0 when steady_ms < 20.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, median, start  # noqa: E402
from cluster import (
    config,  # noqa: E402
    configfile,
)
from cluster.console.status import StatusReader  # noqa: E402
from cluster.home import Home  # noqa: E402
from cluster.queue import QueueFile
from cluster.runspec import RunSpec  # noqa: E402
from cluster.wire.jobstart import JobStart  # noqa: E402

RUN = "20270115080000-p1-beef"


def build(root: Path, archives: int, nodes: int) -> Home:
    home = Home(root)
    home.create()
    now = time.time()
    for i in range(archives):
        run_id = f"2027{1 + i // 100000:02d}{i % 100000:08d}-p1-{i:04x}"
        folder = home.archive / run_id
        folder.mkdir()
        (folder / "report.txt").write_text("report\n")
        (folder / f"{run_id}.tab").write_text(
            "ex__a.ps.ppmraw.72.0\t0\t0.10\t0.00\t0.00\t0\t" + "a" * 32 + "\tr\tgs\tn1\n")
        (folder / "run.info").write_text(
            f"id {run_id}\npriority 1\nqueue git 0123abcd gs\nkind git\nref 0123abcd\n"
            "products gs\ntree ghostpdl\nsource ghostpdl\nbuild make\ntests tests\n"
            f"elapsed 100.0\noutcome done\nnodes 3\ndifferences {i % 7}\nerrors 0\n")
    live_nodes = {}
    for i in range(nodes):
        name = f"n{i:04d}"
        (home.nodes / f"{name}.status").write_text("running jobs\n")
        (home.nodes / f"{name}.caps").write_text("tools=md5sum cores=8 gs=10.02\n")
        (home.nodes / f"{name}.up").touch()
        live_nodes[name] = {"state": "ready", "slots": 8, "done": i, "running": 8,
                            "errors": 0, "timeouts": 0, "last_seen": now, "caps": "",
                            "status": ""}
    line = "git 0123abcd gs"
    QueueFile.for_priority(home, 1).append(RunSpec.parse(line))
    for user in ("alice", "bob", "carol"):
        QueueFile.for_priority(home, 0).append(RunSpec.parse(f"user {user} gs"))
    home.job_start(1).write_text(JobStart(
        id=RUN, priority=1, queue=line, kind="git", ref="0123abcd", products=("gs",),
        tree="ghostpdl", source="ghostpdl", build="make", tests="tests").format())
    home.live(1).write_text(json.dumps({
        "version": 1, "run": RUN, "priority": 1, "kind": "git", "queue": line,
        "products": ["gs"], "started": now - 100, "updated": now,
        "jobs": {"total": 10**6, "done": 5 * 10**5, "running": 8000, "left": 492000},
        "rate": 3000.0, "eta": now + 164, "nodes": live_nodes, "lost": [], "fatal": "",
        "stopping": ""}))
    return home


def timed(reader: StatusReader, home: Home, cfg: config.Config, reps: int,
          live: bool = False) -> list[float]:
    """Milliseconds per snapshot; ``live``: the live file is rewritten before each (as its
    master does every second), outside the timing."""
    text = home.live(1).read_text()
    times = []
    for i in range(reps):
        if live:
            tmp = home.live(1).with_name(f".live.{i}.tmp")
            tmp.write_text(text.replace('"rate": ', f'"rate": {i}.0, "x": ', 1))
            os.replace(tmp, home.live(1))
        t = time.perf_counter()
        reader.snapshot(home, cfg)
        times.append((time.perf_counter() - t) * 1e3)
    return times


def p95(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.95))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="console_status.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archives", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--keep", type=Path, help="build the home here and keep it")
    args = parser.parse_args(argv)
    work = start("console_status", (), args.keep)
    if work is None:
        return 2
    try:
        home = build(work / "home", args.archives, args.nodes)
        cfg = configfile.load(None, {"home": str(home.root)})
        reader = StatusReader(nodes_ttl=3600.0)
        t = time.perf_counter()
        reader.snapshot(home, cfg)
        first = (time.perf_counter() - t) * 1e3
        steady = timed(reader, home, cfg, args.reps)
        live = timed(reader, home, cfg, args.reps, live=True)
        reader.nodes_ttl = 0.0
        relist = timed(reader, home, cfg, args.reps)
        print(figures({"archives": args.archives, "nodes": args.nodes, "reps": args.reps,
                       "first_ms": f"{first:.1f}", "steady_ms": f"{median(steady):.2f}",
                       "p95_steady_ms": f"{p95(steady):.2f}",
                       "live_ms": f"{median(live):.1f}", "p95_live_ms": f"{p95(live):.1f}",
                       "relist_ms": f"{median(relist):.1f}",
                       "p95_relist_ms": f"{p95(relist):.1f}",
                       "load1": f"{os.getloadavg()[0]:.2f}"}), flush=True)
        return 0 if median(steady) < 20 else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
