"""RunState.retry: a sweep task's try not taken goes back to the front of the list, and
the node that tried it is not given it again while a live ready node that has not exists."""

from __future__ import annotations

from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import PAUSE_FORGIVEN, RunState
from cluster.records import Job, JobResult
from cluster.wire import protocol
from cluster.wire.protocol import Request

MD5 = "0123456789abcdef0123456789abcdef"
RUN = "run-1"


def jobs(n: int) -> list[Job]:
    return [Job(f"task{i:02d}", f"__temp__/task{i:02d}.log", f"echo {i}") for i in range(n)]


def req(node: str, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)
    kw.setdefault("slots", 1)
    return Request(node=node, **kw)  # type: ignore[arg-type]


def names(reply: protocol.Reply) -> list[str]:
    return [line.split(" ", 1)[0] for line in reply.jobs]


def ready(state: RunState, node: str, now: float = 0.0) -> protocol.Reply:
    assert state.handle(req(node), now).reply.verb == protocol.BUILD
    return state.handle(req(node), now).reply


def done(name: str, node: str) -> JobResult:
    return JobResult(name, 0, 0.1, 0, 0, MD5, "sweep", node)


def small() -> Settings:
    return Settings(batch_per_slot=1, speculate_tail=False)


def test_a_retried_job_goes_to_another_ready_node_first() -> None:
    state = RunState(RUN, jobs(4), 0, small())
    first_a = names(ready(state, "a"))
    assert first_a == ["task00"]
    assert names(ready(state, "b")) == ["task01"]
    # a's try of task00 is not valid: withheld from the request, put back.
    state.retry("a", "task00")
    assert "task00" not in state.nodes["a"].held
    assert state.holders[0] == 0 and state.running == 1
    assert state.pending[0] == "task00"
    assert state.tried_by("task00") == {"a"}
    # a asks for work: task00 is skipped for it (b has not tried it) and stays first.
    reply_a = state.handle(req("a", pending=0, running=0), 1).reply
    assert names(reply_a) == ["task02"]
    assert state.pending[0] == "task00"
    # b finishes its job and asks: it gets task00.
    reply_b = state.handle(req("b", results=(done("task01", "b"),)), 2).reply
    assert names(reply_b) == ["task00"]


def test_the_node_that_tried_gets_it_when_no_other_ready_node_is_there() -> None:
    state = RunState(RUN, jobs(2), 0, small())
    assert names(ready(state, "a")) == ["task00"]
    state.handle(req("b"), 0)  # b is still building: it does not count
    state.retry("a", "task00")
    reply = state.handle(req("a"), 1).reply
    assert names(reply) == ["task00"]


def test_a_dead_untried_node_no_longer_keeps_the_job_from_the_one_that_tried() -> None:
    settings = Settings(batch_per_slot=1, speculate_tail=False, heartbeat_timeout=10)
    state = RunState(RUN, jobs(3), 0, settings)
    assert names(ready(state, "a")) == ["task00"]
    assert names(ready(state, "b")) == ["task01"]
    state.retry("a", "task00")
    assert names(state.handle(req("a"), 1).reply) == ["task02"]
    # b goes silent and is dropped: its job goes to the front too.
    state.handle(req("a", pending=1, running=0), 5)
    state.tick(14)
    assert state.nodes["b"].state is NodeState.GONE
    assert state.nodes["a"].state is NodeState.READY
    reply = state.handle(req("a", results=(done("task02", "a"),)), 15).reply
    assert names(reply) == ["task01"]  # b's job, put back in front of the retried one
    reply = state.handle(req("a", results=(done("task01", "a"),)), 16).reply
    assert names(reply) == ["task00"]  # no other ready node: a takes it again


def test_a_disabled_node_does_not_count_as_one_to_wait_for() -> None:
    state = RunState(RUN, jobs(3), 0, small())
    assert names(ready(state, "a")) == ["task00"]
    assert names(ready(state, "b")) == ["task01"]
    state.retry("a", "task00")
    state.set_disabled(["b"])
    assert names(state.handle(req("a"), 1).reply) == ["task00"]


def test_retry_of_a_settled_or_unknown_job_changes_nothing() -> None:
    state = RunState(RUN, jobs(2), 0, small())
    assert names(ready(state, "a")) == ["task00"]
    state.handle(req("a", results=(done("task00", "a"),)), 1)
    before = (list(state.front), state.running, dict(state.nodes["a"].held))
    state.retry("a", "task00")
    state.retry("a", "no-such-task")
    assert (list(state.front), state.running, dict(state.nodes["a"].held)) == before
    assert state.tried == {}


def test_retry_of_a_job_already_back_in_the_list_does_not_queue_it_twice() -> None:
    settings = Settings(batch_per_slot=1, speculate_tail=False, heartbeat_timeout=10)
    state = RunState(RUN, jobs(2), 0, settings)
    assert names(ready(state, "a")) == ["task00"]
    state.tick(20)  # a is dropped: task00 is put back
    assert list(state.front) == ["task00"]
    state.retry("a", "task00")  # its late, invalid result
    assert list(state.front) == ["task00"]


def test_a_successor_marks_the_tries_without_handing_the_job_out_twice() -> None:
    # A fresh state (a successor master): nothing is handed out yet, the cursor is at 0.
    state = RunState(RUN, jobs(3), 0, small())
    state.retry("a", "task01")
    assert list(state.front) == []  # handed out from the cursor, once
    assert state.tried_by("task01") == {"a"}
    handed = names(ready(state, "b"))
    for now in range(1, 4):
        reply = state.handle(req("b", results=tuple(done(n, "b") for n in handed[-1:])),
                             now).reply
        handed += names(reply)
    assert handed == ["task00", "task01", "task02"]  # each once, in list order
    assert state.all_results_in


def test_the_usual_batch_leaves_the_tried_table_empty() -> None:
    state = RunState(RUN, jobs(100), 0, Settings(batch_per_slot=10))
    reply = ready(state, "a")
    state.handle(req("a", results=tuple(done(n, "a") for n in names(reply))), 1)
    assert state.tried == {}


def test_pause_gives_the_nodes_back_the_time_the_master_was_busy() -> None:
    settings = Settings(batch_per_slot=1, speculate_tail=False, heartbeat_timeout=10)
    state = RunState(RUN, jobs(2), 0, settings)
    ready(state, "a", now=0)
    state.pause(PAUSE_FORGIVEN / 2)  # too short to matter
    assert state.nodes["a"].last_seen == 0
    state.pause(15)
    assert state.tick(20) == []  # 20 s silent, 15 of them the master's own
    assert state.nodes["a"].state is NodeState.READY
    assert state.tick(26) and state.nodes["a"].state is NodeState.GONE


def test_a_node_is_not_given_a_tail_copy_of_a_task_whose_try_it_made() -> None:
    # Two jobs: a holds task00 and tries it (invalid); b takes it again.  Nothing else is
    # left, so an idle a would get tail copies: never of task00, which it tried.
    state = RunState(RUN, jobs(2), 0, Settings(batch_per_slot=1, speculate_tail=True))
    assert names(ready(state, "a")) == ["task00"]
    assert names(ready(state, "b")) == ["task01"]
    state.retry("a", "task00")
    reply_b = state.handle(req("b", results=(done("task01", "b"),)), 1).reply
    assert names(reply_b) == ["task00"]  # b takes the retry
    # a, idle, asks again and again while b is slow: no copy of task00 for it.
    for now in range(2, 40, 5):
        reply_a = state.handle(req("a", pending=0, running=0), now).reply
        assert "task00" not in names(reply_a), now
    assert state.holders[0] == 1
