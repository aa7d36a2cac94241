"""clusterscale.py -- the provisioner: keeps the batch jobs running ephemeral nodes at the
number the master's resource file wants (docs/provisioning.md, "The provisioner").

Usage: clusterscale.py [--config master.conf] [--home DIR] [--set key=value]... [--once] [-q]
       clusterscale.py [--config master.conf] --clear-host HOST|all

Every ``resource_interval`` seconds, and within :data:`WATCH_POLL` of each rewrite of the
resource file (the master rewrites it at once when a run starts or ends), it reads it
(``resource_file``, default ``<home>/resources.json``), lists the batch system's jobs
named ``<node_prefix>-*``, decides what to submit and cancel
(:mod:`cluster.provision.scaler`: ``max_nodes``, ``slurm_max_submit_rate``, two looks of
hysteresis before a cancel) and does it.  Each look
is one log line ``wanted W pending P running R: <what it did and why>`` in
``<home>/log/clusterscale.log`` (and on stderr; ``--quiet`` for crontab lines keeps only
warnings there); a line equal to the previous look's is logged at DEBUG only, so an idle
cluster does not fill the log.  A failed call to the batch system is a WARNING line quoting
its message, and the next look tries again.  After each look it rewrites
``<home>/provision.json`` (:mod:`cluster.wire.provision`: the counts, each job with its
node's name and a pending job's reason, the line, the last failure's message), which the
status page, ``clusteradmin stat`` and ``clustermonitor`` show.

Each job's node, ``<node_prefix>-<job id>``, gets its key ``node-keys/<name>.key`` in the
home as soon as sbatch has given the id, and each job of the prefix found without one (a
restart) gets it at the look that finds it (:class:`cluster.provision.jobkeys.JobKeys`):
an ephemeral node that logs in over ssh cannot make its own.  A key that cannot be made is
a WARNING naming the node and the path.

Single instance: a second one (cron starts it every few minutes, like the other daemons)
sees ``<home>/clusterscale.lock`` held, logs so and exits 0.  A restarted one adopts the
jobs it finds by their name: it submits nothing twice.  SIGTERM or SIGINT ends the loop
after the current look; the batch jobs are left as they are (the ephemeral nodes leave by
themselves when nothing is wanted of them).

Each job runs a pilot (:mod:`cluster.provision.pilots`): the node under ``node_python``,
else this process's own interpreter, its imports checked first, its output in
``<pilot_log>/<node>.log``.  A pilot that ends within ``pilot_min_life`` (not by exit 0 or
a stop signal) failed: one WARNING with its last lines per streak of failures, the submits
paused (doubling, up to ``pilot_backoff_max``), and after ``pilot_exclude_after`` failures
on one host that host excluded from the submissions until ``--clear-host HOST`` (or
``all``) clears it.  The node of a job that has ended leaves ``nodes/`` (and so the
console's lists) at the look that sees it gone.

The batch system is master.conf's ``provision_engine`` (``slurm``, ``gridengine`` or a
site's ``module:Class``; :func:`cluster.provision.engines.make_engine`);
:data:`ENGINE_FACTORY` makes it, and a test swaps it.

Exit status: 0 stopped, or another instance runs; 2 a bad option or configuration, or the
engine cannot be set up (its message on stderr).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from cluster.cli import common, progname
from cluster.config import Config
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.files.nodefiles import forget_node
from cluster.master.files.resources import resource_path
from cluster.provision.engine import PENDING, RUNNING, Engine
from cluster.provision.engines import make_engine
from cluster.provision.exclusions import FILE_NAME as EXCLUDED_FILE
from cluster.provision.exclusions import Exclusions
from cluster.provision.jobkeys import JobKeys
from cluster.provision.pilots import PilotSettings, PilotWatch, node_python, pilot_log_dir
from cluster.provision.scaler import Demand, Provisioner, ScaleSettings, Step, job_number
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopFlag, install_signal_handlers
from cluster.wire.provision import (
    CANCELLED,
    SUBMITTED,
    ProvisionJob,
    ProvisionStatus,
    format_status,
)
from cluster.wire.resources import STALE_INTERVALS, ResourceFileError, read_resources

logger = logging.getLogger("cluster.provision")

PROG = progname.prog("clusterscale.py")
LOCK_NAME = "clusterscale.lock"
LOG_NAME = "clusterscale.log"
#: How often the resource file is looked at between looks [seconds]: a master rewrites it
#: at once when a run starts, and a look then follows within this time, so a push's first
#: node is asked for at once, not at the next ``resource_interval``.
WATCH_POLL = 0.2


#: Makes the engine from the configuration (ClusterError when it cannot); tests swap it.
ENGINE_FACTORY: Callable[[Config], Engine] = make_engine


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Keep the batch jobs running "
                                "ephemeral nodes at the number the master wants.")
    common.add_config_options(p)
    p.add_argument("--once", action="store_true", help="one look (read, decide, act), then exit")
    p.add_argument("--clear-host", metavar="HOST", help="let the provisioner submit to HOST "
                   "again after failed pilots excluded it ('all': every host), then exit")
    common.add_quiet_option(p)
    return p


def read_demand(path: Path, now: float, interval: float) -> Demand:
    """What the resource file at ``path`` wants at ``now`` (epoch seconds).  A file that is
    stale, missing or unreadable means the master is gone: nothing is wanted."""
    try:
        resources = read_resources(path, now, interval)
    except FileNotFoundError:
        return Demand(0, False, (), f"no resource file {path}")
    except OSError as exc:
        return Demand(0, False, (), f"resource file {path} cannot be read: {exc.strerror}")
    except ResourceFileError as exc:
        return Demand(0, False, (), str(exc))
    if resources.stale:
        return Demand(0, False, tuple(resources.node.command),
                      f"resource file {path} written {now - resources.written:.0f} s ago, "
                      f"more than {STALE_INTERVALS} x {interval:g} s")
    return Demand(resources.nodes_wanted, True, tuple(resources.node.command))


def file_stamp(path: Path) -> tuple[int, int] | None:
    """What tells one write of ``path`` from the next: its inode and modification time
    (every write is a new file renamed over the old one); None when it cannot be seen."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def wait_for_change(path: Path, seen: tuple[int, int] | None, seconds: float,
                    stop: StopFlag, clock: Clock) -> None:
    """Return after ``seconds``, when ``stop`` is set, or as soon as ``path`` is no longer
    the file ``seen`` (:func:`file_stamp`), whichever comes first; looked at every
    :data:`WATCH_POLL` seconds (a stat: cheap)."""
    deadline = clock.monotonic() + seconds
    while not stop.is_set():  # bounded by the deadline
        left = deadline - clock.monotonic()
        if left <= 0 or file_stamp(path) != seen:
            return
        stop.wait(min(WATCH_POLL, left), clock)


def _job_order(job: ProvisionJob) -> tuple[int, tuple[int, ...], str]:
    """Oldest first: a batch system numbers its jobs upwards (Slurm's 42, Grid Engine's
    42.3)."""
    return job_number(job.job_id)


def provision_status(provisioner: Provisioner, step: Step, interval: float,
                     now: float) -> ProvisionStatus:
    """What the status file says of ``step``: the counts and the line of the look, its
    jobs as listed (those it cancelled marked ``cancelled``) and the ones it submitted
    (``submitted``), each with the name of its ephemeral node, oldest first."""
    settings = provisioner.settings
    cancelled = set(step.cancelled)
    jobs = [ProvisionJob(job.job_id, job.name, settings.node_name(job.job_id),
                         CANCELLED if job.job_id in cancelled else job.state, job.reason)
            for job in step.jobs or ()]
    jobs += [ProvisionJob(job_id, settings.job_name, settings.node_name(job_id), SUBMITTED)
             for job_id in step.submitted]
    pilots = provisioner.pilots
    failing, failure, next_submit = 0, "", 0.0
    excluded: tuple[str, ...] = ()
    if pilots is not None:
        failing, excluded = pilots.streak, tuple(pilots.excluded())
        last = pilots.last_failure
        if failing and last is not None:
            failure = last.describe() + (": " + " / ".join(last.tail) if last.tail else "")
            next_submit = max(0.0, pilots.pause_until - pilots.clock.monotonic())
    return ProvisionStatus(written=now, pid=os.getpid(), engine=provisioner.engine.label,
                           interval=interval, wanted=step.wanted,
                           pending=step.count(PENDING), running=step.count(RUNNING),
                           jobs=tuple(sorted(jobs, key=_job_order)), action=step.line,
                           trouble=step.trouble, failing=failing, failure=failure,
                           next_submit=next_submit, excluded=excluded)


class StatusWriter:
    """Writes the status file (``<home>/provision.json``) atomically after each look, mode
    0644 (it holds no secret).  A write that fails (a full disk) is logged once while it
    lasts and never stops the provisioner."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failing = False

    def write(self, status: ProvisionStatus) -> None:
        try:
            fsutil.atomic_write(self.path, format_status(status), fsync=False, mode=0o644)
        except OSError as exc:
            if not self.failing:
                logger.warning("cannot write the status file %s: %s (the console does not "
                               "see this provisioner until it can)", self.path,
                               exc.strerror or exc)
            self.failing = True
            return
        if self.failing:
            logger.info("the status file %s is written again", self.path)
        self.failing = False


def serve(provisioner: Provisioner, path: Path, interval: float, stop: StopFlag,
          clock: Clock, once: bool = False, status: StatusWriter | None = None,
          home: Home | None = None) -> None:
    """Look every ``interval`` seconds, and at once when the resource file is rewritten
    (a run starting or ending), until ``stop`` is set (or once); after each look,
    ``status`` (when given) writes what it saw and did, and the nodes of the jobs that
    ended leave ``home``'s ``nodes/``."""
    previous = ""
    while not stop.is_set():  # bounded by the stop flag: a daemon's loop
        started = clock.monotonic()
        # Taken before the read: a write during the look is then seen after it.
        seen = file_stamp(path)
        step = provisioner.step(read_demand(path, clock.time(), interval))
        if step.trouble:
            logger.warning("%s", step.line)
        else:
            logger.log(logging.INFO if step.line != previous else logging.DEBUG, "%s",
                       step.line)
        previous = step.line
        if home is not None and provisioner.pilots is not None:
            for node in provisioner.pilots.gone_nodes:
                try:
                    if forget_node(home, node):
                        logger.info("node %s has ended (its job is gone): it leaves the "
                                    "node lists", node)
                except OSError as exc:
                    logger.warning("cannot remove the files of ended node %s: %s", node,
                                   exc.strerror or exc)
        if status is not None:
            status.write(provision_status(provisioner, step, interval, clock.time()))
        if once:
            return
        wait_for_change(path, seen, interval - (clock.monotonic() - started), stop, clock)


def main(argv: list[str] | None = None, clock: Clock | None = None) -> int:
    parsed = common.parse_with_config(_parser(), argv, PROG)
    if isinstance(parsed, int):
        return parsed
    args, cfg = parsed
    clock = clock or SystemClock()
    if args.clear_host:
        return clear_host(Home(cfg.home), args.clear_host)
    started = common.start_master_daemon(cfg, PROG, LOG_NAME, LOCK_NAME, args.quiet, logger)
    if isinstance(started, int):
        return started
    home, guard = started
    try:
        try:
            engine = ENGINE_FACTORY(cfg)
        except ClusterError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        # Each job's node key, made here beside the master home: a node over ssh cannot.
        pilots = PilotWatch(PilotSettings.from_config(cfg), clock,
                            pilot_log_dir(cfg, home.root), cfg.node_prefix,
                            node_python(cfg, sys.executable),
                            Exclusions(home.root / EXCLUDED_FILE))
        provisioner = Provisioner(engine, ScaleSettings.from_config(cfg), clock,
                                  jobs_seen=JobKeys(home.root, cfg.node_prefix), pilots=pilots)
        path = resource_path(cfg)
        logger.info("provisioning from %s every %g s: at most %d nodes of %d slots named "
                    "%s-*, at most %g submits a minute", path, cfg.resource_interval,
                    cfg.max_nodes, cfg.node_slots, cfg.node_prefix, cfg.slurm_max_submit_rate)
        stop = StopFlag()
        restore = install_signal_handlers(stop)
        try:
            serve(provisioner, path, cfg.resource_interval, stop, clock, once=args.once,
                  status=StatusWriter(home.provision_status), home=home)
        finally:
            restore()
        if stop.is_set():
            logger.info("stopped by signal %s; the batch jobs are left as they are", stop.signum)
        return EXIT_OK
    finally:
        guard.release()


def clear_host(home: Home, host: str) -> int:
    """--clear-host: take ``host`` ("all": every host) off the excluded list."""
    exclusions = Exclusions(home.root / EXCLUDED_FILE)
    try:
        gone = exclusions.clear(host)
    except OSError as exc:
        print(f"{PROG}: cannot change {exclusions.path}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_USAGE
    if gone:
        print(f"{PROG}: cleared {', '.join(gone)}: the provisioner submits there again")
    else:
        left = ", ".join(sorted(exclusions.hosts())) or "none"
        print(f"{PROG}: {host} is not excluded (excluded: {left})")
    return EXIT_OK
