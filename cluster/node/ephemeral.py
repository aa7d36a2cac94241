"""An ephemeral node: one node session without cron (``clusterpull.py --ephemeral``).

A batch system (Slurm, through the provisioner of docs/provisioning.md) starts it when runs
wait; it leaves by itself when it is no longer wanted.  It is the resident loop of
:mod:`cluster.node.pull` (the same heartbeats, the same run.py, the same node code fetched
through the transport, the same key) with three differences:

* **its name** is ``--name``, else ``<prefix>-<SLURM_JOB_ID>`` (:func:`ephemeral_name`): the
  prefix the master writes in its resource file (``node.prefix``), else this node's own
  ``node_prefix`` setting;
* **its work folder** is ``--work``, else ``$TMPDIR/<name>`` (:func:`work_folder`);
* **its exit status** (:meth:`EphemeralSession.verdict`, asked at every pass of the loop):

  - 0 (:data:`EXIT_NOT_WANTED`) when nothing was wanted of it for ``ephemeral_idle``
    seconds, or -- a node that has not worked yet: it was started for runs that are over --
    when the resource file, fresh, says every priority is ``idle`` or ``finished`` (looked
    at once before the first heartbeat, then at most every ``resource_interval`` while
    nothing is wanted).  A node that has worked waits out ``ephemeral_idle``, so a run
    queued meanwhile takes it without a new batch job.  Something is wanted of it while its
    run.py runs, while the monitor says a run waits that it has not finished, and while the
    fresh resource file says a priority is ``running`` a run it has not finished (or one
    not yet started, whose id is still ""): a run queued but not yet served by its master
    (the job list still being made) keeps the node, which the provisioner started for it;
  - 3 (:data:`EXIT_UNREACHABLE`) after ``connect_retries`` heartbeats failed in a row,
    ``connect_retry_delay`` apart (the monitor unreachable, or this node's key not there):
    Slurm's ``RequeueExit=3`` starts it again.

The resource file is read through the node's transport and checked by the one reader of its
format (:func:`cluster.wire.resources.parse_resources`).  A file older than three
``resource_interval`` is *stale* (its master is dead) and is not believed: the heartbeats
decide then.  A file that cannot be read or is malformed is ignored, with a log line.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Config
from cluster.datatypes import valid_node_name
from cluster.defaults import EXIT_OK, NODE_EXIT_UNREACHABLE
from cluster.errors import ClusterError, ConfigError
from cluster.node.pull import ClusterPull
from cluster.node.transport import Transport
from cluster.wire.resources import RUNNING, STALE_INTERVALS, Resources, parse_resources

log = logging.getLogger("cluster.pull")

#: The exit status of an ephemeral node that is no longer wanted (the batch job is done).
EXIT_NOT_WANTED = EXIT_OK
#: The exit status of one that could not reach its master (the batch system requeues it).
EXIT_UNREACHABLE = NODE_EXIT_UNREACHABLE
#: The resource file in the master home when ``resource_file`` is not set.
DEFAULT_RESOURCE_FILE = "resources.json"
#: The batch system's job id in the environment of the job.
JOB_ID_VARIABLE = "SLURM_JOB_ID"
#: The CPUs the batch system gave the job on this machine.
CPUS_VARIABLE = "SLURM_CPUS_ON_NODE"


def stale(resources: Resources, now: float, interval: float) -> bool:
    """Whether the file read is stale at ``now`` (epoch seconds): older than
    :data:`~cluster.wire.resources.STALE_INTERVALS` x ``interval``.  Judged at each use,
    not when it was read: a copy kept while nothing rewrites it goes stale."""
    return now - resources.written > STALE_INTERVALS * interval


def all_done(resources: Resources, now: float, interval: float) -> bool:
    """Whether the file is fresh at ``now`` and says every priority is idle or finished."""
    return not stale(resources, now, interval) and resources.finished


def runs_on(resources: Resources, now: float, interval: float, finished: set[str]) -> bool:
    """Whether the file is fresh at ``now`` and says a priority is running a run not in
    ``finished`` (or one not started yet, whose id is "")."""
    return not stale(resources, now, interval) and any(
        info.status == RUNNING and info.run not in finished
        for info in resources.priorities.values())


def resource_rel(cfg: Config) -> str:
    """The resource file as a path in the master home: ``resource_file`` when set (an
    absolute one must lie in ``master_home``), else ``resources.json``.  ConfigError
    otherwise."""
    if not cfg.resource_file:
        return DEFAULT_RESOURCE_FILE
    path = Path(cfg.resource_file)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.relative_to(cfg.master_home).as_posix()
    except ValueError:
        raise ConfigError("resource_file", cfg.resource_file,
                          f"a path inside the master home {cfg.master_home} (a node reads it "
                          "through its transport)") from None


def load_resources(transport: Transport, rel: str, now: float, interval: float
                   ) -> Resources | None:
    """The resource file ``rel`` read through ``transport`` and checked
    (:func:`cluster.wire.resources.parse_resources`), or None when it is absent, unreadable
    or malformed (said in the log: the heartbeats then decide)."""
    try:
        text = transport.read_text(rel)
    except ClusterError as exc:
        log.warning("cannot read the resource file %s: %s", rel, exc)
        return None
    if text is None:
        return None
    try:
        return parse_resources(text, now, interval, source=rel)
    except ValueError as exc:
        log.warning("resource file ignored: %s", exc)
        return None


def ephemeral_name(explicit: str | None, env: Mapping[str, str], prefix: str) -> str:
    """This node's name: ``explicit`` (``--name``), else ``<prefix>-<SLURM_JOB_ID>``.
    ConfigError when neither is there or the result is not a node name."""
    if explicit:
        name = explicit
    else:
        job_id = env.get(JOB_ID_VARIABLE, "")
        if not job_id:
            raise ConfigError("--name", "", f"a node name: give --name, or run inside a batch "
                                            f"job that sets {JOB_ID_VARIABLE}")
        name = f"{prefix}-{job_id}"
    if not valid_node_name(name):
        raise ConfigError("--name", name, "letters, digits, '.', '_' or '-' (max 64)")
    return name


def work_folder(explicit: Path | None, env: Mapping[str, str], name: str) -> Path:
    """This node's work folder: ``explicit`` (``--work``), else ``<$TMPDIR>/<name>`` (the
    system's temporary folder when TMPDIR is not set), absolute."""
    if explicit is not None:
        return explicit.resolve()
    base = env.get("TMPDIR") or tempfile.gettempdir()
    return (Path(base) / name).resolve()


def session_settings(cfg: Config, name: str, work: Path, env: Mapping[str, str]
                     ) -> dict[str, str]:
    """The settings this session adds to its configuration (and hands run.py as
    ``--set``): its name and work folder, and, when ``slots`` is 0 (the CPU count) inside
    a Slurm job, the CPUs Slurm gave the job (``SLURM_CPUS_ON_NODE``) rather than the
    machine's."""
    settings = {"node_name": name, "work_dir": str(work)}
    cpus = env.get(CPUS_VARIABLE, "")
    if cfg.slots == 0 and cpus.isdigit() and int(cpus) > 0:
        settings["slots"] = cpus
    return settings


@dataclass
class EphemeralSession:
    """The exit rules of an ephemeral node around its :class:`ClusterPull` (whose ``cfg``
    carries the session's name and work folder).  ``load(now)`` reads the resource file
    (None when there is none); ``wall`` is the wall clock (epoch seconds) the file's
    ``written`` is compared with."""

    pull: ClusterPull
    load: Callable[[float], Resources | None]
    wall: Callable[[], float]
    idle_since: float | None = None
    #: When the resource file is next read (monotonic); the last one read till then.
    next_look: float = 0.0
    resources: Resources | None = None
    #: Whether it has had work (a run.py of its own): then it waits out ephemeral_idle.
    worked: bool = False

    def __post_init__(self) -> None:
        self.pull.retry_delay = self.pull.cfg.connect_retry_delay

    def verdict(self, now: float) -> int | None:
        """The exit status at ``now`` (monotonic), or None to go on (module docstring)."""
        cfg = self.pull.cfg
        if self.pull.failures >= cfg.connect_retries:
            log.warning("node %s: the master could not be reached in %d tries; exiting %d",
                        self.pull.name, self.pull.failures, EXIT_UNREACHABLE)
            return EXIT_UNREACHABLE
        if self.pull.has_work():
            self.idle_since = None
            self.worked = True
            return None
        wall = self.wall()
        if now >= self.next_look:
            self.next_look = now + cfg.resource_interval
            self.resources = self.load(wall)
        known = self.resources
        if known is not None and all_done(known, wall, cfg.resource_interval) \
                and not (self.worked or self.pull.finished):
            # Started for nothing: the runs it was asked for are over.  A node that has
            # worked waits out ephemeral_idle instead, so that a run queued meanwhile
            # takes it without a new batch job.
            log.info("node %s: the resource file says every priority is idle or finished; "
                     "exiting %d", self.pull.name, EXIT_NOT_WANTED)
            return EXIT_NOT_WANTED
        if known is not None and runs_on(known, wall, cfg.resource_interval,
                                         self.pull.finished):
            self.idle_since = None  # a run it may join is on (or queued): wanted
            return None
        if self.idle_since is None:
            self.idle_since = now
        if now - self.idle_since >= cfg.ephemeral_idle:
            log.info("node %s: nothing wanted of it for %.0f s; exiting %d", self.pull.name,
                     now - self.idle_since, EXIT_NOT_WANTED)
            return EXIT_NOT_WANTED
        return None

    def run(self) -> int:
        """The session: the node loop until :meth:`verdict` gives an exit status (or a stop
        request: 0)."""
        return self.pull.run(until=self.verdict)
