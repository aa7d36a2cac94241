"""Withdrawn copies (docs/results.md, "Withdrawn copies"): the ``withdraw`` reply line and
the ``features`` header (grammar), and the master's bookkeeping of the tail's copies."""

from __future__ import annotations

import pytest

from cluster.errors import ProtocolError
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.records import Job, JobResult
from cluster.wire import protocol, signing
from cluster.wire.protocol import Reply, Request
from cluster.wire.withdraw import WITHDRAW_PER_LINE

MD5 = "0123456789abcdef0123456789abcdef"
RUN = "run-1"
NEW = (protocol.FEATURE_WITHDRAW,)


# ------------------------------------------------------------------ the grammar
def test_a_reply_of_any_verb_but_abort_carries_withdraw_lines_after_its_own() -> None:
    jobs = ("t1.ps a.log true ; echo 1", "t2.ps a.log true ; echo 2")
    for reply in (Reply(protocol.JOBS, jobs, withdraw=("t9.ps.ppmraw.72.0",)),
                  Reply(protocol.CONTINUE, withdraw=("t9.ps", "t8.pdf.pdfwrite.72.0")),
                  Reply(protocol.UPLOAD, withdraw=("t9.ps",)),
                  Reply(protocol.BUILD, withdraw=("t9.ps",)),
                  Reply(protocol.JOBS, (), withdraw=("t9.ps",))):
        data = protocol.format_reply(reply)
        assert data.endswith(("withdraw " + " ".join(reply.withdraw) + "\n").encode())
        assert protocol.parse_reply(data) == reply


def test_a_reply_without_withdrawals_is_byte_for_byte_as_before() -> None:
    assert protocol.format_reply(Reply(protocol.CONTINUE)) == b"CONTINUE\n"
    assert protocol.format_reply(Reply(protocol.JOBS, ("a b true ; c",))) == \
        b"JOBS\n1\na b true ; c\n"
    assert protocol.parse_reply(b"CONTINUE\n").withdraw == ()


def test_many_withdrawals_take_several_lines() -> None:
    tests = tuple(f"t{i}.ps" for i in range(WITHDRAW_PER_LINE * 2 + 1))
    data = protocol.format_reply(Reply(protocol.CONTINUE, withdraw=tests))
    lines = data.decode().splitlines()
    assert lines[0] == "CONTINUE" and len(lines) == 4
    assert all(line.startswith("withdraw ") for line in lines[1:])
    assert protocol.parse_reply(data).withdraw == tests


@pytest.mark.parametrize("data", [
    b"CONTINUE\nwithdrawn t1.ps\n",         # not a withdraw line
    b"CONTINUE\nwithdraw\n",                # names nothing
    b"CONTINUE\nwithdraw t1.ps ../x\n",     # not a test id
    b"JOBS\n1\na b true ; c\nextra\n",      # a line past the counted jobs
    b"JOBS\n3\na b true ; c\nwithdraw t1.ps\n",  # the count does not match
    b"ABORT run complete\nwithdraw t1.ps\n",    # ABORT stops every job anyway
    b"CONTINUE\nwithdraw " + b" ".join(b"t%d" % i for i in range(WITHDRAW_PER_LINE + 1))
    + b"\n",                                # too many on one line
])
def test_malformed_withdraw_lines_make_the_reply_malformed(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.parse_reply(data)


def test_the_signature_covers_the_withdraw_lines() -> None:
    key, nonce = b"k" * 32, "00" * 16
    reply = protocol.format_reply(Reply(protocol.CONTINUE, withdraw=("t1.ps",)))
    signed = signing.sign_reply(reply, key, nonce)
    assert protocol.parse_reply(signing.verify_reply(signed, key, nonce)).withdraw == \
        ("t1.ps",)
    forged = signed.replace(b"withdraw t1.ps", b"withdraw t2.ps")
    with pytest.raises(signing.SignatureError):
        signing.verify_reply(forged, key, nonce)


def test_the_features_header_round_trips_and_keeps_words_it_does_not_know() -> None:
    req = Request(node="n1", job_id=RUN, features=("withdraw", "later-thing"))
    data = protocol.format_request(req)
    assert b"\nfeatures withdraw later-thing\n" in data
    assert protocol.parse_request(data).features == ("withdraw", "later-thing")
    assert protocol.parse_request(data, canonical=True).features == ("withdraw", "later-thing")
    assert protocol.parse_request(b"node n1\nOK\n").features == ()
    with pytest.raises(ProtocolError):
        protocol.parse_request(b"node n1\nfeatures Withdraw!\nOK\n")


# ------------------------------------------------------------------ the master's bookkeeping
def jobs(n: int) -> list[Job]:
    return [Job(f"t{i:04d}.ps.ppmraw.72.0", f"__temp__/t{i:04d}.log", f"echo {i}")
            for i in range(n)]


def req(node: str, features: tuple[str, ...] = NEW, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)
    kw.setdefault("slots", 2)
    return Request(node=node, features=features, **kw)  # type: ignore[arg-type]


def result(name: str, node: str) -> JobResult:
    return JobResult(name, 0, 0.1, 0, 0, MD5, "gs", node)


def names(reply: Reply) -> list[str]:
    return [line.split(" ", 1)[0] for line in reply.jobs]


def ready(state: RunState, node: str, now: float, slots: int = 2,
          features: tuple[str, ...] = NEW) -> Reply:
    assert state.handle(req(node, features, slots=slots), now).reply.verb == protocol.BUILD
    return state.handle(req(node, features, slots=slots), now).reply


def tail(slow_features: tuple[str, ...] = NEW, fast_features: tuple[str, ...] = NEW
         ) -> tuple[RunState, list[str], list[str]]:
    """A run of 3 jobs: ``slow`` (3 slots) holds them all, idle ``fast`` (2 slots) gets
    copies of two; returns the state, slow's jobs and fast's copies."""
    state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=True))
    slow = names(ready(state, "slow", 0, slots=3, features=slow_features))
    copies = names(ready(state, "fast", 1, features=fast_features))
    assert len(slow) == 3 and copies == slow[:2]
    return state, slow, copies


def test_a_copy_that_wins_withdraws_the_original_in_its_nodes_next_reply() -> None:
    state, slow, copies = tail()
    out = state.handle(req("fast", results=(result(copies[0], "fast"),), running=1), 2)
    assert len(out.new_results) == 1 and out.reply.withdraw == ()
    assert copies[0] not in state.nodes["slow"].held and state.withdrawn == 1
    # slow's next call, whatever it carries, is told (once).
    told = state.handle(req("slow", slots=3, pending=0, running=3), 3).reply
    assert told.verb == protocol.CONTINUE and told.withdraw == (copies[0],)
    again = state.handle(req("slow", slots=3, pending=0, running=2), 4).reply
    assert again.withdraw == ()
    # Its own third job still runs there, untouched; the other copy still races.
    assert set(state.nodes["slow"].held) == {copies[1], slow[2]}


def test_an_original_that_wins_withdraws_the_copy() -> None:
    state, slow, copies = tail()
    state.handle(req("slow", slots=3, results=(result(copies[1], "slow"),), running=2), 2)
    told = state.handle(req("fast", running=2), 3).reply
    assert told.withdraw == (copies[1],)
    assert copies[1] not in state.nodes["fast"].held


def test_the_withdrawn_copys_late_result_is_a_duplicate_never_refused() -> None:
    """A copy that ended before its node heard of the withdrawal sends its result: the
    lease stands, so it is a duplicate (the winner's result is the one recorded)."""
    state, slow, copies = tail()
    state.handle(req("fast", results=(result(copies[0], "fast"),)), 2)
    late = state.handle(req("slow", slots=3, results=(result(copies[0], "slow"),)), 3)
    assert late.new_results == () and late.refused == 0 and state.duplicates == 1
    assert state.results[copies[0]].machine == "fast"


def test_an_older_node_is_never_sent_withdraw_lines_and_keeps_its_copy() -> None:
    state, slow, copies = tail(slow_features=())
    state.handle(req("fast", results=(result(copies[0], "fast"),)), 2)
    assert state.withdrawn == 0
    assert copies[0] in state.nodes["slow"].held  # as before: its result is a duplicate
    assert state.handle(req("slow", (), slots=3), 3).reply.withdraw == ()


def test_an_abort_carries_no_withdraw_lines_and_forgets_them() -> None:
    state, slow, copies = tail()
    state.handle(req("fast", results=(result(copies[0], "fast"),)), 2)
    out = state.handle(req("slow", slots=3, leaving=True), 3)
    assert out.reply.verb == protocol.ABORT and out.reply.withdraw == ()
    assert state.nodes["slow"].withdraw == []


def test_without_copies_nothing_is_withdrawn_or_looked_at() -> None:
    state = RunState(RUN, jobs(8), 0, Settings(batch_per_slot=2, speculate_tail=True))
    given = names(ready(state, "a", 0))
    names(ready(state, "b", 0))
    assert not state.copied
    out = state.handle(req("a", results=tuple(result(n, "a") for n in given)), 1)
    assert out.reply.withdraw == () and state.withdrawn == 0


def test_every_copy_settled_leaves_no_copy_marked() -> None:
    state, slow, copies = tail()
    assert state.copied == {state.jobs.index[n] for n in copies}
    state.handle(req("fast", results=tuple(result(n, "fast") for n in copies)), 2)
    assert not state.copied
    assert state.handle(req("slow", slots=3), 3).reply.withdraw == tuple(copies)


def test_the_holders_of_a_copy_are_found_from_its_leases() -> None:
    """The master finds who holds a copied job from the job's leases, not by a walk over
    the nodes: the node process first handed it, then the one given the copy.  A new
    process under a lessee's name is not told."""
    state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=True))
    for session in ("s1", "s1"):
        slow = names(state.handle(req("slow", slots=3), 0, session=session).reply)
    for session in ("f1", "f1"):
        copies = names(state.handle(req("fast"), 1, session=session).reply)
    assert copies == slow[:2]
    assert state.leases.lessees(state.jobs.index[copies[0]]) == [("slow", "s1"),
                                                                  ("fast", "f1")]
    assert state.leases.lessees(state.jobs.index[slow[2]]) == [("slow", "s1")]
    # slow restarts (its old process leaves the run) before fast's result comes.
    assert state.handle(req("slow", slots=3), 2, session="s2").reply.verb == protocol.BUILD
    state.handle(req("fast", results=(result(copies[0], "fast"),)), 3, session="f1")
    assert state.withdrawn == 0
    assert state.handle(req("slow", slots=3), 4, session="s2").reply.withdraw == ()
