"""What one node's run is: the facts read and the folders made once, when the run opens.

:func:`open_run` reads job.start through the transport, derives the run's signing key from
the node's own key, checks ``work_dir``, makes the run's folders (``runs/<id>/temp``, the
job folders, the slots' homes when jobs run as ``job_user``), takes the build's key (no
tidy removes it meanwhile: :class:`cluster.node.workdir.UseHold`) and opens the node's log:
it returns the whole :class:`RunContext`, and nothing of it is set later.  The parts of the
run (:mod:`cluster.node.nodebuild`, :mod:`cluster.node.nodejobs`,
:mod:`cluster.node.nodeupload`, :mod:`cluster.node.mastercontact`) all work over that one
context; what they share that changes as the run goes is its :class:`NodeStatus`.

``<key>``, the name of the build folder ``work_dir/build/<key>`` and of the source mirror
``work_dir/src/<key>``, is the source path, or for a run's snapshot
(``runs/<id>/source/<tree>``) the run's kind, the user of a user run, and the tree: the
same for every run of that user's tree (:func:`build_key`).  A baseline tree (bmpcmp
runs) is kept in ``work_dir/baseline/<name>`` across runs.

A node running as root with ``job_user`` set runs its jobs as that account
(:mod:`cluster.node.jobuser`): the run's ``temp`` folder is the account's in a sweep run,
root's otherwise (each job writes in its own folder below: :mod:`cluster.node.jobdirs`),
each slot has a folder of its own in ``runs/<id>/homes/``, and processes of the account an
earlier run left are killed when the run opens.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from cluster import nodekeys
from cluster.config import Config
from cluster.defaults import REPO_ROOT
from cluster.errors import ClusterError
from cluster.home import suffixed
from cluster.node import jobuser, sweepresults, workdir
from cluster.node.jobdirs import JOBS_DIR, JobDirs
from cluster.node.slots import size_limit_blocks
from cluster.node.transport import Transport, read_node_key
from cluster.records import PYTHON
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock
from cluster.runtime.service import StopFlag
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.node")

#: The signals that make run.py leave its run cleanly: they set :attr:`RunContext.stop_flag`
#: (``cluster.runtime.service.install_signal_handlers``), and the loop then leaves the run.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SAFE_PATH = re.compile(r"[A-Za-z0-9_./+,@%=:-]+")
#: A baseline tree's folder name under work_dir/baseline (``/`` written as ``__``); it
#: starts with a letter or digit, so it never clashes with the dot files beside it.
BASELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+,@%=-]*")
RELAXED_TIMEOUT = 1800.0  # relaxtimeout, per clusterpush.txt: 30 minutes
#: The run folder's folder of the slots' own folders (their HOME and TMPDIR) when jobs run
#: as job_user (:mod:`cluster.node.slots`).
SLOT_HOMES = "homes"
#: The file in work_dir holding the node's instance id (``instance`` header): made once,
#: kept across restarts of the node, different on every machine set up from one node.conf.
INSTANCE_FILE = "instance"


@dataclass
class NodeStatus:
    """What the parts of a run share that changes as it goes: the failure the node reports
    with its next call (0 for none) and when that call is due (a monotonic time; 0.0 means
    at once)."""

    failure: int = 0
    failure_reason: str = ""
    next_contact: float = 0.0


@dataclass(frozen=True)
class RunContext:
    """One node's run, made whole by :func:`open_run`; its fields never change (what they
    point at -- the status, the log, the outbox, the job folders -- may)."""

    cfg: Config
    clock: Clock
    transport: Transport
    #: The lane whose job.start and port the run is at (cluster.lanes: a priority's own
    #: lane is its number).
    lane: int
    #: The node's name and slot count (``cfg``'s effective ones).
    name: str
    slots: int
    #: Set by TERM, INT and HUP: the run is left at the loop's next pass.
    stop_flag: StopFlag
    start: JobStart
    #: The run's signing key (the node's own key and the run id: cluster.wire.signing).
    key: bytes
    #: work_dir/instance (the ``instance`` header).
    instance: str
    work: Path
    run_dir: Path
    temp: Path
    #: The mirror of the master's tree, and the folder it is built in (buildtree).
    src: Path
    build_dir: Path
    tests: Path
    node_log_path: Path
    build_log: Path
    #: Touched once the run's build succeeded (a restarted run.py needs no new BUILD).
    built_marker: Path
    #: Where the baseline tree is built (bmpcmp runs); None without a baseline.
    baseline_dir: Path | None
    node_log: TextIO
    job_timeout: float
    #: The account jobs run as (job_user, the node being root), None for the node's own.
    account: jobuser.JobAccount | None
    #: Each job's own folder, its ``__temp__``; None in a sweep run, whose tasks have
    #: folders of their own (:mod:`cluster.node.jobdirs`).
    job_dirs: JobDirs | None
    #: A sweep run's results waiting to be sent; None in other runs.
    outbox: sweepresults.Outbox | None
    #: ``ulimit -f`` of a shell job (512-byte blocks) from ``max_output_bytes``.
    output_blocks: int
    status: NodeStatus


def open_run(cfg: Config, transport: Transport, lane: int, clock: Clock,
             stop_flag: StopFlag, in_use: workdir.UseHold) -> RunContext:
    """Open the run job.start describes (see the module docstring): ClusterError,
    ValueError or OSError when it cannot be (MasterUnreachable after the transport's own
    retries).  ``in_use`` takes the key of the run's build."""
    name = cfg.effective_node_name()
    start = _read_start(transport, lane)
    key = signing.run_key(_node_key(transport, name), start.id)
    work = _checked_work(cfg)
    account = jobuser.job_account(cfg.job_user)
    if account is not None:
        _open_for_jobs(work, account, name)
    elif os.geteuid() == 0:
        log.warning("node %s runs as root and job_user is empty: its jobs run as root "
                    "and can read node.conf and the node's keys; set job_user "
                    "(docs/security.md)", name)
    instance = node_instance(work)
    run_dir = work / "runs" / start.id
    sweep = bool(start.max_result_bytes)
    temp = _make_temp(run_dir, account, sweep)
    job_dirs = None if sweep else JobDirs(temp / JOBS_DIR, account)
    tree = _checked_build_key(start)
    build_dir = work / workdir.BUILD / tree  # where it is built (buildtree)
    in_use.take(build_dir.parent, tree)  # no tidy removes it meanwhile
    baseline_dir = _baseline_dir(start, work)
    node_log_path = run_dir / f"{name}.log"
    return RunContext(
        cfg=cfg, clock=clock, transport=transport, lane=lane, name=name,
        slots=cfg.effective_slots(), stop_flag=stop_flag, start=start, key=key,
        instance=instance, work=work, run_dir=run_dir, temp=temp,
        src=work / workdir.SRC / tree, build_dir=build_dir, tests=work / "tests",
        node_log_path=node_log_path, build_log=run_dir / f"{name}.build.log",
        built_marker=run_dir / "built", baseline_dir=baseline_dir,
        node_log=open(node_log_path, "a", encoding="utf-8"),  # noqa: SIM115
        job_timeout=_job_timeout(cfg, start), account=account, job_dirs=job_dirs,
        outbox=None if not sweep else sweepresults.Outbox(
            run_dir / sweepresults.OUTBOX_DIR, name, instance, start.max_result_bytes),
        output_blocks=size_limit_blocks(cfg.max_output_bytes), status=NodeStatus())


def _read_start(transport: Transport, lane: int) -> JobStart:
    text = transport.read_text(suffixed("job.start", lane))
    if text is None:
        raise ClusterError(f"no {suffixed('job.start', lane)} on the master")
    return JobStart.parse(text)


def _node_key(transport: Transport, name: str) -> bytes:
    """This node's own key, read through the transport (:func:`read_node_key`)."""
    text = read_node_key(transport, name)
    try:
        return signing.parse_secret(text)
    except ValueError as exc:
        raise ClusterError(f"{nodekeys.key_rel(name)} on the master: {exc}") from None


def _checked_work(cfg: Config) -> Path:
    work = cfg.work_dir.resolve()
    if not SAFE_PATH.fullmatch(str(work)):
        raise ClusterError(f"work_dir {work} must be a path of [A-Za-z0-9_./+,@%=:-] "
                           "(it is pasted into shell commands)")
    return work


def _make_temp(run_dir: Path, account: jobuser.JobAccount | None, sweep: bool) -> Path:
    """The run's temp folder, made, with the slots' homes beside it for ``account``; what
    a node killed in this run before (it rejoins) left as temporary files removed."""
    temp = run_dir / "temp"
    temp.mkdir(parents=True, exist_ok=True)
    if account is not None:
        if sweep:
            # Where a sweep's tasks write their streams and the node makes their
            # folders; the run folder above stays root's.
            jobuser.give_folder(temp, account)
        else:
            # Root's: a job writes in its own folder below only (jobdirs).
            os.chown(temp, 0, 0, follow_symlinks=False)
            os.chmod(temp, 0o711, follow_symlinks=False)
        (run_dir / SLOT_HOMES).mkdir(exist_ok=True)
    fsutil.remove_dead_temps(run_dir, recursive=True)
    return temp


def _checked_build_key(start: JobStart) -> str:
    key = build_key(start)
    if not BASELINE_NAME.fullmatch(key):
        raise ClusterError(f"job.start source {start.source!r} gives the build folder name "
                           f"{key!r}; expected [A-Za-z0-9_.+,@%=-] starting with a letter "
                           "or digit")
    return key


def _baseline_dir(start: JobStart, work: Path) -> Path | None:
    if not start.baseline:
        return None
    key = start.baseline.strip("/").replace("/", "__")
    if not BASELINE_NAME.fullmatch(key):
        raise ClusterError(f"job.start baseline {start.baseline!r} is not a tree "
                           "path of [A-Za-z0-9_.+,@%=-] and / starting with a letter "
                           "or digit")
    # Kept across runs (unlike src): the cache of the baseline build.
    return work / "baseline" / key


def _job_timeout(cfg: Config, start: JobStart) -> float:
    if start.job_timeout:
        return start.job_timeout  # a sweep's: never before its own timeout
    return RELAXED_TIMEOUT if "relaxtimeout" in start.options else cfg.job_timeout


def _open_for_jobs(work: Path, account: jobuser.JobAccount, name: str) -> None:
    """The node is root and its jobs run as ``account``: what the node makes from now on
    is readable by all but its secrets (umask 022: the corpus mirror, the builds, the run
    folders), ``work_dir`` and ``work_dir/runs`` can be entered, and the folders above
    must let the account through (ClusterError naming the one that does not).  A Python
    or node code the account cannot reach is warned of (only ``__python__`` jobs need
    them).  Processes of the account an earlier run left are killed."""
    os.umask(0o022)
    work.mkdir(parents=True, exist_ok=True)
    for folder in (work, work / "runs"):
        folder.mkdir(exist_ok=True)
        os.chmod(folder, os.stat(folder).st_mode | 0o711)
    blocked = jobuser.blocked_folder(work, account)
    if blocked is not None:
        raise ClusterError(
            f"job_user {account.name} cannot enter {blocked} (mode "
            f"{os.stat(blocked).st_mode & 0o7777:04o}), above work_dir {work}: its "
            "jobs could not reach their inputs; let others search it (chmod o+x) or "
            "put work_dir elsewhere")
    for what, folder in (("Python", Path(sys.executable).parent), ("node code", REPO_ROOT)):
        blocked = jobuser.blocked_folder(folder, account)
        if blocked is not None:
            # Only the jobs calling __python__ (bmpcmp's) need them: said, not refused.
            log.warning("node %s: job_user %s cannot enter %s, so it cannot use the "
                        "node's %s in %s: jobs calling %s (bmpcmp) will fail; install "
                        "them where others may enter", name, account.name, blocked, what,
                        folder, PYTHON)
    killed = jobuser.kill_leftovers(account)
    if killed:
        log.warning("node %s: killed %d process(es) of %s an earlier run left", name,
                    killed, account.name)
    # A run that ended without its own clean-up (the node was killed) may have left what
    # its jobs scheduled.
    for done in jobuser.remove_schedules(account):
        log.warning("node %s: %s (left by an earlier run)", name, done)


def node_instance(work_dir: Path) -> str:
    """This node's instance id: 16 hex digits in ``work_dir``/:data:`INSTANCE_FILE`, made
    the first time (atomically: two first starts agree on one).  A damaged file is made
    anew."""
    path = work_dir / INSTANCE_FILE
    try:
        value = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        value = ""
    if protocol.INSTANCE.fullmatch(value):
        return value
    work_dir.mkdir(parents=True, exist_ok=True)
    fresh = os.urandom(8).hex()
    fsutil.atomic_write(path, fresh + "\n")
    return fresh


def build_key(start: JobStart) -> str:
    """The name of the node's mirror and build folder of ``start``'s source (see the module
    docstring): the same for every run of one tree, so its build is reused.  A run's
    snapshot ``runs/<id>/source/<tree...>`` is keyed by the run's kind, a user run's user
    and the tree; any other source by its path; ``/`` written as ``__``."""
    parts = start.source.strip("/").split("/")
    if len(parts) > 3 and parts[0] == "runs" and parts[2] == "source":
        parts = [start.kind, *([start.ref] if start.kind == "user" else []), *parts[3:]]
    return "__".join(parts)


def job_environment() -> dict[str, str]:
    """The slot shells' environment: ours, with the project first on PYTHONPATH."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + old if old else "")
    return env
