"""The runtime room: one atomic write, one process runner, one stop flag."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from cluster.runtime import fsutil, proc
from cluster.runtime.clock import FakeClock, SystemClock
from cluster.runtime.service import StopFlag


def _temps(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{fsutil.TEMP_SUFFIX}"))


# ----------------------------------------------------------------------------------------------
# fsutil

def test_atomic_write_text_bytes_and_pieces(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    fsutil.atomic_write(target, "one\n")
    assert target.read_text() == "one\n"
    fsutil.atomic_write(target, b"\x00two")
    assert target.read_bytes() == b"\x00two"
    fsutil.atomic_write(target, (f"{i}\n" for i in range(3)), fsync=False)
    assert target.read_text() == "0\n1\n2\n"
    assert _temps(tmp_path) == []


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    fsutil.atomic_write(target, "a")
    assert target.stat().st_mode & 0o777 == fsutil.NEW_FILE_MODE
    target.chmod(0o600)
    fsutil.atomic_write(target, "b")
    assert target.stat().st_mode & 0o777 == 0o600
    fsutil.atomic_write(target, "c", mode=0o640)
    assert target.stat().st_mode & 0o777 == 0o640


def test_a_failed_write_leaves_the_target_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    fsutil.atomic_write(target, "old\n")

    def pieces() -> object:
        yield "new, half"
        raise KeyboardInterrupt  # even an interrupt mid-write

    with pytest.raises(KeyboardInterrupt):
        fsutil.atomic_write(target, pieces())  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert _temps(tmp_path) == []
    with pytest.raises(RuntimeError), fsutil.atomic_writer(target) as fh:
        fh.write("streamed")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old\n"
    assert _temps(tmp_path) == []


def test_concurrent_writers_never_tear_the_file(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    texts = [str(i) * 100_000 for i in range(8)]
    threads = [threading.Thread(target=fsutil.atomic_write, args=(target, t),
                                kwargs={"fsync": False}) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_text() in texts
    assert _temps(tmp_path) == []


def test_temp_names_carry_the_writer_and_match_the_clean_up_pattern(tmp_path: Path) -> None:
    """Every temp name says whose it is, even for targets with dots and digits in them."""
    for name in ("jobs", "jobs.1", "clustermaster.2.pid", "x.123", ".stamp"):
        fd, tmp = fsutil.temp_file(tmp_path / name)
        os.close(fd)
        match = fsutil.TEMP_NAME.fullmatch(Path(tmp).name)
        assert match, tmp
        assert match["target"] == name and int(match["pid"]) == os.getpid()
    for other in (".jobs.tmp", "jobs.12.abcdefgh.tmp", ".jobs.12.abcdefgh.tmp~",
                  ".jobs.0.abcdefgh.tmp", ".jobs.12.abcdefg.tmp", ".jobs.x.abcdefgh.tmp"):
        assert fsutil.TEMP_NAME.fullmatch(other) is None, other


def test_flocked_excludes_other_holders(tmp_path: Path) -> None:
    lock = tmp_path / "sub" / "x.lock"
    with fsutil.flocked(lock):
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at the end of the block
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------
# proc

def test_run_captures_output_and_status() -> None:
    done = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, b"out\n",
                                                                          b"err\n", False)
    assert not done.ok
    with pytest.raises(proc.ProcessError, match=r"^step: exit status 3: err$"):
        done.check("step")
    assert proc.run(["cat"], input=b"fed", timeout=30).check().stdout == b"fed"


def test_run_sends_output_to_a_callers_file(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with open(log, "w") as out:
        done = proc.run("echo a; echo b >&2", shell=True, timeout=30, stdout=out,
                        stderr=proc.STDOUT)
    assert done.ok and done.stdout == b""
    assert sorted(log.read_text().split()) == ["a", "b"]


def _alive_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_a_timeout_kills_the_whole_tree() -> None:
    seconds = 1000 + uuid.uuid4().int % 1000  # a sleep no other process has
    started = time.monotonic()
    done = proc.run(["sh", "-c", f"sleep {seconds} & sleep {seconds}; echo never"],
                    timeout=0.5, kill_grace=2)
    assert done.timed_out and not done.ok
    assert time.monotonic() - started < 10
    assert done.describe(0.5) == "timed out after 0.5 s"
    with pytest.raises(proc.ProcessError, match="timed out after 0.5 s"):
        done.check("make", timeout=0.5)
    deadline = time.monotonic() + 5
    while _alive_with(f"sleep {seconds}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(f"sleep {seconds}") == []


def test_a_command_that_cannot_start_says_so(tmp_path: Path) -> None:
    with pytest.raises(proc.ProcessError, match="cannot start .*no-such-program"):
        proc.run([str(tmp_path / "no-such-program")], timeout=5)


def test_wait_exit_returns_the_status_at_the_end_or_none_at_the_timeout() -> None:
    """wait_exit is woken by the child's end (a 60 s wait ends with it), reaps it and
    gives its status; a child still running after the timeout gives None and runs on."""
    sleeper = proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert proc.wait_exit(sleeper, 0.1) is None and sleeper.poll() is None
        threading.Timer(0.2, sleeper.terminate).start()
        assert proc.wait_exit(sleeper, 60.0) == -signal.SIGTERM
        assert sleeper.returncode == -signal.SIGTERM
        assert proc.wait_exit(sleeper, 60.0) == -signal.SIGTERM  # reaped: at once
    finally:
        sleeper.kill()
        sleeper.wait()


def test_spawn_runs_in_its_own_session_and_kill_tree_ends_it() -> None:
    child = proc.spawn(["sleep", "30"])
    try:
        assert os.getsid(child.pid) == child.pid != os.getsid(0)
        assert proc.kill_tree(child.pid, signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill_tree(child.pid)
        child.wait()
    assert not proc.kill_tree(child.pid)  # gone: nothing to signal
    assert proc.describe_status(-signal.SIGKILL) == "terminated by SIGKILL"


# ----------------------------------------------------------------------------------------------
# clock

def test_a_clock_wait_ends_when_its_event_is_set() -> None:
    """SystemClock.wait returns the moment another thread sets the event, well before its
    60 s; FakeClock.wait is a recorded sleep unless the event is set already."""
    event = threading.Event()
    timer = threading.Timer(0.2, event.set)
    timer.start()
    waiter = threading.Thread(target=SystemClock().wait, args=(event, 60.0), daemon=True)
    waiter.start()
    waiter.join(10)
    timer.join()
    assert not waiter.is_alive(), "the wait did not end when the event was set"
    assert SystemClock().wait(event, 60.0) is True

    clock = FakeClock()
    assert clock.wait(threading.Event(), 0.5) is False
    assert clock.sleeps == [0.5] and clock.monotonic() == 0.5
    assert clock.wait(event, 30.0) is True
    assert clock.sleeps == [0.5] and clock.monotonic() == 0.5


def test_a_clock_wait_for_a_readable_fd_ends_when_a_byte_comes() -> None:
    """SystemClock.wait_readable returns True the moment the fd can be read, well before
    its 60 s, and False after its time when nothing came; with no fd it is a sleep.
    FakeClock's is a recorded sleep unless the fd is readable already."""
    read_end, write_end = os.pipe()
    try:
        results: list[bool] = []
        waiter = threading.Thread(
            target=lambda: results.append(SystemClock().wait_readable(read_end, 60.0)),
            daemon=True)
        waiter.start()
        time.sleep(0.2)
        os.write(write_end, b"x")
        waiter.join(10)
        assert not waiter.is_alive() and results == [True]
        os.read(read_end, 1)
        assert SystemClock().wait_readable(read_end, 0.01) is False
        assert SystemClock().wait_readable(None, 0.01) is False

        clock = FakeClock()
        assert clock.wait_readable(read_end, 0.5) is False
        assert clock.sleeps == [0.5] and clock.monotonic() == 0.5
        os.write(write_end, b"x")
        assert clock.wait_readable(read_end, 30.0) is True
        assert clock.sleeps == [0.5] and clock.monotonic() == 0.5
        assert clock.wait_readable(None, 1.0) is False and clock.sleeps == [0.5, 1.0]
    finally:
        os.close(read_end)
        os.close(write_end)


# ----------------------------------------------------------------------------------------------
# service

def test_stop_flag_wait_sleeps_in_slices_and_returns_early_once_set() -> None:
    clock = FakeClock()
    flag = StopFlag()
    assert flag.wait(1.0, clock, poll=0.25) is False
    assert clock.sleeps == [0.25] * 4
    flag.set(signal.SIGTERM)
    assert flag.wait(100.0, clock) is True
    assert len(clock.sleeps) == 4 and not flag.hard
    flag.set(signal.SIGTERM)
    assert flag.hard


def test_a_stop_request_ends_a_run_and_its_tree() -> None:
    seconds = 2000 + uuid.uuid4().int % 1000
    flag = StopFlag()
    timer = threading.Timer(0.3, flag.set)
    timer.start()
    started = time.monotonic()
    done = proc.run(["sh", "-c", f"sleep {seconds} & sleep {seconds}"], timeout=60,
                    stop=flag, kill_grace=2)
    timer.join()
    assert done.stopped and not done.timed_out and not done.ok
    assert time.monotonic() - started < 10
    assert done.describe() == "stopped on request"
    deadline = time.monotonic() + 5
    while _alive_with(f"sleep {seconds}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(f"sleep {seconds}") == []


def test_a_run_with_a_stop_flag_that_is_never_set_runs_to_its_end() -> None:
    done = proc.run(["sh", "-c", "sleep 0.6; echo done"], timeout=30, stop=StopFlag())
    assert done.ok and done.stdout == b"done\n" and not done.stopped
