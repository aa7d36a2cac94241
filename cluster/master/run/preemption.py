"""preemption: the serving master's look, once a second, at the more urgent runs and at the
other runs of its own priority.

While its run is served, a master looks at the ``job[.lane].start`` of each lane
(:mod:`cluster.lanes`) of a more urgent priority and, at priority 0, of each other
priority-0 lane (a stat each; nothing more while there is none).

*More urgent runs* (docs/runoptions.md, "Preemption").  For a more urgent run that exists
it reads what the resource file reads (:func:`cluster.master.files.resources.running_facts`:
its jobs left, the nodes it can use, the nodes in it by its live file), the nodes' heartbeat
records (``nodes/*.status``: which are idle, which say they run the urgent run), and the
other less urgent runs' facts; then :mod:`cluster.master.model.preempt` says how many of its
own nodes leave and which, and the run state marks them
(:meth:`cluster.master.state.runstate.RunState.preempt`): each is told at its next call,
leaves at its next job boundary and joins the urgent run (docs/protocol.md, "Preemption at
job boundaries").  Every urgent lane is looked at, so two priority-0 runs served side by
side each get their share of a nightly run's nodes.

*Runs of the same priority* (docs/runoptions.md, "Fair share").  The runs of the other
lanes of its priority, and its own, divide the nodes they hold (and the idle ones) by their
weights (:func:`cluster.master.model.fairshare.run_share`: ``share=N``, else the user's
``user_shares`` weight, else 1); :func:`cluster.master.model.fairshare.plan` says how many of
this run's nodes go to which of them now, and they move by the same mechanics, told
``ABORT preempted: for run X (priority 0, fair share)``.  What a run can use, for this, is
one node per :data:`cluster.wire.resources.JOBS_PER_SLOT` jobs of a slot it has not finished
(left to hand out and running: a run keeps nodes for the jobs its nodes hold), one while its
job list is made, none when it is stopping.

A node sent away counts as on its way until the receiving run's live file or the node's
heartbeat shows it there, or :data:`ON_THE_WAY` passes, so one need is never answered twice;
and a node is sent to one run once (one that came back while that run goes on -- refused
there, or not needed -- stays).  An ``every_node`` run's nodes never leave it: its jobs are
pinned to them.

Off with master.conf's ``preempt = no``.  The cost while no other run exists: one stat per
lane looked at a second; while one exists, the job.starts and live files of the other lanes,
and the nodes' heartbeat statuses (a file per node) only when the live files alone say
nodes should move.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cluster.config import Config
from cluster.datatypes import parse_user_shares
from cluster.errors import ConfigError
from cluster.home import Home
from cluster.lanes import ALL_LANES, lanes_of, priority_of
from cluster.master.files import groups, nodefiles, resources
from cluster.master.model import fairshare, preempt
from cluster.master.model.placement import Placement
from cluster.master.state.runstate import RunState
from cluster.runoptions import count_in
from cluster.runtime.clock import Clock
from cluster.wire.jobstart import JobStart
from cluster.wire.resources import PriorityInfo, nodes_wanted

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
    found = count_in(words, "min_nodes")
    return default if found is None else found




def _share(start: JobStart, user_shares: dict[str, int]) -> int:
    """A run's fair-share weight from its job.start: its ``share=``, else its user's."""
    return fairshare.run_share(start.options, fairshare.owner(start.kind, start.ref),
                               user_shares)


def _can_use(cfg: Config, info: PriorityInfo) -> int:
    """The nodes a run can use in the fair share (module docstring): by its jobs not
    finished; the resource file's count while its list is made; 0 when it is stopping
    (its live file says so: no node wanted while jobs are left)."""
    if info.nodes_wanted == 0 and info.jobs_left > 0:
        return 0
    unfinished = nodes_wanted(info.jobs_left + info.jobs_running, cfg.node_slots,
                              cfg.max_nodes)
    return max(info.nodes_wanted, unfinished)


#: Each other lane's run by :func:`cluster.master.files.resources.running_facts`.
Facts = dict[int, tuple[JobStart, PriorityInfo, frozenset[str]] | None]


@dataclass
class Preemption:
    """One served run's preemption (see the module docstring).  The master calls
    :meth:`tick` at every turn; :attr:`moves` is what the live file shows.  ``lane``: the
    lane serving the run (:mod:`cluster.lanes`); -1, the default: the lane of ``priority``."""

    cfg: Config
    home: Home
    priority: int
    clock: Clock
    #: Nodes sent away: name -> (the receiving run's id, monotonic time chosen).
    sent: dict[str, tuple[str, float]] = field(default_factory=dict)
    #: Nodes ever sent to each run (by its id): never sent there twice (one that came back
    #: while it runs -- refused there, or not needed -- stays).
    sent_to: dict[str, set[str]] = field(default_factory=dict)
    moves: list[dict[str, object]] = field(default_factory=list)
    next_at: float = 0.0
    #: The lane serving the run (cluster.lanes); -1: the priority's own.
    lane: int = -1
    #: This run's fair-share weight, read from its job.start once needed.
    my_share: int | None = None
    #: The nodes' heartbeat statuses of the current look, read once needed.
    _seen: dict[str, str] | None = field(default=None, repr=False)
    #: master.conf's ``user_shares``, read once (:meth:`__post_init__`), not at every look.
    user_shares: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.lane < 0:
            self.lane = self.priority
        try:
            self.user_shares = parse_user_shares(self.cfg.user_shares)
        except ConfigError:
            self.user_shares = {}  # checked when the configuration was read

    def note(self, text: str) -> None:
        """A move, for the live file's ``moves`` (the last :data:`MOVES_SHOWN`)."""
        self.moves.append({"at": round(self.clock.time(), 3), "text": text})
        del self.moves[:-MOVES_SHOWN]

    def tick(self, state: RunState, now: float) -> list[str]:
        """At most every :data:`PREEMPT_INTERVAL`: nodes of ``state`` sent to a more urgent
        run that needs them, or to a run of its own priority short of its fair share; the
        log's notes."""
        if now < self.next_at:
            return []
        self.next_at = now + PREEMPT_INTERVAL
        if (not self.cfg.preempt or state.fatal or state.all_results_in
                or state.policy.every_node):
            return []  # an every_node run's jobs are pinned: its nodes never leave it
        urgent = [lane for lane in ALL_LANES if priority_of(lane) < self.priority
                  and self.home.job_start(lane).exists()]
        peers = [lane for lane in lanes_of(self.priority)
                 if lane != self.lane and self.home.job_start(lane).exists()]
        if not urgent and not peers:
            self.sent.clear()
            self.sent_to.clear()
            return []
        cfg, home = self.cfg, self.home
        facts: Facts = {lane: resources.running_facts(cfg, home, lane) for lane in ALL_LANES
                        if lane != self.lane}
        self._seen = None
        notes: list[str] = []
        for lane in urgent:
            notes += self._urgent(state, lane, facts, now)
        if peers:
            notes += self._fair(state, peers, facts, now)
        return notes

    # -------------------------------------------------------------- what a look reads
    def _statuses(self) -> dict[str, str]:
        """The fresh heartbeat statuses, name -> status (a file per node, read once a look)."""
        if self._seen is None:
            fresh = 2 * self.cfg.heartbeat_interval + 5.0
            self._seen = {name: status for name, (age, status) in
                          nodefiles.nodes_seen(self.home, self.clock.time()).items()
                          if age <= fresh}
        return self._seen

    def _held(self, state: RunState, run: str, in_live: frozenset[str], statuses: bool,
              now: float) -> tuple[set[str], set[str]]:
        """The nodes in run ``run`` (by its live file, and with ``statuses`` by their
        heartbeats too) and those on their way to it (marked here, or sent within
        :data:`ON_THE_WAY`)."""
        there = set(in_live) if not statuses else set(in_live) | {
            name for name, status in self._statuses().items()
            if status.startswith(f"running run {run} ")}
        self.sent = {name: (to, at) for name, (to, at) in self.sent.items()
                     if name not in there and now - at < ON_THE_WAY}
        coming = {n.name for n in state.moving() if n.moving_to.startswith(f"run {run} ")}
        coming |= {name for name, (to, _) in self.sent.items() if to == run}
        return there, coming - there

    def _idle(self, state: RunState, statuses: bool, busy: set[str]) -> int:
        """Nodes up and in no run (0 without ``statuses``), not counting ``busy`` ones."""
        if not statuses:
            return 0
        mine = {n.name for n in state.live_nodes()}
        return sum(1 for name, status in self._statuses().items()
                   if status == "idle" and name not in busy and name not in mine)

    def _send(self, state: RunState, start: JobStart, count: int, target: str,
              now: float) -> list[str]:
        """Up to ``count`` of ``state``'s movable nodes marked to leave for ``start``'s run
        (never one its placement refuses, nor one sent there before); the names marked."""
        candidates = state.movable()
        where = Placement.of_words(list(start.options)) if start.options else Placement()
        if where.restricted:
            known = groups.all_groups(self.home)
            candidates = [n for n in candidates if where.may_take(n.name, known)]
        been = self.sent_to.setdefault(start.id, set())
        names = preempt.choose((preempt.Candidate(n.name, len(n.held), n.slots)
                                for n in candidates if n.name not in been), count)
        marked = state.preempt(names, target)
        for name in marked:
            self.sent[name] = (start.id, now)
            been.add(name)
        return marked

    # ------------------------------------------------------------ a more urgent run
    def _urgent(self, state: RunState, lane: int, facts: Facts, now: float) -> list[str]:
        found = facts.get(lane)
        if found is None:
            return []
        start, info, in_live = found
        q = priority_of(lane)
        own = preempt.Donor(self.priority, state.remaining, len(state.movable()),
                            state.options.min_nodes)
        others = [preempt.Donor(priority_of(other_lane), o_info.jobs_left, o_info.nodes,
                                _min_nodes(o_start.options, self.cfg.min_nodes))
                  for other_lane, other in facts.items()
                  if other is not None and priority_of(other_lane) > q
                  for o_start, o_info, _ in (other,)]
        # Nodes seen there and idle ones only lower the need: the statuses are read (a
        # file per node) only when the live file alone says nodes should move.
        for statuses in (False, True):
            there, coming = self._held(state, start.id, in_live, statuses, now)
            idle = self._idle(state, statuses, coming)
            need = preempt.Urgent(q, start.id, info.jobs_left, len(there), info.nodes_wanted)
            count = preempt.how_many(need, own, others, idle, len(coming))
            if count <= 0:
                return []
        target = f"run {start.id} (priority {q})"
        marked = self._send(state, start, count, target, now)
        if not marked:
            return []
        return [f"run {state.run_id}: {len(marked)} node(s) sent to the more urgent "
                f"{target}: {', '.join(marked)} ({need.nodes} there, {len(coming)} on "
                f"their way, {idle} idle, it can use {need.wanted})"]

    # ------------------------------------------------------- runs of its own priority
    def _fair(self, state: RunState, peers: list[int], facts: Facts,
              now: float) -> list[str]:
        cfg, user_shares = self.cfg, self.user_shares
        if self.my_share is None:
            mine = resources.running_facts(cfg, self.home, self.lane)
            if mine is None:
                return []
            self.my_share = state.options.share or _share(mine[0], user_shares)
        # Its own run by its state, fresher than its live file: the jobs not finished, the
        # nodes in it that are not leaving.
        holds = sum(1 for n in state.live_nodes() if not n.moving_to)
        me = fairshare.FairRun(state.run_id, self.my_share,
                               nodes_wanted(state.remaining, cfg.node_slots, cfg.max_nodes),
                               holds, state.options.min_nodes)
        others = [(lane, found) for lane in peers
                  if (found := facts.get(lane)) is not None and found[0].id != me.run]
        for statuses in (False, True):
            runs, held = [me], {}
            for _, (start, info, in_live) in others:
                there, coming = self._held(state, start.id, in_live, statuses, now)
                held[start.id] = (len(there), len(coming))
                runs.append(fairshare.FairRun(
                    start.id, _share(start, user_shares), _can_use(cfg, info),
                    len(there) + len(coming), _min_nodes(start.options, cfg.min_nodes)))
            busy = {name for name, (to, _) in self.sent.items()}
            idle = self._idle(state, statuses, busy)
            plan = fairshare.plan(runs, idle)
            if not any(give == me.run for give, _ in plan):
                return []
        wanted = fairshare.targets(sum(r.holds for r in runs) + idle, runs)
        notes = []
        for lane, (start, _, _) in others:
            count = plan.get((me.run, start.id), 0)
            if count <= 0:
                continue
            target = f"run {start.id} (priority {priority_of(lane)}, fair share)"
            marked = self._send(state, start, count, target, now)
            if marked:
                in_run, on_way = held[start.id]
                notes.append(
                    f"run {state.run_id}: {len(marked)} node(s) sent to {target}: "
                    f"{', '.join(marked)} (weights {me.share} here, "
                    f"{_share(start, user_shares)} there; targets {wanted[me.run]} here, "
                    f"{wanted[start.id]} there; {in_run} there, {on_way} on their way, "
                    f"{idle} idle)")
        return notes
