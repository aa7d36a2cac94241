"""RunState takes a result only from a node the job was handed to (issue 11)."""

from __future__ import annotations

from cluster.master.runstate import RunState, Settings
from cluster.wire import protocol
from cluster.wire.protocol import format_result
from tests.unit.test_runstate import RUN, jobs, names, ready, req, result

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
    assert state.lessee.itemsize == 4 and len(state.lessee) == 1000
    assert not state.more_lessees
