"""Lanes (docs/architecture.md, "Lanes and fair share"; docs/runoptions.md, "Fair share"):
the numbering, which run a lane's master takes, the claim that keeps two lanes off one
run, when the supervisor leaves a user lane idle, what a heartbeat tells a node of them,
and where a preempted node goes next."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import lanes
from cluster.config import Config
from cluster.datatypes import parse_user_shares
from cluster.errors import ConfigError
from cluster.home import Home
from cluster.master.daemon.offers import RunCounts, fair_order, for_node
from cluster.master.run import idle, nextrun
from cluster.node import moves
from cluster.queue import QueueFile
from cluster.runoptions import RunOptionError, RunOptions
from cluster.runspec import RunSpec
from cluster.wire import protocol
from cluster.wire.heartbeat import (
    Heartbeat,
    format_heartbeat,
    format_reply,
    parse_heartbeat,
    parse_reply,
)
from cluster.wire.jobstart import JobStart


def spec(line: str) -> RunSpec:
    return RunSpec.parse(line)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.root.mkdir()
    return h


def start_of(line: str, lane: int, run_id: str = "r1") -> JobStart:
    s = spec(line)
    return JobStart(id=run_id, priority=lanes.priority_of(lane), queue=s.line(), kind=s.kind,
                    ref=s.ref, products=s.products, tree=s.tree, source="src", build="b",
                    tests="t", options=s.options,
                    lane_number=lane if lane >= lanes.FIRST_USER_LANE else -1)


def serve(home: Home, lane: int, line: str) -> None:
    home.job_start(lane).write_text(start_of(line, lane).format())


def queue_of(home: Home, *lines: str) -> QueueFile:
    queue = QueueFile.for_priority(home, 0)
    for line in lines:
        queue.append(spec(line), duplicate=True)
    return queue


def test_the_numbering() -> None:
    assert lanes.ALL_LANES == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert [lanes.priority_of(n) for n in (0, 1, 2, 3, 9)] == [0, 1, 2, 0, 0]
    assert lanes.lanes_of(0) == (0, 3, 4, 5, 6, 7, 8, 9) and lanes.lanes_of(2) == (2,)
    assert lanes.served_lanes(1) == (0, 1, 2) and lanes.served_lanes(3) == (0, 1, 2, 3, 4)
    assert lanes.describe(1) == "priority 1" and lanes.describe(4) == "priority 0 (lane 4)"
    assert Home(Path("/h")).job_start(3) == Path("/h/job.3.start")
    assert Config(base_port=9000).port_for(4) == 9004


def test_job_start_names_a_user_lane_and_only_then() -> None:
    plain = start_of("user a gs", 0)
    assert "\nlane " not in plain.format() and JobStart.parse(plain.format()).lane == 0
    third = start_of("user a gs", 3)
    assert "lane 3\n" in third.format() and JobStart.parse(third.format()).lane == 3
    with pytest.raises(ValueError, match="lane"):
        JobStart.parse(third.format().replace("lane 3", "lane 12"))


def test_share_option_and_user_shares() -> None:
    assert RunOptions.of(["share=3"], Config()).share == 3
    assert RunOptions.of([], Config()).share is None
    with pytest.raises(RunOptionError, match="share"):
        RunOptions.of(["share=0"], Config())
    assert parse_user_shares("alice=2, bob=1") == {"alice": 2, "bob": 1}
    for bad in ("alice", "alice=0", "alice=101", "alice=1 alice=2", "../x=1"):
        with pytest.raises(ConfigError, match="user_shares"):
            parse_user_shares(bad)


def test_a_user_lane_takes_another_users_run(home: Home) -> None:
    queue = queue_of(home, "user alice gs", "user alice gs tree=t2", "user bob gs")
    serve(home, 0, "user alice gs")
    # Lane 0 runs alice's first push; alice's second waits for her; bob's goes to lane 3.
    assert nextrun.look(home, 3, queue).serve == spec("user bob gs")
    assert nextrun.look(home, 0, queue).serve == spec("user alice gs")  # its own
    serve(home, 3, "user bob gs")
    assert nextrun.look(home, 4, queue).serve is None  # only alice's second waits


def test_lane_0_prefers_an_unserved_user_then_takes_any(home: Home) -> None:
    queue = queue_of(home, "user alice gs", "user alice gs tree=t2", "user bob gs")
    serve(home, 3, "user alice gs")
    assert nextrun.look(home, 0, queue).serve == spec("user bob gs")
    serve(home, 4, "user bob gs")
    assert nextrun.look(home, 0, queue).serve == spec("user alice gs tree=t2")


def test_a_user_lane_takes_no_run_without_a_user(home: Home) -> None:
    queue = queue_of(home, "user alice gs", "auto nightly gs")
    serve(home, 0, "user alice gs")
    assert nextrun.look(home, 3, queue).serve is None


def test_one_copy_of_a_line_per_lane_that_serves_it(home: Home) -> None:
    queue = queue_of(home, "user alice gs", "user alice gs")
    serve(home, 0, "user alice gs")
    # The second copy waits (a push queued again behind its running self) ...
    assert nextrun.look(home, 0, queue).serve == spec("user alice gs")
    # ... and is alice's: no user lane takes it while her first copy runs.
    assert nextrun.look(home, 3, queue).serve is None


def test_a_claim_keeps_a_second_lane_off_the_run(home: Home) -> None:
    queue = queue_of(home, "user alice gs", "user bob gs")
    assert nextrun.claim(home, 3, queue, spec("user bob gs"))
    assert [s.line() for s in queue.read()] == ["user bob gs", "user alice gs"]
    assert not nextrun.claim(home, 4, queue, spec("user bob gs"))
    assert nextrun.look(home, 0, queue).serve == spec("user alice gs")
    assert nextrun.look(home, 3, queue).serve == spec("user bob gs")  # its claim
    # The claim stays while the run's job.start or end waits, then goes.
    serve(home, 3, "user bob gs")
    nextrun.release(home, 3)
    assert home.lane_claim(3).exists()
    home.job_start(3).unlink()
    nextrun.release(home, 3)
    assert not home.lane_claim(3).exists()


def test_a_claimed_line_that_left_the_queue_is_not_served(home: Home) -> None:
    queue = queue_of(home, "user bob gs")
    queue.remove(spec("user bob gs"))
    assert not nextrun.claim(home, 3, queue, spec("user bob gs"))
    assert not home.lane_claim(3).exists()


def test_the_supervisor_starts_user_lanes_only_for_a_run_no_lane_serves(home: Home) -> None:
    cfg = Config(home=home.root)
    queue = queue_of(home, "user alice gs")
    assert idle.surely_idle(cfg, home, 3)  # lane 0 is free: it takes the run
    serve(home, 0, "user alice gs")
    assert idle.surely_idle(cfg, home, 3)  # nothing waits beyond lane 0's run
    queue.append(spec("user bob gs"))
    assert not idle.surely_idle(cfg, home, 3)
    assert idle.surely_idle(cfg, home, 4)  # lane 3 is free: the lanes fill in order
    home.lane_claim(3).parent.mkdir(exist_ok=True)
    home.lane_claim(3).write_text("user bob gs\n")
    assert not idle.surely_idle(cfg, home, 3)  # its claim is its work
    assert idle.surely_idle(cfg, home, 4)  # nothing left for it


def test_a_heartbeat_says_it_knows_lanes_and_hears_of_them() -> None:
    hb = parse_heartbeat(format_heartbeat(Heartbeat("n1", lanes=True)))
    assert hb.lanes and not parse_heartbeat(format_heartbeat(Heartbeat("n1"))).lanes
    assert parse_reply(format_reply([(3, "r3"), (0, "r0"), (2, "r2")])) == [
        (3, "r3"), (0, "r0"), (2, "r2")]
    with pytest.raises(Exception, match="lane 0-9"):
        parse_reply(b"job 10 r1\nEND\n")


def test_the_monitor_lists_priority_0s_runs_fewest_nodes_first() -> None:
    counts = RunCounts()
    for node, status in (("n1", "running run A (priority 0)"),
                         ("n2", "running run A (priority 0)"),
                         ("n3", "running run N (priority 2)")):
        counts.note(node, status)
    jobs = [(0, "A"), (2, "N"), (3, "B")]
    assert fair_order(jobs, counts) == [(3, "B"), (0, "A"), (2, "N")]
    counts.note("n1", "running run B (priority 0)")
    counts.note("n2", None)  # no status: stays where it was
    assert counts == {"A": 1, "B": 1, "N": 1}
    counts.note("n2", "idle")
    assert fair_order(jobs, counts) == [(0, "A"), (3, "B"), (2, "N")]  # a tie: by lane
    # A node of an earlier release is told of lanes 0-2 only: it could not reach lane 3.
    assert for_node(jobs, False) == [(0, "A"), (2, "N")]
    assert for_node(jobs, True) == jobs


def test_a_preempted_node_notes_where_it_goes(tmp_path: Path) -> None:
    assert protocol.preempted_for("preempted: for run R-1 (priority 0, fair share)") == "R-1"
    assert protocol.preempted_for("run complete") is None
    assert moves.take(tmp_path) is None
    moves.note(tmp_path, "R-1")
    assert moves.take(tmp_path) == "R-1"
    assert moves.take(tmp_path) is None  # taken once


def test_clusterpull_joins_the_run_it_was_sent_to_first(tmp_path: Path) -> None:
    from cluster.node.pull import ClusterPull

    started: list[tuple[int, str]] = []
    pull = ClusterPull(Config(work_dir=tmp_path), caps="")
    pull._start = lambda lane, run_id: started.append((lane, run_id)) or True  # type: ignore[method-assign]
    pull.waiting = [(0, "A"), (3, "B"), (2, "N")]
    assert pull._start_next(0.0) and started[-1] == (0, "A")  # the monitor's order
    pull.prefer = "B"
    assert pull._start_next(0.0) and started[-1] == (3, "B")
    assert pull.prefer is None
    pull.prefer = "N"  # never before a more urgent run
    assert pull._start_next(0.0) and started[-1] == (0, "A")


def test_a_lane_number_outside_the_served_ones_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cluster.cli import clustermaster

    args = ["--home", str(tmp_path / "h"), "--set", "user_lanes=2"]
    assert clustermaster.main([*args, "--lane", "4"]) == 2
    assert "lane 4 is not served with user_lanes = 2 (lanes 0, 1, 2, 3)" in \
        capsys.readouterr().err
    assert clustermaster.main([*args, "--priority", "1", "--lane", "3"]) == 2
    assert "lane 3 serves priority 0, not 1" in capsys.readouterr().err
