"""Which ABORTs end a run for a node for good, and which let it rejoin: a node told
that its master was replaced exits NODE_EXIT_ABORTED, so clusterpull brings it back to the
successor; a user's abort, a failed run and a finished one stay final."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import NODE_EXIT_ABORTED, NODE_EXIT_DONE, NODE_EXIT_FAILED
from cluster.master.run.servedrun import REPLACED, USER_ABORT
from cluster.master.state.runstate import RunState
from cluster.node.mastercontact import FINAL_ABORTS, REJOIN_ABORTS, is_final_abort
from cluster.node.noderun import RunLoop
from cluster.records import Job
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request
from tests.helpers import open_test_run

RUN = "run-1"


@pytest.mark.parametrize("reason, final", [
    ("run complete", True),
    ("unsuitable: missing tools: gs", True),
    ("wrong job id, running 20260101000000-p0-beef", True),
    ("run aborted", True),  # the node whose failure -1 aborted the run
    ("run aborted: node n2 failed with code -1: build failed", True),
    (f"run aborted: {USER_ABORT}", True),
    ("run aborted: run stopped: max_run_time", True),
    ("dropped after failure 1", True),
    ("run aborted: clustermaster replaced", False),
    (" run aborted: clustermaster replaced ", False),
    ("run aborted: clustermaster replaced, and more", True),  # matched whole, not a prefix
    ("goodbye", False),
    ("bad request: no node header", False),
    ("", False),
])
def test_final_or_not(reason: str, final: bool) -> None:
    assert is_final_abort(reason) is final


def test_the_rejoin_reasons_would_otherwise_be_final() -> None:
    """Each exception is needed: it starts with a final prefix."""
    assert all(reason.startswith(FINAL_ABORTS) for reason in REJOIN_ABORTS)


def _abort_reason(fatal: str) -> str:
    """The reason a node reads, as the real run state and wire format make it."""
    state = RunState(RUN, [Job("t1.ps.ppmraw.72.0", "__temp__/t1.log", "true")], 0)
    call = Request(node="a", job_id=RUN, built=RUN, slots=1)
    assert state.handle(call, 0).reply.verb == protocol.BUILD
    state.fatal = fatal
    reply = state.handle(call, 1).reply
    assert reply.verb == protocol.ABORT
    return protocol.parse_reply(protocol.format_reply(reply)).reason


def test_the_masters_replaced_reason_is_not_final() -> None:
    assert not is_final_abort(_abort_reason(REPLACED))


def test_the_masters_user_abort_reason_is_final() -> None:
    assert is_final_abort(_abort_reason(USER_ABORT))


class _Pool:
    """The slot pool's kill_all, running and doom_waiting, all _obey needs of it."""

    killed = 0
    given_back = 0

    def kill_all(self) -> None:
        self.killed += 1

    def doom_waiting(self) -> list[str]:
        self.given_back += 1
        return []

    def running(self) -> int:
        return 1  # one job of the run still running


def _obey(tmp_path: Path, reason: str, failure: int = 0) -> int | None:
    cfg = Config(node_name="n1", work_dir=tmp_path / "work")
    ctx = open_test_run(tmp_path / "home", cfg)
    pool = _Pool()
    loop = RunLoop(ctx, "tools=md5sum", pool)  # type: ignore[arg-type]
    ctx.status.failure = failure
    try:
        code = loop.contact._obey(Reply(protocol.ABORT, reason=reason))
    finally:
        ctx.node_log.close()
    assert pool.killed == 1  # every ABORT kills what runs
    return code


@pytest.mark.parametrize("reason, code", [
    (f"run aborted: {REPLACED}", NODE_EXIT_ABORTED),
    (f"run aborted: {USER_ABORT}", NODE_EXIT_DONE),
    ("run complete", NODE_EXIT_DONE),
    ("goodbye", NODE_EXIT_ABORTED),
])
def test_exit_codes(tmp_path: Path, reason: str, code: int) -> None:
    assert _obey(tmp_path, reason) == code


def test_a_failed_node_exits_failed_even_when_the_master_was_replaced(tmp_path: Path) -> None:
    assert _obey(tmp_path, f"run aborted: {REPLACED}", failure=1) == NODE_EXIT_FAILED


def test_the_named_reasons_keep_their_wire_text_and_their_meaning() -> None:
    """Master and node share the ABORT reasons of cluster.wire.protocol: their text on the
    wire is unchanged, the final ones end the run for a node, the others do not."""
    assert protocol.FINAL_ABORTS == ("run complete", "unsuitable", "wrong job id",
                                     "run aborted", "dropped")
    assert protocol.REJOIN_ABORTS == ("run aborted: clustermaster replaced",)
    assert FINAL_ABORTS is protocol.FINAL_ABORTS and REJOIN_ABORTS is protocol.REJOIN_ABORTS
    for final in protocol.FINAL_ABORTS:
        assert is_final_abort(final) and is_final_abort(f"{final}: why")
    for passing in (protocol.ABORT_GOODBYE, protocol.ABORT_BUSY, protocol.ABORT_MASTER_ERROR,
                    f"{protocol.ABORT_REFUSED}: line too long",
                    f"{protocol.ABORT_BAD_REQUEST}: no node header"):
        assert not is_final_abort(passing)
    assert (protocol.ABORT_BUSY, protocol.ABORT_MASTER_ERROR, protocol.ABORT_GOODBYE) == (
        "master busy, try again", "master error", "goodbye")


def test_preempted_is_not_final_and_kills_nothing(tmp_path: Path) -> None:
    """ABORT ``preempted: ...``: the node drops the jobs it has not started, lets those it
    runs finish and stays in the run until they did (docs/protocol.md, "Preemption at job
    boundaries")."""
    reason = f"{protocol.ABORT_PREEMPTED}: for run 20260101000000-p0-beef (priority 0)"
    assert not is_final_abort(reason)
    cfg = Config(node_name="n1", work_dir=tmp_path / "work")
    ctx = open_test_run(tmp_path / "home", cfg)
    pool = _Pool()
    loop = RunLoop(ctx, "tools=md5sum", pool)  # type: ignore[arg-type]
    loop.jobs.queue.append(Job("t2.ps.ppmraw.72.0", "__temp__/t2.log", "true"))
    try:
        assert loop.contact._obey(Reply(protocol.ABORT, reason=reason)) is None
    finally:
        ctx.node_log.close()
    assert pool.killed == 0 and not loop.jobs.queue
    assert pool.given_back == 1  # the job waiting in a slot's shell is not run either
    assert loop.contact.leaving_for == reason
    ctx.status.next_contact = 10.0
    assert not loop.contact.due(0.0)  # no call for more work on its way out
    assert loop.contact.leave_if_done(0.0) is None  # its job still runs


def test_a_failed_node_told_preempted_leaves_at_once(tmp_path: Path) -> None:
    assert _obey(tmp_path, f"{protocol.ABORT_PREEMPTED}: for run x (priority 0)",
                 failure=1) == NODE_EXIT_FAILED
