"""Dependencies between runs (docs/runoptions.md section 5): which queued run may
start, which must leave its queue because a run it waits for ended badly, and whether a
graph of new runs (a ``.dag`` file) may be queued.

A run's dependencies are its ``after=`` references and, for a bmpcmp run, the run it
compares (see :func:`implicit`).  A reference is a run name (``name=``) or a run id:

* **a name** ``X``: while any run named ``X`` is queued or running, in any priority's
  queue, the reference is *waiting*; otherwise it is the latest ended run named ``X``, as
  ``names/X`` in the master home records it (:func:`record_end`, written by the end of
  every run that has a name, before its line leaves its queue, so a name is never seen
  neither queued nor ended while its run ends);
* **a run id** (a name no run has): ``archive/<id>/run.info`` gives its outcome; a run
  folder ``runs/<id>/`` without it is a run being served or ended: *waiting*.

An ended run is *met* when its outcome is ``done``; any other outcome (failed, aborted or
stopped, timed out, gave up, unstartable -- which a run dropped for its own dependencies
is) *fails* the runs after it.  A reference that is neither is *unknown*, and fails them
too.  The state is the queue files and ``names/``, so it holds across priorities (each
priority's master reads every queue) and survives a master's restart.

Cost: :func:`needs_look` says whether a queue's head can be served as before (no
``after=``, no bmpcmp) without reading anything more; otherwise each reference costs a
dictionary look-up, or one small file read.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cluster.home import Home
from cluster.runoptions import NAME, order_of, parse_names
from cluster.runspec import RunSpec
from cluster.runtime import fsutil

log = logging.getLogger("cluster.deps")

#: The outcome of an ended run that lets the runs after it start (ending.Outcome.DONE).
ENDED_WELL = "done"
#: The outcome of a run queued again for another attempt: it has not ended.
RETRY = "retry"
#: The most bytes of ``run.info`` or a name record read (a queue line is at most 4096).
MAX_RECORD = 1 << 16

#: Every priority's queued runs, in queue order: {priority: [spec, ...]}.
Queued = Mapping[int, Sequence[RunSpec]]


class State(enum.Enum):
    """Where a dependency stands."""

    MET = "met"          # ended well
    WAITING = "waiting"  # queued, running or ending
    FAILED = "failed"    # ended otherwise
    UNKNOWN = "unknown"  # no run by that name or id


@dataclass(frozen=True)
class Ended:
    """An ended run: its id and outcome (``done``, ``failed``, ...)."""

    run_id: str
    outcome: str


@dataclass(frozen=True)
class Dep:
    """One dependency of a run: what it refers to, where it stands, and how a message says
    so (``nightly-build (run 2026...-p0-ab12, outcome failed)``)."""

    ref: str
    state: State
    detail: str = ""

    def describe(self) -> str:
        return f"{self.ref} ({self.detail})" if self.detail else self.ref


@dataclass(frozen=True)
class Verdict:
    """A queued run's dependencies taken together: ``failed`` (the first that failed or is
    unknown, else None) and ``waiting`` (those still waited for)."""

    failed: Dep | None = None
    waiting: tuple[Dep, ...] = ()

    @property
    def ready(self) -> bool:
        return self.failed is None and not self.waiting

    def reason(self) -> str:
        """Why the run leaves its queue (``failed`` set)."""
        dep = self.failed
        assert dep is not None
        if dep.state is State.UNKNOWN:
            return (f"it waits for {dep.ref}, which names no run (none queued, running or "
                    "ended by that name or id)")
        return f"it waits for {dep.describe()}, which did not end well"


@dataclass
class Choice:
    """What a priority's master does next: serve ``serve`` (None: nothing is ready), after
    dropping each of ``drop`` (spec, reason) with a report; ``waiting`` are the runs passed
    over (spec, the dependencies they wait for)."""

    serve: RunSpec | None = None
    drop: list[tuple[RunSpec, str]] = field(default_factory=list)
    waiting: list[tuple[RunSpec, tuple[Dep, ...]]] = field(default_factory=list)

    @property
    def has_work(self) -> bool:
        """Whether the master has a run to serve or to drop."""
        return self.serve is not None or bool(self.drop)


# ---------------------------------------------------------------------------- records
def record_end(home: Home, name: str, run_id: str, outcome: str) -> None:
    """Record that run ``run_id``, named ``name``, ended with ``outcome`` (``names/<name>``,
    replaced atomically: the latest ended run of a name is the one that counts).  A run
    queued again (``retry``) has not ended: nothing is recorded."""
    if outcome == RETRY or not NAME.fullmatch(name):
        return
    home.run_names.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write(home.run_names / name, f"{run_id} {outcome}\n")


def _read_small(path_text: str) -> str | None:
    try:
        with open(path_text, "rb") as fh:
            return fh.read(MAX_RECORD).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("cannot read %s (%s); taking it as absent", path_text, exc)
        return None


def ended_by_name(home: Home, name: str) -> Ended | None:
    """The latest ended run named ``name`` (``names/<name>``), or None."""
    if not NAME.fullmatch(name):
        return None
    text = _read_small(str(home.run_names / name))
    if text is None:
        return None
    words = text.split()
    if len(words) != 2:
        log.warning("%s: %r is not '<run id> <outcome>'; taking the name as never ended",
                    home.run_names / name, text[:200])
        return None
    return Ended(words[0], words[1])


def ended_by_id(home: Home, run_id: str) -> Ended | None:
    """Run ``run_id``'s end (the ``outcome`` line of ``archive/<id>/run.info``), or None."""
    if not NAME.fullmatch(run_id):
        return None
    text = _read_small(str(home.archive / run_id / "run.info"))
    if text is None:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "outcome" and value.strip():
            return Ended(run_id, value.strip())
    return None


def started(home: Home, run_id: str) -> bool:
    """Whether run ``run_id`` is being served or ended (its folder ``runs/<id>/``)."""
    return NAME.fullmatch(run_id) is not None and home.run_dir(run_id).is_dir()


# ---------------------------------------------------------------------------- resolving
def after_refs(spec: RunSpec) -> tuple[str, ...]:
    """The runs ``spec`` names in ``after=``."""
    value = spec.option("after")
    return parse_names("after", value) if value else ()


def run_name(spec: RunSpec) -> str:
    """``spec``'s ``name=``, or ""."""
    return spec.option("name") or ""


def is_bmpcmp(spec: RunSpec) -> bool:
    return spec.has_flag("bmpcmp")


def needs_look(spec: RunSpec) -> bool:
    """Whether ``spec`` may have to wait for another run (``after=``, or a bmpcmp run)."""
    return spec.option("after") is not None or is_bmpcmp(spec)


def implicit(spec: RunSpec, priority: int, position: int, queued: Queued) -> tuple[Dep, ...]:
    """The runs a bmpcmp run waits for without naming them: it compares its user's newest
    run (``cluster.master.end.finish.last_user_run``), so every other run of that user queued
    before it in its own queue (``position``: its index there), or anywhere in another
    priority's queue, ends first.  Whether they end well does not matter."""
    if not is_bmpcmp(spec) or spec.kind != "user":
        return ()
    deps: list[Dep] = []
    for p, runs in sorted(queued.items()):
        ahead = runs[:position] if p == priority else runs
        for other in ahead:
            if other.kind == "user" and other.ref == spec.ref and not is_bmpcmp(other):
                deps.append(Dep(f"{other.ref}'s run '{other.line()}'", State.WAITING,
                                "the run bmpcmp compares"))
    return tuple(deps)


class Resolver:
    """Where each reference stands, for one look at the queues (``queued``) and the home's
    records.  :meth:`drop` makes a run dropped during the look count as failed for the
    runs after it in the same look."""

    def __init__(self, home: Home, queued: Queued) -> None:
        self.home = home
        self.queued_names: dict[str, int] = {}
        for runs in queued.values():
            for spec in runs:
                name = run_name(spec)
                if name:
                    self.queued_names[name] = self.queued_names.get(name, 0) + 1
        self.dropped: set[str] = set()
        self._ended: dict[str, Ended | None] = {}

    def drop(self, spec: RunSpec) -> None:
        name = run_name(spec)
        if name:
            self.queued_names[name] -= 1
            if not self.queued_names[name]:
                del self.queued_names[name]
            self.dropped.add(name)

    def dep(self, ref: str) -> Dep:
        if self.queued_names.get(ref):
            return Dep(ref, State.WAITING, "queued or running")
        if ref in self.dropped:
            return Dep(ref, State.FAILED, "dropped: a run it waits for did not end well")
        ended = self._ended_name(ref)
        if ended is None:
            ended = ended_by_id(self.home, ref)
            if ended is None:
                if started(self.home, ref):
                    return Dep(ref, State.WAITING, "running")
                return Dep(ref, State.UNKNOWN)
        if ended.outcome == ENDED_WELL:
            return Dep(ref, State.MET, f"run {ended.run_id}, done")
        if ended.outcome == RETRY:  # an id of an attempt queued again: the run goes on
            return Dep(ref, State.FAILED, f"run {ended.run_id}, lost its nodes and was "
                       "queued again under a new id; name runs with name= to follow them")
        return Dep(ref, State.FAILED, f"run {ended.run_id}, outcome {ended.outcome}")

    def _ended_name(self, name: str) -> Ended | None:
        if name not in self._ended:
            self._ended[name] = ended_by_name(self.home, name)
        return self._ended[name]

    def known(self, ref: str) -> bool:
        """Whether ``ref`` names a run that is queued, running or ended (submission)."""
        return self.dep(ref).state is not State.UNKNOWN


def verdict(spec: RunSpec, priority: int, position: int, queued: Queued,
            resolver: Resolver) -> Verdict:
    """Where ``spec`` (at index ``position`` of ``priority``'s queue) stands."""
    waiting: list[Dep] = []
    for ref in after_refs(spec):
        dep = resolver.dep(ref)
        if dep.state in (State.FAILED, State.UNKNOWN):
            return Verdict(failed=dep)
        if dep.state is State.WAITING:
            waiting.append(dep)
    waiting.extend(implicit(spec, priority, position, queued))
    return Verdict(waiting=tuple(waiting))


def serving_order(runs: Sequence[RunSpec],
                  later: Callable[[RunSpec], bool] | None = None
                  ) -> list[tuple[int, RunSpec]]:
    """``runs`` (one queue, in file order) as (position, run) in the order a master looks
    at them: lowest ``order=`` first (docs/runoptions.md, "Order within a queue"), file
    order among equals (a stable sort).  ``later``: runs it is true of come after every
    other (a lane prefers a user who has no run served: docs/runoptions.md, "Fair share")."""
    if later is None:
        return sorted(enumerate(runs), key=lambda item: order_of(item[1].options))
    return sorted(enumerate(runs),
                  key=lambda item: (later(item[1]), order_of(item[1].options)))


def choose(priority: int, queued: Queued, resolver: Resolver, *,
           skip: Callable[[int, RunSpec], bool] | None = None,
           later: Callable[[RunSpec], bool] | None = None) -> Choice:
    """The next run of ``priority``: the first queued run, in :func:`serving_order`, whose
    dependencies are all met; each run before it whose dependency failed (or names no run)
    is dropped, and the others before it wait.  The look stops at the run it serves.
    ``skip(position, run)``: runs not looked at (served by another lane, or not this
    lane's to take: :mod:`cluster.master.run.nextrun`); ``later``: as for
    :func:`serving_order`."""
    choice = Choice()
    for position, spec in serving_order(queued.get(priority, ()), later):
        if skip is not None and skip(position, spec):
            continue
        found = verdict(spec, priority, position, queued, resolver)
        if found.failed is not None:
            choice.drop.append((spec, found.reason()))
            resolver.drop(spec)
        elif found.waiting:
            choice.waiting.append((spec, found.waiting))
        else:
            choice.serve = spec
            break
    return choice


# ---------------------------------------------------------------------------- submission
class GraphError(ValueError):
    """A graph of runs that cannot be queued: the message names the run and the problem."""


def check_graph(new: Sequence[tuple[str, RunSpec]], queued: Queued,
                known: Resolver | None = None) -> None:
    """Check runs about to be queued together (``new``: (label for messages, spec), e.g.
    ``dag.txt:3``) against the runs already queued (``queued``) and the ended ones
    (``known``; None: no run has ended).  GraphError for a name given twice in ``new``, an
    ``after=`` naming no run (not in ``new``, not queued, not running, not ended) or a
    cycle (named run by run: ``A -> B -> A``)."""
    defined: dict[str, str] = {}
    for label, spec in new:
        name = run_name(spec)
        if name in defined:
            raise GraphError(f"{label}: name={name} is given twice (also at "
                             f"{defined[name]}); expected each name once in a graph")
        if name:
            defined[name] = label
    resolver = known
    queued_names = {run_name(s) for runs in queued.values() for s in runs} - {""}
    for label, spec in new:
        for ref in after_refs(spec):
            if ref in defined or ref in queued_names:
                continue
            if resolver is None or not resolver.known(ref):
                raise GraphError(f"{label}: after={ref} names no run: not in the graph, not "
                                 "queued, not running, not ended; expected a run's name= or "
                                 "a run id")
    edges: dict[str, set[str]] = {}
    for spec in [s for _label, s in new] + [s for runs in queued.values() for s in runs]:
        name = run_name(spec)
        if name:
            edges.setdefault(name, set()).update(after_refs(spec))
    cycle = find_cycle(edges)
    if cycle:
        where = ", ".join(f"{n} at {defined[n]}" if n in defined else f"{n} (queued)"
                          for n in dict.fromkeys(cycle))
        raise GraphError(f"the runs wait for each other in a cycle: {' -> '.join(cycle)} "
                         f"({where}); expected a graph without cycles")


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """A cycle of ``edges`` (name -> the names it waits for) as ``[a, b, ..., a]``, or []
    when there is none.  Iterative depth-first search: each name and edge visited once."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(edges, WHITE)
    for root in sorted(edges):
        if colour[root] != WHITE:
            continue
        path = [root]
        stack = [iter(sorted(edges[root]))]
        colour[root] = GREY
        while stack:  # bounded: each edge is taken once
            child = next(stack[-1], None)
            if child is None:
                colour[path.pop()] = BLACK
                stack.pop()
                continue
            if child not in colour:
                continue  # a run outside the graph (ended, or an id): no edges
            if colour[child] == GREY:
                return path[path.index(child):] + [child]
            if colour[child] == WHITE:
                colour[child] = GREY
                path.append(child)
                stack.append(iter(sorted(edges[child])))
    return []


# ---------------------------------------------------------------------------- display
def waits(home: Home, queued: Queued) -> dict[tuple[int, int], str]:
    """What each queued run that cannot start waits for, as ``clusteradmin stat`` says it:
    {(priority, index in its queue): "waits for A (queued or running), ..."} or "leaves its
    queue: ..." for one whose dependency failed (its master drops it at its next look).
    Nothing is read when no queued run has a dependency."""
    if not any(needs_look(s) for runs in queued.values() for s in runs):
        return {}
    resolver = Resolver(home, queued)
    found: dict[tuple[int, int], str] = {}
    for priority, runs in sorted(queued.items()):
        for index, spec in enumerate(runs):
            if not needs_look(spec):
                continue
            seen = verdict(spec, priority, index, queued, resolver)
            if seen.failed is not None:
                found[(priority, index)] = f"leaves its queue: {seen.reason()}"
            elif seen.waiting:
                found[(priority, index)] = "waits for " + ", ".join(
                    d.describe() for d in seen.waiting)
    return found
