"""The master's run state: batching, node death, late and duplicate results, joins, failures."""

from __future__ import annotations

import pytest

from cluster.master.state.nodeinfo import NodeState
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.records import Job, JobResult
from cluster.wire import protocol
from cluster.wire.protocol import Request

MD5 = "0123456789abcdef0123456789abcdef"
RUN = "run-1"


def jobs(n: int) -> list[Job]:
    return [Job(f"t{i:04d}.ps.ppmraw.72.0", f"__temp__/t{i:04d}.log", f"echo {i}")
            for i in range(n)]


def req(node: str, **kw: object) -> Request:
    kw.setdefault("job_id", RUN)
    kw.setdefault("built", RUN)  # a node past its build says so in every call
    kw.setdefault("slots", 2)
    return Request(node=node, **kw)  # type: ignore[arg-type]


def result(name: str, node: str, md5: str = MD5) -> JobResult:
    return JobResult(name, 0, 0.1, 0, 0, md5, "gs", node)


def names(reply: protocol.Reply) -> list[str]:
    return [line.split(" ", 1)[0] for line in reply.jobs]


def ready(state: RunState, node: str, now: float = 0.0, slots: int = 2) -> protocol.Reply:
    """Walk a node through first contact (BUILD) and a not-busy call; return that reply."""
    assert state.handle(req(node, slots=slots), now).reply.verb == protocol.BUILD
    return state.handle(req(node, slots=slots), now).reply


def finish(state: RunState, node: str, reply: protocol.Reply, now: float = 0.0,
           slots: int = 2) -> protocol.Reply:
    """Report every job of ``reply`` as done; return the master's next reply."""
    results = tuple(result(n, node) for n in names(reply))
    return state.handle(req(node, slots=slots, results=results), now).reply


def test_wrong_id_is_aborted_and_not_remembered() -> None:
    state = RunState(RUN, jobs(4), 0)
    out = state.handle(req("a", job_id="old-run"), 0)
    assert out.reply.verb == protocol.ABORT and "wrong job id" in out.reply.reason
    assert "a" not in state.nodes
    assert state.handle(req("a"), 1).reply.verb == protocol.BUILD  # may come back later


def test_unsuitable_caps_cull_the_node_for_the_run() -> None:
    def suitable(caps: str) -> tuple[bool, str]:
        return ("tools=gs" in caps, "missing tools: gs")

    state = RunState(RUN, jobs(4), 0, suitable=suitable)
    first = state.handle(req("a", caps="tools=none"), 0)
    assert first.reply.verb == protocol.ABORT and "missing tools: gs" in first.reply.reason
    # Even with better caps later, a culled node stays out of this run.
    assert state.handle(req("a", caps="tools=gs"), 1).reply.verb == protocol.ABORT
    assert state.handle(req("b", caps="tools=gs"), 1).reply.verb == protocol.BUILD


def test_first_contact_builds_busy_continues_then_jobs() -> None:
    state = RunState(RUN, jobs(10), 0)
    assert state.handle(req("a"), 0).reply.verb == protocol.BUILD
    assert state.handle(req("a", busy="build"), 1).reply.verb == protocol.CONTINUE
    assert state.nodes["a"].state is NodeState.BUILDING
    reply = state.handle(req("a"), 2).reply
    assert reply.verb == protocol.JOBS
    assert state.nodes["a"].state is NodeState.READY


def test_batch_fills_slots_times_depth_and_no_more() -> None:
    """A 4-slot node is kept holding 8 jobs; it gets only what it lacks."""
    state = RunState(RUN, jobs(100), 0, Settings(batch_per_slot=2))
    reply = ready(state, "a", slots=4)
    assert len(reply.jobs) == 8
    # Holding 5 (3 pending, 2 running) it may take 3 more.
    more = state.handle(req("a", slots=4, pending=3, running=2), 1).reply
    assert len(more.jobs) == 3
    full = state.handle(req("a", slots=4, pending=6, running=4), 2).reply
    assert full.verb == protocol.CONTINUE


def test_every_job_is_handed_out_once_across_nodes() -> None:
    state = RunState(RUN, jobs(40), 0, Settings(speculate_tail=False))
    seen: list[str] = []
    replies = {n: ready(state, n) for n in ("a", "b", "c")}
    for _ in range(50):
        for node, reply in list(replies.items()):
            seen += names(reply)
            replies[node] = finish(state, node, reply)
    assert sorted(seen) == sorted(j.name for j in jobs(40))
    assert state.all_results_in and state.duplicates == 0


def test_batches_shrink_toward_the_end_so_the_tail_spreads() -> None:
    """With 6 jobs left and 3 equal nodes, no node gets more than its share of 2."""
    state = RunState(RUN, jobs(6), 0, Settings(batch_per_slot=4))
    for n in ("a", "b", "c"):
        state.handle(req(n), 0)
        state.nodes[n].state = NodeState.READY
    sizes = [len(state.handle(req(n), 1).reply.jobs) for n in ("a", "b", "c")]
    assert sizes == [2, 2, 2]


def test_silent_node_is_dropped_and_its_jobs_go_to_the_front() -> None:
    state = RunState(RUN, jobs(20), 0, Settings(heartbeat_timeout=180))
    lost = names(ready(state, "a", 0))
    b_jobs = names(ready(state, "b", 0))
    state.handle(req("b", pending=4, running=0), 100)  # b keeps calling in
    assert state.tick(150) == []
    notes = state.tick(181)
    assert any("node a dropped" in n for n in notes)
    assert state.nodes["a"].state is NodeState.GONE
    assert list(state.pending)[:len(lost)] == lost
    assert any(entry.startswith("a (not heard from") for entry in state.lost)
    # b, still alive, gets a's jobs next.
    done = tuple(result(n, "b") for n in b_jobs)
    reply = state.handle(req("b", pending=0, running=0, results=done), 182).reply
    assert names(reply)[:2] == lost[:2]


def test_busy_node_is_never_timed_out_while_it_keeps_calling() -> None:
    state = RunState(RUN, jobs(5), 0, Settings(heartbeat_timeout=10))
    state.handle(req("a"), 0)
    for t in range(5, 100, 5):
        assert state.handle(req("a", busy="build"), t).reply.verb == protocol.CONTINUE
        assert state.tick(t) == []
    assert state.nodes["a"].state is NodeState.BUILDING


def test_late_result_from_a_dead_node_counts_once() -> None:
    """First result wins; the late copy is a duplicate, recorded once."""
    state = RunState(RUN, jobs(4), 0, Settings(heartbeat_timeout=10))
    given = names(ready(state, "a", 0))
    ready(state, "b", 0)
    state.tick(20)  # a is presumed dead; b also called at 0 only, so it goes too
    ready(state, "c", 21)
    reply = state.handle(req("c"), 22).reply
    assert given[0] in names(reply) or given[0] in state.nodes["c"].held
    out1 = state.handle(req("c", results=(result(given[0], "c", MD5),)), 23)
    assert [r.name for r in out1.new_results] == [given[0]]
    # Now a comes back from the dead with its old result.
    late = state.handle(req("a", results=(result(given[0], "a", "f" * 32),)), 24)
    assert late.new_results == ()
    assert state.results[given[0]].md5 == MD5 and state.duplicates == 1


def test_result_for_unknown_test_is_counted_and_noted() -> None:
    state = RunState(RUN, jobs(2), 0)
    ready(state, "a")
    out = state.handle(req("a", results=(result("nosuch.ps.x.72.0", "a"),)), 1)
    assert state.unknown_results == 1 and "unknown test" in out.notes[0]
    assert out.new_results == ()


def test_node_joining_mid_run_gets_work() -> None:
    state = RunState(RUN, jobs(30), 0)
    first = ready(state, "a")
    finish(state, "a", first)
    late = ready(state, "late", 50)
    assert late.verb == protocol.JOBS and late.jobs


def test_negative_failure_aborts_the_whole_run_on_all_nodes() -> None:
    state = RunState(RUN, jobs(10), 0)
    ready(state, "a")
    assert state.handle(req("b", built=""), 0).reply.verb == protocol.BUILD  # building
    out = state.handle(req("b", built="", failure=-1, failure_reason="build failed"), 1)
    assert out.reply.verb == protocol.ABORT
    assert "build failed" in state.fatal and state.finished(1)
    assert state.handle(req("a", pending=1), 2).reply.verb == protocol.ABORT
    assert state.handle(req("new"), 3).reply.verb == protocol.ABORT


def test_positive_failure_drops_the_node_and_requeues_its_unfinished_jobs() -> None:
    state = RunState(RUN, jobs(10), 0)
    given = names(ready(state, "a"))
    done = result(given[0], "a")
    out = state.handle(req("a", failure=2, failure_reason="too many timeouts",
                           results=(done,)), 1)
    assert out.reply.verb == protocol.ABORT
    assert state.nodes["a"].state is NodeState.GONE
    assert list(state.pending)[:len(given) - 1] == given[1:]
    assert given[0] in state.results  # what it finished is kept
    assert not state.fatal


def test_failure_during_upload_means_try_again() -> None:
    state = RunState(RUN, jobs(2), 0)
    reply = ready(state, "a")
    assert finish(state, "a", reply).verb == protocol.UPLOAD
    assert state.handle(req("a", failure=1), 1).reply.verb == protocol.UPLOAD
    assert state.handle(req("a", busy="upload"), 2).reply.verb == protocol.CONTINUE
    assert not state.finished(2)
    assert state.handle(req("a"), 3).reply.verb == protocol.ABORT  # uploaded -> done
    assert state.finished(3) and state.everyone_told()


def test_a_built_node_that_ran_no_job_uploads_too_and_the_run_waits_for_it() -> None:
    """Seed 001: "else if node not uploaded -> upload": its build log is kept as well."""
    state = RunState(RUN, jobs(2), 0)
    reply = ready(state, "a")
    assert ready(state, "idle").verb == protocol.CONTINUE  # built; "a" holds every job
    assert finish(state, "a", reply).verb == protocol.UPLOAD
    assert state.handle(req("a", busy="upload"), 1).reply.verb == protocol.CONTINUE
    assert state.handle(req("a"), 2).reply.verb == protocol.ABORT  # a uploaded
    assert not state.finished(2)  # "idle" built the run: its logs are waited for
    assert state.handle(req("idle"), 3).reply.verb == protocol.UPLOAD
    assert not state.finished(3)
    assert state.handle(req("idle"), 4).reply.verb == protocol.ABORT
    assert state.finished(4) and state.everyone_told()


def test_a_node_still_building_at_the_end_is_told_abort_and_not_waited_for() -> None:
    state = RunState(RUN, jobs(2), 0)
    reply = ready(state, "a")
    state.handle(req("slow", built=""), 0)  # first contact: BUILD
    assert finish(state, "a", reply).verb == protocol.UPLOAD
    assert state.handle(req("a"), 1).reply.verb == protocol.ABORT
    assert state.finished(1)  # the master's end then tells "slow" ABORT
    assert not state.everyone_told()


def test_a_node_that_reports_holding_nothing_gives_its_jobs_back() -> None:
    """Its reply was lost, or it restarted: jobs we think it holds are put back."""
    state = RunState(RUN, jobs(10), 0, Settings(batch_per_slot=1))
    given = names(ready(state, "a"))
    reply = state.handle(req("a", pending=0, running=0), 1).reply
    assert names(reply) == given  # handed out again at once


def test_tail_speculation_gives_idle_nodes_copies_of_old_jobs() -> None:
    state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=True))
    slow = names(ready(state, "slow", 0, slots=3))
    assert len(slow) == 3
    copies = names(ready(state, "fast", 1, slots=2))
    assert copies == slow[:2]
    done = state.handle(req("fast", results=tuple(result(n, "fast") for n in copies)), 2)
    assert len(done.new_results) == 2
    late = state.handle(req("slow", slots=3, results=(result(slow[0], "slow"),)), 3)
    assert late.new_results == () and state.duplicates == 1


def test_no_speculation_when_disabled() -> None:
    state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=False))
    ready(state, "slow", 0, slots=3)
    assert ready(state, "fast", 1).verb == protocol.CONTINUE


def test_journaled_results_are_not_handed_out_again() -> None:
    all_jobs = jobs(6)
    done = [result(j.name, "old") for j in all_jobs[:4]]
    state = RunState(RUN, all_jobs, 0, done=done)
    assert state.remaining == 2
    reply = ready(state, "a", slots=4)
    assert names(reply) == [j.name for j in all_jobs[4:]]


def test_upload_timeout_ends_a_run_whose_node_never_uploads() -> None:
    state = RunState(RUN, jobs(1), 0, Settings(upload_timeout=30, heartbeat_timeout=1000))
    reply = ready(state, "a")
    assert finish(state, "a", reply, now=5).verb == protocol.UPLOAD
    assert not state.finished(20)
    assert state.finished(36)


def test_leaving_node_gives_back_its_jobs() -> None:
    state = RunState(RUN, jobs(5), 0)
    given = names(ready(state, "a"))
    out = state.handle(req("a", leaving=True), 1)
    assert out.reply.verb == protocol.ABORT
    assert list(state.pending)[:len(given)] == given


# ------------------------------------------------------------------ sized for a million jobs
def test_new_results_come_back_as_journal_lines() -> None:
    state = RunState(RUN, jobs(4), 0)
    given = names(ready(state, "a"))
    out = state.handle(req("a", result_lines=(f"{given[0]} 0 0.10 0.00 0.00 {MD5} gs",),
                           results=(result(given[1], "a"),)), 1)
    assert out.journal.decode().splitlines() == [
        f"a result {given[0]} 0 0.10 0.00 0.00 {MD5} gs",
        f"a result {given[1]} 0 0.10 0.00 0.00 {MD5} gs"]
    assert [r.name for r in out.new_results] == given[:2]
    assert state.results[given[0]] == JobResult(given[0], 0, 0.1, 0, 0, MD5, "gs", "a")
    assert len(state.results) == 2 and set(state.results) == set(given[:2])


def test_two_copies_in_one_request_count_once() -> None:
    state = RunState(RUN, jobs(4), 0)
    given = names(ready(state, "a"))
    text = f"{given[0]} 0 0.10 0.00 0.00 {MD5} gs"
    out = state.handle(req("a", result_lines=(text, text)), 1)
    assert len(out.new_results) == 1 and state.duplicates == 1


def test_journal_lines_resume_a_run() -> None:
    all_jobs = jobs(5)
    done = [f"old result {j.name} 0 0.10 0.00 0.00 {MD5} gs" for j in all_jobs[:3]]
    done.append(f"old result nosuch.1 0 0.10 0.00 0.00 {MD5} gs")  # not in this run
    state = RunState(RUN, all_jobs, 0, done=done)
    assert state.remaining == 2 and state.results[all_jobs[0].name].machine == "old"
    assert state.pending == [j.name for j in all_jobs[3:]]


def test_finished_jobs_leave_in_flight_even_with_a_copy_out() -> None:
    """Only unfinished jobs count as held (running), even with a copy still out."""
    state = RunState(RUN, jobs(3), 0, Settings(batch_per_slot=1, speculate_tail=True))
    slow = names(ready(state, "slow", 0, slots=3))
    copies = names(ready(state, "fast", 1, slots=2))
    state.handle(req("fast", results=tuple(result(n, "fast") for n in copies)), 2)
    assert list(state.in_flight()) == [slow[2]] and state.running == 1
    assert set(state.nodes["slow"].held) == set(slow)  # until it reports or is dropped
    state.tick(1000)  # slow is dropped: only its unfinished job goes back
    assert state.pending == [slow[2]]


def test_the_exact_share_agrees_with_the_bound() -> None:
    """Batch sizes are those of the exact fair share, whichever way they are computed.

    One state uses the bound (slots of every known node) to skip the walk over all nodes;
    the other is made to walk every time.  Driven alike, they answer alike.
    """
    for total in (7, 40, 200):
        states = [RunState(RUN, jobs(total), 0, Settings(batch_per_slot=3,
                                                         speculate_tail=False))
                  for _ in range(2)]
        nodes = {f"n{i}": 1 + i % 4 for i in range(6)}
        replies: list[list[str]] = [[], []]
        for k, state in enumerate(states):
            for node, slots in nodes.items():
                state.handle(req(node, slots=slots), 0)
            for rnd in range(60):
                if k == 1:
                    state.slots_known = 10**9  # the bound never suffices: exact every time
                for node, slots in nodes.items():
                    held = list(state.nodes[node].held)
                    done = tuple(result(n, node) for n in held[:slots])
                    reply = state.handle(req(node, slots=slots, running=len(held) - len(done),
                                             results=done), rnd + 1).reply
                    replies[k].append(f"{node} {reply.verb} {names(reply)}")
            assert state.all_results_in
        assert replies[0] == replies[1]


def test_result_table_lines_are_those_of_tab_rows() -> None:
    from cluster.report.tab import TabRow
    state = RunState(RUN, jobs(4), 0)
    given = names(ready(state, "a"))
    sent = (JobResult(given[0], 0, 1.234, 2, 0, MD5, "gs pdfwrite", "a"),
            JobResult(given[1], 8, 0.5, 0, 0, MD5, "gs", "a"))
    state.handle(req("a", results=sent), 1)
    table = state.results.table("rev7")
    assert list(table) == sorted(given[:2]) and len(table) == 2
    for r in sent:
        row = TabRow.from_result(r, "rev7")
        assert table.line(r.name) == row.line()
        assert table[r.name] == TabRow.parse(row.line())  # times as the .tab has them
        assert table.brief(r.name) == (row.error, row.md5, row.product)
    assert list(table.lines()) == [table.line(n) for n in sorted(given[:2])]
    assert given[2] not in table and given[0] in table


def measured(state: RunState, node: str, seconds_per_job: float, now: float) -> None:
    """Give ``node`` a measured rate: each of its slots has taken ``seconds_per_job``."""
    info = state.nodes[node]
    info.working_since = now - 100 * seconds_per_job
    info.results = 100 * info.slots


def test_tail_copies_the_jobs_a_slow_node_would_finish_last() -> None:
    """Idle nodes take over the slow node's queued jobs, not a fast node's older ones."""
    state = RunState(RUN, jobs(8), 0, Settings(batch_per_slot=2))
    fast = names(ready(state, "fast", 0))   # handed out first: the oldest
    slow = names(ready(state, "slow", 0))
    assert len(fast) == len(slow) == 4 and not state.pending
    for name in ("idle1", "idle2", "idle3"):
        ready(state, name, 0)  # no work left: CONTINUE
    measured(state, "fast", 1.0, 10)
    measured(state, "slow", 5.0, 10)
    measured(state, "idle1", 1.0, 10)
    measured(state, "idle2", 1.0, 10)
    measured(state, "idle3", 1.0, 10)
    done = tuple(result(n, "fast") for n in fast[:2])  # fast runs its last two
    assert state.handle(req("fast", results=done, pending=0, running=2), 10).reply.verb \
        == protocol.CONTINUE
    state.handle(req("slow", pending=2, running=2), 10)
    first = names(state.handle(req("idle1"), 10).reply)
    assert first == [slow[2], slow[3]]      # queued on slow: they would end last
    second = names(state.handle(req("idle2"), 10).reply)
    assert second == [slow[0], slow[1]]     # slow's running jobs, at most one copy each
    # fast's jobs would end within one job time of an idle node's: no copy.
    assert state.handle(req("idle3"), 10).reply.verb == protocol.CONTINUE


def test_a_slow_node_does_not_copy_a_faster_nodes_jobs() -> None:
    state = RunState(RUN, jobs(6), 0, Settings(batch_per_slot=2))
    fast = names(ready(state, "fast", 0))
    slow = names(ready(state, "slow", 0))
    measured(state, "fast", 1.0, 10)
    measured(state, "slow", 5.0, 10)
    state.handle(req("fast", results=tuple(result(n, "fast") for n in fast[:2]),
                     pending=0, running=2), 10)
    reply = state.handle(req("slow", results=tuple(result(n, "slow") for n in slow)), 10)
    assert reply.reply.verb == protocol.CONTINUE
    assert state.in_flight() == {fast[2]: 1, fast[3]: 1}  # no copy was made
    assert state.running == 2


def test_a_silent_nodes_jobs_are_copied_first() -> None:
    """A node not heard from for a while looks ever slower: its jobs go first."""
    state = RunState(RUN, jobs(8), 0, Settings(batch_per_slot=2))
    quiet = names(ready(state, "quiet", 0))
    busy = names(ready(state, "busy", 0))
    ready(state, "idle", 0)
    for name in ("quiet", "busy", "idle"):
        measured(state, name, 1.0, 3)
    state.handle(req("busy", pending=2, running=2), 3)  # quiet was last heard at 0
    copies = names(state.handle(req("idle"), 3).reply)
    assert copies == [quiet[2], quiet[3]] and busy[3] not in copies


def test_in_the_tail_a_silent_nodes_running_jobs_are_copied() -> None:
    """A live node's running jobs are not worth a copy; once it falls silent they are."""
    state = RunState(RUN, jobs(4), 0, Settings(batch_per_slot=2))
    given = names(ready(state, "a", 0))
    assert ready(state, "idle", 0).verb == protocol.CONTINUE
    measured(state, "a", 1.0, 10)
    measured(state, "idle", 1.0, 10)
    state.handle(req("a", pending=2, running=2), 10)
    assert names(state.handle(req("idle"), 10).reply) == given[2:]  # queued on a
    done = tuple(result(n, "idle") for n in given[2:])
    assert state.handle(req("idle", results=done), 10.6).reply.verb == protocol.CONTINUE
    state.handle(req("a", pending=0, running=2), 10.6)
    assert state.handle(req("idle"), 11.2).reply.verb == protocol.CONTINUE
    # a says nothing more: after a few of its job times, its running jobs are copied.
    assert names(state.handle(req("idle"), 14).reply) == given[:2]


def test_a_node_that_runs_dry_fast_gets_bigger_batches_then_smaller() -> None:
    """Batches double while a node comes back quickly, and halve when it is slow."""
    state = RunState(RUN, jobs(10000), 0, Settings(batch_per_slot=2, batch_seconds=1.0))
    reply = ready(state, "a", 0.0, slots=1)
    sizes = [len(reply.jobs)]
    t = 0.0
    for _ in range(5):  # each batch is done in 10 ms
        t += 0.01
        reply = finish(state, "a", reply, now=t, slots=1)
        sizes.append(len(reply.jobs))
    assert sizes[:4] == [2, 4, 8, 16]
    t += 5.0  # now it takes far longer than batch_seconds
    slow = finish(state, "a", reply, now=t, slots=1)
    assert 0 < len(slow.jobs) < sizes[-1]


def check_holders(state: RunState) -> None:
    """The per-job holder counts agree with the nodes' held jobs: an unfinished job is
    counted once per node that holds it (a node gone holds nothing), a finished one not at
    all, and ``running`` is the number of jobs counted."""
    expected = [0] * len(state.jobs)
    for node in state.nodes.values():
        for name, i in node.held.items():
            assert state.jobs.names[i] == name
            if name not in state.results:
                expected[i] += 1
    assert list(state.holders) == expected
    assert state.running == sum(1 for h in expected if h)


@pytest.mark.parametrize("features", [(), (protocol.FEATURE_WITHDRAW,)])
def test_holder_counts_stay_true_through_deaths_rejoins_copies_and_stray_results(
        features: tuple[str, ...]) -> None:
    """A seeded random walk of six nodes over a run of 60 jobs: each call reports some of
    its jobs (now and then twice, or one of another node's, or an unknown test), some
    nodes go silent and are dropped, come back, and the tail copies jobs.  The counts are
    checked after every step, and every job ends with exactly one result.  With nodes that
    take ``withdraw`` lines too: a copied job's first result leaves no other node holding
    it, and no job with a result stays marked as copied."""
    import random
    rng = random.Random(11)
    state = RunState(RUN, jobs(60), 0, Settings(batch_per_slot=2, heartbeat_timeout=5))
    nodes = [f"n{i}" for i in range(6)]
    now = 0.0

    def call(node: str, **kw: object) -> Request:
        return req(node, features=features, **kw)

    for node in nodes:
        state.handle(call(node, slots=2), now)
    for _ in range(400):
        if state.all_results_in:
            break
        now += 1.0
        node = rng.choice(nodes)
        info = state.nodes[node]
        if info.state is NodeState.GONE or rng.random() < 0.1:
            state.handle(call(node, slots=2), now)  # (re)join: BUILD, or a call without news
        else:
            held = list(info.held)
            done = [n for n in held[:rng.randint(0, len(held))]]
            if done and rng.random() < 0.2:
                done.append(done[0])  # twice in one request
            others = [n for other in state.nodes.values() if other.name != node
                      for n in other.held]
            if others and rng.random() < 0.2:
                done.append(rng.choice(others))  # never handed to it: refused
            if rng.random() < 0.05:
                done.append("nosuch.1")  # not in the run
            state.handle(call(node, slots=2, results=tuple(result(n, node) for n in done),
                             running=len(held) - len(set(done) & set(held))), now)
        if rng.random() < 0.1:
            state.tick(now + 6)  # the silent ones are dropped, their jobs put back
        check_holders(state)
        assert not any(state.jobs.names[i] in state.results for i in state.copied)
    assert state.all_results_in and state.results.count == 60
    assert state.running == 0
    assert (state.withdrawn > 0) == bool(features)


# ------------------------------------------------------------------ a node is a process

def test_a_call_without_busy_or_built_is_told_build_again_never_given_jobs() -> None:
    """Ready only on the positive signal: ``built <this run>``, not a missing ``busy``."""
    state = RunState(RUN, jobs(10), 0)
    assert state.handle(req("a", built=""), 0).reply.verb == protocol.BUILD
    assert state.handle(req("a", built=""), 1).reply.verb == protocol.BUILD
    assert state.handle(req("a", built="another-run"), 2).reply.verb == protocol.BUILD
    assert state.nodes["a"].state is NodeState.BUILDING and state.running == 0
    assert state.handle(req("a"), 3).reply.verb == protocol.JOBS


def test_a_known_name_from_a_new_session_of_its_instance_is_a_new_node() -> None:
    """A node restarted mid-run: its old jobs go back to the front, it is told BUILD, and
    it gets jobs only once it says it built."""
    state = RunState(RUN, jobs(20), 0)
    assert state.handle(req("a", instance="1" * 16), 0, "s-old", "10.0.0.1:1").reply.verb \
        == protocol.BUILD
    given = names(state.handle(req("a", instance="1" * 16), 1, "s-old", "10.0.0.1:1").reply)
    assert given
    out = state.handle(req("a", built="", instance="1" * 16), 2, "s-new", "10.0.0.1:2")
    assert out.reply.verb == protocol.BUILD
    assert any("restarted" in note for note in out.notes)
    assert state.pending[:len(given)] == given  # the old session's jobs, first in line
    assert state.handle(req("a", built="", instance="1" * 16, busy="build"), 3, "s-new"
                        ).reply.verb == protocol.CONTINUE
    assert state.handle(req("a", instance="1" * 16), 4, "s-new").reply.verb == protocol.JOBS
    assert state.lost == []  # a restart is not a lost node


def test_a_second_live_process_under_a_name_in_use_is_refused_naming_both_peers() -> None:
    state = RunState(RUN, jobs(20), 0, Settings(heartbeat_timeout=60))
    state.handle(req("a", instance="1" * 16), 0, "s-one", "10.0.0.1:1")
    held = names(state.handle(req("a", instance="1" * 16), 1, "s-one", "10.0.0.1:1").reply)
    out = state.handle(req("a", instance="2" * 16, results=(result(held[0], "a"),)), 2,
                       "s-two", "10.0.0.2:7")
    assert out.reply.verb == protocol.ABORT
    assert "node name a is in use" in out.reply.reason
    assert "10.0.0.1:1" in out.reply.reason and "10.0.0.2:7" in out.reply.reason
    assert out.notes and not out.journal  # logged; nothing it carried is recorded
    assert len(state.nodes["a"].held) == len(held) and state.nodes["a"].session == "s-one"
    # Once the first falls silent past heartbeat_timeout, the name may be taken over.
    assert state.handle(req("a", instance="2" * 16), 100, "s-two", "10.0.0.2:8").reply.verb \
        == protocol.BUILD
    assert state.nodes["a"].session == "s-two"


def test_failure_minus_one_only_from_a_node_told_build_and_building() -> None:
    state = RunState(RUN, jobs(10), 0)
    stranger = state.handle(req("ghost", built="", failure=-1, failure_reason="x"), 0, "s")
    assert stranger.reply.verb == protocol.ABORT and "refused" in stranger.reply.reason
    assert not state.fatal and "ghost" not in state.nodes
    # A node past its build: dropped like failure 1 (its jobs go back), the run goes on.
    ready(state, "a")
    out = state.handle(req("a", failure=-1, failure_reason="late"), 1)
    assert out.reply.verb == protocol.ABORT and not state.fatal
    assert state.nodes["a"].state is NodeState.GONE and len(state.pending) == 10
    # A building node, but the request is from another process under its name: refused.
    state.handle(req("b", built="", instance="3" * 16), 2, "s-b", "p1")
    other = state.handle(req("b", built="", instance="4" * 16, failure=-1), 3, "s-x", "p2")
    assert other.reply.verb == protocol.ABORT and not state.fatal
    building = state.handle(req("b", built="", failure=-1, failure_reason="cc"), 4, "s-b")
    assert building.reply.verb == protocol.ABORT and "cc" in state.fatal
