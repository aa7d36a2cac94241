"""Timeouts that fit each test (docs/results.md): a test that hangs after recorded runs of
0.2 s is killed by a real node (run.py's engine, against a scripted master on loopback)
after its own timeout -- the floor, 2 s -- not after the node's job_timeout of 300 s, and
its result is a timeout, which the report names so."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE
from cluster.master.model import jobtimeouts, runlimits
from cluster.master.model.joblist import MemoryJobList
from cluster.records import ERROR_TIMEOUT, Job, timed_line
from cluster.report.compare import error_description
from cluster.runspec import RunSpec
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Reply, Request
from tests.component.test_node_run import RUN, SECRET, ScriptedMaster, make_node_home, node
from tests.helpers import give_key

HUNG = "t0.ps.ppmraw.72.0"
QUICK = "t1.ps.ppmraw.72.0"


def script(lines: list[str]) -> Callable[[Request, list[Request]], bytes]:
    """BUILD, then ``lines`` once, then CONTINUE until every result is in, then ABORT."""
    given = {"done": False}

    def reply(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy:
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if not given["done"]:
            given["done"] = True
            return protocol.format_reply(Reply(protocol.JOBS, tuple(lines)))
        if sum(len(r.results) for r in seen) >= len(lines):
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return protocol.format_reply(Reply(protocol.CONTINUE))

    return reply


def test_a_hung_test_is_killed_after_its_own_timeout_not_the_nodes(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    home = make_node_home(tmp_path)
    spec = RunSpec.parse("user t gs adaptive_timeout=5")
    start = JobStart(id=RUN, priority=0, queue=spec.line(), kind="user", ref="t",
                     products=("gs",), tree="ghostpdl", source="src", build="make",
                     tests="tests")
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)
    # The stream's last runs: 0.2 s each for both tests.
    tables = tmp_path / "tables"
    tables.mkdir()
    for name in jobtimeouts.TABLES:
        (tables / name).write_text("".join(
            f"{test}\t0\t0.20\t0.00\t0.00\t0\t{'a' * 32}\trev\tgs\tn0\n" for test in (HUNG, QUICK)))
    jobs = MemoryJobList([
        Job(HUNG, f"__temp__/{HUNG}.log", f"echo gs > __temp__/{HUNG}.log ; sleep 1000"),
        Job(QUICK, f"__temp__/{QUICK}.log", f"echo gs > __temp__/{QUICK}.log ; true")])
    cfg = Config(adaptive_timeout_floor=2.0)
    fit = jobtimeouts.fit_for_run(start, runlimits.run_options(spec, cfg), cfg)
    assert fit is not None
    timeouts = jobtimeouts.job_timeouts(jobs, [tables / name for name in jobtimeouts.TABLES],
                                        fit.multiple, fit.floor, fit.limit)
    assert timeouts is not None
    lines = [timed_line(line, seconds)  # as the ordering writes them into the jobs file
             for line, seconds in zip(jobs.lines([0, 1]), timeouts, strict=True)]
    assert lines[0].startswith(f"{HUNG} __temp__/{HUNG}.log timeout=2 ; ")
    master = ScriptedMaster(script(lines))
    port = serve(master)
    began = time.monotonic()
    code = node(home, tmp_path, port, job_timeout=300.0, kill_grace=0.5).run()
    took = time.monotonic() - began
    assert code == NODE_EXIT_DONE
    results = {r.name: r for req in master.seen for r in req.results}
    assert results[HUNG].error == ERROR_TIMEOUT
    assert results[QUICK].error != ERROR_TIMEOUT
    assert error_description(results[HUNG].error) == "timeout"
    # Killed at its 2 s floor (plus the grace and the node's calls), far from 300 s.
    assert took < 30, f"the run took {took:.0f} s: the job kept the node's job_timeout"
    hung_for = results[HUNG].time1 + results[HUNG].time2 + results[HUNG].time3
    assert hung_for < 10, f"the hung job ran {hung_for:.1f} s, past its own 2 s timeout"
