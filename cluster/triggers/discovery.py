"""Phase 1 of clustermaster: finding new runs and putting them in the queue.

A discoverer is ``f(home, cfg, queue) -> list[RunSpec]``: it appends what it finds to the
queue itself (so a request is consumed only once it is safely queued) and returns what it
added.  :data:`DISCOVERERS` lists them per priority:

* priority 0: :func:`cluster.triggers.droppings.scan_user_droppings`, the droppings
  clusterpush leaves in user trees (``cluster_command.run``, and the legacy ``gs.run`` and
  ``ghostscript.run``);
* priority 1: :func:`cluster.triggers.git.poll.poll`, new commits of the configured git
  repositories (the post-receive/post-commit hook queues them too, at once; a commit is
  queued once);
* priority 2: nothing here, cron's enqueue_auto.py appends to the queue itself.

:class:`WorkWatcher` tells the supervisor, between runs, which priorities have work.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cluster.config import Config
from cluster.defaults import AUTO_PRIORITY, COMMIT_PRIORITY, PRIORITIES, USER_PRIORITY
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.triggers import droppings
from cluster.triggers.git import poll

Discoverer = Callable[[Home, Config, QueueFile], list[RunSpec]]
#: What WorkWatcher compares per priority: the (mtime, size) of the queue file and of its
#: earlier release's name, and whether the PID file exists.
Signature = tuple[tuple[int, int], tuple[int, int], bool]

DISCOVERERS: dict[int, list[Discoverer]] = {USER_PRIORITY: [droppings.scan_user_droppings],
                                             COMMIT_PRIORITY: [poll.poll],
                                             AUTO_PRIORITY: []}


def may_find(home: Home, cfg: Config, priority: int) -> bool:
    """Whether phase 1 at ``priority`` could queue anything now, from a few stat calls:
    False only when its discoverers (:data:`DISCOVERERS`) surely find nothing.

    Priority 0: a clusterpush dropping waits.  Priority 1: a git repository is configured
    (only a fetch can tell whether it has new commits, so a configured one always may).
    Priority 2: never (it has no discoverer: cron's enqueue_auto.py writes the queue
    itself).  Whoever gives a priority a new discoverer says here what it looks at.
    """
    if priority == USER_PRIORITY:
        return bool(droppings.waiting(home))
    if priority == COMMIT_PRIORITY:
        return bool(cfg.repositories)
    return priority not in DISCOVERERS or bool(DISCOVERERS[priority])


class WorkWatcher:
    """Tells the supervisor which priorities have new work, from a few stat calls.

    A priority has new work when its queue file changed (a run was queued, or the running
    one finished and was dequeued) and is not empty, or when another priority's queue
    changed and its own is not empty (its runs may wait for that one's), or a queue file
    of an earlier release's name (``queue``, ``queue.1``, ``queue.2``) appeared or changed
    (the master moves it to the new name), or its PID file appeared or went away (a master
    released it: the next queued run can start) while its queue is not empty, or, for
    priority 0, when a clusterpush dropping (``cluster_command.run``, or the legacy
    ``gs.run`` and ``ghostscript.run``) is new or was written again.  The droppings waiting
    when the watcher is made are not new: the supervisor's first tick starts priority 0
    for them.  Call it as ``wakeup()`` -> priorities to start now (the supervisor still
    leaves out one whose master is busy and that phase 1 can give nothing).
    """

    def __init__(self, home: Home, priorities: tuple[int, ...] = PRIORITIES) -> None:
        self.home = home
        self.priorities = priorities
        # The paths each poll looks at, as strings made once: the watcher polls 20 times a
        # second for the life of the cluster, and building Paths was most of its cost.
        self._paths = {p: (str(home.queue(p)), str(home.legacy_queue(p)), str(home.pid_file(p)))
                       for p in priorities}
        self.seen: dict[int, Signature] = {p: self._signature(p) for p in priorities}
        self.droppings = self._droppings() if USER_PRIORITY in priorities else set()

    @staticmethod
    def _stat(path: str) -> tuple[int, int]:
        try:
            st = os.stat(path)
        except OSError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_size)

    def _signature(self, priority: int) -> Signature:
        """(the queue's (mtime, size), the old-name queue's, whether a PID file exists)."""
        queue, legacy, pid_file = self._paths[priority]
        return (self._stat(queue), self._stat(legacy), os.path.lexists(pid_file))

    def _droppings(self) -> set[tuple[str, int]]:
        return {(path, self._stat(path)[0]) for path in droppings.waiting_paths(self.home)}

    def __call__(self) -> list[int]:
        woken: list[int] = []
        changed = False
        for p in self.priorities:
            sig = self._signature(p)
            if sig != self.seen[p]:
                self.seen[p] = sig
                changed = True
                if sig[0][1] > 0 or sig[1][1] > 0:
                    woken.append(p)
        if changed:
            # A run left one queue: a run of another may have waited for it (after=,
            # cluster.deps), so every priority with queued runs looks again.
            woken += [p for p in self.priorities if p not in woken
                      and (self.seen[p][0][1] > 0 or self.seen[p][1][1] > 0)]
        if USER_PRIORITY in self.priorities:
            # Only droppings not seen before (or written again since): one that waits for
            # phase 1 must not start a clustermaster at every poll.
            now = self._droppings()
            if now - self.droppings and USER_PRIORITY not in woken:
                woken.append(USER_PRIORITY)
            self.droppings = now
        return woken
