"""cluster.master.codelock: a run is announced only after its tick's node code publish."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cluster.master import codelock
from cluster.wire.jobstart import JobStart
from tests.unit.test_runlimits import master_with_a_queued_run


def test_no_lock_file_means_no_publisher_and_no_wait(tmp_path: Path) -> None:
    assert codelock.wait_for_publish(tmp_path / "node-code.lock", timeout=0)
    assert not (tmp_path / "node-code.lock").exists()  # a look creates nothing


def test_a_free_lock_is_passed_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "node-code.lock"
    with codelock.publishing(lock):
        pass
    assert codelock.wait_for_publish(lock, timeout=0)


def test_a_waiter_passes_only_once_the_publisher_let_go(tmp_path: Path) -> None:
    lock = tmp_path / "node-code.lock"
    holding, released = threading.Event(), threading.Event()

    def publisher() -> None:
        with codelock.publishing(lock):
            holding.set()
            time.sleep(0.3)
            released.set()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        assert holding.wait(10)
        assert codelock.wait_for_publish(lock, timeout=30)
        assert released.is_set()
    finally:
        thread.join()


def test_a_publish_that_outlasts_the_wait_is_given_up_on(tmp_path: Path) -> None:
    lock = tmp_path / "node-code.lock"
    with codelock.publishing(lock):
        assert not codelock.wait_for_publish(lock, timeout=0.05)
    assert codelock.wait_for_publish(lock, timeout=0)


def test_the_master_writes_job_start_only_once_the_ticks_publish_ended(tmp_path: Path) -> None:
    """A clustermaster started at a tick sets its run up while the supervisor publishes the
    node code, and announces it (job.start) only after the publish let go of the lock."""
    home, master, spec = master_with_a_queued_run(tmp_path / "home", "auto nightly gs")
    holding, released = threading.Event(), threading.Event()
    seen_while_held: list[bool] = []

    def supervisor_publishing() -> None:
        with codelock.publishing(home.node_code_lock):
            holding.set()
            time.sleep(0.3)
            seen_while_held.append(home.job_start(1).exists())
            released.set()

    thread = threading.Thread(target=supervisor_publishing)
    thread.start()
    try:
        assert holding.wait(10)
        start = master._job_start(spec)
        assert released.is_set() and seen_while_held == [False]
        assert JobStart.parse(home.job_start(1).read_text()).id == start.id
    finally:
        thread.join()
