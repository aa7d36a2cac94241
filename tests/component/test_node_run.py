"""run.py's engine against a scripted master on loopback: timeouts, failures, resends."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE as EXIT_DONE
from cluster.defaults import NODE_EXIT_FAILED as EXIT_FAILED
from cluster.node.noderun import NodeRun
from cluster.node.transport import LocalTransport
from cluster.records import ERROR_TIMEOUT, Job
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Reply, Request
from tests.helpers import give_key

RUN = "20261122000000-p0-beef"
#: Node n1's own key (node-keys/n1.key in the home), and its run key, with which the
#: scripted master verifies and signs.
SECRET = signing.new_secret()
KEY = signing.run_key(signing.parse_secret(SECRET), RUN)


@dataclass
class ScriptedMaster:
    """A NodeServer whose replies come from ``script(request, seen_so_far)``."""

    script: Callable[[Request, list[Request]], bytes]
    seen: list[Request] = field(default_factory=list)

    def handler(self, data: bytes, peer: str) -> bytes:
        # n1's key in the run the request names (the tests' runs have several ids).
        key = signing.run_key(signing.parse_secret(SECRET),
                              signing.header_value(data, b"id"))
        _, nonce = signing.verify_request(data, key)
        req = protocol.parse_request(data)
        self.seen.append(req)
        return signing.sign_reply(self.script(req, self.seen), key, nonce)


def make_node_home(tmp_path: Path) -> Path:
    """A master home with a one-file corpus and a product tree ``src`` whose build is empty."""
    root = tmp_path / "home"
    (root / "tests" / "t").mkdir(parents=True)
    (root / "tests" / "t" / "f.ps").write_text("showpage\n")
    (root / "src").mkdir()
    (root / "src" / "Makefile").write_text("all:\n\tmkdir -p bin\n")
    return root


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_node_home(tmp_path)


def write_start(home: Path, build: str = "make") -> None:
    start = JobStart(id=RUN, priority=0, queue="user t gs", kind="user", ref="t",
                     products=("gs",), tree="ghostpdl", source="src", build=build,
                     tests="tests")
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)


def node(home: Path, tmp_path: Path, port: int, **settings: object) -> NodeRun:
    cfg = Config(base_port=port, node_name="n1", work_dir=tmp_path / "work", slots=2,
                 poll_interval=0.2, report_interval=0.05, connect_retry_delay=0.1,
                 connect_retries=5, io_timeout=5).with_changes(**settings)
    return NodeRun(cfg, LocalTransport(home), 0, "tools=md5sum")


def jobs_reply(*commands: str) -> bytes:
    lines = tuple(Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", c).line
                  for i, c in enumerate(commands))
    return protocol.format_reply(Reply(protocol.JOBS, lines))


def script_once(*commands: str) -> Callable[[Request, list[Request]], bytes]:
    """BUILD, then the jobs once, then CONTINUE until every result is in, then ABORT."""
    given = {"done": False}

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy or req.failure:
            if req.failure:
                return protocol.format_reply(Reply(protocol.ABORT, reason="dropped"))
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if not given["done"]:
            given["done"] = True
            return jobs_reply(*commands)
        results = sum(len(r.results) for r in seen)
        if results >= len(commands):
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return protocol.format_reply(Reply(protocol.CONTINUE))

    return script


def test_a_timed_out_test_is_killed_with_its_whole_tree(home: Path, tmp_path: Path,
                                                        serve) -> None:
    write_start(home)
    pidfile = tmp_path / "grandchild.pid"
    master = ScriptedMaster(script_once(
        f"echo gs > __temp__/t0.ps.ppmraw.72.0.log ; "
        f"sh -c 'sleep 300 & echo $! > {pidfile}; wait'"))
    port = serve(master)
    code = node(home, tmp_path, port, job_timeout=1.0, kill_grace=0.5).run()
    assert code == EXIT_DONE
    (result,) = [r for req in master.seen for r in req.results]
    assert result.error == ERROR_TIMEOUT and result.md5 == "0"
    grandchild = int(pidfile.read_text())
    assert not psutil.pid_exists(grandchild) or \
        psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert any(req.timeouts == 1 for req in master.seen)


def test_too_many_timeouts_fail_the_node_with_code_2(home: Path, tmp_path: Path,
                                                     serve) -> None:
    write_start(home)
    master = ScriptedMaster(script_once("sleep 30", "sleep 30", "sleep 30"))
    port = serve(master)
    code = node(home, tmp_path, port, slots=3, job_timeout=0.5, kill_grace=0.2,
                max_timeouts=1).run()
    assert code == EXIT_FAILED
    failing = [r for r in master.seen if r.failure]
    assert failing and failing[0].failure == protocol.FAILURE_TIMEOUTS
    assert "timed out" in failing[0].failure_reason


def test_results_are_sent_again_when_a_call_fails(home: Path, tmp_path: Path, serve) -> None:
    """The node forgets results only once the master has answered."""
    write_start(home)
    base = script_once("echo gs > __temp__/t0.ps.ppmraw.72.0.log ; "
                       "echo 0123456789abcdef0123456789abcdef > __temp__/t0.ps.ppmraw.72.0.md5")
    dropped = {"n": 0}

    def script(req: Request, seen: list[Request]) -> bytes:
        if req.results and dropped["n"] == 0:
            dropped["n"] += 1
            return b""  # the master dies before answering
        return base(req, seen)

    master = ScriptedMaster(script)
    port = serve(master)
    assert node(home, tmp_path, port).run() == EXIT_DONE
    carrying = [r for r in master.seen if r.results]
    assert len(carrying) == 2 and carrying[0].results == carrying[1].results
    assert carrying[0].results[0].md5 == "0123456789abcdef0123456789abcdef"


def test_a_failed_build_reports_minus_one_after_uploading_its_log(home: Path, tmp_path: Path,
                                                                  serve) -> None:
    write_start(home, build="echo compiling; echo 'error: no compiler' >&2; exit 3")
    master = ScriptedMaster(script_once("true"))
    port = serve(master)
    assert node(home, tmp_path, port).run() == EXIT_FAILED
    failing = [r for r in master.seen if r.failure]
    assert failing[0].failure == protocol.FAILURE_BUILD
    assert "exited with status 3" in failing[0].failure_reason
    log = (home / "runs" / RUN / "logs" / "n1.build.log").read_text()
    assert "error: no compiler" in log
    assert any(r.busy == "build" for r in master.seen)


def test_abort_during_a_build_stops_it_and_its_log_says_so(home: Path, tmp_path: Path,
                                                          serve) -> None:
    """Told ABORT while its build runs (another node's build failed), the node kills the
    build's process tree and waits for it before leaving: the build log ends with how the
    build ended, and no process of the build outlives run.py (it once left the build's
    log without its end line, and the command running)."""
    pidfile = tmp_path / "build.pid"
    write_start(home, build=f"echo compiling; sleep 300 & echo $! > {pidfile}; wait")

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if not pidfile.exists():
            return protocol.format_reply(Reply(protocol.CONTINUE))
        return protocol.format_reply(Reply(protocol.ABORT, reason="run aborted: node n2 "
                                           "failed with code -1: build failed"))

    master = ScriptedMaster(script)
    began = time.monotonic()
    assert node(home, tmp_path, serve(master), kill_grace=0.5).run() == EXIT_DONE
    assert time.monotonic() - began < 30
    log = (tmp_path / "work" / "runs" / RUN / "n1.build.log").read_text()
    assert log.splitlines()[-1].endswith(" stopped: the node was told to stop; its process "
                                         "tree was killed"), log
    sleeper = int(pidfile.read_text())
    assert not psutil.pid_exists(sleeper) or \
        psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE


def test_the_node_asks_for_more_before_it_runs_dry(home: Path, tmp_path: Path,
                                                   serve) -> None:
    write_start(home)
    batches = {"n": 0}

    def script(req: Request, seen: list[Request]) -> bytes:
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy:
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if batches["n"] < 3 and req.pending < 2:
            batches["n"] += 1
            return jobs_reply(*["sleep 0.3"] * 4)
        if sum(len(r.results) for r in seen) >= 12:
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return protocol.format_reply(Reply(protocol.CONTINUE))

    master = ScriptedMaster(script)
    port = serve(master)
    assert node(home, tmp_path, port, poll_interval=5.0).run() == EXIT_DONE
    # Asked while jobs were still running and fewer than one per slot were queued.
    assert any(r.running > 0 and r.pending < 2 and not r.busy for r in master.seen)
    assert batches["n"] == 3
    assert sum(len(r.results) for r in master.seen) == 12
    assert os.path.exists(tmp_path / "work" / "runs" / RUN / "n1.log")


def test_a_run_py_restarted_for_a_run_already_built_sends_its_build_digests(
        home: Path, tmp_path: Path, serve) -> None:
    """A run.py started again for the run its node built (the master was replaced, the
    node rejoins) takes its programs' digests while it prepares: it once read job.start
    from the run it had not set yet, and died with an AssertionError (exit 1), so an
    ephemeral node took the run for finished and left."""
    (home / "src" / "Makefile").write_text(
        "all:\n\tmkdir -p bin && printf '#!/bin/sh\\n' > bin/gs && chmod +x bin/gs\n")
    start = JobStart(id=RUN, priority=0, queue="user t gs", kind="user", ref="t",
                     products=("gs",), tree="ghostpdl", source="src", build="make",
                     tests="tests", programs=("gs",))
    (home / "job.start").write_text(start.format())
    give_key(home, "n1", SECRET)
    first = ScriptedMaster(script_once("echo gs > __temp__/t0.ps.ppmraw.72.0.log"))
    assert node(home, tmp_path, serve(first)).run() == EXIT_DONE
    assert any(req.digests for req in first.seen)

    def complete(req: Request, seen: list[Request]) -> bytes:
        return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))

    again = ScriptedMaster(complete)
    assert node(home, tmp_path, serve(again)).run() == EXIT_DONE
    assert again.seen[0].built == RUN and again.seen[0].digests == first_digests(first)


def first_digests(master: ScriptedMaster) -> tuple[tuple[str, str], ...]:
    """The digests the node sent in the first run."""
    return next(req.digests for req in master.seen if req.digests)


def _one_slow_job_then(reply_when_idle: bytes, seconds: float, ended: Path,
                       called: list[tuple[float, Request]], *earlier: float
                       ) -> Callable[[Request, list[Request]], bytes]:
    """BUILD, then one job of ``seconds`` that writes the wall time it ended into
    ``ended`` (and one job of each of the ``earlier`` seconds beside it); every later call
    is answered ``reply_when_idle`` until the last result came, then ABORT.  ``called``
    gets (wall time, request) of each call."""
    given = {"done": False}

    def job(i: int, seconds: float, mark: str) -> str:
        name = f"t{i}.ps.ppmraw.72.0"
        return (f"sleep {seconds} ; {mark} echo gs > __temp__/{name}.log ; "
                f"echo 0123456789abcdef0123456789abcdef > __temp__/{name}.md5")

    jobs = [job(0, seconds, f"date +%s.%N > {ended} ;"),
            *(job(i, s, "") for i, s in enumerate(earlier, 1))]

    def script(req: Request, seen: list[Request]) -> bytes:
        called.append((time.time(), req))
        if len(seen) == 1:
            return protocol.format_reply(Reply(protocol.BUILD))
        if req.busy:
            return protocol.format_reply(Reply(protocol.CONTINUE))
        if not given["done"]:
            given["done"] = True
            return protocol.format_reply(Reply(protocol.JOBS, tuple(
                Job(f"t{i}.ps.ppmraw.72.0", f"__temp__/t{i}.log", c).line
                for i, c in enumerate(jobs))))
        if sum(len(r.results) for r in seen) >= len(jobs):
            return protocol.format_reply(Reply(protocol.ABORT, reason="run complete"))
        return reply_when_idle

    return script


def test_the_last_result_goes_at_once_when_no_job_runs(home: Path, tmp_path: Path,
                                                       serve) -> None:
    """Results wait up to report_interval to be sent together; when no job runs any more
    nothing can join them, so the node calls at once (the end of every run waited)."""
    write_start(home)
    ended = tmp_path / "ended"
    called: list[tuple[float, Request]] = []
    # JOBS 0 (no work now): the node asks again 1 s later, at about 1.0, 2.0, 3.0 s...
    idle = protocol.format_reply(Reply(protocol.JOBS, ()))
    master = ScriptedMaster(_one_slow_job_then(idle, 1.5, ended, called))
    port = serve(master)
    assert node(home, tmp_path, port, slots=1, poll_interval=10.0,
                report_interval=3.0).run() == EXIT_DONE
    (sent_at,) = [when for when, req in called if req.results]
    delay = sent_at - float(ended.read_text())
    assert delay < 0.3, f"the result was sent {delay:.2f} s after its job ended"


def test_an_idle_node_told_continue_asks_again_soon_then_less_often(
        home: Path, tmp_path: Path, serve) -> None:
    """After CONTINUE a node with a free slot asks again after 0.05 s, the wait doubling up
    to 0.5 s: another node's last job ends the run sooner than a fixed 0.5 s would."""
    write_start(home)
    ended = tmp_path / "ended"
    called: list[tuple[float, Request]] = []
    master = ScriptedMaster(_one_slow_job_then(protocol.format_reply(Reply(protocol.CONTINUE)),
                                               2.0, ended, called))
    port = serve(master)
    # Two slots, one job: a slot stays free, so the node keeps asking for work.
    assert node(home, tmp_path, port, slots=2, poll_interval=10.0,
                report_interval=3.0).run() == EXIT_DONE
    asks = [when for when, req in called if not req.busy and not req.results]
    gaps = [b - a for a, b in zip(asks[1:], asks[2:], strict=False)]  # after the JOBS reply
    assert len(gaps) >= 4, gaps
    assert gaps[0] < 0.2, f"first ask after CONTINUE came {gaps[0]:.2f} s later: {gaps}"
    assert max(gaps) < 0.8, gaps
    assert gaps[-1] > 0.35, f"the waits did not grow towards 0.5 s: {gaps}"



def test_a_node_that_sent_its_last_results_starts_its_continue_waits_afresh(
        home: Path, tmp_path: Path, serve) -> None:
    """At a run's end a node sends its last result while another node still runs the last
    job, and is told CONTINUE: its next ask comes 0.05 s later (that job may end any
    moment), not after the 0.5 s its waits had grown to while its own job ran."""
    write_start(home)
    ended = tmp_path / "ended"
    called: list[tuple[float, Request]] = []
    continue_ = protocol.format_reply(Reply(protocol.CONTINUE))
    base = _one_slow_job_then(continue_, 1.5, ended, called)
    told_after_result = {"n": 0}

    def script(req: Request, seen: list[Request]) -> bytes:
        # The other node's last job: CONTINUE for three more calls after the result.
        if any(r.results for r in seen) and told_after_result["n"] < 3:
            told_after_result["n"] += 1
            called.append((time.time(), req))
            return continue_
        return base(req, seen)

    master = ScriptedMaster(script)
    port = serve(master)
    # Two slots, one job: a slot stays free, so the node asks for work while its job runs.
    assert node(home, tmp_path, port, slots=2, poll_interval=10.0,
                report_interval=3.0).run() == EXIT_DONE
    times = [when for when, _ in called]
    last_result = next(i for i, (_, req) in enumerate(called) if req.results)
    assert called[last_result][1].running == 0 and last_result + 1 < len(called)
    # The waits while the job ran had grown towards 0.5 s ...
    before = [b - a for a, b in zip(times[2:last_result], times[3:last_result], strict=False)]
    assert before and max(before) > 0.35, before
    gap = times[last_result + 1] - times[last_result]
    assert gap < 0.2, f"the node asked again {gap:.2f} s after sending its last result"
