#!/usr/bin/env python3
"""bench/sweep_load.py -- how many sweep results per second one clustermaster takes.

Usage: python3 bench/sweep_load.py [--nodes 100] [--slots 8] [--tasks 100000]
                                   [--check none|fast|SECONDS] [--slow-task] [--procs N]
                                   [--files 1] [--keep DIR] [--profile FILE]

What ``bench/master_load.py`` is for plain jobs, for a sweep run: a real
``clustermaster.py`` process serves one sweep of M tasks (a pushed sweep folder in
``users/bench/sweep``, queued as ``user bench sweep sweep=sweep.toml``; the master
snapshots it and runs build.py, which expands it), and K simulated nodes with S slots each
speak the node protocol to it over loopback, signed as real nodes sign.  Every task
"finishes" at once; its result file comes home as real nodes on the master's file system
send it: each call's results travel in a *folder bundle* ``<node>.<instance>.<n>.d``
(``tasks.json`` and one folder per task) moved into ``runs/<id>/results/incoming/`` before
the call names it (``bundle`` header).  A node's task folders are made before the master
starts (``outbox/<task id>/out``, ``--files`` files each), as a real node's are made by
its tasks, so each call costs the client one folder, one ``tasks.json`` and one rename per
task: what is measured is the master.

``--check`` adds ``[validate] script = "check.sh"``: ``fast`` (``exit 0``) or a number of
seconds it sleeps before ``exit 0``.  ``--slow-task`` makes the script sleep only for the
first task (``--check`` seconds, default 1) and exit at once for the others: the figure
``other_wait_ms`` then says how long the other tasks' results waited to be recorded.

Figures:

  results_per_s  sweep results the master acknowledged per second, from the first JOBS
                 reply to the reply that acknowledged the last result (its request path:
                 with a check script, a result is acknowledged once it is held for the
                 check, not once it is judged)
  judged_s       from the first JOBS to the last result journaled (every check done)
  steady_results_per_s  the same between 5% and 95% of the acknowledgements
  p50_ms p99_ms  connection latency: connect to reply read (all calls)
  master_us_per_result  the master's CPU time per result in the steady state
  rss_mb         the master's peak RSS
  ok             the archive's results.tsv has every task ``ok``, each task's folder in
                 ``results/`` holds its file

Prints the machine, then one line of figures.  Exit status 0 only when ``ok=yes``.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import hmac
import json
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

from bench.common import REPO, figures, start  # noqa: E402
from bench.master_load import (  # noqa: E402
    CAPS,
    DIGESTS,
    IDLE_DELAY,
    MAX_REFUSED,
    Sampler,
    Stats,
    busy,
    listening,
    percentile,
    run_key,
    wait_until,
)
from cluster import nodekeys  # noqa: E402
from cluster.home import Home  # noqa: E402
from cluster.queue import QueueFile  # noqa: E402
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402
from cluster.sweep.expand import tasks as sweep_tasks  # noqa: E402
from cluster.sweep.spec import load as load_sweep  # noqa: E402
from cluster.wire import signing  # noqa: E402
from cluster.wire.jobstart import JobStart  # noqa: E402

QUEUE_LINE = "user bench sweep sweep=sweep.toml"
SWEEP_TOML = """\
command = "echo {i} > out.txt"
table = "params.csv"
timeout = 600
"""


def sweep_toml(files: int, check: bool) -> str:
    text = SWEEP_TOML
    if files:
        text += "[results]\n" + "".join(f'out{k} = "out{k}.txt"\n' for k in range(files))
    if check:
        text += '[validate]\nscript = "check.sh"\n'
    return text


def check_script(seconds: float, first_only: str) -> str:
    """The check script: exit 0, after ``seconds`` of sleep (for every task, or only for
    the task whose folder name is ``first_only``)."""
    if not seconds:
        return "#!/bin/sh\nexit 0\n"
    if first_only:
        return (f'#!/bin/sh\ncase "$1" in */{first_only}) sleep {seconds:g};; esac\n'
                "exit 0\n")
    return f"#!/bin/sh\nsleep {seconds:g}\nexit 0\n"


# ------------------------------------------------------------------------------ the nodes
@dataclass
class Node:
    name: str
    prefix: bytes
    instance: str
    key: bytes
    held: list[bytes] = field(default_factory=list)
    session: bytes = b""
    count: int = 0
    bundles: int = 0
    refused: int = 0


class _Call:
    __slots__ = ("node", "sock", "out", "sent", "chunks", "started", "nonce")

    def __init__(self, node: Node, sock: socket.socket, out: bytes, started: float,
                 nonce: str) -> None:
        self.node, self.sock, self.out, self.started, self.nonce = \
            node, sock, out, started, nonce
        self.sent = 0
        self.chunks: list[bytes] = []


def run_nodes(port: int, run_id: str, names: list[str], slots: int, order: dict[bytes, int],
              deadline: float, job_start: Path, home_root: Path, outbox: Path,
              incoming: Path, files: int) -> Stats:
    """Drive ``names`` as simulated sweep nodes until each is told ABORT (or ``deadline``).
    ``order``: task id -> its number (1-based), for the acknowledgement times."""
    stats = Stats(ack=array("d", bytes(8 * (len(order) + 1))))
    ack, lat, verbs = stats.ack, stats.latencies, stats.verbs
    sel = selectors.DefaultSelector()
    address = ("127.0.0.1", port)
    mono = time.monotonic
    nodes = [Node(n, (f"node {n}\nid {run_id}\nbuilt {run_id}\n{DIGESTS}caps {CAPS}\n"
                      f"slots {slots}\njobs 0 0\n").encode(), os.urandom(8).hex(),
                  run_key(home_root, n, run_id), session=os.urandom(8).hex().encode())
             for n in names]
    sha256 = hashlib.sha256
    waiting: list[tuple[float, Node]] = [(0.0, n) for n in nodes]
    live = len(nodes)
    # Each task's result files as tasks.json lists them, and its md5 (the same for all:
    # the files hold the same bytes, made so before the master started).
    entry_files = {f"out{k}": [2, hashlib.md5(b"x\n").hexdigest()] for k in range(files)}
    now_s = time.time()

    def bundle(node: Node) -> bytes:
        """The node's results into a folder bundle in incoming/; the bundle header."""
        node.bundles += 1
        name = f"{node.name}.{node.instance}.{node.bundles}.d"
        folder = outbox / name
        folder.mkdir()
        entries = []
        for task in node.held:
            text = task.decode()
            if files:
                try:
                    os.rename(outbox / text, folder / text)
                except FileNotFoundError:  # a second copy (the tail): files of its own
                    os.mkdir(folder / text)
                    for k in range(files):
                        (folder / text / f"out{k}").write_bytes(b"x\n")
            entries.append({"task": text, "start": now_s, "runtime": 0.0, "exit": 0,
                            "files": entry_files, "failed": ""})
        (folder / "tasks.json").write_text(json.dumps({"node": node.name, "tasks": entries}))
        os.rename(folder, incoming / name)
        return b"bundle %s\n" % name.encode()

    def start_call(node: Node) -> None:
        node.count += 1
        nonce = b"%s%016x" % (node.session, node.count)
        if node.held:
            head = b"".join([node.prefix, bundle(node),
                             *[b"result %s 0 0.00 0.00 0.00 0 sweep\n" % name
                               for name in node.held],
                             b"nonce %s\n" % nonce])
        else:
            head = node.prefix + b"nonce %s\n" % nonce
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
        nonlocal live
        node = call.node
        node.refused += 1
        if not job_start.exists() or node.refused > MAX_REFUSED:
            if job_start.exists():
                stats.errors.append(f"{node.name}: gave up: {why}")
            live -= 1
            return
        waiting.append((mono() + 0.05, node))

    def replied(call: _Call, data: bytes) -> None:
        nonlocal live
        now = mono()
        node = call.node
        try:
            data = signing.verify_reply(data, node.key, call.nonce)
        except signing.SignatureError as exc:
            stats.errors.append(f"{node.name}: reply refused: {exc}: {data[:80]!r}")
            live -= 1
            return
        node.refused = 0
        lat.append(now - call.started)
        stats.calls += 1
        if node.held:
            for name in node.held:
                i = order[name]
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
            _count, _, body = rest.partition(b"\n")
            lines = body.split(b"\n")
            lines.pop()
            node.held = [line[:line.index(b" ")] for line in lines]
            start_call(node)
        elif word in ("BUILD", "UPLOAD"):
            start_call(node)
        elif word == "CONTINUE":
            waiting.append((now + IDLE_DELAY, node))
        elif word == "ABORT":
            if not verb.startswith(b"ABORT run complete"):
                stats.errors.append(f"{node.name}: {verb.decode(errors='replace')}")
            live -= 1
        else:
            stats.errors.append(f"{node.name}: unexpected reply {verb[:80]!r}")
            live -= 1

    while live and mono() < deadline:
        if waiting:
            now = mono()
            later = []
            for when, node in waiting:
                if when <= now:
                    start_call(node)
                else:
                    later.append((when, node))
            waiting = later
        for key, events in sel.select(0.01 if waiting else 0.5):
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


def _client(conn: mp.connection.Connection, *args: object) -> None:
    try:
        stats = run_nodes(*args)  # type: ignore[arg-type]
    except BaseException as exc:  # report, never hang the parent
        stats = Stats()
        import traceback
        stats.errors.append(f"client process failed: {exc!r}: "
                            + traceback.format_exc().replace("\n", " | "))
    conn.send(stats)
    conn.close()


class JournalWatcher(threading.Thread):
    """Reads the run's journal as it grows (every 5 ms): when each task's result was
    journaled, on the monotonic clock."""

    def __init__(self, path: Path, order: dict[bytes, int]) -> None:
        super().__init__(daemon=True)
        self.path, self.order = path, order
        self.seen = array("d", bytes(8 * (len(order) + 1)))
        self.stop = threading.Event()

    def run(self) -> None:
        fh = None
        carry = b""
        while not self.stop.is_set():
            if fh is None:
                try:
                    fh = open(self.path, "rb")
                except OSError:
                    self.stop.wait(0.005)
                    continue
            data = fh.read()
            now = time.monotonic()
            if data:
                lines = (carry + data).split(b"\n")
                carry = lines.pop()
                for line in lines:
                    parts = line.split(b" ", 3)
                    i = self.order.get(parts[2]) if len(parts) > 2 else None
                    if i is not None and not self.seen[i]:
                        self.seen[i] = now
            else:
                self.stop.wait(0.005)
        if fh is not None:
            fh.close()


# ------------------------------------------------------------------------------ the home
def make_home(root: Path, count: int, files: int, check: float | None,
              first_only: bool) -> tuple[Home, list[str]]:
    """A master home with the sweep pushed and queued; the task ids in table order."""
    home = Home(root)
    home.create()
    folder = home.users / "bench" / "sweep"
    folder.mkdir(parents=True)
    (folder / "params.csv").write_text("i\n" + "".join(f"{i}\n" for i in range(1, count + 1)))
    (folder / "sweep.toml").write_text(sweep_toml(files, check is not None))
    (folder / "check.sh").write_text("#!/bin/sh\nexit 0\n")  # the sweep file names it
    ids = [t.task_id for t in sweep_tasks(load_sweep(folder / "sweep.toml"))]
    if check is not None:
        (folder / "check.sh").write_text(check_script(check, ids[0] if first_only else ""))
        (folder / "check.sh").chmod(0o755)
    QueueFile(home.queue(0), home.queue_lock(0)).append(RunSpec.parse(QUEUE_LINE))
    return home, ids


def make_outbox(outbox: Path, ids: list[str], files: int) -> None:
    """Each task's result folder, as its command left it on the node."""
    outbox.mkdir(parents=True)
    if not files:
        return
    for task in ids:
        os.mkdir(outbox / task)
        for k in range(files):
            with open(outbox / task / f"out{k}", "wb") as fh:
                fh.write(b"x\n")


def check_archive(home: Home, ids: list[str], files: int) -> tuple[bool, str]:
    archives = list(home.archive.iterdir()) if home.archive.is_dir() else []
    if len(archives) != 1:
        return False, f"{len(archives)} archives"
    archive = archives[0]
    with open(archive / "results.tsv", encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
        status = header.index("status")
        rows = [line.rstrip("\n").split("\t") for line in fh]
    bad = [r for r in rows if r[status] != "ok"]
    if len(rows) != len(ids) or bad:
        return False, (f"results.tsv has {len(rows)} rows, {len(bad)} not ok "
                       f"(first: {bad[0][status] if bad else '-'})")
    results = archive / "results"
    for task in ids[:: max(1, len(ids) // 200)]:  # a sample: every folder is one stat
        got = sorted(p.name for p in (results / task).iterdir())
        if got != [f"out{k}" for k in range(files)]:
            return False, f"results/{task} holds {got}"
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=100000)
    parser.add_argument("--files", type=int, default=1, help="result files per task")
    parser.add_argument("--check", default="none",
                        help="none, fast (exit 0) or the seconds the check script sleeps")
    parser.add_argument("--slow-task", action="store_true",
                        help="only the first task's check sleeps (--check seconds, 1 if "
                             "not given)")
    parser.add_argument("--procs", type=int, default=1,
                        help="client processes the simulated nodes are spread over")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--keep", type=Path, help="work here and keep it")
    parser.add_argument("--profile", type=Path,
                        help="run the master under cProfile, writing its stats here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra master configuration (repeatable)")
    args = parser.parse_args(argv)
    if min(args.nodes, args.slots, args.tasks, args.procs) < 1 or args.files < 0:
        parser.error("--nodes, --slots, --tasks and --procs must be positive")
    check: float | None
    if args.check == "none":
        check = 1.0 if args.slow_task else None
    elif args.check == "fast":
        check = 0.0
    else:
        check = float(args.check)
    work = start("sweep-load", (), args.keep)
    assert work is not None
    if args.keep is not None and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    home, ids = make_home(work / "home", args.tasks, args.files, check, args.slow_task)
    order = {t.encode(): n for n, t in enumerate(ids, 1)}
    outbox = work / "outbox"
    made = time.monotonic()
    make_outbox(outbox, ids, args.files)
    outbox_s = time.monotonic() - made
    job_start = home.job_start(0)
    port = free_port()
    argv_master = [str(REPO / "clustermaster.py"), "--priority", "0", "--home", str(home.root),
                   "--set", f"base_port={port}", "--set", "linger=5",
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
    watcher = JournalWatcher(home.results(0), order)
    watcher.start()
    try:
        wait_until(lambda: job_start.exists(), 300, proc, "job.start")
        run_id = JobStart.parse(job_start.read_text()).id
        wait_until(lambda: listening(port), 600, proc, "the master to listen")
        incoming = home.run_dir(run_id) / "results" / "incoming"
        wait_until(incoming.is_dir, 60, proc, "results/incoming")
        deadline = time.monotonic() + args.timeout
        names = [f"n{i:05d}" for i in range(args.nodes)]
        for name in names:
            nodekeys.ensure_node_key(home.root, name)
        ctx = mp.get_context("fork")
        pipes, workers = [], []
        for p in range(args.procs):
            parent_end, child_end = ctx.Pipe(duplex=False)
            w = ctx.Process(target=_client, args=(
                child_end, port, run_id, names[p::args.procs], args.slots, order, deadline,
                job_start, home.root, outbox, incoming, args.files))
            w.start()
            child_end.close()
            pipes.append(parent_end)
            workers.append(w)
        stats = [pipe.recv() for pipe in pipes]
        for w in workers:
            w.join()
        if any(s.errors for s in stats):
            proc.kill()
        rc = proc.wait(timeout=max(60.0, deadline - time.monotonic()))
        exited = time.monotonic()
    except (RuntimeError, subprocess.TimeoutExpired, EOFError) as exc:
        proc.kill()
        proc.wait()
        print(f"sweep_load: {exc}; see {work / 'master.stderr'}", file=sys.stderr)
        return 1
    finally:
        sampler.stop.set()
        sampler.join()
        watcher.stop.set()
        watcher.join()
        log.close()
    errors = [e for s in stats for e in s.errors]
    if errors and proc.poll() is None:
        proc.kill()
    ok, problem = True, ""
    if errors:
        ok, problem = False, errors[0]
    elif rc != 0:
        ok, problem = False, f"master exit status {rc}"
    else:
        ok, problem = check_archive(home, ids, args.files)
    acks = stats[0].ack
    for s in stats[1:]:
        acks = array("d", [a if a and (a <= b or not b) else b
                           for a, b in zip(acks, s.ack, strict=True)])
    missing = sum(1 for a in acks[1:] if not a)
    if missing and ok:
        ok, problem = False, f"{missing} results never acknowledged"
    first = min((s.first_jobs for s in stats if s.first_jobs), default=0.0)
    last = max(acks[1:]) if len(acks) > 1 else 0.0
    journaled = watcher.seen
    judged = max(journaled[1:]) if len(journaled) > 1 else 0.0
    if ok and not all(journaled[1:]):
        ok, problem = False, "the journal watcher missed results"
    lat = sorted(x for s in stats for x in s.latencies)
    ordered = sorted(acks[1:])
    n5, n95 = int(0.05 * len(ordered)), int(0.95 * len(ordered)) - 1
    steady = (n95 - n5) / (ordered[n95] - ordered[n5]) \
        if ordered and ordered[n95] > ordered[n5] else 0.0
    rate = args.tasks / (last - first) if last > first else 0.0
    slow = {}
    if args.slow_task and ordered:
        # The other tasks' results: recorded while the first task's check sleeps?
        others = sorted(journaled[2:])
        slow = {"others_journaled_s": f"{others[-1] - first:.2f}" if others else "nan",
                "slow_journaled_s": f"{journaled[1] - first:.2f}" if journaled[1] else "nan"}
    if problem:
        print(f"# problem: {problem}", file=sys.stderr)
    master_busy = busy(sampler.cpu, ordered[n5], ordered[n95]) if ordered else float("nan")
    print(figures({
        "results_per_s": f"{rate:.0f}",
        "steady_results_per_s": f"{steady:.0f}",
        "judged_s": f"{judged - first:.2f}" if judged and first else "nan",
        "p50_ms": f"{1000 * percentile(lat, 0.5):.1f}",
        "p99_ms": f"{1000 * percentile(lat, 0.99):.1f}",
        "master_cpu": f"{master_busy:.2f}",
        "client_cpu": f"{sum(busy(s.cpu, ordered[n5], ordered[n95]) for s in stats):.2f}"
        if ordered else "nan",
        "machine_cpu": f"{busy(sampler.machine, ordered[n5], ordered[n95]):.2f}"
        if ordered else "nan",
        "master_us_per_result": f"{1e6 * master_busy / steady:.1f}" if steady else "nan",
        "rss_mb": f"{max(sampler.peak_rss, sampler.hwm) / 2**20:.0f}",
        "tasks": args.tasks, "nodes": args.nodes, "slots": args.slots, "files": args.files,
        "check": args.check + ("-first-task" if args.slow_task else ""),
        "calls": sum(s.calls for s in stats),
        "startup_s": f"{first - spawned:.1f}" if first else "nan",
        "finish_s": f"{exited - last:.1f}" if last else "nan",
        "outbox_s": f"{outbox_s:.1f}",
        **slow,
        "ok": "yes" if ok else "no",
    }), flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
