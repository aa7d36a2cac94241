"""The tail of a run: which running jobs are worth a speculative copy on an idle node.

When no job is left to hand out, an idle node is given copies of the jobs expected to finish
last elsewhere (deep in the queue of a slow or silent node) when a copy on it should finish
sooner; the first result wins (:class:`cluster.master.state.runstate.RunState` counts the other as
a duplicate).  :class:`TailPlan` ranks the candidates and hands them out.

The plan reads what it needs of a node through :class:`Holder` (the run state's
``NodeInfo`` is one) and shares the run state's ``holders`` count (by job index: how many
nodes hold the unfinished job): a job is copied only while exactly one node holds it, so at
most once.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, MutableSequence, Sequence
from typing import Protocol


class Holder(Protocol):
    """What the tail plan reads (and, for ``held``, writes) of a node."""

    @property
    def held(self) -> dict[str, int]:
        """Jobs handed out to the node with no result yet, oldest first: name -> index."""
        ...

    @property
    def slots(self) -> int: ...

    @property
    def last_seen(self) -> float: ...

    @property
    def working_since(self) -> float | None: ...

    def job_seconds(self, now: float) -> float | None:
        """Wall seconds one of its slots has spent per job so far; None if unknown."""
        ...


#: A ranked job: (expected finish, -place in its node's list, job index); ascending order.
Entry = tuple[float, int, int]


class TailPlan:
    """The jobs worth copying in the tail, ranked by expected finish (latest popped first).

    Ranking every held job costs a walk over all nodes, so it is done at most every
    ``REFRESH`` seconds, or sooner (after ``REFILL``) when the plan is used up; each idle
    node's call then only pops from it, dropping entries that finished or were copied.
    """

    REFRESH = 0.5
    REFILL = 0.05

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.made_at = -math.inf
        self.made_size = 0

    def copies(self, node: Holder, free: int, now: float, nodes: Iterable[Holder],
               holders: MutableSequence[int], names: Sequence[str],
               skip: Container[int] = ()) -> list[int]:
        """Up to ``free`` copies for ``node`` (job indexes); they are added to its ``held``
        and counted in ``holders``.  ``nodes`` are all the nodes of the run (the plan is
        remade from them when it is due); ``names`` are the job names by index; ``skip``
        the jobs this node is not to copy (a sweep task whose try it made was not valid:
        another node tries it again).

        Only jobs expected to finish later than a job of this node's own would are copied:
        a fast node takes over a slow node's last jobs, a slow node does not copy a fast
        node's.  At most one copy per job.
        """
        age = now - self.made_at
        if age >= self.REFRESH or (not self.entries and self.made_size
                                   and age >= self.REFILL):
            self.rank(nodes, holders, now)
        entries = self.entries
        if not entries:
            return []
        mine = node.job_seconds(now) or 0.0
        held = node.held
        batch: list[int] = []
        own: list[Entry] = []
        while entries and len(batch) < free:
            entry = entries[-1]
            if entry[0] <= mine:
                break  # the rest would end sooner still
            entries.pop()
            i = entry[2]
            if holders[i] != 1:
                continue  # finished (no holders any more), or copied already
            name = names[i]
            if name in held or i in skip:
                own.append(entry)  # this node's own job, or one it tried: for the others
                continue
            batch.append(i)
            held[name] = i
            holders[i] = 2
        entries.extend(reversed(own))
        return batch

    def rank(self, nodes: Iterable[Holder], holders: Sequence[int], now: float) -> None:
        """Rank the jobs that exactly one node holds by when they are expected to finish.

        A node runs its jobs in the order it got them, so the job at place p of its list
        ends about ``p // slots + 1/2`` of its job times from now (a running job is half
        done, on average; the job time is measured, or while the node has no result yet,
        at least the time it has had), plus however long it has been silent beyond one job
        time (a dead node looks ever slower).  The last two rounds of each node's list are
        ranked: the jobs it would start last.
        """
        entries: list[Entry] = []
        for other in nodes:
            held = other.held
            if not held:
                continue
            per_job = other.job_seconds(now)
            if per_job is None:
                since = other.working_since
                per_job = now - since if since is not None else 0.0
            # Silence beyond one job time: no job of its has ended for that long.
            late = max(now - other.last_seen - per_job, 0.0)
            slots = other.slots
            cap = 2 * slots
            place = len(held)
            taken = 0
            last_wave = -1
            for i in reversed(held.values()):  # the latest places first: they finish last
                place -= 1
                wave = place // slots
                if taken >= cap and wave < last_wave:
                    break
                if holders[i] != 1:  # finished (no holders any more), or copied
                    continue
                # Ordered by finish; among equals, the job handed out first goes first.
                entries.append(((wave + 0.5) * per_job + late, -place, i))
                taken += 1
                last_wave = wave
        entries.sort()  # popped from the end: latest finish first
        self.entries = entries
        self.made_at = now
        self.made_size = len(entries)
