"""The master's side of the admin's steering: disabled nodes in a run, stop requests, the
monitor's list of disabled nodes, run.info's summary lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.home import Home
from cluster.master.daemon.offers import jobs_for
from cluster.master.end import finish
from cluster.master.end.endrun import run_info
from cluster.master.files import abort
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.files.nodefiles import disabled_nodes, is_disabled
from cluster.master.state.admission import disabled_reason
from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.node.mastercontact import is_final_abort
from cluster.records import Job, JobResult
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Request

MD5 = "0123456789abcdef0123456789abcdef"
RUN = "20261123000000-p0-abcd"


def jobs(n: int) -> list[Job]:
    return [Job(f"t{i:03d}.ps", f"__temp__/t{i:03d}.log", f"echo {i}") for i in range(n)]


def req(node: str, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)  # a node past its build says so in every call
    kw.setdefault("slots", 2)
    return Request(node=node, **kw)  # type: ignore[arg-type]


def names(reply: protocol.Reply) -> list[str]:
    return [line.split(" ", 1)[0] for line in reply.jobs]


# ------------------------------------------------------------------------ disabled nodes
def test_a_disabled_node_gets_abort_and_no_work() -> None:
    state = RunState(RUN, jobs(10), 0.0)
    state.set_disabled({"bad"})
    out = state.handle(req("bad"), 0.0)
    assert out.reply == protocol.Reply(protocol.ABORT, reason="node bad is disabled")
    assert "bad" not in state.nodes and state.lost == []
    assert state.handle(req("good"), 0.0).reply.verb == protocol.BUILD


def test_a_node_disabled_mid_run_hands_its_jobs_back_and_is_not_lost() -> None:
    state = RunState(RUN, jobs(12), 0.0, Settings(batch_per_slot=2))
    for node in ("a", "b"):
        state.handle(req(node), 0.0)
    held = names(state.handle(req("a"), 1.0).reply)
    assert held
    state.set_disabled(["a"])
    # Its next call carries one finished job: the result is kept, the rest go back.
    done = JobResult(held[0], 0, 0.1, 0, 0, MD5, "gs")
    out = state.handle(req("a", results=(done,), pending=len(held) - 1,
                           running=len(held) - 1), 2.0)
    assert out.reply.reason == "node a is disabled"
    assert out.new_results and out.new_results[0].name == held[0]
    assert state.nodes["a"].state is NodeState.GONE
    assert state.lost == [] and state.left[0].startswith("a (disabled; ")
    got = names(state.handle(req("b"), 2.0).reply)
    assert held[1] in got  # its unfinished jobs are handed out first
    # Enabled again: it rejoins as a new node.
    state.set_disabled([])
    assert state.handle(req("a"), 3.0).reply.verb == protocol.BUILD


def test_result_errors_and_timeouts_are_counted_per_node() -> None:
    state = RunState(RUN, jobs(8), 0.0)
    state.handle(req("a"), 0.0)
    held = names(state.handle(req("a", slots=8), 0.0).reply)
    codes = [0, 1, 3, 4, 10, -1, 0, 8][:len(held)]
    lines = tuple(f"{name} {code} 0.10 0.00 0.00 0 gs" for name, code in zip(held, codes,
                                                                          strict=True))
    state.handle(req("a", slots=8, result_lines=lines), 1.0)
    node = state.nodes["a"]
    assert node.results == len(codes)
    assert node.errors == sum(1 for c in codes if c != 0)
    assert node.timeouts == sum(1 for c in codes if c in (3, 4))
    assert state.errors == node.errors


# ------------------------------------------------------------------------ stop requests
def test_a_stop_request_names_who_and_why(tmp_path: Path) -> None:
    home = Home(tmp_path)
    assert abort.stop_reason(home, RUN) is None
    abort.request_stop(home, RUN, "alice@host", "disk full")
    assert home.stop_request(RUN).read_text() == "alice@host\ndisk full\n"
    assert abort.stop_reason(home, RUN) == "stopped by alice@host: disk full"
    abort.request_stop(home, RUN, "bob")
    assert abort.stop_reason(home, RUN) == "stopped by bob"


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xff\xfe\x00\n"])
def test_an_empty_or_garbled_stop_file_still_stops(tmp_path: Path, content: bytes) -> None:
    home = Home(tmp_path)
    path = home.stop_request(RUN)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    reason = abort.stop_reason(home, RUN)
    assert reason is not None and reason.startswith("stopped by ")
    if not content.strip():
        assert reason == "stopped by an admin"


def test_a_stop_file_is_cut_to_one_sane_line(tmp_path: Path) -> None:
    home = Home(tmp_path)
    path = home.stop_request(RUN)
    path.parent.mkdir(parents=True)
    path.write_text("eve\x1b[31m " + "x" * 500 + "\n" + "why " * 400 + "\nthird line\n")
    reason = abort.stop_reason(home, RUN)
    assert reason is not None and "\x1b" not in reason and "\n" not in reason
    who, _, why = reason.removeprefix("stopped by ").partition(": ")
    assert len(who) <= abort.STOP_WHO_MAX and len(why) <= abort.STOP_REASON_MAX
    assert "third" not in reason


def test_a_stop_folder_instead_of_a_file_still_stops(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.stop_request(RUN).mkdir(parents=True)
    assert abort.stop_reason(home, RUN) == "stopped by an admin"


# ------------------------------------------------------------------------ the monitor's side
def test_disabled_nodes_are_the_down_files(tmp_path: Path) -> None:
    home = Home(tmp_path)
    assert disabled_nodes(home) == frozenset()  # no nodes/ yet
    home.create()
    for name in ("n1.up", "n1.status", "n2.down", "n3.down", ".n4.down.tmp"):
        (home.nodes / name).write_text("disabled by alice at 2026-11-23T00:00:00Z\n")
    assert disabled_nodes(home) == {"n2", "n3"}
    assert is_disabled(home, "n2") and not is_disabled(home, "n1")


def test_a_disabled_node_is_told_no_run_waits(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    home.job_start(0).write_text(f"id {RUN}\n")
    assert jobs_for(home, "n1") == [(0, RUN)]
    home.node_down("n1").write_text("disabled by alice at 2026-11-23T00:00:00Z\n")
    assert jobs_for(home, "n1") == [] and jobs_for(home, "n2") == [(0, RUN)]


# ------------------------------------------------------------------------ run.info
def test_run_info_ends_with_the_summary_and_still_parses(tmp_path: Path) -> None:
    start = JobStart(id=RUN, priority=0, queue="user alice gs", kind="user", ref="alice",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="b",
                     tests="tests", secret="s" * 64)
    record = EndRecord.create(tmp_path, start, Outcome.DONE, elapsed=12.34)
    text = run_info(start, record, 3, finish.Report("text", differences=4, errors=1))
    assert text.endswith("elapsed 12.3\noutcome done\nnodes 3\ndifferences 4\nerrors 1\n")
    assert "secret" not in text
    assert JobStart.parse(text).id == RUN
    bare = run_info(start, record, 0, finish.Report("text"))
    assert bare.endswith("outcome done\nnodes 0\n")


def test_run_info_says_why_a_run_that_is_not_done_ended(tmp_path: Path) -> None:
    """localcluster.py's exit line reads it (cluster.localrunend.run_end)."""
    from cluster.localrunend import run_end

    start = JobStart(id=RUN, priority=0, queue="user alice gs", kind="user", ref="alice",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="b",
                     tests="tests", secret="s" * 64)
    record = EndRecord.create(tmp_path, start, Outcome.FAILED,
                              reason="node n1 failed with code -1: build failed:\n x.c:1: "
                                     "error: y", elapsed=1.0)
    text = run_info(start, record, 0, finish.Report("text"))
    assert text.endswith("outcome failed\nreason node n1 failed with code -1: build failed: "
                         "x.c:1: error: y\nnodes 0\n")
    (tmp_path / "run.info").write_text(text)
    end = run_end(tmp_path)
    assert not end.complete
    assert end.describe() == "failed: node n1 failed with code -1: build failed: x.c:1: error: y"


def test_the_node_side_reads_these_aborts_as_meant() -> None:
    """run.py: a disabled node's ABORT may pass (exit 4; the monitor keeps it away while
    it is disabled); an admin's stop ends the run for the node for good (exit 0)."""
    assert not is_final_abort(disabled_reason("n1"))
    assert is_final_abort(f"{protocol.RUN_ABORTED}: stopped by alice@host: disk full")
