"""Slowest tests first (cluster.master.model.joborder): the order, and the jobs file rewritten in
it from the baseline's times, which the master then hands out from its head."""

from __future__ import annotations

from pathlib import Path

from cluster.master.model.joblist import JobFile
from cluster.master.model.joborder import UNKNOWN, order_jobs_file, slowest_first
from cluster.report.tab import TabRow, write_tab


def test_unknown_times_first_then_the_longest_and_equal_times_keep_their_order() -> None:
    times = [0.5, 3.0, UNKNOWN, 0.5, 10.0, UNKNOWN, 3.0, 0.0]
    assert slowest_first(times) == [2, 5, 4, 1, 6, 0, 3, 7]


def test_no_time_known_leaves_the_order_alone() -> None:
    assert slowest_first([UNKNOWN] * 4) == [0, 1, 2, 3]
    assert slowest_first([]) == []


def job(name: str) -> str:
    return f"{name} __temp__/{name}.log true ; echo {name} | md5sum"


def row(name: str, t1: float, t2: float = 0.0, t3: float = 0.0) -> TabRow:
    return TabRow(name, 0, t1, t2, t3, "a" * 32, "r", "gs", "n1")


def test_the_jobs_file_is_rewritten_slowest_first_by_the_baseline(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    names = ["a", "b", "c", "d", "e"]
    jobs.write_text("".join(job(n) + "\n" for n in names))
    baseline = tmp_path / "current.tab"
    # b's stages add up to the most; e is new (no row); x is not in the run.
    write_tab(baseline, [row("a", 0.1), row("b", 1.0, 2.0, 0.5), row("c", 2.0),
                         row("d", 0.1), row("x", 99.0)])
    done = order_jobs_file(jobs, baseline)
    assert (done.jobs, done.known, done.rewritten) == (5, 4, True)
    assert jobs.read_text() == "".join(job(n) + "\n" for n in ["e", "b", "c", "a", "d"])
    # The file stays one the master reads a batch of with one read: dense, in order.
    listed = JobFile(jobs)
    try:
        assert listed.names == ["e", "b", "c", "a", "d"] and listed.dense
        assert listed.lines([0, 1, 2]) == [job("e"), job("b"), job("c")]
    finally:
        listed.close()


def test_no_baseline_or_the_same_order_leaves_the_file_untouched(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.write_text(job("a") + "\n" + job("b") + "\n")
    before = jobs.stat().st_ino
    done = order_jobs_file(jobs, tmp_path / "none.tab")
    assert (done.known, done.rewritten) == (0, False)
    write_tab(tmp_path / "current.tab", [row("a", 2.0), row("b", 1.0)])
    assert not order_jobs_file(jobs, tmp_path / "current.tab").rewritten
    assert jobs.stat().st_ino == before
