"""The third step of a node request: the reply, chosen by the run's state and the node's.

Seed 001's "normal course of events", for a node let in (:mod:`~cluster.master.state.admission`)
whose results are taken (:mod:`~cluster.master.state.recording`):

* a run aborted (``failure <0`` from a building node) tells everyone ABORT;
* a disabled node in the run (``nodes/<name>.down``) gets ABORT ``node <name> is disabled``:
  its jobs go back to the others, and it leaves without counting as lost (it did not fail);
* ``failure <0`` aborts the whole run; ``failure >0`` drops the node and puts its unfinished
  jobs back at the front of the list (during UPLOAD it means "try again": UPLOAD once more);
  a node leaving is dropped the same way;
* a node's first contact gets BUILD; ``busy`` keeps its lease alive without giving it work;
  a node says it ``built`` this run to become ready (its build noted, the result cache's
  results for that build taken);
* a ready node gets JOBS (:meth:`Handout._batch`) or, with nothing for it now, CONTINUE; a
  node whose build lacks programs gets no job until a verdict (:meth:`Handout._judge`);
* when every job has a result, each node that built the run is told UPLOAD (seed 001:
  "else if node not uploaded -> upload", so the build log of a node that ran no job is kept
  too), and after its upload it is told ABORT (while a confirm phase may follow,
  ``hold_end``: CONTINUE).

The batch: a node is kept holding ``batch_per_slot`` jobs per slot, or about
``batch_seconds`` of work at its measured rate (:meth:`Handout._capacity`), its fair share
near the end (:meth:`Handout._share`), first from the jobs put back (the front list: a
sweep's retried job not to a node that tried it, :meth:`Handout._avoid`), then the next of
the list as one slice.  With nothing left to hand out, an idle node gets copies of the jobs
expected to finish last elsewhere (:meth:`Handout._tail_copies`, planned by
:class:`~cluster.master.model.tailplan.TailPlan`); a ``no_reschedule`` run makes none.
"""

from __future__ import annotations

import math
from array import array

from cluster.master.cache.reuseverify import RECORD_FILE, ReuseChecks
from cluster.master.state.admission import disabled_reason
from cluster.master.state.nodeinfo import NodeInfo, NodeState
from cluster.master.state.runcore import RunCore
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request

#: The most jobs a node is kept holding, however fast it is.
MAX_BATCH = 65536


class Handout(RunCore):
    """The reply each node is given, and the jobs handed out in it."""

    def _reply(self, node: NodeInfo, req: Request, now: float, fresh: bool,
               notes: list[str]) -> Reply:
        """The reply to ``req`` from ``node`` (``fresh``: it joined the run with it), its
        results already taken; the node's state moves with it.  ``notes`` gets what is
        worth a log line (a node dropped, a build's verdict)."""
        if self.fatal:
            return Reply(protocol.ABORT, reason=f"{protocol.RUN_ABORTED}: {self.fatal}")
        if node.name in self.disabled:
            # Its results are in (recorded); its other jobs go back to the others.  Not a
            # failure: it does not count against max_failed_nodes.
            self._drop(node, "disabled", notes, lost=False)
            return Reply(protocol.ABORT, reason=disabled_reason(node.name))
        if req.failure or req.leaving:
            return self._leaving(node, req, notes)
        if fresh:
            return Reply(protocol.BUILD)  # BUILDING: first contact
        if req.busy:
            return Reply(protocol.CONTINUE)
        if node.state is NodeState.BUILDING:
            if req.built != self.run_id:
                # Neither building nor built for this run (it lost the BUILD reply, or is
                # not what it was): never ready merely because ``busy`` is missing.
                return Reply(protocol.BUILD)
            node.state = NodeState.READY  # BUILDING -> READY: it said it built this run
            self._note_build(node, req.unbuilt, notes)
            self._reuse_results(node, req.digests, now, notes, req.keychanges)
        elif node.state is NodeState.UPLOADING:
            node.state = NodeState.DONE  # UPLOADING -> DONE: connected in without busy
        if req.pending == 0 and req.running == 0 and node.held:
            # The node holds nothing, yet we think it holds jobs: it lost them (restarted,
            # or never received our reply).  Put them back.
            self._requeue(node, front=True)
            notes.append(f"node {node.name} lost jobs it was given; put back in the list")
        if node.moving_to:
            return self._move(node, req, notes)
        if node.lacks and not self.all_results_in:
            verdict = self._judge(node, now, notes)
            if verdict is not None:
                return verdict
        if not self.all_results_in:
            return self._jobs(node, req, now)
        return self._end_reply(node)

    def _leaving(self, node: NodeInfo, req: Request, notes: list[str]) -> Reply:
        """The reply to ``node``, which failed (``req.failure``, not 0) or leaves."""
        if req.failure < 0:
            self.fatal = (f"node {node.name} failed with code {req.failure}: "
                          f"{req.failure_reason}").rstrip()
            notes.append(self.fatal)
            self._drop(node, f"failure {req.failure}", notes)
            return Reply(protocol.ABORT, reason=protocol.RUN_ABORTED)
        if req.failure > 0:
            if node.state is NodeState.UPLOADING:
                return Reply(protocol.UPLOAD)  # seed 000: upload failed -> try again
            self._drop(node, f"failure {req.failure} {req.failure_reason}".rstrip(), notes)
            return Reply(protocol.ABORT,
                         reason=f"{protocol.ABORT_DROPPED} after failure {req.failure}")
        if node.moving_to or req.moving:
            # Moved, not failed (a master that took the run over since knows it from the
            # node's ``moving`` header only).
            target = node.moving_to or req.moving.removeprefix(
                f"{protocol.ABORT_PREEMPTED}: for ")
            self._drop(node, f"moved to {target}", notes, lost=False)
            self.move_events.append(f"node {node.name} left for {target}")
        else:
            self._drop(node, "left the run", notes)
        return Reply(protocol.ABORT, reason=protocol.ABORT_GOODBYE)

    def _move(self, node: NodeInfo, req: Request, notes: list[str]) -> Reply:
        """The reply to ``node``, preempted (:meth:`RunState.preempt`): told once to leave
        at its next job boundary (ABORT ``preempted: for <run>``), its unstarted jobs put
        back at the front of the list at once (:meth:`_return_unstarted`); then CONTINUE
        while it finishes the jobs it runs and sends their results, until its leaving call
        (:meth:`_leaving`).  A later call with jobs waiting, or none running, is told
        again."""
        told = Reply(protocol.ABORT, reason=f"{protocol.ABORT_PREEMPTED}: for {node.moving_to}")
        if node.told_move:
            # Told already.  A node that still has jobs waiting, or none running, did not
            # get that reply (a lost connection): told again (the node takes it twice
            # alike); those jobs went back already, so one may run twice, the first result
            # kept, as with a tail copy.
            return told if req.pending or not req.running else Reply(protocol.CONTINUE)
        node.told_move = True
        back = self._return_unstarted(node, req.pending)
        what = (f"node {node.name} told to leave for {node.moving_to} at its next job "
                f"boundary: {back} unstarted jobs put back, {len(node.held)} to finish")
        notes.append(what)
        self.move_events.append(what)
        return told

    def _return_unstarted(self, node: NodeInfo, pending: int) -> int:
        """The ``pending`` jobs ``node`` has not started, back at the front of the list; how
        many had no result and went back.

        A node runs its jobs in the order it was handed them and its queue is what it has
        not started, so those are the newest ``pending`` of its ``held`` (handed out in
        order, results taken out).  Jobs handed in a reply the node never read are newest
        too: the jobs put back are never jobs it started (nothing runs twice), and those
        it dropped but are still held here go back when it leaves (:meth:`_drop`).  Even in
        a ``no_reschedule`` run they go back: they never ran."""
        if pending <= 0 or not node.held:
            return 0
        held, holders, offsets = node.held, self.holders, self.results.offsets
        newest = list(held)[-pending:]
        back: list[str] = []
        for name in newest:
            i = held.pop(name)
            count = holders[i]
            if count > 1:
                holders[i] = count - 1
                continue
            if count == 1:
                holders[i] = 0
                self.running -= 1
            if offsets[i] < 0:
                back.append(name)
        self.front.extendleft(reversed(back))
        return len(back)

    def _jobs(self, node: NodeInfo, req: Request, now: float) -> Reply:
        """JOBS for ready ``node`` while jobs are unsettled, leased to its process; or
        CONTINUE when there is nothing for it now."""
        batch = self._batch(node, req, now)
        if not batch:
            return Reply(protocol.CONTINUE)
        if node.state is NodeState.DONE:
            node.state = NodeState.READY  # DONE -> READY: work came back after a death
        self.leases.grant(node.name, node.session, batch)
        return Reply(protocol.JOBS, tuple(self.jobs.lines(batch)))

    def _end_reply(self, node: NodeInfo) -> Reply:
        """The reply to ``node`` once every job is settled: UPLOAD its logs once, then
        ABORT (CONTINUE while it uploads, or while a confirm phase may follow)."""
        if self.hold_end:
            return Reply(protocol.CONTINUE)  # a confirm phase may follow: no upload yet
        if node.state is NodeState.READY:
            node.state = NodeState.UPLOADING  # READY -> UPLOADING
            return Reply(protocol.UPLOAD)
        if node.state is NodeState.UPLOADING:
            return Reply(protocol.CONTINUE)
        return Reply(protocol.ABORT, reason=protocol.ABORT_RUN_COMPLETE)

    # ---------------------------------------------------------------- a node's build
    def _note_build(self, node: NodeInfo, lacks: tuple[str, ...], notes: list[str]) -> None:
        """``node`` says it built the run, and its build made none of ``lacks``."""
        node.lacks = frozenset(lacks)
        self.unbuilt.note_build(node.name, node.lacks)
        if lacks:
            notes.append(f"node {node.name}'s build made no {', '.join(lacks)}: it is given "
                         "no job calling them")

    def _reuse_results(self, node: NodeInfo, digests: tuple[tuple[str, str], ...],
                       now: float, notes: list[str],
                       keychanges: protocol.KeyChanges = ()) -> None:
        """``node`` built the run as ``digests``: the jobs without a result whose key for
        that build the result cache holds (:meth:`cluster.master.cache.reuse.RunReuse.resolve`:
        one pass over the jobs, once per distinct build) are taken from it.  With checks
        (``reuse.verify``, :mod:`cluster.master.cache.reuseverify`) a sample of them runs and
        the rest are held until it agrees; without, they are recorded at once.  Recorded,
        a result's machine is ``cache:<node>@<run>`` of the node and run that made it,
        journaled like results (:meth:`take_made_results`).  A job a node holds
        meanwhile is left to it.  ``keychanges``: what the node said moved in its
        programs' keys, kept for the report."""
        if self.reuse is None or not digests or self.policy.every_node:
            return
        self.reuse.note_keychanges(node.name, keychanges)
        indexes, values = self.reuse.resolve(node.name, digests, self.results.offsets,
                                             self.not_run)
        if not indexes:
            return
        holders, names = self.holders, self.jobs.names
        samples = self.checks.samples if self.checks is not None else {}
        kept = [(i, v) for i, v in zip(indexes, values, strict=True)
                if not holders[i] and names[i] not in samples]
        if not kept:
            return
        if self.reuse.verify > 0:
            if self.checks is None:
                self.checks = ReuseChecks(self.reuse.cache, self.reuse.withdrawn, self.run_id,
                                          self.reuse.builds_path.with_name(RECORD_FILE),
                                          self.reuse.verify)
            self.checks.take(self, digests, [i for i, _ in kept], [v for _, v in kept],
                             notes)
            return
        taken = self.record_cached([i for i, _ in kept], [v for _, v in kept])
        if self.all_results_in and self.all_results_at is None:
            self.all_results_at = now
        notes.append(f"node {node.name}'s build: {taken} results taken from the "
                     "result cache (their keys are unchanged)")

    def _judge(self, node: NodeInfo, now: float, notes: list[str]) -> Reply | None:
        """For ``node``, whose build lacks programs: the reply when it gets no jobs now
        (ABORT: dropped, its own fault; CONTINUE: waiting for the nodes still building),
        or None to go on (its programs are decided "not built": the jobs calling them are
        not run; see :mod:`cluster.master.model.unbuilt`).  A walk over the nodes, not the jobs."""
        # Nodes that may still build the program: those building now, and, for the first
        # heartbeat_timeout of the run, those not heard from yet (a live node of the
        # cluster calls within that time; one that comes later is not waited for).
        building = (now - self.started < self.settings.heartbeat_timeout
                    or any(n.state is NodeState.BUILDING and n is not node
                           for n in self.nodes.values()))
        verdict = self.unbuilt.judge(node.name, building)
        if verdict.fault:
            why = f"cannot run jobs: {verdict.fault}"
            self._drop(node, f"failure 1 {why}", notes)
            return Reply(protocol.ABORT, reason=f"{protocol.ABORT_DROPPED} after failure 1: {why}")
        if verdict.wait:
            return Reply(protocol.CONTINUE)
        if verdict.decide:
            notes.extend(self.unbuilt.decide(verdict.decide, self.jobs, self.results.offsets,
                                             self.holders))
            if self.all_results_in and self.all_results_at is None:
                self.all_results_at = now  # settled by this: uploads are due now
        return None

    # ---------------------------------------------------------------- the batch
    def _batch(self, node: NodeInfo, req: Request, now: float) -> list[int]:
        """Jobs to hand ``node`` now (their indexes in the job list, now in its ``held`` and
        counted in ``holders``); empty if it holds enough or nothing is left.

        A node is kept holding ``batch_per_slot`` jobs per slot, or, once its rate is
        known, about ``batch_seconds`` of work at that rate if that is more: a node that
        runs a thousand tiny jobs a second then calls a few times a second, not a thousand.
        It asks for more before it runs dry.  Near the end the batch shrinks to the node's
        fair share of what is left (by slots), so the last jobs spread over all nodes
        instead of piling on one.
        """
        want = self._capacity(node, req, now) - (req.pending + req.running)
        policy = self.policy
        if policy.capped:
            # max_worker_instances, max_cluster_instances: what this node and every node
            # hold of the run (a walk over the nodes, only for a run with a cap).
            want = policy.cap(want, max(len(node.held), req.pending + req.running),
                              sum(len(n.held) for n in self.nodes.values()
                                  if n.state is not NodeState.GONE))
        if want <= 0:
            return []
        if policy.every_node:
            return self._pinned_batch(node, want, now)
        if self._has_pending():
            size = self._share(node, want)
            batch: list[int] = []
            if self.front:
                self._from_front(node, size, batch)
            if len(batch) < size:
                self._from_cursor(node, size, batch)
            if batch:
                node.last_batch_at = now
                return batch
        return self._tail_copies(node, req, want, now)

    def _capacity(self, node: NodeInfo, req: Request, now: float) -> int:
        """How many jobs ``node`` is kept holding now (also its ``capacity``, and its
        ``working_since`` from its first batch)."""
        base = node.slots * self.settings.batch_per_slot
        capacity = max(base, node.capacity)
        if node.working_since is None:
            node.working_since = now
        elif now - node.working_since >= 0.5 and node.results:
            rate = node.results / (now - node.working_since)
            capacity = max(capacity, math.ceil(rate * self.settings.batch_seconds))
        if node.last_batch_at is not None and req.pending < node.slots:
            # The measured rate undercounts a node that was starved (small batches, a
            # round trip each), which would keep it starved.  So also grow a node's
            # batches while it comes back for more well within batch_seconds, and shrink
            # them when it comes back only much later.
            gap = now - node.last_batch_at
            if gap < self.settings.batch_seconds / 2:
                capacity = min(max(base, node.capacity) * 2, MAX_BATCH)
            elif gap > self.settings.batch_seconds * 2:
                capacity = max(base, node.capacity // 2)
        node.capacity = capacity
        return capacity

    def _share(self, node: NodeInfo, want: int) -> int:
        """How many of the ``want`` jobs ``node`` is given: its fair share of all unfinished
        work, less what it already holds.  The slots of every known node bound those of
        the nodes taking work from above, so the exact sum (a walk over all nodes) is only
        needed near the end of the run."""
        remaining, held = self.remaining, len(node.held)
        bound = math.ceil(remaining * node.slots / max(self.slots_known, node.slots))
        if bound - held >= want:
            return want
        total_slots = sum(n.slots for n in self.nodes.values()
                          if n.state in (NodeState.READY, NodeState.DONE))
        share = math.ceil(remaining * node.slots / max(total_slots, node.slots))
        return max(1, min(want, share - held))

    def _from_front(self, node: NodeInfo, size: int, batch: list[int]) -> None:
        """Fill ``batch`` up to ``size`` from the jobs put back (the front list), for
        ``node``: not those with a result, held by it or not run, nor a retried job it
        tried while another node may take it (left first in line for the others)."""
        held, holders, offsets = node.held, self.holders, self.results.offsets
        front, index, tried = self.front, self.jobs.index, self.tried
        avoided: list[str] = []  # retried jobs this node is not to take now
        while front and len(batch) < size:
            name = front.popleft()
            i = index[name]
            if offsets[i] >= 0 or name in held or self.not_run[i]:
                continue
            if tried and i in tried and self._avoid(node, tried[i]):
                avoided.append(name)
                continue
            batch.append(i)
            held[name] = i
            if not holders[i]:
                self.running += 1
            holders[i] += 1
        if avoided:
            front.extendleft(reversed(avoided))  # first in line for the others

    def _from_cursor(self, node: NodeInfo, size: int, batch: list[int]) -> None:
        """Fill ``batch`` up to ``size`` with the next jobs of the list from the cursor:
        never handed out before, so nobody holds them."""
        held, holders, offsets = node.held, self.holders, self.results.offsets
        names = self.jobs.names
        cursor, total = self.cursor, len(names)
        end = min(total, cursor + size - len(batch))
        marks = self.not_run
        if (offsets[cursor:end].count(-1) == end - cursor
                and (not self.unbuilt.count
                     or marks[cursor:end].count(0) == end - cursor)):
            # The usual batch: the next jobs of the list, none with a result yet
            # (only a journal taken over gives results ahead of the cursor) and
            # none not run (only after a program was not built).  Taken
            # as one slice; the node's held jobs and the holder counts filled in C:
            # no Python step per job.
            taken = range(cursor, end)
            batch.extend(taken)
            held.update(zip(names[cursor:end], taken, strict=True))
            holders[cursor:end] = array("H", [1]) * len(taken)
            self.running += len(taken)
            cursor = end
        else:
            while cursor < total and len(batch) < size:
                if offsets[cursor] < 0 and not marks[cursor]:
                    batch.append(cursor)
                    held[names[cursor]] = cursor
                    holders[cursor] = 1
                    self.running += 1
                cursor += 1
        self.cursor = cursor

    def _tail_copies(self, node: NodeInfo, req: Request, want: int, now: float) -> list[int]:
        """Tail: nothing left to hand out and ``node`` has idle slots.  Copies of the jobs
        expected to finish last elsewhere (deep in the queue of a slow or silent node) when
        a copy here should finish sooner; the first result wins.  None in a
        ``no_reschedule`` run (its jobs are never run twice) or without ``speculate_tail``."""
        if (not self.settings.speculate_tail or self.options.no_reschedule
                or req.pending > 0 or req.running >= node.slots):
            return []
        free = node.slots - req.running
        if self.policy.capped:
            free = min(free, want)  # copies count against the caps too
        skip: set[int] = set()
        if self.tried:
            # A node does not copy a task whose try it made was not valid (sweeps).
            number = self.node_numbers.get(node.name, -1)
            skip = {i for i, numbers in self.tried.items() if number in numbers}
        batch = self.tail_plan.copies(node, free, now, self.nodes.values(), self.holders,
                                      self.jobs.names, skip)
        if batch:
            self.copied.update(batch)  # their first result withdraws the other copy
        return batch

    def _has_pending(self) -> bool:
        """Drop finished jobs from the head of the list; True if a job is left to hand out."""
        front = self.front
        offsets = self.results.offsets
        index = self.jobs.index
        marks = self.not_run
        while front and (offsets[index[front[0]]] >= 0 or marks[index[front[0]]]):
            front.popleft()
        if front:
            return True
        cursor, total = self.cursor, len(offsets)
        while cursor < total and (offsets[cursor] >= 0 or marks[cursor]):
            cursor += 1
        self.cursor = cursor
        return cursor < total

    def _pinned_batch(self, node: NodeInfo, want: int, now: float) -> list[int]:
        """An every_node run's batch for ``node``: up to ``want`` of the jobs pinned to it
        that have no result, are not marked not run and it does not hold; never another
        node's (nor a tail copy: each job has one node)."""
        offsets, marks, holders, held = self.results.offsets, self.not_run, self.holders, \
            node.held
        names = self.jobs.names
        batch: list[int] = []
        for i in self.policy.pinned_to(node.name):
            if len(batch) >= want:
                break
            if offsets[i] >= 0 or marks[i] or names[i] in held:
                continue
            batch.append(i)
            held[names[i]] = i
            if not holders[i]:
                self.running += 1
            holders[i] += 1
        if batch:
            node.last_batch_at = now
        return batch

    def _avoid(self, node: NodeInfo, tried: set[int]) -> bool:
        """Whether ``node`` is not to be given a job the nodes ``tried`` tried: it tried
        it, and a live ready node (not disabled) that did not is there to take it.  A walk
        over the nodes, made only for a retried job in the front list."""
        numbers = self.node_numbers
        if numbers.get(node.name, -1) not in tried:
            return False
        return any(other is not node and other.state is NodeState.READY
                   and other.name not in self.disabled
                   and numbers.get(other.name, -1) not in tried
                   for other in self.nodes.values())
