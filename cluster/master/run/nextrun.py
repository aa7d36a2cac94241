"""Which queued run a priority's master serves next (docs/runoptions.md, section 5;
:mod:`cluster.deps`).

Seed 000's master served the head of its queue.  It still serves the head when it is
already running (``job[.p].start`` exists: a successor master takes it over, whatever its
dependencies or ``order=`` say now).  Otherwise the waiting runs are looked at in
:func:`cluster.deps.serving_order` -- lowest ``order=`` first, queue order among equals
(docs/runoptions.md, "Order within a queue") -- and the first of them is served at the
cost of one read of its queue when it waits for nothing (no ``after=``, no bmpcmp).
Otherwise every priority's queue is read and the first run in that order whose
dependencies are met is served (:func:`cluster.deps.choose`); the run served is moved to
the head of its queue first (:meth:`cluster.queue.QueueFile.promote`), so the head is the
running run as everything else expects.  The runs before it whose dependency failed leave the queue
with a report (:meth:`cluster.master.run.clustermaster.ClusterMaster.work`).
"""

from __future__ import annotations

from cluster import deps
from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.queue import QueueFile


def look(home: Home, priority: int, queue: QueueFile) -> deps.Choice:
    """What ``priority``'s master does next (see the module docstring)."""
    runs = queue.read()
    if not runs:
        return deps.Choice()
    if home.job_start(priority).exists():
        return deps.Choice(serve=runs[0])
    first = deps.serving_order(runs)[0][1]
    if not deps.needs_look(first):
        return deps.Choice(serve=first)
    queued = {p: runs if p == priority else QueueFile.for_priority(home, p).read()
              for p in PRIORITIES}
    return deps.choose(priority, queued, deps.Resolver(home, queued))
