"""Named schedules (docs/operating.md, "Schedules"): a run, a sweep or a whole graph of runs
queued by cron at any cron expression, under a name (seed 003's ``name`` and ``cron`` keys
of a job file, and its ``cron.meta``: a graph of jobs on a schedule).

A schedule ``<name>`` is the folder ``auto/cron/<name>/`` of the master home
(:data:`cluster.triggers.auto.NAMED`), holding two files:

``jobdef.txt``
    what it queues, in the grammar of a nightly jobdef (:mod:`cluster.triggers.auto`):
    ``<products> [option ...]`` (queued as ``auto cron-<name> <products> [option ...]`` at
    priority 2), ``sweep <folder> [option ...]`` or ``dag <file>`` (every run of the
    graph at its own priority, all or none);
``schedule.toml``
    when: ``cron = "<five fields or an @nickname>"`` (TOML, :data:`SCHEDULE_FILE`).

Its crontab entry (:func:`entry`, tagged ``schedule-<name>:<home>``: :func:`tag`) runs
``enqueue_auto.py ... --quiet cron <name>``, which queues it (:func:`cluster.triggers.auto.
enqueue`).  ``clusteradmin schedule add`` checks everything before it writes or installs
anything (:func:`check`): the name (:data:`NAME`), the cron expression
(:func:`cluster.cron.schedule_problem`: a bad field is named with what it takes) and what
it queues (a run line by the queue's grammar, a sweep as ``clusterpush.py --sweep`` checks
it, a graph as ``clusteradmin dag`` checks its lines).  A folder written by hand is checked
the same way when ``enqueue_auto.py --install-cron`` installs its entry (:func:`read`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from cluster import cron
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import KINDS, RunSpec
from cluster.runtime import fsutil
from cluster.triggers import auto, dag
from cluster.triggers.sweeppush import prepare_sweep

#: A schedule's name: a letter, then letters, digits, ``_`` or ``-`` (48 at most, so the
#: run's ref ``cron-<name>`` is one).
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,47}")
SCHEDULE_FILE = "schedule.toml"
JOBDEF_FILE = "jobdef.txt"
#: The key of ``schedule.toml`` holding the cron expression.
CRON_KEY = "cron"
#: The largest ``schedule.toml`` read [bytes].
MAX_SCHEDULE_BYTES = 4096
#: The first word of the tag of a schedule's crontab entry.
TAG_PROGRAM = "schedule"


class ScheduleError(ClusterError):
    """A schedule that cannot be added, read or queued; the message names it and why."""


@dataclass(frozen=True)
class Schedule:
    """One named schedule: its name, cron expression, jobdef line and folder."""

    name: str
    cron: str
    line: str
    folder: Path

    @property
    def what(self) -> str:
        """``run``, ``sweep`` or ``dag``: what its jobdef queues."""
        first = self.line.split()[0]
        return first if first in (auto.DAG, "sweep") else "run"


def folder_of(home: Home, name: str) -> Path:
    """``<home>/auto/cron/<name>``."""
    return auto.jobs_dir(home, auto.NAMED) / name


def tag(home: Home, name: str) -> str:
    """The crontab tag of schedule ``name`` of ``home`` (:mod:`cluster.cron`)."""
    return f"{TAG_PROGRAM}-{name}:{home.root.resolve()}"


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ScheduleError(f"schedule name {name!r}: expected a letter, then letters, "
                            "digits, '_' or '-' (at most 48)")
    return name


def check_cron(name: str, schedule: str) -> str:
    """``schedule`` normalised; ScheduleError naming the bad field and what it takes."""
    problem = cron.schedule_problem(schedule)
    if problem is not None:
        raise ScheduleError(f"schedule {name}: cron expression {schedule!r}: {problem}")
    return " ".join(schedule.split())


def run_line(name: str, text: str) -> str:
    """The jobdef line of ``--run '<products> [option ...]'``; ScheduleError for a line the
    queue's grammar refuses (naming the word and what is expected)."""
    words = text.split()
    if not words:
        raise ScheduleError(f"schedule {name}: an empty run; expected '<products> "
                            "[option ...]' such as 'gs,pdfwrite lowres'")
    if words[0] in KINDS:
        raise ScheduleError(f"schedule {name}: run {text!r} starts with the kind "
                            f"{words[0]!r}; expected only '<products> [option ...]' (the "
                            f"run is queued as 'auto {auto.NAMED}-{name} ...', priority 2)")
    if words[0] in (auto.DAG, "sweep"):
        raise ScheduleError(f"schedule {name}: run {text!r}: a {words[0]} is scheduled "
                            f"with --{words[0]} FILE")
    try:
        RunSpec.parse(f"auto {auto.NAMED}-{name} {text}", source=f"schedule {name}")
    except ClusterError as exc:
        raise ScheduleError(f"schedule {name}: run {text!r}: "
                            f"{getattr(exc, 'problem', exc)}") from None
    return " ".join(words)


def path_line(word: str, path: Path) -> str:
    """The jobdef line ``sweep <path>`` or ``dag <path>``, the path absolute and quoted."""
    return f"{word} {shlex.quote(str(path.resolve()))}"


def check_line(home: Home, name: str, line: str) -> None:
    """Check the jobdef line of schedule ``name`` as it will be queued (a graph read, a
    sweep checked, a run parsed), before anything is written; ScheduleError naming the
    schedule and what is wrong (for a graph or a sweep: its file, line and key)."""
    jobdef = folder_of(home, name) / JOBDEF_FILE  # where a relative path would start
    try:
        graph = auto.dag_of(jobdef, line)
        if graph is not None:
            dag.check_dag(home, graph)
            return
        sweep = auto.sweep_file_of(jobdef, line)
        if sweep is not None:
            prepare_sweep(sweep)
        else:
            run_line(name, line)
    except ScheduleError:
        raise
    except (ClusterError, OSError) as exc:
        raise ScheduleError(f"schedule {name}: {exc}") from None


def check_jobdef(name: str, jobdef: Path) -> str:
    """The line of ``jobdef`` once checked as it will be queued (a graph read, a sweep
    checked, a run parsed); ScheduleError naming the schedule and what is wrong."""
    try:
        line = auto.first_line(jobdef)
        if auto.dag_of(jobdef, line) is None:
            auto.read_jobdef(jobdef, auto.NAMED)
    except (ClusterError, OSError) as exc:
        raise ScheduleError(f"schedule {name}: {jobdef}: {exc}") from None
    return line


def read(home: Home, name: str) -> Schedule:
    """Schedule ``name`` of ``home``, checked (see :func:`check_jobdef`); ScheduleError when
    it is not there or is bad."""
    folder = folder_of(home, check_name(name))
    path = folder / SCHEDULE_FILE
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SCHEDULE_BYTES + 1)
    except FileNotFoundError:
        raise ScheduleError(f"no schedule {name}: {path} does not exist (clusteradmin "
                            "schedule ls lists them)") from None
    except OSError as exc:
        raise ScheduleError(f"schedule {name}: cannot read {path}: {exc.strerror}") from None
    try:
        if len(data) > MAX_SCHEDULE_BYTES:
            raise ValueError(f"larger than {MAX_SCHEDULE_BYTES} bytes")
        table = tomllib.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ScheduleError(f"schedule {name}: {path}: {exc}; expected TOML such as "
                            f"{CRON_KEY} = \"0 3 * * 0\"") from None
    value = table.get(CRON_KEY)
    if not isinstance(value, str) or set(table) != {CRON_KEY}:
        raise ScheduleError(f"schedule {name}: {path}: expected one key, {CRON_KEY} = "
                            "\"<cron expression>\"; got " + (", ".join(sorted(table)) or
                                                             "no key"))
    when = check_cron(name, value)
    return Schedule(name, when, check_jobdef(name, folder / JOBDEF_FILE), folder)


def names(home: Home) -> list[str]:
    """The names of ``home``'s schedules (folders with a ``schedule.toml``), sorted."""
    return sorted(p.parent.name for p in auto.jobs_dir(home, auto.NAMED).glob(
        f"*/{SCHEDULE_FILE}"))


def add(home: Home, name: str, schedule: str, line: str) -> Schedule:
    """Write schedule ``name`` (``schedule``: its cron expression; ``line``: its jobdef
    line), checked first: ScheduleError, and nothing written, when the name, the
    expression or the line is bad or the name is taken.  The folder appears whole (made
    beside it, then renamed)."""
    check_name(name)
    when = check_cron(name, schedule)
    check_line(home, name, line)
    folder = folder_of(home, name)
    if os.path.lexists(folder):
        raise ScheduleError(f"schedule {name} exists ({folder}); expected a new name "
                            "(clusteradmin schedule rm removes it)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{name}.",
                                suffix=fsutil.TEMP_SUFFIX))
    staged = tmp / name
    try:
        staged.mkdir()
        fsutil.atomic_write(staged / SCHEDULE_FILE,
                            f"# when schedule {name} is queued (clusteradmin schedule add)\n"
                            f"{CRON_KEY} = \"{when}\"\n")
        fsutil.atomic_write(staged / JOBDEF_FILE, f"# what schedule {name} queues\n{line}\n")
        os.rename(staged, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Schedule(name, when, line, folder)


def remove(home: Home, name: str) -> Path:
    """Delete schedule ``name``'s folder; return it.  ScheduleError when there is none."""
    folder = folder_of(home, check_name(name))
    if not folder.is_dir():
        raise ScheduleError(f"no schedule {name}: {folder} does not exist")
    shutil.rmtree(folder)
    return folder


def entry(home: Home, schedule: Schedule, options: list[str]) -> cron.CronEntry:
    """The crontab entry of ``schedule``: ``enqueue_auto.py <options> --quiet cron <name>``
    at its cron expression (``options``: the --config/--home/--set that name this home)."""
    return cron.CronEntry(tag(home, schedule.name), schedule.cron,
                          cron.script_command("enqueue_auto.py",
                                              [*options, "--quiet", auto.NAMED,
                                               schedule.name]))


def stale_tags(home: Home, listed: list[cron.Listed]) -> list[str]:
    """The tags of ``home``'s schedule entries in ``listed`` (the crontab) whose schedule
    folder is gone."""
    suffix = f":{home.root.resolve()}"
    prefix = f"{TAG_PROGRAM}-"
    present = set(names(home))
    return [e.tag for e in listed if e.tag.startswith(prefix) and e.tag.endswith(suffix)
            and e.tag[len(prefix):-len(suffix)] not in present]
