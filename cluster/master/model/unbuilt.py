"""Programs the nodes' builds did not make: whose fault, and the jobs not run.

After its build a node says which of job.start's ``programs`` its build did not make (the
``unbuilt`` request header).  :class:`Unbuilt` keeps what each node's build lacked and
judges a node that lacks a program (:meth:`Unbuilt.judge`):

* another node's build in this run made the program: the node is at fault (it
  "cannot run jobs", failure 1): the caller drops it and its jobs go to the others;
* no node's build made it yet, but a live node is still building, or the run is younger
  than ``heartbeat_timeout`` (a node of the cluster may not have called yet): the verdict
  waits (that build may make it), and the node is given no job meanwhile;
* no node's build made it and no node may still build it: the tree's fault (every node
  builds the same tree with the same command).  The jobs calling the program that have no
  result and are held by nobody are marked not run (:meth:`Unbuilt.decide`): they settle
  like results, so the run ends with the other products' results, and the report says once
  which product was not tested.  No node is dropped for it.

A verdict of "not built" holds for the rest of the run: a node joining later whose build
makes the program does not bring its jobs back (docs/deviations.md).

Costs: nothing per job while no node lacks a program.  A verdict walks the nodes' records
(tens), not the jobs; deciding a program "not built" reads every job line once (in
chunks), once per run.  The marks are one byte a job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.master.model.joblist import JobList
from cluster.records import BIN

#: The most programs a run decides "not built" (a job's mark is one byte).
MAX_NOT_BUILT = 254
#: The pseudo-program of an every_node run's jobs not run because their node is not there
#: (never a program's name: programs are file names without '@').
ABSENT = "@absent"
#: The pseudo-program of the jobs whose cached results wait for their group's check
#: (:mod:`cluster.master.cache.reuseverify`): marked so that no node is handed them meanwhile,
#: and always unmarked (recorded from the cache, or run) before the run's last result.
HELD = "@held"
#: Job lines read at once when marking.
_CHUNK = 65536
#: What may follow a program's name in a job line without making it another name.
_NAME_CHAR = r"[A-Za-z0-9_.+-]"


@dataclass(frozen=True)
class Verdict:
    """What :meth:`Unbuilt.judge` decided for a node that lacks programs.

    ``fault``: the node's own fault (why, e.g. ``its build made no gs, which node node1's
    build made``); ``wait``: undecided, give the node no job for now; ``decide``: the
    programs no node built, to be marked not run now.  All empty: every program it lacks
    is decided "not built" already, and the node takes the other jobs.
    """

    fault: str = ""
    wait: bool = False
    decide: tuple[str, ...] = ()


class Unbuilt:
    """The builds' missing programs of one run and the jobs not run for them."""

    def __init__(self, jobs: int) -> None:
        #: Node name -> the programs its (latest) build in this run did not make; every
        #: node that built is here, those that made everything with an empty set.
        self.lacks: dict[str, frozenset[str]] = {}
        #: Programs decided "not built" -> the nodes whose builds lacked it, in the order
        #: decided (a job's mark is 1 + the position here).
        self.not_built: dict[str, tuple[str, ...]] = {}
        #: Per job: 0, or 1 + the position in :attr:`not_built` of the program it calls
        #: (a job not run).
        self.marks = bytearray(jobs)
        self.count = 0
        #: Jobs not run, by program.
        self.by_program: dict[str, int] = {}

    def note_build(self, node: str, lacks: Iterable[str]) -> None:
        """Node ``node`` built the run; its build made none of ``lacks``."""
        self.lacks[node] = frozenset(lacks)

    def judge(self, node: str, building: bool) -> Verdict:
        """The verdict on node ``node``'s missing programs (see the module docstring);
        ``building``: whether another node may still build them (one is building, or the
        run is too young for every node to have called)."""
        undecided: list[str] = []
        for program in sorted(self.lacks.get(node, ())):
            if program in self.not_built:
                continue
            maker = self._maker(program, node)
            if maker is not None:
                return Verdict(fault=f"its build made no {program}, which node {maker}'s "
                                     "build made")
            undecided.append(program)
        if not undecided:
            return Verdict()
        if building:
            return Verdict(wait=True)
        return Verdict(decide=tuple(undecided))

    def _maker(self, program: str, node: str) -> str | None:
        """A node other than ``node`` whose build in this run made ``program``."""
        for name, lacks in self.lacks.items():
            if name != node and program not in lacks:
                return name
        return None

    def decide(self, programs: Sequence[str], jobs: JobList, offsets: Sequence[int],
               holders: Sequence[int]) -> list[str]:
        """Mark ``programs`` "not built": each job calling one of them (``__bin__/<name>``)
        with no result (``offsets`` < 0) and held by nobody (``holders`` 0) is not run.
        Returns what was decided, one line per program, for the log; programs past
        :data:`MAX_NOT_BUILT` are left undecided and said so."""
        notes: list[str] = []
        position: dict[str, int] = {}
        for program in programs:
            if program in self.not_built:
                continue
            if len(self.not_built) >= MAX_NOT_BUILT:
                notes.append(f"{program}: not marked: {MAX_NOT_BUILT} programs are decided "
                             "not built in this run already")
                continue
            self.not_built[program] = tuple(sorted(
                name for name, lacks in self.lacks.items() if program in lacks))
            position[program] = len(self.not_built)
            self.by_program[program] = 0
        if not position:
            return notes
        calls = re.compile(re.escape(BIN) + "/("
                           + "|".join(map(re.escape, sorted(position, key=len, reverse=True)))
                           + f")(?!{_NAME_CHAR})")
        marks = self.marks
        total = len(jobs)
        for start in range(0, total, _CHUNK):
            indexes = range(start, min(total, start + _CHUNK))
            for i, line in zip(indexes, jobs.lines(indexes), strict=True):
                if marks[i] or offsets[i] >= 0 or holders[i]:
                    continue
                found = calls.search(line)
                if found is not None:
                    program = found.group(1)
                    marks[i] = position[program]
                    self.by_program[program] += 1
                    self.count += 1
        for program in position:
            notes.append(f"no node's build made {program} (built on "
                         f"{', '.join(self.not_built[program]) or 'no node'}): its "
                         f"{self.by_program[program]} jobs left are not run")
        return notes

    def mark_absent(self, node: str, indexes: Sequence[int]) -> None:
        """The jobs ``indexes`` of an every_node run, pinned to node ``node``, are not run:
        the node is not there to run them (docs/runoptions.md).  They are kept under the one
        pseudo-program :data:`ABSENT`, whose "nodes" are the absent nodes (the report
        names them, :func:`cluster.master.end.finish.unbuilt_lines`)."""
        if ABSENT not in self.not_built:
            self.not_built[ABSENT] = ()
            self.by_program[ABSENT] = 0
        self.not_built[ABSENT] = tuple(sorted({*self.not_built[ABSENT], node}))
        mark = list(self.not_built).index(ABSENT) + 1
        marks = self.marks
        for i in indexes:
            if not marks[i]:
                marks[i] = mark
                self.by_program[ABSENT] += 1
                self.count += 1

    def hold(self, indexes: Sequence[int]) -> None:
        """The jobs ``indexes`` (no result, held by no node) wait for a check of their
        cached results: marked under :data:`HELD`, so no node is handed them."""
        if HELD not in self.not_built:
            self.not_built[HELD] = ()
            self.by_program[HELD] = 0
        mark = self.held_mark
        marks = self.marks
        for i in indexes:
            if not marks[i]:
                marks[i] = mark
                self.by_program[HELD] += 1
                self.count += 1

    @property
    def held_mark(self) -> int:
        """The mark of the jobs held by :meth:`hold` (0: none was ever held)."""
        return list(self.not_built).index(HELD) + 1 if HELD in self.not_built else 0

    def release(self, indexes: Sequence[int]) -> list[int]:
        """Those of ``indexes`` still held (:meth:`hold`), no longer: they are to be run, or
        recorded by the caller; returned."""
        mark = self.held_mark
        if not mark:
            return []
        marks = self.marks
        out = [i for i in indexes if marks[i] == mark]
        for i in out:
            marks[i] = 0
        self.count -= len(out)
        self.by_program[HELD] -= len(out)
        return out

    def unmark(self, i: int) -> None:
        """Job ``i``, marked not run, has a result after all (from a node it was handed to
        before the verdict): it counts as run."""
        program = list(self.not_built)[self.marks[i] - 1]
        self.marks[i] = 0
        self.count -= 1
        self.by_program[program] -= 1

    def names(self, jobs: JobList) -> frozenset[str]:
        """The tests not run (empty when none: a walk over every job only then); a job
        held for a check of its cached result (:meth:`hold`) is not one of them."""
        if self.count == self.by_program.get(HELD, 0):
            return frozenset()
        names, marks, held = jobs.names, self.marks, self.held_mark
        return frozenset(names[i] for i in range(len(names)) if marks[i] and marks[i] != held)
