"""A ``.dag`` file: a graph of runs queued at once, all or nothing (``clusteradmin dag FILE``;
docs/runoptions.md section 5).

One run per line, as a queue line, with an optional ``priority=N`` word (0, 1 or 2; by
default the run's kind's: ``user`` 0, ``git`` 1, ``auto`` 2); blank lines and ``#``
comments are skipped::

    user bob gs name=A
    user bob pcl name=B after=A
    auto nightly gs name=C after=A,B priority=1

Every line is checked before anything is queued: its grammar (``cluster.queue``), a name
given twice, an ``after=`` naming no run (not in the file, not queued, not running, not
ended), a cycle (among the file's runs and the queued ones), a run already queued.  The
three queues are held locked together (:func:`cluster.queue.holding_all`) while the graph
is checked against them and written, so no run of it is queued unless every run is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cluster import deps
from cluster.defaults import AUTO_PRIORITY, COMMIT_PRIORITY, PRIORITIES, USER_PRIORITY
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile, holding_all
from cluster.runspec import RunSpec

#: The largest .dag file read [bytes], and the most runs in one.
MAX_DAG_BYTES = 1 << 20
MAX_DAG_RUNS = 1000
#: Each kind's priority when a line gives none.
KIND_PRIORITY = {"user": USER_PRIORITY, "git": COMMIT_PRIORITY, "auto": AUTO_PRIORITY}


class DagError(ClusterError):
    """A .dag file that cannot be queued; the message names the file, the line and why.
    Nothing of it was queued."""


@dataclass(frozen=True)
class DagRun:
    """One run of a .dag file: where it is (``file:line``), its priority and its run."""

    label: str
    priority: int
    spec: RunSpec


def parse_dag(text: str, source: str) -> list[DagRun]:
    """The runs of a .dag file's ``text`` (``source`` names it in messages); DagError for a
    bad line, a bad ``priority=``, no run or too many."""
    runs: list[DagRun] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        label = f"{source}:{lineno}"
        given = [w for w in words if w.startswith("priority=")]
        if len(given) > 1:
            raise DagError(f"{label}: priority= given twice; expected it at most once")
        try:
            spec = RunSpec.parse(" ".join(w for w in words if w not in given), source,
                                 lineno)
        except QueueLineError as exc:
            raise DagError(f"{label}: {exc.problem}") from None
        priority = KIND_PRIORITY[spec.kind]
        if given:
            value = given[0].partition("=")[2]
            if value not in {str(p) for p in PRIORITIES}:
                raise DagError(f"{label}: {given[0]}: expected priority=0, 1 or 2")
            priority = int(value)
        runs.append(DagRun(label, priority, spec))
        if len(runs) > MAX_DAG_RUNS:
            raise DagError(f"{source}: more than {MAX_DAG_RUNS} runs; expected at most "
                           f"{MAX_DAG_RUNS}")
    if not runs:
        raise DagError(f"{source}: no run; expected one run per line "
                       "('<kind> <ref> <products> [option ...] [priority=N]')")
    return runs


def read_dag(path: Path) -> list[DagRun]:
    """The runs of the .dag file ``path`` (at most :data:`MAX_DAG_BYTES`); DagError naming
    it when it cannot be read or a line is bad."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_DAG_BYTES + 1)
    except OSError as exc:
        raise DagError(f"{path}: cannot read it ({exc.strerror}); expected a .dag file") \
            from None
    if len(data) > MAX_DAG_BYTES:
        raise DagError(f"{path}: larger than {MAX_DAG_BYTES} bytes; expected a smaller file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DagError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_dag(text, str(path))


def check_dag(home: Home, runs: list[DagRun]) -> None:
    """Check the graph ``runs`` as :func:`queue_dag` would queue it now, without queuing
    anything (a name given twice, an ``after=`` naming no run, a cycle: DagError naming
    it); a run already queued is no error here (a schedule queues it later)."""
    queued = {p: QueueFile.for_priority(home, p).read() for p in PRIORITIES}
    try:
        deps.check_graph([(r.label, r.spec) for r in runs], queued,
                         deps.Resolver(home, queued))
    except deps.GraphError as exc:
        raise DagError(str(exc)) from None


def queue_dag(home: Home, runs: list[DagRun]) -> None:
    """Queue ``runs`` all together, or none (DagError naming the run and why; see the
    module docstring)."""
    with holding_all([QueueFile.for_priority(home, p) for p in PRIORITIES]) as all_held:
        held = dict(zip(PRIORITIES, all_held, strict=True))
        queued = {p: h.runs for p, h in held.items()}
        for run in runs:
            if run.spec in queued[run.priority]:
                raise DagError(f"{run.label}: '{run.spec.line()}' is already queued at "
                               f"priority {run.priority}; expected a new run")
        try:
            deps.check_graph([(r.label, r.spec) for r in runs], queued,
                             deps.Resolver(home, queued))
        except deps.GraphError as exc:
            raise DagError(str(exc)) from None
        for run in runs:
            held[run.priority].add(run.spec)
