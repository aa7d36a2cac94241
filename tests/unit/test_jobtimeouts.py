"""Timeouts that fit each test (docs/results.md): the pure computation of a job's own
timeout, the stream's tables it is read from, and the job line that carries it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.master.cache.resultcache import job_key
from cluster.master.model import joborder, jobtimeouts
from cluster.master.model.joblist import JobFile, MemoryJobList
from cluster.master.model.jobtimeouts import fitted_timeout, median
from cluster.node.slots import SlotPool
from cluster.records import Job, timed_line, untimed_line
from cluster.runoptions import RunOptionError, RunOptions
from cluster.wire.jobstart import JobStart

NAN = math.nan


def test_median_of_odd_and_even_counts() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert median([7.0]) == 7.0
    with pytest.raises(ValueError):
        median([])


def test_the_timeout_is_the_multiple_of_the_median_recorded_time() -> None:
    assert fitted_timeout([20.0, 30.0, 90.0], multiple=5, floor=10, limit=450) == 150.0


def test_the_floor_holds_for_fast_tests() -> None:
    assert fitted_timeout([0.2, 0.2, 0.3], multiple=5, floor=10, limit=450) == 10.0


def test_never_above_the_global_limit_which_then_needs_no_own_timeout() -> None:
    # 5 x 100 s is past the 450 s limit: the node's own limit applies (0 = none of its own).
    assert fitted_timeout([100.0], multiple=5, floor=10, limit=450) == 0.0
    assert fitted_timeout([1.0], multiple=5, floor=450, limit=450) == 0.0


def test_an_unknown_test_or_multiple_zero_keeps_the_global_limit() -> None:
    assert fitted_timeout([], multiple=5, floor=10, limit=450) == 0.0
    assert fitted_timeout([NAN, NAN, NAN], multiple=5, floor=10, limit=450) == 0.0
    assert fitted_timeout([1.0, 2.0], multiple=0, floor=10, limit=450) == 0.0


def test_runs_without_the_test_are_left_out_of_the_median() -> None:
    assert fitted_timeout([NAN, 4.0, 8.0], multiple=2, floor=1, limit=450) == 12.0


def tab(path: Path, rows: dict[str, float]) -> Path:
    path.write_text("".join(f"{name}\t0\t{t:.2f}\t0.00\t0.00\t0\t{'a' * 32}\trev\tgs\tn1\n"
                            for name, t in rows.items()))
    return path


def test_each_job_gets_its_own_timeout_from_the_last_three_tables(tmp_path: Path) -> None:
    jobs = MemoryJobList(Job(n, f"__temp__/{n}.log", "true") for n in ("fast", "slow", "new"))
    tables = [tab(tmp_path / "current.tab", {"fast": 0.2, "slow": 40.0}),
              tab(tmp_path / "previous.tab", {"fast": 0.4, "slow": 60.0}),
              tab(tmp_path / "previous2.tab", {"fast": 5.0})]
    timeouts = jobtimeouts.job_timeouts(jobs, tables, multiple=5, floor=2, limit=450)
    assert timeouts is not None
    assert timeouts[0] == 2.0  # median 0.4 s: 2 s, the floor
    assert timeouts[1] == 250.0  # median of 40 and 60
    assert timeouts[2] == 0.0  # no recorded time: the node's limit


def test_no_table_or_multiple_zero_gives_no_timeouts(tmp_path: Path) -> None:
    jobs = MemoryJobList([Job("a", "__temp__/a.log", "true")])
    assert jobtimeouts.job_timeouts(jobs, [tmp_path / "current.tab"], 5, 2, 450) is None
    tab(tmp_path / "current.tab", {"a": 1.0})
    assert jobtimeouts.job_timeouts(jobs, [tmp_path / "current.tab"], 0, 2, 450) is None


def start(queue: str, options: tuple[str, ...] = ()) -> JobStart:
    return JobStart(id="r1", priority=0, queue=queue, kind="user", ref="t", products=("gs",),
                    tree="ghostpdl", source="src", build="make", tests="tests",
                    options=options)


def test_the_fit_uses_the_runs_option_and_task_timeout_and_spares_relaxtimeout(
        tmp_path: Path) -> None:
    jobs = MemoryJobList([Job("a", "__temp__/a.log", "true")])
    tables = [tab(tmp_path / "current.tab", {"a": 1.0})]
    cfg = Config(adaptive_timeout=0.0, adaptive_timeout_floor=2.0)
    off = RunOptions.of((), cfg)
    assert jobtimeouts.fit_for_run(start("user t gs"), off, cfg) is None
    on = RunOptions.of(("adaptive_timeout=3",), cfg)
    assert on.adaptive_timeout == 3.0
    fit = jobtimeouts.fit_for_run(start("user t gs adaptive_timeout=3"), on, cfg)
    assert fit == jobtimeouts.TimeoutFit(3.0, 2.0, cfg.job_timeout)
    got = jobtimeouts.job_timeouts(jobs, tables, fit.multiple, fit.floor, fit.limit)
    assert got is not None and got[0] == 3.0
    short = RunOptions.of(("adaptive_timeout=3", "task_timeout=3"), cfg)
    fit = jobtimeouts.fit_for_run(start("user t gs"), short, cfg)
    assert fit is not None and fit.limit == 3.0  # 3 x 1 s is not below it: none
    assert jobtimeouts.job_timeouts(jobs, tables, fit.multiple, fit.floor, fit.limit) is None
    relaxed = start("user t gs relaxtimeout", ("relaxtimeout",))
    assert jobtimeouts.fit_for_run(relaxed, on, cfg) is None
    assert [float(w) for w in jobtimeouts.TimeoutFit(0.1, 2.5, 450.0).argv()] == [0.1, 2.5, 450]


def test_the_job_line_carries_its_own_timeout_only_when_it_has_one() -> None:
    job = Job("t.ps", "__temp__/t.ps.log", "sleep 1 ; echo done")
    assert timed_line(job.line, 0.0) == job.line
    line = timed_line(job.line, 2.5)
    assert line == "t.ps __temp__/t.ps.log timeout=2.5 ; sleep 1 ; echo done"
    assert Job.parse(line) == Job("t.ps", "__temp__/t.ps.log", "sleep 1 ; echo done", 2.5)
    assert Job.parse(line).line == line
    assert Job.parse(job.line).timeout == 0.0


@pytest.mark.parametrize("word", ["timeout=", "timeout=0", "timeout=-1", "timeout=nan",
                                  "timeout=1e9", "timeout=x", "false"])
def test_a_bad_timeout_word_is_refused(word: str) -> None:
    with pytest.raises(ValueError):
        Job.parse(f"t.ps __temp__/t.log {word} ; true")


def test_the_ordering_writes_each_jobs_own_timeout_into_the_jobs_file(
        tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_text("a __temp__/a.log true ; echo a true ; x\n"
                    "b __temp__/b.log true ; echo b\nc __temp__/c.log true ; echo c\n")
    tab(tmp_path / "current.tab", {"a": 0.1, "b": 9.0})  # c: no recorded time
    done = joborder.order_jobs_file(path, tmp_path / "current.tab",
                                    jobtimeouts.TimeoutFit(10.0, 60.0, 450.0))
    assert done.rewritten and done.timed == 2
    assert path.read_text().splitlines() == [
        "c __temp__/c.log true ; echo c",            # unknown first, the node's limit
        "b __temp__/b.log timeout=90 ; echo b",      # 10 x 9 s
        "a __temp__/a.log timeout=60 ; echo a true ; x"]  # the floor; the command unchanged
    jobs = JobFile(path)  # the master reads the lines as they are, and the node parses them
    try:
        assert jobs.names == ["c", "b", "a"] and not jobs.skipped
        assert [Job.parse(line).timeout for line in jobs.lines([0, 1, 2])] == [0.0, 90.0, 60.0]
    finally:
        jobs.close()
    # What a job runs, and so its result cache key, does not depend on its timeout.
    assert untimed_line("a __temp__/a.log timeout=60 ; echo a") == "a __temp__/a.log true ; echo a"
    assert untimed_line("a x true ; echo timeout=60 ;") == "a x true ; echo timeout=60 ;"
    key = job_key("b __temp__/b.log true ; __bin__/gs", [], [])
    assert job_key("b __temp__/b.log timeout=9 ; __bin__/gs", [], []) == key


def test_without_a_fit_an_ordered_file_keeps_true(tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_text("a __temp__/a.log true ; echo a\nb __temp__/b.log true ; echo b\n")
    tab(tmp_path / "current.tab", {"a": 0.1, "b": 9.0})
    assert joborder.order_jobs_file(path, tmp_path / "current.tab").timed == 0
    assert "timeout=" not in path.read_text()


@pytest.mark.parametrize("word", ["adaptive_timeout=x", "adaptive_timeout=-1",
                                  "adaptive_timeout=1.5", "adaptive_timeout"])
def test_a_bad_run_option_is_refused(word: str) -> None:
    with pytest.raises(RunOptionError):
        RunOptions.of((word,), Config())


def test_a_fast_test_in_every_table_gets_the_floor_and_a_slow_one_its_multiple(
        tmp_path: Path) -> None:
    jobs = MemoryJobList(Job(n, f"__temp__/{n}.log", "true") for n in ("a", "b", "c"))
    tables = [tab(tmp_path / name, {"a": 0.1, "b": 9.0, "c": 0.1 if name != "previous.tab"
                                    else 30.0}) for name in jobtimeouts.TABLES]
    timeouts = jobtimeouts.job_timeouts(jobs, tables, multiple=10, floor=60, limit=450)
    assert timeouts is not None
    assert list(timeouts) == [60.0, 90.0, 60.0]  # c: median of 0.1, 30, 0.1 is 0.1


def test_the_node_takes_the_shorter_of_the_jobs_own_timeout_and_its_limit() -> None:
    pool = SlotPool(0, {}, timeout=450.0, kill_grace=1.0)
    assert pool.limit_of(Job("a", "__temp__/a.log", "true")) == 450.0
    assert pool.limit_of(Job("a", "__temp__/a.log", "true", 2.0)) == 2.0
    # An own timeout never lengthens the node's limit.
    assert pool.limit_of(Job("a", "__temp__/a.log", "true", 900.0)) == 450.0
