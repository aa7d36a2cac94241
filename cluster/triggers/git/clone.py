"""The master's bare clone of a configured repository: clone, fetch, make sure it has a commit.

The clone is only a cache of the configured url: a missing one is cloned, a broken one is
cloned afresh, and every fetch is from the url as configured now (not ``remote.origin``).
Callers hold the tree's fetch lock (:attr:`RepoFiles.fetch_lock`) around all of this, so no
one ever sees a clone half cloned; :func:`ensure_commit` takes it itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

from cluster import datatypes
from cluster.config import Config
from cluster.errors import ConfigError
from cluster.runtime import fsutil
from cluster.triggers.git.errors import CommitError
from cluster.triggers.git.gitcmd import (
    CLONE_TIMEOUT,
    FETCH_TIMEOUT,
    FULL_SHA,
    GitFailed,
    git,
    resolve,
    run_git,
)
from cluster.triggers.git.ledger import RepoFiles

log = logging.getLogger("cluster.commits")


def configured_url(cfg: Config, tree: str) -> str:
    """The url ``repositories`` gives ``tree``; CommitError if the tree is not configured."""
    try:
        repositories = datatypes.parse_repositories(cfg.repositories)
    except ConfigError as exc:
        raise CommitError(tree, "", str(exc)) from None
    if tree not in repositories:
        known = ", ".join(repositories) or "none"
        raise CommitError(tree, "", f"not a configured repository (repositories: {known})")
    return repositories[tree]


def _clone(tree: str, url: str, files: RepoFiles) -> None:
    """Clone ``url`` bare into ``files.clone``.  Caller holds the fetch lock."""
    # Into a temp dir renamed into place: a clone cut short never looks like a clone.
    tmp = tempfile.mkdtemp(prefix=f".{tree}.", suffix=".clone", dir=files.clone.parent)
    try:
        git(None, ["clone", "--bare", "--quiet", "--", url, tmp], CLONE_TIMEOUT)
        fsutil.swap_dir(tmp, files.clone)
    except GitFailed as exc:
        raise CommitError(tree, "", f"cannot clone {url}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("tree %s: cloned %s into %s", tree, url, files.clone)


def fetch(tree: str, url: str, files: RepoFiles) -> None:
    """Bring every branch of the clone up to ``url``.  Caller holds the fetch lock."""
    try:
        git(files.clone, ["fetch", "--quiet", "--prune", "--", url,
                          "+refs/heads/*:refs/heads/*"], FETCH_TIMEOUT)
    except GitFailed as exc:
        raise CommitError(tree, "", f"cannot fetch {url}: {exc}") from None


def update_clone(tree: str, url: str, files: RepoFiles) -> None:
    """Fetch the bare clone, or clone it when missing.  Caller holds the fetch lock."""
    files.clone.parent.mkdir(parents=True, exist_ok=True)
    if (files.clone / "HEAD").is_file():
        fetch(tree, url, files)
        return
    if files.clone.exists() or files.clone.is_symlink():
        # Not a repository (left by hand or by a tool): it is only a cache of the url.
        log.warning("tree %s: %s is not a git repository; cloning afresh", tree, files.clone)
        aside = files.clone.with_name(f".{files.clone.name}.broken.{os.getpid()}")
        os.replace(files.clone, aside)
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink()
    _clone(tree, url, files)


def ensure_commit(files: RepoFiles, tree: str, url: str, sha: str) -> str:
    """The full sha of ``sha`` in the bare clone, cloning or fetching when it is missing.

    Takes the fetch lock.  CommitError if neither the branches of ``url`` nor (for a full
    sha) ``url`` itself hand out the commit.
    """
    with fsutil.flocked(files.fetch_lock):
        if not (files.clone / "HEAD").is_file():
            update_clone(tree, url, files)
        full = resolve(files.clone, sha)
        if full is None:
            fetch(tree, url, files)
            full = resolve(files.clone, sha)
        if full is None and FULL_SHA.fullmatch(sha):
            # No longer on a branch (history rewritten after it was queued): servers that
            # allow it hand out a commit by its sha.  Kept under refs/cluster/ so gc keeps it.
            done = run_git(files.clone, ["fetch", "--quiet", "--", url,
                                         f"{sha}:refs/cluster/{sha}"], FETCH_TIMEOUT)
            if done.returncode == 0:
                full = resolve(files.clone, sha)
    if full is None:
        raise CommitError(tree, sha, f"no such commit in {url} (after fetching its branches)")
    return full
