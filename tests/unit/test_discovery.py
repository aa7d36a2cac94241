"""Phase 1 at priority 0: clusterpush droppings become queue lines, bad ones are set aside."""

from __future__ import annotations

from pathlib import Path

from cluster.cli.clustermaster import priority_from_name
from cluster.config import Config
from cluster.home import Home, suffixed
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import discovery, droppings


def drop(home: Home, user: str, tree: str, text: str) -> Path:
    path = home.users / user / tree / droppings.DROPPING
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_droppings_are_queued_once_and_removed(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    queue = QueueFile(home.queue(0), home.queue_lock(0))
    a = drop(home, "ann", "ghostpdl", "user ann gs lowres\n")
    b = drop(home, "bob", "mupdf", "user bob mupdf\n")
    added = droppings.scan_user_droppings(home, Config(), queue)
    assert [s.line() for s in added] == ["user ann gs lowres", "user bob mupdf"]
    assert not a.exists() and not b.exists()
    drop(home, "ann", "ghostpdl", "user ann gs lowres\n")
    assert droppings.scan_user_droppings(home, Config(), queue) == []  # already queued
    assert [s.line() for s in queue.read()] == ["user ann gs lowres", "user bob mupdf"]


def test_bad_droppings_are_set_aside_with_a_reason(tmp_path: Path, caplog) -> None:
    home = Home(tmp_path)
    home.create()
    queue = QueueFile(home.queue(0), home.queue_lock(0))
    drop(home, "ann", "ghostpdl", "user mallory gs\n")        # claims another user
    drop(home, "bob", "ghostpdl", "user bob mupdf\n")         # wrong tree
    drop(home, "cat", "ghostpdl", "user cat gs; rm -rf /\n")  # hostile words
    drop(home, "dan", "ghostpdl", "x" * 5000)                 # absurd size
    assert droppings.scan_user_droppings(home, Config(), queue) == []
    assert queue.read() == []
    rejected = sorted(p.parent.parent.name for p in home.users.glob("*/*/*.rejected"))
    assert rejected == ["ann", "bob", "cat", "dan"]
    text = caplog.text
    assert "must be a 'user ann ...' line" in text and "belong in tree 'mupdf'" in text
    assert "larger than 4096 bytes" in text


def test_priority_comes_from_the_invoked_name() -> None:
    assert priority_from_name("/x/clustermaster.py") == 0
    assert priority_from_name("clustermaster1.py") == 1
    assert priority_from_name("./clustermaster2.py") == 2


def test_per_priority_names_follow_the_suffix_rule() -> None:
    assert [suffixed("queue.lst", p) for p in (0, 1, 2)] == ["queue.lst", "queue.1.lst",
                                                             "queue.2.lst"]
    assert suffixed("job.start", 2) == "job.2.start"
    assert suffixed("clustermaster.pid", 1) == "clustermaster.1.pid"


def test_work_watcher_wakes_a_priority_when_its_queue_gets_work(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    watch = discovery.WorkWatcher(home)
    assert watch() == []
    QueueFile(home.queue(2), home.queue_lock(2)).append(RunSpec.parse("auto n-x gs"))
    assert watch() == [2]
    assert watch() == []  # nothing new since
    drop(home, "ann", "ghostpdl", "user ann gs\n")
    assert watch() == [0]
    assert watch() == []  # the same dropping, still waiting for phase 1: no new start


def test_work_watcher_wakes_a_priority_whose_master_released_its_pid_file(
        tmp_path: Path) -> None:
    """A run ended (its master dequeued it, then released the PID file): the next queued
    run must start at once, not at the next tick, so the release itself is a change."""
    home = Home(tmp_path)
    home.create()
    queue = QueueFile(home.queue(2), home.queue_lock(2))
    queue.append(RunSpec.parse("auto n-x gs"))
    home.pid_file(2).write_text("12345\n")
    watch = discovery.WorkWatcher(home)
    assert watch() == []
    home.pid_file(2).unlink()
    assert watch() == [2]
    assert watch() == []
    queue.remove(RunSpec.parse("auto n-x gs"))
    home.pid_file(2).write_text("12345\n")  # a master came; the queue is empty: no wake
    assert watch() == []
    home.pid_file(2).unlink()
    assert watch() == []


def test_work_watcher_leaves_the_droppings_it_starts_with_to_the_first_tick(
        tmp_path: Path) -> None:
    """The supervisor's first tick starts priority 0 for them; a wake as well would start
    a second copy beside it."""
    home = Home(tmp_path)
    home.create()
    drop(home, "ann", "ghostpdl", "user ann gs\n")
    watch = discovery.WorkWatcher(home)
    assert watch() == []
    drop(home, "bob", "ghostpdl", "user bob gs\n")
    assert watch() == [0]
