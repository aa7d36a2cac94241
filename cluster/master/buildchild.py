"""build.py's job list made in a forked child of the master, not in a new interpreter.

The master makes a run's job list by running build.py (seed 000: clustermaster.pl ran
build.pl), and the run cannot start before it: a new Python interpreter with build.py's
imports cost 0.15-0.2 s of that wait on a two-core machine, more than making the jobs of a
small corpus.  clustermaster.py (the command line, which may import build.py's; the master's
own modules may not) hands the master build.py's ``main``, and :func:`run` calls it in a
``fork`` of the master: the same program with the same arguments, its stdout the jobs file,
its stderr kept for the master's log, without the interpreter's start.

The child is made fit for it before ``main`` runs: the master's signal handlers (which only
set a stop flag) are back at their defaults, so a TERM or KILL of the master's group ends it
too; its logging handlers (the master's log file) are dropped, so build.py logs to its
stderr as it does when run alone; it leaves with ``os._exit`` (no ``atexit`` of the master,
no flush of the master's buffers, which were flushed before the fork).  An exception
escaping ``main`` is printed to its stderr and is exit status :data:`CRASHED`.  The master
waits at most ``timeout`` seconds, then KILLs it (build_timeout).

Why a fork is safe here: the master forks before it serves anything; its only other thread
is the PID file's refresher, whose locks the child never takes, and CPython re-creates the
import and logging locks in a child after ``fork``.
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

#: build.py's ``main``: its arguments in, its exit status out.
JobListMain = Callable[[list[str]], int]
#: The exit status of a child whose ``main`` raised (EX_SOFTWARE).
CRASHED = 70
#: The signals whose handlers the master installed: back to the default in the child.
_RESET = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often the master looks whether the child ended: the first look, the longest [s].
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


def run(main: JobListMain, args: Sequence[str], out: IO[str], timeout: float) -> Made:
    """``main(args)`` in a forked child whose stdout is ``out`` (an open file: the jobs
    file) and whose stderr is kept; the child is KILLed after ``timeout`` seconds."""
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


def _child(main: JobListMain, args: list[str], out_fd: int, err_fd: int) -> None:
    """The child's whole life (module docstring); never returns."""
    code = CRASHED
    try:
        for signum in _RESET:
            signal.signal(signum, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # Fresh streams on the two descriptors: the master's may be any object (a log
        # file's wrapper, a test runner's capture) and may hold buffered text of its own.
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        logging.getLogger().handlers.clear()
        code = main(args)
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
