"""The PID-file dance between real processes: a refreshing master is never evicted, a frozen
one (SIGSTOP) goes stale, is taken over and, after the wait, killed (seed 000: "it kills the
old version").  Real signals, real /proc, the real clocks."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cluster.defaults import REPO_ROOT
from cluster.master.files.pidformat import parse
from cluster.master.run.oldmaster import is_clustermaster
from cluster.master.run.pidfile import PidDecision, PidFile
from cluster.runtime.clock import SystemClock

#: The taker's stale_after and wait [seconds]: small, yet 20 refreshes of the holder long.
STALE = 2.0
WAIT = 1.0

# A stand-in master: named clustermaster.py (so is_clustermaster() knows it), takes the PID
# file and refreshes it every 0.1 s until it is replaced.  With "hang" it ignores SIGTERM and
# does not stop when replaced: only SIGKILL ends it.  Bounded: it gives up after 120 s.
HOLDER = """\
import signal, sys, time
from pathlib import Path
from cluster.master.run.pidfile import PidDecision, PidFile
from cluster.runtime.clock import SystemClock

path, hang = Path(sys.argv[1]), sys.argv[2] == "hang"
if hang:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
pf = PidFile(path, SystemClock(), stale_after=3600, wait=1, is_master=lambda pid: True)
decision = pf.acquire()
print(decision.value, flush=True)
if decision is not PidDecision.RUN:
    sys.exit(2)
deadline = time.monotonic() + 120
while time.monotonic() < deadline and pf.refresh():
    time.sleep(0.1)
print("replaced", flush=True)
while hang and time.monotonic() < deadline:
    time.sleep(0.1)
"""


def _until(what: str, predicate: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {seconds:g} s: {what}")


def _first_line(path: Path) -> str | None:
    try:
        return parse(path.read_text())[0]
    except FileNotFoundError:
        return None


@pytest.mark.parametrize("hang", [False, True], ids=["obeys-term", "ignores-term"])
def test_a_frozen_master_is_taken_over_and_killed(tmp_path: Path, hang: bool,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "clustermaster.pid"
    script = tmp_path / "clustermaster.py"
    script.write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    holder = subprocess.Popen([sys.executable, str(script), str(path),
                               "hang" if hang else "obey"], env=env, cwd=tmp_path)
    try:
        _until("the holder owns the PID file", lambda: _first_line(path) == str(holder.pid),
               30)
        assert is_clustermaster(holder.pid)
        taker = PidFile(path, SystemClock(), stale_after=STALE, wait=WAIT, refresh_every=0.2)

        # (a) A master that refreshes is never stale, however long it runs.
        busy_until = time.monotonic() + 2.5 * STALE
        while time.monotonic() < busy_until:
            assert taker.acquire() is PidDecision.EXIT_BUSY
            time.sleep(0.2)
        assert _first_line(path) == str(holder.pid)
        stamp = parse(path.read_text())[1]
        assert stamp is not None and time.monotonic() - stamp.monotonic < STALE

        # (b) Frozen, it refreshes nothing: after STALE the taker takes over, waits, kills it.
        os.kill(holder.pid, signal.SIGSTOP)
        _until("the holder is stopped",
               lambda: psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED, 10)
        frozen_at = time.monotonic()
        # Staleness counts from the holder's last refresh, which may precede the freeze
        # by up to its refresh interval: that stamp is the reference, not the freeze.
        last = parse(path.read_text())[1]
        assert last is not None
        decision = PidDecision.EXIT_BUSY
        with caplog.at_level(logging.INFO, logger="cluster.pidfile"):
            deadline = frozen_at + STALE + 60
            while decision is PidDecision.EXIT_BUSY and time.monotonic() < deadline:
                decision = taker.acquire()
                if decision is PidDecision.EXIT_BUSY:
                    time.sleep(0.1)
        assert decision is PidDecision.TOOK_OVER
        assert time.monotonic() - last.monotonic >= STALE + WAIT
        assert "terminated due to timeout" in caplog.text
        assert f"old clustermaster {holder.pid} still running" in caplog.text

        # Dead by the taker's signals (the kill waited for it); we, its parent, reap it.
        code = holder.wait(timeout=30)
        assert code == (-signal.SIGKILL if hang else -signal.SIGTERM)
        assert not is_clustermaster(holder.pid)
        if path.exists():
            # The race PidFile.refresh documents: frozen between its read and its rename, the
            # holder, continued by the taker's SIGCONT, wrote its stamp over the taker's pid,
            # so the taker did not free the file.  It names the dead holder, and the next
            # starter takes it over; the run is delayed, not doubled.
            assert _first_line(path) == str(holder.pid)
            successor = PidFile(path, SystemClock(), stale_after=STALE, wait=WAIT)
            assert successor.acquire() is PidDecision.TOOK_OVER
        assert not path.exists()  # freed after the (last) taker's wait
    finally:
        if holder.poll() is None:
            holder.kill()  # SIGKILL ends a stopped process too
            holder.wait(timeout=30)


def test_a_master_that_stops_when_replaced_is_not_killed(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """A live master whose file went stale (it was blocked, not frozen) sees the takeover at
    its next refresh and leaves during the wait: the taker kills nothing."""
    path = tmp_path / "clustermaster.pid"
    script = tmp_path / "clustermaster.py"
    script.write_text(HOLDER)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    holder = subprocess.Popen([sys.executable, str(script), str(path), "obey"], env=env,
                              cwd=tmp_path)
    try:
        _until("the holder owns the PID file", lambda: _first_line(path) == str(holder.pid),
               30)
        # Judge it as if it had not refreshed for a long time: a taker whose stale_after is
        # shorter than the holder's refresh interval.  The holder is alive and notices.
        taker = PidFile(path, SystemClock(), stale_after=0.01, wait=3.0, refresh_every=0.2)
        decision = PidDecision.EXIT_BUSY
        deadline = time.monotonic() + 30
        with caplog.at_level(logging.INFO, logger="cluster.pidfile"):
            while decision is PidDecision.EXIT_BUSY and time.monotonic() < deadline:
                time.sleep(0.05)
                decision = taker.acquire()
        assert decision is PidDecision.TOOK_OVER
        assert holder.wait(timeout=30) == 0  # it stopped by itself ("replaced")
        assert f"old clustermaster {holder.pid} has ended" in caplog.text
        assert "killing" not in caplog.text
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
