"""A program's ``main`` run in a forked child, not in a new interpreter.

The master runs two programs before a run can start: build.py, which makes the job list
(seed 000: clustermaster.pl ran build.pl), and the slowest-first ordering of that list
(:mod:`cluster.master.model.joborder`, a child so that its memory goes back whole when it ends).
Each used to be a new Python interpreter with its imports: 0.1-0.2 s apiece on a two-core
machine, more than the work itself for a small corpus.  :func:`run` calls the program's
``main`` in a ``fork`` of the caller instead: the same code with the same arguments, its
stdout a file the caller gives, its stderr kept for the caller's log, without the
interpreter's start.  (The master's own modules may not import build.py's command line:
clustermaster.py hands its ``main`` down.)

The child is made fit for it before ``main`` runs: the caller's signal handlers (which may
only set a stop flag) are back at their defaults, so a TERM or KILL of the caller's group
ends it too; ``sys.stdout`` and ``sys.stderr`` are new streams on descriptors 1 and 2, now
the given file and the kept stderr (the caller's may be a log file's wrapper or a test
runner's capture, with buffered text of its own); its logging handlers (the caller's log
file) are dropped, so the program logs to its stderr as it does when run alone; it leaves
with ``os._exit`` (no ``atexit`` of the caller, no second flush of the caller's buffers,
which were flushed before the fork).  An exception escaping ``main`` is printed to its
stderr and is exit status :data:`CRASHED`.  The caller waits at most ``timeout`` seconds,
then KILLs it.

Why a fork is safe where the master uses it: it forks before it serves anything; its only
other thread is the PID file's refresher, whose locks the child never takes, and CPython
re-creates the import and logging locks in a child after ``fork``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

from cluster.runtime import proc

#: A program's ``main``: its arguments in, its exit status out.
Main = Callable[[list[str]], int]
#: The exit status of a child whose ``main`` raised (EX_SOFTWARE).
CRASHED = 70
#: The signals whose handlers the caller may have installed: back to the default in the child.
_RESET = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often the caller looks whether the child ended: the first look, the longest [s].
_FIRST_LOOK, _LONGEST_LOOK = 0.002, 0.05


@dataclass(frozen=True)
class Made:
    """How the child ended: its exit status (negative: killed by that signal), what it
    wrote on stderr, and whether it was killed at the timeout."""

    returncode: int
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self, timeout: float) -> str:
        """The outcome in words, as :meth:`cluster.runtime.proc.Result.describe` gives a
        program's ("timed out after 60 s", "exit status 2", "terminated by SIGKILL")."""
        if self.timed_out:
            return f"timed out after {timeout:g} s"
        return proc.describe_status(self.returncode)


def run(main: Main, args: Sequence[str], out: IO[str] | IO[bytes], timeout: float) -> Made:
    """``main(args)`` in a forked child whose stdout is ``out`` (an open file) and whose
    stderr is kept; the child is KILLed after ``timeout`` seconds."""
    out.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or odd stream: nothing to flush
            stream.flush()
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; covered through its effects
            _child(main, list(args), out.fileno(), err.fileno())
        returncode, timed_out = _wait(pid, timeout)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return Made(returncode, text, timed_out)


def _child(main: Main, args: list[str], out_fd: int, err_fd: int) -> None:
    """The child's whole life (module docstring); never returns."""
    code = CRASHED
    try:
        for signum in _RESET:
            signal.signal(signum, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # Fresh streams on the two descriptors: the caller's may be any object (a log
        # file's wrapper, a test runner's capture) and may hold buffered text of its own.
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        logging.getLogger().handlers.clear()
        try:
            code = main(args)
        except SystemExit as exc:  # sys.exit() in main: its status, as for a program
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if not isinstance(exc.code, int | None):
                print(exc.code, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - whatever it is, it is reported, never re-raised
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else CRASHED)


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The exit status of child ``pid`` (as :attr:`Made.returncode`), KILLing it once
    ``timeout`` seconds have passed; and whether it was."""
    deadline = time.monotonic() + timeout
    look = _FIRST_LOOK
    while True:  # bounded: the deadline ends it with a KILL
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status), True
        time.sleep(look)
        look = min(look * 2, _LONGEST_LOOK)
