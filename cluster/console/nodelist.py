"""The status snapshot's nodes list, made from the files of ``nodes/`` and the live files.

Every name with a ``.up``, ``.down``, ``.status`` or ``.caps`` file (:data:`NODE_FILES`)
in ``nodes/`` is a node, and so is every node a running run's live file names.  A node's
``last_heard`` is its ``.up`` mtime; one not heard from for ``node_down_after`` seconds is
down since ``last_heard + node_down_after``.  :func:`list_nodes` lists the folder (one stat
per node); :func:`node_list` makes the entries and says for which span of ``now`` they hold,
so :class:`cluster.console.status.StatusReader` reuses a list until a node's down state
flips.  Pure code: the caches are the reader's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


#: The files of nodes/ that tell of a node (cluster.master.daemon.monitor, clusteradmin).
NODE_FILES = ("up", "status", "caps", "down")


@dataclass(frozen=True)
class NodeFiles:
    """What nodes/ says of one node, and its snapshot entry made of that alone."""

    has: frozenset[str]  # which of NODE_FILES exist
    last_heard: float | None  # .up's mtime
    status: str
    caps: str
    down: str | None  # the .down file's text, None if the node is not disabled
    base: JSON = field(default_factory=dict)


Listing = dict[str, NodeFiles]


NO_FILES = NodeFiles(frozenset(), None, "", "", None)


@dataclass(frozen=True)
class Made:
    """A nodes list and what it was made of (:meth:`cluster.console.status.StatusReader._nodes`)."""

    listing: Listing
    lives: tuple[object, ...]
    after: float
    valid_from: float  # the list holds for ``now`` in [valid_from, valid_until)
    valid_until: float
    nodes: list[JSON]


def list_nodes(folder: str) -> dict[str, tuple[frozenset[str], float | None, int | None]]:
    """Each node named by a file of ``folder`` (nodes/): which of its files exist and its
    heartbeat time in s and ns (one stat per node)."""
    kinds: dict[str, set[str]] = {}
    ups: dict[str, os.DirEntry[str]] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        name, dot, ext = entry.name.rpartition(".")
        if not dot or ext not in NODE_FILES or entry.name.startswith("."):
            continue
        kinds.setdefault(name, set()).add(ext)
        if ext == "up":
            ups[name] = entry
    found: dict[str, tuple[frozenset[str], float | None, int | None]] = {}
    for name, exts in kinds.items():
        mtime: float | None = None
        mtime_ns: int | None = None
        up = ups.get(name)
        if up is not None:
            try:
                st = up.stat()
                mtime, mtime_ns = st.st_mtime, st.st_mtime_ns
            except FileNotFoundError:
                pass
        found[name] = (frozenset(exts), mtime, mtime_ns)
    return found


def node_list(listing: Listing, running: list[JSON], after: float, now: float
               ) -> tuple[list[JSON], float, float]:
    """The snapshot's nodes, and the span of ``now`` in which no node's down state
    changes.  Each node's entry is a copy of its listing's ``base`` with the run's facts
    and the down state filled in (a copy of a small dict is the cheap part)."""
    in_run: dict[str, tuple[str, JSON]] = {}
    for live in running:
        for name, facts in (live.get("nodes") or {}).items():
            if isinstance(facts, dict):
                in_run.setdefault(name, (str(live.get("run")), facts))
    valid_from, valid_until = float("-inf"), float("inf")
    nodes: list[JSON] = []
    names: Iterable[str] = listing.keys()  # sorted when listed
    if not in_run.keys() <= listing.keys():
        names = sorted(listing.keys() | in_run.keys())
    for name in names:
        files = listing.get(name)
        entry = (files.base if files is not None else base_entry(name, NO_FILES)).copy()
        last_heard = entry["last_heard"]
        joined = in_run.get(name)
        if joined is not None:
            run, facts = joined
            entry["run"] = run
            for key in ("done", "errors", "timeouts"):
                value = facts.get(key)
                entry[key] = value if type(value) is int else int(value or 0)
            if last_heard is None and isinstance(facts.get("last_seen"), int | float):
                last_heard = entry["last_heard"] = float(facts["last_seen"])
            has = files.has if files is not None else frozenset()
            if "caps" not in has:
                entry["caps"] = str(facts.get("caps", ""))
            if "status" not in has:
                entry["status"] = str(facts.get("status", ""))
        if last_heard is not None:
            flip = last_heard + after
            if now > flip:  # "not heard from for node_down_after seconds"
                entry["down_since"] = flip
                entry["down"] = True
                if flip > valid_from:
                    valid_from = flip
            else:
                entry["down"] = False
                if flip < valid_until:
                    valid_until = flip
        nodes.append(entry)
    return nodes, valid_from, valid_until


def base_entry(name: str, files: NodeFiles) -> JSON:
    """A node's entry from its files alone: not in a run, down if never heard from."""
    disabled = reason = None
    if files.down is not None:
        first, _, rest = files.down.partition("\n")
        disabled = first.strip() or "disabled"
        reason = rest.strip() or None
    return {"name": name, "caps": files.caps, "status": files.status,
            "last_heard": files.last_heard, "down_since": None, "down": True,
            "disabled": disabled, "disabled_reason": reason, "run": None, "done": 0,
            "errors": 0, "timeouts": 0}
