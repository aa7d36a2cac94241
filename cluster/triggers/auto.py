"""Auto runs (priority 2): the nightly and weekly job definitions that cron queues.

Each job lives in ``auto/<nightly|weekly>/<name>/jobdef.txt`` in the master home (the layout
of the ClusterWork TWiki page).  Its first non-comment line is
``<products> [option ...]``, e.g. ``gs,pdfwrite highres relaxtimeout``.  Queuing it appends
``auto <schedule>-<name> <products> [option ...]`` to the priority-2 queue (once: a run
already queued is not queued twice).  An auto run builds the master's own tree of its
product (``<home>/ghostpdl`` or ``<home>/mupdf``).

A nightly or weekly sweep (docs/sweeps.md section 8) is the line
``sweep <path> [option ...]``: ``<path>`` is the sweep folder (its sweep file is
``sweep.toml``) or a sweep file in the top of its folder, absolute or relative to the
jobdef's own folder (``auto/<schedule>/<name>/``), never through ``~``; the line is split
into words as a shell splits them, so a path with blanks is written in quotes.  Queuing it first
checks the sweep exactly as ``clusterpush.py --sweep`` does
(:func:`cluster.triggers.sweeppush.prepare_sweep`: a bad sweep is logged naming the
jobdef, the file and the key, and not queued), then appends
``auto <schedule>-<name> sweep sweep=<file> [option ...]``.  When the run starts, the
master reads the jobdef again and copies the folder it names, less what a push leaves out,
into the run's ``runs/<id>/source/sweep`` (:func:`snapshot_sweep`): the nodes fetch that
copy, and build.py reads the sweep file there, as for a pushed sweep.

A whole graph of runs (a ``.dag`` file, :mod:`cluster.triggers.dag`; seed 003's
``cron.meta``) is the line ``dag <file>``, the file absolute or relative to the jobdef's
folder, quoted as a sweep's path is: queuing it queues every run of the graph at its own
priority, all or none, as ``clusteradmin dag`` does (a refused graph is logged naming the
jobdef and why, and nothing of it is queued).

Besides ``nightly`` and ``weekly``, ``auto/cron/<name>/`` (:data:`NAMED`) holds the jobdef
of a named schedule (:mod:`cluster.triggers.schedules`: its own cron expression in
``schedule.toml`` beside it); its runs are ``auto cron-<name> ...``.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
from pathlib import Path

from cluster.defaults import AUTO_PRIORITY
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile
from cluster.runspec import DEFAULT_SWEEP_FILE, SWEEP, RunSpec
from cluster.runtime import fsutil
from cluster.runtime.mirror import mirror
from cluster.triggers.dag import DagRun, queue_dag, read_dag
from cluster.triggers.push import MAX_PUSH_BYTES, is_excluded
from cluster.triggers.sweeppush import prepare_sweep

log = logging.getLogger("cluster.auto")

SCHEDULES = ("nightly", "weekly")
#: The folder of the named schedules' jobdefs, each with its own cron expression.
NAMED = "cron"
#: Every folder of ``auto/`` that holds jobdefs.
JOBDEF_FOLDERS = (*SCHEDULES, NAMED)
#: The first word of a jobdef line that queues a whole graph of runs.
DAG = "dag"
MAX_JOBDEF_BYTES = 4096


def cron_tag(home: Home, schedule: str) -> str:
    """The crontab tag of ``home``'s entry that queues the ``schedule`` jobs
    (``enqueue_auto.py --install-cron`` writes it; :mod:`cluster.cron`)."""
    return f"enqueue_auto-{schedule}:{home.root.resolve()}"


def first_line(path: Path) -> str:
    """The first non-comment line of a jobdef.txt; QueueLineError naming the file."""
    if path.stat().st_size > MAX_JOBDEF_BYTES:
        raise QueueLineError("", f"larger than {MAX_JOBDEF_BYTES} bytes", str(path))
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace")
             .splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise QueueLineError("", "empty; expected '<products> [option ...]'", str(path))
    return lines[0]


def sweep_file_of(path: Path, line: str) -> Path | None:
    """The sweep file a jobdef line ``sweep <path> [option ...]`` names (the module's
    docstring), resolved against the jobdef ``path``'s folder; None for any other line.
    QueueLineError naming the jobdef when the line names no folder or file there."""
    if line.split()[0] != SWEEP:
        return None
    words = _sweep_words(path, line)
    if len(words) < 2 or "=" in words[1]:
        raise QueueLineError(line, f"a sweep jobdef names its sweep folder: expected "
                             f"'{SWEEP} <folder or sweep file> [option ...]'", str(path), 1)
    named = Path(words[1])
    target = named if named.is_absolute() else path.parent / named
    if target.is_dir():
        return target / DEFAULT_SWEEP_FILE
    if target.is_file():
        return target
    raise QueueLineError(line, f"{words[1]!r} is neither a folder nor a file (looked at "
                         f"{target}); expected the sweep folder or its sweep file, absolute "
                         "or relative to the jobdef's folder", str(path), 1)


def dag_of(path: Path, line: str) -> list[DagRun] | None:
    """The runs of the graph a jobdef line ``dag <file>`` names (the module's docstring),
    the file resolved against the jobdef ``path``'s folder; None for any other line.
    QueueLineError naming the jobdef for a line without one file; DagError (naming the
    .dag file, its line and why) for a graph that cannot be read."""
    if line.split()[0] != DAG:
        return None
    words = _sweep_words(path, line)
    if len(words) != 2:
        raise QueueLineError(line, f"a dag jobdef names one .dag file: expected '{DAG} "
                             "<file>', a path with blanks in quotes", str(path), 1)
    named = Path(words[1])
    return read_dag(named if named.is_absolute() else path.parent / named)


def _sweep_words(path: Path, line: str) -> list[str]:
    """The words of a sweep line: split as a shell splits them, so a path with a blank is
    written in quotes (``sweep "/srv/team sweeps/model"``); QueueLineError naming the
    jobdef for an unbalanced quote."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise QueueLineError(line, f"{exc}; expected the words of '{SWEEP} <folder> "
                             "[option ...]', a path with blanks in quotes", str(path), 1) \
            from None


def read_jobdef(path: Path, schedule: str) -> RunSpec:
    """The run a jobdef.txt describes; QueueLineError naming the file and the problem, and
    for a sweep the SweepError (naming the sweep file and the key) of its check."""
    name = path.parent.name
    line = first_line(path)
    sweep = sweep_file_of(path, line)
    if sweep is None:
        return RunSpec.parse(f"auto {schedule}-{name} {line}", source=str(path), lineno=1)
    submission = prepare_sweep(sweep)  # as clusterpush --sweep: nothing queued if bad
    options = _sweep_words(path, line)[2:]
    return RunSpec.parse(" ".join([f"auto {schedule}-{name}",
                                   *submission.words_with(options)]),
                         source=str(path), lineno=1)


def jobdef_of(home: Home, spec: RunSpec) -> Path:
    """The jobdef.txt of the auto run ``spec`` (``auto <schedule>-<name> ...``); ValueError
    when its ref is not of that form."""
    schedule, dash, name = spec.ref.partition("-")
    if spec.kind != "auto" or schedule not in JOBDEF_FOLDERS or not dash or not name:
        raise ValueError(f"{spec.line()!r} is not an auto run of a jobdef; expected "
                         f"'auto <{'|'.join(JOBDEF_FOLDERS)}>-<name> ...'")
    return jobs_dir(home, schedule) / name / "jobdef.txt"


def snapshot_sweep(home: Home, spec: RunSpec, dest: Path) -> Path:
    """Copy the sweep folder the auto sweep run ``spec``'s jobdef names to ``dest``; return
    the folder copied.

    The jobdef is read again (it says where the folder is: the module's docstring), and
    the folder is copied as a push sends it (:func:`cluster.triggers.push.is_excluded`,
    files up to :data:`~cluster.triggers.push.MAX_PUSH_BYTES`), into a temporary folder
    beside ``dest`` renamed to ``dest`` once complete: a master killed meanwhile leaves no
    half copy under the final name.  ClusterError (naming the jobdef) when it no longer
    names a sweep folder holding the run's sweep file; ``dest`` must not exist.
    """
    jobdef = jobdef_of(home, spec)
    try:
        sweep = sweep_file_of(jobdef, first_line(jobdef))
    except OSError as exc:
        raise ClusterError(f"auto sweep run {spec.line()!r}: cannot read its jobdef "
                           f"{jobdef}: {exc.strerror or exc}") from None
    if sweep is None or sweep.name != spec.sweep_file:
        raise ClusterError(f"auto sweep run {spec.line()!r}: its jobdef {jobdef} no longer "
                           f"names a sweep of the sweep file {spec.sweep_file}; expected "
                           f"'{SWEEP} <folder> ...' as when it was queued")
    folder = sweep.parent.resolve()
    if os.path.lexists(dest):
        raise ClusterError(f"snapshot destination {dest} exists; expected a new path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.",
                                suffix=fsutil.TEMP_SUFFIX))
    try:
        mirror(folder, tmp, exclude=is_excluded, max_size=MAX_PUSH_BYTES,
               label=folder.name, timeout=None)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("snapshot of the sweep folder %s in %s", folder, dest)
    return folder


def jobs_dir(home: Home, schedule: str) -> Path:
    """``<home>/auto/<schedule>``: where the ``schedule`` job definitions live."""
    return home.root / "auto" / schedule


def definitions(home: Home, schedule: str) -> list[Path]:
    """The ``schedule`` job definitions, ``<home>/auto/<schedule>/*/jobdef.txt``, sorted."""
    return sorted(jobs_dir(home, schedule).glob("*/jobdef.txt"))


def enqueue(home: Home, schedule: str, names: list[str] | None = None) -> list[RunSpec]:
    """Queue the ``schedule`` jobs (all, or only ``names``); return the runs added.

    Finding no job definition at all is an error (logged, naming where it looked: the
    pattern ``<home>/auto/<schedule>/*/jobdef.txt`` and whether that directory exists), as
    is a named job that is not there: a cron entry that queues nothing must say so.
    """
    if schedule not in JOBDEF_FOLDERS:
        raise ValueError(f"schedule {schedule!r}: expected one of "
                         f"{', '.join(JOBDEF_FOLDERS)}")
    root = jobs_dir(home, schedule)
    queue = QueueFile.for_priority(home, AUTO_PRIORITY)
    wanted = set(names or [])
    added: list[RunSpec] = []
    found: set[str] = set()
    jobdefs = definitions(home, schedule)
    if not jobdefs:
        what = ("does not exist" if not root.exists()
                else "is not a directory" if not root.is_dir()
                else "holds no <name>/jobdef.txt")
        log.error("no %s auto jobs to queue: looked for %s/*/jobdef.txt, and %s %s (each "
                  "job is auto/%s/<name>/jobdef.txt in the master home %s, holding "
                  "'<products> [option ...]')", schedule, root, root, what, schedule,
                  home.root)
    for jobdef in jobdefs:
        name = jobdef.parent.name
        if wanted and name not in wanted:
            continue
        found.add(name)
        try:
            graph = dag_of(jobdef, first_line(jobdef))
            if graph is not None:
                queue_dag(home, graph)  # all or none
                for run in graph:
                    log.info("queued at priority %d: %s", run.priority, run.spec.line())
                added.extend(run.spec for run in graph)
                continue
            spec = read_jobdef(jobdef, schedule)
        except (ClusterError, OSError) as exc:  # a QueueLineError, a sweep's SweepError
            log.error("skipping auto job %s: %s", jobdef, exc)
            continue
        if queue.append(spec):
            log.info("queued %s", spec.line())
            added.append(spec)
    for name in sorted(wanted - found):
        log.error("no auto job %s/%s/jobdef.txt in %s", schedule, name, home.root)
    return added
