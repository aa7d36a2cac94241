"""Lanes: the clustermasters of a home, each serving one run at a time (docs/architecture.md,
"Lanes and fair share").

Seed 000 has three masters, one per priority: lanes 0, 1 and 2 serve the queues of
priorities 0, 1 and 2, each on ``base_port + lane`` with its files suffixed by its number
(``job.start``, ``job.1.start``, ...).  So that two developers' pushes run side by side on
shares of the nodes, priority 0 has ``user_lanes - 1`` more lanes, numbered from
:data:`FIRST_USER_LANE` (``job.3.start``, port ``base_port + 3``, ...); each serves a
waiting priority-0 run of a user who has no run in another lane.  A commit run or a
nightly run compares with the run before it in its stream, so priorities 1 and 2 keep one
lane each.

Every reader of the lanes' files looks at :data:`ALL_LANES` (a missing file is a lane with no
run); only the supervisor and the configuration decide which lanes have a master
(:func:`served_lanes`).  A leaf module, as :mod:`cluster.defaults`.
"""

from __future__ import annotations

from cluster.defaults import PRIORITIES, USER_PRIORITY

#: The first lane beyond the seed's three: it and those after it serve priority 0.
FIRST_USER_LANE = len(PRIORITIES)
#: The most lanes priority 0 may have (``user_lanes``): its lane 0 and seven more, on
#: ``base_port + 3`` .. ``base_port + 9`` (the monitor's default port is base_port + 10).
MAX_USER_LANES = 8
#: Every lane that may exist, whatever the configuration: 0, 1, 2, then the user lanes.
ALL_LANES = (*PRIORITIES, *range(FIRST_USER_LANE, FIRST_USER_LANE + MAX_USER_LANES - 1))


def priority_of(lane: int) -> int:
    """The priority whose queue ``lane`` serves."""
    return lane if lane < FIRST_USER_LANE else USER_PRIORITY


def lanes_of(priority: int) -> tuple[int, ...]:
    """Every lane that may serve ``priority``'s queue (its own number first)."""
    return tuple(lane for lane in ALL_LANES if priority_of(lane) == priority)


def served_lanes(user_lanes: int) -> tuple[int, ...]:
    """The lanes a master home with ``user_lanes`` runs a clustermaster for."""
    extra = max(0, min(user_lanes, MAX_USER_LANES) - 1)
    return (*PRIORITIES, *range(FIRST_USER_LANE, FIRST_USER_LANE + extra))


def is_lane(value: int) -> bool:
    """Whether ``value`` names a lane (a node is told one in a heartbeat's answer)."""
    return value in ALL_LANES


def describe(lane: int) -> str:
    """``priority 0`` for a seed lane, ``priority 0 (lane 3)`` for a user lane: how logs and
    pages name a lane."""
    p = priority_of(lane)
    return f"priority {p}" if lane == p else f"priority {p} (lane {lane})"
