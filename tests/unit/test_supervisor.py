"""Tests of cluster.master.daemon.supervisor and run_clustermaster.py (the port of
runClustermaster.sh)."""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cluster.cli import common
from cluster.cli import run_clustermaster as cli
from cluster.master.daemon.supervisor import Periodic, Supervisor, describe_status
from cluster.runtime import service
from cluster.runtime.clock import FakeClock, SystemClock
from cluster.runtime.service import StopFlag, install_signal_handlers
from tests.helpers import stop_as_a_signal_does, wakeup_pipe

REPO = Path(__file__).resolve().parents[2]
APPEND = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _appender(out: Path, word: str) -> list[str]:
    return [sys.executable, "-c", APPEND, str(out), word]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ----------------------------------------------------------------------------------------------
# tick, reaping, logs


def test_tick_starts_one_process_per_command(tmp_path: Path) -> None:
    """Each tick starts every command once; finished children are reaped."""
    out = tmp_path / "out"
    sup = Supervisor([_appender(out, "p0"), _appender(out, "p1"), _appender(out, "p2")])
    sup.tick(0.0)
    assert len(sup.children) == 3
    assert wait_for(lambda: len(_lines(out)) == 3)
    assert sorted(_lines(out)) == ["p0", "p1", "p2"]
    assert wait_for(lambda: sup.reap() >= 0 and not sup.children)
    sup.tick(10.0)
    assert wait_for(lambda: len(_lines(out)) == 6)
    assert sup.ticks == 2 and sup.last_tick == 10.0
    sup.shutdown()


def test_a_tick_does_not_start_what_idle_says_has_nothing_to_do(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The idle check is asked per command index at each tick; a command it calls idle is
    not started, one it fails on is (starting is always safe) and the failure is logged."""
    out = tmp_path / "out"
    asked: list[int] = []
    verdicts = {0: False, 1: True}

    def idle(index: int) -> bool:
        asked.append(index)
        if index == 2:
            raise OSError("cannot read the queue")
        return verdicts[index]

    sup = Supervisor([_appender(out, "p0"), _appender(out, "p1"), _appender(out, "p2")],
                     idle=idle)
    with caplog.at_level(logging.DEBUG, logger="cluster.supervisor"):
        sup.tick(0.0)
    assert asked == [0, 1, 2]
    assert wait_for(lambda: len(_lines(out)) == 2)
    assert sorted(_lines(out)) == ["p0", "p2"]
    assert "the idle check of" in caplog.text and "cannot read the queue" in caplog.text
    assert "nothing to do" in caplog.text
    verdicts[1] = False  # work came: the next tick starts it
    assert wait_for(lambda: sup.reap() >= 0 and not sup.children)
    sup.tick(10.0)
    assert wait_for(lambda: len(_lines(out)) == 5)
    assert sorted(_lines(out)) == ["p0", "p0", "p1", "p2", "p2"]
    sup.shutdown()


def test_finished_children_leave_no_zombies(tmp_path: Path) -> None:
    """After a reap no child of ours is left as a zombie."""
    sup = Supervisor([[sys.executable, "-c", "pass"]] * 3)
    sup.tick(0.0)
    pids = [c.pid for c in sup.children]
    me = psutil.Process()
    assert wait_for(lambda: not any(_alive(p) for p in pids))  # exited: zombie or gone
    sup.reap()
    assert sup.children == []
    zombies = [c.pid for c in me.children() if c.pid in pids]
    assert zombies == []


def test_children_output_goes_to_log(tmp_path: Path) -> None:
    """stdout and stderr of the children are appended to the log file."""
    log = tmp_path / "log" / "children.log"
    cmd = [sys.executable, "-c", "import sys; print('to-out'); print('to-err', file=sys.stderr)"]
    sup = Supervisor([cmd], log_path=log)
    sup.initialize()
    sup.tick(0.0)
    assert wait_for(lambda: not sup.children or sup.reap() >= 0 and not sup.children)
    sup.shutdown()
    text = log.read_text()
    assert "to-out" in text and "to-err" in text


def test_children_get_devnull_without_log(tmp_path: Path,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    """Without a log file the children's output is discarded, not mixed into ours."""
    sup = Supervisor([[sys.executable, "-c", "print('noise-from-child')"]])
    sup.tick(0.0)
    assert wait_for(lambda: sup.reap() >= 0 and not sup.children)
    assert "noise-from-child" not in capfd.readouterr().out


def test_unstartable_command_is_logged_and_others_start(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """A command that cannot be started is logged; the other commands still run."""
    out = tmp_path / "out"
    missing = str(tmp_path / "no-such-program")
    sup = Supervisor([[missing], _appender(out, "ok")])
    with caplog.at_level(logging.ERROR, logger="cluster.supervisor"):
        sup.tick(0.0)
    assert "cannot start" in caplog.text and "no-such-program" in caplog.text
    assert wait_for(lambda: _lines(out) == ["ok"])
    sup.shutdown()


def test_nonzero_exit_is_logged_in_words(tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """A child failing is logged with its exit status in words."""
    sup = Supervisor([[sys.executable, "-c", "raise SystemExit(3)"]])
    sup.tick(0.0)
    with caplog.at_level(logging.WARNING, logger="cluster.supervisor"):
        assert wait_for(lambda: sup.reap() == 1 or not sup.children)
    assert "exit status 3" in caplog.text


def test_describe_status() -> None:
    """Return codes become words."""
    assert describe_status(0) == "exit status 0"
    assert describe_status(2) == "exit status 2"
    assert describe_status(-signal.SIGKILL) == "terminated by SIGKILL"
    assert describe_status(-250) == "terminated by signal 250"


def test_invalid_interval_refused() -> None:
    """A zero or negative interval is a programming error."""
    with pytest.raises(ValueError, match="expected seconds > 0"):
        Supervisor([], interval=0)


# ----------------------------------------------------------------------------------------------
# the run loop (fake clock)


class CountingStop:
    """Stops the loop once `limit` ticks happened."""

    def __init__(self, sup: Supervisor, limit: int) -> None:
        self.sup = sup
        self.limit = limit

    def is_set(self) -> bool:
        return self.sup.ticks >= self.limit


class SlowSupervisor(Supervisor):
    """A supervisor whose ticks take `cost` seconds of fake time and are recorded."""

    def __init__(self, clock: FakeClock, cost: float, interval: float = 10.0) -> None:
        super().__init__([], clock=clock, interval=interval)
        self.fake = clock
        self.cost = cost
        self.tick_times: list[float] = []

    def tick(self, now: float) -> None:
        super().tick(now)
        self.tick_times.append(now)
        self.fake.advance(self.cost)


def test_run_ticks_on_a_drift_corrected_schedule() -> None:
    """Ticks that take time do not push the schedule: they stay at start + k * interval."""
    clock = FakeClock(monotonic_start=100.0)
    sup = SlowSupervisor(clock, cost=3.0)
    sup.run(CountingStop(sup, 5))
    assert sup.tick_times == [100.0, 110.0, 120.0, 130.0, 140.0]


def test_run_skips_missed_periods(caplog: pytest.LogCaptureFixture) -> None:
    """A tick longer than the interval skips the missed periods instead of bursting."""
    clock = FakeClock(monotonic_start=0.0)
    sup = SlowSupervisor(clock, cost=25.0)
    with caplog.at_level(logging.WARNING, logger="cluster.supervisor"):
        sup.run(CountingStop(sup, 3))
    assert sup.tick_times == [0.0, 30.0, 60.0]
    assert "skipping" in caplog.text


def test_a_wake_does_not_start_what_idle_says_has_nothing_to_do(tmp_path: Path) -> None:
    """Between ticks, the commands ``wakeup`` names go through the same idle check: a
    queue change at a priority whose master is busy starts nothing."""
    out = tmp_path / "out"
    wakes = [[1], [1, 2], [], [1]]
    asked: list[int] = []

    def wakeup() -> list[int]:
        return wakes.pop(0) if wakes else []

    def idle(index: int) -> bool:
        asked.append(index)
        return index != 2  # 0: nothing to do, 1: its master is busy

    class AfterTheWakes:
        def is_set(self) -> bool:
            return not wakes

    sup = Supervisor([_appender(out, "p0"), _appender(out, "p1"), _appender(out, "p2")],
                     clock=FakeClock(monotonic_start=0.0), interval=10.0, poll=1.0,
                     wakeup=wakeup, idle=idle)
    sup.run(AfterTheWakes())
    assert asked == [0, 1, 2, 1, 1, 2, 1]  # the first tick's three, then each wake's
    assert wait_for(lambda: len(_lines(out)) == 2)
    assert _lines(out) == ["p2", "p2"]


LINGERER = "import sys, time; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n'); time.sleep(60)"


def _woken_once_while_a_copy_runs(tmp_path: Path, claimed_from: float
                                  ) -> tuple[Supervisor, list[float], Path]:
    """A supervisor of one command, run on a fake clock for 8 s: its first tick starts a
    copy that stays alive; the watcher wakes the command once, at once.  ``claimed`` turns
    True at fake time ``claimed_from``, and ``idle`` then says the priority is busy.
    Returns the supervisor, the fake times ``idle`` was asked at, and the start log."""
    out = tmp_path / "out"
    clock = FakeClock(monotonic_start=0.0)
    wakes = [[0]]
    asked: list[float] = []

    def idle(index: int) -> bool:
        asked.append(clock.monotonic())
        return clock.monotonic() >= claimed_from  # busy once claimed; work before

    class ForEightSeconds:
        def is_set(self) -> bool:
            return clock.monotonic() >= 8.0

    sup = Supervisor([[sys.executable, "-c", LINGERER, str(out), "copy"]], clock=clock,
                     interval=100.0, poll=1.0, wakeup=lambda: wakes.pop(0) if wakes else [],
                     idle=idle, claimed=lambda index: clock.monotonic() >= claimed_from)
    sup.run(ForEightSeconds())
    return sup, asked, out


def _kill_copies(sup: Supervisor) -> None:
    for child in sup.children:
        _kill_group(child.pid)


def test_a_wake_waits_for_the_young_copy_to_claim_the_work_and_starts_no_second(
        tmp_path: Path) -> None:
    """The first tick's clustermaster queues the push that woke the watcher: the wake waits
    while that copy has not claimed the work (no PID file yet) and is then judged busy, so
    no second copy starts."""
    sup, asked, out = _woken_once_while_a_copy_runs(tmp_path, claimed_from=2.0)
    try:
        assert asked == [0.0, 2.0]  # the tick's check, then the wake's once claimed
        assert len(sup.children) == 1 and not sup.waking
        assert wait_for(lambda: _lines(out) == ["copy"])
    finally:
        _kill_copies(sup)


def test_a_wake_that_the_young_copy_never_claims_is_judged_after_the_wait(
        tmp_path: Path) -> None:
    """A copy whose phase 1 takes longer than WAKE_WAIT does not hold the wake back for
    ever: it is judged then, and (work waiting) a second copy starts."""
    from cluster.master.daemon.supervisor import WAKE_WAIT

    sup, asked, out = _woken_once_while_a_copy_runs(tmp_path, claimed_from=99.0)
    try:
        assert asked == [0.0, WAKE_WAIT]
        assert len(sup.children) == 2 and not sup.waking
        assert wait_for(lambda: _lines(out) == ["copy", "copy"])
    finally:
        _kill_copies(sup)


def _hook_sees(sup: Supervisor, lock: Path, seen: list[tuple[int, bool]]) -> Callable[[], None]:
    """An on_tick hook that records how many children were started before it ran, and
    whether the publish lock was held while it ran."""
    from cluster.master.files import codelock

    def hook() -> None:
        seen.append((len(sup.children), not codelock.wait_for_publish(lock, timeout=0)))
    return hook


def test_with_a_tick_lock_the_hook_runs_after_the_starts_under_the_lock(
        tmp_path: Path) -> None:
    """The node code's publish (the hook) and the resource file's writer overlap the
    tick's clustermasters' start, with the lock held from before the starts to the hooks'
    end; then it is free."""
    from cluster.master.files import codelock

    out, lock, seen = tmp_path / "out", tmp_path / "node-code.lock", []
    sup = Supervisor([_appender(out, "p0"), _appender(out, "p1")], tick_lock=lock)
    sup.on_tick = _hook_sees(sup, lock, seen)
    resources: list[tuple[int, bool]] = []
    sup.periodic = [Periodic(10.0, _hook_sees(sup, lock, resources))]
    sup.tick(0.0)
    assert seen == [(2, True)]
    assert resources == [(2, True)]  # the resource file too, before any run is announced
    assert codelock.wait_for_publish(lock, timeout=0)
    assert wait_for(lambda: len(_lines(out)) == 2)


def test_without_the_lock_the_hook_runs_before_the_starts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No tick_lock, or one that cannot be taken (logged): the publish comes first, so a
    run is still announced only after it."""
    out, seen = tmp_path / "out", []
    (tmp_path / "a-file").write_text("")
    unlockable = tmp_path / "a-file" / "node-code.lock"
    for lock in (None, unlockable):
        sup = Supervisor([_appender(out, "p0")], tick_lock=lock)
        sup.on_tick = lambda sup=sup: seen.append((len(sup.children), False))
        with caplog.at_level(logging.ERROR, logger="cluster.supervisor"):
            sup.tick(0.0)
    assert seen == [(0, False), (0, False)]
    assert "cannot lock" in caplog.text and "publishing before the starts" in caplog.text
    assert wait_for(lambda: len(_lines(out)) == 2)


def test_a_stop_flags_wakeup_fd_ends_the_supervisors_wait_at_the_signal() -> None:
    """The loop waits on its StopFlag's wakeup fd: with a poll and an interval of an hour it
    still stops when the fd turns readable (a signal's byte), and the fd is drained."""
    sup = Supervisor([], interval=3600.0, poll=3600.0)
    with wakeup_pipe() as pipe:
        thread = threading.Thread(target=sup.run, args=(pipe.flag,), daemon=True)
        thread.start()
        assert wait_for(lambda: sup.ticks == 1)
        stop_as_a_signal_does(pipe, thread, "the supervisor")


def test_run_sleeps_in_short_slices() -> None:
    """Between ticks the loop sleeps at most `poll` seconds at a time (to see a stop fast)."""
    clock = FakeClock()
    sup = SlowSupervisor(clock, cost=0.0)
    sup.run(CountingStop(sup, 2))
    assert clock.sleeps and max(clock.sleeps) <= sup.poll
    assert sum(clock.sleeps) == pytest.approx(10.0)


def test_periodic_hooks_run_at_start_and_every_interval_between_ticks(
        caplog: pytest.LogCaptureFixture) -> None:
    """A periodic hook (the resource file's writer) runs at the first tick, then every
    interval of its own, between the ticks too; one that fails is logged and runs again."""
    clock = FakeClock(monotonic_start=0.0)
    times: list[float] = []

    def failing() -> None:
        raise OSError("disk full")

    sup = Supervisor([], clock=clock, interval=10.0,
                     periodic=[(3.0, lambda: times.append(clock.monotonic())),
                               (7.0, failing)])
    with caplog.at_level(logging.ERROR, logger="cluster.supervisor"):
        sup.run(CountingStop(sup, 3))  # ticks at 0, 10, 20
    assert times == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0]
    failures = [r for r in caplog.records if "periodic hook" in r.getMessage()]
    assert len(failures) == 3  # at 0, 7 and 14


def test_a_late_periodic_hook_skips_missed_periods() -> None:
    calls: list[float] = []
    sup = Supervisor([], clock=FakeClock(), periodic=[(2.0, lambda: calls.append(0.0))])
    sup.run_periodic(0.0)
    sup.run_periodic(1.0)   # not due
    sup.run_periodic(9.0)   # late: runs once, next at 11
    sup.run_periodic(10.0)
    sup.run_periodic(11.0)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="periodic hook interval"):
        Supervisor([], periodic=[(0.0, lambda: None)])


def test_run_stops_at_once_when_stop_already_set() -> None:
    """A set stop means no tick at all."""
    sup = Supervisor([], clock=FakeClock())
    stop = threading.Event()
    stop.set()
    sup.run(stop)
    assert sup.ticks == 0


# ----------------------------------------------------------------------------------------------
# stopping and signals

SLEEPER = """
import os, sys, time
open(sys.argv[1], 'w').write(str(os.getpid()))
time.sleep(60)
"""

STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], 'w').write(str(os.getpid()))
time.sleep(60)
"""

WITH_GRANDCHILD = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
open(sys.argv[1], 'w').write(str(g.pid))
time.sleep(60)
"""


def test_stop_leaves_children_running_by_default(tmp_path: Path) -> None:
    """Without kill_children a running clustermaster is left to finish its run."""
    ready = tmp_path / "ready"
    sup = Supervisor([[sys.executable, "-c", SLEEPER, str(ready)]])
    sup.tick(0.0)
    pid = sup.children[0].pid
    try:
        assert wait_for(ready.exists)
        sup.shutdown(StopFlag())
        assert _alive(pid)
        # Own session: a ^C to the supervisor's terminal would not reach it.
        assert os.getsid(pid) == pid
    finally:
        _kill_group(pid)
        sup.children[0].proc.wait()


def test_kill_children_terminates_the_process_group(tmp_path: Path) -> None:
    """With kill_children, SIGTERM reaches the clustermaster and its own children."""
    ready = tmp_path / "ready"
    sup = Supervisor([[sys.executable, "-c", WITH_GRANDCHILD, str(ready)]], kill_children=True,
                     kill_grace=10)
    sup.tick(0.0)
    proc = sup.children[0].proc
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text() != "")
        grandchild = int(ready.read_text())
        sup.shutdown(StopFlag())
        assert sup.children == []
        assert proc.returncode == -signal.SIGTERM
        assert wait_for(lambda: not _alive(grandchild))
    finally:
        _kill_group(proc.pid)
        proc.wait()


def test_the_stop_looks_at_its_children_soon_then_less_often(tmp_path: Path) -> None:
    """After SIGTERM the supervisor looks whether its children ended 2 ms later, then at
    doubling waits up to its poll; a child that had ended already is not waited for."""
    from cluster.master.daemon.supervisor import KILL_FIRST_LOOK

    class RecordingClock(SystemClock):
        def __init__(self) -> None:
            self.sleeps: list[float] = []

        def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            super().sleep(seconds)

    ready = tmp_path / "ready"
    clock = RecordingClock()
    sup = Supervisor([[sys.executable, "-c", STUBBORN, str(ready)]], kill_children=True,
                     kill_grace=0.5, poll=0.05, clock=clock)
    sup.tick(0.0)
    proc = sup.children[0].proc
    try:
        assert wait_for(ready.exists)
        sup.shutdown(StopFlag())  # it ignores SIGTERM: the whole grace is looked through
        assert clock.sleeps[:6] == [KILL_FIRST_LOOK * 2 ** k for k in range(5)] + [0.05]
    finally:
        _kill_group(proc.pid)
        proc.wait()

    ended = Supervisor([_appender(tmp_path / "out", "p0")], kill_children=True, clock=clock)
    ended.tick(0.0)
    ended.children[0].proc.wait()
    clock.sleeps.clear()
    ended.shutdown(StopFlag())
    assert clock.sleeps == [] and ended.children == []


def test_second_stop_request_kills_hard(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """A child ignoring SIGTERM is SIGKILLed when a second stop request arrives."""
    ready = tmp_path / "ready"
    sup = Supervisor([[sys.executable, "-c", STUBBORN, str(ready)]], kill_children=True,
                     kill_grace=10)
    sup.tick(0.0)
    proc = sup.children[0].proc
    try:
        assert wait_for(ready.exists)
        stop = StopFlag()
        stop.set(signal.SIGTERM)
        stop.set(signal.SIGTERM)
        assert stop.hard
        with caplog.at_level(logging.WARNING, logger="cluster.supervisor"):
            sup.shutdown(stop)
        assert proc.returncode == -signal.SIGKILL
        assert "SIGKILL" in caplog.text
    finally:
        _kill_group(proc.pid)
        proc.wait()


def test_grace_expires_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A child ignoring SIGTERM past the grace period is reported, not silently forgotten."""
    ready = tmp_path / "ready"
    sup = Supervisor([[sys.executable, "-c", STUBBORN, str(ready)]], kill_children=True,
                     kill_grace=0.3)
    sup.tick(0.0)
    proc = sup.children[0].proc
    try:
        assert wait_for(ready.exists)
        with caplog.at_level(logging.WARNING, logger="cluster.supervisor"):
            sup.shutdown(StopFlag())
        assert "still running" in caplog.text
        assert _alive(proc.pid)
    finally:
        _kill_group(proc.pid)
        proc.wait()


def test_signal_handler_only_sets_the_flag() -> None:
    """SIGTERM sets the StopFlag (and nothing else); restore() puts the old handler back."""
    before = signal.getsignal(signal.SIGTERM)
    flag = StopFlag()
    restore = install_signal_handlers(flag)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(flag.is_set, 2)
        assert flag.signum == signal.SIGTERM and not flag.hard
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_signal_makes_the_flags_wakeup_fd_readable_until_drained() -> None:
    """install_signal_handlers gives the flag a wakeup fd: readable after a signal (what a
    select-based loop waits on besides its sockets), empty again once drained; restore()
    gives the process its previous wakeup fd back and closes the pipe."""
    flag = StopFlag()
    assert flag.wakeup_fd is None
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    restore = install_signal_handlers(flag)
    fd = flag.wakeup_fd
    try:
        assert fd is not None
        assert select.select([fd], [], [], 0)[0] == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert select.select([fd], [], [], 5)[0] == [fd]
        assert wait_for(flag.is_set, 2)
        service.drain(fd)
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        restore()
    assert flag.wakeup_fd is None
    assert signal.set_wakeup_fd(before) == before
    with pytest.raises(OSError):
        os.fstat(fd)


def test_signal_stops_a_real_run_loop_promptly() -> None:
    """With the system clock, a SIGINT during the sleep ends run() within a poll slice."""
    sup = Supervisor([], interval=3600)
    flag = StopFlag()
    restore = install_signal_handlers(flag)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    try:
        started = time.monotonic()
        timer.start()
        sup.run(flag)
        assert time.monotonic() - started < 3.0
        assert sup.ticks == 1
    finally:
        timer.cancel()
        restore()


# ----------------------------------------------------------------------------------------------
# run_clustermaster.py


def test_commands_run_each_priority_script_with_our_arguments(tmp_path: Path) -> None:
    """One command per priority script, with absolute --config/--home and every --set."""
    parsed = cli._parser().parse_args(["--config", str(tmp_path / "m.conf"), "--home",
                                       str(tmp_path / "home"), "--set", "a=1", "--set", "b=2"])
    cmds = cli.clustermaster_commands(Path("/repo"), common.config_argv(parsed))
    assert [c[1] for c in cmds] == ["/repo/clustermaster.py", "/repo/clustermaster1.py",
                                    "/repo/clustermaster2.py"]
    for c in cmds:
        assert c[0] == sys.executable
        assert c[2:] == ["--config", str(tmp_path / "m.conf"), "--home", str(tmp_path / "home"),
                         "--set", "a=1", "--set", "b=2"]


def test_repo_root_holds_the_scripts() -> None:
    """REPO_ROOT is the checkout: run_clustermaster.py lives there."""
    assert cli.REPO_ROOT == REPO
    assert (REPO / "run_clustermaster.py").exists()
    assert os.access(REPO / "run_clustermaster.py", os.X_OK)


def test_cli_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --set key is reported with the legal keys; exit status 2."""
    assert cli.main(["--home", str(tmp_path), "--set", "nonsense=1", "--once"]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert cli.main(["--home", str(tmp_path), "--interval", "0", "--once"]) == 2


FAKE_MASTER = """#!/usr/bin/env python3
import os, sys
from pathlib import Path
here = Path(__file__).parent
with open(here / "calls.log", "a") as fh:
    fh.write(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) + "\\n")
"""


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    """A copy of the package and run_clustermaster.py with fake clustermaster scripts."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "cluster", repo / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "run_clustermaster.py", repo / "run_clustermaster.py")
    for name in cli.SCRIPTS:
        (repo / name).write_text(FAKE_MASTER)
    return repo


def _cli(repo: Path, *args: str) -> list[str]:
    return [sys.executable, str(repo / "run_clustermaster.py"), *args]


def test_cli_once_starts_the_three_masters(fake_repo: Path, tmp_path: Path) -> None:
    """--once starts clustermaster.py, clustermaster1.py and clustermaster2.py, then exits;
    with user_lanes = 1 nothing more (seed 000's three masters)."""
    home = tmp_path / "home"
    res = subprocess.run(_cli(fake_repo, "--home", str(home), "--set", "base_port=9300",
                              "--set", "user_lanes=1", "--once"),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    calls = fake_repo / "calls.log"
    assert wait_for(lambda: len(_lines(calls)) == 3)
    by_script = {line.split()[0]: line.split()[1:] for line in _lines(calls)}
    assert sorted(by_script) == ["clustermaster.py", "clustermaster1.py", "clustermaster2.py"]
    for args in by_script.values():
        assert args == ["--home", str(home.resolve()), "--set", "base_port=9300",
                        "--set", "user_lanes=1"]
    assert (home / "log" / cli.CHILD_LOG_NAME).exists()


def test_cli_once_starts_a_master_per_user_lane(fake_repo: Path, tmp_path: Path) -> None:
    """With user_lanes = 3 (the default) two more clustermaster.py start, as lanes 3 and 4
    of priority 0 (docs/runoptions.md, "Fair share")."""
    home = tmp_path / "home"
    res = subprocess.run(_cli(fake_repo, "--home", str(home), "--once"),
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    calls = fake_repo / "calls.log"
    assert wait_for(lambda: len(_lines(calls)) == 5)
    lanes = sorted(" ".join(line.split()[3:]) for line in _lines(calls)
                   if line.split()[0] == "clustermaster.py")
    assert lanes == ["", "--lane 3", "--lane 4"]


def test_cli_start_writes_the_package_bytecode_once(fake_repo: Path, tmp_path: Path) -> None:
    """The supervisor's start compiles its checkout's package (even where
    PYTHONDONTWRITEBYTECODE is set), so the clustermasters it starts load bytecode."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run(_cli(fake_repo, "--home", str(tmp_path / "home"), "--once"),
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    tag = sys.implementation.cache_tag
    modules = sorted((fake_repo / "cluster").rglob("*.py"))
    missing = [m for m in modules
               if not (m.parent / "__pycache__" / f"{m.stem}.{tag}.pyc").is_file()]
    assert modules and missing == []
    # A second start finds them up to date and leaves them as they are.
    pyc = fake_repo / "cluster" / "master" / "run" / "__pycache__" / f"invocation.{tag}.pyc"
    before = pyc.stat().st_mtime_ns
    res = subprocess.run(_cli(fake_repo, "--home", str(tmp_path / "home"), "--once"),
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    assert pyc.stat().st_mtime_ns == before


def _queue_everywhere(home: Path) -> None:
    """A run queued at each priority: no clustermaster is idle."""
    for name in ("queue.lst", "queue.1.lst", "queue.2.lst"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("auto nightly gs\n")


def test_cli_daemon_starts_only_the_priorities_with_work(fake_repo: Path,
                                                         tmp_path: Path) -> None:
    """On a home at rest no clustermaster is started, round after round; a run queued at
    priority 2 starts clustermaster2.py alone, at once."""
    home = tmp_path / "home"
    args = ("--home", str(home), "--set", "supervisor_interval=0.2")
    first = subprocess.Popen(_cli(fake_repo, *args), stderr=subprocess.PIPE, text=True)
    try:
        log = home / "log" / cli.LOG_NAME
        assert wait_for(lambda: "supervising 5 command(s)" in _text(log), 20)
        time.sleep(1.0)  # five rounds
        calls = fake_repo / "calls.log"
        assert _lines(calls) == []
        (home / "queue.2.lst").write_text("auto nightly gs\n")
        assert wait_for(lambda: len(_lines(calls)) >= 1, 20)
        assert {line.split()[0] for line in _lines(calls)} == {"clustermaster2.py"}
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=10)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_cli_second_instance_exits_at_once(fake_repo: Path, tmp_path: Path) -> None:
    """While one supervisor runs, a second one logs that and exits 0 promptly."""
    home = tmp_path / "home"
    _queue_everywhere(home)
    args = ("--home", str(home), "--set", "supervisor_interval=3600")
    first = subprocess.Popen(_cli(fake_repo, *args), stderr=subprocess.PIPE, text=True)
    try:
        calls = fake_repo / "calls.log"
        assert wait_for(lambda: len(_lines(calls)) == 3, 20), "first instance did not tick"
        lock = home / cli.LOCK_NAME
        assert lock.read_text().strip() == str(first.pid)

        started = time.monotonic()
        second = subprocess.run(_cli(fake_repo, *args), capture_output=True, text=True,
                                timeout=30)
        assert time.monotonic() - started < 10
        assert second.returncode == 0
        assert "already running" in second.stderr
        assert str(first.pid) in second.stderr
        assert len(_lines(calls)) == 3  # the second one started nothing
        # Under cron (--quiet) the second one prints nothing, so cron mails nothing; the
        # supervisor's log says why it left.
        quiet = subprocess.run(_cli(fake_repo, *args, "--quiet"), capture_output=True,
                               text=True, timeout=30)
        assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
        log = (home / "log" / cli.LOG_NAME).read_text()
        assert log.count("already running") == 2 and f"by pid {first.pid}" in log

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=10) == 0
        assert first.stderr is not None
        assert "stop requested (SIGTERM)" in first.stderr.read()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The lock is free again: a new supervisor can start.
    res = subprocess.run(_cli(fake_repo, "--home", str(home), "--once"), capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and "already running" not in res.stderr


def test_at_most_two_copies_of_a_command_are_alive(tmp_path: Path) -> None:
    """The runner and one checker: slow invocations never pile up on a loaded machine."""
    from cluster.master.daemon.supervisor import MAX_ALIVE_PER_COMMAND, Supervisor

    slow = (sys.executable, "-c", "import time; time.sleep(30)")
    sup = Supervisor([list(slow)], interval=1.0)
    sup.initialize()
    try:
        for t in range(5):
            sup.tick(float(t))
        assert len(sup.children) == MAX_ALIVE_PER_COMMAND == 2
    finally:
        for child in sup.children:
            child.proc.kill()
            child.proc.wait()
