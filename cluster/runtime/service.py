"""One way to stop a daemon: signal handlers record a request, the loop acts on it.

STYLE guideline 5.  Every long-running loop of the cluster (the supervisor, the monitor, a
node's pull loop, run.py, the master's run) holds a :class:`StopFlag` and looks at it at
least once per poll slice; :func:`install_signal_handlers` makes SIGTERM and SIGINT set it.
The first request means "stop looping" (finish the current step); a second one means "hard
stop" (:attr:`StopFlag.hard`: kill the children, leave now).

Contract of :class:`StopFlag`:

* :meth:`StopFlag.set` is safe inside a signal handler: plain attribute writes, no lock
  (``threading.Event.set`` takes a lock, and a handler running while the main thread holds
  it would deadlock);
* :meth:`StopFlag.is_set` and :attr:`StopFlag.hard` may be read from any thread;
* :meth:`StopFlag.wait` sleeps in slices of at most ``poll`` seconds on the given clock and
  returns early once the flag is set, so a loop's sleep never delays a stop by more than one
  slice.
"""

from __future__ import annotations

import errno
import logging
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Protocol, TypeVar

from cluster.defaults import EXIT_PORT_TAKEN, EXIT_USAGE
from cluster.runtime.clock import Clock, SystemClock

Server = TypeVar("Server")

#: Longest slice a loop sleeps before looking at its stop flag again [seconds].
STOP_POLL = 0.25


class StopSignal(Protocol):
    """Anything the loop can ask "stop now?" (a threading.Event, a StopFlag)."""

    def is_set(self) -> bool: ...


class StopFlag:
    """A stop request that a signal handler may set: plain attribute writes, no locks.

    (threading.Event.set takes a lock; a handler running while the main thread holds that
    lock would deadlock.)  The first request means "stop looping"; a second one means "hard
    stop" (:attr:`hard`).
    """

    def __init__(self) -> None:
        self.count = 0
        self.signum: int | None = None

    def set(self, signum: int | None = None) -> None:
        self.count += 1
        self.signum = signum

    def is_set(self) -> bool:
        return self.count > 0

    @property
    def hard(self) -> bool:
        return self.count > 1

    def wait(self, seconds: float, clock: Clock | None = None, poll: float = STOP_POLL) -> bool:
        """Sleep up to ``seconds`` on ``clock``, in slices of ``poll``; True if stopped."""
        clock = clock or SystemClock()
        deadline = clock.monotonic() + seconds
        while not self.is_set():
            left = deadline - clock.monotonic()
            if left <= 0:
                break
            clock.sleep(min(poll, left))
        return self.is_set()


def install_signal_handlers(flag: StopFlag,
                            signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)
                            ) -> Callable[[], None]:
    """Make ``signals`` set ``flag``; return a function restoring the previous handlers.

    Must be called from the main thread (a rule of the signal module).
    """
    def handler(signum: int, frame: FrameType | None) -> None:
        flag.set(signum)  # record only; the loop logs and acts (STYLE guideline 5)

    previous = {s: signal.signal(s, handler) for s in signals}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def port_taken_message(doing: str, address: tuple[str, int], remedy: str) -> str:
    """What a daemon logs when another program holds its port: ``cannot <doing> on
    <host>:<port>: the port is taken ...; stop that program or <remedy>``."""
    host, port = address
    return (f"cannot {doing} on {host}:{port}: the port is taken (another program listens "
            f"on it); stop that program or {remedy}")


def listen_or_exit(make: Callable[[], Server], address: tuple[str, int], doing: str,
                   remedy: str, log: logging.Logger) -> Server | int:
    """``make()`` the daemon's listening server on ``address``, or the exit code when it
    cannot: :data:`~cluster.defaults.EXIT_PORT_TAKEN` when another program holds the port
    (logged as :func:`port_taken_message`), EXIT_USAGE for any other reason the address
    cannot be used (logged with the system's error).  Never retries: the daemon's starter
    (cron, the supervisor, localcluster) decides what comes next."""
    try:
        return make()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            log.error("%s", port_taken_message(doing, address, remedy))
            return EXIT_PORT_TAKEN
        log.error("cannot %s on %s:%s: %s (expected an address of this machine and a port "
                  "this user may bind)", doing, address[0], address[1], exc.strerror or exc)
        return EXIT_USAGE
