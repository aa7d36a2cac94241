"""What the master knows of one node in a run: :class:`NodeState` and :class:`NodeInfo`.

A node is a process, not a name: the run state (:mod:`cluster.master.state.runstate`)
keeps one :class:`NodeInfo` per name, replaced when another process of that name joins.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class NodeState(enum.StrEnum):
    BUILDING = "building"    # told BUILD, not yet reported ready
    READY = "ready"          # built; takes jobs
    UPLOADING = "uploading"  # told UPLOAD
    DONE = "done"            # uploaded its logs
    GONE = "gone"            # dead, dropped or left; its unfinished jobs were put back


@dataclass
class NodeInfo:
    """What the master knows of one node in this run."""

    name: str
    state: NodeState
    last_seen: float
    #: The node process this is (the session of its signed nonces; "" when unknown) and the
    #: machine's instance (``instance`` header) and address it calls from: a node is a
    #: process, not a name.
    session: str = ""
    instance: str = ""
    peer: str = ""
    caps: str = ""
    slots: int = 1
    status: str = ""
    #: Jobs handed out to it with no result from it yet, oldest first: name -> job index.
    held: dict[str, int] = field(default_factory=dict)
    working_since: float | None = None  # when it first got jobs: its rate is measured from then
    capacity: int = 0                   # jobs it is kept holding (grown while it runs dry fast)
    last_batch_at: float | None = None  # when it was last given new jobs
    told_abort: bool = False    # it has been told the run is over
    results: int = 0            # first results it delivered
    errors: int = 0             # of those, results with an error code (not 0)
    timeouts: int = 0           # of those, results that timed out (error 3 or 4)
    #: The programs of job.start its build did not make (``unbuilt``).
    lacks: frozenset[str] = frozenset()
    #: Preempted (:mod:`cluster.master.model.preempt`): where it is to go, e.g. ``run X
    #: (priority 0)``; "" while it stays.  Told once (``told_move``), it gets no new job,
    #: and its leaving call drops it without counting it lost.
    moving_to: str = ""
    told_move: bool = False
    #: Whether its process understands ``withdraw`` lines (``features withdraw``), and the
    #: jobs its next reply withdraws: their results came from another node.
    withdraws: bool = False
    withdraw: list[str] = field(default_factory=list)

    def job_seconds(self, now: float) -> float | None:
        """Wall seconds one of its slots has spent per job so far; None if unknown."""
        if self.working_since is None or not self.results:
            return None
        return self.slots * (now - self.working_since) / self.results
