"""A withdrawn copy (docs/results.md, "Withdrawn copies") on a real node (run.py's engine,
against a scripted master on loopback): the job it runs is killed, process tree and all,
within one heartbeat (``poll_interval``: the node's calls to its master) of the other
copy's result reaching the master; no result of it is sent, and the slot takes the node's
next jobs."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from cluster.defaults import NODE_EXIT_DONE
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.records import Job, JobResult
from cluster.wire import protocol, signing
from cluster.wire.protocol import Reply, Request
from tests.component.test_node_run import (
    KEY,
    RUN,
    ScriptedMaster,
    make_node_home,
    node,
    write_start,
)

POLL = 1.0
COPY, NEXT1, NEXT2 = "t0.ps.ppmraw.72.0", "t1.ps.ppmraw.72.0", "t2.ps.ppmraw.72.0"


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_withdrawn_job_stops_within_one_heartbeat_and_its_slot_runs_the_next(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    write_start(home)
    pidfile = tmp_path / "copy.pid"
    lines = (
        Job(COPY, f"__temp__/{COPY}.log", f"echo gs > __temp__/{COPY}.log ; "
            f"sh -c 'trap \"\" HUP; sleep 300 & echo $! > {pidfile}; wait'").line,
        Job(NEXT1, f"__temp__/{NEXT1}.log", f"echo gs > __temp__/{NEXT1}.log").line,
        Job(NEXT2, f"__temp__/{NEXT2}.log", f"echo gs > __temp__/{NEXT2}.log").line)
    # When "another node's copy" of COPY gave its result (the master's decision), and which
    # call was told.
    won = threading.Event()
    times: dict[str, float] = {}

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy or not req.built:
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if "jobs" not in times:
            times["jobs"] = time.monotonic()
            return protocol.format_reply(Reply(protocol.JOBS, lines))
        if won.is_set() and "told" not in times:
            times["told"] = len(seen) - 1  # the call whose reply withdraws the copy
            return protocol.format_reply(Reply(protocol.CONTINUE, withdraw=(COPY,)))
        if ({r.name for seen_req in seen for r in seen_req.results} >= {NEXT1, NEXT2}
                or ("told" in times and time.monotonic() - times["won"] > 10)):
            # Every result in (or a node that did not stop its copy: ended, to fail below).
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return protocol.format_reply(Reply(protocol.CONTINUE))

    def other_copy_wins() -> None:
        # The other copy's result comes in a moment after this node's copy started, at no
        # particular point of the node's call cycle.
        end = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.3)
        times["won"] = time.monotonic()
        won.set()

    master = ScriptedMaster(script)
    port = serve(master)
    threading.Thread(target=other_copy_wins, daemon=True).start()
    killed: dict[str, float] = {}

    def watch() -> None:
        won.wait(60)
        sleeper = int(pidfile.read_text())
        while not gone(sleeper) and time.monotonic() - times["won"] < 30:
            time.sleep(0.01)
        killed["at"] = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # One slot, three jobs: the copy runs, the next waits in the slot shell's input and the
    # third in the node's queue, so the node is not hungry and calls only once a heartbeat.
    code = node(home, tmp_path, port, slots=1, poll_interval=POLL, job_timeout=300.0,
                kill_grace=30.0).run()
    watcher.join(30)
    assert code == NODE_EXIT_DONE
    assert all(req.features == (protocol.FEATURE_WITHDRAW,) for req in master.seen)
    stopped_after = killed["at"] - times["won"]
    assert stopped_after <= POLL + 0.5, (
        f"the withdrawn copy ran {stopped_after:.2f} s after the other's result, more than "
        f"one heartbeat ({POLL} s)")
    sent = [r.name for req in master.seen for r in req.results]
    assert sorted(sent) == [NEXT1, NEXT2], sent  # the withdrawn copy sends nothing
    # The freed slot took the node's other jobs, after the withdrawal (not before: the copy
    # held the only slot).
    assert min(i for i, req in enumerate(master.seen) if req.results) > times["told"]
    log = (tmp_path / "work" / "runs").rglob("n1.log")
    text = "".join(p.read_text() for p in log)
    assert f"job {COPY} withdrawn by the master" in text


def test_the_masters_run_state_withdraws_a_real_nodes_copy_when_the_other_wins(
        tmp_path: Path, serve: Callable[[object], int]) -> None:
    """The master's own run state (admission, the tail's copy, recording, the reply) with
    a real node: node n1 runs the run's one job; an idle node copies it in the tail and
    reports first; n1's next reply (UPLOAD: every result is in) withdraws its copy, and n1
    kills it within one heartbeat, sends no result of it, uploads and leaves."""
    home = make_node_home(tmp_path)
    write_start(home)
    pidfile = tmp_path / "copy.pid"
    job = Job(COPY, f"__temp__/{COPY}.log", f"echo gs > __temp__/{COPY}.log ; "
              f"sh -c 'sleep 300 & echo $! > {pidfile}; wait'")
    state = RunState(RUN, [job], time.monotonic(),
                     Settings(batch_per_slot=1, speculate_tail=True, heartbeat_timeout=60))
    lock = threading.Lock()
    seen: list[Request] = []

    class Master:
        def handler(self, data: bytes, peer: str) -> bytes:
            _, nonce = signing.verify_request(data, KEY)
            req = protocol.parse_request(data)
            with lock:
                seen.append(req)
                out = state.handle(req, time.monotonic(), nonce[:signing.SESSION_HEX], peer)
            return signing.sign_reply(protocol.format_reply(out.reply), KEY, nonce)

    times: dict[str, float] = {}

    def fast_node() -> None:
        """An idle node of the master's: joins once n1's copy runs, gets a tail copy of
        it, and reports its result first."""
        end = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.3)
        fast = Request(node="fast", job_id=RUN, built=RUN, slots=1,
                       features=(protocol.FEATURE_WITHDRAW,))
        with lock:
            assert state.handle(fast, time.monotonic(), "f" * 16).reply.verb == protocol.BUILD
            copies = state.handle(fast, time.monotonic(), "f" * 16).reply
            times["copied"] = float(copies.jobs == (job.line,))
            won = JobResult(COPY, 0, 0.3, 0, 0, "0" * 32, "gs", "fast")
            state.handle(dataclasses.replace(fast, results=(won,)), time.monotonic(),
                         "f" * 16)
            times["won"] = time.monotonic()
        sleeper = int(pidfile.read_text())
        while not gone(sleeper) and time.monotonic() - times["won"] < 30:
            time.sleep(0.01)
        times["killed"] = time.monotonic()

    helper = threading.Thread(target=fast_node, daemon=True)
    helper.start()
    code = node(home, tmp_path, serve(Master()), slots=1, poll_interval=POLL,
                job_timeout=300.0, kill_grace=30.0).run()
    helper.join(30)
    assert code == NODE_EXIT_DONE
    assert times["copied"] == 1.0, "the idle node got no copy of n1's job"
    assert times["killed"] - times["won"] <= POLL + 0.5
    assert not any(r.name == COPY for req in seen for r in req.results)  # none from n1
    assert state.results[COPY].machine == "fast"
    assert state.withdrawn == 1 and state.duplicates == 0 and not state.copied
    assert state.nodes["n1"].results == 0 and not state.nodes["n1"].held
