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
  slice;
* :attr:`StopFlag.wakeup_fd`, once :func:`install_signal_handlers` set it, is a file
  descriptor that turns readable when a signal arrives (``signal.set_wakeup_fd``'s pipe).  A
  loop that waits in ``select`` adds it to what it waits for, and so ends its wait the moment
  a stop is asked instead of at the end of its slice (a blocked ``select`` is resumed after
  a signal's handler, PEP 475); it calls :func:`drain` when it turns readable.
  The daemons whose stop every ``localcluster.py`` exit waits for (the monitor, a node's
  held heartbeat, the supervisor, the status page) wait this way (``Clock.wait_readable``
  where the loop has no select of its own).
"""

from __future__ import annotations

import errno
import logging
import os
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
        #: Readable once a signal arrived (see the module docstring); None until
        #: install_signal_handlers set it.
        self.wakeup_fd: int | None = None

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


def drain(fd: int) -> None:
    """Empty the non-blocking wakeup fd ``fd`` (one byte per signal), so that it turns
    readable again only at the next signal; what a signal asked is in the flag, not in the
    bytes."""
    try:
        while os.read(fd, 512):  # bounded: a pipe holds a few KiB at most
            pass
    except BlockingIOError:
        pass


def install_signal_handlers(flag: StopFlag,
                            signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)
                            ) -> Callable[[], None]:
    """Make ``signals`` set ``flag``, and give it a :attr:`~StopFlag.wakeup_fd`; return a
    function restoring the previous handlers and wakeup fd (and closing the pipe).

    Must be called from the main thread (a rule of the signal module).  The process's one
    ``signal.set_wakeup_fd`` slot is taken: the pipe's write end gets a byte per signal.
    """
    def handler(signum: int, frame: FrameType | None) -> None:
        flag.set(signum)  # record only; the loop logs and acts (STYLE guideline 5)

    previous = {s: signal.signal(s, handler) for s in signals}
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    flag.wakeup_fd = read_end

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(previous_fd)
        flag.wakeup_fd = None
        os.close(read_end)
        os.close(write_end)

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
