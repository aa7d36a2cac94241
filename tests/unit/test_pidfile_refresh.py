"""Unit tests of the PID file's refresh stamp, its staleness on the monotonic clock, the kill
of the old master after a takeover, and keep_fresh (cluster.master.run.pidfile)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.master.files.pidformat import Stamp, parse
from cluster.master.run.pidfile import PidDecision, PidFile
from cluster.runtime.clock import Clock, FakeClock

NOW = 1_700_000_000.0
ME = 4242
OTHER = 3131
BOOT = "11111111-2222-3333-4444-555555555555"
STALE = 600.0


class TwoClocks:
    """A Clock whose wall clock can be stepped apart from its monotonic clock (NTP, date -s)."""

    def __init__(self, wall: float = NOW, mono: float = 1000.0) -> None:
        self.wall = wall
        self.mono = mono
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.wall += max(seconds, 0)
        self.mono += max(seconds, 0)

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)
        self.sleeps.pop()


class Recorder:
    """The kill and start_time seams: records kills, answers start times from a table."""

    def __init__(self, starts: dict[int, float] | None = None) -> None:
        self.kills: list[int] = []
        self.starts = starts if starts is not None else {OTHER: 5.0}

    def kill(self, pid: int) -> None:
        self.kills.append(pid)

    def start_time(self, pid: int) -> float | None:
        return self.starts.get(pid)


def make(path: Path, clock: Clock, pid: int = ME, masters: set[int] | None = None,
         rec: Recorder | None = None, boot: str = BOOT, wait: float = 300.0,
         refresh_every: float = 300.0) -> PidFile:
    live = masters if masters is not None else set()
    r = rec if rec is not None else Recorder()
    return PidFile(path, clock, stale_after=STALE, wait=wait,
                   is_master=live.__contains__, pid=pid, kill=r.kill,
                   start_time=r.start_time, refresh_every=refresh_every, boot_id=boot)


def write(path: Path, text: str, mtime: float = NOW) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def stamp_of(path: Path) -> Stamp:
    stamp = parse(path.read_text())[1]
    assert stamp is not None, path.read_text()
    return stamp


# --- the file's format ---------------------------------------------------------------------------

def test_first_line_is_the_bare_pid_and_second_the_stamp(tmp_path: Path) -> None:
    """Other tools read the first line: it stays the bare pid; the stamp is line two."""
    path = tmp_path / "clustermaster.pid"
    clock = TwoClocks(mono=1234.5)
    assert make(path, clock).acquire() is PidDecision.RUN
    assert path.read_text() == f"{ME}\nrefreshed 1234.500 {BOOT}\n"
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_without_a_boot_id_no_stamp_is_written(tmp_path: Path) -> None:
    """Where the kernel gives no boot id, the file is the Perl's: the pid alone."""
    path = tmp_path / "clustermaster.pid"
    pf = make(path, TwoClocks(), boot="")
    assert pf.acquire() is PidDecision.RUN
    assert path.read_text() == f"{ME}\n"
    assert pf.refresh() and path.read_text() == f"{ME}\n"


@pytest.mark.parametrize("text, first, stamp", [
    ("", "", None),
    ("4242\n", "4242", None),
    ("4242\nrefreshed 12.5 abc-1\n", "4242", Stamp(12.5, "abc-1")),
    ("4242\nrefreshed 12.5\n", "4242", None),
    ("4242\nrefreshed x abc\n", "4242", None),
    ("4242\nsomething else\n", "4242", None),
    ("  0  \n", "0", None),
])
def test_parse(text: str, first: str, stamp: Stamp | None) -> None:
    assert parse(text) == (first, stamp)


# --- refresh -------------------------------------------------------------------------------------

def test_refresh_restamps_our_file(tmp_path: Path) -> None:
    """refresh() rewrites our file with the current monotonic time and says True."""
    path = tmp_path / "clustermaster.pid"
    clock = TwoClocks(mono=100.0)
    pf = make(path, clock)
    assert pf.acquire() is PidDecision.RUN
    assert stamp_of(path) == Stamp(100.0, BOOT)
    clock.advance(550)
    assert pf.refresh()
    assert stamp_of(path) == Stamp(650.0, BOOT)
    assert parse(path.read_text())[0] == str(ME)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clustermaster.pid"]  # no temp left


def test_refresh_says_false_once_replaced_or_removed(tmp_path: Path) -> None:
    """A file holding another pid (a taker) or no file: False, and the file is not touched."""
    path = tmp_path / "clustermaster.pid"
    clock = TwoClocks()
    pf = make(path, clock)
    assert pf.acquire() is PidDecision.RUN
    write(path, f"{OTHER}\nrefreshed 5.000 {BOOT}\n")
    assert not pf.refresh()
    assert path.read_text() == f"{OTHER}\nrefreshed 5.000 {BOOT}\n"
    path.unlink()
    assert not pf.refresh()
    assert not path.exists()  # refresh never re-creates a released file


def test_refresh_write_failure_is_logged_once_and_keeps_the_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: refresh says True (the file is still ours) and logs once, not every 2 s."""
    from cluster.runtime import fsutil

    path = tmp_path / "clustermaster.pid"
    pf = make(path, TwoClocks())
    assert pf.acquire() is PidDecision.RUN

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil, "atomic_write", full)
    with caplog.at_level(logging.ERROR, logger="cluster.pidfile"):
        assert pf.refresh() and pf.refresh() and pf.refresh()
    assert caplog.text.count("cannot refresh the pid file") == 1
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert pf.refresh()
    assert "works again" in caplog.text


# --- staleness on the monotonic clock ------------------------------------------------------------

def test_a_wall_clock_step_does_not_make_a_refreshed_file_stale(tmp_path: Path) -> None:
    """The runner refreshed a minute ago; the wall clock then jumps 3 hours (and the file's
    mtime looks 3 hours old): the starter still sees a live master and exits."""
    path = tmp_path / "clustermaster.pid"
    runner_clock = TwoClocks(wall=NOW, mono=5000.0)
    runner = make(path, runner_clock, pid=OTHER)
    assert runner.acquire() is PidDecision.RUN
    os.utime(path, (NOW, NOW))
    starter_clock = TwoClocks(wall=NOW + 3 * 3600 + 60, mono=5060.0)  # stepped +3 h
    rec = Recorder()
    starter = make(path, starter_clock, masters={OTHER}, rec=rec)
    assert starter.acquire() is PidDecision.EXIT_BUSY
    assert starter_clock.sleeps == [] and rec.kills == []
    assert parse(path.read_text())[0] == str(OTHER)


def test_a_backward_wall_clock_step_does_not_keep_a_dead_run(tmp_path: Path) -> None:
    """Not refreshed for longer than stale_after on the monotonic clock: stale, even if the
    wall clock went back and the mtime looks new."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"{OTHER}\nrefreshed 1000.000 {BOOT}\n", mtime=NOW)
    clock = TwoClocks(wall=NOW - 3600, mono=1000.0 + STALE + 1)
    rec = Recorder()
    assert make(path, clock, masters={OTHER}, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == [OTHER]


def test_no_refresh_for_stale_after_makes_it_stale(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """At stale_after since the last refresh the file is fresh; a second later it is stale."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"{OTHER}\nrefreshed 1000.000 {BOOT}\n")
    clock = TwoClocks(mono=1000.0 + STALE)
    assert make(path, clock, masters={OTHER}).acquire() is PidDecision.EXIT_BUSY
    clock.advance(1)
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert make(path, clock, masters={OTHER}).acquire() is PidDecision.TOOK_OVER
    assert "terminated due to timeout" in caplog.text and "not refreshed for 601s" in caplog.text


def test_refreshing_keeps_a_long_run(tmp_path: Path) -> None:
    """A run three times longer than stale_after, refreshed every 2 s, is never taken over."""
    path = tmp_path / "clustermaster.pid"
    clock = TwoClocks()
    runner = make(path, clock, pid=OTHER)
    assert runner.acquire() is PidDecision.RUN
    for _ in range(int(3 * STALE / 2)):
        clock.advance(2)
        assert runner.refresh()
    assert make(path, clock, masters={OTHER}).acquire() is PidDecision.EXIT_BUSY


def test_a_stamp_from_another_boot_is_stale_and_nobody_is_killed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a reboot the owner is dead whatever its stamp says; its pid may now be another
    clustermaster's, which must not be killed."""
    path = tmp_path / "clustermaster.pid"
    other_boot = "99999999-2222-3333-4444-555555555555"
    write(path, f"{OTHER}\nrefreshed 1000.000 {other_boot}\n")
    clock = TwoClocks(mono=1001.0)  # "fresh" by the number alone
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert make(path, clock, masters={OTHER}, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert "before a reboot" in caplog.text
    assert rec.kills == []
    assert not path.exists()


@pytest.mark.parametrize("text", [f"{OTHER}\n", f"{OTHER}", f"{OTHER}\nhand-written note\n"])
def test_a_file_without_stamp_falls_back_to_the_mtime_rule(tmp_path: Path, text: str) -> None:
    """Old format or hand-written: fresh or stale by its mtime on the wall clock."""
    path = tmp_path / "clustermaster.pid"
    write(path, text, mtime=NOW)
    clock = TwoClocks(wall=NOW + STALE, mono=10**6)
    assert make(path, clock, masters={OTHER}).acquire() is PidDecision.EXIT_BUSY
    clock.advance(1)
    rec = Recorder()
    assert make(path, clock, masters={OTHER}, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == [OTHER]


def test_a_stamp_ahead_of_this_clock_falls_back_to_the_mtime_rule(tmp_path: Path) -> None:
    """A stamp later than our monotonic now cannot be from this clock: judged by mtime."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"{OTHER}\nrefreshed 99999.000 {BOOT}\n", mtime=NOW)
    clock = TwoClocks(wall=NOW + 10, mono=10.0)
    assert make(path, clock, masters={OTHER}).acquire() is PidDecision.EXIT_BUSY
    clock.wall = NOW + STALE + 1
    assert make(path, clock, masters={OTHER}).acquire() is PidDecision.TOOK_OVER


def test_a_starter_without_boot_id_judges_by_mtime(tmp_path: Path) -> None:
    """A starter that cannot tell the boot cannot compare stamps: the mtime rule."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"{OTHER}\nrefreshed 0.000 {BOOT}\n", mtime=NOW)
    clock = TwoClocks(wall=NOW + 5, mono=10**6)
    assert make(path, clock, masters={OTHER}, boot="").acquire() is PidDecision.EXIT_BUSY


def test_the_stop_marker_still_works_with_a_stamp(tmp_path: Path) -> None:
    """First line 0 is the stop marker whatever follows; no kill (there is no old pid)."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"0\nrefreshed 1000.000 {BOOT}\n")
    rec = Recorder()
    assert make(path, TwoClocks(), rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == [] and not path.exists()


# --- the kill after the takeover wait ------------------------------------------------------------

def _stale_file(path: Path) -> TwoClocks:
    write(path, f"{OTHER}\nrefreshed 1000.000 {BOOT}\n")
    return TwoClocks(mono=1000.0 + STALE + 1)


def test_kill_after_the_wait_when_still_a_clustermaster(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """The stale owner is still the same clustermaster after the wait: killed, then the file
    (ours during the wait) is freed."""
    path = tmp_path / "clustermaster.pid"
    clock = _stale_file(path)
    events: list[str] = []

    class Kill(Recorder):
        def kill(self, pid: int) -> None:
            events.append(f"kill {pid} file={parse(path.read_text())[0]}")
            super().kill(pid)

    rec = Kill()
    pf = make(path, clock, masters={OTHER}, rec=rec)
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"):
        assert pf.acquire() is PidDecision.TOOK_OVER
    assert clock.sleeps == [300]  # the kill comes after the wait ...
    assert events == [f"kill {OTHER} file={ME}"]  # ... and before the file is freed
    assert "killing it" in caplog.text
    assert not path.exists()


def test_no_kill_when_the_old_master_ended_during_the_wait(tmp_path: Path) -> None:
    """The old master noticed the takeover and stopped: nothing to kill."""
    path = tmp_path / "clustermaster.pid"
    clock = _stale_file(path)
    masters = {OTHER}

    class Ending(TwoClocks):
        def sleep(self, seconds: float) -> None:
            masters.discard(OTHER)  # it shut down neatly while we waited
            super().sleep(seconds)

    ending = Ending(wall=clock.wall, mono=clock.mono)
    rec = Recorder()
    assert make(path, ending, masters=masters, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == []


def test_no_kill_when_the_pid_was_reused(tmp_path: Path) -> None:
    """After the wait the pid is a clustermaster again, but another process (a new start
    time): it is not the old master and is left alone."""
    path = tmp_path / "clustermaster.pid"
    clock = _stale_file(path)
    rec = Recorder({OTHER: 5.0})

    class Reusing(TwoClocks):
        def sleep(self, seconds: float) -> None:
            rec.starts[OTHER] = 6.0  # the old one died; a new clustermaster got its pid
            super().sleep(seconds)

    reusing = Reusing(wall=clock.wall, mono=clock.mono)
    assert make(path, reusing, masters={OTHER}, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == []


def test_no_kill_of_a_stale_owner_that_was_no_clustermaster(tmp_path: Path) -> None:
    """A stale file whose pid is not a clustermaster when judged: nothing to kill, even if a
    clustermaster gets that pid during the wait."""
    path = tmp_path / "clustermaster.pid"
    clock = _stale_file(path)
    masters: set[int] = set()

    class Appearing(TwoClocks):
        def sleep(self, seconds: float) -> None:
            masters.add(OTHER)
            super().sleep(seconds)

    appearing = Appearing(wall=clock.wall, mono=clock.mono)
    rec = Recorder()
    assert make(path, appearing, masters=masters, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == []


def test_never_kills_itself(tmp_path: Path) -> None:
    """A stale file holding our own pid (an earlier process that had it): no kill."""
    path = tmp_path / "clustermaster.pid"
    write(path, f"{ME}\nrefreshed 1000.000 {BOOT}\n")
    rec = Recorder({ME: 1.0})
    clock = TwoClocks(mono=1000.0 + STALE + 1)
    assert make(path, clock, masters={ME}, rec=rec).acquire() is PidDecision.TOOK_OVER
    assert rec.kills == []


# --- the takeover wait keeps the taker's file fresh ----------------------------------------------

def test_the_takeover_wait_refreshes_the_takers_stamp(tmp_path: Path) -> None:
    """A wait longer than stale_after: the taker restamps its file every refresh_every, so a
    second starter during the wait sees a live owner and exits (instead of killing it)."""
    path = tmp_path / "clustermaster.pid"
    write(path, "0\n")
    seen: list[PidDecision] = []

    class Watching(TwoClocks):
        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            if self.mono > 1000.0 + STALE + 10 and not seen:
                other = make(path, TwoClocks(wall=self.wall, mono=self.mono), pid=OTHER,
                             masters={ME})
                seen.append(other.acquire())

    clock = Watching(mono=1000.0)
    pf = make(path, clock, wait=2 * STALE, refresh_every=2.0)
    assert pf.acquire() is PidDecision.TOOK_OVER
    assert seen == [PidDecision.EXIT_BUSY]
    assert sum(clock.sleeps) == pytest.approx(2 * STALE)
    assert max(clock.sleeps) <= 2.0
    assert not path.exists()


def test_the_takeover_wait_is_bounded_even_when_replaced(tmp_path: Path) -> None:
    """If the file stops being ours during the wait, the taker still waits the whole wait,
    once, and leaves the other pid in place."""
    path = tmp_path / "clustermaster.pid"
    write(path, "0\n")

    class Replacing(TwoClocks):
        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            if len(self.sleeps) == 3:
                path.write_text("5555\n")

    clock = Replacing()
    assert make(path, clock, wait=20.0, refresh_every=2.0).acquire() is PidDecision.TOOK_OVER
    assert sum(clock.sleeps) == pytest.approx(20.0)
    assert len(clock.sleeps) == 4  # three steps, then the rest at once
    assert path.read_text() == "5555\n"


# --- keep_fresh ----------------------------------------------------------------------------------

def _wait_until(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _stamp_is(path: Path, monotonic: float) -> Callable[[], bool]:
    return lambda: stamp_of(path).monotonic == monotonic


def test_keep_fresh_refreshes_while_the_block_sleeps(tmp_path: Path) -> None:
    """A blocking step inside keep_fresh: the stamp follows the clock; after the block the
    thread is gone and the stamp stays where it was."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW, monotonic_start=100.0)
    pf = PidFile(path, clock, stale_after=STALE, wait=300, is_master=lambda p: False,
                 pid=ME, boot_id=BOOT)
    assert pf.acquire() is PidDecision.RUN
    before = set(threading.enumerate())
    with pf.keep_fresh(0.02):
        for step in range(1, 4):
            clock.advance(STALE)  # the block "sleeps" longer than stale_after, three times
            assert _wait_until(_stamp_is(path, 100.0 + step * STALE))
        assert any("refresh" in t.name for t in set(threading.enumerate()) - before)
    assert set(threading.enumerate()) - before == set()
    clock.advance(STALE)
    time.sleep(0.1)
    assert stamp_of(path).monotonic == 100.0 + 3 * STALE  # no refresh after the block


def test_keep_fresh_stops_refreshing_a_file_taken_over(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Once the file holds a taker's pid, keep_fresh leaves it alone and says so."""
    path = tmp_path / "clustermaster.pid"
    clock = FakeClock(start=NOW)
    pf = PidFile(path, clock, stale_after=STALE, wait=300, pid=ME, boot_id=BOOT)
    assert pf.acquire() is PidDecision.RUN
    with caplog.at_level(logging.WARNING, logger="cluster.pidfile"), pf.keep_fresh(0.02):
        # A taker writes between two refreshes, never inside one (refresh's docstring: the
        # window of its few system calls is the documented race); without the lock the
        # thread's rename could land on the taker's pid and the test would wait in vain.
        with pf._lock:
            path.write_text(f"{OTHER}\n")
        assert _wait_until(lambda: "stopped refreshing" in caplog.text)
        clock.advance(10)
        time.sleep(0.1)
        assert path.read_text() == f"{OTHER}\n"
    assert not pf.still_mine()


def test_keep_fresh_refuses_a_bad_interval(tmp_path: Path) -> None:
    pf = PidFile(tmp_path / "p.pid", FakeClock(), pid=ME, boot_id=BOOT)
    with pytest.raises(ValueError, match="expected seconds > 0"), pf.keep_fresh(0):
        pass


def test_release_and_keep_fresh_never_recreate_the_file(tmp_path: Path) -> None:
    """release() during keep_fresh removes the file for good: a refresh that read the file
    just before cannot write it back."""
    path = tmp_path / "clustermaster.pid"
    pf = PidFile(path, FakeClock(), stale_after=STALE, wait=300, pid=ME, boot_id=BOOT)
    for _ in range(20):
        assert pf.acquire() is PidDecision.RUN
        with pf.keep_fresh(0.001):
            time.sleep(0.005)
            pf.release()
            time.sleep(0.005)
        assert not path.exists()
