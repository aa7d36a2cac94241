"""A culprit search's record, ``culprits/<run id>.toml`` (docs/results.md, "Finding the
culprit commit").

When a commit run has confirmed differences and commits between it and the stream's last
tested commit were never tested, the master searches for the first commit that changed
each changed test (:mod:`cluster.master.end.culprit`, the decisions in
:mod:`cluster.master.model.bisect`).  The search's state is this record, rewritten
atomically after each of its bisection runs ends; ``clusteradmin culprit RUN`` reads it.

The record (TOML)::

    run = "20261128140000-p1-ab12"      # the commit run whose differences are searched
    tree = "ghostpdl"
    products = ["gs"]
    good_run = "20261128130000-p1-cd34" # the stream's last tested commit's run
    commits = ["<good sha>", "<untested sha>", ..., "<bad sha>"]   # oldest first
    state = "searching"                 # or "done"
    report = ""                         # the follow-up report, in the archive, once done
    mailed = false

    [[tests]]                           # one per confirmed difference
    name = "tests/a.ps.ppmraw.72.0"
    old = "<digest at commits[0]>"      # md5, or "error <code>"
    new = "<digest at commits[-1]>"
    good = 0                            # the newest commit known to give ``old``
    bad = 7                             # the oldest commit known not to
    skipped = [3]                       # commits that gave no result for it

    [[steps]]                           # one per bisection run, numbered from 0
    commit = 3                          # an index into ``commits``
    tests = ["tests/a.ps.ppmraw.72.0"]
    state = "queued"                    # "done" or "skipped" once its run ended
    run = ""                            # its run id, once it ended
    why = ""                            # why a skipped step gave nothing

A test's culprit is ``commits[bad]`` once no commit between ``good`` and ``bad`` is left
to test; when some of those were skipped, the culprit is one of them or ``commits[bad]``.
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cluster.home import Home
from cluster.runtime import fsutil

log = logging.getLogger("cluster.master")

#: The queue option that makes a commit run a bisection run (``culprit=<run id>.<step>``).
OPTION = "culprit"
SEARCHING = "searching"
DONE = "done"
#: A step's states: its run waits or runs; it ended with results; it gave none.
QUEUED, STEP_DONE, SKIPPED = "queued", "done", "skipped"


@dataclass
class ChangedTest:
    """What a search knows of one changed test: its output before (``old``) and after
    (``new``), and the commits that bound its first change."""

    name: str
    old: str
    new: str
    good: int
    bad: int
    skipped: list[int] = field(default_factory=list)

    def candidates(self) -> list[int]:
        """The commits between ``good`` and ``bad`` still to be tested."""
        return [i for i in range(self.good + 1, self.bad) if i not in self.skipped]

    @property
    def pinned(self) -> bool:
        """Whether nothing is left to test: its culprit is known (or one of the skipped)."""
        return not self.candidates()

    def suspects(self) -> list[int]:
        """The commits that may be its culprit: every commit after ``good`` up to ``bad``."""
        return list(range(self.good + 1, self.bad + 1))


@dataclass
class Step:
    """One bisection run: the commit it tests and the tests it runs."""

    commit: int
    tests: list[str]
    state: str = QUEUED
    run: str = ""
    why: str = ""


@dataclass
class Search:
    """A culprit search (the module's docstring has its file)."""

    run: str
    tree: str
    products: list[str]
    good_run: str
    commits: list[str]
    tests: list[ChangedTest]
    steps: list[Step] = field(default_factory=list)
    state: str = SEARCHING
    report: str = ""
    mailed: bool = False

    def pending(self) -> set[str]:
        """The tests a queued step will run."""
        return {t for s in self.steps if s.state == QUEUED for t in s.tests}

    def test(self, name: str) -> ChangedTest | None:
        return next((t for t in self.tests if t.name == name), None)

    def text(self) -> str:
        """The record as TOML."""
        out = [f"run = {_s(self.run)}", f"tree = {_s(self.tree)}",
               f"products = {_list(self.products)}", f"good_run = {_s(self.good_run)}",
               f"commits = {_list(self.commits)}", f"state = {_s(self.state)}",
               f"report = {_s(self.report)}", f"mailed = {'true' if self.mailed else 'false'}"]
        for t in self.tests:
            out += ["", "[[tests]]", f"name = {_s(t.name)}", f"old = {_s(t.old)}",
                    f"new = {_s(t.new)}", f"good = {t.good}", f"bad = {t.bad}",
                    f"skipped = [{', '.join(str(i) for i in t.skipped)}]"]
        for s in self.steps:
            out += ["", "[[steps]]", f"commit = {s.commit}", f"tests = {_list(s.tests)}",
                    f"state = {_s(s.state)}", f"run = {_s(s.run)}", f"why = {_s(s.why)}"]
        return "\n".join(out) + "\n"

    @classmethod
    def parse(cls, text: str) -> Search:
        """A record back from its TOML; ValueError naming what is wrong."""
        try:
            data = tomllib.loads(text)
            tests = [ChangedTest(str(t["name"]), str(t["old"]), str(t["new"]), int(t["good"]),
                               int(t["bad"]), [int(i) for i in t.get("skipped", [])])
                     for t in data.get("tests", [])]
            steps = [Step(int(s["commit"]), [str(n) for n in s["tests"]], str(s["state"]),
                          str(s.get("run", "")), str(s.get("why", "")))
                     for s in data.get("steps", [])]
            search = cls(str(data["run"]), str(data["tree"]),
                         [str(p) for p in data["products"]], str(data["good_run"]),
                         [str(c) for c in data["commits"]], tests, steps,
                         str(data.get("state", SEARCHING)), str(data.get("report", "")),
                         bool(data.get("mailed", False)))
        except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a culprit search record: {exc}") from None
        last = len(search.commits) - 1
        for t in search.tests:
            if not 0 <= t.good < t.bad <= last:
                raise ValueError(f"test {t.name}: good {t.good} and bad {t.bad} are not "
                                 f"commits 0 <= good < bad <= {last}")
        for s in search.steps:
            if not 0 < s.commit < last:
                raise ValueError(f"a step's commit {s.commit} is not an untested commit "
                                 f"(1 to {last - 1})")
        return search


def _s(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes are TOML's, but for DEL."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_s(i) for i in items) + "]"


def path(home: Home, run_id: str) -> Path:
    """The record of the search for run ``run_id``'s differences."""
    return home.culprits / f"{run_id}.toml"


def load(home: Home, run_id: str) -> Search | None:
    """The search for run ``run_id``'s differences; None when there is none.  ValueError
    naming the file when it does not read."""
    where = path(home, run_id)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return Search.parse(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def save(home: Home, search: Search) -> None:
    """Write ``search``'s record atomically (fsync'ed: a queued step must not be lost)."""
    home.culprits.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(path(home, search.run), search.text())


def searches(home: Home) -> list[str]:
    """The run ids that have a search record, newest first."""
    try:
        return sorted((p.stem for p in home.culprits.glob("*.toml")), reverse=True)
    except OSError:
        return []
