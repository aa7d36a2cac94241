"""One archived job run again on a node on any machine, through the cluster's own protocol:
a **repro run** (docs/operating.md, "Reproducing one job: `clusteradmin repro`").

The master never reaches its nodes (they call it), so ``clusteradmin repro`` does not go
to the node: it queues a run that only that node may take, and reads its archive once it
ended.  :func:`repro_spec` is its queue line, built from the archived run's job.start::

    <kind> <ref> <products> [tree=T] [relaxtimeout] [task_timeout=D]
        repro=<run>:<test> nodes=<node> reuse=no confirm=no job_timeout=W queue_timeout=W

* the archived run's kind, ref and products, and the options that decide how its node ran
  a job (``tree=``, ``relaxtimeout``, ``task_timeout=``), so the master builds the same
  source the ``--here`` repro builds: a user run's snapshot kept in its archive (linked
  into the repro run's folder), a commit run's commit (exported again), any other run's
  tree in the master home as it is now;
* ``repro=<run>:<test>``: the run's job list is that test's archived line as it is, its
  own timeout included (:meth:`cluster.master.run.runsetup.RunSetup.repro_jobs`), and the
  run never becomes part of the stream (:func:`cluster.runspec.outside_stream`: its end
  skips tables, cache, mail and clean tree, as a bisection run's);
* ``nodes=<node>``: only that node may take it (docs/runoptions.md, section 4);
* ``reuse=no``: the job runs, never taken from the result cache; ``confirm=no``: once;
* ``job_timeout`` and ``queue_timeout`` of the wait (``--wait-timeout``), so a run whose node
  never comes ends by itself, archived with the reason, and leaves no queue line behind.

It goes in the priority-0 queue (:data:`REPRO_PRIORITY`): a person waits for it, and it
is one job.  :func:`result` reads the ended run's archive: its ``.tab`` row of the test,
the node's log block of the job, and the keys the node's build log gave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cluster.console import repro
from cluster.console.repro import Found, NodeKeys, ReproCannot, ReproUsage
from cluster.console.runinfo import parse_info
from cluster.defaults import USER_PRIORITY
from cluster.home import Home
from cluster.master.files import reprokeep
from cluster.queue import QueueFile
from cluster.report import tab
from cluster.runoptions import MAX_DURATION, NAME
from cluster.runspec import SWEEP, RunSpec

#: The queue a repro run goes in: a developer waits for its one job.
REPRO_PRIORITY = USER_PRIORITY
#: The archived run's options that decide how its node ran a job, carried over.
CARRIED = ("tree", "relaxtimeout", "task_timeout")
#: The longest ``--wait-timeout`` [s]: a run's longest job_timeout.
MAX_WAIT = MAX_DURATION


def repro_spec(found: Found, node: str, wait: float) -> RunSpec:
    """The queue line of the repro run of ``found`` on ``node``, ended by the master
    after ``wait`` seconds at most (module docstring).  ReproCannot when the run's job
    cannot be run so (a sweep run's task; a user run whose archive kept no snapshot)."""
    start = found.start
    if SWEEP in start.products:
        raise ReproCannot(f"run {found.run} is a sweep run: its tasks are not run again one "
                          "by one")
    if start.kind == "user" and reprokeep.kept_source(found.archive, start.tree) is None:
        raise ReproCannot(f"run {found.run} kept no source snapshot "
                          f"({found.archive / reprokeep.SOURCE_DIR / start.tree}): a node "
                          "cannot build it again")
    seconds = min(max(1, math.ceil(wait)), int(MAX_WAIT))
    carried = [o for o in start.options if o.partition("=")[0] in CARRIED]
    return RunSpec(start.kind, start.ref, start.products, (
        *carried, f"repro={found.run}:{found.job.name}", f"nodes={node}", "reuse=no",
        "confirm=no", f"job_timeout={seconds}", f"queue_timeout={seconds}"))


def check_node(home: Home, found: Found, node: str) -> None:
    """ReproUsage unless ``node`` is a node name this master knows: heard of by its
    monitor (``nodes/<node>.*``), or in the run's archived logs."""
    if not NAME.fullmatch(node):
        raise ReproUsage(f"bad node name {node!r}: expected letters, digits, '.', '_' or '-'")
    known = any((home.nodes / f"{node}{suffix}").exists()
                for suffix in (".up", ".caps", ".status"))
    if not known and not (found.archive / "logs" / f"{node}.log").exists():
        raise ReproUsage(f"unknown node {node!r}: expected a node this master has heard "
                         f"from (a file {home.nodes}/{node}.up) or one of run {found.run}'s")


def queue(home: Home, spec: RunSpec) -> bool:
    """Append ``spec`` to the repro queue; False when the same line waits there already
    (it is then that run that ends)."""
    return QueueFile.for_priority(home, REPRO_PRIORITY).append(spec)


@dataclass(frozen=True)
class Ended:
    """A repro run as its archive says it ended: ``outcome`` (run.info's word) and
    ``reason``, the test's row (None: none), the node's log block of the job ('' when
    none) and the keys its build log gave."""

    run: str
    archive: Path
    outcome: str
    reason: str
    row: tab.TabRow | None
    log_block: str
    keys: NodeKeys

    @property
    def complete(self) -> bool:
        return self.outcome == "done" and self.row is not None


def result(archive: Path, test: str, node: str) -> Ended:
    """What repro run ``archive`` (its archive folder) says of ``test`` on ``node``."""
    run = archive.name
    info = parse_info((archive / "run.info").read_text(encoding="utf-8", errors="replace"))
    table = archive / f"{run}.tab"
    row = tab.read_tab(table).get(test) if table.is_file() else None
    return Ended(run, archive, info.get("outcome", "unknown"), info.get("reason", ""), row,
                 log_block(archive / "logs" / f"{node}.log", test),
                 repro.node_keys(archive / "logs" / f"{node}.build.log", node, run))


def log_block(node_log: Path, test: str) -> str:
    """The block a node's log has of job ``test`` (``===<test>===`` to the blank line
    after it: :func:`cluster.node.readlog.log_entry`), the last one; '' when none."""
    try:
        text = node_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    head = f"==={test}===\n"
    at = text.rfind(head)
    if at < 0 or (at > 0 and text[at - 1] != "\n"):
        return ""
    end = text.find("\n\n", at)
    return text[at:] if end < 0 else text[at:end + 1]


def why_not(ended: Ended, node: str) -> str:
    """Why repro run ``ended`` gave no result of its job (for exit status 3)."""
    if ended.outcome == "done":
        return f"repro run {ended.run} ended with no row of the test in its table"
    never = not (ended.archive / "logs" / f"{node}.log").exists()
    said = f"repro run {ended.run} ended {ended.outcome}" + (
        f": {ended.reason}" if ended.reason else "")
    return said + (f" (node {node} never took it)" if never else "")
