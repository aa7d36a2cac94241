"""Programs a node's build did not make: job.start's ``programs``, the ``unbuilt``
header, the node's check, the master's verdict (the node's fault when another node's build
made the program, the tree's when none did), the jobs not run, and what the report and
tables say."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.errors import ProtocolError
from cluster.master.end import finish
from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.node.noderun import RunLoop
from cluster.records import Job, JobResult
from cluster.report import compare as report
from cluster.report.tab import TabRow, merged_lines
from cluster.wire import protocol
from cluster.wire.jobstart import MAX_PROGRAMS, JobStart
from cluster.wire.protocol import Request
from tests.helpers import open_test_run

RUN = "run-1"
MD5 = "0123456789abcdef0123456789abcdef"


# ------------------------------------------------------------------ job.start
def _start(**kw: object) -> JobStart:
    values: dict[str, object] = dict(id=RUN, priority=0, queue="user alice ghostpdl gs pcl",
                                     kind="user", ref="alice", products=("gs", "pcl"),
                                     tree="ghostpdl", source="runs/x/source/ghostpdl",
                                     build="make", tests="tests")
    values.update(kw)
    return JobStart(**values)  # type: ignore[arg-type]


def test_job_start_programs_round_trip_and_are_left_out_when_empty() -> None:
    start = _start(programs=("gpcl6", "gs"))
    text = start.format()
    assert "programs gpcl6,gs\n" in text
    assert JobStart.parse(text) == start
    plain = _start()
    assert "programs" not in plain.format()
    assert JobStart.parse(plain.format()).programs == ()


@pytest.mark.parametrize("value, words", [
    ("gs,bin/gpcl6", "'bin/gpcl6' is not 1-64 of"),
    ("gs,gs", "names a program twice"),
    (",".join(f"p{i}" for i in range(MAX_PROGRAMS + 1)), f"more than {MAX_PROGRAMS}"),
])
def test_job_start_refuses_bad_programs_naming_the_key(value: str, words: str) -> None:
    text = _start().format() + f"programs {value}\n"
    with pytest.raises(ValueError, match="job.start programs") as caught:
        JobStart.parse(text)
    assert words in str(caught.value)


# ------------------------------------------------------------------ the unbuilt header
def test_unbuilt_header_parses_formats_and_round_trips() -> None:
    data = b"node a\nid run-1\nbuilt run-1\nunbuilt gpcl6,gxps\nOK\n"
    for canonical in (False, True):
        req = protocol.parse_request(data, canonical=canonical)
        assert req.unbuilt == ("gpcl6", "gxps") and req.built == RUN
    again = protocol.parse_request(protocol.format_request(
        protocol.parse_request(data)))
    assert again.unbuilt == ("gpcl6", "gxps")
    assert b"unbuilt" not in protocol.format_request(Request(node="a", built=RUN))


@pytest.mark.parametrize("value, words", [
    ("gpcl6;rm", "'gpcl6;rm' is not 1-64 of"),
    ("x" * 65, "is not 1-64 of"),
    ("gs,gs", "names a program twice"),
    (",".join(f"p{i}" for i in range(MAX_PROGRAMS + 1)), f"more than {MAX_PROGRAMS}"),
])
def test_a_bad_unbuilt_header_is_refused_naming_it_and_what_it_takes(value: str,
                                                                     words: str) -> None:
    data = f"node a\nid run-1\nbuilt run-1\nunbuilt {value}\nOK\n".encode()
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_request(data)
    message = str(caught.value)
    assert "header 'unbuilt' takes a comma list of the programs the build did not make" \
        in message and words in message and "line 4" in message


# ------------------------------------------------------------------ the node's check
def test_the_node_reports_the_programs_its_build_did_not_make(tmp_path: Path) -> None:
    cfg = Config(node_name="n1", work_dir=tmp_path / "work")
    ctx = open_test_run(tmp_path / "home", cfg, _start(programs=("gpcl6", "gs", "gxps")))
    node = RunLoop(ctx, "tools=md5sum", _IdlePool())  # type: ignore[arg-type]
    bin_dir = tmp_path / "src" / "bin"
    bin_dir.mkdir(parents=True)
    for name, mode in (("gs", 0o755), ("gxps", 0o644)):  # gxps: there, not executable
        (bin_dir / name).write_text("#!/bin/sh\n")
        os.chmod(bin_dir / name, mode)
    node.build.bin_dir = bin_dir
    node.build.built = True
    with ctx.node_log:
        node.build.check_programs(ctx.start.programs)
    assert node.build.unbuilt == ("gpcl6", "gxps")
    assert node.build.bins_checked == {"gs"}
    assert (f"the build made no {bin_dir / 'gpcl6'}, {bin_dir / 'gxps'}"
            in ctx.node_log_path.read_text())
    assert node.contact.request(False).unbuilt == ("gpcl6", "gxps")
    node.build.built = False  # not built (yet): nothing said about programs
    assert node.contact.request(False).unbuilt == ()


class _IdlePool:
    def running(self) -> int:
        return 0


# ------------------------------------------------------------------ the master
def _jobs() -> list[Job]:
    """Four gs jobs and three pcl jobs (gpcl6, one of them two-stage through gs), mixed."""
    out = []
    for i in range(4):
        out.append(Job(f"a{i}.ps.ppmraw.72.0", f"__temp__/a{i}.log",
                       f"__bin__/gs -sOutputFile=x __tests__/a{i}.ps"))
        if i < 3:
            tail = " ; __bin__/gs -sOutputFile=y x.pdf" if i == 2 else ""
            out.append(Job(f"b{i}.pcl.ppmraw.72.0", f"__temp__/b{i}.log",
                           f"__bin__/gpcl6 -sOutputFile=x __tests__/b{i}.pcl{tail}"))
    return out


#: How long before time 0 the runs of these tests started: longer than heartbeat_timeout,
#: so that a verdict waits only for the nodes still building.
STARTED_AGO = Settings().heartbeat_timeout + 1


def _state() -> RunState:
    """A run of :func:`_jobs` started :data:`STARTED_AGO` seconds before time 0."""
    return RunState(RUN, _jobs(), -STARTED_AGO)


def _req(node: str, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)
    kw.setdefault("slots", 2)
    return Request(node=node, **kw)  # type: ignore[arg-type]


def _names(reply: protocol.Reply) -> list[str]:
    return [line.split(" ", 1)[0] for line in reply.jobs]


def _results(names: list[str], node: str) -> tuple[JobResult, ...]:
    return tuple(JobResult(n, 0, 0.1, 0, 0, MD5, "gs", node) for n in names)


def _run_out(state: RunState, node: str, first: protocol.Reply, now: float,
             **kw: object) -> list[str]:
    """Node ``node`` runs every batch it is given, from ``first`` on, until it is given no
    more (bounded); the names of the jobs it ran."""
    handed: list[str] = []
    reply = first
    for step in range(20):
        if reply.verb != protocol.JOBS:
            break
        handed += _names(reply)
        reply = state.handle(_req(node, results=_results(_names(reply), node), **kw),
                             now + step).reply
    return handed


GS_JOBS = [f"a{i}.ps.ppmraw.72.0" for i in range(4)]
PCL_JOBS = [f"b{i}.pcl.ppmraw.72.0" for i in range(3)]


def test_no_node_built_it_and_none_is_building_the_jobs_are_not_run_and_settle_the_run(
        ) -> None:
    state = _state()
    assert state.handle(_req("a", unbuilt=("gpcl6",)), 0).reply.verb == protocol.BUILD
    out = state.handle(_req("a", unbuilt=("gpcl6",)), 0)
    assert out.reply.verb == protocol.JOBS
    assert any("node a's build made no gpcl6" in note for note in out.notes)
    assert any("no node's build made gpcl6 (built on a): its 3 jobs left are not run" in note
               for note in out.notes)
    handed = _run_out(state, "a", out.reply, 1, unbuilt=("gpcl6",))
    assert sorted(handed) == GS_JOBS
    assert state.all_results_in and state.remaining == 0
    assert state.unbuilt.count == 3 and state.unbuilt.by_program == {"gpcl6": 3}
    assert state.not_run_names() == set(PCL_JOBS)
    assert state.unbuilt.not_built == {"gpcl6": ("a",)}
    assert state.lost == [] and state.nodes["a"].state is NodeState.UPLOADING
    assert "3 not run" in state.status_line()
    assert state.pending == []


def test_a_node_lacking_what_another_node_built_is_dropped_as_failure_1() -> None:
    """b's build made every program, a's made no gs: a is dropped (its own
    fault, failure 1 'cannot run jobs'), nothing is marked not run, b runs every job."""
    state = _state()
    state.handle(_req("b"), 0)
    first = state.handle(_req("b"), 0).reply
    state.handle(_req("a", unbuilt=("gs",)), 1)
    out = state.handle(_req("a", unbuilt=("gs",)), 1)
    assert out.reply.verb == protocol.ABORT
    assert out.reply.reason.startswith("dropped after failure 1: cannot run jobs: its build "
                                       "made no gs, which node b's build made")
    assert state.nodes["a"].state is NodeState.GONE
    assert state.lost == ["a (failure 1 cannot run jobs: its build made no gs, which node "
                          "b's build made; 0 unfinished jobs put back)"]
    assert sorted(_run_out(state, "b", first, 2)) == sorted(GS_JOBS + PCL_JOBS)
    assert state.all_results_in and state.unbuilt.count == 0
    assert finish.unbuilt_lines(state, ("gs", "pcl")) == []


def test_a_node_lacking_a_program_waits_while_another_builds_then_is_at_fault() -> None:
    """a builds first and lacks gs; b is still building: a is given nothing (the verdict
    waits).  b's build makes gs: a is dropped at its next call, b runs everything."""
    state = _state()
    state.handle(_req("b", built=""), 0)                     # b: BUILD
    state.handle(_req("b", built="", busy="build"), 0)
    state.handle(_req("a", unbuilt=("gs",)), 0)              # a: BUILD
    for step in range(3):
        waiting = state.handle(_req("a", unbuilt=("gs",)), 1 + step)
        assert waiting.reply.verb == protocol.CONTINUE and state.unbuilt.count == 0
    first = state.handle(_req("b"), 5).reply                 # b built, with gs
    assert first.verb == protocol.JOBS
    dropped = state.handle(_req("a", unbuilt=("gs",)), 6).reply
    assert dropped.verb == protocol.ABORT and "which node b's build made" in dropped.reason
    assert sorted(_run_out(state, "b", first, 7)) == sorted(GS_JOBS + PCL_JOBS)
    assert state.all_results_in and state.unbuilt.count == 0


def test_every_node_lacking_it_is_the_trees_fault_decided_once_none_is_building() -> None:
    """a lacks gpcl6 and waits while b builds; b lacks it too: the pcl jobs are not run, both
    nodes run the gs jobs, no node is dropped, and the report line names both builds."""
    state = _state()
    state.handle(_req("b", built=""), 0)
    state.handle(_req("a", unbuilt=("gpcl6",)), 0)
    assert state.handle(_req("a", unbuilt=("gpcl6",)), 1).reply.verb == protocol.CONTINUE
    from_b = state.handle(_req("b", unbuilt=("gpcl6",), slots=1), 2)
    assert from_b.reply.verb == protocol.JOBS
    assert all(n.startswith("a") for n in _names(from_b.reply))
    from_a = state.handle(_req("a", unbuilt=("gpcl6",), slots=1), 3).reply
    handed = _run_out(state, "b", from_b.reply, 4, unbuilt=("gpcl6",), slots=1)
    handed += _run_out(state, "a", from_a, 4, unbuilt=("gpcl6",), slots=1)
    assert sorted(set(handed)) == GS_JOBS  # a tail copy may be handed twice
    assert state.all_results_in and state.lost == []
    assert state.unbuilt.not_built == {"gpcl6": ("a", "b")}
    assert finish.unbuilt_lines(state, ("gs", "pcl")) == [
        "product pcl not tested: no node's build made gpcl6 (built on a, b; 3 tests not run)"]


def test_the_verdict_is_taken_when_the_building_node_fails_its_build() -> None:
    state = _state()
    state.handle(_req("b", built=""), 0)
    state.handle(_req("a", unbuilt=("gpcl6",)), 0)
    assert state.handle(_req("a", unbuilt=("gpcl6",)), 1).reply.verb == protocol.CONTINUE
    state.handle(_req("b", built="", failure=1, failure_reason="no compiler"), 2)
    reply = state.handle(_req("a", unbuilt=("gpcl6",)), 3).reply
    assert reply.verb == protocol.JOBS and state.unbuilt.count == 3


def test_a_result_for_a_job_marked_not_run_counts_once() -> None:
    """b's first build made gpcl6 and it was handed pcl jobs; it restarted and its new build
    lacks gpcl6, as a's does: the pcl jobs are not run.  A result the first process of b
    sends for one of the jobs it was handed still counts, and the job is no longer counted
    as not run; the new process of b cannot report the old one's jobs."""
    state = _state()
    state.handle(_req("b", slots=1), 0, session="s1")
    first = state.handle(_req("b", slots=1), 0, session="s1").reply
    held_pcl = [n for n in _names(first) if n.startswith("b")]
    assert held_pcl
    assert state.handle(_req("b", slots=1, unbuilt=("gpcl6",)), 1,
                        session="s2").reply.verb == protocol.BUILD  # a new process
    state.handle(_req("a", unbuilt=("gpcl6",)), 1)
    state.handle(_req("b", slots=1, unbuilt=("gpcl6",)), 2, session="s2")
    state.handle(_req("a", unbuilt=("gpcl6",)), 2)
    assert state.unbuilt.count == 3
    forged = state.handle(_req("b", slots=1, unbuilt=("gpcl6",),
                               results=_results(held_pcl[:1], "b")), 3, session="s2")
    assert forged.refused == 1 and held_pcl[0] not in state.results
    assert state.unbuilt.count == 3
    # The first process, dropped when the second called, delivers its result late.
    late = state.handle(_req("b", slots=1, results=_results(held_pcl[:1], "b")), 3.5,
                        session="s1")
    assert late.journal and held_pcl[0] in state.results
    assert state.unbuilt.count == 2 and state.unbuilt.by_program == {"gpcl6": 2}


def test_a_lone_node_lacking_a_program_waits_heartbeat_timeout_from_the_run_start() -> None:
    """A node of the cluster that has not called yet may build the program: before
    heartbeat_timeout from the run's start the verdict waits even with no node building."""
    state = RunState(RUN, _jobs(), 0, Settings(heartbeat_timeout=30))
    state.handle(_req("a", unbuilt=("gpcl6",)), 0)
    for now in (1, 10, 29.5):
        assert state.handle(_req("a", unbuilt=("gpcl6",)), now).reply.verb == protocol.CONTINUE
    assert state.unbuilt.count == 0
    assert state.handle(_req("a", unbuilt=("gpcl6",)), 30).reply.verb == protocol.JOBS
    assert state.unbuilt.count == 3


def test_an_unbuilt_report_before_the_build_is_done_changes_nothing() -> None:
    state = _state()
    state.handle(_req("a", built=""), 0)
    state.handle(_req("a", built="", busy="build", unbuilt=("gpcl6",)), 1)
    assert state.unbuilt.lacks == {}


def test_a_later_node_building_the_program_does_not_bring_back_jobs_not_run() -> None:
    """The verdict "not built" holds for the run (docs/deviations.md): c, joining after it,
    builds gpcl6 and is given the gs jobs left, no pcl job; a is not dropped for lacking
    it."""
    state = _state()
    state.handle(_req("a", unbuilt=("gpcl6",), slots=1), 0)
    state.handle(_req("a", unbuilt=("gpcl6",), slots=1), 0)
    state.handle(_req("c", slots=1), 1)
    from_c = state.handle(_req("c", slots=1), 1).reply
    assert from_c.verb == protocol.JOBS
    assert all(n.startswith("a") for n in _names(from_c))
    assert state.handle(_req("a", unbuilt=("gpcl6",), slots=1, pending=1, running=1),
                        2).reply.verb != protocol.ABORT
    assert state.lost == [] and state.unbuilt.count == 3


# ------------------------------------------------------------------ report and tables
def _row(name: str, product: str = "pcl") -> TabRow:
    return TabRow(name=name, error=0, time1=1.0, time2=0.0, time3=0.0, md5=MD5, rev="1",
                  product=product, machine="n0")


def test_not_run_tests_keep_their_baseline_lines_and_are_not_removed() -> None:
    old = {"a.ps": _row("a.ps", "gs"), "b.pcl": _row("b.pcl"), "c.pcl": _row("c.pcl")}
    new = {"a.ps": _row("a.ps", "gs")}
    lines = list(merged_lines(old, new, ["gs", "pcl"], frozenset({"b.pcl"})))
    assert [line.split("\t", 1)[0] for line in lines] == ["a.ps", "b.pcl"]
    assert lines[1] == old["b.pcl"].line()  # as it was
    removed = report.analyse(new, old, not_run=frozenset({"b.pcl"})).removed
    assert removed == ["c.pcl"]


def test_the_report_line_names_the_product_and_the_program_and_is_said_once() -> None:
    state = _state()
    state.handle(_req("node1", unbuilt=("gpcl6",)), 0)
    state.handle(_req("node1", unbuilt=("gpcl6",), slots=8), 0)
    assert finish.unbuilt_lines(state, ("gs", "pcl")) == [
        "product pcl not tested: no node's build made gpcl6 (built on node1; 3 tests not "
        "run)"]
    assert finish.unbuilt_lines(_state(), ("gs", "pcl")) == []
