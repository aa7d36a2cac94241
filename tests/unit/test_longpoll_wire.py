"""The heartbeat's long-poll headers (``wait``, ``skip``) in cluster.wire.heartbeat: pure code."""

from __future__ import annotations

import pytest

from cluster.errors import ProtocolError
from cluster.wire.heartbeat import (
    MAX_LINE,
    MAX_SKIP,
    Heartbeat,
    format_heartbeat,
    format_wait,
    parse_heartbeat,
)


def test_wait_and_skip_round_trip() -> None:
    """wait and skip survive format and parse; their absence stays None / empty."""
    for hb in (Heartbeat("n1", wait=10.0),
               Heartbeat("n1", "idle", "os=Linux", 0.5, frozenset({"r1", "20190408115600"})),
               Heartbeat("n1", skip=frozenset({"user-alice-1"})),
               Heartbeat("n1")):
        assert parse_heartbeat(format_heartbeat(hb)) == hb


def test_old_request_has_no_wait() -> None:
    """A request without the new headers is the old one: answered at once."""
    assert parse_heartbeat(b"node a\nstatus idle\nOK\n") == Heartbeat("a", "idle")


def test_skip_lines_accumulate_and_take_several_ids() -> None:
    """skip may repeat and carry several ids a line; the ids are a set."""
    hb = parse_heartbeat(b"node a\nskip r1 r2\nskip r3\nskip r1\nwait 2.25\nOK\n")
    assert hb.skip == {"r1", "r2", "r3"} and hb.wait == 2.25


def test_many_skip_ids_fit_lines_within_the_limit() -> None:
    """format_heartbeat packs skip ids into lines within MAX_LINE, and they parse back."""
    ids = frozenset(f"{i:02d}-" + "x" * 60 for i in range(MAX_SKIP))
    data = format_heartbeat(Heartbeat("a", skip=ids))
    assert max(len(line) for line in data.split(b"\n")) <= MAX_LINE
    assert parse_heartbeat(data).skip == ids


@pytest.mark.parametrize(("data", "problem"), [
    (b"node a\nwait soon\nOK\n", "seconds"),
    (b"node a\nwait -1\nOK\n", "seconds"),
    (b"node a\nwait 1e9\nOK\n", "seconds"),
    (b"node a\nskip\nOK\n", "one or more run ids"),
    (b"node a\nskip ../etc\nOK\n", "not a run id"),
    (b"node a\n" + b"".join(b"skip " + b" ".join(b"r%d" % (i * 10 + j) for j in range(10))
                            + b"\n" for i in range(7)) + b"OK\n", f"more than {MAX_SKIP}"),
])
def test_bad_wait_or_skip_is_refused(data: bytes, problem: str) -> None:
    """A malformed wait or skip is a ProtocolError saying what was expected."""
    with pytest.raises(ProtocolError, match=problem):
        parse_heartbeat(data)


def test_format_refuses_what_the_parser_would() -> None:
    """The client side refuses bad waits, bad ids and too many ids before sending."""
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seconds"):
            format_wait(bad)
    with pytest.raises(ValueError, match="not a job id"):
        format_heartbeat(Heartbeat("a", skip=frozenset({"a b"})))
    with pytest.raises(ValueError, match=f"at most {MAX_SKIP}"):
        format_heartbeat(Heartbeat("a", skip=frozenset(f"r{i}" for i in range(MAX_SKIP + 1))))
    assert format_wait(10) == "10" and format_wait(0.5) == "0.5" and format_wait(0) == "0"


def test_a_goodbye_is_one_header_and_an_older_monitor_ignores_it() -> None:
    """``bye yes``: the node leaves for good (docs/provisioning.md, "Ended nodes leave the
    lists"); any other value is refused, and a heartbeat without it is no goodbye."""
    sent = format_heartbeat(Heartbeat("slurm-41", bye=True))
    assert sent == b"node slurm-41\nbye yes\nOK\n"
    assert parse_heartbeat(sent).bye
    assert not parse_heartbeat(b"node slurm-41\nOK\n").bye
    with pytest.raises(ProtocolError, match="bye"):
        parse_heartbeat(b"node slurm-41\nbye no\nOK\n")
