"""The error of the commit triggers, and the checks of what a caller names: a tree, a commit.

Everything a caller passes (a hook's arguments, a queued run's sha, the command line) is
checked here before it reaches git or a path; a bad value is a :class:`CommitError` that
names the tree, the commit and the expected form.
"""

from __future__ import annotations

import re

from cluster import datatypes
from cluster.errors import ClusterError, ConfigError

#: What a caller may name a commit by: an abbreviated or full sha, nothing git could
#: read as an option, a range or a revision expression.
SHA_ARG = re.compile(r"[0-9a-fA-F]{7,40}")


class CommitError(ClusterError):
    """A commit run could not be queued, exported or described."""

    def __init__(self, tree: str, sha: str, problem: str) -> None:
        super().__init__(tree, sha, problem)
        self.tree = tree
        self.sha = sha
        self.problem = problem

    def __str__(self) -> str:
        what = f"tree {self.tree!r}" + (f" commit {self.sha}" if self.sha else "")
        return f"{what}: {self.problem}"


def check_sha(tree: str, sha: str) -> str:
    """``sha`` lower-cased if it is 7 to 40 hex digits; CommitError naming ``tree`` otherwise."""
    if not isinstance(sha, str) or not SHA_ARG.fullmatch(sha):
        raise CommitError(tree, "", f"bad commit {sha!r}; expected a sha of 7 to 40 hex digits")
    return sha.lower()


def check_tree(tree: str) -> str:
    """``tree`` if a commit run may use it (:func:`cluster.datatypes.check_tree`); CommitError."""
    try:
        return datatypes.check_tree(tree)
    except ConfigError as exc:
        raise CommitError(str(tree), "", f"bad tree name: expected {exc.expected}") from None
