"""The supervisor's idle check (cluster.master.run.idle.surely_idle): a priority is judged
idle only when a real invocation there would do nothing, and anything that may be work --
a queued run, a PID file, a waiting dropping, a configured repository, a run end to
finish -- makes it not idle."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.master.files import ending
from cluster.master.run import idle, invocation
from cluster.master.run.pidfile import PidDecision, PidFile
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime.clock import SystemClock
from cluster.triggers import discovery, droppings


def make_home(tmp_path: Path) -> tuple[Config, Home]:
    cfg = Config(home=tmp_path / "home")
    home = Home(cfg.home)
    home.create()
    return cfg, home


def snapshot(home: Home) -> dict[str, str]:
    """Every file of the home but its logs and its empty lock files (made by whoever
    locks first, and left), with a digest of its contents."""
    return {str(p.relative_to(home.root)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(home.root.rglob("*"))
            if p.is_file() and home.log_dir not in p.parents
            and not (p.suffix == ".lck" and p.stat().st_size == 0)}


def test_a_fresh_home_is_idle_at_every_priority(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, True, True]


def test_an_invocation_judged_idle_changes_nothing(tmp_path: Path) -> None:
    """The claim the supervisor relies on: where surely_idle says so, a real invocation
    (phases 1, 2 and the look for work) leaves every file of the home as it was."""
    cfg, home = make_home(tmp_path)
    home.queue(1).write_text("")  # an emptied queue: still idle
    before = snapshot(home)
    for priority in PRIORITIES:
        assert idle.surely_idle(cfg, home, priority)
        assert invocation.invoke(cfg, priority) == 0
        assert snapshot(home) == before, priority


def test_a_queued_run_is_work_at_its_priority_only(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    QueueFile(home.queue(2), home.queue_lock(2)).append(RunSpec.parse("auto nightly gs"))
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, True, False]


def test_a_queue_under_its_old_name_is_work(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    home.legacy_queue(1).write_text("auto nightly gs\n")
    assert not idle.surely_idle(cfg, home, 1)


@pytest.fixture
def live_master() -> Iterator[int]:
    """The pid of a live process whose command line names a clustermaster."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "clustermaster2.py"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_a_pid_file_of_a_dead_owner_or_garbage_is_work(tmp_path: Path) -> None:
    """Phase 2 must judge it: a takeover is due."""
    cfg, home = make_home(tmp_path)
    home.pid_file(0).write_text("999999999\n")
    home.pid_file(2).write_text("not a pid\n")
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [False, True, False]


def test_a_busy_priority_is_idle_unless_phase_1_may_find_work(tmp_path: Path,
                                                              live_master: int) -> None:
    """A live master holds the PID file: the invocation would only do phase 1 and exit
    busy, whatever is queued behind the running run.  A dropping makes priority 0 work."""
    cfg, home = make_home(tmp_path)
    for priority in (0, 2):
        QueueFile.for_priority(home, priority).append(RunSpec.parse("auto nightly gs"))
        pid = PidFile(home.pid_file(priority), SystemClock(), pid=live_master)
        assert pid.acquire() is PidDecision.RUN
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, True, True]
    before = snapshot(home)
    assert invocation.invoke(cfg, 2) == 0
    assert snapshot(home) == before
    path = home.users / "ann" / "ghostpdl" / droppings.DROPPING
    path.parent.mkdir(parents=True)
    path.write_text("user ann gs\n")
    assert not idle.surely_idle(cfg, home, 0)


def test_a_stale_pid_file_is_work_even_of_a_live_master(tmp_path: Path,
                                                        live_master: int) -> None:
    """Not refreshed for pid_stale: a hung master, which phase 2 ends."""
    cfg, home = make_home(tmp_path)
    cfg = Config(home=cfg.home, pid_stale=0.0)
    PidFile(home.pid_file(2), SystemClock(), pid=live_master).acquire()
    assert not idle.surely_idle(cfg, home, 2)


def test_a_run_end_to_finish_is_work_at_every_priority(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    record = home.run_dir("20261126-120000-0") / ending.FILE_NAME
    record.parent.mkdir(parents=True)
    record.write_text("whatever it holds: the invocation reads it\n")
    assert not any(idle.surely_idle(cfg, home, p) for p in PRIORITIES)


def test_a_waiting_dropping_is_work_at_priority_0(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    path = home.users / "ann" / "ghostpdl" / droppings.DROPPING
    path.parent.mkdir(parents=True)
    path.write_text("user ann gs\n")
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [False, True, True]


def test_a_configured_repository_is_work_at_priority_1(tmp_path: Path) -> None:
    """Only a fetch can tell whether a repository has new commits."""
    cfg, home = make_home(tmp_path)
    cfg = Config(home=cfg.home, repositories=("gs=/srv/git/ghostpdl.git",))
    assert [idle.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, False, True]


def test_every_priority_with_a_discoverer_says_what_it_looks_at() -> None:
    """may_find knows each priority's discoverers: a new one must be added there too."""
    assert {p: [d.__name__ for d in found] for p, found in discovery.DISCOVERERS.items()} \
        == {0: ["scan_user_droppings"], 1: ["poll"], 2: []}


def test_what_cannot_be_read_counts_as_work(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, home = make_home(tmp_path)

    def unreadable(*_: object) -> bool:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(discovery, "may_find", unreadable)
    assert not idle.surely_idle(cfg, home, 2)


def test_the_check_is_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It runs for every priority at every tick: it must not log."""
    cfg, home = make_home(tmp_path)
    with caplog.at_level(logging.DEBUG):
        for priority in PRIORITIES:
            idle.surely_idle(cfg, home, priority)
    assert caplog.records == []
