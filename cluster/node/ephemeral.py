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
    seconds, or when the resource file, fresh, says every priority is ``idle`` or
    ``finished`` (looked at once before the first heartbeat, then at most every
    ``resource_interval`` while nothing is wanted).  Something is wanted of it while its
    run.py runs, while the monitor says a run waits that it has not finished, and while the
    fresh resource file says a priority is ``running`` a run it has not finished (or one
    not yet started, whose id is still ""): a run queued but not yet served by its master
    (the job list still being made) keeps the node, which the provisioner started for it;
  - 3 (:data:`EXIT_UNREACHABLE`) after ``connect_retries`` heartbeats failed in a row,
    ``connect_retry_delay`` apart (the monitor unreachable, or this node's key not there):
    Slurm's ``RequeueExit=3`` starts it again.

The resource file is read here by :func:`read_offer`, which parses only what an ephemeral
node needs of it (when it was written, each priority's status and run, the node prefix);
the file's full format, its writer and its validating reader are
``cluster/wire/resources.py`` (the master's part of issue 24).  A file older than three
``resource_interval`` is *stale* (its master is dead) and is not believed: the heartbeats
decide then.
"""

from __future__ import annotations

import json
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

log = logging.getLogger("cluster.pull")

#: The exit status of an ephemeral node that is no longer wanted (the batch job is done).
EXIT_NOT_WANTED = EXIT_OK
#: The exit status of one that could not reach its master (the batch system requeues it).
EXIT_UNREACHABLE = NODE_EXIT_UNREACHABLE
#: The resource file in the master home when ``resource_file`` is not set.
DEFAULT_RESOURCE_FILE = "resources.json"
#: A resource file older than this many ``resource_interval`` is stale (docs/provisioning.md).
STALE_INTERVALS = 3
#: The statuses of a priority under which nothing is wanted of a node.
DONE_STATUSES = frozenset({"idle", "finished"})
#: The batch system's job id in the environment of the job.
JOB_ID_VARIABLE = "SLURM_JOB_ID"
#: The CPUs the batch system gave the job on this machine.
CPUS_VARIABLE = "SLURM_CPUS_ON_NODE"


@dataclass(frozen=True)
class Offer:
    """What an ephemeral node reads of the resource file: when it was written (epoch
    seconds), each priority's status, the run of each priority that is ``running`` ("" for
    one queued but not yet started), and the prefix of ephemeral nodes' names ("" when the
    file gives none)."""

    written: float
    statuses: dict[str, str]
    prefix: str
    running: dict[str, str]

    def runs_on(self, now: float, interval: float, finished: set[str]) -> bool:
        """Whether the file is fresh and says a run is on that is not in ``finished``."""
        return (not self.stale(now, interval)
                and any(run not in finished for run in self.running.values()))

    def stale(self, now: float, interval: float) -> bool:
        """Whether the file is older than STALE_INTERVALS x ``interval`` at ``now``."""
        return now - self.written > STALE_INTERVALS * interval

    def all_done(self, now: float, interval: float) -> bool:
        """Whether the file is fresh and says every priority is idle or finished."""
        return (not self.stale(now, interval)
                and all(status in DONE_STATUSES for status in self.statuses.values()))


def read_offer(text: str) -> Offer:
    """Parse the fields an ephemeral node uses of the resource file's ``text`` (JSON):
    ``written``, ``priorities.<p>.status`` and ``node.prefix``; the rest is ignored.
    ValueError naming the field and what was expected."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    written = data.get("written")
    if isinstance(written, bool) or not isinstance(written, (int, float)):
        raise ValueError(f"'written' is {written!r}, expected epoch seconds")
    priorities = data.get("priorities")
    if not isinstance(priorities, dict) or not priorities:
        raise ValueError("'priorities' is missing or empty, expected an object of priorities")
    statuses: dict[str, str] = {}
    running: dict[str, str] = {}
    for priority, entry in priorities.items():
        status = entry.get("status") if isinstance(entry, dict) else None
        if not isinstance(status, str):
            raise ValueError(f"'priorities.{priority}.status' is {status!r}, expected "
                             "idle, running or finished")
        statuses[str(priority)] = status
        if status == "running":
            run = entry.get("run", "")
            if not isinstance(run, str):
                raise ValueError(f"'priorities.{priority}.run' is {run!r}, expected a run id")
            running[str(priority)] = run
    node = data.get("node")
    prefix = node.get("prefix", "") if isinstance(node, dict) else ""
    if not isinstance(prefix, str):
        raise ValueError(f"'node.prefix' is {prefix!r}, expected a name")
    return Offer(float(written), statuses, prefix, running)


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


def load_offer(transport: Transport, rel: str) -> Offer | None:
    """The resource file ``rel`` read through ``transport``, or None when it is absent,
    unreadable or malformed (said in the log: the heartbeats then decide)."""
    try:
        text = transport.read_text(rel)
    except ClusterError as exc:
        log.warning("cannot read the resource file %s: %s", rel, exc)
        return None
    if text is None:
        return None
    try:
        return read_offer(text)
    except ValueError as exc:
        log.warning("resource file %s ignored: %s", rel, exc)
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
    carries the session's name and work folder).  ``load`` reads the resource file (None
    when there is none); ``wall`` is the wall clock the file's ``written`` is compared
    with."""

    pull: ClusterPull
    load: Callable[[], Offer | None]
    wall: Callable[[], float]
    idle_since: float | None = None
    #: When the resource file is next read (monotonic); the last one read till then.
    next_look: float = 0.0
    offer: Offer | None = None

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
            return None
        if now >= self.next_look:
            self.next_look = now + cfg.resource_interval
            self.offer = self.load()
        wall = self.wall()
        if self.offer is not None and self.offer.all_done(wall, cfg.resource_interval):
            log.info("node %s: the resource file says every priority is idle or finished; "
                     "exiting %d", self.pull.name, EXIT_NOT_WANTED)
            return EXIT_NOT_WANTED
        if self.offer is not None and self.offer.runs_on(wall, cfg.resource_interval,
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
