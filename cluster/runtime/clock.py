"""Time as a dependency (STYLE guideline 6).

Anything that waits, schedules or compares timestamps takes a :class:`Clock` instead of
calling :mod:`time` directly, so tests can drive it with :class:`FakeClock`:

* ``time()`` is wall-clock seconds since the epoch: use it only for timestamps that are
  written down or compared with file mtimes (the PID file's staleness, for instance);
* ``monotonic()`` is for intervals and deadlines;
* ``sleep(s)`` blocks for ``s`` seconds;
* ``wait(event, s)`` blocks for ``s`` seconds or until ``event`` is set, whichever comes
  first (a thread's work that ends at a moment of its own: a node's BUILD);
* ``wait_readable(fd, s)`` blocks for ``s`` seconds or until the file descriptor ``fd`` can
  be read (a stop flag's wakeup fd: :mod:`cluster.runtime.service`), whichever comes first.

Usage::

    clock = SystemClock()            # production
    clock = FakeClock(start=1e9)     # tests: nothing ever blocks
    clock.sleep(300)                 # FakeClock: both clocks jump 300 s, the call is recorded
    clock.advance(5)                 # FakeClock: let 5 s pass without a sleep
"""

from __future__ import annotations

import select
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """What the cluster needs to know about time."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for intervals only)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block for ``seconds`` (non-positive values return at once)."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Block for ``seconds`` or until ``event`` is set; whether it is set."""
        ...

    def wait_readable(self, fd: int | None, seconds: float) -> bool:
        """Block for ``seconds`` or until ``fd`` is readable; whether it is.  ``fd`` None:
        a plain sleep (False)."""
        ...


class SystemClock:
    """The real clocks of the :mod:`time` module."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(seconds, 0.0))

    def wait_readable(self, fd: int | None, seconds: float) -> bool:
        if fd is None:
            self.sleep(seconds)
            return False
        return bool(select.select([fd], [], [], max(seconds, 0.0))[0])


class FakeClock:
    """A clock for tests: time moves only through :meth:`advance` and :meth:`sleep`.

    Both clocks move together.  Every :meth:`sleep` is recorded in :attr:`sleeps` (so a test
    can assert "slept 300 s") and returns at once.  Safe to share between threads.
    """

    def __init__(self, start: float = 1_000_000_000.0, monotonic_start: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._time = float(start)
        self._monotonic = float(monotonic_start)
        self.sleeps: list[float] = []

    def time(self) -> float:
        with self._lock:
            return self._time

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on both clocks; negative values are refused (time is monotonic)."""
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: got {seconds!r}, expected seconds >= 0")
        with self._lock:
            self._time += seconds
            self._monotonic += seconds

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
        if seconds > 0:
            self.advance(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """At once if ``event`` is set (no time passes); else as :meth:`sleep`."""
        if event.is_set():
            return True
        self.sleep(seconds)
        return event.is_set()

    def wait_readable(self, fd: int | None, seconds: float) -> bool:
        """At once if ``fd`` is readable now (no time passes); else as :meth:`sleep`."""
        if fd is not None and select.select([fd], [], [], 0)[0]:
            return True
        self.sleep(seconds)
        return False
