"""Auto runs (priority 2): the nightly and weekly job definitions that cron queues.

Each job lives in ``auto/<nightly|weekly>/<name>/jobdef.txt`` in the master home (the layout
of the ClusterWork TWiki page).  Its first non-comment line is
``<products> [option ...]``, e.g. ``gs,pdfwrite highres relaxtimeout``.  Queuing it appends
``auto <schedule>-<name> <products> [option ...]`` to the priority-2 queue (once: a run
already queued is not queued twice).  An auto run builds the master's own tree of its
product (``<home>/ghostpdl`` or ``<home>/mupdf``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.defaults import AUTO_PRIORITY
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.queue import QueueFile, RunSpec

log = logging.getLogger("cluster.auto")

SCHEDULES = ("nightly", "weekly")
MAX_JOBDEF_BYTES = 4096


def read_jobdef(path: Path, schedule: str) -> RunSpec:
    """The run a jobdef.txt describes; QueueLineError naming the file and the problem."""
    name = path.parent.name
    if path.stat().st_size > MAX_JOBDEF_BYTES:
        raise QueueLineError("", f"larger than {MAX_JOBDEF_BYTES} bytes", str(path))
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace")
             .splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise QueueLineError("", "empty; expected '<products> [option ...]'", str(path))
    return RunSpec.parse(f"auto {schedule}-{name} {lines[0]}", source=str(path), lineno=1)


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
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
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
            spec = read_jobdef(jobdef, schedule)
        except (QueueLineError, OSError) as exc:
            log.error("skipping auto job %s: %s", jobdef, exc)
            continue
        if queue.append(spec):
            log.info("queued %s", spec.line())
            added.append(spec)
    for name in sorted(wanted - found):
        log.error("no auto job %s/%s/jobdef.txt in %s", schedule, name, home.root)
    return added
