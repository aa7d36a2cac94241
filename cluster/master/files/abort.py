"""``clusterpush abort``: withdraw a user's queued runs and stop the one running.

Queued runs of the user are simply removed from the priority-0 queue.  A run that is already
running (its line is at the queue's front and the ``job.start`` of one of priority 0's lanes
describes it: :mod:`cluster.lanes`) is stopped by its master, not by clusterpush: clusterpush
leaves ``abort.job`` in the master home holding that run's *id* (ARTIFEX §6.4 touches
``abort.job``; one id a line should the user have runs in two lanes), and the master serving
it, which looks for it as often as it checks its PID file, tells its nodes ABORT, reports
the run as aborted and dequeues it.  The id, not the queue line, is what names the run: an
``abort.job`` that arrives just after its run ended can never stop the user's next push of
the same line.

An admin stops a run of any priority the same way, with ``runs/<id>/stop``
(:func:`request_stop`, ``clusteradmin stop``): first line who asks (``alice@host``), an
optional second line why.  The master serving the run looks for it as often as for
``abort.job`` and ends the run as aborted, with the reason :func:`stop_reason` makes of the
file (``stopped by alice@host: disk full``); the file goes with the run's folder.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from cluster import lanes
from cluster.defaults import USER_PRIORITY
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.abort")

ABORT_FILE = "abort.job"
#: The most characters of a stop request's who and reason that are kept.
STOP_WHO_MAX = 100
STOP_REASON_MAX = 300
#: The most bytes of a stop request read (it holds two short lines).
STOP_READ_MAX = 4096
#: Who stopped a run when the stop file does not say (empty or unreadable).
ANONYMOUS = "an admin"
#: How the reason of a run an admin stopped begins (the report and mail rely on it).
STOPPED_BY = "stopped by "


@dataclass(frozen=True)
class AbortOutcome:
    """What ``request_abort`` did: queued runs removed, and the running run asked to stop."""

    removed: int
    running: str | None  # the id of the user's running run, now asked to stop
    #: Every running run of the user asked to stop (``running`` first); more than one only
    #: should the user's runs be running in two lanes at once.
    running_ids: tuple[str, ...] = field(default=(), compare=False)


def _running(home: Home) -> list[JobStart]:
    """The runs running in priority 0's lanes (cluster.lanes), in lane order."""
    found = []
    for lane in lanes.lanes_of(USER_PRIORITY):
        with contextlib.suppress(FileNotFoundError, ValueError):
            found.append(JobStart.parse(home.job_start(lane).read_text(encoding="utf-8")))
    return found


def request_abort(home: Home, user: str) -> AbortOutcome:
    """Remove ``user``'s queued priority-0 runs; ask the masters of the lanes running the
    user's runs to stop them."""
    queue = QueueFile(home.queue(USER_PRIORITY), home.queue_lock(USER_PRIORITY))
    starts = _running(home)
    mine = [s for s in starts if s.kind == "user" and s.ref == user]
    keep = []
    for start in starts:
        with contextlib.suppress(QueueLineError):
            keep.append(RunSpec.parse(start.queue))
    # Each running copy of a line stays (its master dequeues it once its nodes have
    # stopped); a second push of the same line queued behind it goes.
    removed = len(queue.withdraw(lambda s: s.kind == "user" and s.ref == user, running=keep))
    ids = tuple(s.id for s in mine)
    if ids:
        # Whole or absent, never torn: each master compares the lines with its run id.
        # No fsync (as before): lost in a crash, the user asks again.
        fsutil.atomic_write(home.root / ABORT_FILE, "".join(f"{i}\n" for i in ids),
                            fsync=False)
        log.info("asked the master to abort run(s) %s of %s", " ".join(ids), user)
    return AbortOutcome(removed, ids[0] if ids else None, ids)


def _named(home: Home) -> list[str] | None:
    """The run ids ``abort.job`` names, one a line (None: no file)."""
    try:
        text = (home.root / ABORT_FILE).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]


def requested(home: Home, run_id: str) -> bool:
    """Whether ``abort.job`` asks to stop run ``run_id``."""
    return run_id in (_named(home) or [])


def clear(home: Home, run_id: str) -> None:
    """Take ``run_id`` out of ``abort.job``: the file goes once it names no other run (one
    naming only other runs is left alone)."""
    named = _named(home)
    if named is None or run_id not in named:
        return
    rest = [i for i in named if i != run_id]
    if rest:
        fsutil.atomic_write(home.root / ABORT_FILE, "".join(f"{i}\n" for i in rest),
                            fsync=False)
        return
    with contextlib.suppress(FileNotFoundError):
        (home.root / ABORT_FILE).unlink()


def request_stop(home: Home, run_id: str, who: str, reason: str = "") -> None:
    """Ask the master serving run ``run_id`` to stop it: write ``runs/<id>/stop`` (whole or
    absent, never torn).  ``who`` and ``reason`` are kept to one line each."""
    text = _clean(who, STOP_WHO_MAX) + "\n"
    if reason.strip():
        text += _clean(reason, STOP_REASON_MAX) + "\n"
    path = home.stop_request(run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(path, text, fsync=False)


def stop_reason(home: Home, run_id: str) -> str | None:
    """The reason to end run ``run_id`` if an admin asked to stop it, else None.

    ``stopped by <who>`` or ``stopped by <who>: <reason>`` from ``runs/<id>/stop``'s first
    two lines, each on one line and cut to a sane length; a stop file that is empty or
    cannot be read still stops the run, ``stopped by an admin``."""
    path = home.stop_request(run_id)
    try:
        with open(path, "rb") as fh:
            data = fh.read(STOP_READ_MAX)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, no permission: the request is still there
        log.warning("%s: unreadable (%s); stopping the run anyway", path, exc)
        data = b""
    lines = [line for line in data.decode("utf-8", errors="replace").splitlines()
             if line.strip()]
    who = _clean(lines[0], STOP_WHO_MAX) if lines else ""
    why = _clean(lines[1], STOP_REASON_MAX) if len(lines) > 1 else ""
    return f"{STOPPED_BY}{who or ANONYMOUS}" + (f": {why}" if why else "")


def _clean(text: str, limit: int) -> str:
    """``text`` on one line of printable characters, at most ``limit`` of them."""
    words = "".join(c if c.isprintable() else " " for c in text).split()
    out = " ".join(words)
    return out if len(out) <= limit else out[:limit - 3].rstrip() + "..."
