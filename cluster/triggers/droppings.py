"""Priority 0's requests: the droppings clusterpush leaves beside the trees it pushes.

A dropping is ``users/<user>/<tree>/cluster_command.run`` in the master home, holding one
queue line ``user <user> <products> [options]`` (written atomically, after the tree, under
the tree's lock: see :mod:`cluster.triggers.push`).  The legacy names of seed 000,
``gs.run`` and ``ghostscript.run``, are droppings too, beside ``cluster_command.run`` or, as
ARTIFEX §2.7 places them, in ``users/<user>/`` itself.  A legacy dropping's content is read
like ``cluster_command.run``'s; an empty one means "all products" (ARTIFEX §2.7), that is
``gs,pdfwrite,ps2write`` of the ghostpdl tree.

:func:`scan_user_droppings` (priority 0's discoverer, see :mod:`cluster.triggers.discovery`)
turns each into a queued run and removes it, or sets a bad one aside.  No push is lost:
a push of the same user, products and tree as a run that *waits* replaces that
run in place (same position, the new line if its options differ); one that matches the run
*running* (the queue line of a lane's ``job.start``, or of a run whose end steps are not
done yet: see :func:`running`) is queued after it.  Priority 0 may have several runs
running at once, one per busy lane (cluster.lanes); a push replaces none of them.

Only real directories are looked into: a symlink at ``users/<user>`` or
``users/<user>/<tree>`` is never followed (what it points to is outside the home's control).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster import lanes
from cluster.config import Config
from cluster.defaults import USER_PRIORITY
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QUEUED, REPLACED, QueueFile, Submitted
from cluster.runspec import RunSpec
from cluster.runtime import pathlock
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.discovery")

DROPPING = "cluster_command.run"
#: Seed 000: "droppings that clusterpush.sh leaves in the users source directories.  These
#: include gs.run, ghostscript.run, cluster_command.run."
LEGACY_DROPPINGS = ("gs.run", "ghostscript.run")
DROPPINGS = (DROPPING, *LEGACY_DROPPINGS)
#: A bad dropping is renamed ``<name>.rejected`` (nothing is lost).
REJECTED_SUFFIX = ".rejected"
#: What an empty legacy dropping asks for: "all products" (ARTIFEX §2.7) of the gs tree.
LEGACY_PRODUCTS = ("gs", "pdfwrite", "ps2write")
MAX_DROPPING_BYTES = 4096


@dataclass(frozen=True)
class Dropping:
    """One dropping found in the home: ``tree`` is None for one in ``users/<user>/``."""

    path: Path
    user: str
    tree: str | None


def _is_dir(path: str) -> bool:
    """Whether ``path`` is a directory itself (a symlink to one is not)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_request(path: str) -> bool:
    """Whether something that is not a directory is at ``path`` (a dropping's name)."""
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _subdirs(path: str) -> list[str]:
    """The names of the real directories in ``path``, sorted (symlinks left out)."""
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _scan(home: Home) -> Iterator[tuple[str, str, str | None]]:
    """(path, user, tree or None) of every dropping waiting in ``home``, in :func:`found`'s
    order; plain strings (the watcher calls it 20 times a second)."""
    users = str(home.users)
    if not _is_dir(users):
        return
    for user in _subdirs(users):
        user_dir = os.path.join(users, user)
        for name in LEGACY_DROPPINGS:
            path = os.path.join(user_dir, name)
            # A tree may be called gs.run: a directory of that name is a tree, not a request.
            if _is_request(path):
                yield path, user, None
        for tree in _subdirs(user_dir):
            for name in DROPPINGS:
                path = os.path.join(user_dir, tree, name)
                # A directory of that name is part of the pushed source, not a request.
                if _is_request(path):
                    yield path, user, tree


def found(home: Home) -> list[Dropping]:
    """Every dropping waiting in ``home``, users and trees in name order.

    One lstat per possible dropping and a directory listing per user (the supervisor's
    watcher looks every poll, through :func:`waiting_paths`).  Only real directories are
    descended; a dropping may be any kind of file here (the scan refuses what is not a
    regular file).
    """
    return [Dropping(Path(path), user, tree) for path, user, tree in _scan(home)]


def waiting(home: Home) -> list[Path]:
    """The paths of the droppings waiting in ``home`` (see :func:`found`)."""
    return [Path(path) for path, _, _ in _scan(home)]


def waiting_paths(home: Home) -> list[str]:
    """:func:`waiting` as strings, made without a Path (the watcher's poll)."""
    return [path for path, _, _ in _scan(home)]


def same_push(spec: RunSpec) -> Callable[[RunSpec], bool]:
    """A predicate: is a queued run the same push as ``spec`` (a user run of the same user,
    products and tree; the options may differ; never a repro run, which builds an archived
    snapshot, not the pushed tree)?"""
    def same(other: RunSpec) -> bool:
        return (other.kind == "user" and other.ref == spec.ref and other.repro is None
                and other.products == spec.products and other.tree == spec.tree)
    return same


@dataclass(frozen=True)
class Running:
    """The runs that hold their queue lines at a priority (:func:`running`): ``specs``, one
    per busy lane (cluster.lanes: priority 0 may run several at once), in lane order; and
    ``unknown`` when a job.start or end record exists but cannot be read (then the first
    queued run none of ``specs`` holds is taken to be running too: a push is never merged
    into a run that may have started)."""

    specs: tuple[RunSpec, ...] = ()
    unknown: bool = False

    @property
    def spec(self) -> RunSpec | None:
        """The first running run, or None (one priority served by one lane)."""
        return self.specs[0] if self.specs else None


#: The end record of a run (cluster.master.files.ending: ``runs/<id>/end``), read here by its
#: documented format: ``start <job.start line>`` lines, and ``done dequeue`` once the run's
#: line has left the queue.
END_RECORD = "end"


def running(home: Home, priority: int = USER_PRIORITY) -> Running:
    """Every run of ``priority`` that holds its queue line (see :class:`Running`).

    Those are the runs the job.start of each of the priority's lanes describes
    (:func:`cluster.lanes.lanes_of`); and the runs whose job.start is gone but whose end
    steps are not over: the master removes job.start as soon as the serving ends (so nodes
    leave) but dequeues the line only after the report, the tables and the mail, and a
    push of the same line meanwhile must not be merged into a run that has ended.
    """
    specs: list[RunSpec] = []
    ids: set[str] = set()
    unknown = False
    for lane in lanes.lanes_of(priority):
        path = home.job_start(lane)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot read %s (%s); taking a queued run to be running", path, exc)
            unknown = True
            continue
        try:
            start = JobStart.parse(text)
            specs.append(RunSpec.parse(start.queue, source=str(path)))
        except (ValueError, QueueLineError) as exc:
            log.warning("%s is unreadable (%s); taking a queued run to be running", path, exc)
            unknown = True
            continue
        ids.add(start.id)
    ending, ending_unknown = _ending(home, priority, ids)
    return Running((*specs, *ending), unknown or ending_unknown)


def _ending(home: Home, priority: int, serving: set[str]) -> tuple[list[RunSpec], bool]:
    """The runs of ``priority`` whose end record says their line is not dequeued yet (but
    those in ``serving``, the ids a job.start names: counted once), and whether a record
    of one could not be read."""
    found: list[RunSpec] = []
    unknown = False
    for record in sorted(home.runs.glob(f"*/{END_RECORD}")):
        try:
            with open(record, "rb") as fh:
                text = fh.read(1 << 20).decode("utf-8", errors="replace")
        except OSError:
            continue  # removed meanwhile: that run is over
        if not text.endswith("\n"):
            text = text.rpartition("\n")[0]  # a torn last line is not yet written
        start: dict[str, str] = {}
        dequeued = False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "start":
                name, _, field = value.partition(" ")
                start[name] = field
            elif line == "done dequeue":
                dequeued = True
        if dequeued or start.get("priority") != str(priority) or "queue" not in start \
                or start.get("id") in serving:
            continue
        try:
            found.append(RunSpec.parse(start["queue"], source=str(record)))
        except QueueLineError as exc:
            log.warning("%s: %s; taking a queued run to be ending", record, exc)
            unknown = True
    return found, unknown


def submit(queue: QueueFile, spec: RunSpec, now: Running) -> Submitted:
    """Queue a push: replace a waiting run of the same push, else append (see the module).
    A line running in any lane is never replaced."""
    return queue.submit(spec, same=same_push(spec), running=now.specs,
                        head_running=now.unknown)


def read_dropping(drop: Dropping) -> RunSpec:
    """The run a dropping asks for; QueueLineError (or OSError) saying why it is refused."""
    path, user = drop.path, drop.user
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise QueueLineError("", "not a regular file", str(path))
    if st.st_size > MAX_DROPPING_BYTES:
        raise QueueLineError("", f"larger than {MAX_DROPPING_BYTES} bytes", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(MAX_DROPPING_BYTES + 1).decode("utf-8", errors="replace").strip()
    if not text and path.name in LEGACY_DROPPINGS:
        spec = RunSpec("user", user, LEGACY_PRODUCTS)
    else:
        spec = RunSpec.parse(text.splitlines()[0] if text else "", source=str(path), lineno=1)
    if spec.kind != "user" or spec.ref != user:
        raise QueueLineError(text, f"must be a 'user {user} ...' line", str(path), 1)
    if drop.tree is not None and spec.tree != drop.tree:
        raise QueueLineError(text, f"products {','.join(spec.products)} belong in "
                             f"tree {spec.tree!r}, not {drop.tree!r}", str(path), 1)
    return spec


def scan_user_droppings(home: Home, cfg: Config, queue: QueueFile) -> list[RunSpec]:
    """Runs requested by clusterpush: the droppings of :func:`found`.

    Each dropping is read under its tree's lock (users/<user>/.<tree>.lock, the lock
    push_tree holds while it syncs and writes the dropping), taken without waiting: a
    dropping whose tree is being pushed or copied is left for the next scan.  A good one is
    queued with :func:`submit` (the master's log says whether it was queued, replaced a
    waiting run, or was that waiting run already), then removed.  One that is malformed,
    too big, not a regular file, or claims another user or tree is renamed
    ``<name>.rejected`` (nothing is lost) and logged with the reason.

    Returns the runs queued or whose waiting line was replaced.
    """
    out: list[RunSpec] = []
    for drop in found(home):
        try:
            lock_tree = drop.tree
            if lock_tree is None:  # a legacy dropping of users/<user>/: its run's tree
                lock_tree = _peek_tree(drop)
            with pathlock.locked(home.user_tree_lock(drop.user, lock_tree), timeout=0):
                spec = _take(home, drop, queue)
        except pathlock.LockTimeout:
            log.debug("%s: its tree is being pushed or copied; next scan", drop.path)
            continue
        except OSError as exc:
            log.error("dropping %s: %s; left for the next scan", drop.path, exc)
            continue
        if spec is not None:
            out.append(spec)
    return out


def _peek_tree(drop: Dropping) -> str:
    """The tree a legacy dropping of ``users/<user>/`` asks for (ghostpdl if unreadable:
    the lock is then only taken to set it aside)."""
    try:
        return read_dropping(drop).tree
    except (QueueLineError, OSError):
        return "ghostpdl"


def _take(home: Home, drop: Dropping, queue: QueueFile) -> RunSpec | None:
    """Queue one dropping and remove it, or set it aside.  Caller holds its tree's lock."""
    try:
        spec = read_dropping(drop)
    except FileNotFoundError:
        return None  # taken by another scan meanwhile
    except (QueueLineError, OSError) as exc:
        log.error("rejected dropping %s: %s", drop.path, exc)
        _set_aside(drop.path)
        return None
    done = submit(queue, spec, running(home))
    if done.outcome == REPLACED:
        log.warning("push %s from %s replaces the waiting run %s (position %d in the queue)",
                    spec, drop.path, done.previous, done.position)
    elif done.outcome == QUEUED:
        log.info("push %s from %s queued at position %d", spec, drop.path, done.position)
    else:
        log.info("push %s from %s: that very run already waits at position %d; it will "
                 "build the tree as pushed now", spec, drop.path, done.position)
    with contextlib.suppress(FileNotFoundError):
        drop.path.unlink()
    return spec if done.outcome in (QUEUED, REPLACED) else None


def _set_aside(path: Path) -> None:
    try:
        os.replace(path, path.with_name(path.name + REJECTED_SUFFIX))
    except OSError as exc:
        log.error("could not set %s aside: %s", path, exc)
