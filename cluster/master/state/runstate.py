"""The master's view of one run, as pure logic: which node holds which job, what is done.

No sockets, files or clocks here: the master feeds each parsed node request and the current
time to :meth:`RunState.handle` and gets back the reply plus the results that arrived for the
first time (which it must journal before sending the reply); :meth:`RunState.tick` expires the
leases of nodes that went silent.

A request goes through three steps, each its own module (seed 001's "normal course of
events" is spread over them):

1. admission (:mod:`cluster.master.state.admission`): is this node, its process and this
   request let in -- a wrong job id, a culled or disabled node, a second live process under
   a name in use, a ``failure <0`` from a node not building are refused with ABORT;
2. recording (:mod:`cluster.master.state.recording`): the results it carries, taken once
   each and only from a node that was handed their jobs (leases), duplicates counted, a
   sweep's invalid tries put back (:meth:`RunState.retry`);
3. the reply (:mod:`cluster.master.state.handout`), by the run's state and the node's: BUILD,
   JOBS (the batch, tail copies), CONTINUE, UPLOAD, ABORT.

They share the run's state and its common moves (:mod:`cluster.master.state.runcore`: a node
leaving the run, its jobs put back) and the node records (:mod:`cluster.master.state.nodeinfo`).

More rules:

* nodes may join at any time; the run ends when every built node still alive has uploaded
  (or ``upload_timeout`` after the last result);
* a node not heard from for ``heartbeat_timeout`` seconds is dead (:meth:`RunState.tick`):
  its unfinished jobs go to the front of the list.  If it comes back it is treated as a new
  node;
* in a run with ``no_reschedule`` (docs/runoptions.md, section 3; :attr:`RunState.options`)
  the unfinished jobs of a node that leaves the run (dead, failed, restarted, disabled) are
  never handed out again: each gets the result :data:`~cluster.records.ERROR_LOST` from that
  node (journaled like a node's: :meth:`RunState.take_made_results`), and the tail makes no
  copies.

A node that built the run says which of job.start's ``programs`` its build did not make
(``unbuilt``); :mod:`cluster.master.model.unbuilt` judges it.  Such a node is given no
job until a verdict: when another node's build made the program the node is dropped as
failure 1 (it "cannot run jobs": its jobs go to the others); when no node's build
made it, no live node is still building and the run is older than ``heartbeat_timeout``
(nodes that had not called by then are not waited for), the jobs calling it are marked not
run
(:attr:`RunState.unbuilt`), which settles them like results, so the run ends with the other
products' results; no node is dropped for it.

Only jobs in the front list are looked at for a sweep's retried task, one dict lookup each
while any job was retried: the usual batch (a slice of the list) does not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cluster.master.model.unbuilt import HELD
from cluster.master.state.admission import Admission
from cluster.master.state.handout import Handout
from cluster.master.state.nodeinfo import NodeInfo, NodeState
from cluster.master.state.recording import Recording
from cluster.master.state.runcore import Outcome
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request

#: The shortest pause of the master (:meth:`RunState.pause`) given back to the nodes [s].
PAUSE_FORGIVEN = 1.0


class RunState(Admission, Recording, Handout):
    """Scheduling state of one run.  Callers use handle(), tick() and the read-only queries.

    Its state and constructor are :class:`~cluster.master.state.runcore.RunCore`'s; the
    steps of :meth:`handle` are its bases'."""

    # ---------------------------------------------------------------- queries
    def not_run_names(self) -> frozenset[str]:
        """The tests not run because no node's build made a program they call."""
        return self.unbuilt.names(self.jobs)

    def in_flight(self) -> dict[str, int]:
        """Unfinished jobs held by a node -> how many nodes hold them, in list order (a
        walk over every job: for tests and diagnostics, not for the serving path)."""
        names, holders = self.jobs.names, self.holders
        return {names[i]: h for i, h in enumerate(holders) if h}

    @property
    def pending(self) -> list[str]:
        """The jobs waiting to be handed out, in the order they will be (a copy)."""
        offsets, names = self.results.offsets, self.jobs.names
        marks, index = self.not_run, self.jobs.index
        return ([n for n in self.front if n not in self.results and not marks[index[n]]]
                + [names[i] for i in range(self.cursor, len(names))
                   if offsets[i] < 0 and not marks[i]])

    def finished(self, now: float) -> bool:
        """True when the run is over: aborted, or every result in and every upload done."""
        if self.fatal:
            return True
        if not self.all_results_in or self.hold_end:
            return False
        # Every node that built the run and is alive uploads its logs (seed 001: "when all
        # nodes complete && uploaded -> abort"); one still building is told ABORT instead.
        waiting = [n for n in self.nodes.values()
                   if n.state in (NodeState.READY, NodeState.UPLOADING)]
        if not waiting:
            return True
        assert self.all_results_at is not None
        return now - self.all_results_at >= self.settings.upload_timeout

    def everyone_told(self) -> bool:
        """True when every live node has been told ABORT (the master may then exit)."""
        return all(n.told_abort or n.state is NodeState.GONE for n in self.nodes.values())

    def live_nodes(self) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.state is not NodeState.GONE]

    def status_line(self) -> str:
        done = len(self.results)
        total = len(self.jobs)
        pct = 100 * done // total if total else 100
        # Jobs held for a check of their cached results (cluster.master.cache.reuseverify) are
        # marked as the not-run ones are, but they are not "not run".
        held = self.unbuilt.by_program.get(HELD, 0)
        not_run = self.unbuilt.count - held
        return (f"{done}/{total} done - {pct}% - {len(self.live_nodes())} nodes"
                + (f" - {not_run} not run" if not_run else "")
                + (f" - {held} reused, being checked" if held else "")
                + (f" - aborted: {self.fatal}" if self.fatal else ""))

    def movable(self) -> list[NodeInfo]:
        """The nodes that could be sent to a more urgent run (preemption): in the run,
        built, not disabled, not leaving already."""
        return [n for n in self.nodes.values()
                if n.state is NodeState.READY and not n.moving_to
                and n.name not in self.disabled]

    def preempt(self, names: Iterable[str], target: str) -> list[str]:
        """Nodes ``names`` are to leave for ``target`` (``run X (priority 0)``) at their
        next job boundary: each is told at its next call (:meth:`Handout._move`).  Returns
        the names marked (those of :meth:`movable`)."""
        marked = []
        for name in names:
            node = self.nodes.get(name)
            if node is None or node not in self.movable():
                continue
            node.moving_to = target
            marked.append(name)
            self.move_events.append(f"node {name} chosen to leave for {target}")
        return marked

    def moving(self) -> list[NodeInfo]:
        """The nodes told (or about to be told) to leave that have not left yet."""
        return [n for n in self.nodes.values()
                if n.moving_to and n.state is not NodeState.GONE]

    def take_move_events(self) -> list[str]:
        """The preemption's events since the last call (for the audit trail)."""
        events, self.move_events = self.move_events, []
        return events

    def set_disabled(self, names: Iterable[str]) -> None:
        """The nodes disabled now (the master rereads ``nodes/*.down`` every
        ``pid_check_interval``).  A node in it is told ABORT at its next request."""
        self.disabled = frozenset(names)

    # ---------------------------------------------------------------- the protocol step
    def handle(self, req: Request, now: float, session: str = "", peer: str = "") -> Outcome:
        """Decide the reply to one node request (seed 001's normal course of events).

        ``session`` is the sending process's (the session part of its verified nonce) and
        ``peer`` its address.  A node is a process, not a name: a known name calling from a
        new session is a new node (its old session's jobs go back, it is told BUILD), except
        that a second *live* process of another instance under a name in use is refused
        (:meth:`_same_name`).
        """
        notes: list[str] = []
        admitted = self._admit(req, now, session, peer, notes)  # admission.py
        if isinstance(admitted, Outcome):
            return admitted  # refused: nothing of the request is taken
        node, req, fresh = admitted
        journal, carried, refused = self._take_results(node, req, notes)  # recording.py
        reply = self._reply(node, req, now, fresh, notes)  # handout.py
        return self._outcome(node, reply, journal, notes, carried, refused)

    def _outcome(self, node: NodeInfo, reply: Reply, journal: bytes, notes: list[str],
                 carried: int, refused: int) -> Outcome:
        """The Outcome of a request let in: ``reply`` to ``node`` (told ABORT is
        remembered), the journal lines of its new results (``journal``) and of those the
        state made while deciding (a dropped node's jobs reported lost), the ``notes``, and
        how many results it ``carried`` and how many were ``refused``."""
        if node.withdraw:
            # The copies whose result came from another node (docs/results.md, "Withdrawn
            # copies"); ABORT stops every job anyway.
            if reply.verb != protocol.ABORT:
                reply = dataclasses.replace(reply, withdraw=tuple(node.withdraw))
            node.withdraw = []
        if reply.verb == protocol.ABORT and not (node.told_move
                                                 and node.state is not NodeState.GONE):
            # A node told to move still sends its last results: it is not done with yet.
            node.told_abort = True
        made = self.take_made_results()  # a dropped node's jobs reported lost
        if made and self.checks is not None and self.checks.samples:
            self.checks.on_results(self, made, notes)  # a sample lost: unsure
            made += self.take_made_results()
        return Outcome(reply, journal + made if made else journal, tuple(notes),
                       carried, refused)

    # ---------------------------------------------------------------- the run's course
    def pause(self, seconds: float) -> None:
        """The master served nothing for ``seconds`` (it was judging a sweep's results):
        no node's silence counts that time, so none is dropped for the master's own pause.
        A pause shorter than :data:`PAUSE_FORGIVEN` is not worth the walk over the nodes:
        it is a small part of ``heartbeat_timeout``."""
        if seconds < PAUSE_FORGIVEN:
            return
        for node in self.nodes.values():
            if node.state is not NodeState.GONE:
                node.last_seen += seconds

    def tick(self, now: float) -> list[str]:
        """Expire the leases of silent nodes; return log notes."""
        notes: list[str] = []
        limit = self.settings.heartbeat_timeout
        for node in list(self.nodes.values()):
            if node.state is NodeState.GONE or node.told_abort:
                continue
            if now - node.last_seen > limit:
                self._drop(node, f"not heard from for {now - node.last_seen:.0f} s", notes)
        if self.made_results and self.checks is not None and self.checks.samples:
            # A sample reported lost with its node (no_reschedule) settles as unsure.
            self.checks.on_results(self, bytes(self.made_results), notes)
        return notes

    def adopt_nodes(self, other: RunState) -> None:
        """A confirm phase's state (docs/results.md, "Differences confirmed, indeterminate
        tests named") takes over the nodes of the run's first state ``other`` that have not
        left it, as they are (built, building), holding nothing of its jobs; its culled and
        disabled nodes too.  A node adopted keeps its session, so it is not told BUILD
        again, and the withdrawals its next reply was to carry (a copy of the first
        phase's jobs may still run on it)."""
        for name, node in other.nodes.items():
            if node.state is NodeState.GONE or node.told_abort:
                continue
            copy = dataclasses.replace(node, held={}, working_since=None, capacity=0,
                                       last_batch_at=None, results=0, errors=0,
                                       timeouts=0, lacks=frozenset(),
                                       withdraw=list(node.withdraw))
            self.nodes[name] = copy
            self.slots_known += copy.slots
        self.culled.update(other.culled)
        self.disabled = other.disabled

    def prefer_others(self, first: dict[str, str]) -> None:
        """Job ``test`` is not handed to node ``first[test]`` while a live ready node that
        is not it is there (a confirm phase runs a difference again on another node where
        there is one; :meth:`_avoid`).  Every job not yet handed out moves to the front
        list, the only place that is looked at."""
        index, numbers = self.jobs.index, self.node_numbers
        for test, name in first.items():
            i = index.get(test)
            if i is not None:
                self.tried.setdefault(i, set()).add(numbers.setdefault(name, len(numbers)))
        names, offsets = self.jobs.names, self.results.offsets
        self.front.extend(names[i] for i in range(self.cursor, len(names)) if offsets[i] < 0)
        self.cursor = len(names)

    def settle_rest(self, why: str, now: float) -> int:
        """Every job without a result is not run (a confirm phase given up: ``why``, the
        pseudo-node its jobs are marked under), so the run ends with what it has; a result
        that still comes counts.  Returns how many jobs were settled so."""
        offsets, marks = self.results.offsets, self.not_run
        indexes = [i for i in range(len(self.jobs)) if offsets[i] < 0 and not marks[i]]
        if indexes:
            self.unbuilt.mark_absent(why, indexes)
        if self.all_results_in and self.all_results_at is None:
            self.all_results_at = now
        return len(indexes)

    def settle_absent(self, name: str, why: str, now: float) -> list[str]:
        """Every job of an every_node run pinned to node ``name`` that has no result and
        that no node holds is not run (``why``: the node is not up, or left the run): the
        run's end does not wait for a node that is gone.  Returns the log notes."""
        indexes = [i for i in self.policy.pinned_to(name)
                   if self.results.offsets[i] < 0 and not self.holders[i]
                   and not self.not_run[i]]
        if not indexes:
            return []
        self.unbuilt.mark_absent(name, indexes)
        if self.all_results_in and self.all_results_at is None:
            self.all_results_at = now  # settled by this: uploads are due now
        return [f"every_node: node {name} {why}: its {len(indexes)} job(s) are not run"]
