"""cluster.master.files.codelock: a run is announced only after its tick's node code publish."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cluster.master.files import codelock
from cluster.triggers import push
from cluster.triggers.push import push_tree
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
    """A clustermaster started at a tick comes up while the supervisor publishes the node
    code, and announces its run (job.start) only after the publish let go of the lock."""
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
        start = master.setup.job_start(spec)
        assert released.is_set() and seen_while_held == [False]
        assert JobStart.parse(home.job_start(1).read_text()).id == start.id
    finally:
        thread.join()


def test_a_user_run_waits_for_the_publish_without_holding_its_pushed_tree(
        tmp_path: Path) -> None:
    """A user run's job.start is written under the pushed tree's lock: the wait for the
    publish comes before that, so the user's next push is not held up by a publish."""
    home, master, spec = master_with_a_queued_run(tmp_path / "home", "user ann gs")
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "a.c").write_text("int a;\n")
    push_tree(home, dev, spec, method="copy")
    starts: list[JobStart] = []
    thread = threading.Thread(target=lambda: starts.append(master.setup.job_start(spec)))
    with codelock.publishing(home.node_code_lock):
        thread.start()
        time.sleep(0.3)  # the master waits for the publish now
        with push.tree_locked(home, "ann", "ghostpdl", 0):  # TreeBusy if it held the lock
            pass
        assert not home.job_start(1).exists()
    thread.join(30)
    assert starts and JobStart.parse(home.job_start(1).read_text()).id == starts[0].id
