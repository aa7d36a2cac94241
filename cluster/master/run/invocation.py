"""One clustermaster invocation up to the point where it knows whether it has work.

The supervisor starts clustermaster 0, 1 and 2 every ``supervisor_interval`` seconds
(seed 000), except where :func:`cluster.master.run.idle.surely_idle` shows, from a few stat
calls, that the invocation would find nothing to do; many of those it does start still find
nothing (a queued run waits for another, a commit poll finds no new commit).  :func:`invoke`
does phases 1 and 2 -- the queue scan and the PID-file dance -- and looks for a cut-short
run end and the queue's head with the few light modules they need.  Only when there is a run
to serve or an end to finish does it load :mod:`cluster.master.run.clustermaster` (the server,
the run state, the report, the mail, bmpcmp: about two thirds of the invocation's start-up),
so an idle invocation costs a fraction of what one that serves a run does.

The contract of an invocation is seed 000's, unchanged: at most one run, then exit; the
exit status is EXIT_OK unless the caller's configuration was unusable.

A stop (SIGTERM, SIGINT, SIGHUP; docs/architecture.md, "Stopping"): :func:`invoke` holds a
:class:`cluster.runtime.service.StopPoint`.  A request raises
:class:`~cluster.runtime.service.Stopped` in the invocation wherever it is, except in the
steps the master finishes first (setting up a run's source and job list, the end steps) and
its serving loop, which sees the request within a poll, syncs the journal and leaves; the
invocation then removes its PID file -- only if it still holds its pid -- and exits with 128
+ the signal's number.  The run stays as a killed master leaves it (job.start, the job list,
the journal, its queue line), so the next invocation, finding no PID file, takes it over at
once: the takeover's wait is kept for a master that died without removing its file.

A full disk: an invocation that cannot write (ENOSPC or EDQUOT, from the queue
scan, the PID file, or a run's start) does not die with a traceback at every supervisor
tick.  It says so once -- one line naming the file it could not write, the free space on
that file system and the room it waits for (:data:`DISK_ROOM`) -- and waits, looking at the
free space every :data:`DISK_POLL` seconds, then does its whole invocation again from the
start (every write it makes is atomic, and a run's state is made to survive a master's
death, so starting over loses and tears nothing).  Only one invocation waits at a time, for
all priorities: it holds a ``flock`` on the home's ``log/`` directory (a lock that needs no
disk space); an invocation that meets a full disk while another waits exits quietly, and
the supervisor starts it again at its next tick.  A wait is bounded by
:data:`DISK_WAIT_LIMIT`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from pathlib import Path

from cluster import lanes
from cluster.config import Config
from cluster.defaults import EXIT_FAILED, EXIT_OK
from cluster.home import Home
from cluster.master.files import ending
from cluster.master.run import nextrun, pidfile
from cluster.master.run.pidfile import PidDecision
from cluster.queue import QueueFile
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.forkrun import Main
from cluster.runtime.service import Stopped, StopPoint, signal_name
from cluster.triggers import discovery

log = logging.getLogger("cluster.master")

#: A full disk: the free space a waiting invocation waits for before it starts again
#: [bytes]: the PID file, job.start, the job list and the journal's first results.
DISK_ROOM = 1 << 20
#: How often a waiting invocation looks at the free space [seconds].
DISK_POLL = 2.0
#: The longest an invocation waits for room; then it exits with EXIT_FAILED and one more
#: line, and the supervisor's next invocation waits anew [seconds].
DISK_WAIT_LIMIT = 24 * 3600.0
#: The errors that mean "no room": the disk, or this user's quota, is full.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def queue_scan(cfg: Config, home: Home, priority: int, queue: QueueFile) -> None:
    """Phase 1: let this priority's discoverers append new runs to the queue (one broken
    discoverer is logged and does not stop the others or the invocation; a full disk is
    raised: the invocation waits for room)."""
    for discover in discovery.DISCOVERERS.get(priority, ()):
        try:
            for spec in discover(home, cfg, queue):
                log.info("priority %d: queued %s", priority, spec.line())
        except Exception as exc:  # one broken discoverer must not stop the run
            if disk_full(exc):
                raise  # not the discoverer's fault: the invocation waits for room
            log.exception("priority %d: discoverer %s failed", priority,
                          getattr(discover, "__name__", discover))


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system (or the user's quota) has no room."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still use on the file system of ``path`` (or
    of its nearest existing parent); 0 if that cannot be read."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return 0


class DiskWait:
    """One invocation's wait for room on a full disk (see the module docstring).

    :meth:`start` takes the waiters' lock (a non-blocking ``flock`` on ``home``'s log
    directory) and logs the one line; it returns False, logging nothing above DEBUG, when
    another invocation already waits.  :meth:`wait_for_room` sleeps until :data:`DISK_ROOM`
    bytes are free; :meth:`close` releases the lock."""

    def __init__(self, home: Home, clock: Clock) -> None:
        self.home = home
        self.clock = clock
        self.fd: int | None = None
        self.since = 0.0

    def start(self, exc: OSError) -> bool:
        try:
            self.fd = os.open(self.home.log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.fd = None  # no log directory to lock: wait unlocked
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.close()
                log.debug("disk full (%s); another clustermaster waits for room", exc)
                return False
        self.since = self.clock.monotonic()
        where = Path(exc.filename) if exc.filename else self.home.root
        log.error("disk full: cannot write %s (%s); %d bytes free there, waiting until "
                  "%d are free, then going on", where, exc.strerror, free_bytes(where),
                  DISK_ROOM)
        return True

    def wait_for_room(self) -> bool:
        """Sleep until :data:`DISK_ROOM` bytes are free on the home's file system (True),
        or until :data:`DISK_WAIT_LIMIT` has passed since :meth:`start` (False).  A stop
        request ends the sleep (:class:`~cluster.runtime.service.Stopped`)."""
        deadline = self.since + DISK_WAIT_LIMIT
        for _ in range(int(DISK_WAIT_LIMIT / DISK_POLL) + 2):  # bounded by the deadline too
            if free_bytes(self.home.root) >= DISK_ROOM:
                return True
            left = deadline - self.clock.monotonic()
            if left <= 0:
                break
            self.clock.sleep(min(DISK_POLL, left))
        log.error("disk still full after %.0f s (fewer than %d bytes free on %s); giving "
                  "up this invocation", self.clock.monotonic() - self.since, DISK_ROOM,
                  self.home.root)
        return False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


def invoke(cfg: Config, lane: int, config_args: list[str] | None = None,
           clock: Clock | None = None, job_list_main: Main | None = None,
           stop: StopPoint | None = None) -> int:
    """Phases 1 and 2 of ``lane`` (:mod:`cluster.lanes`: a priority's own lane is its
    number), then phase 3 if this invocation holds the PID file
    and has work: the end of any run whose end was cut short, then the run at the head of
    the queue (:meth:`cluster.master.run.clustermaster.ClusterMaster.work`).  The PID file is
    kept fresh meanwhile and released at the end.

    On a full disk the invocation waits for room, saying so once, and then starts over
    (:class:`DiskWait`); EXIT_FAILED if the room did not come within
    :data:`DISK_WAIT_LIMIT`.  ``job_list_main``: build.py's main, which the run's master
    then calls in a fork (:mod:`cluster.runtime.forkrun`) instead of starting build.py.

    A stop request (see the module docstring) ends it with 128 + the signal's number,
    leaving no PID file of its own.  ``stop``: the StopPoint to use; None: a new one, whose
    handlers are installed for the invocation when it runs in the main thread (and
    restored after)."""
    clock = clock or SystemClock()
    restore = None
    if stop is None:
        stop = StopPoint()
        if threading.current_thread() is threading.main_thread():
            restore = stop.install()
    wait: DiskWait | None = None
    try:
        for _ in range(int(DISK_WAIT_LIMIT / DISK_POLL) + 2):  # each retry waited for room
            try:
                code = _invoke_once(cfg, lane, config_args, clock, job_list_main, stop)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                stop.check()  # a stop asked while the PID file was released
                if wait is None:
                    wait = DiskWait(Home(cfg.home), clock)
                    if not wait.start(exc):
                        return EXIT_OK  # another invocation waits and goes on
                if not wait.wait_for_room():
                    return EXIT_FAILED
                continue
            if wait is not None:
                log.info("room again on %s after %.0f s of a full disk; went on",
                         cfg.home, clock.monotonic() - wait.since)
            stop.check()  # asked while the PID file was released: said the same way
            return code
        return EXIT_FAILED
    except Stopped as exc:
        log.warning("%s: clustermaster %d stopped by %s, leaving no PID file of "
                    "its own", lanes.describe(lane), os.getpid(), signal_name(exc.signum))
        return exc.exit_code
    finally:
        with stop.quiet():
            if wait is not None:
                wait.close()
            if restore is not None:
                restore()


def _invoke_once(cfg: Config, lane: int, config_args: list[str] | None,
                 clock: Clock, job_list_main: Main | None, stop: StopPoint) -> int:
    """One try of :func:`invoke`: phases 1, 2 and 3.  A user lane does no phase 1: its
    priority's own lane scans the queue's sources."""
    home = Home(cfg.home)
    home.create()
    priority = lanes.priority_of(lane)
    queue = QueueFile(home.queue(priority), home.queue_lock(priority))
    if lane == priority:
        queue_scan(cfg, home, priority, queue)
    pid = pidfile.for_priority(cfg, home, lane, clock)
    try:
        decision = pid.acquire()
    except OSError as exc:
        if disk_full(exc) and not exc.filename:
            exc.filename = str(pid.path)  # os.write names no file: the full-disk line does
        raise
    except Stopped:
        # Stopped between creating the file and returning: it may hold our pid (a
        # stopped takeover put the file back as it was, and it is not ours then).
        with stop.quiet():
            pid.release()
        raise
    if decision is not PidDecision.RUN:
        log.debug("%s: %s, exiting", lanes.describe(lane), decision.value)
        return EXIT_OK
    try:
        with pid.keep_fresh(cfg.pid_check_interval):
            pending = ending.pending(home, lane)
            if not pending and not nextrun.look(home, lane, queue).has_work:
                nextrun.release(home, lane)  # a claim left by a master killed in its set-up
                return EXIT_OK  # nothing queued, or every queued run waits (cluster.deps)
            # Loaded only now, on purpose: see the module's docstring.
            from cluster.master.run.clustermaster import ClusterMaster
            master = ClusterMaster(cfg, lane, config_args, clock, job_list_main)
            master.stop = stop
            master.work(pid, pending)
    finally:
        # Whole, whatever ends the invocation: a stop, an error or the end of the work.
        with stop.quiet():
            pid.release()
    return EXIT_OK
