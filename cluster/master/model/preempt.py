"""Preemption at job boundaries, as pure decisions (docs/runoptions.md, "Preemption: an
urgent run takes nodes at a job boundary").

A master serving a less urgent run (the *donor*) asks, while a more urgent run waits or
runs short of nodes and no node is free, how many of its own nodes to send there
(:func:`how_many`) and which (:func:`choose`).  The nodes it picks finish the jobs they are
running, give back those they have not started and join the urgent run; nothing is run
twice or lost (the master's side: :mod:`cluster.master.state.handout`).

How many: the urgent run is owed its share of the nodes the two runs hold between them,
by weight -- the jobs it has left times its priority's weight (:data:`PRIORITY_WEIGHT`: a
priority is worth ten times the next) against the donor's --, at least one node, never
more than it can use (its ``nodes_wanted``, from its jobs left: one node per
:data:`cluster.wire.resources.JOBS_PER_SLOT` jobs of a slot).  Nodes it already has, nodes
on their way to it and idle nodes (which join it on their own) count against that.
Donors less urgent than this one give first (a priority-2 run before a priority-1 run);
a donor never goes below its ``min_nodes``.

Which: the nodes that hold the fewest jobs (the soonest at a job boundary), then the
fewest slots (the donor keeps its wide nodes), then by name; never one the urgent run's
placement refuses, nor one already leaving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: The weight of a run's jobs by its priority: a push's job is worth ten of a commit run's
#: and a hundred of a nightly run's.
PRIORITY_WEIGHT = {0: 100, 1: 10, 2: 1}


def weight(priority: int, jobs_left: int) -> int:
    """A run's claim on the nodes: its jobs left (at least one: a run whose job list is
    not made yet counts as one job) times its priority's weight."""
    return max(jobs_left, 1) * PRIORITY_WEIGHT.get(priority, 1)


@dataclass(frozen=True)
class Urgent:
    """A more urgent run as a donor sees it: its priority and id, jobs left, the nodes in
    it, and how many it can use (``wanted``: 0 when it is stopping)."""

    priority: int
    run: str
    jobs_left: int
    nodes: int
    wanted: int


@dataclass(frozen=True)
class Donor:
    """A less urgent run that may give nodes: its priority, jobs left, its nodes that
    could move (in the run, built or building, not leaving already) and ``min_nodes``."""

    priority: int
    jobs_left: int
    nodes: int
    min_nodes: int = 0

    @property
    def movable(self) -> int:
        return max(0, self.nodes - self.min_nodes)


def share(urgent: Urgent, donor: Donor, coming: int = 0) -> int:
    """The nodes ``urgent`` is owed of the pool it and ``donor`` hold between them (its
    own, ``coming`` on their way to it, the donor's), by weight: at least one, at most
    what it can use."""
    if urgent.wanted <= 0:
        return 0
    pool = urgent.nodes + coming + donor.nodes
    wu = weight(urgent.priority, urgent.jobs_left)
    wd = weight(donor.priority, donor.jobs_left)
    owed = math.ceil(pool * wu / (wu + wd))
    return min(urgent.wanted, max(1, owed))


def how_many(urgent: Urgent, own: Donor, others: Iterable[Donor] = (), idle: int = 0,
             coming: int = 0) -> int:
    """How many of ``own``'s nodes leave for ``urgent`` now.

    ``others``: the other donors (runs less urgent than ``urgent``); those less urgent than
    ``own`` give first, up to their own ``movable``.  ``idle``: nodes up and in no run (they
    join ``urgent`` without being asked).  ``coming``: nodes already told to leave for it, or
    on their way, not yet in it.  0 unless ``own`` is less urgent than ``urgent``."""
    if own.priority <= urgent.priority:
        return 0
    need = share(urgent, own, coming) - urgent.nodes - coming - idle
    if need <= 0:
        return 0
    before = sum(d.movable for d in others if d.priority > own.priority)
    need -= before
    return max(0, min(need, own.movable))


@dataclass(frozen=True)
class Candidate:
    """A donor's node that could leave: its name, the jobs it holds, its slots."""

    name: str
    held: int
    slots: int = 1


def choose(candidates: Iterable[Candidate], count: int) -> list[str]:
    """The names of ``count`` nodes to send away: fewest jobs held, then fewest slots,
    then by name."""
    if count <= 0:
        return []
    ranked = sorted(candidates, key=lambda c: (c.held, c.slots, c.name))
    return [c.name for c in ranked[:count]]
