"""The runs a heartbeat's answer offers a node: those whose ``job[.p].start`` waits, that
the node may take.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.master.files import groups
from cluster.master.files.nodefiles import is_disabled
from cluster.master.model.placement import Placement, offered
from cluster.wire.protocol import JOB_ID

log = logging.getLogger("cluster.monitor")


def read_job_id(path: Path) -> str | None:
    """The ``id`` of a job.start file (``key value`` lines), or None if absent or without a
    valid id."""
    return _read_start(path)[0]


def _read_start(path: Path) -> tuple[str | None, str]:
    """The ``id`` of a job.start file (None if absent or without a valid id) and its
    ``options`` line's value ('' when none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None, ""
    job_id: str | None = None
    options = ""
    found = False
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "id" and not found:
            found = True
            value = value.strip()
            if JOB_ID.fullmatch(value):
                job_id = value
            else:
                log.warning("%s: id %r is not a valid job id", path, value)
        elif key == "options":
            options = value.strip()
    if not found:
        log.warning("%s has no 'id' line", path)
    return job_id, options


def waiting_runs(home: Home) -> list[tuple[int, str, Placement]]:
    """``(priority, id, placement)`` of every run whose job[.p].start exists, by priority:
    its ``groups=``/``exclude=`` from job.start's ``options`` (docs/runoptions.md)."""
    runs = []
    for p in PRIORITIES:
        job_id, options = _read_start(home.job_start(p))
        if job_id is not None:
            try:
                where = Placement.of_words(options.split())
            except ValueError:
                where = Placement()  # the queue refused bad words; the master decides
            runs.append((p, job_id, where))
    return runs


def waiting_jobs(home: Home) -> list[tuple[int, str]]:
    """``(priority, id)`` of every run whose job[.p].start exists, by priority."""
    return [(p, job_id) for p, job_id, _ in waiting_runs(home)]


def offer(home: Home, node: str, runs: list[tuple[int, str, Placement]]
          ) -> list[tuple[int, str]]:
    """The runs of ``runs`` that ``node`` may take (a run with ``groups=`` or
    ``exclude=`` is not offered to a node it may not take; the groups are read only
    then)."""
    if not any(where.restricted for _, _, where in runs):
        return [(p, job_id) for p, job_id, _ in runs]
    placements = {job_id: where for _, job_id, where in runs}
    return offered([(p, job_id) for p, job_id, _ in runs], node, placements,
                   groups.all_groups(home))


def jobs_for(home: Home, node: str) -> list[tuple[int, str]]:
    """The runs ``node`` is told wait: :func:`waiting_runs` it may take (:func:`offer`),
    none if it is disabled."""
    return [] if is_disabled(home, node) else offer(home, node, waiting_runs(home))
