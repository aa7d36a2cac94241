"""The master's view of one run, as pure logic: which node holds which job, what is done.

No sockets, files or clocks here: the master feeds each parsed node request and the current
time to :meth:`RunState.handle` and gets back the reply plus the results that arrived for the
first time (which it must journal before sending the reply); :meth:`RunState.tick` expires the
leases of nodes that went silent.

The rules are seed 001's "normal course of events":

* a wrong job id gets ABORT, and nothing is remembered of the node (it may come back);
* a disabled node (``nodes/<name>.down``, :meth:`RunState.set_disabled`) gets ABORT
  ``node <name> is disabled``: its results are taken, its unfinished jobs go back to the
  others, and it leaves the run without counting as lost (it did not fail);
* unsuitable caps get ABORT and the node is culled for this run;
* a node's first contact gets BUILD; ``busy`` keeps its lease alive without giving it work;
* ``failure <0`` aborts the whole run; ``failure >0`` drops the node and puts its unfinished
  jobs back at the front of the list (during UPLOAD it means "try again": UPLOAD once more);
* nodes may join at any time; when every job has a result, each node that built the run
  is told UPLOAD (seed 001: "else if node not uploaded -> upload", so the build log of a
  node that ran no job is kept too), and after its upload it is told ABORT; the run ends
  when every built node still alive has uploaded (or ``upload_timeout`` after the last
  result);
* a node not heard from for ``heartbeat_timeout`` seconds is dead: its unfinished jobs go to
  the front of the list.  If it comes back it is treated as a new node;
* in a run with ``no_reschedule`` (docs/runoptions.md, section 3; :attr:`RunState.options`)
  the unfinished jobs of a node that leaves the run (dead, failed, restarted, disabled) are
  never handed out again: each gets the result :data:`~cluster.records.ERROR_LOST` from that
  node (journaled like a node's: :meth:`RunState.take_made_results`), and the tail makes no
  copies;
* a result is taken only for a job that was handed to the node sending it (at any time in
  this run: a job put back after its lease lapsed, or copied in the tail, may still come
  back from each node that got it).  Any other result is refused, counted in
  :attr:`Outcome.refused` and logged; the rest of the request goes on (a node
  must not put results into the table for jobs it was never given).

A node that built the run says which of job.start's ``programs`` its build did not make
(``unbuilt``); :mod:`cluster.master.model.unbuilt` judges it.  Such a node is given no
job until a verdict: when another node's build made the program the node is dropped as
failure 1 (it "cannot run jobs": its jobs go to the others); when no node's build
made it, no live node is still building and the run is older than ``heartbeat_timeout``
(nodes that had not called by then are not waited for), the jobs calling it are marked not
run
(:attr:`RunState.unbuilt`), which settles them like results, so the run ends with the other
products' results; no node is dropped for it.

Results stream back with every request.  The first result for a job wins; later ones (from a
node presumed dead, or from a speculative copy in the tail) are counted as duplicates.

A sweep task whose try was not valid is put back (:meth:`RunState.retry`, called by
:mod:`cluster.master.serve.sweepintake` before :meth:`RunState.handle` of the request, which then
does not carry that result): it goes to the front of the list, and the nodes that tried
it are not given it while a live ready node that has not is there.  Only jobs in the front
list are looked at for that, one dict lookup each while any job was retried: the usual
batch (a slice of the list) does not change.

Sized for a million jobs: jobs are known by index in a
:class:`~cluster.master.model.joblist.JobList` (names in memory, lines read in bulk), the jobs not
yet handed out are a cursor over that list plus a deque of those put back, and each result
is kept as its journal line (:class:`~cluster.master.model.results.Results`).  The tail's
speculative copies are planned by :class:`~cluster.master.model.tailplan.TailPlan`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, cast

from cluster.config import DEFAULTS, Config
from cluster.master.cache.reuseverify import RECORD_FILE, ReuseChecks, grouped, prefix
from cluster.master.files.journal import (
    format_line,
    journal_result,
    line_prefix,
    result_text,
    split_line,
)
from cluster.master.model.joblist import JobList, as_job_list, consecutive
from cluster.master.model.leases import Leases
from cluster.master.model.placement import RunPolicy
from cluster.master.model.results import Results
from cluster.master.model.tailplan import TailPlan
from cluster.master.model.unbuilt import HELD, Unbuilt
from cluster.records import (
    ERROR_LOST,
    ERROR_TIMEOUT,
    ERROR_TIMEOUT_STAGE2,
    LOST_PRODUCT,
    Job,
    JobResult,
)
from cluster.runoptions import RunOptions
from cluster.wire import protocol
from cluster.wire.protocol import Reply, Request

if TYPE_CHECKING:
    from cluster.master.cache.reuse import RunReuse

Suitability = Callable[[str], tuple[bool, str]]
#: The machine column's prefix of a result taken from the result cache
#: (:data:`cluster.master.cache.reuse.CACHE_PREFIX`, kept equal by a unit test).
CACHE_PREFIX = "cache:"

#: The most jobs a node is kept holding, however fast it is.
MAX_BATCH = 65536
#: The shortest pause of the master (:meth:`RunState.pause`) given back to the nodes [s].
PAUSE_FORGIVEN = 1.0
#: The first character of a canonical result's error field (``<test> <error> ...``) for
#: error 0, and for the timeout codes (3 and 4; no other code, -1 and 10 included, starts
#: with these digits).
_NO_ERROR = "0"
_TIMEOUT_DIGITS = (str(ERROR_TIMEOUT), str(ERROR_TIMEOUT_STAGE2))
#: The test and the rest of a result split at its first space (``str.partition``).
_FIRST, _THIRD = itemgetter(0), itemgetter(2)


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
    #: The node process this is (the session of its signed nonces; "" when unknown) and the
    #: machine's instance (``instance`` header) and address it calls from: a node is a
    #: process, not a name.
    session: str = ""
    instance: str = ""
    peer: str = ""
    caps: str = ""
    slots: int = 1
    status: str = ""
    #: Jobs handed out to it with no result from it yet, oldest first: name -> job index.
    held: dict[str, int] = field(default_factory=dict)
    working_since: float | None = None  # when it first got jobs: its rate is measured from then
    capacity: int = 0                   # jobs it is kept holding (grown while it runs dry fast)
    last_batch_at: float | None = None  # when it was last given new jobs
    told_abort: bool = False    # it has been told the run is over
    results: int = 0            # first results it delivered
    errors: int = 0             # of those, results with an error code (not 0)
    timeouts: int = 0           # of those, results that timed out (error 3 or 4)
    #: The programs of job.start its build did not make (``unbuilt``).
    lacks: frozenset[str] = frozenset()

    def job_seconds(self, now: float) -> float | None:
        """Wall seconds one of its slots has spent per job so far; None if unknown."""
        if self.working_since is None or not self.results:
            return None
        return self.slots * (now - self.working_since) / self.results


@dataclass(frozen=True)
class Outcome:
    """What :meth:`RunState.handle` decided for one request.

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


def disabled_reason(name: str) -> str:
    """The ABORT reason a disabled node is given."""
    return f"node {name} is disabled"


class RunState:
    """Scheduling state of one run.  Callers use handle(), tick() and the read-only queries."""

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
        index = self.jobs.index
        offsets = self.results.offsets
        taken: list[int] = []
        lines: list[str] = []
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
        del taken, lines
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
        #: A sweep's retries (:meth:`retry`): job index -> the numbers of the nodes whose
        #: try of it was not taken.  Empty for every other run; consulted only for jobs
        #: handed out from ``front``, never on the usual batch's slice.
        self.tried: dict[int, set[int]] = {}
        self.refused_results = 0
        self.slots_known = 0               # sum of the slots of self.nodes (any state)
        self.tail_plan = TailPlan()        # the tail's speculative copies
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

    # ---------------------------------------------------------------- queries
    @property
    def all_results_in(self) -> bool:
        """Every job settled: it has a result, or it is not run (:attr:`not_run`)."""
        return self.results.count + self.unbuilt.count == len(self.jobs)

    @property
    def remaining(self) -> int:
        return len(self.jobs) - self.results.count - self.unbuilt.count

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
        if req.job_id != self.run_id:
            # Wrong id: the node runs an old job (or none).  Remember nothing.
            return Outcome(Reply(protocol.ABORT,
                                 reason=f"{protocol.ABORT_WRONG_JOB_ID}, running {self.run_id}"))
        name = req.node
        if name in self.culled:
            return Outcome(Reply(protocol.ABORT,
                                 reason=f"{protocol.ABORT_UNSUITABLE}: {self.culled[name]}"))
        notes: list[str] = []
        node = self.nodes.get(name)
        if (node is not None and session and node.session and session != node.session
                and node.state is not NodeState.GONE):
            refusal = self._same_name(node, req, now, session, peer, notes)
            if refusal is not None:
                return refusal
        disabled = name in self.disabled
        if disabled and (node is None or node.state is NodeState.GONE):
            return Outcome(Reply(protocol.ABORT, reason=disabled_reason(name)))
        if (req.failure < 0 and (node is None or node.state is not NodeState.BUILDING
                                 or node.session != session)):
            # Failure -1 ends everyone's run: taken only from this run's node that was told
            # BUILD and is building, in the session that was told so.
            why = (f"failure {req.failure} refused: node {name} is not building in run "
                   f"{self.run_id}")
            if node is None or node.state is NodeState.GONE or node.session != session:
                return Outcome(Reply(protocol.ABORT, reason=why), notes=(why,))
            # A known node of this session past its build: a node fault, not the source's.
            notes.append(why + "; dropped as failure 1")
            req = dataclasses.replace(req, failure=1,
                                      failure_reason=f"failure {req.failure} after its build: "
                                                     f"{req.failure_reason}".rstrip(": "))
        if node is None or node.state is NodeState.GONE:
            ok, why = self.suitable(req.caps)
            if ok:
                # Placement (groups=, exclude=, every_node's pins): a refused node is not a
                # failed one; "unsuitable" makes its clusterpull leave this run for good.
                why = self.policy.refusal(name)
                ok = not why
            if not ok:
                self.culled[name] = why
                notes.append(f"node {name} culled for this run: {why}")
                return Outcome(Reply(protocol.ABORT, reason=f"{protocol.ABORT_UNSUITABLE}: {why}"),
                               notes=tuple(notes))
            if node is not None:
                notes.append(f"node {name} rejoined the run")
                self.slots_known -= node.slots
            node = NodeInfo(name, NodeState.BUILDING, now, session=session,
                            instance=req.instance)
            self.slots_known += node.slots
            self.nodes[name] = node
            fresh = True
        else:
            fresh = False
        node.last_seen = now
        node.peer = peer or node.peer
        node.caps = req.caps or node.caps
        slots = max(req.slots, 1)
        if slots != node.slots:
            self.slots_known += slots - node.slots
            node.slots = slots
        node.status = req.status
        if req.problems:
            notes.extend(f"node {name}: bad result: {problem}" for problem in req.problems)
        carried = len(req.results) + len(req.result_lines)
        refused_before = self.refused_results
        journal = self._record(node, req, notes) if carried else b""
        refused = self.refused_results - refused_before
        if journal and self.checks is not None and self.checks.samples:
            # Samples of the result cache's checks among them: settled before the reply is
            # decided (the results they vouch for recorded, or run; made_results).
            self.checks.on_results(self, journal, notes)

        def out(reply: Reply) -> Outcome:
            if reply.verb == protocol.ABORT:
                node.told_abort = True
            made = self.take_made_results()  # a dropped node's jobs reported lost
            if made and self.checks is not None and self.checks.samples:
                self.checks.on_results(self, made, notes)  # a sample lost: unsure
                made += self.take_made_results()
            return Outcome(reply, journal + made if made else journal, tuple(notes),
                           carried, refused)

        if self.fatal:
            return out(Reply(protocol.ABORT, reason=f"{protocol.RUN_ABORTED}: {self.fatal}"))
        if disabled:
            # Its results are in (above); its other jobs go back to the others.  Not a
            # failure: it does not count against max_failed_nodes.
            self._drop(node, "disabled", notes, lost=False)
            return out(Reply(protocol.ABORT, reason=disabled_reason(name)))
        if req.failure < 0:
            self.fatal = (f"node {name} failed with code {req.failure}: "
                          f"{req.failure_reason}").rstrip()
            notes.append(self.fatal)
            self._drop(node, f"failure {req.failure}", notes)
            return out(Reply(protocol.ABORT, reason=protocol.RUN_ABORTED))
        if req.failure > 0:
            if node.state is NodeState.UPLOADING:
                return out(Reply(protocol.UPLOAD))  # seed 000: upload failed -> try again
            self._drop(node, f"failure {req.failure} {req.failure_reason}".rstrip(), notes)
            return out(Reply(protocol.ABORT,
                             reason=f"{protocol.ABORT_DROPPED} after failure {req.failure}"))
        if req.leaving:
            self._drop(node, "left the run", notes)
            return out(Reply(protocol.ABORT, reason=protocol.ABORT_GOODBYE))
        if fresh:
            return out(Reply(protocol.BUILD))  # BUILDING: first contact
        if req.busy:
            return out(Reply(protocol.CONTINUE))
        if node.state is NodeState.BUILDING:
            if req.built != self.run_id:
                # Neither building nor built for this run (it lost the BUILD reply, or is
                # not what it was): never ready merely because ``busy`` is missing.
                return out(Reply(protocol.BUILD))
            node.state = NodeState.READY  # BUILDING -> READY: it said it built this run
            self._note_build(node, req.unbuilt, notes)
            self._reuse_results(node, req.digests, now, notes, req.keychanges)
        elif node.state is NodeState.UPLOADING:
            node.state = NodeState.DONE  # UPLOADING -> DONE: connected in without busy
        if req.pending == 0 and req.running == 0 and node.held:
            # The node holds nothing, yet we think it holds jobs: it lost them (restarted,
            # or never received our reply).  Put them back.
            self._requeue(node, front=True)
            notes.append(f"node {name} lost jobs it was given; put back in the list")
        if node.lacks and not self.all_results_in:
            verdict = self._judge(node, now, notes)
            if verdict is not None:
                return out(verdict)
        if not self.all_results_in:
            batch = self._batch(node, req, now)
            if batch:
                if node.state is NodeState.DONE:
                    node.state = NodeState.READY  # DONE -> READY: work came back after a death
                self.leases.grant(node.name, node.session, batch)
                return out(Reply(protocol.JOBS, tuple(self.jobs.lines(batch))))
            return out(Reply(protocol.CONTINUE))
        if self.hold_end:
            return out(Reply(protocol.CONTINUE))  # a confirm phase may follow: no upload yet
        if node.state is NodeState.READY:
            node.state = NodeState.UPLOADING  # READY -> UPLOADING
            return out(Reply(protocol.UPLOAD))
        if node.state is NodeState.UPLOADING:
            return out(Reply(protocol.CONTINUE))
        return out(Reply(protocol.ABORT, reason=protocol.ABORT_RUN_COMPLETE))

    def retry(self, name: str, test: str) -> None:
        """Node ``name``'s result for job ``test`` was not taken: the job is to be tried
        again (a sweep task whose result was not valid, :mod:`cluster.master.serve.sweepintake`).

        Called before :meth:`handle` of the request that carried the result, which must
        then not carry it.  The job leaves the node's held jobs and goes back to the front
        of the list (unless another node holds it, or it waits there already); until it has
        a result it is not handed to a node that tried it while a live ready node that has
        not tried it exists (:meth:`_avoid`).  A job with a result, or not in the run, is
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

    def adopt_nodes(self, other: RunState) -> None:
        """A confirm phase's state (docs/results.md, "Differences confirmed, indeterminate
        tests named") takes over the nodes of the run's first state ``other`` that have not
        left it, as they are (built, building), holding nothing of its jobs; its culled and
        disabled nodes too.  A node adopted keeps its session, so it is not told BUILD
        again."""
        for name, node in other.nodes.items():
            if node.state is NodeState.GONE or node.told_abort:
                continue
            copy = dataclasses.replace(node, held={}, working_since=None, capacity=0,
                                       last_batch_at=None, results=0, errors=0,
                                       timeouts=0, lacks=frozenset())
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

    def takes_results_from(self, name: str) -> bool:
        """Whether :meth:`handle` would look at the results of a request from node ``name``
        now: not from a node culled for this run, nor from a disabled one not in it."""
        if name in self.culled:
            return False
        node = self.nodes.get(name)
        return not (name in self.disabled and (node is None or node.state is NodeState.GONE))

    def tried_by(self, test: str) -> frozenset[str]:
        """The nodes whose try of job ``test`` was not taken (:meth:`retry`)."""
        i = self.jobs.index.get(test)
        numbers = self.tried.get(i, set()) if i is not None else set()
        return frozenset(name for name, number in self.node_numbers.items()
                         if number in numbers)

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

    # ---------------------------------------------------------------- internals
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
        that node while a live ready node that is not it is there (:meth:`_avoid`).  The
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
        to the front list (as :meth:`prefer_others` does)."""
        names, offsets, marks = self.jobs.names, self.results.offsets, self.not_run
        if self.cursor < len(names):
            self.front.extend(names[i] for i in range(self.cursor, len(names))
                              if offsets[i] < 0 and not marks[i] and i not in skip)
            self.cursor = len(names)

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

    def _same_name(self, node: NodeInfo, req: Request, now: float, session: str, peer: str,
                   notes: list[str]) -> Outcome | None:
        """A request under ``node``'s name from another process (``session``).

        A live node (heard from within ``heartbeat_timeout``, not told ABORT) of another
        instance keeps the name: this one is refused, and nothing of it is remembered (the
        ABORT reason names the name and both peers).  Otherwise the old process is gone
        (the node restarted, or the old one fell silent): it leaves the run, its unfinished
        jobs go back to the front of the list, and None lets this request join as a new
        node (BUILD).
        """
        live = (not node.told_abort
                and now - node.last_seen <= self.settings.heartbeat_timeout)
        if live and req.instance and node.instance and req.instance != node.instance:
            why = (f"node name {node.name} is in use by another live process (at "
                   f"{node.peer or '?'}, instance {node.instance}); this one (at "
                   f"{peer or '?'}, instance {req.instance}) is refused")
            return Outcome(Reply(protocol.ABORT, reason=why), notes=(why,))
        self._drop(node, f"restarted: a new process (session {session[:8]}) from "
                         f"{peer or '?'}", notes, lost=False)
        return None

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
        names = list(map(_FIRST, parts))
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
        if not new_idx:
            return b""
        for i in new_idx:
            offsets[i] = -1
        data = self.results.add(new_idx, new_texts, line_prefix(machine))
        self._count_new(node, new_parts)
        return data

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

    def leased(self, i: int, node: NodeInfo) -> bool:
        """Whether job ``i`` was handed to ``node``'s process (its name and session) in
        this run, and that try was not put back as not valid (:meth:`retry`)."""
        return self.leases.holds(i, node.name, node.session)

    def leased_to(self, name: str, test: str, session: str = "") -> bool:
        """Whether job ``test`` was handed to the process ``session`` of node ``name`` in
        this run (:meth:`leased`)."""
        i = self.jobs.index.get(test)
        return i is not None and self.leases.holds(i, name, session)

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
        :meth:`handle` returns them with its own (``Outcome.journal``); the master takes
        them after :meth:`tick`."""
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
        want = capacity - (req.pending + req.running)
        policy = self.policy
        if policy.capped:
            # max_worker_instances, max_cluster_instances: what this node and every node
            # hold of the run (a walk over the nodes, only for a run with a cap).
            want = policy.cap(want, max(len(node.held), req.pending + req.running),
                              sum(len(n.held) for n in self.nodes.values()
                                  if n.state is not NodeState.GONE))
        if want <= 0:
            return []
        held = node.held
        if policy.every_node:
            return self._pinned_batch(node, want, now)
        if self._has_pending():
            # Its fair share of all unfinished work, less what it already holds.  The slots
            # of every known node bound those of the nodes taking work from above, so the
            # exact sum (a walk over all nodes) is only needed near the end of the run.
            remaining = self.remaining
            bound = math.ceil(remaining * node.slots / max(self.slots_known, node.slots))
            if bound - len(held) >= want:
                size = want
            else:
                total_slots = sum(n.slots for n in self.nodes.values()
                                  if n.state in (NodeState.READY, NodeState.DONE))
                share = math.ceil(remaining * node.slots / max(total_slots, node.slots))
                size = max(1, min(want, share - len(held)))
            batch: list[int] = []
            holders = self.holders
            offsets = self.results.offsets
            front = self.front
            if front:
                index = self.jobs.index
                tried = self.tried
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
            if len(batch) < size:
                # Never handed out before, so nobody holds them.
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
            if batch:
                node.last_batch_at = now
                return batch
        if (not self.settings.speculate_tail or self.options.no_reschedule
                or req.pending > 0 or req.running >= node.slots):
            return []  # (a no_reschedule run's job is never run twice: no tail copies)
        free = node.slots - req.running
        if policy.capped:
            free = min(free, want)  # copies count against the caps too
        # Tail: nothing left to hand out and this node has idle slots.  Give it copies of
        # the jobs expected to finish last elsewhere (deep in the queue of a slow or silent
        # node) when a copy here should finish sooner; the first result wins.
        skip: set[int] = set()
        if self.tried:
            # A node does not copy a task whose try it made was not valid (sweeps).
            number = self.node_numbers.get(node.name, -1)
            skip = {i for i, numbers in self.tried.items() if number in numbers}
        return self.tail_plan.copies(node, free, now, self.nodes.values(), self.holders,
                                     self.jobs.names, skip)

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
