"""clusterpush: submit a developer's tree as a user run (port of clusterpush.pl).

The tree is mirrored to ``users/<user>/<tree>`` in the master home (``tree`` is ``ghostpdl``
for gs, pdfwrite and ps2write, ``mupdf`` for mupdf), then a ``cluster_command.run``
dropping holding the run's queue line is left beside it.  Priority-0 clustermasters pick
droppings up in phase 1.  ``abort`` instead removes the user's queued runs.

The embedded default reaches the master home as a local (or shared) directory; the
ssh/rsync route plugs in behind the same function later.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cluster.discovery import DROPPING
from cluster.home import Home
from cluster.queuefiles import QueueFile, RunSpec
from cluster.transport import LocalTransport

log = logging.getLogger("cluster.push")


def push_tree(home: Home, tree: Path, spec: RunSpec) -> Path:
    """Mirror ``tree`` into the user's directory and leave the dropping; return the target."""
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    target = home.users / spec.ref / spec.tree
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tree.resolve()
    # The mirror is the transport's: an exact copy, extra files deleted (rsync --delete).
    LocalTransport(source.parent).fetch_tree(source.name, target)
    dropping = target / DROPPING
    tmp = target / f".{DROPPING}.{os.getpid()}.tmp"
    tmp.write_text(spec.line() + "\n", encoding="utf-8")
    os.replace(tmp, dropping)
    log.info("queueing %s (tree %s -> %s)", spec.line(), source, target)
    return target


def abort_user(home: Home, user: str) -> int:
    """Remove every queued run of ``user`` at priority 0; return how many were removed."""
    queue = QueueFile(home.queue(0), home.queue_lock(0))
    removed = 0
    for spec in queue.read():
        if spec.kind == "user" and spec.ref == user and queue.remove(spec):
            removed += 1
    return removed
