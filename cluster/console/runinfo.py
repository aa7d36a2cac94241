"""A run's small records as the console shows them, read from the master home.

``key value`` records (run.info, job.start) as dicts, the per-run options of a queue line
(docs/runoptions.md), a run's start time from its id, a waiting run's name
``p<priority>:<position>``, the running run of a lane (its job.start) and the running lines
of a queue (priority 0 has one per busy lane: cluster.lanes), its ``order=``
(an admin's ``runs/<id>/order``, else its line's), and the small
file reads they need: a missing file is None or "", an unreadable one is logged and the
same.  Used by the status model (:mod:`cluster.console.status`), clusteradmin and the
history.  Nothing here writes to the home.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cluster import lanes, runoptions
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import JOB_ID

log = logging.getLogger("cluster.console")


def parse_info(text: str) -> dict[str, str]:
    """``key value`` lines (run.info, job.start) as a dict; the first of a key wins."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key and key not in values:
            values[key] = value.strip()
    return values


def run_options(line: str) -> list[str]:
    """The per-run options (docs/runoptions.md) of the queue line ``line``, as its words
    (:attr:`cluster.runoptions.RunOptions.given`'s order); [] for none or a line that does
    not parse (a record of an older release)."""
    try:
        return given_options(RunSpec.parse(line).options)
    except QueueLineError:
        return []


def given_options(words: Iterable[str]) -> list[str]:
    """The per-run options among a queue line's option ``words``, sorted."""
    return sorted(w for w in words if w.partition("=")[0] in runoptions.KEYS)


def with_run_options(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` (a run's ``key: value`` record with its ``queue`` or ``line``) with
    ``run_options``, its per-run options in one string, when it has any; ``info`` itself."""
    given = run_options(str(info.get("queue") or info.get("line") or ""))
    if given:
        info["run_options"] = " ".join(given)
    return info


def small_text(path: str) -> str:
    """The text of a small file (at most 64 KiB), stripped; "" if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536).strip()
    except OSError:
        return ""


def int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def run_started(run_id: str) -> float | None:
    """The start time a run id carries (``YYYYmmddHHMMSS-...``, UTC), or None."""
    try:
        return float(calendar.timegm(time.strptime(run_id[:14], "%Y%m%d%H%M%S")))
    except ValueError:
        return None


def first_line(path: Path) -> str | None:
    """The first line of a small file, or None if it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline(4096).strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None


def job_start(home: Home, lane: int) -> JobStart | None:
    """The run running in ``lane`` (its job.start; a priority's own lane is its number:
    cluster.lanes), or None."""
    text = read_text(home.job_start(lane))
    if text is None:
        return None
    try:
        return JobStart.parse(text)
    except ValueError as exc:
        log.warning("%s: %s", home.job_start(lane), exc)
        return None


def lane_starts(home: Home, priority: int | None = None) -> dict[int, JobStart]:
    """lane -> the job.start of the run it serves, for every lane that has one (of
    ``priority``'s lanes only, when given), in lane order (:data:`cluster.lanes.ALL_LANES`:
    a missing file is a lane with no run)."""
    found: dict[int, JobStart] = {}
    for lane in lanes.ALL_LANES if priority is None else lanes.lanes_of(priority):
        start = job_start(home, lane)
        if start is not None:
            found[lane] = start
    return found


def start_specs(starts: Iterable[JobStart]) -> list[RunSpec]:
    """The queue lines of running runs as runs, to protect them in a queue transaction
    (one that does not parse holds no queued line and is left out)."""
    out = []
    for start in starts:
        with contextlib.suppress(QueueLineError):
            out.append(RunSpec.parse(start.queue))
    return out


def running_lines(starts: Iterable[JobStart], specs: Sequence[RunSpec]) -> dict[int, JobStart]:
    """Which lines of a queue holding ``specs`` are running: 0-based index -> the job.start
    of the run on it.  Each of ``starts`` (a priority's lanes' runs, in lane order) holds
    the first line equal to its queue line that no other one holds
    (:meth:`cluster.queue.QueueFile.withdraw`'s rule); one whose line left the queue holds
    none."""
    held: dict[int, JobStart] = {}
    lines = [spec.line() for spec in specs]
    for start in starts:
        found = next((i for i, line in enumerate(lines) if i not in held
                      and line == start.queue), None)
        if found is not None:
            held[found] = start
    return held


def start_info(start: JobStart) -> dict[str, str]:
    """A job.start as ``key: value`` strings, never its secret."""
    return parse_info(start.format())


def is_run_id(text: str) -> bool:
    """Whether ``text`` can name a run (a job id: no slash, no leading dot)."""
    return JOB_ID.fullmatch(text) is not None


def queue_ref(priority: int, position: int) -> str:
    """The name of the waiting run at ``position`` (from 1) of queue ``priority``."""
    return f"p{priority}:{position}"


def queued_info(spec: RunSpec, priority: int, position: int) -> dict[str, Any]:
    """A waiting run's ``info``: its line's fields, its place and its per-run options."""
    return with_run_options({"line": spec.line(), "kind": spec.kind, "who": spec.ref,
                             "products": list(spec.products), "options": list(spec.options),
                             "priority": priority, "position": position})


def recorded_order(home: Home, run_id: str) -> int | None:
    """The ``order=`` an admin gave the running run ``run_id`` (``runs/<id>/order``), or
    None."""
    first = small_text(str(home.run_order(run_id))).partition("\n")[0]
    with contextlib.suppress(runoptions.RunOptionError):
        return runoptions.parse_order(first) if first else None
    return None


def running_order(home: Home, start: JobStart) -> int:
    """The running run's order: an admin's (:func:`recorded_order`), else its queue line's."""
    given = recorded_order(home, start.id)
    if given is not None:
        return given
    with contextlib.suppress(QueueLineError):
        return runoptions.order_of(RunSpec.parse(start.queue).options)
    return runoptions.ORDER_DEFAULT
