"""The PID-file semaphore of the clustermaster (seed 000 phase 2, ARTIFEX.md §2.6).

``clustermaster[.p].pid`` holds the PID of the clustermaster doing a run, its first line
ported as written, not replaced by flock (STYLE guideline 12), and a second line stamping
when the owner last showed it is alive, on the monotonic clock of its boot (the content:
:mod:`cluster.master.files.pidformat`).  Staleness is judged on that clock, so a
wall-clock step (NTP, an operator's ``date -s``) can neither evict a healthy run nor keep
a dead one alive.  The running master calls :meth:`PidFile.refresh` every
``pid_check_interval`` and wraps its blocking steps (build.py, the end of a run) in
:meth:`PidFile.keep_fresh`; a frozen (SIGSTOP) or hung master refreshes nothing and goes stale.

:meth:`PidFile.acquire` decides what a freshly started clustermaster does:

===========================================  =======================================================
file state                                   action, result
===========================================  =======================================================
missing                                      create it with our PID -> ``RUN`` (we do the run)
first line ``0`` (the stop marker)           takeover (below), no kill -> ``TOOK_OVER``
stamp from another boot                      "written before a reboot": takeover, no kill (the
                                             owner is dead; its PID may now be someone else's)
stamp older than ``stale_after`` on the      "terminated due to timeout": takeover; after the wait,
monotonic clock (same boot)                  kill the owner if it is still that clustermaster
no stamp (an old-format or hand-written      the Perl's rule on the file's mtime (wall clock):
file, or a stamp this clock cannot judge)    older than ``stale_after`` -> as the line above
fresh, PID is a live clustermaster           nothing -> ``EXIT_BUSY``
fresh, PID dead / not a clustermaster /      "died without removing its PID file": takeover, no
garbage first line                           kill -> ``TOOK_OVER``
===========================================  =======================================================

A clustermaster that ends, however it ends short of dying (its run done, nothing to do, a
SIGTERM: :class:`cluster.runtime.service.StopPoint`), removes its own file
(:meth:`PidFile.release`), so the next starter finds none and runs at once, taking the run
over from its journal.  So the takeover's wait is only for a master that truly died (SIGKILL,
a crash, the machine) or hangs, and its line says which.

A *takeover* writes our PID (with a fresh stamp), waits ``wait`` seconds while refreshing
that stamp every ``refresh_every`` (so the file stays ours however long the wait is), kills
the old owner if due, and then removes the file if it still holds our PID.  A taker that is
itself stopped during its wait (a :class:`~cluster.runtime.service.Stopped` raised in it)
puts the file back as it found it (content and mtime), if it is still its own: the old
owner is as dead or hung as before, and the next starter judges it anew.  After
``TOOK_OVER`` or ``EXIT_BUSY`` the caller exits.  While the taker waits, new starters see a
fresh file owned by a live clustermaster and exit, and a live old runner sees at its next
:meth:`refresh` / :meth:`still_mine` that the file is no longer its own, and stops; the kill
after the wait (seed 000: "it kills the old version") ends an old runner that could not stop
(frozen, hung): SIGTERM, SIGCONT, :data:`~cluster.master.run.oldmaster.KILL_GRACE` seconds,
SIGKILL.  The kill happens only if the owner was a clustermaster when judged and is the
*same* process (same start time) after the wait, so a PID reused meanwhile is never killed
(the owner's process: :mod:`cluster.master.run.oldmaster`).

Creating the file is atomic *with its content* (a temporary file hard-linked into place), so
of two masters starting at once exactly one wins, and the loser never reads a half-written
file: it re-evaluates and sees a fresh file owned by the winner.  Overwriting it (a takeover,
a refresh) is :func:`cluster.runtime.fsutil.atomic_write`.

The defaults of ``stale_after``, ``wait`` and ``refresh_every`` are the configuration's
``pid_stale`` (seed 000 judged a run dead after 2 hours without end; a live master now says it
is alive every few seconds, so staleness means "not refreshed for" ``pid_stale``), ``pid_wait``
(seed 000: "wait for 5 minutes ... gives any old clustermaster time to shut down neatly")
and ``pid_check_interval``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from cluster.config import DEFAULTS, Config
from cluster.home import Home
from cluster.master.files.pidformat import (
    FILE_MODE,
    STOP_MARKER,
    Stamp,
    parse,
    read_boot_id,
    render,
)
from cluster.master.run.oldmaster import is_clustermaster, kill_master, process_start_time
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock

logger = logging.getLogger("cluster.pidfile")

#: How often acquire() re-evaluates when the file vanishes or changes under it.
_MAX_ATTEMPTS = 5


class PidDecision(StrEnum):
    """What a starting clustermaster does after :meth:`PidFile.acquire`."""

    RUN = "run"  # we own the file: do the run
    EXIT_BUSY = "busy"  # a live clustermaster owns it: exit quietly
    TOOK_OVER = "took-over"  # we evicted a dead or stale owner and waited: exit


@dataclass(frozen=True)
class Verdict:
    """What a PID file means for a starting clustermaster: its ``decision``, why in words
    (``reason``), and for a takeover the old owner to kill after the wait (``victim``)."""

    decision: PidDecision
    reason: str = ""
    victim: int | None = None


class PidFile:
    """The clustermaster PID file.

    Callers use :meth:`acquire` once at start; during the run :meth:`refresh` every
    ``pid_check_interval`` (it also tells whether the file is still theirs) and
    :meth:`keep_fresh` around steps that block; :meth:`release` at the end.

    Seams for tests: ``clock`` (staleness on ``clock.monotonic()``, the old-format rule on
    ``clock.time()``, the takeover wait on ``clock.sleep()``), ``is_master`` (is that PID a
    live clustermaster), ``start_time`` (a process's identity, so a reused PID is not
    killed), ``kill`` (ends an old master; the default
    :func:`~cluster.master.run.oldmaster.kill_master` sends real
    signals) and ``boot_id`` (None: read it from the kernel; "": unknown, write no stamp).
    ``on_takeover(reason)`` is called before the takeover wait, so the master can write the
    Perl's status line ("Regression terminated due to timeout") while it waits.
    """

    def __init__(self, path: Path, clock: Clock, stale_after: float = DEFAULTS.pid_stale,
                 wait: float = DEFAULTS.pid_wait,
                 is_master: Callable[[int], bool] = is_clustermaster, pid: int | None = None,
                 on_takeover: Callable[[str], None] | None = None,
                 kill: Callable[[int], None] = kill_master,
                 start_time: Callable[[int], float | None] = process_start_time,
                 refresh_every: float = DEFAULTS.pid_check_interval,
                 boot_id: str | None = None) -> None:
        if refresh_every <= 0:
            raise ValueError(f"PidFile refresh_every: got {refresh_every!r}, expected seconds > 0")
        self.path = Path(path)
        self.clock = clock
        self.stale_after = stale_after
        self.wait = wait
        self.is_master = is_master
        self.pid = os.getpid() if pid is None else pid
        self.on_takeover = on_takeover
        self.kill = kill
        self.start_time = start_time
        self.refresh_every = refresh_every
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        # refresh() may run in keep_fresh's thread while the owner calls release(): one at a
        # time, or a refresh could re-create the file release() just removed.
        self._lock = threading.Lock()
        self._write_failing = False

    def __repr__(self) -> str:
        return f"PidFile({str(self.path)!r}, pid={self.pid})"

    # --- the phase 2 dance ---------------------------------------------------------------
    def acquire(self) -> PidDecision:
        """Run the phase 2 dance; may block for ``wait`` seconds (takeover) plus the kill."""
        content = ""
        for _attempt in range(_MAX_ATTEMPTS):
            if self._create():
                logger.debug("%s: no clustermaster running; pid %d takes the run",
                             self.path, self.pid)
                return PidDecision.RUN
            try:
                content, mtime = self._read_with_mtime()
            except FileNotFoundError:
                # Removed between our create attempt and the read: start over.
                continue
            if content == "":
                # Not written by us (ours is linked in complete): a foreign writer may be
                # between create and write.  Give it a moment, then judge it as garbage.
                self.clock.sleep(0.05)
                continue
            return self._judge(content, mtime)
        return self._judge(content, self._mtime_or_now())

    def held_by_live_master(self) -> bool:
        """Whether :meth:`acquire` would now answer ``EXIT_BUSY`` -- the file is fresh and
        names a live clustermaster other than us -- judged by the same rules, without
        writing anything.  For the supervisor, which does not start an invocation that
        could only find this (docs/deviations.md)."""
        try:
            content, mtime = self._read_with_mtime()
        except FileNotFoundError:
            return False
        return self._verdict(content, mtime).decision is PidDecision.EXIT_BUSY

    def _judge(self, content: str, mtime: float) -> PidDecision:
        """Act on the file's :meth:`_verdict`: a takeover is done here."""
        verdict = self._verdict(content, mtime)
        if verdict.decision is PidDecision.TOOK_OVER:
            return self._take_over(verdict.reason, verdict.victim, (content, mtime))
        if verdict.decision is PidDecision.EXIT_BUSY:
            logger.debug("%s: %s; pid %d exits", self.path, verdict.reason, self.pid)
        return verdict.decision

    def _verdict(self, content: str, mtime: float) -> Verdict:
        """What the file's ``content`` (as read, with its ``mtime``) means for us (the table
        in the module docstring); only reads."""
        first, stamp = parse(content)
        if first == STOP_MARKER:
            return Verdict(PidDecision.TOOK_OVER, "pid file holds 0 (stop marker)")
        try:
            owner = int(first)
        except ValueError:
            owner = -1
        if owner <= 0 or str(owner) != first:
            owner = -1
        stale, same_boot = self._staleness(first, stamp, mtime)
        if stale:
            # Kill after the wait only an owner of this boot that is a clustermaster now
            # (after a reboot its PID may belong to anyone, even another clustermaster).
            victim = None
            if same_boot and owner > 0 and owner != self.pid and self.is_master(owner):
                victim = owner
            return Verdict(PidDecision.TOOK_OVER, stale, victim)
        if owner <= 0:
            return Verdict(PidDecision.TOOK_OVER,
                           f"pid file holds garbage {first[:40]!r}; expected a pid")
        if owner == self.pid:
            # Only we could have written our own pid (a second acquire in this process).
            return Verdict(PidDecision.RUN)
        if self.is_master(owner):
            return Verdict(PidDecision.EXIT_BUSY, f"clustermaster {owner} is running")
        return Verdict(PidDecision.TOOK_OVER,
                       f"clustermaster {owner} died without removing its PID file "
                       f"(no such clustermaster process)")

    def _staleness(self, first: str, stamp: Stamp | None, mtime: float) -> tuple[str, bool]:
        """Why the file is stale ("" if it is fresh), and whether its owner may be a process
        of this boot (False only when its stamp names another boot)."""
        limit = self.stale_after
        if stamp is not None and self.boot_id:
            if stamp.boot_id != self.boot_id:
                return (f"pid file {first!r} was written before a reboot (boot id "
                        f"{stamp.boot_id}, now {self.boot_id}): its clustermaster is gone",
                        False)
            age = self.clock.monotonic() - stamp.monotonic
            if age >= 0:
                if age > limit:
                    return (f"terminated due to timeout (pid file {first!r} not refreshed "
                            f"for {age:.0f}s, limit {limit:.0f}s)", True)
                return "", True
            # A stamp from the future cannot come from this clock (another time namespace,
            # or written by hand): judge the file as the Perl did.
            logger.warning("%s: stamp %.3f is ahead of this monotonic clock (%.3f); judging "
                           "the file by its mtime", self.path, stamp.monotonic,
                           self.clock.monotonic())
        age = self.clock.time() - mtime
        if age > limit:
            return (f"terminated due to timeout (pid file {first!r} is {age:.0f}s old by "
                    f"its mtime, limit {limit:.0f}s)", True)
        return "", True

    def _take_over(self, reason: str, victim: int | None = None,
                   found: tuple[str, float] | None = None) -> PidDecision:
        """Write our pid, wait for the old runner to notice and stop (refreshing our stamp),
        kill ``victim`` if it is still the same clustermaster, then free the file.

        ``found``: the file's content and mtime as judged; put back if we are stopped
        (any exception, a :class:`~cluster.runtime.service.Stopped` above all) before the
        takeover is done."""
        logger.warning("%s: %s; pid %d takes over, waits %.0fs and frees the file",
                       self.path, reason, self.pid, self.wait)
        if self.on_takeover is not None:
            self.on_takeover(reason)
        identity = self.start_time(victim) if victim is not None else None
        try:
            self._write_replace(fsync=True)
            self._wait_refreshing()
            if victim is not None:
                self._kill_if_still_there(victim, identity)
        except BaseException:
            if found is not None:
                self._put_back(*found)
            raise
        # Only if still ours: a second taker may have written its pid meanwhile, and it
        # frees the file itself after its own wait.
        self.release()
        return PidDecision.TOOK_OVER

    def _put_back(self, content: str, mtime: float) -> None:
        """Restore the file as a takeover found it (``content``, ``mtime``), if it still
        holds our pid; never raises (it runs while another exception unwinds)."""
        with self._lock:
            if not self.still_mine():
                return
            try:
                fsutil.atomic_write(self.path, content + "\n", fsync=True, mode=FILE_MODE)
                os.utime(self.path, (mtime, mtime))
            except OSError as exc:
                logger.error("%s: cannot put back the file a stopped takeover found (%s); "
                             "removing it", self.path, exc)
                with contextlib.suppress(OSError):
                    self.path.unlink()
                return
        logger.warning("%s: pid %d stopped during its takeover; the file is as it found it",
                       self.path, self.pid)

    def _wait_refreshing(self) -> None:
        """Sleep ``wait`` seconds in steps of ``refresh_every``, refreshing our stamp after
        each, so a wait longer than ``stale_after`` does not make our own file stale."""
        remaining = self.wait
        # Bounded by the number of steps, whatever the clock does.
        for _step in range(math.ceil(max(self.wait, 0) / self.refresh_every)):
            if remaining <= 0:
                break
            step = min(remaining, self.refresh_every)
            self.clock.sleep(step)
            remaining -= step
            if remaining > 0 and not self.refresh():
                logger.warning("%s: no longer holds pid %d during the takeover wait",
                               self.path, self.pid)
                self.clock.sleep(remaining)
                break

    def _kill_if_still_there(self, victim: int, identity: float | None) -> None:
        """Kill ``victim`` (seed 000: "it kills the old version") if, after the wait, it is
        still a clustermaster and the same process as when we judged the file."""
        if not self.is_master(victim):
            logger.info("%s: old clustermaster %d has ended", self.path, victim)
            return
        now = self.start_time(victim)
        if now != identity:
            logger.info("%s: pid %d is another process now (started %s, not %s); not "
                        "killed", self.path, victim, now, identity)
            return
        logger.warning("%s: old clustermaster %d still running %.0fs after the takeover; "
                       "killing it", self.path, victim, self.wait)
        self.kill(victim)

    # --- during and after the run --------------------------------------------------------
    def still_mine(self) -> bool:
        """True iff the file exists and its first line is our pid (the Perl's checkPID)."""
        try:
            return self._first_line() == str(self.pid)
        except FileNotFoundError:
            return False

    def refresh(self) -> bool:
        """Stamp the file anew if it still holds our pid and return True; else return False
        (we were replaced: the caller stops its run).

        Cheap (one read, one small write and a rename): the master calls it every
        ``pid_check_interval``.  A failed write (a full disk) is logged once and returns
        True -- the file is still ours; if the trouble lasts, the file goes stale and a
        successor takes over, which is all a run that cannot write could hope for.

        Between our read and our rename a taker could write its pid, and we would overwrite
        it; a taker does so only after we went unrefreshed for ``stale_after``, so this needs
        a master frozen inside these few system calls.  Even then the taker kills us after its
        wait (we are still a clustermaster) and the file, holding our dead pid, is taken over
        by the next starter: the run is delayed, not doubled.
        """
        with self._lock:
            if not self.still_mine():
                return False
            try:
                # No fsync: the file matters only to processes of this boot, which all read
                # the same page cache.  After a crash every owner is dead, and whatever the
                # disk kept (the previous stamp, another boot id, even an empty file) is
                # judged stale or garbage and taken over -- so syncing every 2 s would buy
                # nothing but disk flushes.
                self._write_replace(fsync=False)
            except OSError as exc:
                if not self._write_failing:
                    logger.error("%s: cannot refresh the pid file: %s; it goes stale if this "
                                 "lasts %.0fs", self.path, exc, self.stale_after)
                self._write_failing = True
                return True
            if self._write_failing:
                logger.warning("%s: refreshing the pid file works again", self.path)
                self._write_failing = False
            return True

    @contextlib.contextmanager
    def keep_fresh(self, interval: float) -> Iterator[None]:
        """While the ``with`` block runs, refresh the file at once and then every ``interval``
        seconds (real time) from a daemon thread.

        For steps that block the master's loop (build.py, the end of a run).  The thread
        stops refreshing when the file is no longer ours (the caller's next
        :meth:`refresh` or :meth:`still_mine` tells it) and is stopped and joined when the
        block ends.  A frozen process runs no thread, so it still goes stale.
        """
        if not interval > 0:
            raise ValueError(f"keep_fresh interval: got {interval!r}, expected seconds > 0")
        stop = threading.Event()

        def loop() -> None:
            while True:  # ends when stop is set (the block ended) or the file is not ours
                try:
                    if not self.refresh():
                        logger.warning("%s: no longer holds pid %d; stopped refreshing it",
                                       self.path, self.pid)
                        return
                except Exception:  # a refresher that dies silently would evict the run
                    logger.exception("%s: refreshing the pid file failed", self.path)
                if stop.wait(interval):
                    return

        thread = threading.Thread(target=loop, name=f"refresh {self.path.name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def release(self) -> None:
        """Remove the file if it still holds our pid; otherwise leave it alone.

        There is a window between the check and the unlink; the Perl has it too, and a
        taker writes its pid only after a file went stale or its owner died.
        """
        with self._lock:
            if self.still_mine():
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                logger.debug("%s: released by pid %d", self.path, self.pid)

    # --- file operations -----------------------------------------------------------------
    def _content(self) -> str:
        """Our pid, and the stamp when this boot has an id."""
        return render(self.pid, self.clock.monotonic(), self.boot_id)

    def _first_line(self) -> str:
        with open(self.path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
        return parse(head)[0]

    def _read_with_mtime(self) -> tuple[str, float]:
        with open(self.path, "rb") as fh:
            mtime = os.fstat(fh.fileno()).st_mtime
            content = fh.read(4096).decode("utf-8", errors="replace").strip()
        return content, mtime

    def _mtime_or_now(self) -> float:
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return self.clock.time()

    def _temp_with_pid(self) -> str:
        """A complete, fsync'ed temporary file holding our pid, beside the PID file.

        Filled here rather than by fsutil's atomic_write because :meth:`_create` links it
        into place (which, unlike a rename, fails if the PID file exists).
        """
        fd, tmp = fsutil.temp_file(self.path)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, self._content().encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _create(self) -> bool:
        """Create the file holding our pid unless it exists; True if we created it.

        link() fails with EEXIST if the name exists and publishes the file complete, so
        exactly one of several simultaneous starters wins.  File systems without hard
        links fall back to O_CREAT|O_EXCL (atomic, but briefly empty).
        """
        tmp = self._temp_with_pid()
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            return False
        try:
            os.write(fd, self._content().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _write_replace(self, fsync: bool) -> None:
        """Overwrite the file with our pid and a fresh stamp atomically (temp + rename)."""
        fsutil.atomic_write(self.path, self._content(), fsync=fsync, mode=FILE_MODE)


def for_priority(cfg: Config, home: Home, priority: int, clock: Clock) -> PidFile:
    """The PID file of ``priority``'s clustermaster in ``home``, with ``cfg``'s timings."""
    return PidFile(home.pid_file(priority), clock, stale_after=cfg.pid_stale,
                   wait=cfg.pid_wait, refresh_every=cfg.pid_check_interval)
