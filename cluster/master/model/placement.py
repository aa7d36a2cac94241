"""Where a run's jobs may go, and how many at once (the placement options of
docs/runoptions.md, section 4), as pure
decisions: :class:`RunPolicy` is what :class:`~cluster.master.state.runstate.RunState` asks.

* **groups / nodes / exclude**: a node may take the run when ``RunOptions.placed`` says
  so, from its name (``nodes=``: only those named; ``clusteradmin repro`` pins its run to
  one node so) and the groups it is in (``groups/<name>``,
  :mod:`cluster.master.files.groups`, reread by the master every ``pid_check_interval``).
  A node that may not is refused at its first call with a
  final ABORT (``unsuitable: ...``): it is not a failed node, and its clusterpull goes on to
  other runs.  The monitor does not offer the run to it in the first place
  (:func:`offered`).  A run that no node up may take waits, and says why
  (:func:`waiting_reason`: ``no node of group win64 is up``).
* **every_node**: the run's job list is each job of build.py's list once per node
  (:func:`expand_every_node`: ``<test>@<node>``, the node's name in the ``.tab`` row), made
  when the run starts for the nodes up, enabled and placed then; a job is handed only to
  the node its name ends with (:meth:`RunPolicy.pinned_to`).  A pinned node that is not in
  the run (never came, left, or was dropped) has its jobs settled as not run naming it
  (:meth:`cluster.master.state.runstate.RunState.settle_absent`, called by the master's placement
  tick), so the run's end waits only for nodes that are up.
* **max_worker_instances / max_cluster_instances**: :meth:`RunPolicy.cap` bounds a node's
  batch by what it and the whole cluster hold of this run.
* **exclusive**: a node runs one run at a time (:mod:`cluster.node.pull` starts run.py only
  when none runs, and a run.py serves one run until it is told ABORT), so a node that takes
  an exclusive run's jobs runs nothing of another run meanwhile, and does not take it while
  it serves another.  The master has nothing more to decide; docs/runoptions.md says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from cluster.config import DEFAULTS
from cluster.home import Home
from cluster.records import TEMP
from cluster.runoptions import RunOptions

#: Between a test's id and its node's name in an every_node run's job names.
PIN = "@"


@dataclass(frozen=True)
class Placement:
    """A run's ``groups=``, ``exclude=`` and ``nodes=``; all empty: every node."""

    groups: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @classmethod
    def of(cls, options: RunOptions) -> Placement:
        return cls(options.groups, options.exclude, options.nodes)

    @classmethod
    def of_words(cls, words: Iterable[str]) -> Placement:
        """From a run's option words (job.start's ``options``); a bad word places nowhere
        differently from the queue's check, which refused it before."""
        return cls.of(RunOptions.of(words, DEFAULTS))

    @property
    def restricted(self) -> bool:
        return bool(self.groups or self.exclude or self.nodes)

    def refusal(self, node: str, groups: Mapping[str, Iterable[str]]) -> str:
        """Why ``node`` may not take the run ('' when it may), ``groups`` being every group
        and its nodes."""
        if node in self.exclude:
            return f"node {node} is excluded from this run (exclude={','.join(self.exclude)})"
        if self.nodes and node not in self.nodes:
            return f"node {node} is not one of this run's nodes (nodes={','.join(self.nodes)})"
        if self.groups and not any(node in groups.get(g, ()) for g in self.groups):
            return (f"node {node} is in none of this run's groups "
                    f"(groups={','.join(self.groups)})")
        return ""

    def may_take(self, node: str, groups: Mapping[str, Iterable[str]]) -> bool:
        return not self.refusal(node, groups)


def waiting_reason(placement: Placement, up: Iterable[str],
                   groups: Mapping[str, Iterable[str]]) -> str:
    """Why no node serves a run placed by ``placement`` when the nodes ``up`` are up
    (heard from, not disabled): '' when one of them may take it, else e.g. ``no node of
    group win64 is up``."""
    if any(placement.may_take(node, groups) for node in up):
        return ""
    if placement.nodes:
        reason = (f"node {placement.nodes[0]} is not up" if len(placement.nodes) == 1
                  else f"none of nodes {', '.join(placement.nodes)} is up")
        if placement.groups or placement.exclude:
            reason += " (or the run's groups= or exclude= refuse it)"
        return reason
    if placement.groups:
        which = (f"group {placement.groups[0]}" if len(placement.groups) == 1
                 else f"groups {', '.join(placement.groups)}")
        reason = f"no node of {which} is up"
        if placement.exclude:
            reason += f" but those excluded (exclude={','.join(placement.exclude)})"
        return reason
    if placement.exclude:
        return f"no node is up but those excluded (exclude={','.join(placement.exclude)})"
    return "no node is up"


def offered(jobs: Iterable[tuple[int, str]], node: str,
            placements: Mapping[str, Placement],
            groups: Mapping[str, Iterable[str]]) -> list[tuple[int, str]]:
    """The waiting runs ``jobs`` (priority, id) the monitor tells ``node`` of: those whose
    placement (``placements`` by run id; a run not in it places anywhere) it may take."""
    return [(p, run_id) for p, run_id in jobs
            if run_id not in placements or placements[run_id].may_take(node, groups)]


def nodes_up(home: Home, within: float, now: float, disabled: Iterable[str]) -> list[str]:
    """The nodes heard from within ``within`` seconds of wall time ``now`` (their
    ``nodes/<name>.up`` mtime) and not ``disabled``, sorted."""
    off = set(disabled)
    found: list[str] = []
    try:
        with os.scandir(home.nodes) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or not name.endswith(".up"):
                    continue
                try:
                    mtime = entry.stat().st_mtime
                except FileNotFoundError:
                    continue
                if now - mtime <= within and name[:-3] not in off:
                    found.append(name[:-3])
    except FileNotFoundError:
        pass
    return sorted(found)


def pinned_name(test: str, node: str) -> str:
    """The name of ``test``'s copy for ``node`` in an every_node run."""
    return f"{test}{PIN}{node}"


def expand_every_node(lines: Iterable[str], nodes: Iterable[str]) -> Iterator[str]:
    """An every_node run's job lines: each of ``lines`` (``<test> <logfile> true ;
    <command>``, newline-ended) once per node of ``nodes``, named ``<test>@<node>``, its
    files in ``__temp__`` renamed alike (the node reads ``<name>.log``/``.out``/``.md5``)."""
    names = list(nodes)
    for line in lines:
        test, sep, rest = line.partition(" ")
        if not sep:
            continue
        for node in names:
            name = pinned_name(test, node)
            yield f"{name} {rest.replace(f'{TEMP}/{test}.', f'{TEMP}/{name}.')}"


@dataclass
class RunPolicy:
    """One run's placement and caps, as :class:`~cluster.master.state.runstate.RunState` asks them.

    ``groups`` is every group and its nodes (:meth:`set_groups` rereads them); ``pins``
    (every_node runs) maps each node to the indexes of its jobs in the run's job list."""

    placement: Placement = field(default_factory=Placement)
    node_cap: int | None = None
    cluster_cap: int | None = None
    every_node: bool = False
    groups: Mapping[str, Iterable[str]] = field(default_factory=dict)
    pins: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, options: RunOptions) -> RunPolicy:
        return cls(Placement.of(options), options.max_worker_instances,
                   options.max_cluster_instances, options.every_node)

    def set_groups(self, groups: Mapping[str, Iterable[str]]) -> None:
        self.groups = {g: frozenset(nodes) for g, nodes in groups.items()}

    def pin(self, names: Iterable[str]) -> None:
        """Learn the pins of an every_node run from its job names (``<test>@<node>``)."""
        if not self.every_node:
            return
        pins: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            node = name.rpartition(PIN)[2]
            if node:
                pins.setdefault(node, []).append(i)
        self.pins = pins

    def refusal(self, node: str) -> str:
        """Why ``node`` may not take this run's jobs ('' when it may)."""
        why = self.placement.refusal(node, self.groups)
        if why or not self.every_node:
            return why
        if node not in self.pins:
            return (f"this every_node run has no job for node {node} (it was not up, "
                    "enabled and placed when the run started)")
        return ""

    def pinned_to(self, node: str) -> list[int]:
        """The jobs of an every_node run that only ``node`` may take."""
        return self.pins.get(node, [])

    def cap(self, want: int, node_holds: int, cluster_holds: int) -> int:
        """``want`` jobs more for a node holding ``node_holds`` of this run's jobs while the
        cluster holds ``cluster_holds`` of them, bounded by the caps (never below 0)."""
        if self.node_cap is not None:
            want = min(want, self.node_cap - node_holds)
        if self.cluster_cap is not None:
            want = min(want, self.cluster_cap - cluster_holds)
        return max(want, 0)

    @property
    def capped(self) -> bool:
        return self.node_cap is not None or self.cluster_cap is not None
