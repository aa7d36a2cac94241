"""Unit tests of cluster.master.run.pidfile: the clustermaster PID-file dance of ARTIFEX.md §2.6."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from cluster.master.files.pidformat import parse
from cluster.master.run.oldmaster import is_clustermaster
from cluster.master.run.pidfile import PidDecision, PidFile
from cluster.runtime.clock import FakeClock
from cluster.runtime.service import Stopped

NOW = 1_700_000_000.0
ME = 4242
OTHER = 3131


def _first(path: Path) -> str:
    """The PID file's first line (the pid other tools read)."""
    return parse(path.read_text())[0]


class RecordingClock(FakeClock):
    """A FakeClock that records the PID file's first line whenever someone slept."""

    def __init__(self, path: Path) -> None:
        super().__init__(start=NOW)
        self.path = path
        self.seen_while_sleeping: list[str | None] = []

    def sleep(self, seconds: float) -> None:
        try:
            self.seen_while_sleeping.append(_first(self.path))
        except FileNotFoundError:
            self.seen_while_sleeping.append(None)
        super().sleep(seconds)


def _write(path: Path, content: str, age: float) -> None:
    path.write_text(content)
    os.utime(path, (NOW - age, NOW - age))


def _pidfile(path: Path, clock: FakeClock, masters: set[int] | None = None,
             pid: int = ME, kills: list[int] | None = None) -> PidFile:
    """A PidFile whose live clustermasters are ``masters`` and whose kills go to ``kills``.

    ``refresh_every`` equals ``wait``: the takeover wait is one sleep, as in the Perl (the
    refreshing wait is tested in test_pidfile_refresh.py).
    """
    live = masters if masters is not None else set()
    record = kills if kills is not None else []
    return PidFile(path, clock, stale_after=7200, wait=300, is_master=live.__contains__,
                   pid=pid, kill=record.append, start_time=lambda p: 1.0, refresh_every=300)


def test_no_file_we_run(tmp_path: Path) -> None:
    """Without a PID file the starter writes its pid and runs, without sleeping."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW)
    pf = _pidfile(path, clock)
    assert pf.acquire() is PidDecision.RUN
    first, stamp = parse(path.read_text())
    assert first == str(ME) and path.read_text().startswith(f"{ME}\n")
    assert stamp is not None and stamp.monotonic == clock.monotonic()
    assert pf.still_mine()
    assert clock.sleeps == []
    assert [p.name for p in tmp_path.iterdir()] == ["clustermaster.pid"]  # no temp left


def test_zero_marker_takes_over(tmp_path: Path) -> None:
    """A file holding 0: write our pid, sleep `wait`, remove the file, TOOK_OVER."""
    path = tmp_path / "clustermaster.pid"
    _write(path, "0\n", age=10)
    clock = RecordingClock(path)
    assert _pidfile(path, clock).acquire() is PidDecision.TOOK_OVER
    assert clock.sleeps == [300]
    assert clock.seen_while_sleeping == [str(ME)]
    assert not path.exists()


def test_stale_file_takes_over_and_logs_timeout(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """An old-format file older than stale_after is taken over even if its pid is a live
    master, which is killed after the wait (seed 000: "it kills the old version")."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=7201)
    clock = RecordingClock(path)
    reasons: list[str] = []
    kills: list[int] = []
    pf = PidFile(path, clock, stale_after=7200, wait=300, is_master=lambda pid: True, pid=ME,
                 on_takeover=reasons.append, kill=kills.append, start_time=lambda p: 1.0,
                 refresh_every=300)
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert pf.acquire() is PidDecision.TOOK_OVER
    assert "terminated due to timeout" in caplog.text
    assert reasons and "terminated due to timeout" in reasons[0]
    assert clock.seen_while_sleeping == [str(ME)]
    assert clock.sleeps == [300]
    assert kills == [OTHER]
    assert not path.exists()


def test_staleness_uses_the_injected_clock(tmp_path: Path) -> None:
    """Old format: mtime is compared with clock.time(): fresh or stale by the clock."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=0)
    clock = FakeClock(start=NOW + 7199)
    assert _pidfile(path, clock, {OTHER}).acquire() is PidDecision.EXIT_BUSY
    clock.advance(2)
    assert _pidfile(path, clock, {OTHER}).acquire() is PidDecision.TOOK_OVER


def test_fresh_live_master_exit_busy(tmp_path: Path) -> None:
    """A fresh file whose pid is a live clustermaster: exit, change nothing."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=60)
    before = path.stat()
    clock = FakeClock(start=NOW)
    pf = _pidfile(path, clock, {OTHER})
    assert pf.acquire() is PidDecision.EXIT_BUSY
    assert path.read_text() == f"{OTHER}\n"
    assert path.stat().st_mtime == before.st_mtime
    assert clock.sleeps == []
    assert not pf.still_mine()


def test_fresh_dead_pid_takes_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A fresh file whose pid is not a live clustermaster is taken over; nothing is killed."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=60)
    clock = RecordingClock(path)
    kills: list[int] = []
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert _pidfile(path, clock, set(), kills=kills).acquire() is PidDecision.TOOK_OVER
    assert f"clustermaster {OTHER} died without removing its PID file" in caplog.text
    assert kills == []
    assert clock.seen_while_sleeping == [str(ME)]
    assert not path.exists()


class StoppingClock(RecordingClock):
    """A RecordingClock whose first sleep is cut by a stop request, as SIGTERM cuts a
    taker's wait (a Stopped raised in it)."""

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        raise Stopped(signal.SIGTERM)


def test_a_master_that_released_its_file_is_followed_at_once(tmp_path: Path) -> None:
    """The file a master removes when it stops (release) leaves the next starter nothing
    to wait for: it runs, without a sleep; a master that died instead left its pid, and
    the next starter waits ``wait`` (seed 000) saying the master died."""
    path = tmp_path / "clustermaster.pid"
    clock = RecordingClock(path)
    stopped = _pidfile(path, clock, pid=OTHER)
    assert stopped.acquire() is PidDecision.RUN
    stopped.release()
    follower = _pidfile(path, clock, {OTHER})
    assert follower.acquire() is PidDecision.RUN
    assert clock.sleeps == []
    follower.release()
    assert _pidfile(path, clock, pid=OTHER).acquire() is PidDecision.RUN  # then it dies
    assert _pidfile(path, clock, set()).acquire() is PidDecision.TOOK_OVER
    assert clock.sleeps == [300]


def test_a_taker_stopped_during_its_wait_puts_the_file_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Stopped in the takeover wait, the taker restores the file it found (content and
    mtime): the master that died is judged anew by the next starter, which waits again."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=60)
    found = path.stat()
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        with pytest.raises(Stopped):
            _pidfile(path, StoppingClock(path), set()).acquire()
    assert path.read_text() == f"{OTHER}\n"
    assert path.stat().st_mtime == found.st_mtime
    assert "stopped during its takeover; the file is as it found it" in caplog.text
    clock = RecordingClock(path)
    assert _pidfile(path, clock, set()).acquire() is PidDecision.TOOK_OVER
    assert clock.sleeps == [300]


def test_a_stopped_taker_leaves_a_file_it_no_longer_holds(tmp_path: Path) -> None:
    """Another taker wrote its pid meanwhile: the stopped one leaves that file alone."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=60)

    class Overtaken(RecordingClock):
        def sleep(self, seconds: float) -> None:
            path.write_text("777\n")
            raise Stopped(signal.SIGTERM)

    with pytest.raises(Stopped):
        _pidfile(path, Overtaken(path), set()).acquire()
    assert path.read_text() == "777\n"


@pytest.mark.parametrize("content", ["garbage", "12abc", "-5", "1.5", "\x00\x01", "007",
                                     "12 13"])
def test_garbage_content_takes_over(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                    content: str) -> None:
    """Content that is not a pid is logged and the file taken over."""
    path = tmp_path / "clustermaster.pid"
    _write(path, content, age=5)
    clock = RecordingClock(path)
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert _pidfile(path, clock, {7, 12, 13}).acquire() is PidDecision.TOOK_OVER
    assert "garbage" in caplog.text
    assert clock.seen_while_sleeping[-1] == str(ME)
    assert not path.exists()


def test_empty_file_is_garbage_after_a_grace(tmp_path: Path) -> None:
    """An empty file (a foreign writer between create and write) is retried, then taken over."""
    path = tmp_path / "clustermaster.pid"
    _write(path, "", age=1)
    clock = FakeClock(start=NOW)
    assert _pidfile(path, clock).acquire() is PidDecision.TOOK_OVER
    assert clock.sleeps[-1] == 300
    assert all(s < 1 for s in clock.sleeps[:-1])


def test_takeover_leaves_a_newer_takers_pid(tmp_path: Path) -> None:
    """After the wait, the file is removed only if it still holds our pid."""
    path = tmp_path / "clustermaster.pid"
    _write(path, f"{OTHER}\n", age=9000)

    class RivalClock(FakeClock):
        def sleep(self, seconds: float) -> None:
            path.write_text("5555\n")  # another taker wrote its pid meanwhile
            super().sleep(seconds)

    assert _pidfile(path, RivalClock(start=NOW)).acquire() is PidDecision.TOOK_OVER
    assert path.read_text() == "5555\n"


def test_old_runner_notices_takeover(tmp_path: Path) -> None:
    """The runner's still_mine() turns False once a taker wrote its pid or removed the file."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW)
    runner = _pidfile(path, clock, pid=OTHER)
    assert runner.acquire() is PidDecision.RUN
    clock.advance(7201)  # the runner did not refresh for longer than stale_after

    seen: list[bool] = []

    class Watching(FakeClock):
        def sleep(self, seconds: float) -> None:
            seen.append(runner.still_mine())
            super().sleep(seconds)

    kills: list[int] = []
    taker = _pidfile(path, Watching(start=clock.time(), monotonic_start=clock.monotonic()),
                     {OTHER}, kills=kills)
    assert taker.acquire() is PidDecision.TOOK_OVER
    assert seen == [False]
    assert not runner.still_mine() and not runner.refresh()
    assert kills == [OTHER]  # the stale runner was still a clustermaster after the wait
    runner.release()  # must not fail or recreate anything
    assert not path.exists()


def test_release_only_our_own_file(tmp_path: Path) -> None:
    """release() unlinks the file when it holds our pid and leaves anyone else's."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW)
    pf = _pidfile(path, clock)
    pf.release()  # no file: nothing to do
    assert pf.acquire() is PidDecision.RUN
    path.write_text(f"{OTHER}\n")
    pf.release()
    assert path.read_text() == f"{OTHER}\n"
    path.write_text(f"{ME}\n")  # old format, our pid: ours too
    pf.release()
    assert not path.exists()


def test_own_pid_in_file_runs(tmp_path: Path) -> None:
    """A second acquire by the owner keeps the run (the file is already ours)."""
    path = tmp_path / "clustermaster.pid"
    pf = _pidfile(path, FakeClock(start=NOW))
    assert pf.acquire() is PidDecision.RUN
    assert pf.acquire() is PidDecision.RUN


def test_race_two_objects_one_wins(tmp_path: Path) -> None:
    """Of two starters, the first creates the file; the second sees it and exits busy."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW)
    first = _pidfile(path, clock, {ME, OTHER}, pid=ME)
    second = _pidfile(path, clock, {ME, OTHER}, pid=OTHER)
    assert first.acquire() is PidDecision.RUN
    assert second.acquire() is PidDecision.EXIT_BUSY
    assert first.still_mine() and not second.still_mine()


def test_loser_reevaluates_when_file_vanishes(tmp_path: Path, monkeypatch: Any) -> None:
    """If the file disappears between the failed create and the read, acquire starts over."""
    path = tmp_path / "clustermaster.pid"
    path.write_text(f"{OTHER}\n")
    pf = _pidfile(path, FakeClock(start=NOW), {OTHER})
    real_read = PidFile._read_with_mtime
    calls = {"n": 0}

    def vanishing(self: PidFile) -> tuple[str, float]:
        calls["n"] += 1
        if calls["n"] == 1:
            path.unlink()  # the owner finished just now
        return real_read(self)

    monkeypatch.setattr(PidFile, "_read_with_mtime", vanishing)
    assert pf.acquire() is PidDecision.RUN
    assert pf.still_mine()


def _race(path: str, pid: int, barrier: Any, results: Any) -> None:
    barrier.wait()
    pf = PidFile(Path(path), FakeClock(start=time.time()), is_master=lambda p: True, pid=pid)
    results.append(pf.acquire().value)


def test_race_between_processes_exactly_one_runs(tmp_path: Path) -> None:
    """Several processes starting at the same instant: exactly one RUN, the others busy."""
    ctx = multiprocessing.get_context("fork")
    manager = ctx.Manager()
    results = manager.list()
    path = tmp_path / "clustermaster.pid"
    for _round in range(5):
        if path.exists():
            path.unlink()
        del results[:]
        barrier = ctx.Barrier(6)
        procs = [ctx.Process(target=_race, args=(str(path), 1000 + i, barrier, results))
                 for i in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert sorted(results) == ["busy"] * 5 + ["run"]
        winner = int(_first(path))
        assert 1000 <= winner < 1006
    manager.shutdown()


# --- the default is_master check ----------------------------------------------------------------

def test_is_clustermaster_own_process_and_dead_pid() -> None:
    """The test runner is not a clustermaster; pids that do not exist are not either."""
    assert not is_clustermaster(os.getpid())
    assert not is_clustermaster(0)
    assert not is_clustermaster(-1)
    assert not is_clustermaster(2**22 + 12345)  # beyond any pid_max


@pytest.mark.parametrize("name, expected", [
    ("clustermaster.py", True),
    ("clustermaster2.py", True),
    ("clustermaster.pl", True),
    ("run_clustermaster.py", False),
    ("notclustermaster.py", False),
])
def test_is_clustermaster_by_command_line(tmp_path: Path, name: str, expected: bool) -> None:
    """A process running a clustermaster script counts; the supervisor script does not."""
    script = tmp_path / name
    script.write_text("import time\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 10
        # Wait until the child exec'd python with its script (cmdline is set).
        while time.monotonic() < deadline:
            try:
                if str(script) in psutil.Process(proc.pid).cmdline():
                    break
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.02)
        assert is_clustermaster(proc.pid) is expected
    finally:
        proc.kill()
        proc.wait()
    assert not is_clustermaster(proc.pid)


def test_is_clustermaster_module_form() -> None:
    """python -m cluster.cli.clustermaster matches the pattern too."""
    from cluster.master.run.oldmaster import MASTER_WORD

    assert MASTER_WORD.fullmatch("cluster.cli.clustermaster")
    assert not MASTER_WORD.fullmatch("cluster.cli.run_clustermaster")
