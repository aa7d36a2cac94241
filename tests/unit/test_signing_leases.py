"""RunState takes a result only from the node process a job was handed to, for that try."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.master.model.leases import (
    LEASES_FILE,
    LeaseLog,
    format_ranges,
    parse_ranges,
    read_leases,
)
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.wire import protocol
from cluster.wire.protocol import format_result
from tests.unit.test_runstate import RUN, finish, jobs, names, ready, req, result

FAKE = "deadbeefdeadbeefdeadbeefdeadbeef"


def test_a_result_for_a_job_of_another_node_is_refused_the_rest_goes_on() -> None:
    state = RunState(RUN, jobs(8), 0, Settings(batch_per_slot=2))
    mine = names(ready(state, "n1"))           # 4 jobs to n1
    theirs = names(ready(state, "n2"))         # 4 others to n2
    assert not set(mine) & set(theirs)
    out = state.handle(req("n1", results=(result(mine[0], "n1"),
                                          result(theirs[0], "n1", FAKE))), 1.0)
    assert out.results == 2 and out.refused == 1
    assert state.results.count == 1 and mine[0] in state.results
    assert theirs[0] not in state.results
    assert any("refused 1 result(s) for jobs never handed to it" in n for n in out.notes)
    assert out.reply.verb == protocol.JOBS  # the request went on: more work
    # Canonical (text) results, as the master parses them, are checked the same way.
    text = format_result(result(theirs[1], "n1", FAKE))[len("result "):]
    out = state.handle(req("n1", result_lines=(text,)), 1.5)
    assert out.refused == 1 and theirs[1] not in state.results
    # n2's own result is taken.
    out = state.handle(req("n2", results=(result(theirs[0], "n2"),)), 2.0)
    assert out.refused == 0 and state.results[theirs[0]].md5 != FAKE


def test_a_node_that_never_got_jobs_and_unknown_nodes_are_refused() -> None:
    state = RunState(RUN, jobs(4), 0)
    handed = names(ready(state, "n1"))
    out = state.handle(req("stranger", results=(result(handed[0], "stranger"),)), 1.0)
    assert out.refused == 1 and state.results.count == 0
    assert out.reply.verb == protocol.BUILD  # its first contact still counts
    # Mixed with a result for a test not in the run: the slow path refuses it too.
    out = state.handle(req("stranger", results=(result(handed[0], "stranger"),
                                                result("nosuch.ps", "stranger"))), 1.5)
    assert out.refused == 1 and state.unknown_results == 1 and state.results.count == 0


def test_jobs_handed_out_again_may_come_back_from_every_node_that_got_them() -> None:
    """A dead node's jobs go to another; the first node's late result is still its own."""
    state = RunState(RUN, jobs(2), 0, Settings(heartbeat_timeout=10, batch_per_slot=1))
    first = names(ready(state, "n1", slots=2))
    assert len(first) == 2
    state.tick(11.0)                            # n1 silent: dropped, its jobs put back
    again = names(ready(state, "n2", now=11.0))
    assert sorted(again) == sorted(first)       # reassigned to n2
    assert state.leased_to("n1", first[0]) and state.leased_to("n2", first[0])
    # n1 comes back (a new node, BUILD) with a result it had finished: taken, as before.
    out = state.handle(req("n1", results=(result(first[0], "n1"),)), 12.0)
    assert out.refused == 0 and first[0] in state.results
    out = state.handle(req("n2", results=(result(first[0], "n2"), result(first[1], "n2"))),
                       12.5)
    assert out.refused == 0 and state.duplicates == 1 and state.all_results_in


def test_lease_memory_is_an_array_not_a_set_per_node() -> None:
    state = RunState(RUN, jobs(1000), 0)
    assert state.leases.lessee.itemsize == 4 and len(state.leases.lessee) == 1000
    assert not state.leases.more


def test_no_lessee_never_matches_a_node_never_handed_a_job() -> None:
    """-1 (no job handed to anyone yet) and -1 (a node handed nothing) are not a match: a
    node's first request with results for every job of the run records none of them."""
    state = RunState(RUN, jobs(6), 0)
    forged = tuple(result(n, "x", FAKE) for n in state.jobs.names)
    out = state.handle(req("x", results=forged), 0.0)
    assert out.reply.verb == protocol.BUILD
    assert out.refused == 6 and state.results.count == 0 and not out.journal
    assert sum("refused 6 result(s)" in n for n in out.notes) == 1  # one line per request
    # Nor later, once it is ready and holds some jobs: only those are its own.
    held = names(state.handle(req("x", slots=1), 1.0).reply)
    out = state.handle(req("x", slots=1, results=forged), 2.0)
    assert out.refused == 6 - len(held)
    assert sorted(state.results) == sorted(held)


def test_another_process_under_the_same_name_holds_none_of_the_leases() -> None:
    """A node is a process: a new session under a known name is a new node, and the jobs
    handed to the old process are not its to report."""
    state = RunState(RUN, jobs(4), 0)
    assert state.handle(req("n1"), 0.0, session="a" * 16).reply.verb == protocol.BUILD
    held = names(state.handle(req("n1"), 0.0, session="a" * 16).reply)
    assert held and state.leased_to("n1", held[0], "a" * 16)
    assert not state.leased_to("n1", held[0], "b" * 16)
    out = state.handle(req("n1", results=(result(held[0], "n1", FAKE),)), 1.0,
                       session="b" * 16)
    assert out.refused == 1 and held[0] not in state.results


def test_a_try_put_back_is_no_longer_the_nodes() -> None:
    """A sweep task whose try was not taken (retry) goes back; a result of that same try
    sent again is refused, the node's later try of it (handed out again) is taken."""
    state = RunState(RUN, jobs(2), 0, Settings(batch_per_slot=1))
    held = names(ready(state, "n1", slots=1))
    state.retry("n1", held[0])
    assert not state.leased_to("n1", held[0])
    out = state.handle(req("n1", slots=1, results=(result(held[0], "n1", FAKE),)), 1.0)
    assert out.refused == 1 and held[0] not in state.results


def test_a_confirm_phase_takes_only_results_of_the_jobs_it_handed_out() -> None:
    """A confirm phase's state adopts the first phase's nodes as they are: their results
    for confirm jobs it has not handed out (a late copy of the first phase's) are refused."""
    first = RunState(RUN, jobs(2), 0)
    finish(first, "n1", ready(first, "n1"))
    confirm = RunState(RUN, jobs(2), 0)
    confirm.confirming = True
    confirm.adopt_nodes(first)
    out = confirm.handle(req("n1", results=(result(confirm.jobs.names[0], "n1", FAKE),)),
                         1.0)
    assert out.refused == 1 and confirm.results.count == 0


def test_the_lease_log_round_trips_and_skips_what_is_torn(tmp_path: Path) -> None:
    path = tmp_path / LEASES_FILE
    log = LeaseLog(path)
    log.append("n1", "ab" * 8, [0, 1, 2, 3])
    log.append("n2", "", [5, 7, 8, 9])
    log.close()
    with open(path, "ab") as fh:
        fh.write(b"n3 zz 1\nn4 - 99\nn5 - 1-\nn6 ")  # bad session, out of range, torn
    assert format_ranges([5, 7, 8, 9]) == "5,7-9"
    assert list(read_leases(path, 10)) == [("n1", "ab" * 8, [0, 1, 2, 3]),
                                           ("n2", "", [5, 7, 8, 9])]
    state = RunState(RUN, jobs(10), 0)
    assert state.leases.load(read_leases(path, 10)) == 8
    assert state.leased_to("n1", state.jobs.names[3], "ab" * 8)
    assert state.leased_to("n2", state.jobs.names[8])
    assert not state.leased_to("n2", state.jobs.names[6])
    with pytest.raises(ValueError, match="outside the run's 10 jobs"):
        parse_ranges("3-12", 10)


def test_results_for_unknown_tests_are_one_line_per_request_with_a_count() -> None:
    """An insider's flood of results for tests not in the run is counted and said once per
    request, never a line per result, and nothing is recorded."""
    state = RunState(RUN, jobs(2), 0)
    held = names(ready(state, "n1"))
    flood = tuple(result(f"nosuch{i}.ps", "n1") for i in range(1000))
    out = state.handle(req("n1", results=(result(held[0], "n1"), *flood)), 1.0)
    assert state.unknown_results == 1000 and state.results.count == 1
    unknown = [n for n in out.notes if "unknown tests" in n]
    assert len(unknown) == 1 and "sent 1000 result(s) for unknown tests" in unknown[0]
    assert len("\n".join(out.notes)) < 500
