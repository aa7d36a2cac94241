"""The running runs a queue transaction never touches: one, several (priority 0 has a
running run per busy lane), or one whose line is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.home import Home
from cluster.queue import QUEUED, REPLACED, QueueFile, running_indices
from cluster.runspec import RunSpec


def specs(*lines: str) -> list[RunSpec]:
    return [RunSpec.parse(line) for line in lines]


def indexed(*lines: str) -> list[tuple[int, RunSpec]]:
    return list(enumerate(specs(*lines)))


@pytest.fixture
def queue(tmp_path: Path) -> QueueFile:
    home = Home(tmp_path / "home")
    home.create()
    return QueueFile.for_priority(home, 0)


def fill(queue: QueueFile, *lines: str) -> None:
    for spec in specs(*lines):
        queue.append(spec, duplicate=True)


def lines(queue: QueueFile) -> list[str]:
    return [s.line() for s in queue.read()]


def test_one_run_and_none_as_before() -> None:
    runs = indexed("user ann gs", "user bob gs", "user ann gs")
    assert running_indices(runs, None, False) == set()
    assert running_indices(runs, RunSpec.parse("user ann gs"), False) == {0}
    assert running_indices(runs, None, True) == {0}
    assert running_indices([], None, True) == set()


def test_each_running_run_takes_the_first_equal_line_not_taken() -> None:
    runs = indexed("user ann gs", "user bob gs", "user ann gs", "user cat gs")
    assert running_indices(runs, specs("user ann gs", "user bob gs"), False) == {0, 1}
    # Two lanes running the same line hold its first two copies.
    assert running_indices(runs, specs("user ann gs", "user ann gs"), False) == {0, 2}
    # A running run no longer queued takes nothing.
    assert running_indices(runs, specs("user dan gs", "user cat gs"), False) == {3}


def test_an_unknown_running_run_is_the_first_line_not_taken() -> None:
    runs = indexed("user ann gs", "user bob gs", "user cat gs")
    assert running_indices(runs, specs("user ann gs"), True) == {0, 1}
    assert running_indices(runs, specs("user bob gs"), True) == {0, 1}
    assert running_indices(runs, (), True) == {0}


def test_submit_replaces_no_running_run_of_any_lane(queue: QueueFile) -> None:
    fill(queue, "user ann gs", "user cat gs", "user ann gs lowres")
    running = specs("user ann gs", "user cat gs")

    def same(who: str):  # noqa: ANN202 -- a predicate
        return lambda s: s.ref == who

    # ann's running run stays; her waiting one is replaced in place.
    done = queue.submit(RunSpec.parse("user ann gs highres"), same=same("ann"),
                        running=running)
    assert (done.outcome, done.position) == (REPLACED, 3)
    # cat's only run is running (lane 3): her push is queued after it.
    done = queue.submit(RunSpec.parse("user cat gs lowres"), same=same("cat"),
                        running=running)
    assert done.outcome == QUEUED
    assert lines(queue) == ["user ann gs", "user cat gs", "user ann gs highres",
                            "user cat gs lowres"]


def test_withdraw_keeps_every_running_copy(queue: QueueFile) -> None:
    fill(queue, "user ann gs", "user ann gs", "user ann gs", "user bob gs")
    gone = queue.withdraw(lambda s: s.ref == "ann",
                          running=specs("user ann gs", "user ann gs"))
    assert [s.line() for s in gone] == ["user ann gs"]
    assert lines(queue) == ["user ann gs", "user ann gs", "user bob gs"]


def test_withdraw_with_an_unknown_lane_keeps_the_first_run_not_named(
        queue: QueueFile) -> None:
    fill(queue, "user ann gs", "user bob gs", "user cat gs")
    gone = queue.withdraw(lambda s: True, running=specs("user bob gs"), head_running=True)
    assert [s.line() for s in gone] == ["user cat gs"]
    assert lines(queue) == ["user ann gs", "user bob gs"]


def test_replace_never_rewrites_a_running_line(queue: QueueFile) -> None:
    fill(queue, "user ann gs", "user bob gs", "user bob gs")
    running = specs("user ann gs", "user bob gs")
    assert not queue.replace(RunSpec.parse("user ann gs"), RunSpec.parse("user ann gs order=1"),
                             running=running)
    assert queue.replace(RunSpec.parse("user bob gs"), RunSpec.parse("user bob gs order=1"),
                         running=running)
    assert lines(queue) == ["user ann gs", "user bob gs", "user bob gs order=1"]
