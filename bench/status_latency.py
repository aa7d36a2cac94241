#!/usr/bin/env python3
"""bench/status_latency.py -- the status page's latency while a master is under load, and
the master's figures with and without the page being asked.

Usage: python3 bench/status_latency.py [--nodes 1000] [--jobs 1000000] [--rate 20]
                                       [--repeat 1] [--fake-nodes 1000] [--archived 200]
                                       [--plain] [--keep DIR]

Each repeat runs ``bench/master_load.py --nodes N --jobs M`` twice, alternately:

* ``base``: master_load alone;
* ``probed``: master_load while a real ``clusterstatus.py`` serves the same master home and
  this script asks it for ``/api/status`` ``--rate`` times a second as a browser does
  (gzip accepted; open loop: each request on a new connection at its scheduled time, as
  many browsers polling would), from the moment the home is made until master_load exits.
  A probe counts from connect to the last byte of a complete answer.  ``--plain`` probes
  as a client that does not accept gzip (the 300 KB answer of 1,000 nodes, not 10 KB).

In both, the home master_load makes is first given what a cluster that has run a while has
(both runs get the same, so only the probing differs): ``--fake-nodes`` nodes in ``nodes/``
(``.up`` touched in the last seconds, 5% of them not heard from for 10 minutes, 2%
disabled, each with a status and a capabilities line), ``--archived`` finished runs in
``archive/`` (run.info, report.txt, a small .tab; named ``2020...-seed``, which
master_load's checks skip), and runs waiting in queues 1 and 2.  The master's run is
master_load's own (priority 0); its live.json, queue and journal change all the time.

Figures, one line each:

  run=base|probed i=K  <master_load's own line: jobs_per_s p50_ms p99_ms ... ok>
  status i=K requests=R errors=E p50_ms p95_ms p99_ms max_ms   every probe of that run
  status_in_run i=K ...     the probes while the master's live.json existed (the run served)
  summary  medians over the repeats of jobs_per_s, p50_ms, p99_ms, startup_s, finish_s,
           base and probed, and the status percentiles over all probes in runs

Exit status 0 when every master_load run said ok=yes and no probe failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, figures, median, start  # noqa: E402
from cluster.home import Home  # noqa: E402
from cluster.queue import QueueFile
from cluster.runspec import RunSpec  # noqa: E402
from cluster.runtime.ports import free_port  # noqa: E402
from cluster.wire.jobstart import JobStart  # noqa: E402

#: Written into the home once it is seeded: the probed run starts its server then.
SEEDED = ".status-bench-seeded"
#: How long the status service has to answer its first request [seconds].
SERVER_START = 60.0
#: How long one probe may take before it counts as failed [seconds].
PROBE_TIMEOUT = 10.0

#: master_load run in a child, with its home seeded (see the module docstring).
_CHILD = """
import sys
from bench import master_load, status_latency
master_load.make_home = status_latency.seeded(master_load.make_home, {nodes}, {archived})
sys.exit(master_load.main(sys.argv[1:]))
"""


# ------------------------------------------------------------------------------ the home
def seed_nodes(home: Home, count: int, now: float) -> None:
    home.nodes.mkdir(parents=True, exist_ok=True)
    caps = ("os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=8 ram_mb=16000 "
            "tools=cc,gcc,git,gs,make,md5sum,mutool,rsync")
    for i in range(count):
        name = f"farm{i:04d}"
        (home.nodes / f"{name}.status").write_text("idle\n" if i % 3 else
                                                   "running run 20200101000000-p0-seed\n")
        (home.nodes / f"{name}.caps").write_text(caps + "\n")
        up = home.nodes / f"{name}.up"
        up.write_text("")
        ago = 600.0 if i % 20 == 0 else (i % 10) * 0.5  # 5% down for ten minutes
        os.utime(up, (now - ago, now - ago))
        if i % 50 == 1:  # 2% disabled
            home.node_down(name).write_text(
                "disabled by admin@master at 2020-01-01T00:00:00Z\nbench\n")


def seed_archive(home: Home, count: int) -> None:
    for k in range(count):
        run_id = f"20200101{k:06d}-p{k % 3}-seed"
        folder = home.archive / run_id
        folder.mkdir(parents=True, exist_ok=True)
        start_info = JobStart(id=run_id, priority=k % 3, queue="user alice gs", kind="user",
                              ref="alice", products=("gs",), tree="ghostpdl",
                              source=f"runs/{run_id}/source", build="make", tests="tests")
        (folder / "run.info").write_text(
            start_info.format() + f"elapsed {600 + k:.1f}\noutcome done\nnodes 40\n"
            f"differences {k % 7}\nerrors {k % 3}\n")
        (folder / "report.txt").write_text(
            f"User regression: user alice gs - run {run_id}\n\nran 100 tests in 600 "
            f"seconds on 40 nodes\n" + "".join(f"  test{i}\n" for i in range(k % 7)))
        (folder / f"{run_id}.tab").write_text("".join(
            f"t{i}\t0\t0.01\t0.01\t0.01\t0\t{i:032x}\t{run_id}\tgs\tfarm{i % 40:04d}\n"
            for i in range(100)))


def seed_queues(home: Home) -> None:
    commits = QueueFile(home.queue(1), home.queue_lock(1))
    for sha in ("1f2e3d4c5b6a", "2a3b4c5d6e7f", "3c4d5e6f7a8b"):
        commits.append(RunSpec.parse(f"git {sha} gs"))
    QueueFile(home.queue(2), home.queue_lock(2)).append(RunSpec.parse("auto nightly gs"))


def seeded(make_home: Callable[..., Home], nodes: int,
           archived: int) -> Callable[..., Home]:
    """master_load's make_home, followed by the seeding (and the SEEDED mark)."""
    def make(root: Path, *args: Any, **kwargs: Any) -> Home:
        home = make_home(root, *args, **kwargs)
        seed_nodes(home, nodes, time.time())
        seed_archive(home, archived)
        seed_queues(home)
        (home.root / SEEDED).write_text("")
        return home
    return make


# ------------------------------------------------------------------------------ the probes
@dataclass
class Probes:
    """What the prober saw: (latency seconds, the run was live) per probe, and failures."""

    samples: list[tuple[float, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def get(port: int, path: str, gzip_ok: bool = True) -> bytes:
    """The whole answer to GET ``path``, asked as a browser asks (gzip accepted) or, with
    ``gzip_ok`` false, as a plain client."""
    accept = "Accept-Encoding: gzip, deflate\r\n" if gzip_ok else ""
    with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: bench\r\n{accept}\r\n".encode())
        chunks = []
        while chunk := sock.recv(262144):
            chunks.append(chunk)
    return b"".join(chunks)


def complete(answer: bytes) -> bool:
    """Whether ``answer`` is a 200 with as many body bytes as its Content-Length says."""
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200 "):
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value) == len(body)
    return False


def probe(port: int, rate: float, live: Path, stop: threading.Event, out: Probes,
          gzip_ok: bool = True) -> None:
    """Ask ``/api/status`` ``rate`` times a second until ``stop``; open loop: a probe late
    because the previous one was slow goes out at once, the schedule is not pushed back."""
    interval = 1.0 / rate
    due = time.monotonic()
    while not stop.is_set():
        wait = due - time.monotonic()
        if wait > 0:
            stop.wait(wait)
            continue
        due += interval
        running = live.exists()
        begin = time.perf_counter()
        try:
            answer = get(port, "/api/status", gzip_ok)
        except OSError as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}")
            continue
        took = time.perf_counter() - begin
        if not complete(answer):
            out.errors.append(answer[:200].decode("utf-8", errors="replace"))
            continue
        out.samples.append((took, running))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def latency_figures(values: list[float]) -> dict[str, object]:
    return {"requests": len(values),
            "p50_ms": f"{1000 * percentile(values, 0.5):.1f}",
            "p95_ms": f"{1000 * percentile(values, 0.95):.1f}",
            "p99_ms": f"{1000 * percentile(values, 0.99):.1f}",
            "max_ms": f"{1000 * max(values, default=float('nan')):.1f}"}


# ------------------------------------------------------------------------------ the runs
def master_load(work: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    code = _CHILD.format(nodes=args.fake_nodes, archived=args.archived)
    argv = [sys.executable, "-c", code, "--nodes", str(args.nodes), "--jobs", str(args.jobs),
            "--keep", str(work)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)


def figures_line(output: str) -> dict[str, str]:
    for line in reversed(output.splitlines()):
        if "jobs_per_s=" in line:
            return dict(part.split("=", 1) for part in line.split() if "=" in part)
    return {}


def run_base(work: Path, args: argparse.Namespace) -> dict[str, str]:
    child = master_load(work, args)
    out, _ = child.communicate(timeout=args.timeout)
    return figures_line(out)


def run_probed(work: Path, args: argparse.Namespace, probes: Probes) -> dict[str, str]:
    child = master_load(work, args)
    home = work / "home"
    server: subprocess.Popen[bytes] | None = None
    stop = threading.Event()
    prober: threading.Thread | None = None
    try:
        deadline = time.monotonic() + args.timeout
        while not (home / SEEDED).exists():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("master_load ended or hung before its home was made")
            time.sleep(0.01)
        port = free_port()
        with open(work / "clusterstatus.out", "wb") as log:
            server = subprocess.Popen(
                [sys.executable, str(REPO / "clusterstatus.py"), "--home", str(home),
                 "--set", f"status_port={port}", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        ready = time.monotonic() + SERVER_START
        while True:
            try:
                get(port, "/api/nodes")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > ready:
                    raise RuntimeError(f"clusterstatus did not answer; see "
                                       f"{work / 'clusterstatus.out'}") from None
                time.sleep(0.02)
        prober = threading.Thread(target=probe, args=(port, args.rate, Home(home).live(0),
                                                      stop, probes, not args.plain),
                                  daemon=True)
        prober.start()
        out, _ = child.communicate(timeout=args.timeout)
        return figures_line(out)
    finally:
        stop.set()
        if prober is not None:
            prober.join(timeout=30)
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if child.poll() is None:
            child.kill()
            child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="master_load's nodes")
    parser.add_argument("--jobs", type=int, default=1000000, help="master_load's jobs")
    parser.add_argument("--rate", type=float, default=20.0, help="status requests per second")
    parser.add_argument("--repeat", type=int, default=1, help="base/probed pairs to run")
    parser.add_argument("--fake-nodes", type=int, default=1000,
                        help="nodes seeded into nodes/ for the status page to list")
    parser.add_argument("--archived", type=int, default=200,
                        help="finished runs seeded into archive/")
    parser.add_argument("--plain", action="store_true",
                        help="probe without accepting gzip (300 KB answers instead of 10 KB)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    if min(args.nodes, args.jobs, args.repeat) < 1 or args.rate <= 0:
        parser.error("--nodes, --jobs, --repeat and --rate must be positive")
    work = start("status-latency", (), args.keep)
    assert work is not None
    runs: dict[str, list[dict[str, str]]] = {"base": [], "probed": []}
    every: list[float] = []
    ok = True
    for i in range(1, args.repeat + 1):
        for kind in ("base", "probed"):
            folder = work / f"{kind}-{i}"
            probes = Probes()
            try:
                found = run_base(folder, args) if kind == "base" else \
                    run_probed(folder, args, probes)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"status_latency: {kind} run {i}: {exc}", file=sys.stderr)
                return 1
            if args.keep is None:
                shutil.rmtree(folder, ignore_errors=True)  # a million-job home is large
            ok = ok and found.get("ok") == "yes"
            runs[kind].append(found)
            print(f"run={kind} i={i} " + " ".join(f"{k}={v}" for k, v in found.items()),
                  flush=True)
            if kind == "probed":
                all_probes = [t for t, _ in probes.samples]
                in_run = [t for t, live in probes.samples if live]
                every += in_run
                print(figures({"status": "all", "i": i, **latency_figures(all_probes),
                               "errors": len(probes.errors)}), flush=True)
                print(figures({"status": "in_run", "i": i, **latency_figures(in_run)}),
                      flush=True)
                for error in probes.errors[:5]:
                    print(f"# probe failed: {error}", file=sys.stderr)
                ok = ok and not probes.errors
    summary: dict[str, object] = {"summary": "medians"}
    for key in ("jobs_per_s", "p50_ms", "p99_ms", "startup_s", "finish_s"):
        for kind in ("base", "probed"):
            values = [float(r[key]) for r in runs[kind] if key in r]
            summary[f"{kind}_{key}"] = f"{median(values):.1f}"
    summary.update({f"status_in_run_{k}": v for k, v in latency_figures(every).items()})
    summary["ok"] = "yes" if ok else "no"
    print(figures(summary), flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
