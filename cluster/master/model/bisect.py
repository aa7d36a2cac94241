"""A culprit search's decisions, pure (docs/results.md, "Finding the culprit commit").

The commits of a search are ``commits[0]`` (the stream's last tested commit, whose output
of every changed test is ``old``) to ``commits[n]`` (the commit run that found the
differences, ``new``), oldest first.  Each changed test has its own range: ``good``, the
newest commit known to give ``old``, and ``bad``, the oldest known not to.  A bisection
run at commit ``c`` runs the tests whose next commit is ``c``, and each test's result
moves one end of its range (:func:`observe`): its output is still ``old`` -- ``good = c``
-- or it is not (``new``, another md5, an error) -- ``bad = c``; no result (a build that
failed, a test not run) skips ``c`` for that test, as ``git bisect skip`` does.  So tests
split: each is pinned to the first commit that changed it, each on its own.

The next commit of a test (:func:`midpoint`) halves its range, avoiding the skipped
commits: with ``u`` untested commits, ``ceil(log2(u + 1))`` runs pin it when none is
skipped (:func:`bound`), and tests with the same range share each run (:func:`plan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cluster.master.files.culprits import QUEUED, SKIPPED, STEP_DONE, ChangedTest, Search, Step


def bound(untested: int) -> int:
    """The bisection runs that pin one test among ``untested`` commits, none skipped:
    ``ceil(log2(untested + 1))`` (0 when there is none)."""
    return math.ceil(math.log2(untested + 1)) if untested > 0 else 0


def midpoint(test: ChangedTest) -> int | None:
    """The commit to test next for ``test``: the candidate nearest the middle of its range
    (the older of two as near); None when it is pinned."""
    candidates = test.candidates()
    if not candidates:
        return None
    middle = (test.good + test.bad) / 2
    return min(candidates, key=lambda i: (abs(i - middle), i))


def observe(test: ChangedTest, commit: int, digest: str | None) -> None:
    """Narrow ``test``'s range by its result at ``commit`` (``digest``: md5 or
    ``error <code>``; None: no result, the commit is skipped for it).  A commit outside the
    range (a step planned before another narrowed it) changes nothing."""
    if not test.good < commit < test.bad:
        return
    if digest is None:
        if commit not in test.skipped:
            test.skipped.append(commit)
            test.skipped.sort()
    elif digest == test.old:
        test.good = commit
    else:
        test.bad = commit


def plan(search: Search) -> list[Step]:
    """The steps to queue now: one per commit that is the next of a test neither pinned
    nor waiting for a queued step, each running the tests whose next commit it is (in the
    search's order); the steps are added to ``search``."""
    pending = search.pending()
    by_commit: dict[int, list[str]] = {}
    for test in search.tests:
        if test.name in pending:
            continue
        commit = midpoint(test)
        if commit is not None:
            by_commit.setdefault(commit, []).append(test.name)
    made = [Step(commit, names) for commit, names in sorted(by_commit.items())]
    search.steps += made
    return made


def take(search: Search, number: int, digests: Mapping[str, str] | None, run: str,
         why: str = "") -> None:
    """Step ``number`` of ``search`` ended in run ``run``: ``digests`` are its tests'
    results (test -> digest; a test missing had none), None when the run gave none
    (``why``: its build failed, it was stopped): every test of the step skips its commit.
    A step already taken is not taken again."""
    step = search.steps[number]
    if step.state != QUEUED:
        return
    for name in step.tests:
        test = search.test(name)
        if test is not None:
            observe(test, step.commit, None if digests is None else digests.get(name))
    step.state, step.run, step.why = (STEP_DONE, run, "") if digests is not None \
        else (SKIPPED, run, why)


def finished(search: Search) -> bool:
    """Whether every test is pinned and no step waits."""
    return all(t.pinned for t in search.tests) and not search.pending()
