"""Which queued run a lane's master serves next (docs/runoptions.md, sections 5 and
"Fair share"; :mod:`cluster.deps`, :mod:`cluster.lanes`).

Seed 000's master served the head of its queue.  A lane's master still serves the run it
already serves: the queue line its ``job[.n].start`` names (a successor master takes it
over, whatever its dependencies or ``order=`` say now), or the line it claimed and is
setting up (``lanes/<lane>.claim``, :func:`claim`).  Otherwise the waiting runs -- every
line but one copy of each line another lane of the same priority serves or claimed --
are looked at in :func:`cluster.deps.serving_order` (lowest ``order=`` first, queue order
among equals), and the first of them is served at the cost of one read of its queue when
it waits for nothing (no ``after=``, no bmpcmp).  Otherwise every priority's queue is read
and the first run in that order whose dependencies are met is served
(:func:`cluster.deps.choose`).  The runs before it whose dependency failed leave the queue
with a report (:meth:`cluster.master.run.clustermaster.ClusterMaster.work`).

Fair share between users (priority 0, whose queue several lanes serve): a *user lane*
(3 and up) takes only a run whose user has no run in another lane; the priority's own
lane (0) takes such a run first and, when there is none, the first waiting run as seed
000's master did.  So with one user the runs go one at a time as before, and a second
user's push starts at once on a user lane, taking its share of the nodes
(:mod:`cluster.master.run.preemption`).

The choice is made without a lock, and taken with one (:func:`claim`): two lanes that
choose the same run cannot both serve it.  The claimed run moves to the front of its queue,
behind the runs the other lanes serve, so the running runs are the queue's first lines.
"""

from __future__ import annotations

import logging

from cluster import deps, lanes
from cluster.defaults import PRIORITIES
from cluster.home import Home
from cluster.master.files import ending
from cluster.master.model import fairshare
from cluster.queue import QueueFile, running_indices
from cluster.runspec import QueueLineError, RunSpec
from cluster.runtime import fsutil
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: The longest claim file read [bytes] (a queue line is at most 4096).
MAX_CLAIM = 1 << 14


def owner(spec: RunSpec) -> str | None:
    """The user a run is shared out by (:func:`cluster.master.model.fairshare.owner`)."""
    return fairshare.owner(spec.kind, spec.ref)


def _lane_state(home: Home, lane: int) -> tuple[RunSpec | None, bool]:
    """The queue line ``lane`` serves -- its job.start's, else its claim's; None when it
    serves none or what names it cannot be read -- and whether its job.start exists but
    names no line that can be read (the lane runs a run, not known which)."""
    try:
        text = home.job_start(lane).read_text(encoding="utf-8")
        return RunSpec.parse(JobStart.parse(text).queue), False
    except FileNotFoundError:
        pass
    except (OSError, ValueError, QueueLineError):
        return None, True
    try:
        with open(home.lane_claim(lane), "rb") as fh:
            return RunSpec.parse(fh.read(MAX_CLAIM).decode("utf-8").strip()), False
    except (OSError, UnicodeDecodeError, QueueLineError, ValueError):
        return None, False


def lane_line(home: Home, lane: int) -> RunSpec | None:
    """The queue line ``lane`` serves (:func:`_lane_state`), or None."""
    return _lane_state(home, lane)[0]


def others_lines(home: Home, lane: int) -> list[RunSpec]:
    """The lines the other lanes of ``lane``'s priority serve or claimed."""
    return [spec for other in lanes.lanes_of(lanes.priority_of(lane)) if other != lane
            for spec in (lane_line(home, other),) if spec is not None]


def taken_positions(runs: list[RunSpec], taken: list[RunSpec]) -> set[int]:
    """The positions in ``runs`` of one copy -- the first free -- of each of ``taken``
    (the queue's own rule for running runs, :func:`cluster.queue.running_indices`)."""
    return running_indices(list(enumerate(runs)), taken, False)


def look(home: Home, lane: int, queue: QueueFile) -> deps.Choice:
    """What ``lane``'s master does next (see the module docstring)."""
    runs = queue.read()
    if not runs:
        return deps.Choice()
    mine, unknown = _lane_state(home, lane)
    if mine is not None and mine in runs:
        return deps.Choice(serve=mine)
    priority = lanes.priority_of(lane)
    others = others_lines(home, lane)
    taken = taken_positions(runs, others)
    served = {owner(spec) for spec in others} - {None}
    user_lane = lane != priority

    def skip(position: int, spec: RunSpec) -> bool:
        if position in taken:
            return True
        return user_lane and (owner(spec) is None or owner(spec) in served)

    def later(spec: RunSpec) -> bool:
        return owner(spec) in served

    prefer = later if served and not user_lane else None
    order = [(i, spec) for i, spec in deps.serving_order(runs, prefer) if not skip(i, spec)]
    if not order:
        return deps.Choice()
    if unknown:
        # It runs a run, not known which: as seed 000's master, the first it may serve.
        first = min(i for i, _ in order)
        return deps.Choice(serve=runs[first])
    if not deps.needs_look(order[0][1]):
        return deps.Choice(serve=order[0][1])
    queued = {p: runs if p == priority else QueueFile.for_priority(home, p).read()
              for p in PRIORITIES}
    return deps.choose(priority, queued, deps.Resolver(home, queued), skip=skip,
                       later=prefer)


def claim(home: Home, lane: int, queue: QueueFile, spec: RunSpec) -> bool:
    """Take ``spec`` for ``lane`` under the queue's lock: False when it left the queue or
    another lane serves or claimed every copy of it meanwhile; else ``lanes/<lane>.claim``
    names it (a lane already serving it keeps its job.start) and it moves to the front of
    the queue, behind the runs the other lanes serve."""
    with queue.holding() as held:
        runs = list(held.runs)
        others = others_lines(home, lane)
        taken = taken_positions(runs, others)
        if not any(run == spec for i, run in enumerate(runs) if i not in taken):
            log.info("lane %d: %s was taken by another lane or left %s meanwhile", lane,
                     spec.line(), queue.path.name)
            return False
        path = home.lane_claim(lane)
        path.parent.mkdir(exist_ok=True)
        fsutil.atomic_write(path, spec.line() + "\n")
    queue.promote(spec, behind=others)
    return True


def release(home: Home, lane: int) -> None:
    """Forget ``lane``'s claim once its run is over -- its job.start gone and its end
    steps done, so its line left the queue --: a later push of the same line is a new run.
    Until then the line stays taken (another lane must not serve a run that is ending)."""
    if not home.job_start(lane).exists() and not ending.pending(home, lane):
        home.lane_claim(lane).unlink(missing_ok=True)
