"""``order=N`` (docs/runoptions.md, "Order within a queue"): the option's grammar, the order
a master looks at a queue's waiting runs in (lowest first, file order among equals), the
next run it picks, and the queue's in-place rewrite that ``clusteradmin order`` uses
(keeping the run's enqueue time), and ``clusteradmin order`` itself on a waiting run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cluster import deps
from cluster.config import Config
from cluster.console import reorder
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.master.run import nextrun
from cluster.queue import QueueFile
from cluster.runoptions import RunOptionError, RunOptions, order_of, parse_order
from cluster.runspec import RunSpec


def spec(line: str) -> RunSpec:
    return RunSpec.parse(line)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.root.mkdir()
    return h


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("5", 5), ("-3", -3), ("100", 100),
                                             ("-100", -100)])
def test_order_values(text: str, value: int) -> None:
    assert parse_order(text) == value
    assert order_of(spec(f"user bob gs order={text}").options) == value
    assert RunOptions.of([f"order={text}"], Config()).order == value


@pytest.mark.parametrize("text", ["x", "1.5", "101", "-101", "+5", "05", "-0", "1e2",
                                  "٣", " 1"])
def test_bad_orders_are_refused_naming_the_option_and_range(text: str) -> None:
    with pytest.raises(RunOptionError, match=rf"order={re.escape(text)}: expected a whole number "
                       r"from -100 to 100"):
        parse_order(text)
    with pytest.raises(QueueLineError, match="order"):
        RunSpec.parse(f"user bob gs order={text}")
    with pytest.raises(QueueLineError, match="order= has no value"):
        RunSpec.parse("user bob gs order=")


def test_no_order_is_zero() -> None:
    assert order_of(spec("user bob gs lowres").options) == 0
    assert RunOptions.of([], Config()).order == 0


def test_serving_order_is_lowest_first_and_stable_for_equals() -> None:
    runs = [spec("user a gs order=5"), spec("user b gs"), spec("user c gs order=-3"),
            spec("user d gs order=0"), spec("user e gs order=5"), spec("user f gs order=-3")]
    assert [r.ref for _, r in deps.serving_order(runs)] == ["c", "f", "b", "d", "a", "e"]
    # Positions stay the file's (a bmpcmp run's implicit dependencies use them).
    assert [p for p, _ in deps.serving_order(runs)] == [2, 5, 1, 3, 0, 4]


def test_without_orders_the_queue_order_is_kept() -> None:
    runs = [spec(f"user u{i} gs") for i in range(10)]
    assert [r for _, r in deps.serving_order(runs)] == runs


def test_choose_takes_the_best_ready_run(home: Home) -> None:
    queued = {0: [spec("user a gs"), spec("user b gs order=-1 after=X"),
                  spec("user c gs order=-1")]}
    choice = deps.choose(0, queued, deps.Resolver(home, queued))
    assert choice.serve == spec("user c gs order=-1")
    assert choice.drop[0][0] == spec("user b gs order=-1 after=X")  # X names no run


def test_the_master_takes_the_best_waiting_run_unless_one_runs(home: Home) -> None:
    queue = QueueFile.for_priority(home, 0)
    for line in ("user a gs order=2", "user b gs order=1", "user c gs order=1"):
        queue.append(spec(line))
    assert nextrun.look(home, 0, queue).serve == spec("user b gs order=1")
    home.job_start(0).write_text("running\n")  # the head runs: a successor takes it over
    assert nextrun.look(home, 0, queue).serve == spec("user a gs order=2")


def test_replace_rewrites_a_waiting_line_in_place_keeping_its_time(home: Home) -> None:
    queue = QueueFile.for_priority(home, 0)
    queue.path.write_text("# note\nuser a gs queue_timeout=1h\nuser b gs\n")
    since = queue.waiting_since()["user a gs queue_timeout=1h"]
    new = spec("user a gs order=4 queue_timeout=1h")
    assert queue.replace(spec("user a gs queue_timeout=1h"), new)
    assert queue.path.read_text() == "# note\nuser a gs order=4 queue_timeout=1h\nuser b gs\n"
    assert queue.waiting_since() == {new.line(): pytest.approx(since, abs=0.01)}
    # The running run is never rewritten.
    assert not queue.replace(new, spec("user a gs"), running=new)


def test_clusteradmin_order_on_a_waiting_run(home: Home) -> None:
    queue = QueueFile.for_priority(home, 1)
    queue.append(spec("git 0123abc gs"))
    queue.append(spec("git 4567def gs order=3"))
    done = reorder.set_order(home, "p1:2", "-2", "alice@host")
    assert (done.old, done.new, done.running) == (3, -2, False)
    assert [s.line() for s in queue.read()] == ["git 0123abc gs", "git 4567def gs order=-2"]
    done = reorder.set_order(home, "git 4567def gs order=-2", "0", "bob@host")
    assert [s.line() for s in queue.read()] == ["git 0123abc gs", "git 4567def gs"]
    log = home.admin_log.read_text().splitlines()
    assert log[0].endswith("alice@host order p1:2 'git 4567def gs order=3' 3 -> -2")
    assert "bob@host order p1:2" in log[1]
    before = queue.path.read_bytes()
    with pytest.raises(RunOptionError):
        reorder.set_order(home, "p1:1", "200", "alice@host")
    with pytest.raises(ClusterError, match="holds 2 run"):
        reorder.set_order(home, "p1:3", "1", "alice@host")
    with pytest.raises(ClusterError, match="neither running nor waiting"):
        reorder.set_order(home, "20260101000000-p1-abcd", "1", "alice@host")
    assert queue.path.read_bytes() == before and len(log) == 2
