"""Unit tests of cluster.runtime.singleton: the flock single-instance guard."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.errors import AlreadyRunning, ClusterError
from cluster.runtime.singleton import SingleInstance, read_holder

HOLD = """
import sys, time
from pathlib import Path
from cluster.runtime.singleton import SingleInstance
guard = SingleInstance(Path(sys.argv[1]), "holder")
guard.acquire()
print("held", flush=True)
time.sleep(60)
"""


def _repo_env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start_holder(lock: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE,
                            text=True, env=_repo_env())
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_acquire_writes_pid_and_release_clears(tmp_path: Path) -> None:
    """The holder's pid is in the file while held; release clears it but keeps the file."""
    lock = tmp_path / "x.lock"
    guard = SingleInstance(lock, "x")
    guard.acquire()
    assert guard.held
    assert read_holder(lock) == os.getpid()
    guard.release()
    assert not guard.held
    assert lock.exists()
    assert read_holder(lock) is None
    guard.release()  # idempotent


def test_second_instance_in_process_refused(tmp_path: Path) -> None:
    """Another guard on the same path cannot acquire while the first holds it."""
    lock = tmp_path / "x.lock"
    with SingleInstance(lock, "prog"):
        other = SingleInstance(lock, "prog")
        with pytest.raises(AlreadyRunning) as info:
            other.acquire()
        assert isinstance(info.value, ClusterError)
        assert "prog is already running" in str(info.value)
        assert str(lock) in str(info.value)
        assert not other.held
    with SingleInstance(lock, "prog") as again:  # free once the first left
        assert again.held


def test_acquire_is_idempotent(tmp_path: Path) -> None:
    """Acquiring twice with the same object is a no-op, not a self-deadlock."""
    guard = SingleInstance(tmp_path / "x.lock")
    guard.acquire()
    guard.acquire()
    guard.release()


def test_other_process_holds_lock(tmp_path: Path) -> None:
    """A lock held by another process refuses us at once; its death frees the lock."""
    lock = tmp_path / "x.lock"
    holder = _start_holder(lock)
    try:
        assert read_holder(lock) == holder.pid
        started = time.monotonic()
        with pytest.raises(AlreadyRunning):
            SingleInstance(lock, "x").acquire()
        assert time.monotonic() - started < 1.0  # non-blocking
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without any cleanup
        holder.wait()
    with SingleInstance(lock, "x") as guard:
        assert guard.held


def test_children_do_not_inherit_the_lock(tmp_path: Path) -> None:
    """A child started while holding the lock (even with close_fds=False) does not keep it."""
    lock = tmp_path / "x.lock"
    guard = SingleInstance(lock, "x")
    guard.acquire()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             close_fds=False)
    try:
        guard.release()
        # With close_fds=False Popen may use posix_spawn, whose parent resumes a moment
        # before the kernel closes the child's close-on-exec descriptors: allow for that.
        deadline = time.monotonic() + 5
        while True:
            again = SingleInstance(lock, "x")
            try:
                again.acquire()
                break
            except AlreadyRunning:
                assert time.monotonic() < deadline, "the child kept the lock"
                time.sleep(0.01)
        again.release()
    finally:
        child.kill()
        child.wait()


def test_read_holder_tolerates_junk(tmp_path: Path) -> None:
    """read_holder returns None for a missing or non-numeric file."""
    assert read_holder(tmp_path / "missing") is None
    (tmp_path / "junk").write_text("not a pid\n")
    assert read_holder(tmp_path / "junk") is None
