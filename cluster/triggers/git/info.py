"""What a report says about a commit: author, date, message and the paths it changed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.home import Home
from cluster.triggers.git.clone import configured_url, ensure_commit
from cluster.triggers.git.errors import CommitError, check_sha
from cluster.triggers.git.gitcmd import GitFailed, git
from cluster.triggers.git.ledger import repo_files


@dataclass(frozen=True)
class CommitInfo:
    """What a report says about a commit.

    ``author`` is ``Name <email>``, ``date`` the author date in strict ISO 8601,
    ``subject`` the title, ``message`` the whole log message, ``changed_paths`` the paths
    it added, changed or removed relative to its first parent (every path of a root
    commit), in git's order.
    """

    sha: str
    author: str
    date: str
    subject: str
    message: str
    changed_paths: tuple[str, ...]


_LOG_FORMAT = "%H%x00%P%x00%an <%ae>%x00%aI%x00%s%x00%B"


def read_commit(git_dir: Path, sha: str, tree: str = "") -> CommitInfo:
    """The commit ``sha`` (7 to 40 hex) of the repository ``git_dir``; CommitError if absent."""
    sha = check_sha(tree, sha)
    try:
        raw = git(git_dir, ["log", "-1", "--no-color", f"--format={_LOG_FORMAT}", sha, "--"])
        full, parents, author, date, subject, message = (
            raw.decode("utf-8", "replace").split("\0", 5))
        first = parents.split()[:1]
        # A merge is what it brings to the first parent's line; --no-renames so a move
        # counts at both ends.
        diff = ["diff-tree", "-r", "-z", "--name-only", "--no-renames", "--no-ext-diff"]
        names = git(git_dir, [*diff, first[0], full] if first
                    else [*diff, "--root", "--no-commit-id", full])
    except (GitFailed, ValueError) as exc:
        raise CommitError(tree, sha, f"cannot read it in {git_dir}: {exc}") from None
    paths = tuple(p for p in names.decode("utf-8", "replace").split("\0") if p)
    return CommitInfo(sha=full.strip(), author=author, date=date, subject=subject,
                      message=message.rstrip("\n"), changed_paths=paths)


def commit_info(home: Home, cfg: Config, tree: str, sha: str) -> CommitInfo:
    """Author, date, message and changed paths of commit ``sha`` of ``tree``.

    Read in the master's bare clone, fetched (or cloned) first if it lacks the commit.
    CommitError naming the tree, the sha and the problem.
    """
    files = repo_files(home, tree)
    sha = check_sha(tree, sha)
    full = ensure_commit(files, tree, configured_url(cfg, tree), sha)
    return read_commit(files.clone, full, tree)
