"""cluster.runtime.service.StopPoint: a stop request raised where the program is, except in
the steps it holds, at most once, with real signals sent to this process."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from cluster.runtime.service import Stopped, StopPoint


@pytest.fixture
def point() -> Iterator[StopPoint]:
    stop = StopPoint()
    restore = stop.install()
    try:
        yield stop
    finally:
        restore()


def _signal(signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process; its handler has run when this returns (CPython runs
    a pending handler at the next bytecode of the main thread)."""
    os.kill(os.getpid(), signum)


def test_a_request_raises_at_once_outside_any_step(point: StopPoint) -> None:
    with pytest.raises(Stopped) as caught:
        _signal()
    assert caught.value.signum == signal.SIGTERM
    assert caught.value.exit_code == 128 + signal.SIGTERM
    assert point.is_set()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_interrupt_and_hangup_stop_too(point: StopPoint, signum: int) -> None:
    with pytest.raises(Stopped) as caught:
        _signal(signum)
    assert caught.value.signum == signum


def test_a_held_step_is_finished_then_stopped(point: StopPoint) -> None:
    finished = []
    with pytest.raises(Stopped):
        with point.held():
            _signal()
            finished.append("the rest of the step")
    assert finished == ["the rest of the step"]


def test_a_held_step_may_say_itself_how_it_ended(point: StopPoint) -> None:
    """then_raise=False: the step looks at is_set and leaves; nothing is raised at its end,
    and check() raises after it."""
    with point.held(then_raise=False):
        _signal()
        assert point.is_set()
    with pytest.raises(Stopped):
        point.check()


def test_a_second_request_raises_even_in_a_held_step(point: StopPoint) -> None:
    finished = []
    with pytest.raises(Stopped):
        with point.held():
            _signal()
            _signal()
            finished.append("not reached")
    assert finished == []
    assert point.flag.hard


def test_a_failing_held_step_keeps_its_own_exception(point: StopPoint) -> None:
    with pytest.raises(ValueError):
        with point.held():
            _signal()
            raise ValueError("the step's own failure")


def test_quiet_clean_up_is_never_cut_and_raises_nothing(point: StopPoint) -> None:
    done = []
    with point.quiet():
        _signal()
        _signal()  # even a hard stop
        done.append("clean-up")
    assert done == ["clean-up"]
    with pytest.raises(Stopped):
        point.check()


def test_stopped_is_raised_at_most_once(point: StopPoint) -> None:
    """The clean-up a stop sets off runs undisturbed by the requests that follow."""
    cleaned = []
    with pytest.raises(Stopped):
        try:
            _signal()
        finally:
            _signal()
            point.check()
            cleaned.append("released")
    assert cleaned == ["released"]


def test_a_stop_point_never_installed_is_never_set() -> None:
    stop = StopPoint()
    with stop.held():
        pass
    stop.check()
    assert not stop.is_set()


def test_stopped_is_no_exception_a_step_would_swallow() -> None:
    """Raised through ``except Exception`` (a discoverer's, an end step's) untouched."""
    assert not issubclass(Stopped, Exception)
