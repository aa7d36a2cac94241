"""Reuse that checks itself (docs/results.md, "Results reused"): a sample of the results a
run would take from the result cache is run again, and a mismatch withdraws them.

No build cache checks its hits; a cluster of real machines must, since two nodes with the
same program bytes (the same key) can still disagree: a broken library the key does not
cover, bad RAM.  One node's wrong outputs would otherwise be served to every later run.

**The groups.**  When a node's build is resolved (:meth:`cluster.master.cache.reuse.RunReuse.
resolve`: one pass, the *pass*), its hits are grouped by the (program, digest) pairs of
the programs each job calls and by the result's maker node (the node that ran it, whatever
run it ran in).  Of each group ``reuse_verify`` (a share, rounded up) and at least one job
is a *sample*: it is not taken from the cache but run, first in the list, and not given to
its maker node while a ready node that is not its maker is there
(:meth:`cluster.master.state.handout.Handout._avoid`, the retry machinery).  The group's other
hits are *held*: marked (:meth:`cluster.master.model.unbuilt.Unbuilt.hold`) so no node is
handed them, and not recorded.

**Hold, then record** (not record, then withdraw).  No cached result is recorded for the
run before the samples of every group of its pass are settled: a result recorded is in the
journal, counted and maybe already compared, and taking it back would need a journal line
every reader and a successor master applies, and a report that saw it come and go.  Held
results are only ever released, so a master that dies with results held loses nothing it
said: its successor resolves the builds again and draws new samples (the samples already
run are ordinary results in the journal).  When a pass's samples are all settled, each
held job of a group that agreed and calls no withdrawn build is recorded under the machine
``cache:<maker node>@<maker run>``; the others are run.

**A sample's result** is compared with the cached one by error code and md5
(:func:`cluster.report.indeterminate.digest`):

* the same: the sample agrees;
* another: a *mismatch*.  The job's builds ((program, digest) pairs: a program's digest
  covers its environment as far as the node's key sees it) are withdrawn at once: from the
  store for later runs (:meth:`cluster.master.cache.resultcache.ResultCache.withdraw`, written
  and synced before the node hears back), and from this run: every held job, of any group
  and maker, that calls one of them is released to run.  The run's record says which test,
  the cached digest with its maker node and run, the new one and its node;
* none that can be compared (a timeout, an internal error, a job lost with its node: codes
  the cache never keeps): it vouches for nothing, and it is no evidence against the build
  either.  Another held job of its group becomes the sample in its place, at most
  :data:`MAX_REPLACEMENTS` times; after that the group is *unverified*: its held jobs run,
  nothing is withdrawn.  Conservative: an unchecked group is never served.

A sample that runs on its maker (the only ready node at the time) is compared all the same:
it catches a result that changes by itself, but not a node wrong in the same way twice.

**The record**, ``runs/<id>/reuse-checks`` (:data:`RECORD_FILE`): one tab-separated line
per settled sample (``agreed``, ``mismatch``, ``unsure``) and per group given up
(``unverified``), appended when it happens (a mismatch fsync'ed), so the report of this
master or of a successor says the same (:func:`read_record`, :func:`section`).

**Costs.**  Nothing on a request while no sample is out (one attribute test); while some
are, the new results' journal lines are split for their test names once.  A pass costs one
walk over its hits.  A run that takes nothing from the cache has no checks at all.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cluster.master.cache.resultcache import CACHED_ERRORS, ResultCache, job_inputs, split_cached
from cluster.master.files.journal import line_prefix, split_line
from cluster.master.model.joblist import JobList
from cluster.master.model.results import Results
from cluster.master.model.unbuilt import Unbuilt
from cluster.report.indeterminate import digest

log = logging.getLogger("cluster.reuse")

#: The run's record of its checks, in ``runs/<id>/``.
RECORD_FILE = "reuse-checks"
#: How many times a sample whose result cannot be compared is replaced by another job of
#: its group before the group is run whole.
MAX_REPLACEMENTS = 2
#: The machine column's prefix of a reused result (:data:`cluster.master.cache.reuse.CACHE_PREFIX`).
CACHE_PREFIX = "cache:"

Pairs = tuple[tuple[str, str], ...]


class RunState(Protocol):
    """What the checks use of :class:`cluster.master.state.runstate.RunState` (which imports
    this module, so it is not imported here)."""

    jobs: JobList
    results: Results
    unbuilt: Unbuilt
    reused: int

    def run_first(self, first: dict[int, str]) -> None: ...

    def run_later(self, indexes: list[int]) -> None: ...

    def record_cached(self, indexes: list[int], values: list[str]) -> int: ...


@dataclass
class Group:
    """The hits of one pass with the same builds (``pairs``) and maker node."""

    pairs: Pairs
    maker_node: str
    #: Held jobs: index -> the cached value (``<maker> <text>``).
    held: dict[int, str] = field(default_factory=dict)
    pending: int = 0           # samples out
    replacements: int = 0      # samples replaced so far (unsure results)
    state: str = "checking"    # checking, agreed, withdrawn, unverified


@dataclass
class Sample:
    """A job run again to check its cached result ``value`` (``<maker> <text>``)."""

    index: int
    value: str
    group: Group
    run_pass: list[Group]


@dataclass(frozen=True)
class Check:
    """One line of the record (:func:`read_record`)."""

    kind: str                 # agreed, mismatch, unsure, unverified
    test: str = ""
    maker: str = ""           # <node>@<run> of the cached result
    cached: str = ""          # its digest (md5, or "error N")
    node: str = ""            # the node that ran the sample
    new: str = ""             # the sample's digest (or, for unsure, why)
    pairs: Pairs = ()         # the builds (a mismatch's withdrawn ones; unverified's)
    count: int = 0            # unverified: the jobs run for it

    def line(self) -> str:
        return "\t".join([self.kind, self.test, self.maker, self.cached, self.node, self.new,
                          ",".join(f"{p}={d}" for p, d in self.pairs), str(self.count)])

    @classmethod
    def parse(cls, line: str) -> Check:
        words = line.split("\t")
        if len(words) != 8 or words[0] not in ("agreed", "mismatch", "unsure", "unverified"):
            raise ValueError(f"not a check line: {line[:120]!r}")
        pairs = tuple(tuple(w.split("=", 1)) for w in words[6].split(",") if "=" in w)
        return cls(words[0], words[1], words[2], words[3], words[4], words[5],
                   pairs, int(words[7]))  # type: ignore[arg-type]


def _digest_of(text: str) -> tuple[str, bool]:
    """(digest, comparable) of a canonical result text ``<test> <error> ... <md5> ...``."""
    words = text.split(" ")
    return digest(int(words[1]), words[5]), words[1] in CACHED_ERRORS


class ReuseChecks:
    """One run's checks of what it takes from the result cache (see the module doc)."""

    def __init__(self, cache: ResultCache, withdrawn: set[tuple[str, str]], run_id: str,
                 record: Path, fraction: float, rng: random.Random | None = None) -> None:
        """``cache``: the store a mismatch withdraws from; ``withdrawn``: the run's set of
        withdrawn pairs (:attr:`cluster.master.cache.reuse.RunReuse.withdrawn`), added to."""
        self.cache = cache
        self.withdrawn = withdrawn
        self.run_id = run_id
        self.record = record
        self.fraction = fraction
        self.rng = rng or random.Random()
        #: Samples out: test name -> Sample.  Empty: nothing to look at per request.
        self.samples: dict[str, Sample] = {}
        self.passes: list[list[Group]] = []

    # ------------------------------------------------------------------ a pass
    def take(self, state: RunState, digests: Pairs, indexes: Sequence[int],
             values: Sequence[str], notes: list[str]) -> None:
        """A pass's hits for the build ``digests`` (job ``indexes``, cached ``values``):
        grouped, sampled, held; the samples put first in the list, away from their
        makers."""
        served = dict(digests)
        groups: dict[tuple[Pairs, str], Group] = {}
        lines = state.jobs.lines(list(indexes))
        for i, value, line in zip(indexes, values, lines, strict=True):
            inputs = job_inputs(line)
            if inputs is None:
                continue  # (resolve found a key, so it has inputs)
            maker = split_cached(value)[0]
            maker_node = maker.partition("@")[0]
            pairs = tuple((p, served.get(p, "")) for p in inputs[0])
            group = groups.get((pairs, maker_node))
            if group is None:
                group = groups[(pairs, maker_node)] = Group(pairs, maker_node)
            group.held[i] = value
        if not groups:
            return
        run_pass = list(groups.values())
        self.passes.append(run_pass)
        first: dict[int, str] = {}
        for group in run_pass:
            count = min(len(group.held), max(1, math.ceil(self.fraction * len(group.held))))
            for i in self.rng.sample(sorted(group.held), count):
                self._add_sample(state, group, run_pass, i, first)
        state.unbuilt.hold([i for g in run_pass for i in g.held])
        state.run_first(first)
        notes.append(f"result cache: {sum(len(g.held) for g in run_pass)} results held until "
                     f"{len(first)} of them, run again, agree ({len(run_pass)} group(s) of "
                     "builds and maker nodes)")

    def _add_sample(self, state: RunState, group: Group, run_pass: list[Group], i: int,
                    first: dict[int, str]) -> None:
        value = group.held.pop(i)
        name = state.jobs.names[i]
        self.samples[name] = Sample(i, value, group, run_pass)
        group.pending += 1
        first[i] = group.maker_node

    # ------------------------------------------------------------------ results
    def on_results(self, state: RunState, data: bytes, notes: list[str]) -> None:
        """The new results ``data`` (journal lines) were recorded: settle the samples among
        them (journal lines of cached results recorded go to ``state.made_results``)."""
        samples = self.samples
        for raw in data.split(b"\n"):
            if not raw:
                continue
            line = raw.decode("utf-8", "replace")
            machine, text = split_line(line)
            sample = samples.get(text.partition(" ")[0])
            if sample is None or machine.startswith(CACHE_PREFIX):
                continue
            del samples[text.partition(" ")[0]]
            self._settle(state, sample, machine, text, notes)

    def _settle(self, state: RunState, sample: Sample, node: str, text: str,
                notes: list[str]) -> None:
        group = sample.group
        group.pending -= 1
        maker, cached_text = split_cached(sample.value)
        test = text.partition(" ")[0]
        cached, _ = _digest_of(cached_text)
        new, comparable = _digest_of(text)
        if group.state != "checking":
            pass  # withdrawn meanwhile: its result is an ordinary one
        elif not comparable:
            self._write(Check("unsure", test, maker, cached, node, new))
            if group.held and group.replacements < MAX_REPLACEMENTS:
                group.replacements += 1
                i = self.rng.choice(sorted(group.held))
                first: dict[int, str] = {}
                self._add_sample(state, group, sample.run_pass, i, first)
                state.unbuilt.release([i])
                state.run_first(first)
            else:
                group.state = "unverified"
                ran = self._run(state, group)
                self._write(Check("unverified", maker=maker, node=group.maker_node,
                                  pairs=group.pairs, count=ran))
                notes.append(f"result cache: {test}'s check ran into {new} on {node}; the "
                             f"{ran} results of {group.maker_node} held with it are run")
        elif new == cached:
            self._write(Check("agreed", test, maker, cached, node, new))
            if not group.pending:
                group.state = "agreed"
        else:
            self._mismatch(state, Check("mismatch", test, maker, cached, node, new,
                                        group.pairs), notes)
        self._end_pass(state, sample.run_pass, notes)

    def _mismatch(self, state: RunState, check: Check, notes: list[str]) -> None:
        """A sample disagreed: its builds withdrawn from the store and from this run."""
        pairs = tuple(pair for pair in check.pairs if pair[1])
        self.cache.withdraw(pairs, self.run_id, check.test)
        self.withdrawn.update(pairs)
        self._write(check, sync=True)
        ran = 0
        for run_pass in self.passes:
            for group in run_pass:
                if group.state in ("checking", "agreed") and set(group.pairs) & set(pairs):
                    group.state = "withdrawn"
                    ran += self._run(state, group)
                    for name in [n for n, s in self.samples.items() if s.group is group]:
                        del self.samples[name]  # its other samples are ordinary jobs now
        notes.append(f"result cache: MISMATCH: {check.test} was {check.cached} (made by "
                     f"{check.maker}), now {check.new} on {check.node}: the cached results "
                     f"of {', '.join(f'{p} {d[:12]}' for p, d in pairs)} are withdrawn, "
                     f"{ran} held results of this run are run instead")

    def _end_pass(self, state: RunState, run_pass: list[Group], notes: list[str]) -> None:
        """Every sample of ``run_pass`` settled: its agreed groups' held results recorded."""
        if any(g.state == "checking" for g in run_pass):
            return
        withdrawn = self.withdrawn
        recorded = 0
        for group in run_pass:
            if group.state != "agreed" or not group.held:
                continue
            if withdrawn & set(group.pairs):
                self._run(state, group)
                continue
            indexes = state.unbuilt.release(sorted(group.held))
            offsets = state.results.offsets
            indexes = [i for i in indexes if offsets[i] < 0]
            values = [group.held[i] for i in indexes]
            group.held.clear()
            recorded += state.record_cached(indexes, values)
        if recorded:
            notes.append(f"result cache: {recorded} results taken (their checks agreed)")

    def _run(self, state: RunState, group: Group) -> int:
        """The held jobs of ``group`` are run: released and put in the list."""
        released = state.unbuilt.release(sorted(group.held))
        group.held.clear()
        offsets = state.results.offsets
        state.run_later([i for i in released if offsets[i] < 0])
        return len(released)

    def _write(self, check: Check, sync: bool = False) -> None:
        with open(self.record, "a", encoding="utf-8") as fh:
            fh.write(check.line() + "\n")
            if sync:
                fh.flush()
                os.fsync(fh.fileno())


def grouped(values: Iterable[tuple[int, str]]) -> dict[str, tuple[list[int], list[str]]]:
    """(job index, ``<maker> <text>``) pairs by maker: maker -> (indexes, texts)."""
    out: dict[str, tuple[list[int], list[str]]] = defaultdict(lambda: ([], []))
    for i, value in values:
        maker, text = split_cached(value)
        indexes, texts = out[maker]
        indexes.append(i)
        texts.append(text)
    return out


def prefix(maker: str) -> str:
    """The journal line prefix of results made by ``maker`` (``<node>@<run>``)."""
    return line_prefix(CACHE_PREFIX + maker)


def read_record(run_dir: Path) -> list[Check]:
    """The checks a run recorded (:data:`RECORD_FILE`), by any of its masters."""
    try:
        text = (run_dir / RECORD_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            out.append(Check.parse(line))
        except ValueError as exc:
            log.warning("%s:%d: %s; skipped", run_dir / RECORD_FILE, n, exc)
    return out


# ---------------------------------------------------------------------- the report
def ran_per_program(state: RunState, builds: dict[str, Pairs]
                    ) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """(program -> the run's jobs calling it that a node ran, (program, digest) -> those
    of them run by a node whose build of the program had that digest): one walk over the
    jobs with a result, at the run's end."""
    by_program: dict[str, int] = defaultdict(int)
    by_pair: dict[tuple[str, str], int] = defaultdict(int)
    keyed = {node: dict(d) for node, d in builds.items()}
    results, jobs = state.results, state.jobs
    total = len(jobs)
    for low in range(0, total, 4096):
        todo = [i for i in range(low, min(total, low + 4096)) if results.has(i)]
        for i, line in zip(todo, jobs.lines(todo), strict=True):
            machine = results.line(i).partition(" ")[0]
            if machine.startswith(CACHE_PREFIX):
                continue
            inputs = job_inputs(line)
            if inputs is None:
                continue
            build = keyed.get(machine, {})
            for program in inputs[0]:
                by_program[program] += 1
                if program in build:
                    by_pair[(program, build[program])] += 1
    return by_program, by_pair


@dataclass(frozen=True)
class ReuseReport:
    """What the report says of the result cache: ``lines`` near its top, ``section``
    (the checks' own, "" when nothing was checked)."""

    lines: list[str]
    section: str


def report(state: RunState, run_dir: Path, builds: dict[str, Pairs],
           keychanges: Sequence[tuple[str, tuple[tuple[str, int, tuple[str, ...]], ...]]],
           ) -> ReuseReport:
    """The report's lines on the results reused (``state.reused``, their machine column),
    on the key changes the nodes named (``keychanges``: "gs on node1: <part> changed; 225
    jobs run again", the count being the run's jobs calling that program that a node ran),
    and the section on the checks of the run's masters (:func:`read_record`)."""
    checks = read_record(run_dir)
    lines: list[str] = []
    if state.reused:
        lines.append(f"{state.reused} of {len(state.jobs)} tests reused from earlier complete "
                     "runs (build, test file and command unchanged; machine column "
                     "cache:<node>@<run>, the node and run that made the result)")
    trouble = [c for c in checks if c.kind in ("mismatch", "unverified")]
    ran: tuple[dict[str, int], dict[tuple[str, str], int]] | None = None
    if keychanges or trouble:
        ran = ran_per_program(state, builds)
    latest: dict[str, tuple[tuple[str, int, tuple[str, ...]], ...]] = {}
    for node, changes in keychanges:
        latest[node] = changes
    for node, changes in sorted(latest.items()):
        for program, count, parts in changes:
            assert ran is not None
            named = ", ".join(parts) or "its key"
            more = f" and {count - len(parts)} more" if count > len(parts) else ""
            jobs = ran[0].get(program, 0)
            lines.append(f"{program} on {node}: {named}{more} changed; {jobs} job"
                         f"{'s' if jobs != 1 else ''} run again")
    if not checks:
        return ReuseReport(lines, "")
    samples = [c for c in checks if c.kind in ("agreed", "mismatch")]
    agreed = sum(1 for c in samples if c.kind == "agreed")
    unsure = sum(1 for c in checks if c.kind == "unsure")
    out = ["Reused results checked", "-" * 22,
           f"{len(samples) + unsure} of the results this run would take from the result cache "
           f"were run again as a check (reuse_verify): {agreed} agreed, "
           f"{len(samples) - agreed} did not"
           + (f", {unsure} gave no result to compare" if unsure else "") + "."]
    for check in trouble:
        builds_named = ", ".join(f"{p} {d[:12]}" for p, d in check.pairs)
        count = sum(ran[1].get(pair, 0) for pair in check.pairs) if ran is not None else 0
        maker_node, _, maker_run = check.maker.partition("@")
        if check.kind == "mismatch":
            out.append(f"MISMATCH {check.test}: cached {check.cached} (made by {maker_node} "
                       f"in run {maker_run}), now {check.new} on {check.node}")
            out.append(f"  withdrawn: every cached result of {builds_named} (any node, any "
                       f"run); {count} job{'s' if count != 1 else ''} calling it run again "
                       "in this run, and later runs do not reuse them")
        else:
            out.append(f"NOT CHECKED: the {check.count} cached result"
                       f"{'s' if check.count != 1 else ''} of {builds_named} made by "
                       f"{check.node}: no sample gave a result to compare; run instead")
    if unsure and not any(c.kind == "unverified" for c in checks):
        out.append("(a sample with no result to compare was replaced by another)")
    return ReuseReport(lines, "\n".join(out) + "\n\n")
