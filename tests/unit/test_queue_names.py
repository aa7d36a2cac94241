"""Seed 000's queue names (queue.lst, queue.1.lst, queue.2.lst) and the one-time move of the
queue files of an earlier release (queue, queue.1, queue.2), with real files and processes."""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path

import pytest

from cluster.home import Home, legacy_queue_name, suffixed
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import discovery


def test_home_names_follow_seed_000() -> None:
    home = Home(Path("/h"))
    assert [home.queue(p).name for p in (0, 1, 2)] == ["queue.lst", "queue.1.lst", "queue.2.lst"]
    assert [home.legacy_queue(p).name for p in (0, 1, 2)] == ["queue", "queue.1", "queue.2"]
    # The lock keeps ARTIFEX's name, queue.lck, with the priority suffix.
    assert [home.queue_lock(p).name for p in (0, 1, 2)] == ["queue.lck", "queue.1.lck",
                                                            "queue.2.lck"]
    assert suffixed("queue.lst", 1) == "queue.1.lst"
    assert [legacy_queue_name(n) for n in ("queue.lst", "queue.2.lst", "queue", "x.lst")] == \
        ["queue", "queue.2", None, None]


def test_a_queue_made_from_the_home_paths_knows_its_old_name(tmp_path: Path) -> None:
    """Callers that build QueueFile(home.queue(p), home.queue_lock(p)) get the move too."""
    home = Home(tmp_path)
    assert QueueFile(home.queue(1), home.queue_lock(1)).legacy_path == tmp_path / "queue.1"
    assert QueueFile(tmp_path / "q", tmp_path / "q.lck").legacy_path is None


def test_old_queue_alone_is_renamed_once(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    home = Home(tmp_path)
    old = home.legacy_queue(1)
    data = b"git 0123abc gs\n# a comment\nbogus line \xff\nuser ann gs"
    old.write_bytes(data)
    ino = old.stat().st_ino
    q = QueueFile.for_priority(home, 1)
    with caplog.at_level(logging.WARNING, logger="cluster.queue"):
        assert [s.line() for s in q.read()] == ["git 0123abc gs", "user ann gs"]
        q.read()
    assert not old.exists()
    new = home.queue(1)
    assert new.read_bytes() == data  # the same file, not even rewritten
    assert new.stat().st_ino == ino
    moved = [r for r in caplog.records if "earlier release" in r.getMessage()]
    assert len(moved) == 1 and "renamed it queue.1.lst" in moved[0].getMessage()


def test_both_names_merge_without_losing_or_doubling_a_line(tmp_path: Path) -> None:
    """The new file is never overwritten: the old one's missing lines are appended."""
    home = Home(tmp_path)
    home.queue(0).write_text("user ann gs\nuser bob gs\n")
    home.legacy_queue(0).write_text("user bob gs\n\nuser cat mupdf\nuser ann gs\n# note\n")
    q = QueueFile.for_priority(home, 0)
    assert q.append(RunSpec.parse("user dan gs"))
    assert not home.legacy_queue(0).exists()
    assert home.queue(0).read_text() == ("user ann gs\nuser bob gs\nuser cat mupdf\n# note\n"
                                         "user dan gs\n")


def test_an_old_name_that_is_not_a_file_is_left_alone(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    home = Home(tmp_path)
    home.legacy_queue(2).mkdir()
    q = QueueFile.for_priority(home, 2)
    assert q.append(RunSpec.parse("auto nightly-x gs"))
    assert home.legacy_queue(2).is_dir()
    assert q.read() == [RunSpec.parse("auto nightly-x gs")]
    assert "is not a regular file; left alone" in caplog.text


def _append_many(root: str, writer: int) -> None:
    q = QueueFile.for_priority(Home(Path(root)), 0)
    for i in range(25):
        q.append(RunSpec("user", f"w{writer}-{i}", ("gs",)))


def test_move_under_concurrent_writers_loses_nothing(tmp_path: Path) -> None:
    """Four processes append while the old file waits to be moved: every line arrives."""
    home = Home(tmp_path)
    old_lines = [f"user old{i} gs" for i in range(30)]
    home.legacy_queue(0).write_text("".join(line + "\n" for line in old_lines))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert not home.legacy_queue(0).exists()
    lines = home.queue(0).read_text().splitlines()
    assert sorted(lines) == sorted(old_lines + [f"user w{w}-{i} gs" for w in range(4)
                                                for i in range(25)])


def test_an_old_writer_after_the_move_is_merged_too(tmp_path: Path) -> None:
    """A process of the earlier release still running writes `queue` again: the next
    transaction merges it (every transaction looks)."""
    home = Home(tmp_path)
    q = QueueFile.for_priority(home, 0)
    q.append(RunSpec.parse("user ann gs"))
    home.legacy_queue(0).write_text("user ann gs\nuser zed gs\n")
    assert [s.ref for s in q.read()] == ["ann", "zed"]
    assert not home.legacy_queue(0).exists()


def test_the_watcher_wakes_a_priority_whose_old_queue_waits(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.create()
    watch = discovery.WorkWatcher(home)
    assert watch() == []
    home.legacy_queue(1).write_text("git 0123abc gs\n")
    assert watch() == [1]
    assert watch() == []
    QueueFile.for_priority(home, 1).read()  # the master moves it
    assert not os.path.exists(home.legacy_queue(1))
    assert watch() == [1]  # queue.1.lst changed and is not empty: the master runs it
