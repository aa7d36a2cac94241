#!/usr/bin/env python3
"""bench/tail.py -- the end of a run: makespan on nodes of unequal speed, and a dead node.

Usage: python3 bench/tail.py [--work 150] [--nodes 3] [--slots 2] [--slow 5]
                             [--durations 0.1,0.2,0.3,0.5] [--unequal 1,1.5,2]
                             [--heartbeat-timeout 5] [--slow-tests 3] [--slow-factor 10]
                             [--reps 1] [--cases ...] [--keep DIR]

Every job sleeps a known time: a mix of ``--durations`` (shuffled, fixed seed) adding up to
``--work`` seconds, one job per line of a ``.cmds`` file (product shell).  A node is made
slower by its environment: each node's processes get ``CLUSTER_SLOWDOWN_PCT=<factor in
percent>`` and every job sleeps ``duration x factor``.  The cases (3 nodes x 2 slots by default):

  equal        every node at full speed
  unequal      nodes slowed by --unequal (default 1, 1.5 and 2)
  one-slow-5x  node1 --slow (5) times slower than the others
  dead-node    equal speeds; node1 (clusterpull, run.py and its jobs) is SIGKILLed when
               40% of the results are in, while it holds jobs; the master runs with
               heartbeat_timeout = --heartbeat-timeout (5 s) for this case only
  slow-last    equal speeds; --slow-tests (3) more jobs of --slow-factor (10) times the
               longest duration, last in the corpus; two nightly runs (``auto tail
               shell``) on one cluster: the first has no baseline and goes in the corpus's
               order (as every run did before slowest first): ``slow-last-corpus-order``; the
               second is ordered slowest first by the first's times:
               ``slow-last-slowest-first`` (goal: ratio <= 1.05).  ``slow_started_s``:
               from the first job start to the last start of a slow test

Ideal = total work / total slots, each slot weighted by its node's speed (1 / slowdown).
Makespan = from the enqueue (clusterpush) to the last result reaching the master's journal:
the benchmark watches the journal file (results of priority 0) every 10 ms.  The report is
written later (after the nodes' log uploads): ``report_s`` is the report's mtime, as
bench/dispatch.py counts it.  ``startup_s`` is from the enqueue to the first job starting on
a node (every job appends ``<time> <node> <line>`` to a start log before it sleeps);
``run_ratio`` is (makespan - startup) / ideal, the part the scheduler controls.

For the dead node: ``drop_s`` is from the kill to the master's log line "node node1 dropped"
(its unfinished jobs are then back at the front of the list, for the next node that asks);
``restart_s`` is from the kill until every job node1 had started and not finished has
started again on another node (this adds the wait in the receiving node's own queue);
``rehand_s`` is the earlier of the two (near the end of a run, tail copies hand the jobs out
before the drop); the target is ``limit_s`` = heartbeat_timeout + poll_interval (the
cluster's poll_interval is 1 s here, as in bench/dispatch.py).

Every case checks the .tab: every job exactly once, error 0, the expected md5 (for the dead
node also that the report names node1 as lost): ``correct=yes``.  ``met=yes`` when the issue's
target is reached: ratio <= 1.15 (slow-last-slowest-first: 1.05; slow-last-corpus-order
has none, ``met=-``), or rehand_s <= limit_s in every repetition.  ``ok=yes``
when correct, and for dead-node also met.  The exit status is 0 when every case is ok.
``copies`` counts jobs started more than once (tail copies), ``dup_results`` the late
duplicate results the master's report counted.

Prints the machine, then one line per case, for example:
  case=one-slow-5x nodes=3 slots=2 slowdowns=5,1,1 work_s=149.7 ideal_s=34.02
  makespan_s=35.98 ratio=1.06 startup_s=0.55 run_ratio=1.04 ... met=yes ... ok=yes
(all on one line).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, median, start  # noqa: E402
from bench.dispatch import QUICK  # noqa: E402
from cluster.demotree import write_demo_tree  # noqa: E402
from cluster.localcluster import LocalCluster
from cluster.queue import QueueFile
from cluster.report.tab import read_tab  # noqa: E402
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402

CORPUS_NAME = "tail"
CMDS = "tail.cmds"
MAX_RATIO = 1.15     # makespan <= 1.15 x ideal with one node 5x slower
KILL_AT = 0.4        # dead-node: kill node1 when this share of the results is in
SLOWEST_FIRST = "slowest-first"
ORDERS = ("corpus-order", SLOWEST_FIRST)  # slow-last's two runs, in the order run
ORDER_RATIO = 1.05   # slowest first, makespan <= 1.05 x ideal
AUTO_PRIORITY = 2    # the nightly runs of case slow-last


@dataclass
class Case:
    name: str
    slowdowns: list[float]
    kill: bool = False
    #: slow-last: two nightly runs of one cluster, the corpus's order then slowest first
    orders: bool = False


@dataclass
class Outcome:
    """What one run of one case measured (times in seconds, wall clock)."""

    makespan: float = float("nan")
    report: float = float("nan")
    startup: float = float("nan")
    correct: bool = False    # the .tab holds every job once, with the expected md5
    copies: int = 0          # jobs started more than once (tail copies, re-runs)
    duplicates: int = 0      # late duplicate results the master counted
    per_node: dict[str, int] = field(default_factory=dict)  # first results by machine
    starts: list[tuple[float, str, int]] = field(default_factory=list)  # every job start
    drop: float = float("nan")
    restart: float = float("nan")
    rehand: float = float("nan")
    lost: int = 0            # jobs node1 had started and not finished when it was killed
    put_back: int = -1       # the master's count of node1's unfinished jobs


def durations_for(work: float, mix: list[float], seed: int) -> list[float]:
    """Job durations cycling through ``mix``, adding up to about ``work``, shuffled."""
    mean = sum(mix) / len(mix)
    n = max(1, round(work / mean))
    out = [mix[i % len(mix)] for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def job_line(index: int, duration: float, starts: Path) -> str:
    """One job: log its start, sleep ``duration`` x the node's slowdown, print its index.

    Plain POSIX sh (dash), and no process beyond ``date`` and ``sleep``: the product is
    shell arithmetic on milliseconds and the node's slowdown in percent
    (``CLUSTER_SLOWDOWN_PCT``), the seconds written ``<s>.<ms>`` with the milliseconds
    zero-padded by a parameter expansion (an awk per job, as before, cost each job a fork
    and an exec the scheduler was charged for).
    """
    log = shlex.quote(str(starts))
    ms = round(duration * 1000)
    return (f'echo "$(date +%s.%N) ${{BENCH_NODE:-none}} {index}" >> {log}; '
            f'ms=$(( {ms} * ${{CLUSTER_SLOWDOWN_PCT:-100}} / 100 )); f=$(( ms % 1000 + 1000 )); '
            f'sleep $(( ms / 1000 )).${{f#1}}; echo {index}')


class JournalWatcher(threading.Thread):
    """Polls the master's results journal; remembers when each first result arrived."""

    def __init__(self, path: Path, poll: float = 0.01) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.poll = poll
        self.seen: dict[str, tuple[float, str]] = {}  # test -> (arrival time, machine)
        self.stop_flag = threading.Event()
        self._offset = 0
        self._partial = b""

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.read_new()
            time.sleep(self.poll)

    def read_new(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:  # a new journal
                    self._offset, self._partial = 0, b""
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        now = time.time()
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            parts = raw.decode("utf-8", "replace").split(" ")
            if len(parts) > 2 and parts[1] == "result" and parts[2] not in self.seen:
                self.seen[parts[2]] = (now, parts[0])

    def count(self) -> int:
        return len(self.seen)


def read_starts(path: Path) -> list[tuple[float, str, int]]:
    """(time, node, job index) of every job start, in time order."""
    out: list[tuple[float, str, int]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            try:
                out.append((float(parts[0]), parts[1], int(parts[2])))
            except ValueError:
                continue
    return sorted(out)


def master_log_time(line: str) -> float:
    """Epoch seconds of a log line starting ``YYYY-mm-dd HH:MM:SS,mmm`` (local time)."""
    stamp, ms = line[:19], line[20:23]
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def kill_node(cluster: LocalCluster, name: str) -> None:
    """SIGKILL a node's clusterpull, its run.py and every job they started."""
    root = psutil.Process(cluster.node_procs[name].pid)
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


class TailRun:
    """One local cluster running one case once."""

    def __init__(self, root: Path, case: Case, args: argparse.Namespace,
                 durations: list[float]) -> None:
        self.root = root
        self.case = case
        self.args = args
        self.durations = durations
        root.mkdir(parents=True, exist_ok=True)
        self.starts = root / "starts.log"
        corpus = root / "corpus" / CORPUS_NAME
        corpus.mkdir(parents=True, exist_ok=True)
        (corpus / CMDS).write_text("".join(job_line(i, d, self.starts) + "\n"
                                           for i, d in enumerate(durations, 1)))
        self.expected = {f"{CORPUS_NAME}__{CMDS}.{i}":
                         hashlib.md5(f"{i}\n".encode()).hexdigest()
                         for i in range(1, len(durations) + 1)}
        settings = {**QUICK, "slots": str(args.slots), "base_port": str(free_port(5)),
                    "monitor_port": str(free_port()), "status_port": str(free_port())}
        if case.kill:
            settings["heartbeat_timeout"] = str(args.heartbeat_timeout)
        self.limit = args.heartbeat_timeout + float(settings["poll_interval"])
        self.cluster = LocalCluster(root / "home", len(case.slowdowns), corpus, settings)
        self.cluster.prepare()
        self.tree = write_demo_tree(root / "demo" / "shell", "shell", [])

    def node_env(self) -> dict[str, dict[str, str]]:
        return {f"node{i}": {"CLUSTER_SLOWDOWN_PCT": str(round(s * 100)),
                             "BENCH_NODE": f"node{i}"}
                for i, s in enumerate(self.case.slowdowns, 1)}

    def run_orders(self) -> list[Outcome]:
        """Case slow-last: two nightly runs (``auto tail shell``, priority 2) of the same
        corpus on one cluster.  The first has no baseline: its jobs go out in the corpus's
        order, the slow tests last, as every run did before slowest first.  The second is
        ordered slowest first by the first run's times."""
        cluster = self.cluster
        write_demo_tree(cluster.home_dir / "shell", "shell", [])  # the tree auto runs build
        spec = RunSpec.parse(f"auto {CORPUS_NAME} shell")
        queue = QueueFile.for_priority(cluster.home, AUTO_PRIORITY)
        outcomes: list[Outcome] = []
        cluster.start(self.node_env())
        try:
            cluster.wait_for_nodes()
            for _ in range(2):
                self.starts.write_text("")
                watcher = JournalWatcher(cluster.home.results(AUTO_PRIORITY))
                before = cluster.archives()
                watcher.start()
                start = time.time()
                queue.append(spec)
                try:
                    archive = cluster.wait_for_run(spec, before, 3600, priority=AUTO_PRIORITY)
                finally:
                    watcher.stop_flag.set()
                    watcher.join()
                watcher.read_new()
                out = self._measure(Outcome(), archive, watcher, start)
                out.report = (archive / "report.txt").stat().st_mtime - start
                outcomes.append(out)
        finally:
            cluster.stop(grace=10)
            for up in cluster.home.nodes.glob("*.up"):
                up.unlink()
        return outcomes

    def run(self) -> Outcome:
        cluster = self.cluster
        out = Outcome()
        cluster.start(self.node_env())
        watcher = JournalWatcher(cluster.home.results(0))
        kill_t = float("nan")
        try:
            cluster.wait_for_nodes()
            before = cluster.archives()
            watcher.start()
            start = time.time()
            spec = cluster.push(self.tree, "bench", ["shell"], [])
            if self.case.kill:
                want = KILL_AT * len(self.durations)
                end = time.monotonic() + 600
                while watcher.count() < want and time.monotonic() < end:
                    time.sleep(0.01)
                kill_t = time.time()
                kill_node(cluster, "node1")
            archive = cluster.wait_for_run(spec, before, 3600)
            out.report = (archive / "report.txt").stat().st_mtime - start
        finally:
            watcher.stop_flag.set()
            cluster.stop(grace=10)
            for up in cluster.home.nodes.glob("*.up"):
                up.unlink()
        if watcher.is_alive():
            watcher.join()
        watcher.read_new()
        self._measure(out, archive, watcher, start)
        if self.case.kill:
            self._dead_node(out, kill_t, read_starts(self.starts), watcher.seen,
                            (archive / "report.txt").read_text())
        return out

    def _measure(self, out: Outcome, archive: Path, watcher: JournalWatcher,
                 start: float) -> Outcome:
        """The makespan, start-up, copies and per-node counts of one run, and whether its
        .tab is right."""
        arrivals = watcher.seen
        if len(arrivals) == len(self.expected):
            out.makespan = max(t for t, _ in arrivals.values()) - start
        starts = read_starts(self.starts)
        if starts:
            out.startup = starts[0][0] - start
        out.copies = sum(1 for c in Counter(i for _, _, i in starts).values() if c > 1)
        out.per_node = dict(Counter(m for _, m in arrivals.values()))
        out.starts = starts
        tab_path = archive / f"{archive.name}.tab"
        table = read_tab(tab_path)
        names = [line.split("\t", 1)[0] for line in tab_path.read_text().splitlines()]
        out.correct = (len(names) == len(set(names)) == len(self.expected)
                  and all(r.error == 0 for r in table.values())
                  and {n: r.md5 for n, r in table.items()} == self.expected)
        report_text = (archive / "report.txt").read_text()
        dup = re.search(r"(\d+) late duplicate result", report_text)
        out.duplicates = int(dup.group(1)) if dup else 0
        return out

    def _dead_node(self, out: Outcome, kill_t: float, starts: list[tuple[float, str, int]],
                   arrivals: dict[str, tuple[float, str]], report_text: str) -> None:
        """Fill in drop, rehand and lost for node1, killed at ``kill_t``."""
        log_path = self.cluster.home.log_dir / "clustermaster.log"
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        for line in log_text.splitlines():
            m = re.search(r"node node1 dropped: .*; (\d+) unfinished jobs put back", line)
            if m:
                out.drop = master_log_time(line) - kill_t
                out.put_back = int(m.group(1))
                break

        def not_lost(i: int) -> bool:
            """node1 delivered it (a call may land just after the kill), or a copy did
            before the kill."""
            hit = arrivals.get(f"{CORPUS_NAME}__{CMDS}.{i}")
            return hit is not None and (hit[1] == "node1" or hit[0] <= kill_t)

        lost = {i for t, node, i in starts
                if node == "node1" and t <= kill_t and not not_lost(i)}
        out.lost = len(lost)
        again: dict[int, float] = {}
        for t, node, i in starts:
            if i in lost and node != "node1" and t > kill_t:
                again.setdefault(i, t)
        if lost and len(again) == len(lost):
            out.restart = max(again.values()) - kill_t
        seen = [x for x in (out.drop, out.restart) if not math.isnan(x)]
        out.rehand = min(seen) if seen else float("nan")
        ok_report = "Nodes lost during the run:" in report_text and "node1 (" in report_text
        out.correct = out.correct and ok_report and out.put_back >= 0


def slow_started(out: Outcome, slow_ids: set[int]) -> float:
    """Case slow-last: seconds from the run's first job start to the last start of a slow
    test (the run's end cannot come before this plus a slow test's time)."""
    times = [t for t, _, i in out.starts if i in slow_ids]
    if not out.starts or not times:
        return float("nan")
    return max(times) - out.starts[0][0]


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=float, default=150.0,
                        help="total seconds of work at full speed (default 150: ~25 s on "
                             "3 nodes x 2 slots)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2, help="slots per node")
    parser.add_argument("--slow", type=float, default=5.0,
                        help="slowdown of node1 in case one-slow (default 5)")
    parser.add_argument("--durations", default="0.1,0.2,0.3,0.5",
                        help="job durations at full speed, seconds, comma list")
    parser.add_argument("--unequal", default="1,1.5,2",
                        help="slowdowns of the nodes in case unequal (cycled over nodes)")
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0,
                        help="the master's heartbeat_timeout in case dead-node")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="shuffle of the job durations")
    parser.add_argument("--cases", default="equal,unequal,one-slow,dead-node,slow-last",
                        help="comma list of: equal, unequal, one-slow, dead-node, slow-last")
    parser.add_argument("--slow-tests", type=int, default=3,
                        help="case slow-last: tests --slow-factor times the longest "
                             "duration, last in the corpus (default 3)")
    parser.add_argument("--slow-factor", type=float, default=10.0,
                        help="case slow-last: how much slower those tests are (default 10)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    mix = parse_floats(args.durations)
    unequal = parse_floats(args.unequal)
    if (args.work <= 0 or args.nodes < 1 or args.slots < 1 or args.reps < 1 or args.slow <= 0
            or not mix or min(mix) <= 0 or not unequal or min(unequal) <= 0):
        parser.error("--work, --nodes, --slots, --reps, --slow and the durations must be "
                     "positive")
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    cases: list[Case] = []
    for name in wanted:
        if name == "equal":
            cases.append(Case("equal", [1.0] * args.nodes))
        elif name == "unequal":
            cases.append(Case("unequal", [unequal[i % len(unequal)] for i in range(args.nodes)]))
        elif name == "one-slow":
            cases.append(Case(f"one-slow-{args.slow:g}x", [args.slow] + [1.0] * (args.nodes - 1)))
        elif name == "dead-node":
            if args.nodes < 2:
                parser.error("case dead-node needs at least 2 nodes")
            cases.append(Case("dead-node", [1.0] * args.nodes, kill=True))
        elif name == "slow-last":
            if args.slow_tests < 1 or args.slow_factor <= 0:
                parser.error("--slow-tests and --slow-factor must be positive")
            cases.append(Case("slow-last", [1.0] * args.nodes, orders=True))
        else:
            parser.error(f"unknown case {name!r}")
    work = start("tail", ("date", "sleep"), args.keep)
    if work is None:
        return 2
    durations = durations_for(args.work, mix, args.seed)
    # slow-last: a few tests ten times the longest, last in the corpus (docs/results.md).
    slow_last = durations + [max(mix) * args.slow_factor] * args.slow_tests
    slow_ids = set(range(len(durations) + 1, len(slow_last) + 1))  # their job indexes
    shown: list[Case] = []  # a line each; slow-last gives two, one per order
    for case in cases:
        shown += ([Case(f"{case.name}-{order}", case.slowdowns, orders=True)
                   for order in ORDERS] if case.orders else [case])

    results: dict[str, list[Outcome]] = {c.name: [] for c in shown}
    limits: dict[str, float] = {}
    for rep in range(args.reps):
        for case in cases:
            run = TailRun(work / f"{case.name}-{rep + 1}", case, args,
                          slow_last if case.orders else durations)
            if case.orders:
                done = list(zip(ORDERS, run.run_orders(), strict=True))
            else:
                done = [("", run.run())]
            for order, outcome in done:
                name = f"{case.name}-{order}" if order else case.name
                results[name].append(outcome)
                if case.kill:
                    limits[case.name] = run.limit
                dead = (f"drop {outcome.drop:.2f}s restart {outcome.restart:.2f}s lost "
                        f"{outcome.lost} put_back {outcome.put_back} " if case.kill else "")
                first = (f"slow tests started {slow_started(outcome, slow_ids):.2f}s "
                         if case.orders else "")
                print(f"# rep {rep + 1} {name} makespan {outcome.makespan:.2f}s "
                      f"report {outcome.report:.2f}s startup {outcome.startup:.2f}s {dead}"
                      f"{first}per_node {outcome.per_node} correct={outcome.correct}",
                      flush=True)
    print(figures({"jobs": len(durations), "work_s": f"{sum(durations):.1f}",
                   "durations": args.durations, "reps": args.reps}))
    all_ok = True
    for case in shown:
        runs = results[case.name]
        total = sum(slow_last if case.orders else durations)
        speed_slots = sum(args.slots / s for s in case.slowdowns)
        ideal = total / speed_slots
        correct = all(r.correct for r in runs)
        ok = correct
        line: dict[str, object] = {
            "case": case.name, "nodes": len(case.slowdowns), "slots": args.slots,
            "slowdowns": ",".join(f"{s:g}" for s in case.slowdowns),
            "work_s": f"{total:.1f}"}
        if case.kill:
            limit = limits[case.name]
            rehand = median([r.rehand for r in runs])
            drop = median([r.drop for r in runs])
            within = all(r.rehand <= limit for r in runs)  # nan compares False
            line.update({"heartbeat_timeout_s": f"{args.heartbeat_timeout:g}",
                         "drop_s": f"{drop:.2f}",
                         "restart_s": f"{median([r.restart for r in runs]):.2f}",
                         "rehand_s": f"{rehand:.2f}",
                         "rehand_max_s": f"{max(r.rehand for r in runs):.2f}",
                         "limit_s": f"{limit:g}",
                         "lost": max(r.lost for r in runs),
                         "put_back": max(r.put_back for r in runs),
                         "makespan_s": f"{median([r.makespan for r in runs]):.2f}",
                         "met": "yes" if within else "no"})
            ok = correct and within
        else:
            makespan = median([r.makespan for r in runs])
            startup = median([r.startup for r in runs])
            ratio = makespan / ideal
            # slow-last: the goal is the slowest-first run's; the corpus's order is what
            # every run did before (shown for comparison, no goal).
            goal = (ORDER_RATIO if case.name.endswith(SLOWEST_FIRST) else None) \
                if case.orders else MAX_RATIO
            line.update({"ideal_s": f"{ideal:.2f}", "makespan_s": f"{makespan:.2f}",
                         "ratio": f"{ratio:.2f}", "startup_s": f"{startup:.2f}",
                         "run_ratio": f"{(makespan - startup) / ideal:.2f}",
                         "report_s": f"{median([r.report for r in runs]):.2f}",
                         "max_ratio": "-" if goal is None else goal,
                         "met": "-" if goal is None else "yes" if ratio <= goal else "no"})
            if case.orders:
                line["slow_tests"] = f"{args.slow_tests}x{max(mix) * args.slow_factor:g}s"
                line["slow_started_s"] = \
                    f"{median([slow_started(r, slow_ids) for r in runs]):.2f}"
        line.update({"copies": max(r.copies for r in runs),
                     "dup_results": max(r.duplicates for r in runs),
                     "runs": len(runs), "correct": "yes" if correct else "no",
                     "ok": "yes" if ok else "no"})
        all_ok = all_ok and ok
        print(figures(line), flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
