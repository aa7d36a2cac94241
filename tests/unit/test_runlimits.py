"""A run's own limits (docs/runoptions.md section 3): the pure parts.

job_timeout and max_failed_nodes ending a run, task_timeout in job.start, the queue's
enqueue times and the runs past their queue_timeout, and no_reschedule in the run state.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.home import Home
from cluster.master.files.ending import Outcome
from cluster.master.files.journal import journal_result
from cluster.master.model import runlimits
from cluster.master.run.clustermaster import ClusterMaster
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.queue import QueueFile
from cluster.records import ERROR_LOST, ERROR_NAMES, LOST_PRODUCT
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from tests.unit.test_runstate import RUN, finish, jobs, names, ready, req

CFG = Config().with_changes(max_run_time=7200.0, max_failed_nodes=10)


def options(*words: str) -> RunOptions:
    return RunOptions.of(words, CFG)


# ------------------------------------------------------------------ job_timeout, nodes lost
def test_the_runs_job_timeout_replaces_max_run_time() -> None:
    assert runlimits.limit_reached(options(), 7199, 0) is None
    outcome, why = runlimits.limit_reached(options(), 7201, 0) or (None, "")
    assert outcome is Outcome.TIMED_OUT and "longer than max_run_time 7200 s" in why
    assert runlimits.limit_reached(options("job_timeout=10"), 9.5, 0) is None
    outcome, why = runlimits.limit_reached(options("job_timeout=10"), 10.5, 0) or (None, "")
    assert outcome is Outcome.TIMED_OUT and "longer than its job_timeout 10 s" in why
    # Longer than the global bound, when the run says so.
    assert runlimits.limit_reached(options("job_timeout=3h"), 8000, 0) is None


def test_own_max_failed_nodes_stops_the_run_the_global_one_queues_it_again() -> None:
    assert runlimits.limit_reached(options(), 0, 10) is None
    outcome, why = runlimits.limit_reached(options(), 0, 11) or (None, "")
    assert outcome is Outcome.RETRY and "more than max_failed_nodes 10" in why
    assert runlimits.limit_reached(options("max_failed_nodes=1"), 0, 1) is None
    outcome, why = runlimits.limit_reached(options("max_failed_nodes=1"), 0, 2) or (None, "")
    assert outcome is Outcome.NODES_LOST and "more than its max_failed_nodes 1" in why
    assert not Outcome.NODES_LOST.changes_tables and Outcome.NODES_LOST.dequeues
    # Even the global value, given as the run's own, stops it instead.
    outcome, _ = runlimits.limit_reached(options("max_failed_nodes=10"), 0, 11) or (None, "")
    assert outcome is Outcome.NODES_LOST


# ------------------------------------------------------------------ task_timeout
def test_job_start_carries_the_task_timeout_as_the_nodes_job_timeout() -> None:
    start = JobStart(id="r", priority=1, queue="auto nightly gs", kind="auto", ref="nightly",
                     products=("gs",), tree="ghostpdl", source="ghostpdl", build="make",
                     tests="tests")
    assert runlimits.with_task_timeout(start, options()) == start
    carried = runlimits.with_task_timeout(start, options("task_timeout=1.5m"))
    assert carried.job_timeout == 90.0
    assert JobStart.parse(carried.format()).job_timeout == 90.0
    # The longest task_timeout the grammar allows travels whole.
    assert runlimits.with_task_timeout(start, options("task_timeout=30d")).job_timeout == \
        30 * 86400.0
    assert JobStart.parse(runlimits.with_task_timeout(
        start, options("task_timeout=30d")).format()).job_timeout == 30 * 86400.0


def master_with_a_queued_run(root: Path, line: str, cfg: Config = CFG
                             ) -> tuple[Home, ClusterMaster, RunSpec]:
    """A new home with a clean ghostpdl tree, its priority-1 master, and ``line`` queued
    there: what ``RunSetup.job_start`` needs to set a run up."""
    home = Home(root)
    home.create()
    (home.root / "ghostpdl").mkdir()
    master = ClusterMaster(cfg.with_changes(home=home.root), 1)
    master.queue.append(RunSpec.parse(line))
    spec = master.queue.head()
    assert spec is not None
    return home, master, spec


def test_the_master_writes_task_timeout_into_job_start(tmp_path: Path) -> None:
    home, master, spec = master_with_a_queued_run(tmp_path / "home",
                                                  "auto nightly gs task_timeout=45")
    start = master.setup.job_start(spec)
    assert start.job_timeout == 45.0
    assert JobStart.parse(home.job_start(1).read_text()).job_timeout == 45.0


# ------------------------------------------------------------------ queue_timeout
def queue(tmp_path: Path) -> QueueFile:
    return QueueFile(tmp_path / "queue.lst", tmp_path / "queue.lck")


def test_a_queued_run_keeps_its_first_enqueue_time(tmp_path: Path) -> None:
    q = queue(tmp_path)
    a, b = RunSpec.parse("user a gs queue_timeout=60"), RunSpec.parse("user b gs queue_timeout=9")
    before = time.time()
    assert q.append(a)
    first = q.waiting_since()[a.line()]
    assert before - 1 <= first <= time.time()
    time.sleep(0.01)
    assert not q.append(a)  # the same line twice is one run, with its first time
    assert q.append(RunSpec.parse("user c gs"))  # no queue_timeout: no time kept
    assert q.append(b)
    since = queue(tmp_path).waiting_since()  # another process (a restarted master)
    assert since[a.line()] == pytest.approx(first, abs=0.001)
    assert since[b.line()] >= first
    assert q.remove(a)
    assert set(q.waiting_since()) == {b.line()}
    assert set(since) == {a.line(), b.line()}
    assert q.remove(b)
    assert q.waiting_since() == {} and not (tmp_path / "queue.lst.times").exists()


def test_a_hand_written_line_gets_its_time_when_first_seen(tmp_path: Path) -> None:
    q = queue(tmp_path)
    (tmp_path / "queue.lst").write_text("user a gs queue_timeout=60\n")
    before = time.time()
    (line, seen), = q.waiting_since().items()
    assert line == "user a gs queue_timeout=60" and seen >= before - 1
    assert q.waiting_since()[line] == pytest.approx(seen, abs=0.001)


def test_expired_runs_are_those_past_their_own_queue_timeout_never_the_served_one() -> None:
    served = RunSpec.parse("user s gs queue_timeout=1")
    late = RunSpec.parse("user a gs queue_timeout=60")
    young = RunSpec.parse("user b gs queue_timeout=600")
    plain = RunSpec.parse("user c gs")
    untimed = RunSpec.parse("user d gs queue_timeout=1")
    since = {served.line(): 0.0, late.line(): 0.0, young.line(): 0.0, plain.line(): 0.0}
    found = runlimits.expired([served, late, young, plain, untimed, late], since, 100.0,
                              [served], CFG)
    assert [(e.spec, e.waited, e.limit) for e in found] == [(late, 100.0, 60.0)]
    assert "waited 100.0 s in its queue, longer than its queue_timeout 60 s" in found[0].reason
    assert runlimits.expired([served], since, 100.0, [], CFG)[0].spec == served
    # A run another lane serves is never expired either (docs/runoptions.md, "Fair share").
    assert runlimits.expired([served, late], since, 100.0, [served, late], CFG) == []


def test_an_expired_run_leaves_the_queue_with_a_short_report(tmp_path: Path) -> None:
    """Through the master's end steps; the served run's job list and journal stay."""
    home = Home(tmp_path / "home")
    home.create()
    master = ClusterMaster(CFG.with_changes(home=home.root), 0)
    served = RunSpec.parse("user s gs")
    late = RunSpec.parse("user alice gs queue_timeout=1")
    for spec in (served, late):
        master.queue.append(spec)
    home.jobs(0).write_text("served run's jobs\n")
    home.results(0).write_text("served run's journal\n")
    master._expire_waiting(served)
    assert master.queue.read() == [served, late]  # not yet past its queue_timeout
    times = home.queue(0).with_name(home.queue(0).name + ".times")
    # Queued 5 s ago (the side file is the queue's record of it).
    times.write_text("".join(
        f"{line.split()[0]} {float(line.split()[1]) - 5:.3f}\n"
        for line in times.read_text().splitlines()))
    master._expire_waiting(served)
    assert master.queue.read() == [served]
    (archive,) = [d for d in home.archive.iterdir() if d.is_dir()]
    report = (archive / "report.txt").read_text()
    assert "user alice" in report and "The run did not start: it waited 5.0 s in its " \
        "queue, longer than its queue_timeout 1 s." in report
    assert "outcome queue-timeout" in (archive / "run.info").read_text()
    assert home.jobs(0).read_text() == "served run's jobs\n"
    assert home.results(0).read_text() == "served run's journal\n"
    assert not list(home.runs.glob("*/end"))


# ------------------------------------------------------------------ no_reschedule
def lost_state(*words: str, speculate: bool = False) -> RunState:
    state = RunState(RUN, jobs(6), 0, Settings(batch_per_slot=1, heartbeat_timeout=10,
                                              speculate_tail=speculate))
    state.options = options(*words)
    return state


def test_a_lost_nodes_jobs_are_reported_lost_never_handed_out_again() -> None:
    state = lost_state("no_reschedule")
    given_a = names(ready(state, "a", slots=2))
    given_b = names(ready(state, "b", slots=2))
    assert len(given_a) == 2 and len(given_b) == 2
    # a falls silent; b goes on calling.
    state.handle(req("b", slots=2, pending=2, running=0), 5)
    notes = state.tick(11)
    assert any("2 unfinished jobs reported lost" in n for n in notes)
    made = [journal_result(line) for line in state.take_made_results().decode().splitlines()]
    assert sorted(r.name for r in made) == sorted(given_a)
    assert all((r.error, r.product, r.machine) == (ERROR_LOST, LOST_PRODUCT, "a")
               for r in made)
    assert state.take_made_results() == b""  # taken once
    assert "no_reschedule" in ERROR_NAMES[ERROR_LOST]
    assert "a (not heard from for 11 s; 2 unfinished jobs reported lost)" in state.lost
    # b finishes its own and takes the rest: never a's.
    reply = finish(state, "b", protocol.Reply(protocol.JOBS, tuple(
        f"{n} __temp__/x.log true ; echo" for n in given_b)), now=6)
    rest = names(reply)
    assert not set(rest) & set(given_a) and len(rest) == 2
    finish(state, "b", reply, now=7)
    assert state.all_results_in and state.remaining == 0


def test_without_no_reschedule_a_lost_nodes_jobs_go_back() -> None:
    state = lost_state()
    given_a = names(ready(state, "a", slots=2))
    ready(state, "b", slots=2)
    state.handle(req("b", slots=2, pending=2, running=0), 5)
    state.tick(11)
    assert state.take_made_results() == b""
    assert state.pending[:2] == given_a


def test_a_no_reschedule_run_makes_no_tail_copies() -> None:
    """As test_runstate's tail test: an idle fast node copies a slow node's jobs, except in
    a no_reschedule run."""
    for words, copies in (((), 2), (("no_reschedule",), 0)):
        state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=True))
        state.options = options(*words)
        assert len(names(ready(state, "slow", 0, slots=3))) == 3
        assert len(names(ready(state, "fast", 1, slots=2))) == copies, words


def test_options_default_to_the_global_settings_in_a_bare_state() -> None:
    state = RunState(RUN, jobs(1), 0)
    assert not state.options.no_reschedule and state.options.job_timeout > 0
    assert dataclasses.replace(state.options, no_reschedule=True).no_reschedule
