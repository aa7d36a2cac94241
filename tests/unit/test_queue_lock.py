"""The queue lock cannot be defeated by deleting a file, with real processes.

The break: queue.lck removed while held let a second writer lock a new file of the same
name, and an append made meanwhile was lost.  cluster.runtime.pathlock locks the queue's
directory as well, which no file deletion can undo.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import pathlock


def _slow_append(root: str, inside: Any, release: Any) -> None:
    """Append 'user a gs', stopping inside the transaction (lock held, file read) until
    ``release``: the window in which the other writer must wait."""
    q = QueueFile.for_priority(Home(Path(root)), 0)
    real = QueueFile._rewrite

    def stalled(self: QueueFile, entries: list[Any]) -> None:
        inside.set()
        assert release.wait(60)
        real(self, entries)

    QueueFile._rewrite = stalled  # type: ignore[method-assign]  # this child process only
    q.append(RunSpec.parse("user a gs"))


def _append(root: str, ref: str, done: Any) -> None:
    QueueFile.for_priority(Home(Path(root)), 0).append(RunSpec.parse(f"user {ref} gs"))
    done.set()


def test_deleting_the_held_lock_file_lets_no_second_writer_in(tmp_path: Path) -> None:
    home = Home(tmp_path)
    QueueFile.for_priority(home, 0).append(RunSpec.parse("user first gs"))
    ctx = multiprocessing.get_context("fork")
    inside, release, b_done = ctx.Event(), ctx.Event(), ctx.Event()
    a = ctx.Process(target=_slow_append, args=(str(tmp_path), inside, release))
    a.start()
    try:
        assert inside.wait(60)
        os.unlink(home.queue_lock(0))  # an operator "cleans up a stale lock"
        b = ctx.Process(target=_append, args=(str(tmp_path), "b", b_done))
        b.start()
        # B must wait for A; before the fix it locked a new queue.lck at once.
        assert not b_done.wait(1.0)
    finally:
        release.set()
    a.join(60)
    b.join(60)
    assert a.exitcode == 0 and b.exitcode == 0
    assert [s.ref for s in QueueFile.for_priority(home, 0).read()] == ["first", "a", "b"]


def _writer(root: str, writer: int) -> None:
    q = QueueFile.for_priority(Home(Path(root)), 0)
    for i in range(40):
        q.append(RunSpec("user", f"w{writer}-{i}", ("gs",)))


def _deleter(lock: str, stop: Any) -> None:
    while not stop.is_set():
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass
        time.sleep(0.0005)


def test_appends_under_a_lock_file_deleted_over_and_over_lose_nothing(tmp_path: Path) -> None:
    home = Home(tmp_path)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    deleter = ctx.Process(target=_deleter, args=(str(home.queue_lock(0)), stop))
    deleter.start()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), w)) for w in range(4)]
    try:
        for p in writers:
            p.start()
        for p in writers:
            p.join(180)
            assert p.exitcode == 0
    finally:
        stop.set()
        deleter.join(10)
    refs = sorted(s.ref for s in QueueFile.for_priority(home, 0).read())
    assert refs == sorted(f"w{w}-{i}" for w in range(4) for i in range(40))


def test_shared_locks_coexist_and_exclude_a_writer(tmp_path: Path) -> None:
    lock = tmp_path / "x.lck"
    with pathlock.locked(lock, shared=True), pathlock.locked(lock, shared=True, timeout=0):
        with pytest.raises(pathlock.LockTimeout, match="still held by another process"):
            with pathlock.locked(lock, timeout=0.2):
                pass
    with pathlock.locked(lock, timeout=0):
        pass


def test_other_lock_files_of_the_directory_wait_too(tmp_path: Path) -> None:
    """The directory lock is shared by the directory's lock files (never nest them)."""
    with pathlock.locked(tmp_path / "a.lck"):
        with pytest.raises(pathlock.LockTimeout):
            with pathlock.locked(tmp_path / "b.lck", timeout=0):
                pass


def test_a_symlink_planted_at_the_lock_name_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    (home / "queue.lck").symlink_to(outside / "created-elsewhere")
    with pytest.raises(OSError):
        with pathlock.locked(home / "queue.lck"):
            pass
    assert not (outside / "created-elsewhere").exists()


def test_a_waiting_thread_gets_the_lock_once_released(tmp_path: Path) -> None:
    lock = tmp_path / "x.lck"
    got = threading.Event()

    def waiter() -> None:
        with pathlock.locked(lock, timeout=60):
            got.set()

    with pathlock.locked(lock):
        t = threading.Thread(target=waiter)
        t.start()
        assert not got.wait(0.3)
        os.unlink(lock)  # deleting it changes nothing: the waiter still waits
        assert not got.wait(0.3)
    t.join(60)
    assert got.is_set()
