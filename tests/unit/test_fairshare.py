"""Fair share between runs of one priority (cluster.master.model.fairshare): the weights,
the water-filling, the whole-node targets and the moves, with their hysteresis."""

from __future__ import annotations

from fractions import Fraction
from itertools import permutations

import pytest

from cluster.master.model.fairshare import (
    FairRun,
    fair_moves,
    ideal,
    plan,
    run_share,
    targets,
)


def test_a_runs_weight_is_its_share_option_else_its_users_else_one() -> None:
    shares = {"alice": 2, "bob": 1}
    assert run_share(["min_nodes=1", "share=5"], "alice", shares) == 5
    assert run_share(["min_nodes=1"], "alice", shares) == 2
    assert run_share([], "carol", shares) == 1
    assert run_share([], None, shares) == 1  # not a user run: no user's weight
    assert run_share(["share=0"], "alice", shares) == 2  # not a weight: as if absent
    assert run_share(["share=x"], None, {}) == 1


def test_equal_shares_split_evenly_the_odd_node_by_run_id() -> None:
    runs = [FairRun("b", 1, wanted=10), FairRun("a", 1, wanted=10)]
    assert targets(4, runs) == {"a": 2, "b": 2}
    assert ideal(3, runs) == {"a": Fraction(3, 2), "b": Fraction(3, 2)}
    assert targets(3, runs) == {"a": 2, "b": 1}
    assert targets(0, runs) == {"a": 0, "b": 0}


def test_weights_two_to_one() -> None:
    runs = [FairRun("alice", 2, wanted=10), FairRun("bob", 1, wanted=10)]
    assert targets(3, runs) == {"alice": 2, "bob": 1}
    assert targets(9, runs) == {"alice": 6, "bob": 3}
    assert targets(4, runs) == {"alice": 3, "bob": 1}  # 8/3 and 4/3: the larger remainder


def test_a_run_gets_no_more_than_it_can_use_the_rest_goes_to_the_others() -> None:
    runs = [FairRun("a", 1, wanted=1), FairRun("b", 1, wanted=10), FairRun("c", 2, wanted=10)]
    # 10 nodes by 1:1:2 would be 2.5, 2.5, 5; a can use 1, so 9 go 1:2 to b and c.
    assert ideal(10, runs) == {"a": 1, "b": 3, "c": 6}
    assert targets(10, runs) == {"a": 1, "b": 3, "c": 6}
    # Everyone capped: nodes are left over, none is given beyond what a run can use.
    small = [FairRun("a", 1, wanted=1), FairRun("b", 5, wanted=2)]
    assert targets(10, small) == {"a": 1, "b": 2}
    # A stopping run (wanted 0) is owed nothing.
    assert targets(4, [FairRun("a", 3, wanted=0), FairRun("b", 1, wanted=9)]) == {
        "a": 0, "b": 4}


def test_every_master_computes_the_same_targets_whatever_the_order() -> None:
    runs = [FairRun("r1", 1, 7), FairRun("r2", 3, 7), FairRun("r3", 1, 7), FairRun("r4", 2, 2)]
    results = {tuple(sorted(targets(11, list(order)).items())) for order in permutations(runs)}
    assert len(results) == 1
    (only,) = results
    assert sum(n for _, n in only) == 11


def test_a_donor_over_its_target_sends_to_a_run_under_it() -> None:
    mine, theirs = FairRun("lane0", 1, 10, holds=2), FairRun("lane3", 1, 10, holds=0)
    assert fair_moves([mine, theirs], "lane0", "lane3") == 1
    assert fair_moves([mine, theirs], "lane3", "lane0") == 0
    # Weights 2:1 with 3 nodes, the heavier run holding none: it is owed 2.
    heavy, light = FairRun("alice", 2, 10, holds=0), FairRun("bob", 1, 10, holds=3)
    assert fair_moves([heavy, light], "bob", "alice") == 2
    # Nodes on their way or idle count as the recipient's.
    assert fair_moves([mine, theirs], "lane0", "lane3", idle=1) == 0
    assert fair_moves([mine, FairRun("lane3", 1, 10, holds=1)], "lane0", "lane3") == 0


def test_no_ping_pong_over_a_rounding() -> None:
    """Two equal runs on 3 nodes: the odd node stays where it is, whichever run holds it
    (moving it would not make the split any fairer)."""
    for holds in ((2, 1), (1, 2)):
        runs = [FairRun("a", 1, 10, holds=holds[0]), FairRun("b", 1, 10, holds=holds[1])]
        assert plan(runs) == {}
    # Moving to the targets never makes the next look move back.
    runs = [FairRun("a", 2, 10, holds=0), FairRun("b", 1, 10, holds=5)]
    moved = plan(runs)
    assert moved == {("b", "a"): 3}
    after = [FairRun("a", 2, 10, holds=3), FairRun("b", 1, 10, holds=2)]
    assert plan(after) == {}


def test_never_below_the_donors_min_nodes() -> None:
    runs = [FairRun("a", 1, 10, holds=4, min_nodes=3), FairRun("b", 1, 10, holds=0)]
    assert fair_moves(runs, "a", "b") == 1
    runs = [FairRun("a", 1, 10, holds=2, min_nodes=2), FairRun("b", 1, 10, holds=0)]
    assert fair_moves(runs, "a", "b") == 0


def test_two_donors_each_give_their_own_part_never_both_the_whole() -> None:
    runs = [FairRun("a", 1, 10, holds=4), FairRun("b", 1, 10, holds=4),
            FairRun("c", 1, 10, holds=0), FairRun("d", 1, 10, holds=0)]
    moves = plan(runs)
    assert sum(n for (_, to), n in moves.items() if to == "c") == 2
    assert sum(n for (_, to), n in moves.items() if to == "d") == 2
    assert sum(n for (give, _), n in moves.items() if give == "a") == 2
    assert sum(n for (give, _), n in moves.items() if give == "b") == 2


def test_bad_facts_are_refused() -> None:
    with pytest.raises(ValueError, match="each once"):
        targets(2, [FairRun("a", 1, 1), FairRun("a", 1, 1)])
    with pytest.raises(ValueError, match="share >= 1"):
        targets(2, [FairRun("a", 0, 1)])
