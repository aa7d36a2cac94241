#!/usr/bin/env python3
"""bench/master_load.py -- how many jobs per second one clustermaster serves.

Usage: python3 bench/master_load.py [--nodes 1000] [--slots 8] [--jobs 1000000]
                                    [--procs N] [--kind user|auto] [--archived K]
                                    [--first-run] [--keep DIR] [--profile FILE]

A real ``clustermaster.py`` process serves one run of M jobs (product shell: a corpus file
``tests/load/load.cmds`` of M lines, queued as ``user bench shell`` at priority 0, or with
``--kind auto`` as the nightly ``auto bench shell`` at priority 2; the master runs build.py
as usual).  K simulated nodes with S slots each speak the node protocol to it over
loopback: first call -> BUILD, a call without ``busy`` -> JOBS, every job "finishes" at once
and its result (error 0, the md5 of the test name, product ``shell``) goes back with the
next call, UPLOAD is answered by calling again, and ABORT ends the node.  They sign as real
nodes do (docs/protocol.md, "Signed messages"): every request carries a nonce (a session per
node and a counter) and the HMAC-SHA256 ``sig`` line under each node's run key (from its own
key in the home's ``node-keys/``, made before the master starts), and every reply's
signature is verified before it is read.  The nodes run in
``--procs`` client processes (default: 1), each a single-threaded selector loop; the
master is alone on its core.

The run is a second one, as in a cluster that has been running a while: before the master
starts, the home is given a baseline (``tables/current.tab``), the user's previous push
(``tables/user-bench.tab``), each of M rows plus ``REMOVED`` tests the run no longer has,
and an md5 cache.  The baseline differs from the run for every ``BASE_EVERY``-th test, the
previous push for every ``PUSH_EVERY``-th, and the cache holds the run's digest of every
``SEEN_EVERY``-th test, so the report's comparisons have known counts of differences and
of tests "matched at least once in the previous 50 runs".  An auto run is compared with
the baseline only, lists the removed tests, moves the baseline and then rebuilds the md5
cache from the archive; ``--archived K`` puts K earlier nightly runs of M tests in the
archive first (each differing from this run for every ``ARCHIVED_EVERY``-th test, in its
own way), so the rebuild reads K + 1 tables as on a cluster with a full window (49).
``--first-run`` leaves the history out (the report then compares
with nothing).

Figures:

  jobs_per_s   results the master accepted per second, from the first JOBS reply to the
               reply that acknowledged the last missing result
  p50_ms p99_ms  connection latency: connect to reply read to EOF (all calls)
  rss_mb       the master's peak RSS: psutil samples every 0.1 s and its VmHWM, whichever
               is larger
  startup_s    master start to the first JOBS (build.py, reading the job list)
  finish_s     last result to the master's exit (uploads, collation, report, archive)

The run is checked: the archive's .tab must hold M lines, each test once, error 0 and the
expected md5; with the history, the report must give the expected counts and the stream
table (the push's, or the baseline) must be the run's table after the merge.  Exit status
0 only when it does.

Prints the machine, then one line such as
  jobs_per_s=61234 p50_ms=0.8 p99_ms=4.2 rss_mb=310 jobs=1000000 nodes=1000 ok=yes
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import hmac
import multiprocessing as mp
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from bench.common import REPO, figures, start  # noqa: E402
from cluster import nodekeys  # noqa: E402
from cluster.home import Home  # noqa: E402
from cluster.queue import QueueFile
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402
from cluster.wire import signing  # noqa: E402
from cluster.wire.jobstart import JobStart  # noqa: E402

STEM = b"load__load.cmds."  # test ids are <file id>.<line number> (jobgen.shell_jobs)
CAPS = "os=Linux arch=x86_64 bits=64 cc=none cpus=8 ram_mb=16000 tools=md5sum,make"
#: The build digests every node sends beside ``built`` (docs/results.md, "Results reused";
#: real nodes do), so the master learns each node's build and looks it up in the result
#: cache once per build.
DIGESTS = f"digests gs={'5a' * 32}\n"
#: How long a simulated node waits after CONTINUE before it calls again.
IDLE_DELAY = 0.02
#: Connection attempts refused in a row before a node gives up on the master.
MAX_REFUSED = 200
#: The seeded history (see the module docstring): which tests differ from the baseline and
#: from the previous push, which new digests the md5 cache has seen, how many tests the
#: previous tables have that the run does not.
BASE_EVERY = 97
PUSH_EVERY = 89
SEEN_EVERY = 485
REMOVED = 1000
ARCHIVED_EVERY = 50


def md5_of(name: bytes) -> bytes:
    return hashlib.md5(name).hexdigest().encode()


# ------------------------------------------------------------------------------ the nodes
@dataclass
class Node:
    name: str
    prefix: bytes                     # the request headers, ready to send
    held: list[bytes] = field(default_factory=list)  # names of the jobs it was given
    session: bytes = b""              # its nonces' session (16 hex), as a node process has
    key: bytes = b""                  # its run key: from its own key (node-keys/<name>.key)
    count: int = 0                    # its nonces' counter
    calls: int = 0
    done: bool = False
    refused: int = 0


@dataclass
class Stats:
    """What one client process measured; the parent merges them."""

    latencies: array = field(default_factory=lambda: array("d"))
    ack: array = field(default_factory=lambda: array("d"))  # first ack time per job (0: none)
    first_jobs: float = 0.0
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, CPU seconds)
    calls: int = 0
    verbs: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class _Call:
    __slots__ = ("node", "sock", "out", "sent", "chunks", "started", "nonce")

    def __init__(self, node: Node, sock: socket.socket, out: bytes, started: float,
                 nonce: str) -> None:
        self.node = node
        self.nonce = nonce
        self.sock = sock
        self.out = out
        self.sent = 0
        self.chunks: list[bytes] = []
        self.started = started


def run_nodes(port: int, run_id: str, names: list[str], slots: int, jobs: int,
              deadline: float, job_start: Path, home_root: Path) -> Stats:
    """Drive ``names`` as simulated nodes until each is told ABORT (or ``deadline``).

    A node refused after the master removed ``job_start`` came too late: the run was
    over before it joined, which is an end, not an error (as for a real node).
    """
    stats = Stats(ack=array("d", bytes(8 * (jobs + 1))))
    ack = stats.ack
    lat = stats.latencies
    verbs = stats.verbs
    sel = selectors.DefaultSelector()
    address = ("127.0.0.1", port)
    mono = time.monotonic
    nodes = [Node(n, (f"node {n}\nid {run_id}\nbuilt {run_id}\n{DIGESTS}caps {CAPS}\n"
                      f"slots {slots}\njobs 0 0\n").encode(), session=os.urandom(8).hex().encode(),
                 key=run_key(home_root, n, run_id))
             for n in names]
    sha256 = hashlib.sha256
    waiting: list[tuple[float, Node]] = [(0.0, n) for n in nodes]  # (not before, node)
    live = len(nodes)
    md5 = hashlib.md5
    stem_len = len(STEM)

    def start(node: Node) -> None:
        node.count += 1
        nonce = b"%s%016x" % (node.session, node.count)
        if node.held:
            head = b"".join([node.prefix,
                             *[b"result %s 0 0.00 0.00 0.00 %s shell\n"
                               % (name, md5(name).hexdigest().encode()) for name in node.held],
                             b"nonce %s\n" % nonce])
        else:
            head = node.prefix + b"nonce %s\n" % nonce
        # As signing.sign_request: the MAC of every byte but the sig line.
        mac = hmac.new(node.key, head, sha256)
        mac.update(b"OK\n")
        out = b"%ssig %s\nOK\n" % (head, mac.hexdigest().encode())
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        call = _Call(node, sock, out, mono(), nonce.decode())
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            failed(call, os.strerror(err))
            return
        sel.register(sock, selectors.EVENT_WRITE, call)

    def failed(call: _Call, why: str) -> None:
        node = call.node
        node.refused += 1
        if not job_start.exists():  # the run ended before this node got its ABORT
            node.done = True
            finish_node()
            return
        if node.refused > MAX_REFUSED:
            stats.errors.append(f"{node.name}: gave up: {why}")
            node.done = True
            finish_node()
            return
        waiting.append((mono() + 0.05, node))

    def finish_node() -> None:
        nonlocal live
        live -= 1

    def replied(call: _Call, data: bytes) -> None:
        now = mono()
        node = call.node
        try:
            data = signing.verify_reply(data, node.key, call.nonce)  # before anything is read
        except signing.SignatureError as exc:
            stats.errors.append(f"{node.name}: reply refused: {exc}: {data[:80]!r}")
            node.done = True
            finish_node()
            return
        node.refused = 0
        lat.append(now - call.started)
        stats.calls += 1
        if node.held:  # the master has read the results: they are recorded
            for name in node.held:
                i = int(name[stem_len:])
                if not ack[i]:
                    ack[i] = now
            node.held = []
            if now - stats.cpu[-1][0] >= 0.1:
                stats.cpu.append((now, time.process_time()))
        verb, _, rest = data.partition(b"\n")
        word = verb.split(b" ", 1)[0].decode("ascii", "replace")
        verbs[word] = verbs.get(word, 0) + 1
        if word == "JOBS":
            if not stats.first_jobs:
                stats.first_jobs = now
                stats.cpu.append((now, time.process_time()))
            count, _, body = rest.partition(b"\n")
            lines = body.split(b"\n")
            lines.pop()  # after the last newline
            if len(lines) != int(count):
                stats.errors.append(f"{node.name}: JOBS {int(count)} carried {len(lines)}")
            node.held = [line[:line.index(b" ")] for line in lines]
            start(node)
        elif word in ("BUILD", "UPLOAD"):
            start(node)  # built / uploaded at once: call again without busy
        elif word == "CONTINUE":
            waiting.append((now + IDLE_DELAY, node))
        elif word == "ABORT":
            if not verb.startswith(b"ABORT run complete"):
                stats.errors.append(f"{node.name}: {verb.decode(errors='replace')}")
            node.done = True
            finish_node()
        else:
            stats.errors.append(f"{node.name}: unexpected reply {verb[:80]!r}")
            node.done = True
            finish_node()

    while live and mono() < deadline:
        if waiting:
            now = mono()
            later = []
            for when, node in waiting:
                if when <= now:
                    start(node)
                else:
                    later.append((when, node))
            waiting = later
        timeout = 0.01 if waiting else 0.5
        for key, events in sel.select(timeout):
            call: _Call = key.data
            sock = call.sock
            try:
                if events & selectors.EVENT_WRITE:
                    if call.sent == 0:
                        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if err:
                            raise OSError(err, os.strerror(err))
                    call.sent += sock.send(memoryview(call.out)[call.sent:])
                    if call.sent >= len(call.out):
                        sel.modify(sock, selectors.EVENT_READ, call)
                    continue
                while True:
                    chunk = sock.recv(262144)
                    if not chunk:
                        break
                    call.chunks.append(chunk)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                sel.unregister(sock)
                sock.close()
                failed(call, str(exc))
                continue
            sel.unregister(sock)
            sock.close()
            replied(call, b"".join(call.chunks))
    if live:
        stats.errors.append(f"{live} nodes still running at the deadline")
    sel.close()
    return stats


def run_key(home_root: Path, name: str, run_id: str) -> bytes:
    """Node ``name``'s key in run ``run_id``, from its own key in the home."""
    text = nodekeys.read_node_key(home_root, name)
    if text is None:
        raise RuntimeError(f"no key for node {name} in {home_root}")
    return signing.run_key(signing.parse_secret(text), run_id)


def _client(conn: mp.connection.Connection, port: int, run_id: str, names: list[str],
            slots: int, jobs: int, deadline: float, job_start: Path, home_root: Path) -> None:
    try:
        stats = run_nodes(port, run_id, names, slots, jobs, deadline, job_start, home_root)
    except BaseException as exc:  # report, never hang the parent
        stats = Stats()
        stats.errors.append(f"client process failed: {exc!r}")
    conn.send(stats)
    conn.close()


# ------------------------------------------------------------------------------ the master
class Sampler(threading.Thread):
    """Samples the master's RSS (psutil) and VmHWM every ``interval`` s until it exits."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0
        self.hwm = 0
        self.cpu: list[tuple[float, float]] = []  # (monotonic, CPU seconds of the master)
        self.machine: list[tuple[float, float]] = []  # (monotonic, busy CPU s, all cores)
        self.rss: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            proc = psutil.Process(self.pid)
        except psutil.Error:
            return
        status = Path(f"/proc/{self.pid}/status")
        while not self.stop.is_set():
            try:
                rss = proc.memory_info().rss
                self.peak_rss = max(self.peak_rss, rss)
                self.rss.append((time.monotonic(), rss))
                times = proc.cpu_times()
                now = time.monotonic()
                self.cpu.append((now, times.user + times.system))
                total = psutil.cpu_times()
                self.machine.append((now, total.user + total.system + total.nice
                                     + total.irq + total.softirq + total.steal))
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.hwm = max(self.hwm, int(line.split()[1]) * 1024)
            except (psutil.Error, OSError, ValueError):
                return
            self.stop.wait(self.interval)


#: What each --kind queues, and at which priority.
KINDS = {"user": ("user bench shell", 0), "auto": ("auto bench shell", 2)}


def make_home(root: Path, jobs: int, history: bool, kind: str, archived: int = 0) -> Home:
    home = Home(root)
    home.create()
    corpus = home.root / "tests" / "load"
    corpus.mkdir(parents=True, exist_ok=True)
    with open(corpus / "load.cmds", "wb") as fh:
        fh.write(b"true\n" * jobs)
    if history:
        seed_history(home, jobs)
        seed_archive(home, jobs, archived)
    line, priority = KINDS[kind]
    if kind == "auto":
        (home.root / "shell").mkdir(exist_ok=True)  # the clean tree an auto run builds
    else:
        (home.users / "bench" / "shell").mkdir(parents=True, exist_ok=True)  # the push
    QueueFile(home.queue(priority), home.queue_lock(priority)).append(RunSpec.parse(line))
    return home


def test_name(i: int) -> bytes:
    return STEM + str(i).encode()


def seed_history(home: Home, jobs: int) -> None:
    """A baseline, a previous push and an md5 cache, as a running cluster has them."""
    home.tables.mkdir(parents=True, exist_ok=True)
    for path, every, rev in ((home.tables / "current.tab", BASE_EVERY, b"base"),
                             (home.tables / "user-bench.tab", PUSH_EVERY, b"push")):
        rows = []
        for i in range(1, jobs + 1):
            name = test_name(i)
            digest = md5_of(name + b"!") if i % every == 0 else md5_of(name)
            # Times spread over 0-10 s, as a real stream's are: the master orders the run
            # slowest first by them (docs/results.md, "Slowest tests first, and slowdowns
            # named"), a rewrite of the whole jobs file.
            rows.append(b"%s\t0\t%.2f\t0.01\t0.01\t0\t%s\t%s\tshell\tn00000"
                        % (name, (i * 7919) % 1000 / 100, digest, rev))
        rows.extend(b"%sgone%d\t0\t0.01\t0.01\t0.01\t0\t%s\t%s\tshell\tn00000"
                    % (STEM, i, md5_of(b"gone%d" % i), rev) for i in range(REMOVED))
        rows.sort()
        with open(path, "wb") as fh:
            fh.write(b"\n".join(rows) + b"\n")
    seen = sorted(b"%s %s | old\tshell\tn00001\t7" % (test_name(i), md5_of(test_name(i)))
                  for i in range(SEEN_EVERY, jobs + 1, SEEN_EVERY))
    (home.tables / "md5sum.cache").write_bytes(b"50\n" + b"".join(line + b"\n"
                                                                   for line in seen))


def seed_archive(home: Home, jobs: int, runs: int) -> None:
    """``runs`` archived nightly runs of the M tests, older than the run to come; run k
    differs from it for every ARCHIVED_EVERY-th test, starting at test k + 1."""
    names = sorted(test_name(i) for i in range(1, jobs + 1))
    for k in range(runs):
        run_id = f"20260101{k:06d}-p2-seed"
        folder = home.archive / run_id
        folder.mkdir(parents=True)
        info = JobStart(id=run_id, priority=2, queue="auto bench shell", kind="auto",
                        ref="bench", products=("shell",), tree="shell", source="shell",
                        build="make", tests="tests")
        (folder / "run.info").write_text(info.format() + "elapsed 1.0\n")
        with open(folder / f"{run_id}.tab", "wb") as fh:
            fh.writelines(b"%s\t0\t0.01\t0.01\t0.01\t0\t%s\t%s\tshell\tn00000\n"
                          % (name, md5_of(name + b"#%d" % k) if (int(name[len(STEM):]) - k - 1)
                             % ARCHIVED_EVERY == 0 else md5_of(name), run_id.encode())
                          for name in names)


def cache_pairs(jobs: int, runs: int) -> int:
    """How many pairs the rebuilt cache holds: every perturbed (test, digest) of the
    archived runs, each one distinct."""
    return sum(len(range(k + 1, jobs + 1, ARCHIVED_EVERY)) for k in range(runs))


def expected_report(jobs: int, kind: str) -> list[str]:
    """The lines the report must hold, in order, for the seeded history."""
    out = []
    compared = [(BASE_EVERY, None)]
    if kind == "user":
        compared.append((PUSH_EVERY, "Differences from previous clusterpush:"))
    for every, heading in compared:
        if heading:
            out.append(heading)
        differ = range(every, jobs + 1, every)
        seen = sum(1 for i in differ if i % SEEN_EVERY == 0)
        if len(differ) > seen:
            out.append(f"Differences in {len(differ) - seen} of {jobs} non-pdfwrite/ps2write "
                       "test(s):")
        else:
            out.append(f"No differences in {jobs} non-pdfwrite/ps2write tests")
        if kind == "auto":
            out.append(f"The following {REMOVED} regression file(s) have been removed:")
        if seen:
            out.append(f"The following {seen} regression file(s) had differences but matched "
                       "at least once in the previous 50 runs:")
    return out


def check_history(home: Home, jobs: int, kind: str, archived: int) -> tuple[bool, str]:
    """The report gives the seeded history's counts; the stream table is the run's table;
    an auto run rebuilt the md5 cache from the archive (the seeded runs' pairs)."""
    archive = max(home.archive.iterdir())  # the run's: run ids sort by start time
    report = (archive / "report.txt").read_text(encoding="utf-8").splitlines()
    at = 0
    for want in expected_report(jobs, kind):
        try:
            at = report.index(want, at) + 1
        except ValueError:
            return False, f"the report lacks {want!r} (in order)"
    stream = home.tables / ("user-bench.tab" if kind == "user" else "current.tab")
    if stream.read_bytes() != (archive / f"{archive.name}.tab").read_bytes():
        return False, f"{stream} is not the run's table after the merge"
    if kind == "auto":
        with open(home.tables / "md5sum.cache", "rb") as fh:
            lines = sum(1 for _ in fh)
        if lines - 1 != cache_pairs(jobs, archived):
            return False, (f"the rebuilt md5 cache holds {lines - 1} pairs, expected "
                           f"{cache_pairs(jobs, archived)}")
    return True, ""


def wait_until(predicate, timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise RuntimeError(f"the master exited ({proc.returncode}) before {what}")
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def listening(port: int) -> bool:
    """True once the master answers a request (a wrong job id: it remembers nothing)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"node probe\nid probe\nOK\n")
            return sock.recv(100).startswith(b"ABORT")
    except OSError:
        return False


def check_tab(home: Home, jobs: int) -> tuple[bool, str]:
    """The archive's .tab holds each of the M tests once, error 0, md5 of its name."""
    archives = [a for a in home.archive.iterdir() if not a.name.endswith("-seed")] \
        if home.archive.is_dir() else []
    if len(archives) != 1:
        return False, f"{len(archives)} archives of this run"
    tab = archives[0] / f"{archives[0].name}.tab"
    if not tab.exists():
        return False, "no .tab in the archive"
    seen = bytearray(jobs + 1)
    lines = 0
    with open(tab, "rb") as fh:
        for line in fh:
            lines += 1
            cols = line.rstrip(b"\n").split(b"\t")
            name = cols[0]
            if len(cols) != 10 or not name.startswith(STEM):
                return False, f"bad line {line[:100]!r}"
            i = int(name[len(STEM):])
            if not 1 <= i <= jobs or seen[i]:
                return False, f"test {name!r} unexpected or twice"
            seen[i] = 1
            if cols[1] != b"0" or cols[6] != md5_of(name) or cols[8] != b"shell":
                return False, f"wrong result {line[:150]!r}"
    if lines != jobs:
        return False, f".tab has {lines} lines, expected {jobs}"
    return True, ""


def busy(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds per second over [start, end], from (time, CPU seconds) samples."""
    inside = [(t, c) for t, c in samples if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1000000)
    parser.add_argument("--procs", type=int, default=1,
                        help="client processes the simulated nodes are spread over")
    parser.add_argument("--first-run", action="store_true",
                        help="no history: no baseline, previous push or md5 cache")
    parser.add_argument("--kind", choices=sorted(KINDS), default="user",
                        help="queue a user run (priority 0) or a nightly auto run (2)")
    parser.add_argument("--archived", type=int, default=0, metavar="K",
                        help="with --kind auto: K earlier nightly runs in the archive, read "
                             "by the md5 cache rebuild (49: a full window)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="give up after this many seconds")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    parser.add_argument("--profile", type=Path,
                        help="run the master under cProfile, writing its stats here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra master configuration (repeatable)")
    args = parser.parse_args(argv)
    if min(args.nodes, args.slots, args.jobs, args.procs) < 1:
        parser.error("--nodes, --slots, --jobs and --procs must be positive")
    work = start("master-load", (), args.keep)
    assert work is not None  # no tools to miss
    if args.keep is not None and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if args.archived and (args.kind != "auto" or args.first_run):
        parser.error("--archived needs --kind auto and a history (no --first-run)")
    if args.archived < 0:
        parser.error("--archived must not be negative")
    home = make_home(work / "home", args.jobs, not args.first_run, args.kind, args.archived)
    priority = KINDS[args.kind][1]
    job_start = home.job_start(priority)
    port = free_port()  # the master's: base_port + priority
    argv_master = [str(REPO / "clustermaster.py"), "--priority", str(priority),
                   "--home", str(home.root),
                   "--set", f"base_port={port - priority}", "--set", "linger=5",
                   "--set", "heartbeat_timeout=600", "--set", "connection_deadline=60"]
    for pair in args.set:
        argv_master += ["--set", pair]
    if args.profile is not None:
        argv_master = ["-m", "cProfile", "-o", str(args.profile.resolve()), *argv_master]
    spawned = time.monotonic()
    log = open(work / "master.stderr", "wb")
    proc = subprocess.Popen([sys.executable, *argv_master], stderr=log, cwd=work)
    sampler = Sampler(proc.pid)
    sampler.start()
    ok = True
    problem = ""
    try:
        wait_until(lambda: job_start.exists(), 120, proc, "job.start")
        start_info = JobStart.parse(job_start.read_text())
        run_id = start_info.id
        wait_until(lambda: listening(port), 600, proc, "the master to listen")
        deadline = time.monotonic() + args.timeout
        names = [f"n{i:05d}" for i in range(args.nodes)]
        for name in names:  # each node's own key, as bootstrap_node.py makes it
            nodekeys.ensure_node_key(home.root, name)
        ctx = mp.get_context("fork")
        pipes = []
        workers = []
        for p in range(args.procs):
            parent_end, child_end = ctx.Pipe(duplex=False)
            share = names[p::args.procs]
            w = ctx.Process(target=_client, args=(child_end, port, run_id, share, args.slots,
                                                  args.jobs, deadline, job_start,
                                                  home.root))
            w.start()
            child_end.close()
            pipes.append(parent_end)
            workers.append(w)
        stats = [pipe.recv() for pipe in pipes]
        for w in workers:
            w.join()
        rc = proc.wait(timeout=max(60.0, deadline - time.monotonic()))
        exited = time.monotonic()
    except (RuntimeError, subprocess.TimeoutExpired, EOFError) as exc:
        proc.kill()
        proc.wait()
        print(f"master_load: {exc}; see {work / 'master.stderr'}", file=sys.stderr)
        return 1
    finally:
        sampler.stop.set()
        sampler.join()
        log.close()
    errors = [e for s in stats for e in s.errors]
    if rc != 0:
        ok, problem = False, f"master exit status {rc}"
    elif errors:
        ok, problem = False, errors[0]
    else:
        ok, problem = check_tab(home, args.jobs)
        if ok and not args.first_run:
            ok, problem = check_history(home, args.jobs, args.kind, args.archived)
    # Each job's result was accepted at the earliest ack any client saw for it.
    acks = stats[0].ack
    for s in stats[1:]:
        acks = array("d", [a if a and (a <= b or not b) else b
                           for a, b in zip(acks, s.ack, strict=True)])
    last = max(acks[1:]) if len(acks) > 1 else 0.0
    missing = sum(1 for a in acks[1:] if not a)
    if missing and ok:
        ok, problem = False, f"{missing} results never acknowledged"
    first = min(s.first_jobs for s in stats if s.first_jobs) if any(
        s.first_jobs for s in stats) else 0.0
    lat = sorted(x for s in stats for x in s.latencies)
    # The steady state: from 5% to 95% of the results, without ramp-up and tail.
    order = sorted(acks[1:])
    n5, n95 = int(0.05 * len(order)), int(0.95 * len(order)) - 1
    steady = (n95 - n5) / (order[n95] - order[n5]) if order and order[n95] > order[n5] else 0.0
    tail = order[-1] - order[n95] if order else 0.0
    rate = args.jobs / (last - first) if last > first else 0.0
    rss = max(sampler.peak_rss, sampler.hwm)
    if problem:
        print(f"# problem: {problem}", file=sys.stderr)
    print(figures({
        "jobs_per_s": f"{rate:.0f}",
        "p50_ms": f"{1000 * percentile(lat, 0.5):.1f}",
        "p99_ms": f"{1000 * percentile(lat, 0.99):.1f}",
        "rss_mb": f"{rss / 2**20:.0f}",
        "jobs": args.jobs, "nodes": args.nodes, "slots": args.slots, "procs": args.procs,
        "history": "no" if args.first_run else "yes", "kind": args.kind,
        "archived": args.archived,
        "steady_jobs_per_s": f"{steady:.0f}", "tail_s": f"{tail:.2f}",
        "calls": sum(s.calls for s in stats),
        # Cores busy in the steady state: the master (of its one), the clients (summed).
        "master_cpu": f"{busy(sampler.cpu, order[n5], order[n95]):.2f}" if order else "nan",
        "client_cpu": f"{sum(busy(s.cpu, order[n5], order[n95]) for s in stats):.2f}"
        if order else "nan",
        # All cores of the machine: more than master + clients means others were running.
        "machine_cpu": f"{busy(sampler.machine, order[n5], order[n95]):.2f}"
        if order else "nan",
        # The master's CPU time per job in the steady state: 1e6 / this is the rate it
        # would reach with a core of its own.
        "master_us_per_job": f"{1e6 * busy(sampler.cpu, order[n5], order[n95]) / steady:.1f}"
        if steady else "nan",
        # Peak RSS while serving (up to the last result), and when the job list was read.
        "serve_rss_mb": f"{max((r for t, r in sampler.rss if t <= last), default=0) / 2**20:.0f}",
        "start_rss_mb": f"{max((r for t, r in sampler.rss if t <= first), default=0) / 2**20:.0f}",
        "startup_s": f"{first - spawned:.1f}" if first else "nan",
        "finish_s": f"{exited - last:.1f}" if last else "nan",
        "ok": "yes" if ok else "no",
    }), flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
