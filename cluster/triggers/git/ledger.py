"""The files of one tree in the master home: the ledger of decided commits and the poll marker.

``repos/<tree>.queued`` (the ledger) holds one ``<sha> <decision>`` line per commit ever
decided (``queued``, ``untested`` or ``no-products``); it is only appended to, each line
fsync'ed, by a caller holding ``repos/<tree>.lock``.  ``repos/<tree>.seen`` holds the branch
tip the last poll processed, replaced atomically.  A torn ledger line (a crash mid-append)
is ignored when read and never swallows the next line.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cluster.home import Home
from cluster.runtime import fsutil
from cluster.triggers.git.errors import check_tree
from cluster.triggers.git.gitcmd import FULL_SHA

log = logging.getLogger("cluster.commits")

#: Permission bits of the ledger: a hook may run as the git user and the poller as the
#: master's, sharing a group.
LEDGER_MODE = 0o664


@dataclass(frozen=True)
class RepoFiles:
    """Where the clone, the poll marker, the ledger and the locks of one tree live."""

    clone: Path
    seen: Path
    ledger: Path
    lock: Path
    fetch_lock: Path


def repo_files(home: Home, tree: str) -> RepoFiles:
    """The files of ``tree`` under ``<home>/repos``; CommitError for a bad tree name."""
    check_tree(tree)
    base = home.root / "repos"
    return RepoFiles(clone=base / f"{tree}.git", seen=base / f"{tree}.seen",
                     ledger=base / f"{tree}.queued", lock=base / f"{tree}.lock",
                     fetch_lock=base / f"{tree}.fetch.lock")


def read_ledger(path: Path) -> set[str]:
    """The shas the ledger ``path`` has decided (none if it does not exist)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return set()
    return {words[0] for words in map(str.split, text.splitlines())
            if words and FULL_SHA.fullmatch(words[0])}


def ledger_add(path: Path, sha: str, decision: str) -> None:
    """Append ``<sha> <decision>`` durably.  Caller holds the tree lock."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, LEDGER_MODE)
    try:
        line = f"{sha} {decision}\n".encode("ascii")
        size = os.fstat(fd).st_size
        # A line torn by a crash must not swallow the next one.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_seen(path: Path) -> str | None:
    """The tip the last poll processed, or None (never polled, or the file is not a sha)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    if not FULL_SHA.fullmatch(text):
        log.warning("%s holds %r, not a sha; treating the tree as never polled", path, text[:80])
        return None
    return text


def write_seen(path: Path, sha: str) -> None:
    """Record ``sha`` as the tip the last poll processed.  Caller holds the fetch lock."""
    fsutil.atomic_write(path, sha + "\n")
