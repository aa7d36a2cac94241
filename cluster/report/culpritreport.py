"""The follow-up report of a culprit search (docs/results.md, "Finding the culprit commit").

Made from plain facts (the master's end step gathers them from the search's record and the
commits): which commit first changed which tests, with its author and subject; the tests
whose first change could only be narrowed to a few commits, because the others between
could not be tested (a failed build: ``git bisect skip``); the bisection runs that were
made.  The report is archived beside the commit run's own report and mailed like it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.report.compare import display_name

#: The follow-up report's name in the commit run's archive folder.
REPORT_NAME = "culprit.txt"


@dataclass(frozen=True)
class CommitFacts:
    """One commit as the report names it."""

    sha: str
    author: str = ""
    date: str = ""
    subject: str = ""


@dataclass(frozen=True)
class Finding:
    """Tests whose first change is ``culprit`` (``suspects`` empty), or one of
    ``suspects`` (oldest first; some could not be tested)."""

    tests: tuple[str, ...]
    culprit: CommitFacts
    suspects: tuple[CommitFacts, ...] = ()


@dataclass(frozen=True)
class SearchFacts:
    """What the report says of the search itself."""

    run: str
    tree: str
    good: CommitFacts
    good_run: str
    bad: CommitFacts
    untested: int
    runs: Sequence[tuple[str, str, str]]  # (commit sha, run id, state) of each bisection run


def _commit_lines(commit: CommitFacts) -> list[str]:
    lines = [f"commit {commit.sha}"]
    if commit.author:
        lines.append(f"Author: {commit.author}")
    if commit.date:
        lines.append(f"Date:   {commit.date}")
    if commit.subject:
        lines += ["", f"    {commit.subject}"]
    return lines


def render(search: SearchFacts, findings: Sequence[Finding]) -> str:
    """The follow-up report's text."""
    certain = [f for f in findings if not f.suspects]
    vague = [f for f in findings if f.suspects]
    tests = sum(len(f.tests) for f in findings)
    lines = [f"Culprit search for run {search.run} (tree {search.tree}): {tests} changed "
             f"test(s), {len(certain)} culprit commit(s) found"
             + (f", {len(vague)} range(s) with untestable commits" if vague else ""), "",
             f"Last tested commit: {search.good.sha} (run {search.good_run})",
             f"Commit run:         {search.bad.sha} (run {search.run})",
             f"Untested between:   {search.untested} commit(s)",
             f"Bisection runs:     {len(search.runs)}", ""]
    for finding in certain:
        lines += _commit_lines(finding.culprit)
        lines += ["", f"first changed {len(finding.tests)} test(s):",
                  *(f"  {display_name(t)}" for t in finding.tests), ""]
    for finding in vague:
        lines += [f"{len(finding.tests)} test(s) first changed in one of these commits (the "
                  "others between could not be tested):",
                  *(f"  {c.sha} {c.author} {c.subject}".rstrip() for c in finding.suspects),
                  "tests:", *(f"  {display_name(t)}" for t in finding.tests), ""]
    lines.append("Bisection runs (commit, run, state):")
    lines += [f"  {sha} {run or '-'} {state}" for sha, run, state in search.runs] or ["  none"]
    return "\n".join(lines) + "\n"
