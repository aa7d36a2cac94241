"""Phase 1 of clustermaster: finding new runs and putting them in the queue.

A discoverer is ``f(home, cfg, queue) -> list[RunSpec]``: it appends what it finds to the
queue itself (so a request is consumed only once it is safely queued) and returns what it
added.  :data:`DISCOVERERS` lists them per priority:

* priority 0: :func:`scan_user_droppings`, the droppings clusterpush leaves in user trees;
* priority 1: :func:`cluster.commits.poll`, new commits of the configured git repositories
  (the post-receive/post-commit hook queues them too, at once; a commit is queued once);
* priority 2: nothing here, cron's enqueue_auto.py appends to the queue itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from cluster.config import Config
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile, RunSpec
from cluster.triggers.git import commits

log = logging.getLogger("cluster.discovery")

DROPPING = "cluster_command.run"
MAX_DROPPING_BYTES = 4096

Discoverer = Callable[[Home, Config, QueueFile], list[RunSpec]]


def scan_user_droppings(home: Home, cfg: Config, queue: QueueFile) -> list[RunSpec]:
    """Runs requested by clusterpush: ``users/<user>/<tree>/cluster_command.run``.

    The dropping holds one queue line, ``user <user> <products> [options]``.  It is
    removed once its run is in the queue (a duplicate of a queued run is not queued twice);
    one that is malformed, too big, or claims another user or tree is
    renamed to ``cluster_command.run.rejected`` (nothing is lost) and logged with the reason.
    """
    found: list[RunSpec] = []
    if not home.users.is_dir():
        return found
    for path in sorted(home.users.glob(f"*/*/{DROPPING}")):
        user, tree = path.parent.parent.name, path.parent.name
        try:
            if path.is_symlink() or not path.is_file():
                raise QueueLineError(str(path), "not a regular file", str(path))
            if path.stat().st_size > MAX_DROPPING_BYTES:
                raise QueueLineError("", f"larger than {MAX_DROPPING_BYTES} bytes", str(path))
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            spec = RunSpec.parse(text.splitlines()[0] if text else "", source=str(path),
                                 lineno=1)
            if spec.kind != "user" or spec.ref != user:
                raise QueueLineError(text, f"must be a 'user {user} ...' line", str(path), 1)
            if spec.tree != tree:
                raise QueueLineError(text, f"products {','.join(spec.products)} belong in "
                                     f"tree {spec.tree!r}, not {tree!r}", str(path), 1)
        except (QueueLineError, OSError) as exc:
            log.error("rejected dropping %s: %s", path, exc)
            _set_aside(path)
            continue
        if queue.append(spec):
            found.append(spec)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    return found


def _set_aside(path: Path) -> None:
    try:
        os.replace(path, path.with_name(DROPPING + ".rejected"))
    except OSError as exc:
        log.error("could not set %s aside: %s", path, exc)


DISCOVERERS: dict[int, list[Discoverer]] = {0: [scan_user_droppings], 1: [commits.poll],
                                             2: []}


class WorkWatcher:
    """Tells the supervisor which priorities have new work, from a few stat calls.

    A priority has new work when its queue file changed (a run was queued, or the running
    one finished and was dequeued) and is not empty, or, for priority 0, when a clusterpush
    dropping is waiting.  Call it as ``wakeup()`` -> priorities to start now.
    """

    def __init__(self, home: Home, priorities: tuple[int, ...] = (0, 1, 2)) -> None:
        self.home = home
        self.priorities = priorities
        self.seen: dict[int, tuple[int, int]] = {p: self._signature(p) for p in priorities}
        self.droppings: set[str] = set()

    def _signature(self, priority: int) -> tuple[int, int]:
        try:
            st = os.stat(self.home.queue(priority))
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

    def __call__(self) -> list[int]:
        woken: list[int] = []
        for p in self.priorities:
            sig = self._signature(p)
            if sig != self.seen[p]:
                self.seen[p] = sig
                if sig[1] > 0:
                    woken.append(p)
        if 0 in self.priorities:
            # Only droppings not seen before: one that waits for phase 1 must not start a
            # clustermaster at every poll.
            now = {str(p) for p in self.home.users.glob(f"*/*/{DROPPING}")}
            if now - self.droppings and 0 not in woken:
                woken.append(0)
            self.droppings = now
        return woken
