"""Fair share between two priority-0 runs, the master's side (docs/runoptions.md, "Fair
share"): a user's run served by the master of lane 0, scripted nodes calling it over real
TCP, and another user's run of lane 3 written into the home (its job.start, and its live
file as its master writes it).  The lane-0 master sends the lane-3 run the nodes its share
asks for, each told ``ABORT preempted: for run X (priority 0, fair share)`` at its next
call, and no more once the split is fair.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.files.attempts import Attempts
from cluster.master.model import placement, runlimits
from cluster.master.model.joblist import MemoryJobList
from cluster.master.run.runsetup import write_job_start
from cluster.master.run.servedrun import RunHost, ServedRun
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

#: Enough jobs that the served run can use every node (40 jobs a node of 2 slots).
JOBS = [Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", f"echo {i} | md5sum")
        for i in range(1, 201)]
MINE = "20250101000000-p0-aaaa"
OTHER = "20250101000100-p0-bbbb"
USER_LANE = 3


class Served:
    """A priority-0 run served by lane 0's master on a fresh home, turned by the test."""

    def __init__(self, root: Path, line: str, user_shares: str = "") -> None:
        self.port = free_port()
        self.cfg = Config().with_changes(home=root, base_port=self.port, linger=0.0,
                                         result_cache=False, user_shares=user_shares)
        self.home = Home(root)
        self.home.create()
        spec = RunSpec.parse(line)
        QueueFile(self.home.queue(0), self.home.queue_lock(0)).append(spec)
        start = JobStart(id=MINE, priority=0, queue=spec.line(), kind=spec.kind,
                         ref=spec.ref, products=spec.products, tree=spec.tree,
                         source=spec.tree, build="true", tests="tests", options=spec.options)
        write_job_start(self.home.job_start(0), start)
        (self.home.run_dir(start.id) / "logs").mkdir(parents=True)
        self.run_id = known_run(self.home, 0)
        self.clock = FakeClock()
        host = RunHost(self.cfg, self.home, 0, 0, self.clock, StopPoint(), lambda: True,
                       Attempts(self.home.per_priority("attempts", 0)), lambda: None)
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
        self.served = ServedRun.open(host, spec, start, MemoryJobList(JOBS), options,
                                     placement.RunPolicy.of(options), None, self.server,
                                     handler)
        self.served.serve_slice = 0.05

    def tick(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        assert self.served.tick(self.clock.monotonic()) is None

    def call(self, node: str, *extra: str) -> protocol.Reply:
        """Node ``node``'s call over TCP, answered while the test turns the run."""
        replies: list[bytes] = []
        caller = threading.Thread(target=lambda: replies.append(
            signed_talk(self.port, request(node, self.run_id, *extra))))
        caller.start()
        for _ in range(200):
            if not caller.is_alive():
                break
            self.tick()
        caller.join(10)
        assert replies, f"{node}'s call was not answered"
        return protocol.parse_reply(replies[0])

    def join(self, *nodes: str) -> None:
        """Each node built and given its first jobs."""
        for node in nodes:
            assert self.call(node, "slots 2", "jobs 0 0").verb == protocol.BUILD
            assert self.call(node, "slots 2", "jobs 0 0").verb == protocol.JOBS

    def other_run(self, user: str, *, nodes: tuple[str, ...] = (), jobs_left: int = 200,
                  live: bool = True) -> None:
        """Lane 3's run (user ``user``) as its master writes it: its job.start and, with
        ``live``, its live file naming ``nodes`` in it."""
        write_job_start(self.home.job_start(USER_LANE), JobStart(
            id=OTHER, priority=0, queue=f"user {user} gs", kind="user", ref=user,
            products=("gs",), tree=user, source=user, build="true", tests="tests",
            lane_number=USER_LANE))
        if live:
            self.home.live(USER_LANE).write_text(json.dumps({
                "run": OTHER, "jobs": {"left": jobs_left, "running": 0},
                "nodes": {name: {"state": "ready"} for name in nodes}}))

    def moving(self) -> dict[str, str]:
        return {n.name: n.moving_to for n in self.served.state.moving()}

    def close(self) -> None:
        self.served.close()
        self.server.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    runs: list[Served] = []

    def open_run(line: str, user_shares: str = "") -> Served:
        runs.append(Served(tmp_path / "home", line, user_shares))
        return runs[-1]

    yield open_run
    for run in runs:
        run.close()


FAIR = f"run {OTHER} (priority 0, fair share)"


def test_two_equal_runs_the_master_holding_both_nodes_sends_one(
        served: Callable[..., Served]) -> None:
    run = served("user ann gs")
    run.join("n1", "n2")
    run.tick(1.0)
    assert run.moving() == {}  # alone at priority 0: it keeps both

    run.other_run("bob")
    run.tick(1.0)
    moving = run.moving()
    assert list(moving.values()) == [FAIR], moving
    (name,) = moving
    told = run.call(name, "slots 2", "jobs 0 1")
    assert told.verb == protocol.ABORT
    assert told.reason == f"{protocol.ABORT_PREEMPTED}: for {FAIR}"
    run.tick(1.0)
    assert len(run.moving()) == 1  # one each: nothing more moves

    # The node joined the other run (its live file says so): still nothing more moves.
    run.other_run("bob", nodes=(name,))
    run.tick(1.0 + 30.0)
    assert len(run.moving()) == 1
    run.served.session.audit.flush(force=True)
    audit = run.home.audit_log(run.run_id).read_text()
    assert f"node {name} chosen to leave for {FAIR}" in audit
    live = json.loads(run.home.live(0).read_text())
    assert any(FAIR in m["text"] for m in live["moves"])


def test_weights_two_to_one_on_three_nodes(served: Callable[..., Served]) -> None:
    """bob (weight 1) holds all three nodes; alice (weight 2, master.conf's user_shares)
    is owed two of them."""
    run = served("user bob gs", user_shares="alice=2 bob=1")
    run.join("n1", "n2", "n3")
    run.other_run("alice")
    run.tick(1.0)
    assert sorted(run.moving().values()) == [FAIR, FAIR]
    run.tick(1.0)
    assert len(run.moving()) == 2  # 2:1 reached: no third


def test_a_share_option_outweighs_the_users_weight(served: Callable[..., Served]) -> None:
    """The served run's share=2 against alice's 2: equal, so of three nodes the served run
    keeps the odd one."""
    run = served("user bob gs share=2", user_shares="alice=2 bob=1")
    run.join("n1", "n2", "n3")
    run.other_run("alice")
    run.tick(1.0)
    assert list(run.moving().values()) == [FAIR]


def test_a_run_whose_list_is_being_made_gets_one_node(served: Callable[..., Served]) -> None:
    run = served("user ann gs")
    run.join("n1", "n2", "n3")
    run.other_run("bob", live=False)  # no live file yet: it can use one node
    run.tick(1.0)
    assert list(run.moving().values()) == [FAIR]


def test_a_priority_2_run_still_gives_to_both_priority_0_runs(tmp_path: Path) -> None:
    """Cross-priority preemption with two priority-0 lanes running: a nightly run's master
    sends nodes to each (the look itself, cluster.master.run.preemption)."""
    from cluster.master.run.preemption import Preemption
    from cluster.master.state.runstate import RunState
    from cluster.runoptions import RunOptions
    from cluster.wire.protocol import Request

    home = Home(tmp_path / "home")
    home.create()
    cfg = Config().with_changes(home=home.root)
    for lane, run_id, user in ((0, MINE, "ann"), (USER_LANE, OTHER, "bob")):
        write_job_start(home.job_start(lane), JobStart(
            id=run_id, priority=0, queue=f"user {user} gs", kind="user", ref=user,
            products=("gs",), tree=user, source=user, build="true", tests="tests",
            lane_number=lane))
    options = RunOptions(job_timeout=3600.0)
    state = RunState("20250101000000-p2-abcd", JOBS, 0, policy=placement.RunPolicy.of(options))
    state.options = options
    for name in ("a", "b", "c", "d"):
        call = Request(node=name, job_id=state.run_id, built=state.run_id, slots=1)
        assert state.handle(call, 0, session=name).reply.verb == protocol.BUILD
        assert state.handle(call, 0, session=name).reply.verb == protocol.JOBS
    look = Preemption(cfg, home, 2, FakeClock())
    assert len(look.tick(state, 1.0)) == 2
    assert sorted(state.nodes[n.name].moving_to for n in state.moving()) == [
        f"run {MINE} (priority 0)", f"run {OTHER} (priority 0)"]
