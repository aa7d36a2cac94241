"""What the steps of a node request share: one run's jobs, nodes and results, and the moves
every step makes on them.

:class:`RunCore` holds the state of one run (:class:`~cluster.master.state.runstate.RunState`
is it, with its steps: :mod:`~cluster.master.state.admission`,
:mod:`~cluster.master.state.recording`, :mod:`~cluster.master.state.handout`), and the moves
more than one of them makes: a node leaves the run (:meth:`RunCore._drop`), its unfinished
jobs go back or, in a ``no_reschedule`` run, are reported lost (:meth:`RunCore._requeue`);
new results are counted (:meth:`RunCore._count_new`); the result cache's checks
(:mod:`cluster.master.cache.reuseverify`) record results and reorder the list
(:meth:`RunCore.record_cached`, :meth:`RunCore.run_first`, :meth:`RunCore.run_later`).

Sized for a million jobs: jobs are known by index in a
:class:`~cluster.master.model.joblist.JobList` (names in memory, lines read in bulk), the jobs not
yet handed out are a cursor over that list plus a deque of those put back, and each result
is kept as its journal line (:class:`~cluster.master.model.results.Results`).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING

from cluster.config import DEFAULTS, Config
from cluster.master.cache.reuseverify import ReuseChecks, grouped, prefix
from cluster.master.files.journal import format_line, journal_result, line_prefix, split_line
from cluster.master.model.joblist import JobList, as_job_list
from cluster.master.model.leases import Leases
from cluster.master.model.placement import RunPolicy
from cluster.master.model.results import Results
from cluster.master.model.tailplan import TailPlan
from cluster.master.model.unbuilt import Unbuilt
from cluster.master.state.nodeinfo import NodeInfo, NodeState
from cluster.records import (
    ERROR_LOST,
    ERROR_TIMEOUT,
    ERROR_TIMEOUT_STAGE2,
    LOST_PRODUCT,
    Job,
    JobResult,
)
from cluster.runoptions import RunOptions
from cluster.wire.protocol import Reply

if TYPE_CHECKING:
    from cluster.master.cache.reuse import RunReuse

#: Whether a node's caps suit the run, and if not, why (``(ok, why)``).
Suitability = Callable[[str], tuple[bool, str]]

#: The machine column's prefix of a result taken from the result cache
#: (:data:`cluster.master.cache.reuse.CACHE_PREFIX`, kept equal by a unit test).
CACHE_PREFIX = "cache:"


#: The first character of a canonical result's error field (``<test> <error> ...``) for
#: error 0, and for the timeout codes (3 and 4; no other code, -1 and 10 included, starts
#: with these digits).
_NO_ERROR = "0"
_TIMEOUT_DIGITS = (str(ERROR_TIMEOUT), str(ERROR_TIMEOUT_STAGE2))
#: The test and the rest of a result split at its first space (``str.partition``).
_FIRST, _THIRD = itemgetter(0), itemgetter(2)



@dataclass(frozen=True)
class Outcome:
    """What :meth:`~cluster.master.state.runstate.RunState.handle` decided for one request.

    ``journal`` is the results that arrived for the first time, as newline-ended journal
    lines (:mod:`cluster.master.files.journal`'s format, UTF-8): the master writes them to its
    journal before it sends the reply.  :attr:`new_results` is the same as JobResults.
    """

    reply: Reply
    journal: bytes = b""
    notes: tuple[str, ...] = ()  # things worth a log line (bad results, node dropped, ...)
    #: Results the request carried, and those refused: for jobs never handed to its node.
    results: int = 0
    refused: int = 0

    @property
    def new_results(self) -> tuple[JobResult, ...]:
        return tuple(journal_result(line)
                     for line in self.journal.decode("utf-8").splitlines())


@dataclass(frozen=True)
class Settings:
    """The scheduling knobs of a run: the configuration keys of the same names."""

    heartbeat_timeout: float = DEFAULTS.heartbeat_timeout
    batch_per_slot: int = DEFAULTS.batch_per_slot
    batch_seconds: float = DEFAULTS.batch_seconds
    speculate_tail: bool = DEFAULTS.speculate_tail
    upload_timeout: float = DEFAULTS.upload_timeout

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        """The settings ``cfg`` gives."""
        return cls(heartbeat_timeout=cfg.heartbeat_timeout, batch_per_slot=cfg.batch_per_slot,
                   batch_seconds=cfg.batch_seconds, speculate_tail=cfg.speculate_tail,
                   upload_timeout=cfg.upload_timeout)


def _always_suitable(caps: str) -> tuple[bool, str]:
    return True, ""


class RunCore:
    """The state of one run that the steps of a request share, and their common moves.

    Not used alone: :class:`~cluster.master.state.runstate.RunState` is this with its
    steps.  Every attribute is the run state's (its queries and the master read them).
    """

    def __init__(self, run_id: str, jobs: JobList | Iterable[Job], now: float,
                 settings: Settings | None = None,
                 suitable: Suitability = _always_suitable,
                 done: Iterable[JobResult | str] = (),
                 policy: RunPolicy | None = None) -> None:
        """``done``: results already journaled, as JobResults or journal lines.
        ``policy``: the run's placement and caps (docs/runoptions.md, section 4;
        :mod:`cluster.master.model.placement`), none by default."""
        self.run_id = run_id
        self.settings = settings or Settings()
        self.suitable = suitable
        self.jobs: JobList = as_job_list(jobs)
        self.policy = policy or RunPolicy()
        self.policy.pin(self.jobs.names)
        self.results = Results(self.jobs)
        #: Nodes that sent a result, the earlier masters' included (the report's count).
        self.machines: set[str] = set()
        #: Results with an error code (not 0), the earlier masters' included.
        self.errors = 0
        #: Results taken from the result cache (docs/results.md, "Results reused"), the
        #: earlier masters' included.
        self.reused = 0
        #: The run's use of the result cache; None: off (the master sets it before serving).
        self.reuse: RunReuse | None = None
        #: The checks of what it takes from the cache (:mod:`cluster.master.cache.reuseverify`),
        #: made at the first pass with hits when ``reuse.verify`` is not 0.
        self.checks: ReuseChecks | None = None
        self._take_journaled(done)
        # Jobs to hand out: first those put back (front), then jobs[cursor:] without a result.
        self.front: deque[str] = deque()
        self.cursor = 0
        # holders[i]: how many nodes hold unfinished job i (0 once it has a result: a copy
        # still out elsewhere stays in that node's ``held`` only); ``running`` counts the
        # jobs with holders.  An array, not a dict by name: updated by the slice for the
        # usual batch, and 2 bytes a job.
        self.holders = array("H", [0]) * len(self.jobs)
        self.running = 0
        self.nodes: dict[str, NodeInfo] = {}
        # Who was handed each job, ever in this run, by node process (a result is taken
        # only from them; a successor master learns them from the log): Leases.
        self.leases = Leases(len(self.jobs))
        #: The nodes by number for the sweeps' retries (:attr:`tried`): a name's, whatever
        #: its session (a node that tried a task is avoided for it after a restart too).
        self.node_numbers: dict[str, int] = {}
        #: A sweep's retries (``retry``): job index -> the numbers of the nodes whose
        #: try of it was not taken.  Empty for every other run; consulted only for jobs
        #: handed out from ``front``, never on the usual batch's slice.
        self.tried: dict[int, set[int]] = {}
        self.refused_results = 0
        self.slots_known = 0               # sum of the slots of self.nodes (any state)
        self.tail_plan = TailPlan()        # the tail's speculative copies
        #: The jobs with a tail copy out and no result yet (by index; empty but in the
        #: tail): their first result withdraws the other copies (``Recording._withdraw``).
        self.copied: set[int] = set()
        #: Copies withdrawn so (told to their nodes).
        self.withdrawn = 0
        self.culled: dict[str, str] = {}
        self.lost: list[str] = []          # "name (reason)" for the report
        self.duplicates = 0
        self.unknown_results = 0
        self.fatal: str = ""               # set when a node reported failure < 0
        #: Nodes an admin disabled (``nodes/<name>.down``): given no work (set_disabled).
        self.disabled: frozenset[str] = frozenset()
        #: "name (reason; ...)" of the nodes that left without being lost: disabled by an
        #: admin, or restarted as a new process (not in the report's lost nodes).
        self.left: list[str] = []
        #: The programs the nodes' builds did not make, and the jobs not run for them.
        self.unbuilt = Unbuilt(len(self.jobs))
        self.not_run = self.unbuilt.marks  # per job: not 0 when the job is not run
        self.started = now
        self.all_results_at: float | None = now if self.all_results_in else None
        #: The run's effective per-run options (docs/runoptions.md): the master sets them from its
        #: queue line (:func:`cluster.master.model.runlimits.run_options`) before serving; the
        #: global defaults until then.
        self.options = RunOptions(job_timeout=DEFAULTS.max_run_time,
                                  max_failed_nodes=DEFAULTS.max_failed_nodes)
        #: Journal lines of results the state made itself (a lost node's jobs in a
        #: ``no_reschedule`` run), not yet journaled: :meth:`take_made_results`.
        self.made_results = bytearray()
        #: Set by the master while it may still run a confirm phase
        #: (:mod:`cluster.master.serve.confirm`): once every job has a result, nodes are told
        #: CONTINUE, not UPLOAD, and the run is not finished, until the master decides.
        self.hold_end = False
        #: True for a confirm phase's state: its jobs run again tests whose output changed,
        #: and must never be answered from a results cache.
        self.confirming = False
        #: What preemption did since the master last took them (nodes told to leave for a
        #: more urgent run, nodes that left): lines for the audit trail and the log.
        self.move_events: list[str] = []

    def _take_journaled(self, done: Iterable[JobResult | str]) -> None:
        """Take the results ``done`` already journaled (JobResults or journal lines) into
        :attr:`results`, counting their machines, errors and reused ones; a result for a
        job not in the run, or a second one for a job, is left out."""
        index = self.jobs.index
        offsets = self.results.offsets
        taken: list[int] = []
        lines: list[str] = []
        for r in done:
            if isinstance(r, str):
                line = r
                machine, text = split_line(line)
                name = text[:text.find(" ")]
                failed = text[len(name) + 1:len(name) + 2] != _NO_ERROR
            else:
                line = format_line(r)
                name, machine = r.name, r.machine or "-"
                failed = r.error != 0
            if machine.startswith(CACHE_PREFIX):
                self.reused += 1
            elif machine != "-":
                self.machines.add(machine)
            i = index.get(name)
            if i is not None and offsets[i] < 0:
                offsets[i] = 0  # taken; add() sets the real offset
                taken.append(i)
                lines.append(line)
                self.errors += failed
        if taken:
            for i in taken:
                offsets[i] = -1
            self.results.add(taken, lines)

    @property
    def all_results_in(self) -> bool:
        """Every job settled: it has a result, or it is not run (:attr:`not_run`)."""
        return self.results.count + self.unbuilt.count == len(self.jobs)

    @property
    def remaining(self) -> int:
        return len(self.jobs) - self.results.count - self.unbuilt.count

    # ---------------------------------------------------------------- moves every step makes

    def _count_new(self, node: NodeInfo, parts: list[tuple[str, str, str]]) -> None:
        """Count the new results from ``node`` (each split at its first space: the test,
        then the rest, which starts with the error code), their errors and timeouts among
        them in the node's counts and the errors in the run's too.

        An error code's first character tells 0, the timeout codes (3, 4) and the rest
        apart (-1 and 10 included): those characters are gathered into one string and
        counted, in C, instead of looked at one by one.
        """
        node.results += len(parts)
        self.machines.add(node.name)
        if self.all_results_in and self.all_results_at is None:
            self.all_results_at = node.last_seen
        codes = "".join(map(_FIRST, map(_THIRD, parts)))
        errors = len(codes) - codes.count(_NO_ERROR)
        if errors:
            self.errors += errors
            node.errors += errors
            node.timeouts += sum(map(codes.count, _TIMEOUT_DIGITS))

    def _drop(self, node: NodeInfo, reason: str, notes: list[str], lost: bool = True) -> None:
        """``node`` leaves the run, its unfinished jobs put back (in a ``no_reschedule``
        run: reported lost, :meth:`_requeue`); ``lost`` (the default): it counts as a lost
        node (the report's list, ``max_failed_nodes``)."""
        held = len([n for n in node.held if n not in self.results])
        self._requeue(node, front=True)
        node.state = NodeState.GONE
        fate = "reported lost" if self.options.no_reschedule else "put back"
        entry = f"{node.name} ({reason}; {held} unfinished jobs {fate})"
        (self.lost if lost else self.left).append(entry)
        notes.append(f"node {node.name} dropped: {reason}; {held} unfinished jobs {fate}")

    def take_made_results(self) -> bytes:
        """The journal lines of the results this state made itself since the last call
        (a lost node's jobs in a ``no_reschedule`` run); the caller journals them.
        ``RunState.handle`` returns them with its own (``Outcome.journal``); the master
        takes them after ``RunState.tick``."""
        made = bytes(self.made_results)
        self.made_results.clear()
        return made

    def _report_lost(self, node: NodeInfo, indexes: list[int]) -> None:
        """Jobs ``indexes``, held by ``node`` only and without a result, get the result
        :data:`~cluster.records.ERROR_LOST` from it: never handed out again
        (``no_reschedule``)."""
        if not indexes:
            return
        names = self.jobs.names
        texts = [f"{names[i]} {ERROR_LOST} 0.00 0.00 0.00 0 {LOST_PRODUCT}" for i in indexes]
        self.made_results += self.results.add(indexes, texts, line_prefix(node.name))
        self._count_new(node, [text.partition(" ") for text in texts])

    def _requeue(self, node: NodeInfo, front: bool) -> None:
        """``node`` holds none of its jobs any more: those that no other node holds and
        that have no result go back to the list, at its front (``front``) or after
        everything else; in a ``no_reschedule`` run they are reported lost instead
        (:meth:`_report_lost`)."""
        back: list[str] = []
        holders, offsets = self.holders, self.results.offsets
        for name, i in node.held.items():
            count = holders[i]
            if count > 1:
                # Someone else still holds a copy (tail speculation); no need to re-send.
                holders[i] = count - 1
                continue
            if count == 1:
                holders[i] = 0
                self.running -= 1
            if offsets[i] < 0:
                back.append(name)
        node.held.clear()
        if back and self.options.no_reschedule:
            # The node may have run them, or be running them still: never run twice.
            index = self.jobs.index
            self._report_lost(node, [index[name] for name in back])
            return
        if front:
            self.front.extendleft(reversed(back))
        else:
            # After everything else: jobs[cursor:] are handed out first, so move them over.
            offsets, names = self.results.offsets, self.jobs.names
            self.front.extend(names[i] for i in range(self.cursor, len(names))
                              if offsets[i] < 0)
            self.cursor = len(names)
            self.front.extend(back)

    # ---------------------------------------------------------------- the checks' moves
    def record_cached(self, indexes: list[int], values: list[str]) -> int:
        """Record the cached results ``values`` (``<maker> <text>``) of jobs ``indexes``
        (no result, held by no node) under the machine ``cache:<maker>``, into
        :attr:`made_results`; how many."""
        for maker, (idx, texts) in grouped(zip(indexes, values, strict=True)).items():
            self.made_results += self.results.add(idx, texts, prefix(maker))
            self.errors += sum(1 for text in texts if text.split(" ", 2)[1] != _NO_ERROR)
        self.reused += len(indexes)
        return len(indexes)

    def run_first(self, first: dict[int, str]) -> None:
        """Jobs ``first`` (index -> a node name) are handed out before the others, not to
        that node while a live ready node that is not it is there (``_avoid``).  The
        jobs not yet handed out move to the front list (the only place looked at for
        that), after them; jobs held (marked) stay out of it."""
        numbers = self.node_numbers
        for i, name in first.items():
            self.tried.setdefault(i, set()).add(numbers.setdefault(name, len(numbers)))
        self._cursor_to_front(first)
        names = self.jobs.names
        self.front.extendleft(names[i] for i in sorted(first, reverse=True))

    def run_later(self, indexes: list[int]) -> None:
        """Jobs ``indexes`` (no longer held, no result) are to be run: to the list's end."""
        if not indexes:
            return
        self._cursor_to_front(())
        self.front.extend(self.jobs.names[i] for i in indexes)
        if not self.all_results_in:
            self.all_results_at = None  # settled by the hold only: not all in after all

    def _cursor_to_front(self, skip: dict[int, str] | tuple[()]) -> None:
        """The jobs not yet handed out from the cursor, but ``skip`` and those marked, go
        to the front list (as ``RunState.prefer_others`` does)."""
        names, offsets, marks = self.jobs.names, self.results.offsets, self.not_run
        if self.cursor < len(names):
            self.front.extend(names[i] for i in range(self.cursor, len(names))
                              if offsets[i] < 0 and not marks[i] and i not in skip)
            self.cursor = len(names)
