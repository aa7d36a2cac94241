"""A served run stepped turn by turn: ServedRun.open on a small home, then tick(now) with
times the test chooses (cluster.master.run.servedrun).

The node is scripted (tests.component.scripted_nodes) and talks over real TCP to the
run's server; the master's clock is a FakeClock, so the run's limits and deadlines pass
when the test says so, not when the wall clock does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.files.attempts import Attempts
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.model import placement, runlimits
from cluster.master.model.joblist import MemoryJobList
from cluster.master.run.runsetup import write_job_start
from cluster.master.run.servedrun import LEFT, Ended, RunHost, ServedRun
from cluster.master.serve.handler import RequestHandler
from cluster.master.serve.server import NodeServer
from cluster.queue import QueueFile
from cluster.records import Job
from cluster.runspec import RunSpec
from cluster.runtime.clock import FakeClock
from cluster.runtime.service import StopPoint
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from tests.component.scripted_nodes import known_run, request, signed_talk
from tests.helpers import free_port

PRIORITY = 2
MD5 = "0123456789abcdef0123456789abcdef"
JOBS = [Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", f"echo {i} | md5sum")
        for i in (1, 2)]


class Opened:
    """A run opened on a fresh home: its ServedRun, the FakeClock and the port it serves.
    ``replaced``: the PID file is no longer ours once set."""

    def __init__(self, root: Path, line: str, jobs: list[Job] = JOBS) -> None:
        self.port = free_port()
        self.cfg = Config().with_changes(home=root, base_port=self.port - PRIORITY,
                                         linger=0.0, result_cache=False)
        self.home = Home(root)
        self.home.create()
        (self.home.root / "ghostpdl").mkdir()
        spec = RunSpec.parse(line)
        QueueFile(self.home.queue(PRIORITY), self.home.queue_lock(PRIORITY)).append(spec)
        start = JobStart(id="20250101000000-p2-abcd", priority=PRIORITY, queue=spec.line(),
                         kind=spec.kind, ref=spec.ref, products=spec.products,
                         tree=spec.tree, source=spec.tree, build="true", tests="tests",
                         options=spec.options)
        write_job_start(self.home.job_start(PRIORITY), start)
        (self.home.run_dir(start.id) / "logs").mkdir(parents=True)  # as the master sets up
        self.run_id = known_run(self.home, PRIORITY)  # the scripted node signs for it
        self.clock = FakeClock()
        self.stop = StopPoint()
        self.replaced = False
        self.expired: list[bool] = []
        host = RunHost(self.cfg, self.home, PRIORITY, PRIORITY, self.clock, self.stop,
                       lambda: not self.replaced,
                       Attempts(self.home.per_priority("attempts", PRIORITY)),
                       lambda: self.expired.append(True))
        handler = RequestHandler(self.cfg.max_line_bytes, self.cfg.max_request_lines,
                                 self.clock.monotonic)
        self.server = NodeServer((self.cfg.listen_address, self.port), handler,
                                 max_line=self.cfg.max_line_bytes,
                                 max_lines=self.cfg.max_request_lines,
                                 max_request=self.cfg.max_request_bytes,
                                 max_buffered=self.cfg.max_buffered_bytes,
                                 deadline=self.cfg.connection_deadline)
        handler.refusals = self.server.refusals
        options = runlimits.run_options(spec, self.cfg)
        self.served = ServedRun.open(host, spec, start, MemoryJobList(jobs), options,
                                     placement.RunPolicy.of(options), None, self.server,
                                     handler)
        self.served.serve_slice = 0.05  # the tests' turns are short; their times explicit

    def tick(self, seconds: float = 0.0) -> Ended | None:
        """One turn, ``seconds`` after the last one."""
        self.clock.advance(seconds)
        return self.served.tick(self.clock.monotonic())

    def answered(self, *extra: str) -> bytes:
        """A call of node n1 (``extra`` lines in it), answered while the test turns the
        run (at most 200 turns, the clock standing still)."""
        replies: list[bytes] = []
        caller = threading.Thread(target=lambda: replies.append(
            signed_talk(self.port, request("n1", self.run_id, *extra))))
        caller.start()
        for _ in range(200):
            if not caller.is_alive():
                break
            assert self.tick() is None
        caller.join(10)
        assert replies, "the node's call was not answered"
        return replies[0]

    def answered_leaving(self, *extra: str) -> bytes:
        """As :meth:`answered`, for a call ended by ABORT (the node leaves)."""
        replies: list[bytes] = []
        data = request("n1", self.run_id, *extra)
        data = data[:-len(b"OK\n")] + b"ABORT\n"
        caller = threading.Thread(target=lambda: replies.append(signed_talk(self.port, data)))
        caller.start()
        for _ in range(200):
            if not caller.is_alive():
                break
            assert self.tick() is None
        caller.join(10)
        assert replies, "the node's call was not answered"
        return replies[0]

    def close(self) -> None:
        self.served.close()
        self.server.close()


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Callable[[str], Opened]]:
    runs: list[Opened] = []

    def open_run(line: str) -> Opened:
        runs.append(Opened(tmp_path / "home", line))
        return runs[-1]

    yield open_run
    for run in runs:
        run.close()


def test_a_run_served_turn_by_turn_ends_done_once_its_results_are_in(
        opened: Callable[[str], Opened]) -> None:
    run = opened("auto nightly gs")
    live = run.home.live(PRIORITY)
    assert live.exists()  # opened: the live status says it is served
    assert run.tick() is None  # a turn with nothing to do
    assert run.answered() == b"BUILD\n"  # the node is told to build
    reply = protocol.parse_reply(run.answered("slots 2", "jobs 0 0"))
    held = [Job.parse(line).name for line in reply.jobs]
    assert sorted(held) == sorted(j.name for j in JOBS)
    run.answered("slots 2", "jobs 0 0",
                 *(f"result {name} 0 0.10 0.00 0.00 {MD5} gs" for name in held))
    assert run.served.state.all_results_in
    assert run.tick() is None  # every result in: the node may still upload its logs
    ended = run.tick(run.cfg.upload_timeout + 1)  # ... for upload_timeout, no longer
    assert ended == Ended(Outcome.DONE)
    # The waiting runs are looked at every pid_check_interval of the run's clock: at the
    # first turn and at the last; every turn between came at the same time.
    assert run.expired == [True, True]
    record = run.served.end(ended)
    assert isinstance(record, EndRecord) and record.outcome is Outcome.DONE
    assert not run.home.job_start(PRIORITY).exists() and not live.exists()
    assert run.served.hand_over()[0].run_id == run.run_id


def test_a_run_ends_timed_out_once_now_passes_its_job_timeout(
        opened: Callable[[str], Opened]) -> None:
    run = opened("auto nightly gs job_timeout=10")
    assert run.tick() is None
    assert run.tick(9.0) is None  # 9 s run: within its job_timeout
    ended = run.tick(2.0)  # 11 s run
    assert ended is not None and ended.outcome is Outcome.TIMED_OUT
    assert "job_timeout 10 s" in ended.reason
    assert run.served.state.fatal == f"run stopped: {ended.reason}"


def test_a_master_whose_pid_file_was_taken_leaves_the_run(
        opened: Callable[[str], Opened]) -> None:
    run = opened("auto nightly gs")
    assert run.tick() is None
    run.replaced = True
    assert run.tick(0.5) is None  # the PID file is looked at every pid_check_interval ...
    assert run.tick(run.cfg.pid_check_interval) is LEFT  # ... and then found taken
    assert run.served.state.fatal == protocol.REPLACED
    assert run.served.end(LEFT) is None  # the run goes on under the other master
    assert run.home.job_start(PRIORITY).exists()


def test_a_stop_asked_leaves_the_run_at_the_next_turn(opened: Callable[[str], Opened]
                                                       ) -> None:
    run = opened("auto nightly gs")
    assert run.tick() is None
    run.stop.flag.set()
    assert run.tick() is LEFT
