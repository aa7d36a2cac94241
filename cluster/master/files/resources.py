"""The master's writer of the resource file (docs/provisioning.md, "The resource file"; the
format: cluster.wire.resources).

:func:`write_resources` gathers, for each priority, what the master home already records and
writes the file atomically at ``resource_file`` (default ``<home>/resources.json``).  The
supervisor's loop calls it every ``resource_interval`` seconds; a clustermaster calls it at
once when its run starts and when it ends (:func:`refresh`, which never raises).

Where each priority's facts come from, in this order:

* the ``job[.lane].start`` of one of its lanes (:func:`cluster.lanes.lanes_of`: priority 0's
  lane 0 and its user lanes 3, 4 ...; priorities 1 and 2 one lane each) exists: ``running``;
  each such lane's run gives its jobs left and running and the nodes connected (those not
  gone) from its ``live[.lane].json`` when that names the run.  Without it (the job list is
  being made) the counts are 0 and the run wants one node (``starting``).  A run that is
  stopping (``fatal`` or ``stopping`` in its live file) wants none.  When more than one
  lane runs (two users' pushes side by side, docs/runoptions.md, "Fair share"), the
  priority's counts are the sums over its lanes' runs (its ``nodes_wanted`` bounded by
  ``max_nodes``) and its ``run`` is the run of its lowest lane that runs (lane 0's, else
  the first user lane's).  So the file's format is unchanged -- one entry per priority, one
  run id each -- and a provisioner keeps nodes for every lane's run.
* else a queue line waits that is not the line of a run being ended (``runs/<id>/end``):
  ``running`` with run "" (not started yet), wanting one node.
* else a run of this priority is being ended, or the previous file said this priority ran
  or finished a run: ``finished`` with that run's id.
* else ``idle``.

Nothing here writes a secret: job.start's is never read into the file, and the node command
carries settings only.  The cost is a few stats and small reads: a job.start per lane
(:data:`cluster.lanes.ALL_LANES`; a missing one is a lane with no run), three queue files, a
listing of ``runs/`` (one folder per unfinished run) and the previous file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from cluster.config import Config
from cluster.defaults import PRIORITIES, REPO_ROOT
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.lanes import lanes_of
from cluster.master.files import ending
from cluster.queue import QueueFile
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock, SystemClock
from cluster.wire import resources
from cluster.wire.jobstart import JobStart
from cluster.wire.resources import (
    FINISHED,
    IDLE,
    RUNNING,
    MasterInfo,
    NodeLaunch,
    PriorityInfo,
    Resources,
)

log = logging.getLogger("cluster.master")

#: The resource file's name in the home when ``resource_file`` is empty.
DEFAULT_NAME = "resources.json"
#: The node script an ephemeral node runs, as this master's installation has it.
NODE_SCRIPT = REPO_ROOT / "clusterpull.py"
#: Listen addresses that name no one address: the master's host name is given instead.
WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})


def resource_path(cfg: Config) -> Path:
    """Where the resource file is: ``resource_file``, or ``<home>/resources.json``; a
    relative ``resource_file`` is taken relative to the home."""
    if not cfg.resource_file:
        return cfg.home / DEFAULT_NAME
    path = Path(cfg.resource_file).expanduser()
    return path if path.is_absolute() else cfg.home / path


def master_address(cfg: Config) -> str:
    """The address nodes reach this master at: ``listen_address``, or the host's name when
    it listens on every address."""
    return socket.getfqdn() if cfg.listen_address in WILDCARDS else cfg.listen_address


def node_launch(cfg: Config) -> NodeLaunch:
    """How to start an ephemeral node of this master: this installation's clusterpull.py
    with ``--ephemeral`` and the settings that point it at this master (its address, ports
    and home as this machine sees it: a node on a shared file system or this machine, or
    one logging in over ssh, for which ``master_home`` is a path on this machine too).

    With ``node_config`` set, ``--config <node_config>`` comes first: the batch nodes'
    node.conf (its ``transport``, ssh login, work folders...); the ``--set`` words after
    it still point the node at this master, overriding what that file says of it."""
    settings = {"master_host": master_address(cfg), "base_port": cfg.base_port,
                "monitor_port": cfg.monitor_port, "master_home": cfg.home.resolve(),
                "slots": cfg.node_slots, "node_prefix": cfg.node_prefix,
                "ephemeral_idle": f"{cfg.ephemeral_idle:g}",
                # The node judges the file's staleness by this master's interval, and reads
                # it where this master writes it (as a path in the home).
                "resource_interval": f"{cfg.resource_interval:g}",
                "resource_file": resource_path(cfg).resolve()}
    command = [str(NODE_SCRIPT), "--ephemeral"]
    if cfg.node_config:
        command += ["--config", cfg.node_config]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return NodeLaunch(command=tuple(command), slots=cfg.node_slots, prefix=cfg.node_prefix,
                      idle_exit=cfg.ephemeral_idle)


def gather(cfg: Config, clock: Clock | None = None) -> Resources:
    """The resource file's content now, from ``cfg``'s home (see the module docstring)."""
    clock = clock or SystemClock()
    home = Home(cfg.home)
    path = resource_path(cfg)
    previous = _previous_runs(path)
    endings = _ending_runs(home)
    priorities: dict[int, PriorityInfo] = {}
    for p in PRIORITIES:
        priorities[p] = _priority(cfg, home, p, endings.get(p), previous.get(p, ""))
    total = min(cfg.max_nodes, sum(info.nodes_wanted for info in priorities.values()))
    master = MasterInfo(host=socket.gethostname(), address=master_address(cfg),
                        pid=os.getpid(), base_port=cfg.base_port,
                        monitor_port=cfg.monitor_port)
    return Resources(written=clock.time(), master=master, priorities=priorities,
                     nodes_wanted=total, node=node_launch(cfg))


def write_resources(cfg: Config, clock: Clock | None = None) -> Resources:
    """Write the resource file (atomically, readable by all: it holds no secret) and
    return what was written.  OSError when it cannot be written."""
    content = gather(cfg, clock)
    path = resource_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)  # a resource_file in a folder of its own
    # No fsync: rewritten every few seconds, and a reader only needs it whole (the rename).
    fsutil.atomic_write(path, resources.format_resources(content), fsync=False, mode=0o644)
    return content


def refresh(cfg: Config, clock: Clock | None = None) -> None:
    """:func:`write_resources` for callers that must go on whatever happens (a run's start
    and end): a failure is logged, never raised."""
    try:
        write_resources(cfg, clock)
    except (OSError, ClusterError, ValueError) as exc:
        log.warning("cannot write the resource file %s: %s", resource_path(cfg),
                    _describe(exc))


def _describe(exc: Exception) -> str:
    """An error in words, without the temporary file's random name an OSError carries."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


class ResourceWriter:
    """The supervisor's periodic writer: calling it rewrites the file; a failure is logged
    once per distinct message (then again when it changes or clears), never raised."""

    def __init__(self, cfg: Config, clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.last_error = ""

    def __call__(self) -> bool:
        try:
            write_resources(self.cfg, self.clock)
        except (OSError, ClusterError, ValueError) as exc:
            text = _describe(exc)
            if text != self.last_error:
                log.error("cannot write the resource file %s: %s", resource_path(self.cfg),
                          text)
            self.last_error = text
            return False
        if self.last_error:
            log.info("resource file %s written again", resource_path(self.cfg))
            self.last_error = ""
        return True


# --- the facts of one priority ---------------------------------------------------------------
def _priority(cfg: Config, home: Home, p: int, ending_start: JobStart | None,
              previous_run: str) -> PriorityInfo:
    runs = [_running(cfg, home, lane, start) for lane in lanes_of(p)
            if (start := _job_start(home.job_start(lane))) is not None]
    if runs:
        return _combined(cfg, runs)
    ending_line = ending_start.queue if ending_start is not None else None
    if _waiting(home, p, ending_line):
        return PriorityInfo(status=RUNNING, nodes_wanted=resources.nodes_wanted(
            0, cfg.node_slots, cfg.max_nodes, starting=True))
    last = ending_start.id if ending_start is not None else previous_run
    return PriorityInfo(status=FINISHED, run=last) if last else PriorityInfo(status=IDLE)


def _combined(cfg: Config, runs: list[PriorityInfo]) -> PriorityInfo:
    """One priority's entry for the runs of its lanes (lowest lane first): the first's run
    id, the sums of the counts (the nodes wanted bounded by ``max_nodes``)."""
    if len(runs) == 1:
        return runs[0]
    return PriorityInfo(status=RUNNING, run=runs[0].run,
                        jobs_left=sum(r.jobs_left for r in runs),
                        jobs_running=sum(r.jobs_running for r in runs),
                        nodes=sum(r.nodes for r in runs),
                        nodes_wanted=min(cfg.max_nodes, sum(r.nodes_wanted for r in runs)))


def running_facts(cfg: Config, home: Home, lane: int) -> tuple[JobStart, PriorityInfo,
                                                                frozenset[str]] | None:
    """For the run of ``lane`` (:mod:`cluster.lanes`; a seed lane's number is its
    priority) whose job.start exists: that job.start, its own facts as the resource file
    counts them, and the names of the nodes in it (not gone) by its live file; None when
    there is no such run.  Preemption's look at the other lanes' runs
    (:mod:`cluster.master.run.preemption`)."""
    start = _job_start(home.job_start(lane))
    if start is None:
        return None
    live = _live(home.live(lane), start.id)
    nodes = _mapping(live.get("nodes")) if live is not None else {}
    names = frozenset(name for name, facts in nodes.items()
                      if isinstance(facts, dict) and facts.get("state") != "gone")
    return start, _running(cfg, home, lane, start, live), names


def _running(cfg: Config, home: Home, lane: int, start: JobStart,
             live: dict[str, Any] | None = None) -> PriorityInfo:
    if live is None:
        live = _live(home.live(lane), start.id)
    if live is None:  # its job list is being made: no counts yet
        return PriorityInfo(status=RUNNING, run=start.id, nodes_wanted=resources.nodes_wanted(
            0, cfg.node_slots, cfg.max_nodes, starting=True))
    jobs = _mapping(live.get("jobs"))
    left, running = _count(jobs.get("left")), _count(jobs.get("running"))
    nodes = _mapping(live.get("nodes"))
    connected = sum(1 for facts in nodes.values()
                    if isinstance(facts, dict) and facts.get("state") != "gone")
    stopping = bool(live.get("fatal") or live.get("stopping"))
    wanted = 0 if stopping else resources.nodes_wanted(left, cfg.node_slots, cfg.max_nodes)
    return PriorityInfo(status=RUNNING, run=start.id, jobs_left=left, jobs_running=running,
                        nodes=connected, nodes_wanted=wanted)


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else 0


def _job_start(path: Path) -> JobStart | None:
    try:
        return JobStart.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, ClusterError) as exc:
        # Being written by rename, a job.start is whole or absent; a bad one is the
        # clustermaster's to report.  The run still counts as waiting.
        log.debug("%s: %s", path, exc)
        return None


def _live(path: Path, run_id: str) -> dict[str, Any] | None:
    """The live file if it names ``run_id`` (one left by a killed master does not count)."""
    try:
        live = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return live if isinstance(live, dict) and live.get("run") == run_id else None


def _waiting(home: Home, p: int, ending_line: str | None) -> bool:
    """Whether a queue line of priority ``p`` waits, one copy of ``ending_line`` (the line
    of a run being ended, which its dequeue step removes) not counted."""
    path = home.queue(p)
    if not path.exists() and not home.legacy_queue(p).exists():
        return False  # the idle tick's usual case: one stat, no lock taken
    try:
        lines = [spec.line() for spec in QueueFile.for_priority(home, p).read()]
    except (OSError, ClusterError) as exc:
        log.debug("%s: %s", path, exc)
        return False
    if ending_line is not None and ending_line in lines:
        lines.remove(ending_line)
    return bool(lines)


def _ending_runs(home: Home) -> dict[int, JobStart]:
    """The newest run of each priority whose end steps are not all done, by its end record."""
    found: dict[int, JobStart] = {}
    if not home.runs.is_dir():
        return found
    for path in sorted(home.runs.glob(f"*/{ending.FILE_NAME}")):
        try:
            record = ending.EndRecord.load(path)
        except (OSError, ValueError):
            continue  # finished meanwhile, or unreadable: the clustermaster reports it
        if path.parent.name == record.run_id:
            found[record.start.priority] = record.start
    return found


def _previous_runs(path: Path) -> dict[int, str]:
    """The run each priority ran or finished in the file as it is now (so a priority whose
    run ended stays ``finished`` with that run's id); empty when there is none or it is
    not a good resource file."""
    try:
        old = resources.read_resources(path, 0.0, 1.0)
    except (OSError, ValueError):
        return {}
    return {p: info.run for p, info in old.priorities.items()}
