"""A node's files in the master home, ``nodes/``: its heartbeat record and its disabled flag.

Each heartbeat touches ``nodes/<name>.up``, whose mtime is the node's lease (ARTIFEX.md
§2.3); ``.status`` and ``.caps`` are rewritten atomically.  ``nodes/<name>.down`` marks a
node an administrator disabled (clusteradmin's ``node disable``; the Perl's ``$m.down``).
The heartbeat listener writes these, the clustermaster and the console read them.
"""

from __future__ import annotations

import os

from cluster.home import Home
from cluster.runtime import fsutil
from cluster.runtime.clock import SystemClock
from cluster.wire.heartbeat import Heartbeat


def record_heartbeat(home: Home, hb: Heartbeat) -> None:
    """Touch ``nodes/<node>.up`` (its mtime is the lease) and store status/caps if sent."""
    home.nodes.mkdir(parents=True, exist_ok=True)
    # Atomic, so dashboards and the master never read a torn file; no fsync: rewritten at
    # every heartbeat, and harmless to lose.
    if hb.status is not None:
        fsutil.atomic_write(home.nodes / f"{hb.node}.status", hb.status + "\n", fsync=False)
    if hb.caps is not None:
        fsutil.atomic_write(home.nodes / f"{hb.node}.caps", hb.caps + "\n", fsync=False)
    # Touch last, so a node that is "up" already has its status and caps on disk.
    (home.nodes / f"{hb.node}.up").touch()


#: The suffix of a disabled node's file in ``nodes/`` (:meth:`Home.node_down`).
DOWN_SUFFIX = ".down"


def is_disabled(home: Home, node: str) -> bool:
    """Whether an admin disabled ``node`` (its ``nodes/<name>.down`` exists): one stat."""
    return home.node_down(node).exists()


def disabled_nodes(home: Home) -> frozenset[str]:
    """The names of every disabled node: one scan of ``nodes/`` (no file is read)."""
    try:
        with os.scandir(home.nodes) as entries:
            return frozenset(e.name[:-len(DOWN_SUFFIX)] for e in entries
                             if e.name.endswith(DOWN_SUFFIX) and not e.name.startswith("."))
    except FileNotFoundError:
        return frozenset()


def nodes_seen(home: Home, now: float | None = None) -> dict[str, tuple[float, str]]:
    """``{name: (seconds since its last heartbeat, status text)}`` for every node with a
    ``.up`` file.  ``now`` is wall-clock time (mtimes are); default: the system clock's."""
    now = SystemClock().time() if now is None else now
    seen: dict[str, tuple[float, str]] = {}
    try:
        entries = list(os.scandir(home.nodes))
    except FileNotFoundError:
        return seen
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".up"):
            continue
        name = entry.name[:-3]
        try:
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        try:
            status = (home.nodes / f"{name}.status").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            status = ""
        seen[name] = (max(0.0, now - mtime), status)
    return seen


def forget_node(home: Home, node: str) -> bool:
    """Remove ``nodes/<node>.up``, ``.status`` and ``.caps`` (never ``.down``: an admin's
    flag): a node that has ended -- an ephemeral node whose batch job is gone -- leaves
    the lists at once instead of showing as up until its lease runs out.  Whether it had
    any."""
    had = False
    for suffix in (".up", ".status", ".caps"):
        try:
            (home.nodes / f"{node}{suffix}").unlink()
            had = True
        except FileNotFoundError:
            pass
    return had
