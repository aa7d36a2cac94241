"""The provisioner's status file: what ``clusterscale.py`` saw and did at its last look.

The provisioner (:mod:`cluster.cli.clusterscale`) rewrites ``<home>/provision.json``
(:attr:`cluster.home.Home.provision_status`) at each look; the console (the status page,
``clusteradmin stat``, ``clustermonitor``) reads it to show "from Slurm: wanted W, pending
P, running R", each batch job with its ephemeral node's name, a pending job's reason, and
the message of a failed call to the batch system.
It never holds a secret (nothing the provisioner knows is one): it is written mode 0644.
The fields are described in docs/provisioning.md ("The provisioner's status file").

* :class:`ProvisionStatus` and :class:`ProvisionJob`: the model, frozen;
* :func:`format_status`: the model as the file's text (JSON);
* :func:`read_status` / :func:`parse_status`: the text as the model, every field checked;
  a bad field raises :class:`ProvisionFileError` (a ``ValueError``) naming the field and
  what was expected.  The reader also says whether the file is *stale*: older than
  :data:`~cluster.wire.resources.STALE_INTERVALS` (3) x the provisioner's own look
  interval (written in the file), which means the provisioner is not running.

It lives in ``wire/`` beside the resource file's format, so the console reads it without
importing the provisioner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cluster.wire.jsonfields import JsonFields
from cluster.wire.resources import STALE_INTERVALS

#: The format this module writes and the only one it reads.
FORMAT = 1
#: A job's state: the engine's (cluster.provision.engine.STATES but "gone", which is never
#: listed), or what the look did to it: submitted now (not listed yet) or cancelled now.
SUBMITTED, CANCELLED = "submitted", "cancelled"
JOB_STATES = ("pending", "running", "ending", SUBMITTED, CANCELLED)


class ProvisionFileError(ValueError):
    """The text is not a provisioner's status file of :data:`FORMAT`; the message names
    the field and what was expected."""


@dataclass(frozen=True)
class ProvisionJob:
    """One batch job of the provisioner: its id, its batch name, the name of the ephemeral
    node it runs (``<prefix>-<job id>``), its state (:data:`JOB_STATES`) and, pending, why
    the batch system does not start it (Slurm's reason: ``Resources``, ``PartitionDown``...;
    "" otherwise)."""

    job_id: str
    name: str
    node: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class ProvisionStatus:
    """One look of the provisioner.

    ``written``: epoch seconds; ``pid``: the provisioner's process; ``engine``: the batch
    system's name for people ("Slurm"); ``interval``: seconds between looks; ``wanted``: the
    nodes wanted (bounded by ``max_nodes``); ``pending`` and ``running``: its jobs as the
    batch system listed them, both None when they could not be listed; ``jobs``: those jobs
    and the ones submitted at this look; ``action``: the look's log line; ``trouble``: the
    message of the last call to the batch system that failed at this look, or "".
    ``stale`` is the reader's verdict (never written)."""

    written: float
    pid: int
    engine: str
    interval: float
    wanted: int
    pending: int | None
    running: int | None
    jobs: tuple[ProvisionJob, ...] = ()
    action: str = ""
    trouble: str = ""
    #: Pilots that failed in a row (docs/provisioning.md, "Pilots that cannot start"), the
    #: last one's account with its last lines, and the seconds until the next submit the
    #: back-off allows (0: now).
    failing: int = 0
    failure: str = ""
    next_submit: float = 0.0
    #: The hosts excluded from the submissions.
    excluded: tuple[str, ...] = ()
    stale: bool = False

    def age(self, now: float) -> float:
        """Seconds since it was written (0 for a writer's clock ahead of ``now``)."""
        return max(0.0, now - self.written)


def format_status(status: ProvisionStatus) -> str:
    """``status`` as the file's text: one JSON object, a final newline (``stale`` is not
    written)."""
    document = {
        "format": FORMAT,
        "written": round(status.written, 3),
        "pid": status.pid,
        "engine": status.engine,
        "interval": status.interval,
        "wanted": status.wanted,
        "pending": status.pending,
        "running": status.running,
        "jobs": [{"job_id": j.job_id, "name": j.name, "node": j.node, "state": j.state,
                  "reason": j.reason} for j in status.jobs],
        "action": status.action,
        "trouble": status.trouble,
        "failing": status.failing,
        "failure": status.failure,
        "next_submit": round(status.next_submit, 1),
        "excluded": list(status.excluded),
    }
    return json.dumps(document, indent=1) + "\n"


def read_status(path: Path, now: float) -> ProvisionStatus:
    """The status file at ``path``, checked, and stale if written more than
    :data:`STALE_INTERVALS` x its interval before ``now`` (epoch seconds).

    OSError when it cannot be read (FileNotFoundError: no provisioner has written one);
    :class:`ProvisionFileError` naming the file and the field when its content is wrong.
    """
    return parse_status(path.read_bytes(), now, source=str(path))


def parse_status(data: bytes | str, now: float,
                 source: str = "provisioner status file") -> ProvisionStatus:
    """:func:`read_status` on the file's content ``data``; ``source`` names it in errors."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProvisionFileError(f"{source}: not JSON ({exc}): expected one JSON object"
                                 ) from None
    top = JsonFields.top(document, source, ProvisionFileError)
    version = top.get("format")
    if version != FORMAT or isinstance(version, bool):
        raise top.error("format", version, str(FORMAT))
    interval = top.number("interval", 0.0, positive=True)
    pending, running = top.count_or_null("pending"), top.count_or_null("running")
    if (pending is None) != (running is None):
        raise top.error("running" if running is None else "pending", None,
                        "null only when the other of pending and running is null too "
                        "(the jobs could not be listed)")
    jobs = top.get("jobs")
    if not isinstance(jobs, list):
        raise top.error("jobs", jobs, "a list of jobs")
    written = top.number("written")
    excluded = top.get("excluded") if "excluded" in document else []
    if not isinstance(excluded, list) or not all(isinstance(h, str) for h in excluded):
        raise top.error("excluded", excluded, "a list of host names")
    return ProvisionStatus(
        written=written, pid=top.integer("pid", 1), engine=top.text("engine", empty=False),
        interval=interval, wanted=top.integer("wanted", 0), pending=pending, running=running,
        jobs=tuple(_job(JsonFields.of(job, source, f"jobs.{i}.", ProvisionFileError))
                   for i, job in enumerate(jobs)),
        action=top.text("action"), trouble=top.text("trouble"),
        # Keys added within format 1: a file without them is an older provisioner's.
        failing=top.integer("failing", 0) if "failing" in document else 0,
        failure=top.text("failure") if "failure" in document else "",
        next_submit=top.number("next_submit", 0.0) if "next_submit" in document else 0.0,
        excluded=tuple(excluded),
        stale=now - written > STALE_INTERVALS * interval)


def _job(fields: JsonFields) -> ProvisionJob:
    state = fields.get("state")
    if state not in JOB_STATES:
        raise fields.error("state", state, "one of " + ", ".join(JOB_STATES))
    return ProvisionJob(job_id=fields.text("job_id", empty=False),
                        name=fields.text("name"), node=fields.text("node", empty=False),
                        state=state, reason=fields.text("reason"))
