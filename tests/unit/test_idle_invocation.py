"""The supervisor's idle check (cluster.master.invocation.surely_idle): a priority is judged
idle only when a real invocation there would do nothing, and anything that may be work --
a queued run, a PID file, a waiting dropping, a configured repository, a run end to
finish -- makes it not idle."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.master import ending, invocation
from cluster.queue import QueueFile, RunSpec
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
    assert [invocation.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, True, True]


def test_an_invocation_judged_idle_changes_nothing(tmp_path: Path) -> None:
    """The claim the supervisor relies on: where surely_idle says so, a real invocation
    (phases 1, 2 and the look for work) leaves every file of the home as it was."""
    cfg, home = make_home(tmp_path)
    home.queue(1).write_text("")  # an emptied queue: still idle
    before = snapshot(home)
    for priority in PRIORITIES:
        assert invocation.surely_idle(cfg, home, priority)
        assert invocation.invoke(cfg, priority) == 0
        assert snapshot(home) == before, priority


def test_a_queued_run_is_work_at_its_priority_only(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    QueueFile(home.queue(2), home.queue_lock(2)).append(RunSpec.parse("auto nightly gs"))
    assert [invocation.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, True, False]


def test_a_queue_under_its_old_name_is_work(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    home.legacy_queue(1).write_text("auto nightly gs\n")
    assert not invocation.surely_idle(cfg, home, 1)


def test_a_pid_file_is_work_even_a_dead_owners(tmp_path: Path) -> None:
    """A run is served there, or a stale owner waits to be judged by phase 2."""
    cfg, home = make_home(tmp_path)
    home.pid_file(0).write_text("999999999\n")
    assert [invocation.surely_idle(cfg, home, p) for p in PRIORITIES] == [False, True, True]


def test_a_run_end_to_finish_is_work_at_every_priority(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    record = home.run_dir("20261126-120000-0") / ending.FILE_NAME
    record.parent.mkdir(parents=True)
    record.write_text("whatever it holds: the invocation reads it\n")
    assert not any(invocation.surely_idle(cfg, home, p) for p in PRIORITIES)


def test_a_waiting_dropping_is_work_at_priority_0(tmp_path: Path) -> None:
    cfg, home = make_home(tmp_path)
    path = home.users / "ann" / "ghostpdl" / droppings.DROPPING
    path.parent.mkdir(parents=True)
    path.write_text("user ann gs\n")
    assert [invocation.surely_idle(cfg, home, p) for p in PRIORITIES] == [False, True, True]


def test_a_configured_repository_is_work_at_priority_1(tmp_path: Path) -> None:
    """Only a fetch can tell whether a repository has new commits."""
    cfg, home = make_home(tmp_path)
    cfg = Config(home=cfg.home, repositories=("gs=/srv/git/ghostpdl.git",))
    assert [invocation.surely_idle(cfg, home, p) for p in PRIORITIES] == [True, False, True]


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
    assert not invocation.surely_idle(cfg, home, 2)


def test_the_check_is_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """It runs for every priority at every tick: it must not log."""
    cfg, home = make_home(tmp_path)
    with caplog.at_level(logging.DEBUG):
        for priority in PRIORITIES:
            invocation.surely_idle(cfg, home, priority)
    assert caplog.records == []
