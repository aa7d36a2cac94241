"""Preemption's decisions (cluster.master.model.preempt): how many nodes a less urgent run
sends to a more urgent one, and which."""

from __future__ import annotations

from cluster.master.model.preempt import Candidate, Donor, Urgent, choose, how_many, share

PUSH = Urgent(priority=0, run="push", jobs_left=0, nodes=0, wanted=1)  # list not made yet


def test_a_push_being_set_up_takes_one_node_of_a_nightly_run() -> None:
    nightly = Donor(priority=2, jobs_left=100, nodes=2)
    assert how_many(PUSH, nightly) == 1


def test_a_big_push_takes_every_node_it_can_use_a_smaller_one_its_share() -> None:
    nightly = Donor(priority=2, jobs_left=10_000, nodes=10)
    big = Urgent(0, "push", jobs_left=2000, nodes=0, wanted=10)
    assert how_many(big, nightly) == 10  # 200,000 against 10,000: all it can use
    small = Urgent(0, "push", jobs_left=30, nodes=0, wanted=10)
    assert share(small, nightly) == 3  # 3,000 against 10,000: ceil(10 * 3/13)
    assert how_many(small, nightly) == 3
    assert how_many(small, nightly, coming=1) == 2
    tiny = Urgent(0, "push", jobs_left=30, nodes=0, wanted=2)  # its size: two nodes' worth
    assert how_many(tiny, nightly) == 2


def test_the_examples_of_the_manual() -> None:
    """docs/runoptions.md, "8. Preemption": beside a nightly run of 10,000 jobs on 10 nodes
    of one slot (one node per 20 jobs: wire/resources.nodes_wanted)."""
    from cluster.wire.resources import nodes_wanted

    nightly = Donor(2, jobs_left=10_000, nodes=10)
    for jobs, owed in ((300, 8), (2000, 10), (30, 2)):
        push = Urgent(0, "push", jobs, nodes=0, wanted=nodes_wanted(jobs, 1, 100))
        assert how_many(push, nightly) == owed, jobs


def test_sizes_and_priorities_weigh_a_commit_run_against_a_nightly_run() -> None:
    commit = Urgent(1, "commit", jobs_left=100, nodes=0, wanted=10)
    nightly = Donor(2, jobs_left=900, nodes=10)
    assert how_many(commit, nightly) == 6  # 1,000 against 900 of 10 nodes: ceil(5.26)


def test_never_below_min_nodes_never_from_an_equal_or_more_urgent_run() -> None:
    assert how_many(PUSH, Donor(2, 100, nodes=1, min_nodes=1)) == 0
    big = Urgent(0, "push", jobs_left=5000, nodes=0, wanted=8)
    assert how_many(big, Donor(2, 100, nodes=5, min_nodes=2)) == 3
    assert how_many(PUSH, Donor(0, 100, nodes=4)) == 0
    assert how_many(Urgent(1, "c", 100, 0, 4), Donor(0, 100, nodes=4)) == 0


def test_nodes_there_on_their_way_or_idle_count_against_the_need() -> None:
    nightly = Donor(2, 100, nodes=4)
    assert how_many(PUSH, nightly, idle=1) == 0  # an idle node joins it on its own
    assert how_many(PUSH, nightly, coming=1) == 0  # one was sent already
    assert how_many(Urgent(0, "p", 0, nodes=1, wanted=1), nightly) == 0
    assert how_many(Urgent(0, "p", 0, 0, wanted=0), nightly) == 0  # stopping: wants none


def test_the_least_urgent_run_gives_first() -> None:
    big = Urgent(0, "push", jobs_left=5000, nodes=0, wanted=3)
    commit = Donor(1, 100, nodes=4)
    nightly = Donor(2, 100, nodes=2, min_nodes=0)
    assert how_many(big, nightly, [commit]) == 2  # the nightly run's two
    assert how_many(big, commit, [nightly]) == 1  # the commit run the rest


def test_the_nodes_chosen_hold_the_fewest_jobs_then_have_the_fewest_slots() -> None:
    nodes = [Candidate("a", held=4, slots=2), Candidate("b", held=1, slots=8),
             Candidate("c", held=1, slots=2), Candidate("d", held=0, slots=2)]
    assert choose(nodes, 2) == ["d", "c"]
    assert choose(nodes, 0) == []
    assert choose(nodes, 9) == ["d", "c", "b", "a"]


def test_a_successor_master_drops_a_moving_node_as_moved_not_lost() -> None:
    """A master that took the run over knows nothing of the move but the node's `moving`
    header: its leaving call drops it as moved, not lost; the header goes over the wire."""
    from cluster.master.state.runstate import RunState
    from cluster.records import Job
    from cluster.wire import protocol
    from cluster.wire.protocol import Request

    state = RunState("run-1", [Job("t1.ps.ppmraw.72.0", "__temp__/t1.log", "true")], 0)
    call = Request(node="a", job_id="run-1", built="run-1", slots=1)
    assert state.handle(call, 0).reply.verb == protocol.BUILD
    why = "preempted: for run 20260101000000-p0-beef (priority 0)"
    leaving = Request(node="a", job_id="run-1", built="run-1", slots=1, leaving=True,
                      moving=why)
    assert protocol.parse_request(protocol.format_request(leaving)).moving == why
    assert state.handle(leaving, 1).reply.reason == protocol.ABORT_GOODBYE
    assert not state.lost
    assert state.left == ["a (moved to run 20260101000000-p0-beef (priority 0); 0 unfinished "
                          "jobs put back)"]
