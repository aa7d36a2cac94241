"""The PID-file semaphore of the clustermaster (seed 000 phase 2, ARTIFEX.md §2.6).

``clustermaster[.p].pid`` holds the PID of the clustermaster doing a run.  Other processes
depend on its *content* and *mtime*, so this is ported as written, not replaced by flock
(STYLE guideline 12).  :meth:`PidFile.acquire` decides what a freshly started clustermaster
does:

==========================================  =====================================================
file state                                  action, result
==========================================  =====================================================
missing                                     write our PID -> ``RUN`` (we do the run)
holds ``0`` (the stop marker)               write our PID, sleep ``wait``, remove -> ``TOOK_OVER``
mtime older than ``stale_after`` (2 h)      log "terminated due to timeout", same -> ``TOOK_OVER``
fresh, PID is a live clustermaster          nothing -> ``EXIT_BUSY``
fresh, PID dead / not a clustermaster /     log it, same takeover -> ``TOOK_OVER``
garbage content
==========================================  =====================================================

After ``TOOK_OVER`` or ``EXIT_BUSY`` the caller exits.  A takeover keeps our PID in the file
while it sleeps: new starters see a fresh file owned by a live clustermaster and exit, and
the old runner sees at its next :meth:`still_mine` check that the file is no longer its own,
and stops.  During a run the owner calls :meth:`still_mine` often and :meth:`release` at the
end.

Creating the file is atomic *with its content* (a temporary file hard-linked into place), so
of two masters starting at once exactly one wins, and the loser never reads a half-written
file: it re-evaluates and sees a fresh file owned by the winner.  Overwriting it (a takeover)
is :func:`cluster.runtime.fsutil.atomic_write`.  Both are fsync'ed.

The defaults of ``stale_after`` and ``wait`` are the configuration's ``pid_stale`` (seed 000:
"No run should take more than 2 hours") and ``pid_wait`` (seed 000: "wait for 5 minutes ...
gives any old clustermaster time to shut down neatly").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import tempfile
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from cluster.config import DEFAULTS
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock

logger = logging.getLogger("cluster.pidfile")

#: Where the defaults of stale_after and wait come from: the configuration table.
#: Permission bits of the PID file: other users' tools read it.
_FILE_MODE = 0o644
#: The content that tells the running master to stop (ARTIFEX.md §2.6).
STOP_MARKER = "0"
#: How often acquire() re-evaluates when the file vanishes or changes under it.
_MAX_ATTEMPTS = 5

# An argv word naming a clustermaster: clustermaster.py, /x/clustermaster2.pl,
# cluster.cli.clustermaster (python -m) -- but not run_clustermaster.py, the supervisor, whose
# command line also "mentions" clustermaster.
_MASTER_WORD = re.compile(r"(?:.*\.)?clustermaster\d*(?:\.py|\.pl)?")


class PidDecision(StrEnum):
    """What a starting clustermaster does after :meth:`PidFile.acquire`."""

    RUN = "run"  # we own the file: do the run
    EXIT_BUSY = "busy"  # a live clustermaster owns it: exit quietly
    TOOK_OVER = "took-over"  # we evicted a dead or stale owner and waited: exit


def is_clustermaster(pid: int) -> bool:
    """Whether ``pid`` is a live process whose command line runs a clustermaster.

    The port of the Perl's ``ps -p <pid>`` check.  A zombie counts as dead.  When the command
    line cannot be read (another user's process), we assume it *is* a clustermaster: wrongly
    evicting a live run is worse than waiting for the file to go stale.
    """
    import psutil  # imported here: only the default check needs it

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
    return any(_MASTER_WORD.fullmatch(word.rsplit("/", 1)[-1]) for word in argv)


class PidFile:
    """The clustermaster PID file.

    Callers use :meth:`acquire` once at start, :meth:`still_mine` during the run and
    :meth:`release` at its end.  ``is_master`` and ``clock`` are the seams for tests;
    ``on_takeover(reason)`` is called before the takeover wait, so the master can write the
    Perl's status line ("Regression terminated due to timeout") while it waits.
    """

    def __init__(self, path: Path, clock: Clock, stale_after: float = DEFAULTS.pid_stale,
                 wait: float = DEFAULTS.pid_wait,
                 is_master: Callable[[int], bool] = is_clustermaster, pid: int | None = None,
                 on_takeover: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.clock = clock
        self.stale_after = stale_after
        self.wait = wait
        self.is_master = is_master
        self.pid = os.getpid() if pid is None else pid
        self.on_takeover = on_takeover

    def __repr__(self) -> str:
        return f"PidFile({str(self.path)!r}, pid={self.pid})"

    # --- the phase 2 dance ---------------------------------------------------------------
    def acquire(self) -> PidDecision:
        """Run the phase 2 dance; may block for ``wait`` seconds (takeover)."""
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

    def _judge(self, content: str, mtime: float) -> PidDecision:
        if content == STOP_MARKER:
            return self._take_over("pid file holds 0 (stop marker)")
        age = self.clock.time() - mtime
        if age > self.stale_after:
            return self._take_over(f"terminated due to timeout (pid file {content!r} is "
                                   f"{age:.0f}s old, limit {self.stale_after:.0f}s)")
        try:
            owner = int(content)
        except ValueError:
            owner = -1
        if owner <= 0 or str(owner) != content:
            return self._take_over(f"pid file holds garbage {content[:40]!r}; expected a pid")
        if owner == self.pid:
            # Only we could have written our own pid (a second acquire in this process).
            return PidDecision.RUN
        if self.is_master(owner):
            logger.debug("%s: clustermaster %d is running (%.0fs); pid %d exits",
                         self.path, owner, age, self.pid)
            return PidDecision.EXIT_BUSY
        return self._take_over(f"missing clustermaster process {owner}")

    def _take_over(self, reason: str) -> PidDecision:
        """Write our pid, wait for the old runner to notice and stop, then free the file."""
        logger.warning("%s: %s; pid %d takes over, waits %.0fs and frees the file",
                       self.path, reason, self.pid, self.wait)
        if self.on_takeover is not None:
            self.on_takeover(reason)
        self._write_replace()
        self.clock.sleep(self.wait)
        # Only if still ours: a second taker may have written its pid meanwhile, and it
        # frees the file itself after its own wait.
        self.release()
        return PidDecision.TOOK_OVER

    # --- during and after the run --------------------------------------------------------
    def still_mine(self) -> bool:
        """True iff the file exists and holds our pid (the Perl's checkPID)."""
        try:
            return self._read() == str(self.pid)
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the file if it still holds our pid; otherwise leave it alone.

        There is a window between the check and the unlink; the Perl has it too, and a
        taker writes its pid only after a file went stale or its owner died.
        """
        if self.still_mine():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            logger.debug("%s: released by pid %d", self.path, self.pid)

    # --- file operations -----------------------------------------------------------------
    def _read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace").strip()

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

        Made here rather than by fsutil because :meth:`_create` links it into place (which,
        unlike fsutil's rename, fails if the PID file exists); named as fsutil names its
        temporary files.
        """
        fd, tmp = tempfile.mkstemp(dir=self.path.parent,
                                   prefix=f".{self.path.name}.{os.getpid()}.",
                                   suffix=fsutil.TEMP_SUFFIX)
        try:
            os.fchmod(fd, _FILE_MODE)
            os.write(fd, f"{self.pid}\n".encode())
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
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{self.pid}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _write_replace(self) -> None:
        """Overwrite the file with our pid atomically (temp + rename), fsync'ed."""
        fsutil.atomic_write(self.path, f"{self.pid}\n", fsync=True, mode=_FILE_MODE)
