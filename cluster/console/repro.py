"""One archived job found again, for ``clusteradmin repro`` (docs/operating.md,
"Reproducing one job: `clusteradmin repro`").

:func:`find` reads what an archived run kept of one test: its row of the run's ``.tab``
(md5, error code, the node that made it), its job line from ``jobs.gz``
(:mod:`cluster.master.files.reprokeep`), and from the node's archived build log the
folder it built in and the keys it sent (:func:`cluster.node.builddigest.keys_line`: its
environment digest and each program's build digest).  The rest is pure:
:func:`fill` puts a place's values in for the placeholders, :func:`keeping_output`
changes a job's command so that its raster stays beside its md5 (the same bytes go to
``md5sum`` through ``tee``), :func:`programs` names the ``__bin__`` programs a job calls.
:mod:`cluster.console.reprorun` builds and runs.

Errors: :class:`ReproUsage` (exit 2) names an unknown run or test and what was expected;
:class:`ReproCannot` (exit 3) says why the job cannot be run (no job list kept, a build
that failed); its :class:`NotHere` that the node's build is not on this machine (then a
repro run takes the job to the node: :mod:`cluster.console.reproqueue`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cluster.console import history, runinfo
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files import reprokeep
from cluster.node import builddigest
from cluster.records import BIN, TEMP, Job
from cluster.report import tab
from cluster.wire.jobstart import JobStart

#: A reused row's machine column starts so: ``cache:<node>@<run>`` (the master's
#: cluster.master.state.runcore.CACHE_PREFIX; the console reads files only).
CACHE_PREFIX = "cache:"
#: The name of the raster a job keeps (in its temp folder, beside its log and md5).
RASTER = ".raster"
#: The programs a job calls (``__bin__/<name>``): cluster.node.nodejobs.BIN_NAME's rule.
BIN_NAME = re.compile(re.escape(BIN) + r"/([A-Za-z0-9_.+-]+)")
#: The build log's line saying where a node built (cluster.node.nodebuild._build_tree).
BUILD_FOLDER = re.compile(r"node (\S+): build folder (/\S*) updated from ")


class ReproUsage(ClusterError):
    """An unknown run or test (exit 2)."""


class ReproCannot(ClusterError):
    """The job cannot be run again (exit 3): the message says why."""


class NotHere(ReproCannot):
    """The node's build of the run is not on this machine (its work folder is elsewhere, it
    did not build the run, or its build folder is gone): the job goes to the node as a
    repro run (:mod:`cluster.console.reproqueue`)."""


@dataclass(frozen=True)
class NodeKeys:
    """What a node's build log says of its build for the run: where it built, its
    environment digest, its programs' digests (each None or empty when not said: a run
    archived before nodes said it, a sweep run)."""

    build_dir: str | None
    environment: str | None
    digests: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Found:
    """One test of an archived run: its job, its row, and the node that made the row."""

    run: str
    archive: Path
    start: JobStart
    job: Job
    row: tab.TabRow
    #: The node whose result the row is; ``made_in`` the run in which it made it (another
    #: run's when the row was reused from the result cache: ``cache:<node>@<run>``).
    node: str
    made_in: str
    keys: NodeKeys

    @property
    def reused(self) -> bool:
        return self.made_in != self.run


def find(home: Home, run_id: str, test: str) -> Found:
    """Test ``test`` (an id, or as reports show it) of archived run ``run_id``."""
    folder = home.archive / run_id
    if not runinfo.is_run_id(run_id) or not (folder / "run.info").is_file():
        raise ReproUsage(f"unknown run {run_id!r}: expected the id of an archived run "
                         f"(a folder of {home.archive} with a run.info)")
    try:
        start = JobStart.parse((folder / "run.info").read_text(encoding="utf-8",
                                                               errors="replace"))
    except ValueError as exc:
        raise ReproCannot(f"run {run_id}: its run.info does not read ({exc})") from None
    name = history.test_id(test)
    table = folder / f"{run_id}.tab"
    row = None
    if table.is_file():
        row = next((e.row() for e in tab.TabFile(table).entries() if e.name == name), None)
    if row is None:
        raise ReproUsage(f"unknown test {test!r}: expected a test id of run {run_id}'s "
                         f"table {table.name}" + ("" if table.is_file() else
                                                  " (the run archived no table)"))
    try:
        line = reprokeep.job_line(folder, name)
    except FileNotFoundError:
        raise ReproCannot(f"run {run_id} kept no job list ({reprokeep.JOBS_NAME}): it was "
                          "archived before runs kept one") from None
    except (OSError, EOFError) as exc:
        raise ReproCannot(f"run {run_id}'s {reprokeep.JOBS_NAME} does not read: {exc}"
                          ) from None
    if line is None:
        raise ReproCannot(f"test {name} has a row in run {run_id}'s table but no line in "
                          f"its {reprokeep.JOBS_NAME}")
    job = Job.parse(line)
    node, made_in = maker(row.machine, run_id)
    keys = node_keys(home.archive / made_in / "logs" / f"{node}.build.log", node, made_in)
    return Found(run_id, folder, start, job, row, node, made_in, keys)


def maker(machine: str, run_id: str) -> tuple[str, str]:
    """(node, run) that made a row of run ``run_id`` whose machine column is ``machine``:
    a reused row's ``cache:<node>@<run>``, else the machine in this run."""
    if machine.startswith(CACHE_PREFIX):
        node, _, run = machine[len(CACHE_PREFIX):].rpartition("@")
        if node and run:
            return node, run
    return machine, run_id


def node_keys(build_log: Path, node: str, run_id: str) -> NodeKeys:
    """What ``node``'s archived build log of run ``run_id`` says (:class:`NodeKeys`): the
    last of each line, since a node restarted in a run says it again."""
    build_dir = environment = None
    digests: tuple[tuple[str, str], ...] = ()
    try:
        text = build_log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return NodeKeys(None, None, ())
    for line in text.splitlines():
        m = BUILD_FOLDER.match(line)
        if m is not None and m.group(1) == node:
            build_dir = m.group(2)
            continue
        said = builddigest.parse_keys_line(line)
        if said is not None and said[0] == node and said[1] == run_id:
            environment, digests = said[2], said[3]
    return NodeKeys(build_dir, environment, digests)


def programs(command: str) -> list[str]:
    """The ``__bin__`` programs ``command`` calls, in order, once each."""
    return list(dict.fromkeys(BIN_NAME.findall(command)))


def fill(command: str, values: dict[str, str]) -> str:
    """``command`` with each placeholder of ``values`` put in (as the node does:
    ``__temp__`` first, then the build's values)."""
    if TEMP in values:
        command = command.replace(TEMP, values[TEMP])
    for placeholder, value in values.items():
        if placeholder != TEMP:
            command = command.replace(placeholder, value)
    return command


def keeping_output(command: str, name: str) -> str:
    """``command`` (placeholders unfilled) changed so that its final output stays in its
    temp folder as ``<name>.raster`` while the same bytes still go to its md5:

    * a raster piped to md5sum (``-sOutputFile='|md5sum >> ...'``, mutool's ``| md5sum``)
      goes through ``tee`` into the file first;
    * a seeking device's raster file (``<name>.raster``), a two-stage test's intermediate
      file, is not removed;
    * a shell job's output (``<name>.out``) is kept as it is (the node hashes it).
    """
    raster = f"{TEMP}/{name}{RASTER}"
    kept = command.replace("'|md5sum >> ", f"'|tee {raster.replace('%', '%%')} | md5sum >> ")
    kept = re.sub(r"(2>> \S+) \| md5sum >> ", lambda m: f"{m.group(1)} | tee {raster} | md5sum >> ",
                  kept)
    return re.sub(r" ; rm -f " + re.escape(TEMP) + r"/\S+", "", kept)


def compare_line(new: str, old: str) -> str:
    """``md5 <new>  run <old>  same|DIFFERENT``."""
    return f"md5 {new}  run {old}  {'same' if new == old else 'DIFFERENT'}"


def key_line(what: str, now: str | None, then: str | None) -> str:
    """A key as found now beside the run's: ``<what> <now> (the run's: same|<then>)``."""
    shown = now or "unknown"
    if then is None:
        return f"{what} {shown} (the run's: not recorded)"
    return f"{what} {shown} (the run's: {'same' if now == then else then})"
