"""The master's view of one run, as pure logic: which node holds which job, what is done.

No sockets, files or clocks here: the master feeds each parsed node request and the current
time to :meth:`RunState.handle` and gets back the reply plus the results that arrived for the
first time (which it must journal before sending the reply); :meth:`RunState.tick` expires the
leases of nodes that went silent.

The rules are seed 001's "normal course of events":

* a wrong job id gets ABORT, and nothing is remembered of the node (it may come back);
* unsuitable caps get ABORT and the node is culled for this run;
* a node's first contact gets BUILD; ``busy`` keeps its lease alive without giving it work;
* ``failure <0`` aborts the whole run; ``failure >0`` drops the node and puts its unfinished
  jobs back at the front of the list (during UPLOAD it means "try again": UPLOAD once more);
* nodes may join at any time; when every job has a result, each node that ran jobs is told
  UPLOAD, and after its upload it is told ABORT;
* a node not heard from for ``heartbeat_timeout`` seconds is dead: its unfinished jobs go to
  the front of the list.  If it comes back it is treated as a new node.

Results stream back with every request.  The first result for a job wins; later ones (from a
node presumed dead, or from a speculative copy in the tail) are counted as duplicates.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cluster import protocol
from cluster.protocol import Reply, Request
from cluster.records import Job, JobResult

Suitability = Callable[[str], tuple[bool, str]]


class NodeState(enum.StrEnum):
    BUILDING = "building"    # told BUILD, not yet reported ready
    READY = "ready"          # built; takes jobs
    UPLOADING = "uploading"  # told UPLOAD
    DONE = "done"            # uploaded its logs
    GONE = "gone"            # dead, dropped or left; its unfinished jobs were put back


@dataclass
class NodeInfo:
    """What the master knows of one node in this run."""

    name: str
    state: NodeState
    last_seen: float
    caps: str = ""
    slots: int = 1
    status: str = ""
    held: dict[str, None] = field(default_factory=dict)  # jobs handed out, no result yet (ordered)
    working_since: float | None = None  # when it first got jobs: its rate is measured from then
    ran_jobs: bool = False      # it was given jobs, so it has logs to upload
    told_abort: bool = False    # it has been told the run is over
    results: int = 0            # first results it delivered


@dataclass(frozen=True)
class Outcome:
    """What :meth:`RunState.handle` decided for one request."""

    reply: Reply
    new_results: tuple[JobResult, ...] = ()
    notes: tuple[str, ...] = ()  # things worth a log line (bad results, node dropped, ...)


@dataclass(frozen=True)
class Settings:
    heartbeat_timeout: float = 180.0
    batch_per_slot: int = 2
    batch_seconds: float = 1.0
    speculate_tail: bool = True
    upload_timeout: float = 300.0


def _always_suitable(caps: str) -> tuple[bool, str]:
    return True, ""


class RunState:
    """Scheduling state of one run.  Callers use handle(), tick() and the read-only queries."""

    def __init__(self, run_id: str, jobs: Iterable[Job], now: float,
                 settings: Settings | None = None,
                 suitable: Suitability = _always_suitable,
                 done: Iterable[JobResult] = ()) -> None:
        self.run_id = run_id
        self.settings = settings or Settings()
        self.suitable = suitable
        self.jobs: dict[str, Job] = {}
        for job in jobs:
            self.jobs.setdefault(job.name, job)
        self.results: dict[str, JobResult] = {}
        for r in done:
            if r.name in self.jobs:
                self.results.setdefault(r.name, r)
        self.pending: deque[str] = deque(n for n in self.jobs if n not in self.results)
        # in_flight: job -> number of nodes holding it; ordered by first hand-out (oldest first).
        self.in_flight: dict[str, int] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.culled: dict[str, str] = {}
        self.lost: list[str] = []          # "name (reason)" for the report
        self.duplicates = 0
        self.unknown_results = 0
        self.fatal: str = ""               # set when a node reported failure < 0
        self.started = now
        self.all_results_at: float | None = now if self.all_results_in else None

    # ---------------------------------------------------------------- queries
    @property
    def all_results_in(self) -> bool:
        return len(self.results) == len(self.jobs)

    @property
    def remaining(self) -> int:
        return len(self.jobs) - len(self.results)

    def finished(self, now: float) -> bool:
        """True when the run is over: aborted, or every result in and every upload done."""
        if self.fatal:
            return True
        if not self.all_results_in:
            return False
        waiting = [n for n in self.nodes.values()
                   if n.ran_jobs and n.state not in (NodeState.DONE, NodeState.GONE)]
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
        return (f"{done}/{total} done - {pct}% - {len(self.live_nodes())} nodes"
                + (f" - aborted: {self.fatal}" if self.fatal else ""))

    # ---------------------------------------------------------------- the protocol step
    def handle(self, req: Request, now: float) -> Outcome:
        """Decide the reply to one node request (seed 001's normal course of events)."""
        if req.job_id != self.run_id:
            # Wrong id: the node runs an old job (or none).  Remember nothing.
            return Outcome(Reply(protocol.ABORT, reason=f"wrong job id, running {self.run_id}"))
        name = req.node
        if name in self.culled:
            return Outcome(Reply(protocol.ABORT, reason=f"unsuitable: {self.culled[name]}"))
        notes: list[str] = []
        node = self.nodes.get(name)
        if node is None or node.state is NodeState.GONE:
            ok, why = self.suitable(req.caps)
            if not ok:
                self.culled[name] = why
                notes.append(f"node {name} culled for this run: {why}")
                return Outcome(Reply(protocol.ABORT, reason=f"unsuitable: {why}"),
                               notes=tuple(notes))
            if node is not None:
                notes.append(f"node {name} rejoined the run")
            node = NodeInfo(name, NodeState.BUILDING, now)
            self.nodes[name] = node
            fresh = True
        else:
            fresh = False
        node.last_seen = now
        node.caps = req.caps or node.caps
        node.slots = max(req.slots, 1)
        node.status = req.status
        notes.extend(f"node {name}: bad result: {problem}" for problem in req.problems)
        new = self._record(node, req.results, notes)

        def out(reply: Reply) -> Outcome:
            if reply.verb == protocol.ABORT:
                node.told_abort = True
            return Outcome(reply, tuple(new), tuple(notes))

        if self.fatal:
            return out(Reply(protocol.ABORT, reason=f"run aborted: {self.fatal}"))
        if req.failure < 0:
            self.fatal = (f"node {name} failed with code {req.failure}: "
                          f"{req.failure_reason}").rstrip()
            notes.append(self.fatal)
            self._drop(node, f"failure {req.failure}", notes)
            return out(Reply(protocol.ABORT, reason="run aborted"))
        if req.failure > 0:
            if node.state is NodeState.UPLOADING:
                return out(Reply(protocol.UPLOAD))  # seed 000: upload failed -> try again
            self._drop(node, f"failure {req.failure} {req.failure_reason}".rstrip(), notes)
            return out(Reply(protocol.ABORT, reason=f"dropped after failure {req.failure}"))
        if req.leaving:
            self._drop(node, "left the run", notes)
            return out(Reply(protocol.ABORT, reason="goodbye"))
        if fresh:
            return out(Reply(protocol.BUILD))  # BUILDING: first contact
        if req.busy:
            return out(Reply(protocol.CONTINUE))
        if node.state is NodeState.BUILDING:
            node.state = NodeState.READY  # BUILDING -> READY: built, not busy any more
        elif node.state is NodeState.UPLOADING:
            node.state = NodeState.DONE  # UPLOADING -> DONE: connected in without busy
        if req.pending == 0 and req.running == 0 and node.held:
            # The node holds nothing, yet we think it holds jobs: it lost them (restarted,
            # or never received our reply).  Put them back.
            self._requeue(node, front=True)
            notes.append(f"node {name} lost jobs it was given; put back in the list")
        if not self.all_results_in:
            batch = self._batch(node, req, now)
            if batch:
                if node.state is NodeState.DONE:
                    node.state = NodeState.READY  # DONE -> READY: work came back after a death
                node.ran_jobs = True
                return out(Reply(protocol.JOBS, tuple(self.jobs[n].line for n in batch)))
            return out(Reply(protocol.CONTINUE))
        if node.ran_jobs and node.state is NodeState.READY:
            node.state = NodeState.UPLOADING  # READY -> UPLOADING
            return out(Reply(protocol.UPLOAD))
        if node.state is NodeState.UPLOADING:
            return out(Reply(protocol.CONTINUE))
        return out(Reply(protocol.ABORT, reason="run complete"))

    def tick(self, now: float) -> list[str]:
        """Expire the leases of silent nodes; return log notes."""
        notes: list[str] = []
        limit = self.settings.heartbeat_timeout
        for node in list(self.nodes.values()):
            if node.state is NodeState.GONE or node.told_abort:
                continue
            if now - node.last_seen > limit:
                self._drop(node, f"not heard from for {now - node.last_seen:.0f} s", notes)
        return notes

    # ---------------------------------------------------------------- internals
    def _record(self, node: NodeInfo, results: Iterable[JobResult],
                notes: list[str]) -> list[JobResult]:
        new: list[JobResult] = []
        for r in results:
            if r.name not in self.jobs:
                self.unknown_results += 1
                notes.append(f"node {node.name} sent a result for unknown test {r.name!r}")
                continue
            node.held.pop(r.name, None)
            holders = self.in_flight.get(r.name)
            if holders is not None:
                if holders <= 1:
                    del self.in_flight[r.name]
                else:
                    self.in_flight[r.name] = holders - 1
            if r.name in self.results:
                self.duplicates += 1  # first result wins; later ones are only counted
                continue
            self.results[r.name] = r
            node.results += 1
            new.append(r)
        if new and self.all_results_in and self.all_results_at is None:
            self.all_results_at = node.last_seen
        return new

    def _drop(self, node: NodeInfo, reason: str, notes: list[str]) -> None:
        held = len([n for n in node.held if n not in self.results])
        self._requeue(node, front=True)
        node.state = NodeState.GONE
        self.lost.append(f"{node.name} ({reason}; {held} unfinished jobs put back)")
        notes.append(f"node {node.name} dropped: {reason}; {held} unfinished jobs put back")

    def _requeue(self, node: NodeInfo, front: bool) -> None:
        back: list[str] = []
        for name in node.held:
            holders = self.in_flight.get(name, 0)
            if holders <= 1:
                self.in_flight.pop(name, None)
                if name not in self.results:
                    back.append(name)
            else:
                # Someone else still holds a copy (tail speculation); no need to re-send.
                self.in_flight[name] = holders - 1
        node.held.clear()
        if front:
            self.pending.extendleft(reversed(back))
        else:
            self.pending.extend(back)

    def _batch(self, node: NodeInfo, req: Request, now: float) -> list[str]:
        """Jobs to hand ``node`` now; empty if it holds enough or nothing is left.

        A node is kept holding ``batch_per_slot`` jobs per slot, or, once its rate is
        known, about ``batch_seconds`` of work at that rate if that is more: a node that
        runs a thousand tiny jobs a second then calls a few times a second, not a thousand.
        It asks for more before it runs dry.  Near the end the batch shrinks to the node's
        fair share of what is left (by slots), so the last jobs spread over all nodes
        instead of piling on one.
        """
        capacity = node.slots * self.settings.batch_per_slot
        if node.working_since is None:
            node.working_since = now
        elif now - node.working_since >= 0.5 and node.results:
            rate = node.results / (now - node.working_since)
            capacity = max(capacity, math.ceil(rate * self.settings.batch_seconds))
        want = capacity - (req.pending + req.running)
        if want <= 0:
            return []
        pending = self.pending
        results = self.results
        while pending and pending[0] in results:
            pending.popleft()
        if pending:
            total_slots = sum(n.slots for n in self.nodes.values()
                              if n.state in (NodeState.READY, NodeState.DONE))
            # Its fair share of all unfinished work, less what it already holds.
            share = math.ceil(self.remaining * node.slots / max(total_slots, node.slots))
            size = max(1, min(want, share - len(node.held)))
            batch: list[str] = []
            held = node.held
            in_flight = self.in_flight
            while pending and len(batch) < size:
                name = pending.popleft()
                if name in results or name in held:
                    continue
                batch.append(name)
                held[name] = None
                in_flight[name] = in_flight.get(name, 0) + 1
            if batch:
                return batch
        if not self.settings.speculate_tail or req.pending > 0 or req.running >= node.slots:
            return []
        # Tail: nothing left to hand out and this node has idle slots.  Give it copies of
        # jobs that have been out longest on other nodes; the first result wins.
        free = node.slots - req.running
        batch = []
        for name, holders in self.in_flight.items():
            if holders == 1 and name not in node.held and name not in self.results:
                batch.append(name)
                if len(batch) >= free:
                    break
        for name in batch:
            node.held[name] = None
            self.in_flight[name] += 1
        return batch
