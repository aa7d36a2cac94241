"""The process that owns a clustermaster's PID file, as a takeover sees it (ARTIFEX.md
§2.6): is it a live clustermaster (the Perl's ``ps -p`` check), which process exactly (its
start time, so a reused PID is never killed), and ending it (seed 000: "it kills the old
version").  :mod:`cluster.master.run.pidfile` decides when; these only look and act.
"""

from __future__ import annotations

import logging
import re
import signal
import time

import psutil

#: The PID file's logger: these lines are part of its takeover.
logger = logging.getLogger("cluster.pidfile")

#: Seconds an old master has to end after SIGTERM (and again after SIGKILL) when killed.
KILL_GRACE = 5.0
#: How often the kill looks whether the old master has ended [seconds].
_KILL_POLL = 0.05

# An argv word naming a clustermaster: clustermaster.py, /x/clustermaster2.pl,
# cluster.cli.clustermaster (python -m) -- but not run_clustermaster.py, the supervisor, whose
# command line also "mentions" clustermaster.
MASTER_WORD = re.compile(r"(?:.*\.)?clustermaster\d*(?:\.py|\.pl)?")


def is_clustermaster(pid: int) -> bool:
    """Whether ``pid`` is a live process whose command line runs a clustermaster.

    The port of the Perl's ``ps -p <pid>`` check.  A zombie counts as dead; a stopped
    (frozen) process counts as alive.  When the command line cannot be read (another user's
    process), we assume it *is* a clustermaster: wrongly evicting a live run is worse than
    waiting for the file to go stale.
    """
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    return any(MASTER_WORD.fullmatch(word.rsplit("/", 1)[-1]) for word in argv)


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (an identity: a reused PID has another), None if gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, ValueError):
        return None


def kill_master(pid: int) -> None:
    """End the old clustermaster ``pid``: SIGTERM, then SIGCONT (a stopped process acts on
    TERM only once continued), up to :data:`KILL_GRACE` seconds for it to end, then SIGKILL
    (which ends a stopped process too) and up to :data:`KILL_GRACE` seconds more.

    Never raises: a process that is gone already is fine, one we may not signal (another
    user's) or that outlives SIGKILL (stuck in the kernel) is logged as an error.  A zombie
    counts as ended: its parent, not us, must reap it.
    """
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)  # send_signal checks the PID was not reused
        proc.send_signal(signal.SIGCONT)
    except psutil.NoSuchProcess:
        return
    except psutil.AccessDenied as exc:
        logger.error("clustermaster %d: may not signal it (%s); it keeps running", pid, exc)
        return
    if _ended_within(proc, KILL_GRACE):
        logger.warning("clustermaster %d: ended after SIGTERM", pid)
        return
    logger.warning("clustermaster %d: still running %.0fs after SIGTERM; sending SIGKILL",
                   pid, KILL_GRACE)
    try:
        proc.kill()
    except psutil.NoSuchProcess:
        return
    except psutil.AccessDenied as exc:
        logger.error("clustermaster %d: may not SIGKILL it (%s); it keeps running", pid, exc)
        return
    if not _ended_within(proc, KILL_GRACE):
        logger.error("clustermaster %d: still there %.0fs after SIGKILL (stuck in the "
                     "kernel?)", pid, KILL_GRACE)


def _ended_within(proc: psutil.Process, seconds: float) -> bool:
    """Whether ``proc`` is gone or a zombie within ``seconds`` (real time: only the real
    kill, never a test's fake clock, waits here)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_KILL_POLL)
