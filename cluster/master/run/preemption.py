"""preemption: the serving master's look, once a second, at the more urgent runs.

While its run is served, a master of priority 1 or 2 looks at each more urgent priority's
``job[.p].start`` (a stat each; nothing more while there is none).  For a more urgent run
that exists it reads what the resource file reads (:func:`cluster.master.files.resources.
running_facts`: its jobs left, the nodes it can use, the nodes in it by its live file),
the nodes' heartbeat records (``nodes/*.status``: which are idle, which say they run the
urgent run), and the other less urgent runs' facts; then :mod:`cluster.master.model.preempt`
says how many of its own nodes leave and which, and the run state marks them
(:meth:`cluster.master.state.runstate.RunState.preempt`): each is told at its next call,
leaves at its next job boundary and joins the urgent run (docs/protocol.md, "Preemption at
job boundaries").  A node sent away counts as on its way until the urgent run's live file
or the node's heartbeat shows it there, or :data:`ON_THE_WAY` passes, so one need is
never answered twice; and a node is sent to one urgent run once (one that came back while
that run goes on -- refused there, or not needed -- stays).  An ``every_node`` run's nodes
never leave it: its jobs are pinned to them.

Off with master.conf's ``preempt = no``.  The cost while no more urgent run exists: one
stat per more urgent priority a second; while one exists, the job.starts and live files of
the other priorities, and the nodes' heartbeat statuses (a file per node) only when the
live files alone say nodes should move.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cluster.config import Config
from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.master.files import groups, nodefiles, resources
from cluster.master.model import preempt
from cluster.master.model.placement import Placement
from cluster.master.state.runstate import RunState
from cluster.runoptions import RunOptionError, parse_count
from cluster.runtime.clock import Clock

log = logging.getLogger("cluster.master")

#: How often the serving master looks at the more urgent runs [seconds].
PREEMPT_INTERVAL = 1.0
#: How long a node sent to an urgent run counts as on its way there, when neither the
#: urgent run's live file nor its heartbeat shows it there yet [seconds]: its last jobs
#: here, its start and the first call there take a few seconds.
ON_THE_WAY = 30.0
#: The most moves the live file lists.
MOVES_SHOWN = 20


def _min_nodes(words: tuple[str, ...], default: int) -> int:
    """A run's ``min_nodes=`` among its job.start ``options``, else ``default``."""
    for word in words:
        key, _, value = word.partition("=")
        if key == "min_nodes":
            try:
                return parse_count("min_nodes", value)
            except RunOptionError:
                return default
    return default


@dataclass
class Preemption:
    """One served run's preemption (see the module docstring).  The master calls
    :meth:`tick` at every turn; :attr:`moves` is what the live file shows."""

    cfg: Config
    home: Home
    priority: int
    clock: Clock
    #: Nodes sent away: name -> (the urgent run's id, monotonic time chosen).
    sent: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Nodes ever sent to each urgent run (by its id): never sent there twice (one that
    #: came back while it runs -- refused there, or not needed -- stays).
    sent_to: dict[str, set[str]] = field(default_factory=dict)
    moves: list[dict[str, object]] = field(default_factory=list)
    next_at: float = 0.0
    #: The lane serving the run (cluster.lanes); -1: the priority's own.
    lane: int = -1

    def note(self, text: str) -> None:
        """A move, for the live file's ``moves`` (the last :data:`MOVES_SHOWN`)."""
        self.moves.append({"at": round(self.clock.time(), 3), "text": text})
        del self.moves[:-MOVES_SHOWN]

    def tick(self, state: RunState, now: float) -> list[str]:
        """At most every :data:`PREEMPT_INTERVAL`: nodes of ``state`` sent to a more urgent
        run that needs them; the log's notes."""
        if now < self.next_at:
            return []
        self.next_at = now + PREEMPT_INTERVAL
        if (not self.cfg.preempt or state.fatal or state.all_results_in
                or state.policy.every_node):
            return []  # an every_node run's jobs are pinned: its nodes never leave it
        urgent = [q for q in range(self.priority) if self.home.job_start(q).exists()]
        if not urgent:
            self.sent.clear()
            self.sent_to.clear()
            return []
        return self._look(state, urgent, now)

    def _look(self, state: RunState, urgent: list[int], now: float) -> list[str]:
        cfg, home = self.cfg, self.home
        facts = {q: resources.running_facts(cfg, home, q) for q in PRIORITIES
                 if q != self.priority}
        seen: dict[str, str] | None = None  # the nodes' heartbeat statuses, read once needed
        mine = {n.name for n in state.live_nodes()}
        for q in sorted(urgent):
            found = facts.get(q)
            if found is None:
                continue
            start, info, in_live = found
            candidates = state.movable()
            own = preempt.Donor(self.priority, state.remaining, len(candidates),
                                state.options.min_nodes)
            others = [preempt.Donor(p, o_info.jobs_left, o_info.nodes,
                                    _min_nodes(o_start.options, cfg.min_nodes))
                      for p, other in facts.items() if other is not None and p > q
                      for o_start, o_info, _ in (other,)]
            # Nodes seen there and idle ones only lower the need: the statuses are read
            # (a file per node) only when the live file alone says nodes should move.
            for look in ("live", "statuses"):
                if look == "statuses" and seen is None:
                    fresh = 2 * cfg.heartbeat_interval + 5.0
                    seen = {name: status for name, (age, status) in
                            nodefiles.nodes_seen(home, self.clock.time()).items()
                            if age <= fresh}
                there = set(in_live) if look == "live" else set(in_live) | {
                    name for name, status in (seen or {}).items()
                    if status.startswith(f"running run {start.id} ")}
                self.sent = {name: (run, at) for name, (run, at) in self.sent.items()
                             if name not in there and now - at < ON_THE_WAY}
                coming = {n.name for n in state.moving()
                          if n.moving_to.startswith(f"run {start.id} ")}
                coming |= {name for name, (run, _) in self.sent.items() if run == start.id}
                coming -= there
                idle = 0 if look == "live" else sum(
                    1 for name, status in (seen or {}).items()
                    if status == "idle" and name not in coming and name not in mine)
                need = preempt.Urgent(q, start.id, info.jobs_left, len(there),
                                      info.nodes_wanted)
                count = preempt.how_many(need, own, others, idle, len(coming))
                if count <= 0:
                    break
            if count <= 0:
                continue
            where = Placement.of_words(list(start.options)) if start.options else Placement()
            if where.restricted:
                known = groups.all_groups(home)
                candidates = [n for n in candidates if where.may_take(n.name, known)]
            been = self.sent_to.setdefault(start.id, set())
            names = preempt.choose((preempt.Candidate(n.name, len(n.held), n.slots)
                                    for n in candidates if n.name not in been), count)
            target = f"run {start.id} (priority {q})"
            marked = state.preempt(names, target)
            for name in marked:
                self.sent[name] = (start.id, now)
                been.add(name)
            if marked:
                return [f"run {state.run_id}: {len(marked)} node(s) sent to the more urgent "
                        f"{target}: {', '.join(marked)} ({need.nodes} there, "
                        f"{len(coming)} on their way, {idle} idle, it can use "
                        f"{need.wanted})"]
        return []
