"""The clustermasters a local cluster's supervisor runs, found and waited for.

:func:`supervisor_masters` finds them among the supervisor's children (``/proc``: a few
reads, where psutil would scan every process of the machine), with the priority each
serves (:func:`master_lane`, from its command line); :func:`wait_for_masters` waits,
up to a deadline, until each has exited or serves a run again.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from cluster.home import Home
from cluster.runtime.clock import Clock

log = logging.getLogger("cluster.localcluster")

#: How often :meth:`cluster.localcluster.LocalCluster.wait_for_run` looks for the run's end
#: once it may come (the run's job.start is gone: its master is ending it), and the waits
#: here look [seconds]: localcluster.py's exit waits on the look that sees it.  While the
#: run is served it looks every ``_POLL``: a look costs about 0.15 ms of CPU, taken from
#: the jobs.
END_LOOK = 0.01
_MASTER_SCRIPT = re.compile(r"clustermaster(\d*)\.py")


def master_lane(argv: list[str]) -> int | None:
    """The lane of the clustermaster a command line runs (cluster.lanes: ``clustermaster.py``
    0, ``clustermaster<N>.py`` N, ``--priority N`` wins, ``--lane L`` over both), or None
    when it runs none."""
    priority = None
    for word in argv:
        match = _MASTER_SCRIPT.fullmatch(Path(word).name)
        if match:
            priority = int(match.group(1) or 0)
    for option in ("--priority", "--lane"):
        if priority is not None and option in argv[:-1]:
            try:
                priority = int(argv[argv.index(option) + 1])
            except ValueError:
                pass
    return priority


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie is not): its /proc stat's state."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    # "pid (comm) S ...": the state follows the last ')' (a comm may hold one).
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x", b"")


def _children(pid: int) -> list[int]:
    """The children of process ``pid``, from /proc (every thread's ``children`` file: a
    few reads, where psutil scans every process of the machine); [] when it is gone."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
                found += [int(word) for word in fh.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _cmdline(pid: int) -> list[str]:
    """Process ``pid``'s command line ([] when it is gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]


def supervisor_masters(supervisor: int) -> list[tuple[int, int]]:
    """The clustermasters supervisor ``supervisor`` has running now, as (pid, lane): its
    children, each named for its lane as the supervisor starts them
    (:func:`master_lane`)."""
    found = []
    for child in _children(supervisor):
        lane = master_lane(_cmdline(child))
        if lane is not None:
            found.append((child, lane))
    return found


def wait_for_masters(home: Home, masters: list[tuple[int, int]], end: float,
                     clock: Clock) -> bool:
    """Wait (up to monotonic ``end`` on ``clock``, a look every :data:`END_LOOK` seconds)
    until each clustermaster of ``masters`` ((pid, lane), as
    :func:`supervisor_masters` gives them) has exited -- a zombie its supervisor has not
    reaped yet counts as exited -- or serves a run: its lane's job.start exists (a
    master ending a run removed it first; one that serves is not waited for).  Whether
    none was left; those left are logged."""
    left = masters
    while True:
        left = [(pid, p) for pid, p in left
                if _alive(pid) and not os.path.lexists(home.job_start(p))]
        if not left or clock.monotonic() >= end:
            break
        clock.sleep(END_LOOK)
    if left:
        log.warning("clustermaster(s) %s still running; stopping the cluster anyway (told "
                    "to stop, each leaves its work to the next one)",
                    " ".join(str(pid) for pid, _ in left))
    return not left
