#!/usr/bin/env python3
"""bench/sweep.py -- a sweep of tiny tasks through the cluster, against xargs and GNU parallel.

Usage: python3 bench/sweep.py [--tasks 5000] [--slots 2] [--reps 3] [--keep DIR]

One sweep of N tasks, each ``echo <i> > out.txt`` in a folder of its own (a tiny program
leaving a small result file), is run by three contenders, repetitions interleaved
(a b c a b c ...):

  xargs      ``xargs -P S sh -c`` over the same commands, each making its folder under a
             local results folder and writing ``out.txt`` there -- the local limit
  parallel   GNU parallel ``-j S --results <dir>`` over the same commands (parallel also
             keeps each task's stdout and stderr, as its users know it)
  cluster    a master and one local node with S slots running the sweep (``sweep.toml``:
             the table ``params.csv`` with the column ``i``, ``[results] out = "out.txt"``),
             timed from the enqueue to the report being written; the daemons are started
             before the clock starts and stopped after it stops

Every contender's output is checked: each task's ``out.txt`` holds its ``i``; for the
cluster that is ``archive/<run>/results/<task id>/out`` for every task, and
``results.tsv`` has one ``ok`` row per task, in task order.

Prints the machine, then one line per contender:
  contender=xargs median_s=9.80 ratio=1.00 runs=3 ok=yes
The goal (docs/performance.md, "sweep") is cluster / xargs <= 1.3.  The exit status is 0
when every output was right, whatever the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import start  # noqa: E402
from bench.dispatch import quick_cluster, report, timed_run  # noqa: E402
from cluster.localcluster import DEFAULT_CORPUS  # noqa: E402
from cluster.sweep import joblog  # noqa: E402
from cluster.sweep.expand import tasks  # noqa: E402
from cluster.sweep.spec import load  # noqa: E402
from cluster.triggers.sweeppush import prepare_sweep  # noqa: E402

#: The sweep file of the benchmark's sweep.
SWEEP_TOML = """\
command = "echo {i} > out.txt"
table = "params.csv"
timeout = 60

[results]
out = "out.txt"
"""


def write_sweep(folder: Path, n: int) -> Path:
    """The benchmark's sweep folder (its sweep file and a table of ``n`` rows); returns the
    sweep file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.csv").write_text("i\n" + "".join(f"{i}\n" for i in range(1, n + 1)),
                                       encoding="utf-8")
    path = folder / "sweep.toml"
    path.write_text(SWEEP_TOML, encoding="utf-8")
    return path


def task_command(results: Path, i: int) -> str:
    """The local contenders' command for task ``i``: the same work in ``results/<i>/``."""
    return f"mkdir -p {results}/{i} && cd {results}/{i} && echo {i} > out.txt"


def check_local(results: Path, n: int) -> bool:
    """Whether every task's ``out.txt`` under ``results`` holds its number."""
    return all((results / str(i) / "out.txt").read_text() == f"{i}\n"
               if (results / str(i) / "out.txt").is_file() else False
               for i in range(1, n + 1))


class LocalContender:
    """xargs or GNU parallel over the commands, into a fresh results folder each time."""

    def __init__(self, root: Path, n: int, slots: int, kind: str) -> None:
        self.root, self.n, self.slots, self.kind = root, n, slots, kind
        self.reps = 0

    def run(self) -> tuple[float, bool]:
        self.reps += 1
        work = self.root / f"{self.kind}{self.reps}"
        results = work / "results"
        results.mkdir(parents=True)
        listing = work / "commands.txt"
        listing.write_text("".join(task_command(results, i) + "\n"
                                   for i in range(1, self.n + 1)), encoding="utf-8")
        if self.kind == "xargs":
            argv = ["xargs", "-d", "\n", "-P", str(self.slots), "-n", "1", "sh", "-c"]
        else:
            argv = ["parallel", "--will-cite", "-j", str(self.slots),
                    "--results", str(work / "parallel")]
        with open(listing, "rb") as stdin:
            began = time.monotonic()
            done = subprocess.run(argv, stdin=stdin, capture_output=True, check=False)
            elapsed = time.monotonic() - began
        ok = done.returncode == 0 and check_local(results, self.n)
        shutil.rmtree(work, ignore_errors=True)
        return elapsed, ok


class ClusterContender:
    """A master and one node with ``slots`` slots, started for each repetition; the sweep
    timed from its enqueue to its report."""

    def __init__(self, root: Path, n: int, slots: int) -> None:
        self.n = n
        self.sweep = prepare_sweep(write_sweep(root / "sweep", n))
        spec = load(self.sweep.folder / self.sweep.file)
        # task id -> the text its out.txt must hold, in task order
        self.expected = {task.task_id: f"{task.row.values[0]}\n" for task in tasks(spec)}
        self.cluster = quick_cluster(root / "cluster", 1, slots, DEFAULT_CORPUS)

    def run(self) -> tuple[float, bool]:
        words = self.sweep.words
        elapsed, archive = timed_run(
            self.cluster, lambda c: c.push(self.sweep.folder, "bench", words[:1], words[1:]))
        return elapsed, self.check(archive)

    def check(self, archive: Path) -> bool:
        """Every task's result file came home with its number, and results.tsv has one ok
        row per task in task order."""
        for task_id, text in self.expected.items():
            path = archive / "results" / task_id / "out"
            if not path.is_file() or path.read_text() != text:
                print(f"# cluster: {path} is missing or wrong", file=sys.stderr)
                return False
        rows = list(joblog.read_joblog(archive / "results.tsv"))
        return [r.seq for r in rows] == list(range(1, self.n + 1)) and all(r.ok for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.slots < 1 or args.reps < 1:
        parser.error("--tasks, --slots and --reps must be positive")
    work = start("sweep", ("xargs", "parallel"), args.keep)
    if work is None:
        return 2
    n, s = args.tasks, args.slots
    contenders = {
        "xargs": LocalContender(work / "xargs", n, s, "xargs").run,
        "parallel": LocalContender(work / "parallel", n, s, "parallel").run,
        "cluster": ClusterContender(work / "cluster", n, s).run,
    }
    return report(contenders, args.reps, "xargs", {"tasks": n, "slots": s}, work,
                  args.keep is None)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
