#!/usr/bin/env python3
"""bench/master_handler.py -- what the master's request handler costs per job, in-process.

Usage: python3 bench/master_handler.py [--jobs 1000000] [--nodes 1000] [--slots 8]
                                       [--reps 3] [--stages] [--ordered] [--keep DIR]

The handler (:class:`cluster.master.serve.handler.RequestHandler`) is bound to a real run state
over a jobs file of M lines, a real journal and audit trail, and called directly by K
simulated nodes in turn, with no sockets and no other process: each call carries the
results of every job the node was given by the call before, signed as a node signs it, and
its reply is verified as a node verifies it.  The run's clock moves 0.4 ms a call, so the
batch sizes (and the number of calls) are the same on every machine and every repeat: the
figures compare trees, where master_load (sockets, a client process, the machine's load)
moves by 20% from one hour to the next.

``--ordered`` serves the jobs file as the master leaves it for a run whose baseline knows
every test's time (docs/results.md, "Slowest tests first, and slowdowns named"; slowest
first, :mod:`cluster.master.model.joborder`; the times spread over 0-10 s), and prints the
rewrite's seconds as ``order_s``: the handler's cost must not depend on it.

Only the time inside the handler is counted.  ``--stages`` also times its steps one by one
(job id, signature check, parse, replay guard, the run state, journal, audit, reply,
signing) and prints each in ns per job; the steps' sum is a little more than the whole.

Figures (the best of the repeats, and each repeat):

  handler_us_per_job  time in the handler per job
  us_per_call         the same per call
  calls jobs_per_call the calls the run took

The run is checked: every job has exactly one result at the end.  Exit status 0 only then.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import figures, start  # noqa: E402
from cluster import nodekeys  # noqa: E402
from cluster.master.files import journal
from cluster.master.files.audit import AuditLog  # noqa: E402
from cluster.master.files.keycache import run_keys  # noqa: E402
from cluster.master.model import joborder
from cluster.master.model.joblist import JobFile  # noqa: E402
from cluster.master.serve.handler import RequestHandler, RunSession  # noqa: E402
from cluster.master.state.runcore import Settings  # noqa: E402
from cluster.master.state.runstate import RunState  # noqa: E402
from cluster.report.tab import write_tab_lines  # noqa: E402
from cluster.wire import protocol, signing  # noqa: E402

RUN_ID = "20261123000000-p0-bench"
PEER = "127.0.0.1:40000"
#: How far the run's clock moves per call [s]: a steady 2,500 calls a second.
TICK = 0.0004
STEM = "load__load.cmds."


def write_jobs(path: Path, jobs: int) -> None:
    """A jobs file of ``jobs`` product-shell lines, as build.py writes them."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(jobs):
            fh.write(f"{STEM}{i} {STEM}{i}.log true ; echo {i} | md5sum\n")


def order_jobs(jobs_path: Path, work: Path, jobs: int) -> float:
    """``--ordered``: the jobs file rewritten slowest first (docs/results.md, "Slowest tests
    first, and slowdowns named") by a baseline whose times spread over 0-10 s, as the master
    does when it makes a run's jobs file; the seconds it took."""
    baseline = work / "current.tab"
    write_tab_lines(baseline, sorted(
        f"{STEM}{i}\t0\t{(i * 7919) % 1000 / 100:.2f}\t0.00\t0.00\t0\t{'0' * 32}\tr\tshell\tn1"
        for i in range(jobs)))
    began = time.perf_counter()
    done = joborder.order_jobs_file(jobs_path, baseline)
    spent = time.perf_counter() - began
    baseline.unlink()
    assert done.rewritten and done.known == jobs, done
    return spent


class Stages:
    """The handler's steps, timed one by one (as RequestHandler.__call__ runs them)."""

    NAMES = ("id", "key", "verify", "parse", "guard", "state", "journal", "audit", "reply",
             "sign")

    def __init__(self) -> None:
        self.ns = dict.fromkeys(self.NAMES, 0)

    def __call__(self, handler: RequestHandler, data: bytes) -> bytes:
        served = handler._served
        assert served is not None
        state, session = served.state, served.session
        clock = time.perf_counter_ns
        marks = [clock()]
        assert signing.header_value(data, b"id") == state.run_id
        marks.append(clock())
        key = session.keys.key(signing.header_value(data, b"node"))
        assert key is not None
        marks.append(clock())
        _, nonce = signing.verify_request(data, key)
        marks.append(clock())
        req = protocol.parse_request(data, handler.max_line, handler.max_lines, canonical=True)
        marks.append(clock())
        assert session.guard.accept(req.node, nonce)
        marks.append(clock())
        outcome = state.handle(req, handler.monotonic(), nonce[:signing.SESSION_HEX], PEER)
        marks.append(clock())
        served.journal.write(outcome.journal)
        marks.append(clock())
        session.audit.connection(PEER, req, outcome.reply, outcome.results, outcome.refused)
        marks.append(clock())
        reply = protocol.format_reply(outcome.reply)
        marks.append(clock())
        signed = signing.sign_reply(reply, key, nonce)
        marks.append(clock())
        for name, before, after in zip(self.NAMES, marks, marks[1:], strict=False):
            self.ns[name] += after - before
        return signed


def one_run(jobs_path: Path, work: Path, jobs: int, nodes: int, slots: int,
            stages: Stages | None) -> tuple[float, int]:
    """Serve one run of ``jobs`` to ``nodes`` simulated nodes; (seconds in the handler,
    calls).  AssertionError if the run does not end with every job's result."""
    now = [1000.0]
    state = RunState(RUN_ID, JobFile(jobs_path), now[0], Settings())
    (work / "results").unlink(missing_ok=True)
    jrnl = journal.Journal(work / "results", RUN_ID)
    home = work / "home"
    keys: list[bytes] = []
    for i in range(nodes):  # each node's own key, as bootstrap_node.py makes it
        nodekeys.ensure_node_key(home, f"n{i:05d}")
        text = nodekeys.read_node_key(home, f"n{i:05d}")
        assert text is not None
        keys.append(signing.run_key(signing.parse_secret(text), RUN_ID))
    session = RunSession(run_keys(home, RUN_ID, lambda: now[0]), signing.ReplayGuard(),
                         AuditLog(work / "audit.log"))
    handler = RequestHandler(protocol.DEFAULT_MAX_LINE, protocol.DEFAULT_MAX_LINES,
                             lambda: now[0])
    handler.bind(state, jrnl, session)
    heads = [(f"node n{i:05d}\nid {RUN_ID}\nbuilt {RUN_ID}\ncaps x\nslots {slots}\n"
              "jobs 0 0\n").encode() for i in range(nodes)]
    nonces = [signing.NonceSource() for _ in range(nodes)]
    held: list[list[bytes]] = [[] for _ in range(nodes)]
    live = set(range(nodes))
    md5 = hashlib.md5
    spent = 0.0
    calls = 0
    clock = time.perf_counter
    while live:
        for k in sorted(live):
            nonce = nonces[k].next()
            body = b"".join([heads[k], *[b"result %s 0 0.00 0.00 0.00 %s shell\n"
                                          % (name, md5(name).hexdigest().encode())
                                          for name in held[k]]])
            data = signing.sign_request(body + b"OK\n", keys[k], nonce)
            began = clock()
            reply = stages(handler, data) if stages else handler(data, PEER)
            spent += clock() - began
            calls += 1
            now[0] += TICK
            verb, _, rest = signing.verify_reply(reply, keys[k], nonce).partition(b"\n")
            held[k] = []
            if verb == b"JOBS":
                lines = rest.partition(b"\n")[2].split(b"\n")
                held[k] = [line[:line.index(b" ")] for line in lines if line]
            elif verb.startswith(b"ABORT"):
                assert verb == b"ABORT run complete", verb
                live.discard(k)
    jrnl.close()
    handler.unbind()
    assert state.results.count == jobs == len(state.results), state.results.count
    return spent, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="master_handler.py", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--stages", action="store_true",
                        help="also time the handler's steps one by one")
    parser.add_argument("--keep", type=Path, help="keep the jobs file, journal and audit here")
    parser.add_argument("--ordered", action="store_true",
                        help="serve the jobs file as the master orders it, slowest first "
                             "(docs/results.md), not in build.py's order")
    args = parser.parse_args(argv)
    if min(args.jobs, args.nodes, args.slots, args.reps) < 1:
        parser.error("--jobs, --nodes, --slots and --reps must be at least 1")
    work = start("master_handler", (), args.keep)
    if work is None:
        return 2
    work.mkdir(parents=True, exist_ok=True)
    jobs_path = work / "jobs"
    write_jobs(jobs_path, args.jobs)
    order_s = order_jobs(jobs_path, work, args.jobs) if args.ordered else None
    per_job: list[float] = []
    stages = Stages() if args.stages else None
    calls = 0
    for _ in range(args.reps):
        spent, calls = one_run(jobs_path, work, args.jobs, args.nodes, args.slots, stages)
        per_job.append(spent / args.jobs * 1e6)
    best = min(per_job)
    values: dict[str, object] = {
        "handler_us_per_job": f"{best:.2f}",
        "us_per_call": f"{best * args.jobs / calls:.0f}",
        "repeats": ",".join(f"{v:.2f}" for v in per_job),
        "calls": calls, "jobs_per_call": f"{args.jobs / calls:.0f}",
        "jobs": args.jobs, "nodes": args.nodes, "slots": args.slots,
        "ordered": "no" if order_s is None else "yes", "order_s": f"{order_s or 0:.2f}",
    }
    if stages:
        values.update({f"{name}_ns": round(ns / args.jobs / args.reps)
                       for name, ns in stages.ns.items()})
    values["ok"] = "yes"
    print(figures(values), flush=True)
    if args.keep is None:
        for name in ("jobs", "results", "audit.log"):
            (work / name).unlink(missing_ok=True)
        shutil.rmtree(work / "home", ignore_errors=True)
        os.rmdir(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
