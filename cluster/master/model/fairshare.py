"""Fair share between the runs of one priority, as pure decisions (docs/runoptions.md,
"Fair share").

Priority 0 has more than one lane (:mod:`cluster.lanes`): two users' pushes are served side
by side and divide the nodes they hold between them by weight.  A run's weight
(:func:`run_share`) is its ``share=N``, else its user's weight in master.conf's
``user_shares``, else 1.

What each run is owed (:func:`ideal`, :func:`targets`): weighted water-filling of the pool
of nodes -- each run gets the pool times its weight over the weights of the runs still
filling, never more than it can use (``wanted``); what a capped run leaves goes to the
others, by their weights, until the pool is shared or every run has what it can use.
:func:`ideal` gives the exact fractions, :func:`targets` whole nodes: each run its
fraction rounded down, the nodes left over one each to the largest remainders, equal
remainders by run id.  Exact arithmetic (fractions, no floats) and the run-id tie-break
make two masters computing it from the same facts agree to the node.

Who sends how many to whom now (:func:`plan`, :func:`fair_moves`): a run holding more than
its target (a *donor*) sends nodes to one holding fewer (a *recipient*: its nodes there, on
their way and the idle nodes that may join it count as held), never below the donor's
``min_nodes``; the recipients with the largest shortfall first, served by the donors with
the largest excess first (equal ones by run id), so each donor's master takes only its own
part of a shortfall and two donors do not both fill it.  Hysteresis: a move is made only
when it strictly reduces the imbalance -- the sum of the two runs' distances from their
exact (fractional) shares --, so with 3 nodes and two equal runs the 2:1 split stays as it
is whichever run holds the two: no node ping-pongs on a rounding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from cluster.runoptions import count_in

#: A run's weight without ``share=`` and without an entry in ``user_shares``.
DEFAULT_SHARE = 1


def owner(kind: str, ref: str) -> str | None:
    """The user a run is shared out by: a pushed tree's (``kind`` user, ``ref`` the
    user's name); None for any other run (no user's weight, and no user lane takes it)."""
    return ref if kind == "user" else None


def run_share(options: Iterable[str], user: str | None, user_shares: Mapping[str, int]) -> int:
    """The run's weight: its ``share=N`` option word among ``options`` (a job.start's or a
    queue line's words; others are ignored), else ``user_shares[user]``, else
    :data:`DEFAULT_SHARE`.  A ``share=`` word that is not a valid weight (1 to
    :data:`cluster.runoptions.MAX_SHARE`; the queue never lets one in) counts as absent.
    Always >= 1."""
    given = count_in(options, "share")
    if given is not None:
        return given
    if user is not None and user_shares.get(user, 0) >= 1:
        return user_shares[user]
    return DEFAULT_SHARE


@dataclass(frozen=True)
class FairRun:
    """One run of the priority, as every master sees it: its id, its weight (``share``,
    >= 1), how many nodes it can use (``wanted``; 0: none, e.g. stopping), the nodes it
    holds (``holds``: in it and on their way to it; a recipient's idle nodes are given to
    :func:`plan` apart) and the fewest it keeps (``min_nodes``)."""

    run: str
    share: int
    wanted: int
    holds: int = 0
    min_nodes: int = 0


def _check(runs: Sequence[FairRun]) -> None:
    ids = [r.run for r in runs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"fair share: run ids {sorted(ids)!r}: expected each once")
    for r in runs:
        if r.share < 1 or r.wanted < 0 or r.holds < 0 or r.min_nodes < 0:
            raise ValueError(f"fair share: {r!r}: expected share >= 1 and counts >= 0")


def ideal(pool: int, runs: Sequence[FairRun]) -> dict[str, Fraction]:
    """Each run's exact share of ``pool`` nodes by weighted water-filling (module
    docstring): sums to ``min(pool, sum of wanted)``; a run wanting 0 gets 0.  ValueError
    for a repeated run id, a weight below 1 or a negative count."""
    _check(runs)
    owed = {r.run: Fraction(0) for r in runs}
    filling = [r for r in runs if r.wanted > 0]
    left = Fraction(max(pool, 0))
    while filling and left > 0:
        weights = sum(r.share for r in filling)
        capped = [r for r in filling if left * r.share / weights >= r.wanted]
        if not capped:
            for r in filling:
                owed[r.run] = left * r.share / weights
            break
        for r in capped:
            owed[r.run] = Fraction(r.wanted)
            left -= r.wanted
        filling = [r for r in filling if r not in capped]
    return owed


def targets(pool: int, runs: Sequence[FairRun]) -> dict[str, int]:
    """Each run's whole number of nodes of ``pool``: :func:`ideal` rounded down, the nodes
    left over one each to the largest remainders, equal remainders by run id (the smaller
    first).  Sums to ``min(pool, sum of wanted)``; never above a run's ``wanted``; the same
    for the same facts on every master."""
    exact = ideal(pool, runs)
    whole = {run: int(value) for run, value in exact.items()}  # floor: values are >= 0
    extra = int(sum(exact.values())) - sum(whole.values())
    by_remainder = sorted(exact, key=lambda run: (-(exact[run] - whole[run]), run))
    for run in by_remainder[:extra]:
        whole[run] += 1
    return whole


def _distance(holds: int, owed: Fraction) -> Fraction:
    return abs(holds - owed)


def plan(runs: Sequence[FairRun], idle: int = 0) -> dict[tuple[str, str], int]:
    """The moves that bring ``runs`` toward their shares now: (donor id, recipient id) ->
    nodes, only positive counts.

    The pool is every run's ``holds`` plus ``idle`` (nodes up and in no run); the idle nodes
    count as held by each recipient (they may join it on their own), so they lower every
    shortfall.  A donor holds more than its :func:`targets` and gives at most down to it
    and never below its ``min_nodes``; a recipient holds (with the idle nodes) fewer than
    its target.  Recipients by largest shortfall, then run id; each served by the donors
    with the most to give first, then run id.  A move of k nodes is made only when it
    strictly reduces ``|held - ideal|`` summed over its two runs (the largest such k up to
    what the two allow)."""
    pool = sum(r.holds for r in runs) + max(idle, 0)
    whole = targets(pool, runs)
    exact = ideal(pool, runs)
    held = {r.run: r.holds for r in runs}
    floor = {r.run: max(r.min_nodes, whole[r.run]) for r in runs}
    seen = {r.run: r.holds + (idle if r.holds < whole[r.run] else 0) for r in runs}
    recipients = sorted((r.run for r in runs if seen[r.run] < whole[r.run]),
                        key=lambda run: (-(whole[run] - seen[run]), run))
    moves: dict[tuple[str, str], int] = {}
    for to in recipients:
        donors = sorted((r.run for r in runs if held[r.run] > floor[r.run]),
                        key=lambda run: (-(held[run] - floor[run]), run))
        for give in donors:
            most = min(held[give] - floor[give], whole[to] - seen[to])
            before = _distance(held[give], exact[give]) + _distance(seen[to], exact[to])
            count = next((k for k in range(most, 0, -1)
                          if _distance(held[give] - k, exact[give])
                          + _distance(seen[to] + k, exact[to]) < before), 0)
            if count > 0:
                moves[give, to] = count
                held[give] -= count
                seen[to] += count
    return moves


def fair_moves(runs: Sequence[FairRun], donor: str, other: str, idle: int = 0) -> int:
    """How many of run ``donor``'s nodes go to run ``other`` now: its part of
    :func:`plan` (0 when there is none, or when either is not among ``runs``)."""
    return plan(runs, idle).get((donor, other), 0)
