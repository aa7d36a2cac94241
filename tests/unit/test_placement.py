"""A run's placement (docs/runoptions.md, section 4), as pure decisions: groups and exclude,
the waiting reason, the monitor's offer, every_node's pinned jobs, the per-node and
per-cluster caps; and the group files (cluster/master/groups.py) in a temporary home."""

from __future__ import annotations

import pytest

from cluster.config import DEFAULTS
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.master.files import groups
from cluster.master.model.placement import (
    Placement,
    RunPolicy,
    expand_every_node,
    offered,
    waiting_reason,
)
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec
from cluster.wire import protocol
from tests.unit.test_runstate import RUN, finish, jobs, names, ready, req, result

GROUPS = {"win64": ("w1", "w2"), "linux": ("l1",)}


def policy(*words: str) -> RunPolicy:
    made = RunPolicy.of(RunOptions.of(words, DEFAULTS))
    made.set_groups(GROUPS)
    return made


def test_groups_and_exclude_decide_who_may_take_a_run() -> None:
    where = Placement(groups=("win64",), exclude=("w2",))
    assert where.refusal("w1", GROUPS) == ""
    assert "excluded" in where.refusal("w2", GROUPS)
    assert "none of this run's groups (groups=win64)" in where.refusal("l1", GROUPS)
    assert Placement().may_take("anything", {})


def test_a_run_no_node_up_may_take_says_why() -> None:
    assert waiting_reason(Placement(groups=("win64",)), ["l1"], GROUPS) == \
        "no node of group win64 is up"
    assert waiting_reason(Placement(groups=("win64", "mac")), [], GROUPS) == \
        "no node of groups win64, mac is up"
    assert waiting_reason(Placement(groups=("win64",)), ["l1", "w2"], GROUPS) == ""
    assert "exclude=l1" in waiting_reason(Placement(exclude=("l1",)), ["l1"], GROUPS)


def test_nodes_pins_a_run_and_says_why_it_waits() -> None:
    assert RunOptions.of(["nodes=n1,n2"], DEFAULTS).nodes == ("n1", "n2")
    for bad in ("nodes=", "nodes=a/b", "nodes=n1,n1"):
        with pytest.raises(QueueLineError, match="nodes"):
            RunSpec.parse(f"user bob gs {bad}")
    where = Placement.of_words(["nodes=node2"])
    assert where.restricted and where.may_take("node2", {})
    assert where.refusal("node1", {}) == \
        "node node1 is not one of this run's nodes (nodes=node2)"
    assert waiting_reason(where, ["node1"], {}) == "node node2 is not up"
    assert waiting_reason(where, ["node1", "node2"], {}) == ""
    assert waiting_reason(Placement(nodes=("a", "b")), [], {}) == "none of nodes a, b is up"
    assert "excluded" in Placement(exclude=("node2",), nodes=("node2",)).refusal("node2", {})


def test_the_monitor_offers_a_node_only_the_runs_it_may_take() -> None:
    jobs_waiting = [(0, "r0"), (1, "r1"), (2, "r2")]
    placements = {"r0": Placement(groups=("win64",)), "r2": Placement(exclude=("l1",))}
    assert offered(jobs_waiting, "l1", placements, GROUPS) == [(1, "r1")]
    assert offered(jobs_waiting, "w1", placements, GROUPS) == jobs_waiting


def test_a_node_refused_for_placement_is_told_a_final_abort_and_is_not_lost() -> None:
    state = RunState(RUN, jobs(4), 0, policy=policy("groups=win64"))
    out = state.handle(req("l1"), 0)
    assert out.reply.verb == protocol.ABORT
    assert out.reply.reason.startswith("unsuitable: ")  # final: the node leaves this run
    assert "groups=win64" in out.reply.reason
    assert state.lost == [] and "l1" in state.culled
    assert names(ready(state, "w1")) != []


def test_max_worker_instances_caps_what_a_node_holds() -> None:
    state = RunState(RUN, jobs(10), 0, Settings(batch_per_slot=4),
                     policy=policy("max_worker_instances=1"))
    first = ready(state, "a", slots=4)
    assert len(names(first)) == 1
    # Still holding it: nothing more, however many slots.
    again = state.handle(req("a", slots=4, pending=0, running=1), 0.1).reply
    assert again.verb == protocol.CONTINUE
    nxt = finish(state, "a", first, 0.2, slots=4)
    assert len(names(nxt)) == 1


def test_max_cluster_instances_caps_what_all_nodes_hold() -> None:
    state = RunState(RUN, jobs(10), 0, Settings(batch_per_slot=4),
                     policy=policy("max_cluster_instances=3"))
    a = ready(state, "a", slots=2)
    b = ready(state, "b", slots=2)
    assert len(names(a)) + len(names(b)) == 3
    assert state.handle(req("c", slots=2), 0).reply.verb == protocol.BUILD
    assert state.handle(req("c", slots=2), 0).reply.verb == protocol.CONTINUE


def test_every_node_jobs_go_only_to_their_node() -> None:
    base = [f"t{i}.sh __temp__/t{i}.sh.log true ; echo x > __temp__/t{i}.sh.out\n"
            for i in range(2)]
    lines = list(expand_every_node(base, ["a", "b"]))
    assert [line.split(" ")[0] for line in lines] == ["t0.sh@a", "t0.sh@b", "t1.sh@a",
                                                      "t1.sh@b"]
    assert "__temp__/t0.sh@b.out" in lines[1] and "__temp__/t0.sh.out" not in lines[1]
    from cluster.master.model.joblist import MemoryJobList
    from cluster.records import Job
    job_list = MemoryJobList([Job.parse(line.rstrip("\n")) for line in lines])
    state = RunState(RUN, job_list, 0, Settings(speculate_tail=True),
                     policy=policy("every_node"))
    got_a = names(ready(state, "a"))
    assert got_a == ["t0.sh@a", "t1.sh@a"]
    # A node with no pinned jobs is refused (final), and is not lost.
    stranger = state.handle(req("c"), 0).reply
    assert stranger.verb == protocol.ABORT and "no job for node c" in stranger.reason
    # a finishes; it gets no copy of b's jobs (no tail for pinned jobs).
    done = state.handle(req("a", results=tuple(result(n, "a") for n in got_a)), 1).reply
    assert done.verb == protocol.CONTINUE
    # b never comes: its jobs are settled as not run, naming it, and the run can end.
    notes = state.settle_absent("b", "is not up", 2)
    assert notes and "node b is not up" in notes[0]
    assert state.all_results_in
    assert state.handle(req("a"), 3).reply.verb == protocol.UPLOAD
    assert state.unbuilt.not_built["@absent"] == ("b",)


def test_group_files(tmp_path) -> None:
    home = Home(tmp_path)
    assert groups.create(home, "win64") == "group win64 created (empty)"
    with pytest.raises(ClusterError, match="exists already"):
        groups.create(home, "win64")
    groups.add(home, "win64", ["n1", "n2", "n1"])
    assert groups.members(home, "win64") == ("n1", "n2")
    assert "already in it" in groups.add(home, "win64", ["n2"])
    with pytest.raises(ClusterError, match="n9 not in group win64"):
        groups.remove(home, "win64", ["n1", "n9"])
    assert groups.members(home, "win64") == ("n1", "n2")  # nothing changed
    groups.remove(home, "win64", ["n1"])
    assert groups.all_groups(home) == {"win64": ("n2",)}
    with pytest.raises(ClusterError, match="contains a '/'"):
        groups.create(home, "a/b")
    with pytest.raises(ClusterError, match="no group 'mac'"):
        groups.add(home, "mac", ["n1"])
    with pytest.raises(ClusterError, match="not a node name"):
        groups.add(home, "win64", ["bad name"])
    groups.delete(home, "win64")
    with pytest.raises(ClusterError, match="no group 'win64' to delete"):
        groups.delete(home, "win64")
    assert groups.all_groups(home) == {}


def test_stop_group_withdraws_the_waiting_runs_placed_on_it(tmp_path) -> None:
    from cluster.console import admin
    from cluster.queue import QueueFile
    from cluster.runspec import RunSpec

    home = Home(tmp_path)
    home.create()
    queue = QueueFile.for_priority(home, 1)
    placed, other = RunSpec.parse("user ann gs groups=win64,mac"), RunSpec.parse("user bob gs")
    queue.append(placed)
    queue.append(other)
    done = admin.stop_group(home, "win64", "me")
    assert [(d.action, d.line) for d in done] == [("withdrawn", placed.line())]
    assert queue.read() == [other]
    with pytest.raises(ClusterError, match="no group 'mac2' and no run names it"):
        admin.stop_group(home, "mac2", "me")


def test_clusteradmin_usage_errors_exit_2(tmp_path, capsys) -> None:
    from cluster.cli import clusteradmin

    Home(tmp_path).create()
    for words in (["stop"], ["stop", "r1", "--group", "g"], ["group", "add", "g"],
                  ["group", "create"], ["group", "ls", "a", "b"]):
        assert clusteradmin.main(["--home", str(tmp_path), *words]) == 2, words
        assert capsys.readouterr().err.startswith("clusteradmin")
