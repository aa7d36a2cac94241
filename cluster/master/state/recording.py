"""The second step of a node request: take the results it carries.

A result is taken only for a job that was handed to the node sending it (at any time in
this run: a job put back after its lease lapsed, or copied in the tail, may still come back
from each node that got it; :class:`~cluster.master.model.leases.Leases` is asked).  Any
other result is refused, counted (``refused_results``, ``Outcome.refused``) and logged; the
rest of the request goes on (a node must not put results into the table for jobs it was
never given).  A result for a test not in the run is counted (``unknown_results``) and
logged once per request.

The first result for a job wins; later ones (from a node presumed dead, or from a
speculative copy in the tail) are counted as duplicates.  The first result of a job with a
tail copy out withdraws the other copy (:meth:`Recording._withdraw`): its node, if it
understands ``withdraw`` lines, is told in its next reply and stops it.  A result for a
job marked not run (its program was judged not built) unmarks it.  The usual request --
every result new, once, for a job the node holds -- is taken in bulk, with no Python step
per job beyond the split of its line.

A sweep task whose try was not valid is put back (:meth:`Recording.retry`, called by
:mod:`cluster.master.serve.sweepintake` before the request is handled, which then does not
carry that result): it goes to the front of the list, and the nodes that tried it are not
given it while a live ready node that has not is there (the hand-out's ``_avoid``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import itemgetter
from typing import cast

from cluster.master.files.journal import line_prefix, result_text
from cluster.master.model.joblist import consecutive
from cluster.master.state.nodeinfo import NodeInfo, NodeState
from cluster.master.state.runcore import RunCore
from cluster.wire.protocol import Request

#: A result's test, from the result split at its first space (``str.partition``).
_TEST = itemgetter(0)


class Recording(RunCore):
    """The results the nodes send, taken into the run once each."""

    def _take_results(self, node: NodeInfo, req: Request,
                      notes: list[str]) -> tuple[bytes, int, int]:
        """Take the results ``req`` from ``node`` carries: the journal lines of the new
        ones, how many it carried and how many of them were refused (for jobs never handed
        to it).  ``notes`` gets the node's bad results and what was refused.  Samples of
        the result cache's checks among the new ones are settled here, before the reply is
        decided (the results they vouch for recorded, or run; ``made_results``)."""
        if req.problems:
            notes.extend(f"node {node.name}: bad result: {problem}" for problem in req.problems)
        carried = len(req.results) + len(req.result_lines)
        refused_before = self.refused_results
        journal = self._record(node, req, notes) if carried else b""
        refused = self.refused_results - refused_before
        if journal and self.checks is not None and self.checks.samples:
            self.checks.on_results(self, journal, notes)
        return journal, carried, refused

    def _record(self, node: NodeInfo, req: Request, notes: list[str]) -> bytes:
        """Take the request's results; return the journal lines of the new ones."""
        texts: Iterable[str] = req.result_lines
        if req.results:
            texts = [*texts, *(result_text(r) for r in req.results)]
        if not isinstance(texts, list):
            texts = list(texts)
        offsets = self.results.offsets
        machine = node.name
        parts = list(map(str.partition, texts, repeat(" ")))  # (test, " ", the rest)
        names = list(map(_TEST, parts))
        # Each result's job leaves the node's held jobs; the job's index comes with it (None:
        # not held by this node, or a second result for it in this request).  A small dict
        # of the node's, instead of a lookup in the index of a million jobs.
        pop: Callable[[str, None], int | None] = node.held.pop
        idx = list(map(pop, names, repeat(None)))
        jobs = cast(list[int], idx)  # if None is not in it
        if idx and None not in idx and max(map(offsets.__getitem__, jobs)) < 0:
            # The usual request: every result new, once, for a job this node holds (so it
            # was handed to it).
            self._finish(jobs)
            data = self.results.add(jobs, texts, line_prefix(machine))
            self._count_new(node, parts)
            if self.copied:
                self._withdraw(node, jobs)
            return data
        return self._record_each(node, texts, parts, idx, notes)

    def _record_each(self, node: NodeInfo, texts: list[str],
                     parts: list[tuple[str, str, str]], held: list[int | None],
                     notes: list[str]) -> bytes:
        """:meth:`_record`, one result at a time, for a request that is not the usual one:
        a result for a job the node does not hold (put back after its lease lapsed,
        copied in the tail, never handed to it, or not in the run), a job with a result
        already, or a job twice.  ``parts``: each result split at its first space;
        ``held``: each result's job index if the node held it."""
        index, offsets, holders = self.jobs.index, self.results.offsets, self.holders
        machine = node.name
        leased = self.leased
        new_idx: list[int] = []
        new_texts: list[str] = []
        new_parts: list[tuple[str, str, str]] = []
        stray: list[str] = []
        unknown: list[str] = []
        for text, part, i in zip(texts, parts, held, strict=True):
            name = part[0]
            if i is None:
                i = index.get(name)
                if i is None:
                    unknown.append(name)
                    continue
                if not leased(i, node):
                    stray.append(name)
                    continue
            if offsets[i] >= 0:
                self.duplicates += 1  # first result wins; later ones are only counted
                continue
            if self.unbuilt.count and self.not_run[i]:
                self.unbuilt.unmark(i)
            # Finished: no longer counted as held even if a tail copy is still out on
            # another node (that node's held keeps it until it reports or is dropped).
            if holders[i]:
                holders[i] = 0
                self.running -= 1
            offsets[i] = 0  # taken (a second copy in this request is a duplicate)
            new_idx.append(i)
            new_texts.append(text)
            new_parts.append(part)
        if unknown or stray:
            self._not_recorded(node, unknown, stray, notes)
        if not new_idx:
            return b""
        for i in new_idx:
            offsets[i] = -1
        data = self.results.add(new_idx, new_texts, line_prefix(machine))
        self._count_new(node, new_parts)
        if self.copied:
            self._withdraw(node, new_idx)
        return data

    def _withdraw(self, winner: NodeInfo, indexes: list[int]) -> None:
        """Jobs ``indexes`` got their first result, from ``winner``: the other copies of
        those with a tail copy out (:attr:`copied`) are withdrawn (docs/results.md,
        "Withdrawn copies").  A node holding one no longer holds it, and its next reply
        names it in a ``withdraw`` line, if its process understands that
        (``features withdraw``; an older node keeps it, and its result is a duplicate, as
        before).  The nodes holding a job are found from its leases (two for a copy), never
        by a walk over the nodes; and no log line is written per copy (the audit trail's
        ``withdrew <n>`` says it per reply): a tail of a thousand nodes copies thousands."""
        won = self.copied.intersection(indexes)
        if not won:
            return
        self.copied -= won
        names, nodes = self.jobs.names, self.nodes
        for i in sorted(won):
            name = names[i]
            for lessee, session in self.leases.lessees(i):
                other = nodes.get(lessee)
                if (other is None or other is winner or other.session != session
                        or not other.withdraws or other.state is NodeState.GONE
                        or other.held.pop(name, None) is None):
                    continue
                other.withdraw.append(name)
                self.withdrawn += 1

    def _not_recorded(self, node: NodeInfo, unknown: list[str], stray: list[str],
                      notes: list[str]) -> None:
        """Count and log the results of ``node`` not recorded: for the tests ``unknown``
        (not in the run) and for the jobs ``stray`` (never handed to its process)."""
        machine = node.name
        if unknown:
            # One line per request, however many: an insider's flood is a count, not a log.
            self.unknown_results += len(unknown)
            notes.append(f"node {machine} sent {len(unknown)} result(s) for unknown tests, "
                         f"not in run {self.run_id} (first: {unknown[0][:200]!r}); not "
                         "recorded")
        if stray:
            self.refused_results += len(stray)
            notes.append(f"node {machine}: refused {len(stray)} result(s) for jobs never "
                         f"handed to it (to its process of session {node.session[:8] or '-'}"
                         f" in run {self.run_id}; first: {stray[0][:200]!r}); not recorded")

    def _finish(self, jobs: list[int]) -> None:
        """Jobs ``jobs``, held by the node that sent their first results, are no longer
        held by anyone."""
        holders = self.holders
        self.running -= len(jobs)
        if consecutive(jobs):  # a batch reported in order
            holders[jobs[0]:jobs[0] + len(jobs)] = array("H", [0]) * len(jobs)
            return
        for i in jobs:
            holders[i] = 0

    def leased(self, i: int, node: NodeInfo) -> bool:
        """Whether job ``i`` was handed to ``node``'s process (its name and session) in
        this run, and that try was not put back as not valid (:meth:`retry`)."""
        return self.leases.holds(i, node.name, node.session)

    def leased_to(self, name: str, test: str, session: str = "") -> bool:
        """Whether job ``test`` was handed to the process ``session`` of node ``name`` in
        this run (:meth:`leased`)."""
        i = self.jobs.index.get(test)
        return i is not None and self.leases.holds(i, name, session)

    def retry(self, name: str, test: str) -> None:
        """Node ``name``'s result for job ``test`` was not taken: the job is to be tried
        again (a sweep task whose result was not valid, :mod:`cluster.master.serve.sweepintake`).

        Called before ``RunState.handle`` of the request that carried the result, which must
        then not carry it.  The job leaves the node's held jobs and goes back to the front
        of the list (unless another node holds it, or it waits there already); until it has
        a result it is not handed to a node that tried it while a live ready node that has
        not tried it exists (the hand-out's ``_avoid``).  A job with a result, or not in the run, is
        left alone.  A successor master calls it for the tries its predecessors put back
        (the job, not yet handed out by it, is then only marked).
        """
        i = self.jobs.index.get(test)
        if i is None or self.results.offsets[i] >= 0:
            return
        self.tried.setdefault(i, set()).add(
            self.node_numbers.setdefault(name, len(self.node_numbers)))
        node = self.nodes.get(name)
        if node is not None:
            # That try is over: a result of it is refused now.
            self.leases.release(i, node.name, node.session)
        holders = self.holders
        if node is not None and node.held.pop(test, None) is not None and holders[i]:
            holders[i] -= 1
            if not holders[i]:
                self.running -= 1
        # Jobs at or past the cursor are handed out from there; one already in the front
        # list must not be there twice (it would go to two nodes at once).
        if not holders[i] and i < self.cursor and test not in self.front:
            self.front.appendleft(test)

    def judging(self, name: str, test: str) -> None:
        """Node ``name``'s result for job ``test`` came and is held for its check script
        (:mod:`cluster.master.serve.checkpool`): the node holds the job no more, and the job
        is not handed out again, but it has no result yet (the run is not done) until
        :meth:`record_judged` or :meth:`retry`."""
        i = self.jobs.index.get(test)
        node = self.nodes.get(name)
        if i is None or node is None or node.held.pop(test, None) is None:
            return
        holders = self.holders
        if holders[i]:
            holders[i] -= 1
            if not holders[i]:
                self.running -= 1

    def record_judged(self, name: str, test: str, text: str, now: float) -> bytes:
        """Record ``text``, node ``name``'s result for job ``test`` once its check judged
        it (:meth:`judging`), whatever the node's state now: its journal line, or nothing
        when the job has a result already (counted as a duplicate)."""
        i = self.jobs.index.get(test)
        if i is None:
            return b""
        if self.results.offsets[i] >= 0:
            self.duplicates += 1
            return b""
        if self.unbuilt.count and self.not_run[i]:
            self.unbuilt.unmark(i)
        if self.holders[i]:  # a copy still out on another node: finished all the same
            self.holders[i] = 0
            self.running -= 1
        data = self.results.add([i], [text], line_prefix(name))
        node = self.nodes.get(name)
        if node is not None:
            self._count_new(node, [text.partition(" ")])
        else:  # a successor judging its predecessor's try: the node has not called it
            self.machines.add(name)
            self.errors += text.split(" ", 2)[1] != "0"
        if self.all_results_in and self.all_results_at is None:
            self.all_results_at = now
        return data

    def tried_by(self, test: str) -> frozenset[str]:
        """The nodes whose try of job ``test`` was not taken (:meth:`retry`)."""
        i = self.jobs.index.get(test)
        numbers = self.tried.get(i, set()) if i is not None else set()
        return frozenset(name for name, number in self.node_numbers.items()
                         if number in numbers)
