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

A program that is one piece of work rather than a loop (a clustermaster invocation: one
run, then exit) holds a :class:`StopPoint` instead: a stop request *raises*
:class:`Stopped` in its main thread, wherever it is, so its ``finally`` blocks (the PID
file's release) run -- except inside the steps it marks :meth:`StopPoint.held` (finished,
then stopped) or :meth:`StopPoint.quiet`; see :class:`StopPoint`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
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


class Stopped(BaseException):  # noqa: N818 - a request, not an error
    """Raised in the main thread by a :class:`StopPoint` when a stop is asked (``signum``:
    the signal).  A BaseException, as KeyboardInterrupt: no ``except Exception`` meant for a
    step's own failures takes it for one and goes on."""

    def __init__(self, signum: int | None) -> None:
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The status a process stopped this way exits with: 128 + the signal's number, as
        the shell reports a process the signal ended (143 for SIGTERM)."""
        return 128 + (self.signum or signal.SIGTERM)


class StopPoint:
    """The stop of a program that does one piece of work and exits (a clustermaster
    invocation), rather than a loop that can look at a flag.

    Contract:

    * :meth:`install` (main thread only) makes SIGTERM, SIGINT and SIGHUP record the request
      in :attr:`flag` and raise :class:`Stopped` in the main thread at once, wherever it is
      (a blocked ``select`` or ``sleep`` included), so the program unwinds through its
      ``finally`` blocks.  It returns a function restoring the previous handlers.
    * Inside a :meth:`held` block a request is only recorded: the step is finished, and the
      block's normal end raises :class:`Stopped`.  A second request (:attr:`StopFlag.hard`)
      raises at once even there.
    * Inside a :meth:`quiet` block a request is only recorded, and its end raises nothing
      (clean-up that must run whole, and may run while an exception unwinds); code after it
      asks :meth:`check` or :meth:`is_set`.
    * :class:`Stopped` is raised at most once: the clean-up it sets off runs undisturbed by
      further requests.

    Code may also look at :meth:`is_set` in a loop it runs inside a :meth:`held` block and
    leave the loop cleanly (the master's serving loop does).
    """

    def __init__(self) -> None:
        self.flag = StopFlag()
        self._held = 0
        self._quiet = 0
        self._raised = False

    def install(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
                ) -> Callable[[], None]:
        """Make ``signals`` stop the program (see the class docstring); return a function
        restoring the previous handlers.  Main thread only (a rule of the signal module)."""
        previous = {s: signal.signal(s, self._handler) for s in signals}

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.flag.set(signum)
        if self._quiet == 0 and (self._held == 0 or self.flag.hard):
            self._raise()

    def _raise(self) -> None:
        if not self._raised:
            self._raised = True
            raise Stopped(self.flag.signum)

    def is_set(self) -> bool:
        """Whether a stop was asked."""
        return self.flag.is_set()

    def check(self) -> None:
        """Raise :class:`Stopped` if a stop was asked and not yet raised (outside
        :meth:`held` and :meth:`quiet` blocks)."""
        if self.flag.is_set() and self._held == 0 and self._quiet == 0:
            self._raise()

    @contextlib.contextmanager
    def held(self, then_raise: bool = True) -> Iterator[None]:
        """A step finished rather than cut by a stop; a request made during it is raised
        when it ends normally (see the class docstring), unless ``then_raise`` is False
        (the step looks at :meth:`is_set` itself and says how it ended)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if then_raise:
            self.check()  # reached only when the block ended normally

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Clean-up no request interrupts; nothing is raised at its end."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1


def signal_name(signum: int | None) -> str:
    """``SIGTERM`` for 15; ``a stop request`` for None."""
    if signum is None:
        return "a stop request"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
