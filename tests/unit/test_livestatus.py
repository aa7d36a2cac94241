"""The live status of a run: rate and eta math, the live dict from a RunState, its file."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest

from cluster.master.state.livestatus import (
    RATE_WINDOW,
    VERSION,
    LiveStatus,
    RateMeter,
    eta,
    rate,
    remove_if_run,
)
from cluster.master.state.runstate import RunState
from cluster.records import Job, JobResult
from cluster.runtime.clock import FakeClock
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import Request

MD5 = "0123456789abcdef0123456789abcdef"
RUN = "20261123000000-p2-abcd"


def start(run_id: str = RUN) -> JobStart:
    return JobStart(id=run_id, priority=2, queue="auto nightly gs", kind="auto",
                    ref="nightly", products=("gs",), tree="ghostpdl", source="ghostpdl",
                    build="build", tests="tests")


def jobs(n: int) -> list[Job]:
    return [Job(f"t{i:03d}.ps", f"__temp__/t{i:03d}.log", f"echo {i}") for i in range(n)]


# ------------------------------------------------------------------------ rate and eta
def test_rate_is_results_per_second_between_the_oldest_and_newest_sample() -> None:
    assert rate([(0.0, 0), (10.0, 50)]) == 5.0
    assert rate(deque([(3.0, 10), (4.0, 12), (7.0, 30)])) == 5.0


@pytest.mark.parametrize("samples", [[], [(1.0, 5)], [(2.0, 5), (2.0, 9)], [(1.0, 5), (9.0, 5)]])
def test_rate_is_zero_without_two_samples_time_or_progress(samples: list[tuple[float, int]]
                                                           ) -> None:
    assert rate(samples) == 0.0


def test_eta_is_now_plus_remaining_over_rate() -> None:
    assert eta(1000.0, 50, 5.0) == 1010.0
    assert eta(1000.0, 0, 0.0) == 1000.0  # nothing left: it ends now (uploads)
    assert eta(1000.0, 7, 0.0) is None    # no rate yet: unknown


def test_the_rate_meter_spans_the_last_window_only() -> None:
    meter = RateMeter(window=30.0)
    # 10 results a second for 60 s, then 2 a second.
    done = 0
    for t in range(61):
        got = meter.add(float(t), done)
        done += 10
    assert got == pytest.approx(10.0)
    for t in range(61, 92):
        done += 2
        got = meter.add(float(t), done)
    # The last 30 s saw only the slow rate (the oldest sample kept is 30 s old at most
    # one tick more), and the ring stays small.
    assert got == pytest.approx(2.0, rel=0.15)
    assert len(meter.samples) <= 32
    assert meter.samples[0][0] <= 91 - 30 < meter.samples[1][0]


def test_the_default_window_is_thirty_seconds() -> None:
    assert RATE_WINDOW == 30.0


# ------------------------------------------------------------------------ the live dict
def test_the_live_dict_follows_the_run_state(tmp_path: Path) -> None:
    clock = FakeClock(start=1_763_900_000.0, monotonic_start=500.0)
    state = RunState(RUN, jobs(20), clock.monotonic())
    path = tmp_path / "live.2.json"
    live = LiveStatus(path, start(), started=1_763_899_000.0, clock=clock)
    first = live.update(state, [])
    assert json.loads(path.read_text()) == first
    assert first["version"] == VERSION and first["run"] == RUN and first["priority"] == 2
    assert first["kind"] == "auto" and first["queue"] == "auto nightly gs"
    assert first["products"] == ["gs"] and first["started"] == 1_763_899_000.0
    assert first["jobs"] == {"total": 20, "done": 0, "running": 0, "left": 20}
    assert first["rate"] == 0.0 and first["eta"] is None and first["nodes"] == {}

    now = clock.monotonic()
    first = Request(node="n1", job_id=RUN, built=RUN, slots=2, caps="c1")
    assert state.handle(first, now).reply.verb == protocol.BUILD
    second = Request(node="n1", job_id=RUN, built=RUN, slots=2, status="ok")
    reply = state.handle(second, now).reply
    got = [line.split(" ", 1)[0] for line in reply.jobs]
    assert got
    clock.advance(2.0)
    # Three results: one fine, one error 1, one timeout (3).
    results = (JobResult(got[0], 0, 0.1, 0, 0, MD5, "gs"),
               JobResult(got[1], 1, 0.1, 0, 0, "0", "gs"),
               JobResult(got[2], 3, 0.1, 0, 0, "0", "gs"))
    state.handle(Request(node="n1", job_id=RUN, built=RUN, slots=2, status="ok", results=results,
                         pending=len(got) - 3, running=len(got) - 3), clock.monotonic())
    clock.advance(1.0)
    second = live.update(state, ["n9 (gone)"])
    held = len(state.nodes["n1"].held)
    assert second["jobs"] == {"total": 20, "done": 3, "running": held,
                              "left": 20 - 3 - held}
    assert second["rate"] == pytest.approx(1.0)  # 3 results in the 3 s between samples
    assert second["eta"] == pytest.approx(clock.time() + 17 / 1.0)
    node = second["nodes"]["n1"]
    assert node["done"] == 3 and node["errors"] == 2 and node["timeouts"] == 1
    assert node["state"] == "ready" and node["slots"] == 2 and node["caps"] == "c1"
    # last_seen is wall clock: the node called 1 s before this update.
    assert node["last_seen"] == pytest.approx(clock.time() - 1.0)
    assert second["lost"] == ["n9 (gone)"] and second["fatal"] == "" \
        and second["stopping"] == ""
    assert state.errors == 2


def test_a_stop_shows_in_the_live_dict(tmp_path: Path) -> None:
    clock = FakeClock()
    state = RunState(RUN, jobs(2), clock.monotonic())
    live = LiveStatus(tmp_path / "live.json", start(), clock.time(), clock)
    state.fatal = live.stopping = "stopped by alice@host: disk full"
    out = live.update(state, [])
    assert out["stopping"] == out["fatal"] == "stopped by alice@host: disk full"


def test_a_failed_write_does_not_stop_the_run(tmp_path: Path) -> None:
    clock = FakeClock()
    state = RunState(RUN, jobs(2), clock.monotonic())
    live = LiveStatus(tmp_path / "no-such-dir" / "live.json", start(), clock.time(), clock)
    assert live.update(state, [])["run"] == RUN
    assert live.failing


def test_removal_touches_only_this_runs_file(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "live.json"
    state = RunState(RUN, jobs(2), clock.monotonic())
    live = LiveStatus(path, start(), clock.time(), clock)
    live.update(state, [])
    remove_if_run(path, "another-run")
    assert path.exists()
    live.remove()
    assert not path.exists()
    live.remove()  # gone already: no error
    path.write_text("{torn")
    remove_if_run(path, "whatever")  # unreadable: cannot be a later run's
    assert not path.exists()


def test_errors_of_journaled_results_are_counted_on_takeover() -> None:
    lines = [f"n1 result t000.ps 0 0.10 0.00 0.00 {MD5} gs",
             "n1 result t001.ps 3 0.10 0.00 0.00 0 gs",
             "n2 result t002.ps 10 0.10 0.00 0.00 0 gs",
             "n2 result t002.ps 0 0.10 0.00 0.00 0 gs"]  # a later copy: not counted
    state = RunState(RUN, jobs(5), 0.0, done=lines)
    assert state.errors == 2 and state.results.count == 3
