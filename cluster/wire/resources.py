"""The master's resource file (docs/provisioning.md, "The resource file"): read it.

A minimal reader with the interface the provisioner uses, until the resource file's own
module lands (issue 24's resource-file part replaces this file whole): ``read_resources``
and ``nodes_wanted`` keep their signatures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

#: A node is worth starting for at least this many jobs a slot.
JOBS_PER_SLOT = 20
#: A file older than this many resource intervals means the master is dead.
STALE_INTERVALS = 3


class ResourceFileError(ValueError):
    """The resource file's text is not a resource file; the message says what is wrong."""


@dataclass(frozen=True)
class NodeLaunch:
    """How to start an ephemeral node: the file's ``node`` object."""

    command: tuple[str, ...]
    slots: int
    prefix: str
    idle_exit: float


@dataclass(frozen=True)
class Resources:
    """The resource file as read at time ``now``."""

    written: float
    nodes_wanted: int
    node: NodeLaunch
    stale: bool
    priorities: dict[str, dict[str, object]] = field(default_factory=dict)


def nodes_wanted(jobs_left: int, node_slots: int, max_nodes: int) -> int:
    """The nodes worth starting for ``jobs_left`` jobs: 0 when none are left."""
    if jobs_left <= 0 or max_nodes <= 0:
        return 0
    return min(max_nodes, max(1, math.ceil(jobs_left / (node_slots * JOBS_PER_SLOT))))


def read_resources(path: Path, now: float, interval: float) -> Resources:
    """The resource file ``path``; stale when written more than ``STALE_INTERVALS`` x
    ``interval`` seconds before ``now``.  OSError when it cannot be read, ResourceFileError
    when its content is wrong."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        node = data["node"]
        written = float(data["written"])
        return Resources(written=written, nodes_wanted=int(data["nodes_wanted"]),
                         node=NodeLaunch(tuple(str(w) for w in node["command"]), int(node["slots"]),
                                        str(node["prefix"]), float(node["idle_exit"])),
                         stale=now - written > STALE_INTERVALS * interval,
                         priorities=dict(data.get("priorities", {})))
    except (ValueError, KeyError, TypeError) as exc:
        raise ResourceFileError(f"resource file {path}: expected the JSON object of "
                                f"docs/provisioning.md, got an error: {exc!r}") from exc
