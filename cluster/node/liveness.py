"""Whether the clusterpull that holds a node's work_dir is alive, not merely present.

clusterpull.sh, started by cron every ten minutes, "checks to see if there are existing
clusterpull processes running, checking for timeouts" (seed 000).  Here the single-instance
lock (a kernel ``flock``) says that a clusterpull exists; a process that hangs (stopped with
SIGSTOP, stuck in a call without a timeout) keeps its lock and would keep the node out of
every run.  So the loop touches ``work_dir/clusterpull.alive`` at every pass
(:meth:`Liveness.beat`, at most every :data:`BEAT_EVERY` seconds), and a second clusterpull
that finds the lock held looks at that file's age: older than :func:`hung_after`, the
holder is hung, and :func:`stop_hung` kills it with everything it started (its run.py, the
jobs) so that the newcomer takes the node over.

Every call the loop makes is bounded (a held heartbeat by its wait and ``io_timeout``, a
run.py start by the process runner), so a healthy loop never goes that long without a pass.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import psutil

from cluster.runtime import singleton
from cluster.wire.heartbeat import MAX_WAIT

log = logging.getLogger("cluster.pull")

#: The file the loop touches, in work_dir.
ALIVE_FILE = "clusterpull.alive"
#: The loop touches it at most this often [seconds].
BEAT_EVERY = 5.0
#: However short the loop's timeouts, a holder is hung only after this long [seconds].
MIN_HUNG_AFTER = 300.0
#: How long the newcomer waits for a killed holder's lock to be released [seconds].
RELEASE_WAIT = 10.0


def hung_after(heartbeat_interval: float, io_timeout: float) -> float:
    """Seconds without a pass of the loop after which its clusterpull counts as hung: three
    of its longest passes (a held heartbeat: its wait, at most MAX_WAIT, plus ``io_timeout``,
    plus the interval), and never less than :data:`MIN_HUNG_AFTER`."""
    return max(MIN_HUNG_AFTER, 3 * (heartbeat_interval + io_timeout + MAX_WAIT))


class Liveness:
    """The loop's side: :meth:`beat` at every pass."""

    def __init__(self, work_dir: Path) -> None:
        self.path = Path(work_dir) / ALIVE_FILE
        self._last = float("-inf")

    def beat(self, now: float) -> None:
        """Touch the file if :data:`BEAT_EVERY` passed since the last touch (``now`` on the
        loop's monotonic clock).  A failure (a full disk) is logged, not raised: it must
        not stop the node."""
        if now - self._last < BEAT_EVERY:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:
            log.warning("cannot touch %s: %s", self.path, exc)


def silent_for(work_dir: Path, now: float | None = None) -> float | None:
    """Seconds since the loop of ``work_dir``'s clusterpull last touched its file (wall
    clock), or None if there is no file (a clusterpull that predates it, or none yet)."""
    try:
        mtime = (Path(work_dir) / ALIVE_FILE).stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def _is_clusterpull(proc: psutil.Process) -> bool:
    try:
        return any(part.endswith("clusterpull.py") or part == "clusterpull"
                   for part in proc.cmdline())
    except psutil.Error:
        return False


def stop_hung(lock: Path, work_dir: Path, limit: float) -> str | None:
    """If the clusterpull holding ``lock`` has been silent longer than ``limit`` seconds,
    kill it and every process it started, and wait (at most :data:`RELEASE_WAIT` s) for
    its lock to be free; return a line saying what was done, or None when it is not hung
    (or not a clusterpull: a pid the system reused is never killed)."""
    silent = silent_for(work_dir)
    if silent is None or silent <= limit:
        return None
    pid = singleton.read_holder(lock)
    if pid is None or pid == os.getpid():
        return None
    try:
        holder = psutil.Process(pid)
    except psutil.Error:
        return None
    if not _is_clusterpull(holder):
        return None
    try:
        family = [holder, *holder.children(recursive=True)]
    except psutil.Error:
        family = [holder]
    for proc in family:
        try:
            proc.send_signal(signal.SIGKILL)  # a hung process ignores, or never sees, TERM
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=RELEASE_WAIT)
    return (f"clusterpull pid {pid} holds {lock} but its loop has not run for {silent:.0f} s "
            f"(more than {limit:.0f} s): hung; killed it and {len(family) - 1} process(es) it "
            "started, taking the node over")
