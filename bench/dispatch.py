#!/usr/bin/env python3
"""bench/dispatch.py -- the cluster against xargs and GNU parallel on one list of small jobs.

Usage: python3 bench/dispatch.py [--jobs 5000] [--slots 2] [--reps 3] [--gs]
                                 [--localcluster [--corpus DIR]] [--keep DIR]

One list of N jobs (``echo <i> | md5sum``) is run by four contenders, repetitions
interleaved (a b c d a b c d ...):

  xargs        ``xargs -P S sh -c`` -- the local limit
  parallel     GNU parallel ``-j S``
  cluster-1node   a master and one local node with S slots
  cluster-2node   a master and two local nodes with S/2 slots each

The cluster's time runs from the enqueue (clusterpush) to the report being written; the
daemons are started before the clock starts and stopped after it stops.  Every contender's
output is checked: xargs and parallel must print the N expected lines, the cluster's .tab
must hold every job once with the md5 of the expected output.

With --gs the real case is timed as well: one gs run over the example corpus
(contender=gs-cluster-1node, the same S slots).

With --localcluster the one-command experience is timed instead, against the same work
done by hand:

  gs-xargs       the gs job commands of the demo run (the README's main job), with the
                 node's placeholders filled in, by ``xargs -P <cpus> sh -c`` after one
                 ``make`` of the demo tree
  localcluster   ``python3 localcluster.py --home <new dir>``, wall time from start to exit
                 (home, corpus mirror, daemons, the run, the report, the stop)

Both produce an md5 per job; the check is that every job has one.  ``--corpus DIR`` runs
both over another corpus than the ghostpdl examples (localcluster.py's own --corpus).

Prints the machine, then one line per contender:
  contender=xargs median_s=4.02 ratio=1.00 runs=3 ok=yes
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, median, start  # noqa: E402
from cluster.demotree import write_demo_tree
from cluster.jobs import generate as jobgen  # noqa: E402
from cluster.localcluster import DEFAULT_CORPUS, SUPERVISOR_SCRIPT, LocalCluster
from cluster.node import code  # noqa: E402
from cluster.records import BIN, TEMP, TESTS  # noqa: E402
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

#: Intervals for a cluster that should react in well under a second.
QUICK = {"supervisor_interval": "10", "heartbeat_interval": "0.2", "poll_interval": "1",
         "report_interval": "0.1", "linger": "2", "pid_check_interval": "1"}


def commands(n: int) -> list[str]:
    return [f"echo {i} | md5sum" for i in range(n)]


def output_line(i: int) -> str:
    """What ``echo <i> | md5sum`` prints (without the newline)."""
    return hashlib.md5(b"%d\n" % i).hexdigest() + "  -"


def expected_lines(n: int) -> Counter[str]:
    return Counter(output_line(i) for i in range(n))


def run_local(argv: list[str], jobs_file: Path, n: int) -> tuple[float, bool]:
    """Time a local runner reading the job list on stdin; check its output."""
    with open(jobs_file, "rb") as stdin:
        start = time.monotonic()
        done = subprocess.run(argv, stdin=stdin, capture_output=True, check=False)
        elapsed = time.monotonic() - start
    ok = done.returncode == 0 and Counter(done.stdout.decode().splitlines()) == \
        expected_lines(n)
    return elapsed, ok


def settle(cluster: LocalCluster, timeout: float = 30.0) -> None:
    """Wait (at most ``timeout`` seconds) until the supervisor's first round is over, so
    that none of it falls inside the timed run of a cluster that, in use, has been up for
    days: the round has published the node code (its first act, the ``MANIFEST`` written)
    and no clustermaster it started is alive.  On the fresh home of a bench it starts none
    (each priority surely has nothing to do: docs/deviations.md); should one have work, it
    is waited for.  The supervisor is looked at every 5 ms."""
    supervisor = psutil.Process(cluster.daemons[SUPERVISOR_SCRIPT].child.pid)
    manifest = cluster.home.node_code / code.MANIFEST
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        masters = 0
        for child in supervisor.children():
            try:
                argv = child.cmdline()
            except psutil.Error:  # ended meanwhile (a zombie has no command line)
                continue
            masters += any(Path(arg).name.startswith("clustermaster") for arg in argv)
        if not masters and manifest.is_file():
            return
        time.sleep(0.005)
    raise TimeoutError(f"the supervisor's first round did not end within {timeout:.0f} s")


def timed_run(cluster: LocalCluster, push: Callable[[LocalCluster], RunSpec]
              ) -> tuple[float, Path]:
    """Start ``cluster``, wait until its nodes are up and its first round is over, then
    time one run queued by ``push`` from the enqueue to its report; the daemons are stopped
    afterwards.  (seconds, the run's archive folder)."""
    cluster.start()
    try:
        cluster.wait_for_nodes()  # so only the run is timed
        settle(cluster)
        before = cluster.archives()
        start = time.time()
        spec = push(cluster)
        archive = cluster.wait_for_run(spec, before, 3600)
        elapsed = (archive / "report.txt").stat().st_mtime - start
    finally:
        cluster.stop(grace=10)
        for up in cluster.home.nodes.glob("*.up"):
            up.unlink()
    return elapsed, archive


def quick_cluster(root: Path, nodes: int, slots: int, corpus: Path,
                  settings: dict[str, str] | None = None) -> LocalCluster:
    """A prepared local cluster of ``nodes`` nodes of ``slots`` slots on free ports, with
    intervals that react in well under a second."""
    cluster = LocalCluster(root, nodes, corpus, {
        **QUICK, **(settings or {}), "slots": str(slots), "base_port": str(free_port(5)),
        "monitor_port": str(free_port()), "status_port": str(free_port())})
    cluster.prepare()
    return cluster


class ClusterContender:
    """A local cluster that is started for each repetition and timed from the enqueue."""

    def __init__(self, root: Path, nodes: int, slots: int, corpus: Path, product: str,
                 expected: dict[str, str] | None, settings: dict[str, str]) -> None:
        self.nodes = nodes
        self.product = product
        self.expected = expected
        self.cluster = quick_cluster(root, nodes, slots, corpus, settings)
        self.tree = write_demo_tree(root / "demo" / product, product, [])

    def run(self) -> tuple[float, bool]:
        elapsed, archive = timed_run(
            self.cluster, lambda c: c.push(self.tree, "bench", [self.product], []))
        table = read_tab(archive / f"{archive.name}.tab")
        names = [line.split("\t", 1)[0]
                 for line in (archive / f"{archive.name}.tab").read_text().splitlines()]
        ok = len(names) == len(set(names)) and all(r.error == 0 for r in table.values())
        if self.expected is not None:
            ok = ok and {n: r.md5 for n, r in table.items()} == self.expected
        return elapsed, ok


class OneCommand:
    """``python3 localcluster.py`` end to end, and xargs over the same gs job commands."""

    def __init__(self, root: Path, corpus: Path = DEFAULT_CORPUS) -> None:
        self.root = root
        self.corpus = corpus
        self.reps = 0
        # The job list of the demo run, as the master makes it from the default settings.
        scratch = LocalCluster(root / "scratch", 2, corpus, {})
        cfg = scratch.prepare()
        self.tree = write_demo_tree(root / "by-hand" / "gs", "gs", [])
        subprocess.run(["make"], cwd=self.tree, check=True, capture_output=True)
        tests = scratch.home_dir / "tests"
        self.jobs = [job.command.replace(BIN, str(self.tree / "bin"))
                     .replace(TESTS, str(tests)) for job in jobgen.generate(cfg, ["gs"], tests)]

    def xargs(self) -> tuple[float, bool]:
        self.reps += 1
        temp = self.root / f"temp{self.reps}"
        temp.mkdir()
        listing = self.root / f"gs-jobs{self.reps}.txt"
        listing.write_text("".join(c.replace(TEMP, str(temp)) + "\n" for c in self.jobs))
        argv = ["xargs", "-d", "\n", "-P", str(os.cpu_count() or 1), "-n", "1", "sh", "-c"]
        with open(listing, "rb") as stdin:
            began = time.monotonic()
            subprocess.run(argv, stdin=stdin, capture_output=True, check=False)
            elapsed = time.monotonic() - began
        ok = len(list(temp.glob("*.md5"))) == len(self.jobs)
        shutil.rmtree(temp, ignore_errors=True)
        return elapsed, ok

    def localcluster(self) -> tuple[float, bool]:
        self.reps += 1
        home = self.root / f"home{self.reps}"
        argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home),
                "--corpus", str(self.corpus),
                "--set", f"base_port={free_port(5)}", "--set", f"monitor_port={free_port()}",
                "--set", f"status_port={free_port()}"]
        began = time.monotonic()
        done = subprocess.run(argv, capture_output=True, check=False, cwd=self.root)
        elapsed = time.monotonic() - began
        tables = list((home / "archive").glob("*/*.tab"))
        ok = done.returncode == 0 and len(tables) == 1 and \
            len(read_tab(tables[0])) == len(self.jobs)
        if not ok:
            print(done.stderr.decode(errors="replace")[-2000:], file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
        return elapsed, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gs", action="store_true", help="also time a gs corpus run")
    parser.add_argument("--localcluster", action="store_true",
                        help="time python3 localcluster.py against xargs over its gs jobs")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help="with --localcluster: the corpus (default: the ghostpdl examples)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.slots < 1 or args.reps < 1:
        parser.error("--jobs, --slots and --reps must be positive")
    work = start("dispatch", ("xargs", "parallel", "md5sum"), args.keep)
    if work is None:
        return 2
    n, s = args.jobs, args.slots
    jobs_file = work / "jobs.txt"
    jobs_file.write_text("".join(c + "\n" for c in commands(n)))
    corpus = work / "corpus"
    corpus.mkdir(exist_ok=True)
    shutil.copy(jobs_file, corpus / "small.cmds")
    # The md5 the node computes is that of the job's output line.
    expected = {f"{corpus.name}__small.cmds.{i + 1}":
                hashlib.md5((output_line(i) + "\n").encode()).hexdigest() for i in range(n)}

    contenders: dict[str, Callable[[], tuple[float, bool]]]
    if args.localcluster:
        one_command = OneCommand(work / "one-command", args.corpus.resolve())
        contenders = {"gs-xargs": one_command.xargs, "localcluster": one_command.localcluster}
        return report(contenders, args.reps, "gs-xargs", {"jobs": len(one_command.jobs)},
                      work, args.keep is None)
    contenders = {
        "xargs": lambda: run_local(["xargs", "-d", "\n", "-P", str(s), "-n", "1", "sh", "-c"],
                                   jobs_file, n),
        "parallel": lambda: run_local(["parallel", "--will-cite", "-j", str(s)], jobs_file, n),
    }
    one = ClusterContender(work / "c1", 1, s, corpus, "shell", expected, {})
    contenders["cluster-1node"] = one.run
    two = ClusterContender(work / "c2", 2, max(1, s // 2), corpus, "shell", expected, {})
    contenders["cluster-2node"] = two.run
    if args.gs:
        gs = ClusterContender(work / "gs", 1, s, DEFAULT_CORPUS, "gs", None, {})
        contenders["gs-cluster-1node"] = gs.run

    return report(contenders, args.reps, "xargs", {"jobs": n, "slots": s}, work,
                  args.keep is None)


def report(contenders: dict[str, Callable[[], tuple[float, bool]]], reps: int, base_name: str,
           facts: dict[str, object], work: Path, remove: bool) -> int:
    """Run the contenders ``reps`` times, interleaved; print their medians and ratios to
    ``base_name``'s; 0 if every output was right."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    ok: dict[str, bool] = {name: True for name in contenders}
    for rep in range(reps):
        for name, run in contenders.items():
            elapsed, good = run()
            times[name].append(elapsed)
            ok[name] = ok[name] and good
            print(f"# rep {rep + 1} {name} {elapsed:.2f}s ok={good}", flush=True)
    base = median(times[base_name])
    print(figures({**facts, "reps": reps}))
    for name in contenders:
        med = median(times[name])
        # The gs run is other work than the list: a ratio to xargs would mean nothing.
        ratio = "n/a" if name == "gs-cluster-1node" else f"{med / base:.2f}"
        print(figures({"contender": name, "median_s": f"{med:.2f}", "ratio": ratio,
                       "runs": len(times[name]), "ok": "yes" if ok[name] else "no"}),
              flush=True)
    if remove:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
