"""Preemption, the master's side (docs/protocol.md, "Preemption at job boundaries"): a
served priority-2 run, a scripted node over real TCP, and a priority-0 run's job.start
written into the home.  The master tells its node to leave at its next job boundary; the
jobs the node has not started go back to the front of the list at once, the result of the
job it was running is still taken, its leaving call drops it without counting it lost, and
every step is in the audit trail and the live file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.master.run.runsetup import write_job_start
from cluster.master.state.nodeinfo import NodeState
from cluster.records import Job
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from tests.component.test_served_run import MD5, PRIORITY, Opened

JOBS = [Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", f"echo {i} | md5sum")
        for i in range(1, 9)]
URGENT = "20250101000100-p0-beef"


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Callable[[str], Opened]]:
    runs: list[Opened] = []

    def open_run(line: str) -> Opened:
        runs.append(Opened(tmp_path / "home", line, JOBS))
        return runs[-1]

    yield open_run
    for run in runs:
        run.close()


def push_waits(run: Opened) -> None:
    """A priority-0 run's job.start, as its master writes it once its source is ready."""
    write_job_start(run.home.job_start(0), JobStart(
        id=URGENT, priority=0, queue="user ann gs", kind="user", ref="ann", products=("gs",),
        tree="ann", source="ann", build="true", tests="tests"))


def test_a_node_told_to_leave_gives_back_its_unstarted_jobs_and_finishes_the_rest(
        opened: Callable[[str], Opened]) -> None:
    run = opened("auto nightly gs")
    state = run.served.state
    assert run.answered() == b"BUILD\n"
    reply = protocol.parse_reply(run.answered("slots 1", "jobs 0 0"))
    held = [Job.parse(line).name for line in reply.jobs]
    assert len(held) >= 2, reply  # one to run, at least one waiting on the node
    assert run.tick(1.0) is None
    assert state.nodes["n1"].moving_to == ""  # nothing more urgent: it stays

    push_waits(run)
    assert run.tick(1.0) is None  # the look at the more urgent runs
    assert state.nodes["n1"].moving_to == f"run {URGENT} (priority 0)"
    # Its next call: one job running, the rest not started.
    first = protocol.parse_reply(run.answered("slots 1", f"jobs {len(held) - 1} 1"))
    assert first.verb == protocol.ABORT
    assert first.reason == f"preempted: for run {URGENT} (priority 0)"
    assert state.pending[:len(held) - 1] == held[1:]  # at the front of the list, at once
    assert list(state.nodes["n1"].held) == [held[0]]  # the running one stays its own
    waiting = protocol.parse_reply(run.answered("slots 1", "jobs 0 1"))
    assert waiting.verb == protocol.CONTINUE  # no new work for a node on its way out
    done = protocol.parse_reply(run.answered(
        "slots 1", "jobs 0 0", f"result {held[0]} 0 0.10 0.00 0.00 {MD5} gs"))
    assert held[0] in state.results
    # Nothing running: told again (had it missed the first reply, it would learn it now);
    # nothing more is put back.
    assert done == first and state.pending[:len(held) - 1] == held[1:]
    # Its leaving call, after uploading its logs.
    bye = protocol.parse_reply(run.answered_leaving("slots 1", "jobs 0 0"))
    assert bye.verb == protocol.ABORT and bye.reason == protocol.ABORT_GOODBYE
    node = state.nodes["n1"]
    assert node.state is NodeState.GONE and not state.lost
    assert state.left == [f"n1 (moved to run {URGENT} (priority 0); 0 unfinished jobs "
                          "put back)"]
    assert state.pending == held[1:] + [j.name for j in JOBS if j.name not in held]

    assert run.tick(1.0) is None  # the moves into the audit trail and the live file
    run.served.session.audit.flush(force=True)
    audit = run.home.audit_log(run.run_id).read_text()
    moves = [line.split(" move ", 1)[1] for line in audit.splitlines() if " move " in line]
    assert moves == [f"node n1 chosen to leave for run {URGENT} (priority 0)",
                     f"node n1 told to leave for run {URGENT} (priority 0) at its next job "
                     f"boundary: {len(held) - 1} unstarted jobs put back, 1 to finish",
                     f"node n1 left for run {URGENT} (priority 0)"]
    assert "given ABORT: preempted: for run" in audit
    run.tick(1.0)
    live = json.loads(run.home.live(PRIORITY).read_text())
    assert [m["text"] for m in live["moves"]] == moves


def test_no_node_moves_below_the_runs_min_nodes(
        opened: Callable[[str], Opened]) -> None:
    run = opened("auto nightly gs min_nodes=1")
    state = run.served.state
    assert run.answered() == b"BUILD\n"
    assert protocol.parse_reply(run.answered("slots 1", "jobs 0 0")).verb == protocol.JOBS
    push_waits(run)
    assert run.tick(1.0) is None
    assert state.nodes["n1"].moving_to == ""  # its one node is its min_nodes
    assert protocol.parse_reply(run.answered("slots 1", "jobs 1 1")).verb != protocol.ABORT


def test_a_node_is_sent_to_one_urgent_run_once_and_an_every_node_run_keeps_its_nodes(
        tmp_path: Path) -> None:
    """The look itself (cluster.master.run.preemption) on a home with a waiting push: no
    node moves while an idle node is up, or once one says it runs the push; a node that
    came back while the push still waits is not sent again, the need goes to another node
    once the first no longer counts as on its way (30 s); an every_node run gives none."""
    from cluster.config import Config
    from cluster.home import Home
    from cluster.master.model.placement import RunPolicy, pinned_name
    from cluster.master.run.preemption import ON_THE_WAY, Preemption
    from cluster.master.state.runstate import RunState
    from cluster.runoptions import RunOptions
    from cluster.runtime.clock import FakeClock
    from cluster.wire.protocol import Request

    home = Home(tmp_path / "home")
    home.create()
    cfg = Config().with_changes(home=home.root)
    clock = FakeClock()

    def state_with(nodes: tuple[str, ...], every_node: bool = False) -> RunState:
        options = RunOptions(job_timeout=3600.0, every_node=every_node)
        jobs = [Job(pinned_name(job.name, name), job.logfile, job.command)
                for job in JOBS for name in nodes] if every_node else JOBS
        state = RunState("20250101000000-p2-abcd", jobs, 0, policy=RunPolicy.of(options))
        state.options = options
        for name in nodes:
            call = Request(node=name, job_id=state.run_id, built=state.run_id, slots=1)
            assert state.handle(call, 0, session=name).reply.verb == protocol.BUILD
            assert state.handle(call, 0, session=name).reply.verb == protocol.JOBS
        return state

    write_job_start(home.job_start(0), JobStart(
        id=URGENT, priority=0, queue="user ann gs", kind="user", ref="ann", products=("gs",),
        tree="ann", source="ann", build="true", tests="tests"))
    look = Preemption(cfg, home, PRIORITY, clock)
    state = state_with(("a", "b"))
    # An idle node is up: it joins the push on its own, so none of this run's moves.
    home.nodes.mkdir(parents=True, exist_ok=True)
    (home.nodes / "spare.status").write_text("idle\n")
    (home.nodes / "spare.up").touch()
    assert look.tick(state, 0.0) == [] and not state.moving()
    (home.nodes / "spare.status").write_text(f"running run {URGENT} (priority 0)\n")
    assert look.tick(state, 1.0) == [] and not state.moving()  # there now: enough
    (home.nodes / "spare.up").unlink()
    (home.nodes / "spare.status").unlink()
    assert look.tick(state, 2.0) and [n.name for n in state.moving()] == ["a"]
    # a left (its leaving call) and came back as a new process while the push waits.
    call = Request(node="a", job_id=state.run_id, built=state.run_id, slots=1, leaving=True)
    state.handle(call, 2.0, session="a")
    assert state.nodes["a"].state is NodeState.GONE
    again = Request(node="a", job_id=state.run_id, built=state.run_id, slots=1)
    assert state.handle(again, 3.0, session="a2").reply.verb == protocol.BUILD
    assert state.handle(again, 3.0, session="a2").reply.verb == protocol.JOBS
    assert look.tick(state, 5.0) == []  # a counts as on its way for ON_THE_WAY
    assert look.tick(state, 2.0 + ON_THE_WAY)
    assert [n.name for n in state.moving()] == ["b"]  # never a twice

    pinned = Preemption(cfg, home, PRIORITY, clock)
    every = state_with(("c", "d"), every_node=True)
    assert pinned.tick(every, 1.0) == [] and not every.moving()
