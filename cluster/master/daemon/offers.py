"""The runs a heartbeat's answer offers a node: those whose ``job[.n].start`` waits (one
per lane, :mod:`cluster.lanes`), that the node may take, in the order it should take them.

Order: by lane number, except that the runs of priority 0's lanes are listed together
first, those with the fewest nodes first (:func:`fair_order`: the monitor counts the nodes
whose last heartbeat said they run each run), so an idle node joins the user's run that has
the least; the shares themselves are kept by the masters, which move nodes between runs of
one priority at job boundaries (docs/runoptions.md, "Fair share").  A node that did not say
``lanes yes`` (a clusterpull of an earlier release) is offered no user lane's run: it could
not reach its port.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from cluster import lanes
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
    """``(lane, id, placement)`` of every run whose job[.n].start exists, by lane: its
    ``groups=``/``exclude=`` from job.start's ``options`` (docs/runoptions.md)."""
    runs = []
    for p in lanes.ALL_LANES:
        job_id, options = _read_start(home.job_start(p))
        if job_id is not None:
            try:
                where = Placement.of_words(options.split())
            except ValueError:
                where = Placement()  # the queue refused bad words; the master decides
            runs.append((p, job_id, where))
    return runs


def waiting_jobs(home: Home) -> list[tuple[int, str]]:
    """``(lane, id)`` of every run whose job[.n].start exists, by lane."""
    return [(p, job_id) for p, job_id, _ in waiting_runs(home)]


def fair_order(jobs: list[tuple[int, str]], nodes_in: Mapping[str, int]
               ) -> list[tuple[int, str]]:
    """``jobs`` (lane, id) with priority 0's runs first, the fewest nodes (``nodes_in``:
    run id -> nodes in it) first, then by lane; the other runs after them, as they were."""
    first = [job for job in jobs if lanes.priority_of(job[0]) == 0]
    if len(first) < 2:
        return jobs
    first.sort(key=lambda job: (nodes_in.get(job[1], 0), job[0]))
    return first + [job for job in jobs if lanes.priority_of(job[0]) != 0]


def for_node(jobs: list[tuple[int, str]], knows_lanes: bool) -> list[tuple[int, str]]:
    """``jobs`` as a node is told them: without the user lanes' runs unless it
    ``knows_lanes``."""
    if knows_lanes:
        return jobs
    return [job for job in jobs if job[0] < lanes.FIRST_USER_LANE]


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


class RunCounts(Counter[str]):
    """Run id -> how many nodes said in their last heartbeat that they run it (``running
    run <id> ...``): a node counts in one run, the one its latest status names; a heartbeat
    without a status leaves it where it was."""

    def __init__(self) -> None:
        super().__init__()
        self.node_run: dict[str, str] = {}

    def note(self, node: str, status: str | None) -> None:
        """Count ``node`` in the run ``status`` names, out of the one it ran before."""
        if status is None:
            return
        words = status.split(" ", 3)
        now = words[2] if len(words) > 2 and words[:2] == ["running", "run"] else ""
        before = self.node_run.get(node, "")
        if now == before:
            return
        if before:
            self[before] -= 1
            if self[before] <= 0:
                del self[before]
        if now:
            self.node_run[node] = now
            self[now] += 1
        else:
            self.node_run.pop(node, None)
