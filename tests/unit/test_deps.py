"""Dependencies between runs (cluster.deps): the graph check at submission (names given
twice, unknown names, cycles), where a reference stands (queued, ended well or not, a run
id), the choice of a priority's next run, and what stat says of a waiting run; the queue's
promote and holding (cluster.queue) and the .dag file (cluster.triggers.dag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import deps
from cluster.home import Home
from cluster.queue import QueueFile, holding_all
from cluster.runspec import RunSpec
from cluster.triggers import dag


def spec(line: str) -> RunSpec:
    return RunSpec.parse(line)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.root.mkdir()
    return h


def look(home: Home, priority: int, queued: dict[int, list[RunSpec]]) -> deps.Choice:
    return deps.choose(priority, queued, deps.Resolver(home, queued))


# ------------------------------------------------------------------------- cycles
@pytest.mark.parametrize(("edges", "cycle"), [
    ({"A": [], "B": ["A"], "C": ["A", "B"]}, []),
    ({"A": ["B"], "B": ["A"]}, ["A", "B", "A"]),
    ({"A": ["B"], "B": ["C"], "C": ["A"], "D": ["A"]}, ["A", "B", "C", "A"]),
    ({"A": ["X"], "B": ["A", "X"]}, []),  # X: outside the graph (an ended run)
    ({"A": ["B"], "B": ["C"], "C": ["B"]}, ["B", "C", "B"]),
])
def test_find_cycle(edges: dict[str, list[str]], cycle: list[str]) -> None:
    assert deps.find_cycle(edges) == cycle


def test_a_long_chain_has_no_cycle_and_no_recursion_limit() -> None:
    edges = {f"r{i}": [f"r{i - 1}"] if i else [] for i in range(5000)}
    assert deps.find_cycle(edges) == []
    edges["r0"] = ["r4999"]
    assert len(deps.find_cycle(edges)) == 5001


# ------------------------------------------------------------------------- check_graph
def test_a_graph_of_three_runs_is_accepted(home: Home) -> None:
    new = [("f:1", spec("user bob gs name=A")), ("f:2", spec("user bob pcl name=B after=A")),
           ("f:3", spec("auto nightly gs name=C after=A,B"))]
    deps.check_graph(new, {}, deps.Resolver(home, {}))


def test_a_cycle_is_refused_naming_it(home: Home) -> None:
    new = [("f:1", spec("user bob gs name=A after=C")),
           ("f:2", spec("user bob pcl name=B after=A")),
           ("f:3", spec("auto nightly gs name=C after=B"))]
    with pytest.raises(deps.GraphError, match=r"cycle: A -> C -> B -> A \(A at f:1, C at f:3, "
                                              r"B at f:2\)"):
        deps.check_graph(new, {}, deps.Resolver(home, {}))


def test_a_cycle_through_a_queued_run_is_refused(home: Home) -> None:
    queued = {0: [spec("user bob gs name=Q after=A")]}
    new = [("f:1", spec("user bob pcl name=A after=Q"))]
    with pytest.raises(deps.GraphError, match=r"A -> Q -> A \(A at f:1, Q \(queued\)\)"):
        deps.check_graph(new, queued, deps.Resolver(home, queued))


def test_an_unknown_name_is_refused_naming_it(home: Home) -> None:
    new = [("f:1", spec("user bob gs name=A")), ("f:2", spec("user bob pcl name=B after=A,Z"))]
    with pytest.raises(deps.GraphError, match="f:2: after=Z names no run"):
        deps.check_graph(new, {}, deps.Resolver(home, {}))


def test_a_name_given_twice_is_refused(home: Home) -> None:
    new = [("f:1", spec("user bob gs name=A")), ("f:2", spec("user bob pcl name=A"))]
    with pytest.raises(deps.GraphError, match=r"f:2: name=A is given twice \(also at f:1\)"):
        deps.check_graph(new, {}, deps.Resolver(home, {}))


def test_queued_ended_and_archived_runs_are_known(home: Home) -> None:
    deps.record_end(home, "built", "20260101000000-p2-aaaa", "done")
    (home.archive / "20260101000000-p0-bbbb").mkdir(parents=True)
    (home.archive / "20260101000000-p0-bbbb" / "run.info").write_text("id x\noutcome failed\n")
    (home.run_dir("20260101000000-p1-cccc")).mkdir(parents=True)
    queued = {1: [spec("git 0123abc gs name=Q")]}
    new = [("f:1", spec("user bob gs after=Q,built,20260101000000-p0-bbbb,"
                        "20260101000000-p1-cccc"))]
    deps.check_graph(new, queued, deps.Resolver(home, queued))


# ------------------------------------------------------------------------- where a ref stands
def test_a_name_is_waiting_while_queued_then_its_latest_end_counts(home: Home) -> None:
    deps.record_end(home, "A", "run-1", "failed")
    queued = {0: [spec("user bob gs name=A")]}
    assert deps.Resolver(home, queued).dep("A").state is deps.State.WAITING
    assert deps.Resolver(home, {}).dep("A").state is deps.State.FAILED
    deps.record_end(home, "A", "run-2", "done")
    met = deps.Resolver(home, {}).dep("A")
    assert met.state is deps.State.MET and "run-2" in met.detail
    deps.record_end(home, "A", "run-3", "retry")  # queued again: not an end
    assert deps.ended_by_name(home, "A") == deps.Ended("run-2", "done")


def test_a_run_id_of_an_attempt_queued_again_fails_and_says_why(home: Home) -> None:
    (home.archive / "r1").mkdir(parents=True)
    (home.archive / "r1" / "run.info").write_text("outcome retry\n")
    dep = deps.Resolver(home, {}).dep("r1")
    assert dep.state is deps.State.FAILED and "name=" in dep.detail


# ------------------------------------------------------------------------- choose
def test_a_waiting_head_does_not_block_the_runs_behind_it(home: Home) -> None:
    queued = {0: [spec("user bob gs name=A")],
              1: [spec("git 0123abc gs after=A"), spec("git 0123abd gs")]}
    choice = look(home, 1, queued)
    assert choice.serve == spec("git 0123abd gs")
    assert [(s, [d.ref for d in w]) for s, w in choice.waiting] == [
        (spec("git 0123abc gs after=A"), ["A"])]
    assert not choice.drop


def test_a_run_whose_dependencies_ended_well_is_served(home: Home) -> None:
    deps.record_end(home, "A", "run-a", "done")
    deps.record_end(home, "B", "run-b", "done")
    queued = {2: [spec("auto nightly gs name=C after=A,B")]}
    assert look(home, 2, queued).serve == queued[2][0]


def test_a_failed_dependency_drops_the_run_and_those_after_it(home: Home) -> None:
    deps.record_end(home, "A", "run-a", "failed")
    queued = {0: [spec("user bob pcl name=B after=A"),
                  spec("user bob xps name=C after=B"), spec("user carol gs")]}
    choice = look(home, 0, queued)
    assert choice.serve == spec("user carol gs")
    (b, why_b), (c, why_c) = choice.drop
    assert b == queued[0][0] and "A (run run-a, outcome failed)" in why_b
    assert c == queued[0][1] and "B (dropped" in why_c


def test_an_unknown_dependency_drops_the_run(home: Home) -> None:
    choice = look(home, 0, {0: [spec("user bob gs after=gone")]})
    assert choice.serve is None and "gone, which names no run" in choice.drop[0][1]
    assert choice.has_work


def test_nothing_ready_is_no_work(home: Home) -> None:
    queued = {0: [spec("user bob gs name=A")], 1: [spec("git 0123abc gs after=A")]}
    assert not look(home, 1, queued).has_work


def test_a_bmpcmp_run_waits_for_its_users_runs_ahead_of_it(home: Home) -> None:
    queued = {0: [spec("user bob gs after=X"), spec("user bob gs bmpcmp"),
                  spec("user bob pcl")]}
    deps.record_end(home, "X", "run-x", "done")
    choice = look(home, 0, queued)
    assert choice.serve == queued[0][0]
    queued = {0: [spec("user bob gs bmpcmp"), spec("user bob pcl")],
              1: [spec("git 0123abc gs")]}
    assert look(home, 0, queued).serve == queued[0][0]  # bob's pcl run is behind it
    waits = {0: [spec("user carol gs name=N after=M"), spec("user carol gs bmpcmp"),
                 spec("user bob gs")]}
    choice = look(home, 0, waits)
    assert "M" not in home.run_names.name
    assert choice.drop[0][0] == waits[0][0]  # M names no run
    assert choice.serve == spec("user bob gs")  # carol's bmpcmp waits: her run is queued


def test_waits_says_what_each_run_waits_for(home: Home) -> None:
    deps.record_end(home, "F", "run-f", "aborted")
    queued = {0: [spec("user bob gs name=A"), spec("user bob pcl after=A")],
              2: [spec("auto nightly gs after=F")]}
    assert deps.waits(home, queued) == {
        (0, 1): "waits for A (queued or running)",
        (2, 0): "leaves its queue: it waits for F (run run-f, outcome aborted), which did "
                "not end well"}
    assert deps.waits(home, {0: [spec("user bob gs")]}) == {}


# ------------------------------------------------------------------------- queue
def test_promote_moves_a_run_to_the_head_keeping_the_others_order(home: Home) -> None:
    queue = QueueFile.for_priority(home, 0)
    queue.path.write_text("# comment\nuser a gs\nuser b gs\nuser c gs\n")
    assert queue.promote(spec("user c gs"))
    assert queue.path.read_text() == "# comment\nuser c gs\nuser a gs\nuser b gs\n"
    assert queue.promote(spec("user c gs"))
    assert not queue.promote(spec("user d gs"))


def test_holding_writes_only_when_the_block_ends_well(home: Home) -> None:
    queue = QueueFile.for_priority(home, 1)
    with pytest.raises(RuntimeError), queue.holding() as held:
        held.add(spec("git 0123abc gs"))
        raise RuntimeError("refused")
    assert queue.read() == []
    with queue.holding() as held:
        held.add(spec("git 0123abc gs"))
    assert queue.read() == [spec("git 0123abc gs")]


# ------------------------------------------------------------------------- .dag files
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "graph.dag"
    path.write_text(text)
    return path


def all_queued(home: Home) -> dict[int, list[str]]:
    return {p: [s.line() for s in QueueFile.for_priority(home, p).read()] for p in (0, 1, 2)}


def test_a_dag_file_queues_every_run_at_its_priority(home: Home, tmp_path: Path) -> None:
    path = write(tmp_path, "# a graph\nuser bob gs name=A\n\nuser bob pcl name=B after=A "
                           "priority=1\nauto nightly gs name=C after=A,B\n")
    dag.queue_dag(home, dag.read_dag(path))
    assert all_queued(home) == {0: ["user bob gs name=A"], 1: ["user bob pcl after=A name=B"],
                                2: ["auto nightly gs after=A,B name=C"]}


@pytest.mark.parametrize(("text", "error"), [
    ("user bob gs name=A after=B\nuser bob pcl name=B after=A\n", r"cycle: A -> B -> A"),
    ("user bob gs name=A\nuser bob pcl after=A,nobody\n", r"graph.dag:2: after=nobody names no"),
    ("user bob gs name=A\nuser bob pcl name=A\n", r"graph.dag:2: name=A is given twice"),
    ("user bob gs name=A after=A\n", r"graph.dag:1: option after=A names the run itself"),
    ("user bob gs name=A priority=3\n", r"graph.dag:1: priority=3: expected priority=0, 1"),
    ("user bob gs priority=1 priority=2\n", r"graph.dag:1: priority= given twice"),
    ("user bob gs after=../x\n", r"graph.dag:1: option after=\.\./x: bad entry"),
    ("# nothing\n\n", r"no run; expected one run per line"),
    ("user bob gs\nuser carol gs name=X\n", r"graph.dag:1: 'user bob gs' is already queued"),
])
def test_a_bad_dag_file_queues_nothing(home: Home, tmp_path: Path, text: str,
                                       error: str) -> None:
    QueueFile.for_priority(home, 0).append(spec("user bob gs"))
    before = all_queued(home)
    with pytest.raises(dag.DagError, match=error):
        dag.queue_dag(home, dag.read_dag(write(tmp_path, text)))
    assert all_queued(home) == before


def test_a_dag_may_wait_for_queued_and_ended_runs(home: Home, tmp_path: Path) -> None:
    QueueFile.for_priority(home, 2).append(spec("auto nightly gs name=build"))
    deps.record_end(home, "lastweek", "run-0", "done")
    dag.queue_dag(home, dag.read_dag(write(tmp_path, "user bob gs after=build,lastweek\n")))
    assert all_queued(home)[0] == ["user bob gs after=build,lastweek"]


def test_holding_all_writes_no_queue_when_the_block_fails(home: Home) -> None:
    queues = [QueueFile.for_priority(home, p) for p in (0, 1, 2)]
    with pytest.raises(RuntimeError), holding_all(queues) as held:
        held[0].add(spec("user bob gs"))
        held[2].add(spec("auto nightly gs"))
        raise RuntimeError("refused")
    assert all_queued(home) == {0: [], 1: [], 2: []}
    with holding_all(queues) as held:
        held[0].add(spec("user bob gs"))
        held[2].add(spec("auto nightly gs"))
    assert all_queued(home) == {0: ["user bob gs"], 1: [], 2: ["auto nightly gs"]}


def test_a_run_leaving_one_queue_wakes_the_priorities_whose_runs_may_wait_for_it(
        home: Home) -> None:
    from cluster.triggers.discovery import WorkWatcher

    QueueFile.for_priority(home, 1).append(spec("auto A gs name=A"))
    QueueFile.for_priority(home, 1).append(spec("auto X gs"))
    QueueFile.for_priority(home, 2).append(spec("auto B gs after=A"))
    watcher = WorkWatcher(home)
    assert watcher() == []
    QueueFile.for_priority(home, 1).remove(spec("auto A gs name=A"))  # A ended
    assert sorted(watcher()) == [1, 2]  # 0 has no run: not woken
    assert watcher() == []
