"""Deciding and queueing commits: the poller (priority-1 discoverer) and the hook's entry.

Both :func:`poll` and :func:`enqueue_commits` end in one locked step: each commit not yet
in the tree's ledger is read, decided (:mod:`.decide`), queued if it is to be tested, and
written to the ledger, so whichever path sees a commit first queues it, and it is never
queued again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cluster import datatypes
from cluster.config import Config
from cluster.datatypes import PathRule
from cluster.defaults import COMMIT_PRIORITY
from cluster.errors import ConfigError, QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.triggers.git.clone import configured_url, update_clone
from cluster.triggers.git.decide import UNTESTED, UNTESTED_MARK, decide
from cluster.triggers.git.errors import CommitError, check_sha, check_tree
from cluster.triggers.git.gitcmd import GitFailed, resolve, rev_list
from cluster.triggers.git.info import read_commit
from cluster.triggers.git.ledger import (
    ledger_add,
    read_ledger,
    read_seen,
    repo_files,
    write_seen,
)

log = logging.getLogger("cluster.commits")

#: The ledger's word for a commit that was queued (or found already queued).
QUEUED = "queued"


def _enqueue(home: Home, tree: str, shas: Sequence[str], git_dir: Path,
             rules: Sequence[PathRule], queue: QueueFile) -> list[RunSpec]:
    """Decide each full sha not in the ledger, oldest first; queue the ones to test.

    The ledger and the queue are checked and appended under the tree lock, so of two
    callers (the hook and the poller) exactly one decides a commit.  The queue line is
    written before the ledger line: a crash in between leaves the run queued, and the next
    caller finds it there (QueueFile.append refuses it) and completes the ledger.
    """
    files = repo_files(home, tree)
    added: list[RunSpec] = []
    with fsutil.flocked(files.lock):
        decided = read_ledger(files.ledger)
        for sha in shas:
            if sha in decided:
                log.debug("tree %s: commit %s already decided", tree, sha)
                continue
            info = read_commit(git_dir, sha, tree)
            outcome = decide(tree, info, rules)
            if isinstance(outcome, str):
                why = (f"its message says {UNTESTED_MARK}" if outcome == UNTESTED else
                       f"its {len(info.changed_paths)} changed path(s) need no product "
                       "(path_products)")
                log.info("tree %s: commit %s not tested: %s (%s)", tree, sha[:12], why,
                         info.subject[:72])
                decision = outcome
            else:
                if queue.append(outcome):
                    added.append(outcome)
                else:
                    log.info("tree %s: commit %s was already in %s", tree, sha[:12], queue.path)
                decision = QUEUED
            ledger_add(files.ledger, sha, decision)
            decided.add(sha)
    return added


def enqueue_commits(home: Home, cfg: Config, tree: str, shas: Sequence[str],
                    git_dir: Path) -> list[RunSpec]:
    """Queue the commits ``shas`` (oldest first) of ``tree``, reading them in ``git_dir``.

    What the hook calls: ``git_dir`` is the repository the hook runs in.  Same rules and
    ledger as :func:`poll`: a commit already decided by either is skipped.  Returns the runs
    added to the priority-1 queue.  CommitError for a bad or unconfigured tree, a sha that
    is not hex, or a commit ``git_dir`` does not have; nothing is queued then.
    """
    check_tree(tree)
    configured_url(cfg, tree)  # only configured trees: the master must be able to fetch them
    try:
        rules = datatypes.parse_path_products(cfg.path_products)
    except ConfigError as exc:
        raise CommitError(tree, "", str(exc)) from None
    checked = [check_sha(tree, sha) for sha in shas]
    git_dir = Path(git_dir).absolute()
    full: list[str] = []
    for sha in checked:
        resolved = resolve(git_dir, sha)
        if resolved is None:
            raise CommitError(tree, sha, f"no such commit in {git_dir}")
        full.append(resolved)
    if not full:
        return []
    queue = QueueFile.for_priority(home, COMMIT_PRIORITY)
    try:
        return _enqueue(home, tree, full, git_dir, rules, queue)
    except QueueLineError as exc:  # cannot happen for a full sha and checked products
        raise CommitError(tree, "", str(exc)) from None


def poll(home: Home, cfg: Config, queue: QueueFile) -> list[RunSpec]:
    """The priority-1 discoverer: fetch every repository and queue its new commits.

    For each configured repository: clone it if missing, fetch, and decide the commits of
    ``git_branch`` since the tip the previous poll processed (``repos/<tree>.seen``), oldest
    first (topological order); then record the new tip.  The first poll of a tree (no
    .seen) decides only the tip: it becomes the first baseline, and a repository's whole
    history is never queued.  If the recorded tip is gone (history rewritten) it is treated
    the same way.  A repository that cannot be cloned, fetched or read is logged with its
    tree, url and git's message, and left for the next poll; the others go on.  Returns the
    runs added to ``queue``.
    """
    if not cfg.repositories:
        return []
    try:
        repositories = datatypes.parse_repositories(cfg.repositories)
        rules = datatypes.parse_path_products(cfg.path_products)
        branch = datatypes.check_branch(cfg.git_branch)
    except ConfigError as exc:
        log.error("commit polling is off: %s", exc)
        return []
    added: list[RunSpec] = []
    for tree, url in repositories.items():
        try:
            added += _poll_tree(home, tree, url, branch, rules, queue)
        except CommitError as exc:
            log.error("commit polling: %s", exc)
        except OSError as exc:
            log.error("commit polling: tree %r (%s): %s", tree, url, exc)
    return added


def _poll_tree(home: Home, tree: str, url: str, branch: str, rules: Sequence[PathRule],
               queue: QueueFile) -> list[RunSpec]:
    files = repo_files(home, tree)
    # The whole poll holds the fetch lock: two overlapping polls of one tree then agree on
    # .seen, and an export never sees a clone half cloned.
    with fsutil.flocked(files.fetch_lock):
        update_clone(tree, url, files)
        tip = resolve(files.clone, f"refs/heads/{branch}")
        if tip is None:
            raise CommitError(tree, "", f"no branch {branch!r} in {url}")
        seen = read_seen(files.seen)
        if seen == tip:
            return []
        if seen is None:
            log.info("tree %s: first poll; only the tip %s is considered (the first "
                     "baseline), not the history before it", tree, tip[:12])
            shas = [tip]
        elif resolve(files.clone, seen) is None:
            log.warning("tree %s: the last polled commit %s is gone from %s (history "
                        "rewritten?); only the tip %s is considered", tree, seen[:12], url,
                        tip[:12])
            shas = [tip]
        else:
            try:
                shas = rev_list(files.clone, seen, tip)
            except GitFailed as exc:
                raise CommitError(tree, "", f"cannot list commits {seen}..{tip}: {exc}") \
                    from None
        added = _enqueue(home, tree, shas, files.clone, rules, queue)
        write_seen(files.seen, tip)
    return added
