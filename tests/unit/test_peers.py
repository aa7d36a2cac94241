"""The per-peer bookkeeping of the listeners (runtime/peers): slots per host, and refusals
logged a few in full, then one summary per window, under a lines-a-second bound."""

from __future__ import annotations

import logging

import pytest

from cluster.runtime.peers import (
    MIN_PER_PEER,
    OTHERS,
    PeerSlots,
    RefusalLog,
    host_of,
    per_peer_limit,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_per_peer_limit_is_a_quarter_but_never_small() -> None:
    assert per_peer_limit(10000) == 2500
    assert per_peer_limit(960) == 240
    assert per_peer_limit(100) == MIN_PER_PEER
    assert per_peer_limit(3) == 3
    assert host_of(("10.0.0.5", 4711)) == "10.0.0.5"


def test_slots_cap_each_host_separately() -> None:
    slots = PeerSlots(2)
    assert slots.take("a") and slots.take("a") and not slots.take("a")
    assert slots.take("b")
    slots.give("a")
    assert slots.open("a") == 1 and slots.take("a")
    with pytest.raises(ValueError, match="per_peer=0"):
        PeerSlots(0)


def test_a_flood_from_one_host_is_a_few_lines_and_a_summary(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="t")
    clock = Clock()
    told: list[tuple[str, str]] = []
    refusals = RefusalLog(logging.getLogger("t"), peer_lines=3, window=10, clock=clock,
                          on_summary=lambda host, text: told.append((host, text)))
    logged = [refusals.note("h", "peer %s:%d: bad", "h", i) for i in range(1000)]
    assert logged == [True] * 3 + [False] * 997
    clock.now += 5
    refusals.tick()
    assert len(caplog.records) == 3  # the window has not ended
    clock.now += 6
    refusals.tick()
    summary = caplog.records[-1].getMessage()
    assert summary == ("peer h: 997 more refusals in the last 11 s, not logged one by one; "
                       "the last: peer h:999: bad")
    assert told == [("h", summary)]
    assert refusals.note("h", "again")  # a new window logs in full again


def test_all_hosts_together_are_bounded_in_lines_a_second(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="t")
    clock = Clock()
    refusals = RefusalLog(logging.getLogger("t"), rate=2, burst=4, max_peers=50, clock=clock)
    for i in range(200):  # 200 hosts, one refusal each, in one instant
        refusals.note(f"10.0.0.{i}", "refused %d", i)
    assert len(caplog.records) == 4
    assert OTHERS in refusals.bursts and len(refusals.bursts) == 51
    clock.now += 11
    for _ in range(100):  # the summaries come out at 2 a second
        refusals.tick()
        clock.now += 1
    summaries = [r.getMessage() for r in caplog.records[4:]]
    assert len(summaries) == 47  # 46 hosts with a refusal not logged, and the others
    assert any(s.startswith(f"peer {OTHERS}: 150 more refusals") for s in summaries)
    assert refusals.total == 200 and not refusals.bursts


def test_flush_writes_the_open_bursts_counts_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that closes mid-window loses no count: flush() writes every open burst's
    summary, window and rate aside, and forgets it."""
    caplog.set_level(logging.INFO, logger="t")
    clock = Clock()
    told: list[str] = []
    refusals = RefusalLog(logging.getLogger("t"), peer_lines=1, window=10, clock=clock,
                          on_summary=lambda host, text: told.append(text))
    for i in range(4):
        refusals.note("h", "peer h:%d: bad", i)
    refusals.note("quiet", "peer quiet:1: bad")  # logged in full: nothing to sum up
    clock.now += 2
    refusals.flush()
    assert told == ["peer h: 3 more refusals in the last 2 s, not logged one by one; the "
                    "last: peer h:3: bad"]
    refusals.flush()
    assert len(told) == 1  # forgotten once written
