"""A culprit search's decisions (cluster.master.model.bisect) and its record
(cluster.master.files.culprits): ranges, midpoints, splits, skips, the bound, the TOML."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable

import pytest

from cluster.errors import QueueLineError
from cluster.master.files import culprits
from cluster.master.files.culprits import ChangedTest, Search
from cluster.master.model import bisect
from cluster.runspec import RunSpec

OLD, NEW = "0" * 32, "f" * 32


def search(untested: int, tests: dict[str, int] | None = None) -> Search:
    """A search over ``untested`` commits between commit 0 and commit untested + 1."""
    n = untested + 1
    names = tests or {"a": 0}
    return Search("20261128140000-p1-ab12", "ghostpdl", ["gs"], "20261128130000-p1-cd34",
                  [f"{i:040x}" for i in range(n + 1)],
                  [ChangedTest(name, OLD, NEW, 0, n) for name in names])


def run_search(s: Search, culprit_of: Callable[[str], int],
               broken: frozenset[int] = frozenset()) -> int:
    """Drive ``s`` to its end as the master would: each step's run gives each of its
    tests ``NEW`` at or after its culprit, ``OLD`` before; a run at a ``broken`` commit
    gives nothing.  Returns the number of bisection runs."""
    bisect.plan(s)
    runs = 0
    while not bisect.finished(s):
        number = next(i for i, step in enumerate(s.steps) if step.state == culprits.QUEUED)
        step = s.steps[number]
        runs += 1
        if step.commit in broken:
            bisect.take(s, number, None, f"run{runs}", "failed")
        else:
            bisect.take(s, number, {t: NEW if step.commit >= culprit_of(t) else OLD
                                    for t in step.tests}, f"run{runs}")
        bisect.plan(s)
        assert runs < 100
    return runs


def test_the_fifth_of_eight_commits_takes_three_runs() -> None:
    s = search(6)
    runs = run_search(s, lambda t: 4)
    assert runs == 3 <= math.ceil(math.log2(7)) + 1
    assert [step.commit for step in s.steps] == [3, 5, 4]
    test = s.tests[0]
    assert (test.good, test.bad, test.pinned) == (3, 4, True)
    assert s.commits[test.bad] == s.commits[4]


@pytest.mark.parametrize("untested", range(1, 40))
def test_every_culprit_is_found_within_the_bound(untested: int) -> None:
    for culprit in range(1, untested + 2):
        s = search(untested)
        runs = run_search(s, lambda t, c=culprit: c)
        assert runs <= bisect.bound(untested) == math.ceil(math.log2(untested + 1))
        assert s.tests[0].bad == culprit and s.tests[0].good == culprit - 1


def test_no_untested_commit_needs_no_run() -> None:
    assert bisect.bound(0) == 0
    s = search(0)
    assert bisect.plan(s) == [] and bisect.finished(s)


def test_midpoint_is_the_middle_candidate_and_avoids_skipped_commits() -> None:
    test = ChangedTest("a", OLD, NEW, 0, 7)
    assert bisect.midpoint(test) == 3
    test.skipped = [3]
    assert bisect.midpoint(test) == 4
    test.skipped = [2, 3, 4, 5]
    assert bisect.midpoint(test) == 1  # as near as 6: the older
    test.skipped = [1, 2, 3, 4]
    assert bisect.midpoint(test) == 5
    test.skipped = [1, 2, 3, 4, 5, 6]
    assert bisect.midpoint(test) is None and test.pinned
    assert test.suspects() == [1, 2, 3, 4, 5, 6, 7]


def test_tests_split_and_each_is_pinned_to_its_own_commit() -> None:
    culprit = {"a": 2, "b": 6, "c": 6}
    s = search(6, culprit)
    runs = run_search(s, culprit.__getitem__)
    assert {t.name: t.bad for t in s.tests} == culprit
    assert all(t.good == t.bad - 1 for t in s.tests)
    # Every step ran only tests that were open then; the first ran all three.
    assert s.steps[0].tests == ["a", "b", "c"]
    # Tests with one range share a run: b and c never run apart.
    assert all(("b" in step.tests) == ("c" in step.tests) for step in s.steps)
    assert runs <= 2 * bisect.bound(6)


def test_a_failed_build_skips_its_commit_as_git_bisect_skip_does() -> None:
    s = search(6)
    runs = run_search(s, lambda t: 4, broken=frozenset({3}))
    test = s.tests[0]
    assert 3 in test.skipped and test.bad == 4 and test.pinned
    assert [step.state for step in s.steps][0] == culprits.SKIPPED
    assert s.steps[0].why == "failed"
    assert runs <= bisect.bound(6) + 1


def test_skipped_commits_leave_the_culprit_among_suspects() -> None:
    s = search(6)
    run_search(s, lambda t: 4, broken=frozenset({3, 4}))
    test = s.tests[0]
    assert test.pinned and test.good < 3 and test.bad == 5
    assert 3 in test.suspects() and 4 in test.suspects() and 5 in test.suspects()


def test_a_missing_result_skips_only_that_test() -> None:
    s = search(6, {"a": 0, "b": 0})
    bisect.plan(s)
    bisect.take(s, 0, {"a": OLD}, "run1")
    a, b = s.tests
    assert (a.good, a.skipped) == (3, []) and (b.good, b.skipped) == (0, [3])


def test_another_output_than_old_counts_as_changed() -> None:
    test = ChangedTest("a", OLD, NEW, 0, 7)
    bisect.observe(test, 3, "error 1")
    assert test.bad == 3
    bisect.observe(test, 5, OLD)  # outside the range now: nothing moves
    assert (test.good, test.bad) == (0, 3)


def test_a_step_is_taken_once() -> None:
    s = search(6)
    bisect.plan(s)
    bisect.take(s, 0, {"a": OLD}, "run1")
    bisect.take(s, 0, {"a": NEW}, "run1")
    assert (s.tests[0].good, s.tests[0].bad) == (3, 7)


def test_the_record_reads_back_as_written_and_is_toml() -> None:
    s = search(6, {'tests/a "quoted".ps\\x\x7f.ppmraw.72.0': 0, "tests/b.ps": 0})
    bisect.plan(s)
    bisect.take(s, 0, None, "run1", "failed: the build\nbroke")
    bisect.plan(s)
    text = s.text()
    tomllib.loads(text)
    back = Search.parse(text)
    assert back == s


def test_a_bad_record_is_refused_naming_what() -> None:
    s = search(6)
    s.tests[0].bad = 9
    with pytest.raises(ValueError, match="good 0 and bad 9"):
        Search.parse(s.text())
    with pytest.raises(ValueError, match="not a culprit search record"):
        Search.parse("run = 1\n")


def test_a_bisection_run_s_queue_line() -> None:
    spec = RunSpec.parse("git 0123abc gs tree=ghostpdl culprit=20261128140000-p1-ab12.3 "
                         "confirm=no")
    assert spec.culprit == ("20261128140000-p1-ab12", 3)
    assert spec.outside_stream
    assert RunSpec.parse("git 0123abc gs tree=ghostpdl").culprit is None
    with pytest.raises(QueueLineError, match="bad culprit step"):
        RunSpec.parse("user alice gs culprit=20261128140000-p1-ab12.3")
    with pytest.raises(QueueLineError, match="bad culprit step"):
        RunSpec.parse("git 0123abc gs culprit=nostep")
