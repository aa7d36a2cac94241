"""The resource file: what the master tells provisioners and ephemeral nodes
(docs/provisioning.md, "The resource file").

CL-MW (seed 004) keeps a *resource file* that says whether the master is alive, whether its
computation runs or is finished, how many workers it wants and how to start one.  This is
that file's format: a JSON object, written by the master (:mod:`cluster.master.files.resources`)
and read by ephemeral nodes and the provisioner.  It never holds a secret.  The fields are
described in docs/provisioning.md ("The resource file").

* :class:`Resources` and its parts: the model, frozen;
* :func:`nodes_wanted`: the one rule turning jobs left into nodes wanted;
* :func:`format_resources`: the model as the file's text;
* :func:`read_resources` / :func:`parse_resources`: the file's text as the model, every field
  checked; a bad field raises :class:`ResourceFileError` (a ``ValueError``) naming the field
  and what was expected.  A reader also learns whether the file is *stale*: older than
  :data:`STALE_INTERVALS` x the rewrite interval, which a reader takes for the master's
  death.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.defaults import PRIORITIES
from cluster.wire.jsonfields import JsonFields

#: The format this module writes and the only one it reads.
FORMAT = 1
#: A node is worth starting for at least this many jobs per slot it brings.
JOBS_PER_SLOT = 20
#: A file not rewritten for this many intervals is stale: its master is taken for dead.
STALE_INTERVALS = 3
IDLE, RUNNING, FINISHED = "idle", "running", "finished"
#: A priority's computation status: no run yet; a run served or waiting; its last run ended.
STATUSES = (IDLE, RUNNING, FINISHED)
#: Ports are checked against this, as the configuration does.
MAX_PORT = 65535


class ResourceFileError(ValueError):
    """The resource file's text is not a resource file of :data:`FORMAT`; the message names
    the field and what was expected."""


def nodes_wanted(jobs_left: int, node_slots: int, max_nodes: int, *,
                 starting: bool = False) -> int:
    """The nodes worth starting for ``jobs_left`` jobs, at ``node_slots`` slots a node.

    ``min(max_nodes, ceil(jobs_left / (node_slots * JOBS_PER_SLOT))))``: one node per
    ``JOBS_PER_SLOT`` jobs of each of its slots, at least one while any job is left, none
    when none is, never more than ``max_nodes`` (0: none ever).  ``starting``: a run waits
    whose job list is not made yet (queued, or being set up): it counts as one node's worth,
    so a node can be on its way while the list is made.  Integer arithmetic: exact for any
    count.  A negative count, or ``node_slots`` < 1, is a ValueError naming it.
    """
    for name, value, low in (("jobs_left", jobs_left, 0), ("node_slots", node_slots, 1),
                             ("max_nodes", max_nodes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"nodes_wanted: {name} {value!r}: expected an integer >= {low}")
    per_node = node_slots * JOBS_PER_SLOT
    wanted = -(-jobs_left // per_node)  # ceil, exactly, for counts beyond a float's range
    if starting:
        wanted = max(wanted, 1)
    return min(max_nodes, wanted)


@dataclass(frozen=True)
class MasterInfo:
    """Where the master is: its host name, the address nodes reach it at, the pid of the
    process that wrote the file, the clustermaster's base port and the monitor's port."""

    host: str
    address: str
    pid: int
    base_port: int
    monitor_port: int


@dataclass(frozen=True)
class PriorityInfo:
    """One priority's computation: its status (:data:`STATUSES`), its run id (a finished
    one's last run; "" when idle, or running a run not started yet), its jobs left to hand
    out and held by nodes, its nodes connected, and the nodes it wants."""

    status: str
    run: str = ""
    jobs_left: int = 0
    jobs_running: int = 0
    nodes: int = 0
    nodes_wanted: int = 0


@dataclass(frozen=True)
class NodeLaunch:
    """How to start an ephemeral node: its argv, the slots it brings, the prefix of its
    name (``<prefix>-<job id>``) and the idle seconds after which it exits 0."""

    command: tuple[str, ...]
    slots: int
    prefix: str
    idle_exit: float


@dataclass(frozen=True)
class Resources:
    """A resource file.  ``written``: epoch seconds.  ``priorities``: by priority, every one
    of :data:`cluster.defaults.PRIORITIES`.  ``nodes_wanted``: the sum of theirs, bounded
    by ``max_nodes``.  ``stale`` is the reader's verdict (never written): the file was
    older than :data:`STALE_INTERVALS` intervals when read."""

    written: float
    master: MasterInfo
    priorities: Mapping[int, PriorityInfo]
    nodes_wanted: int
    node: NodeLaunch
    stale: bool = False

    @property
    def finished(self) -> bool:
        """Nothing runs or waits at any priority (every one idle or finished)."""
        return all(p.status != RUNNING for p in self.priorities.values())


def format_resources(resources: Resources) -> str:
    """``resources`` as the file's text: one JSON object, keys sorted within each part,
    priorities in order, a final newline.  ``stale`` is not written."""
    m, n = resources.master, resources.node
    document = {
        "format": FORMAT,
        "written": round(resources.written, 3),
        "master": {"host": m.host, "address": m.address, "pid": m.pid,
                   "base_port": m.base_port, "monitor_port": m.monitor_port},
        "priorities": {
            str(p): {"status": info.status, "run": info.run, "jobs_left": info.jobs_left,
                     "jobs_running": info.jobs_running, "nodes": info.nodes,
                     "nodes_wanted": info.nodes_wanted}
            for p, info in sorted(resources.priorities.items())},
        "nodes_wanted": resources.nodes_wanted,
        "node": {"command": list(n.command), "slots": n.slots, "prefix": n.prefix,
                 "idle_exit": n.idle_exit},
    }
    return json.dumps(document, indent=1) + "\n"


def read_resources(path: Path, now: float, interval: float) -> Resources:
    """The resource file at ``path``, checked, and stale if written more than
    :data:`STALE_INTERVALS` x ``interval`` seconds before ``now`` (epoch seconds).

    OSError when it cannot be read (FileNotFoundError: the master has not written it yet);
    :class:`ResourceFileError` naming the file and the field when its content is wrong.
    """
    data = path.read_bytes()
    return parse_resources(data, now, interval, source=str(path))


def parse_resources(data: bytes | str, now: float, interval: float,
                    source: str = "resource file") -> Resources:
    """:func:`read_resources` on the file's content ``data``; ``source`` names it in errors."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResourceFileError(f"{source}: not JSON ({exc}): expected one JSON object"
                                ) from None
    top = JsonFields.top(document, source, ResourceFileError)
    version = top.integer("format", 0)
    if version != FORMAT:
        raise ResourceFileError(f"{source}: format {version}: expected {FORMAT}")
    written = top.number("written", 0.0)
    master = top.part("master")
    master_info = MasterInfo(host=master.text("host"), address=master.text("address"),
                             pid=master.integer("pid", 1),
                             base_port=master.integer("base_port", 0, MAX_PORT),
                             monitor_port=master.integer("monitor_port", 0, MAX_PORT))
    table = top.part("priorities")
    names = {str(p) for p in PRIORITIES}
    extra = sorted(set(table.values) - names)
    if extra:
        raise ResourceFileError(f"{source}: priorities {', '.join(map(repr, extra))}: "
                                f"expected only the priorities {', '.join(sorted(names))}")
    priorities = {p: _priority(table.part(str(p))) for p in PRIORITIES}
    wanted = top.integer("nodes_wanted", 0)
    total = sum(info.nodes_wanted for info in priorities.values())
    if wanted > total:
        raise ResourceFileError(f"{source}: nodes_wanted {wanted}: expected at most the "
                                f"priorities' sum, {total}")
    node = top.part("node")
    command = node.get("command")
    if not isinstance(command, list) or not command or \
            not all(isinstance(word, str) and word for word in command):
        raise ResourceFileError(f"{source}: node.command {command!r}: expected a non-empty "
                                f"list of non-empty strings (an argv)")
    launch = NodeLaunch(command=tuple(command), slots=node.integer("slots", 1),
                        prefix=node.text("prefix", empty=False),
                        idle_exit=node.number("idle_exit", 0.0, positive=True))
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError(f"resource interval {interval!r}: expected seconds > 0")
    stale = now - written > STALE_INTERVALS * interval
    return Resources(written=written, master=master_info, priorities=priorities,
                     nodes_wanted=wanted, node=launch, stale=stale)


def _priority(fields: JsonFields) -> PriorityInfo:
    status = fields.get("status")
    if status not in STATUSES:
        raise fields.error("status", status, "one of " + ", ".join(STATUSES))
    run = fields.text("run")
    if status == IDLE and run:
        raise fields.error("run", run, "'' for an idle priority")
    if status == FINISHED and not run:
        raise fields.error("run", run, "the id of the run that finished")
    return PriorityInfo(status=status, run=run, jobs_left=fields.integer("jobs_left", 0),
                        jobs_running=fields.integer("jobs_running", 0),
                        nodes=fields.integer("nodes", 0),
                        nodes_wanted=fields.integer("nodes_wanted", 0))
