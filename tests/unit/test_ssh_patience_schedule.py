"""The pauses of the ssh transport's retries (docs/protocol.md, "A blink of the link"): 0.2,
0.5, 1, 2, 5 s, then 5 s again, none begun that would end past the call's budget; the
budget is ``ssh_retry_time``, at most half of ``heartbeat_timeout``."""

from __future__ import annotations

from cluster.config import Config
from cluster.node.sshtransport import RETRY_PAUSES, Patience, retry_time


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pauses(patience: Patience, clock: Clock, per_try: float) -> list[float]:
    """The pauses taken, each try lasting ``per_try`` seconds, until Patience says stop."""
    taken: list[float] = []
    for _ in range(1000):  # bounded; Patience must stop long before
        clock.now += per_try
        pause = patience.next_pause()
        if pause is None:
            return taken
        taken.append(pause)
        clock.now += pause
    raise AssertionError("Patience never said stop")


def test_the_pauses_grow_then_repeat_within_the_budget() -> None:
    clock = Clock()
    taken = _pauses(Patience(30.0, clock), clock, per_try=0.0)
    assert RETRY_PAUSES == (0.2, 0.5, 1.0, 2.0, 5.0)
    # 0.2 + 0.5 + 1 + 2 + 5 = 8.7; then 5 s pauses while they end by 30 s: four more.
    assert taken == [0.2, 0.5, 1.0, 2.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    assert sum(taken) <= 30.0


def test_time_spent_in_the_tries_counts_against_the_budget() -> None:
    clock = Clock()
    patience = Patience(10.0, clock)
    taken = _pauses(patience, clock, per_try=1.0)
    # try 1 s, 0.2, 1 s, 0.5, 1 s, 1, 1 s, 2 (= 7.7 s), 1 s: a 5 s pause would end at 13.7.
    assert taken == [0.2, 0.5, 1.0, 2.0]
    assert patience.spent() <= 10.0


def test_a_budget_shorter_than_the_first_pause_allows_no_retry() -> None:
    clock = Clock()
    assert Patience(0.1, clock).next_pause() is None


def test_the_budget_is_ssh_retry_time_and_at_most_half_the_heartbeat_timeout() -> None:
    assert retry_time(Config()) == 60.0  # the defaults: 60 s, heartbeat_timeout 180 s
    assert retry_time(Config(ssh_retry_time=20.0)) == 20.0
    assert retry_time(Config(heartbeat_timeout=6.0)) == 3.0  # localcluster's one file
