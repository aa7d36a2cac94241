"""clusterpull.py -- the node's resident loop (port of clusterpull.sh).

Usage: clusterpull.py [--config FILE] [--set KEY=VALUE]... [-v] [-q]
                      [--once | --install-cron | --remove-cron]
       clusterpull.py --ephemeral [--name NAME] [--work DIR] [--config FILE] [--set ...]

Single instance per work_dir.  Every heartbeat_interval seconds: heartbeat to the master's
monitor, and when a run waits that this node has not finished, start run.py for it.

--install-cron puts one entry in the current user's crontab (clusterpull_schedule, every 10
minutes by default) that starts this script with the same --config/--set options, so a
node that died or rebooted comes back; running it again replaces the entry, never adds a
second.  --remove-cron takes it out.  The entry is tagged with work_dir, so several nodes
on one machine each have their own.  Both exit without starting the loop.  The entry runs
with --quiet: the log (work_dir/log/clusterpull.log) keeps everything, and cron mails only
warnings and errors, not "already running" every ten minutes.

A second start that finds the lock held exits at once, unless the holder is hung: its loop
touches work_dir/clusterpull.alive at every pass, and when that file is older than
max(300 s, three of the loop's longest passes) the holder, its run.py and its jobs are
killed and the newcomer takes the node over (cluster.node.liveness; clusterpull.sh's
"checking for timeouts").

At start (once it holds the single-instance lock) it removes, anywhere under work_dir, the
temporary files that killed processes left (fsutil.remove_dead_temps: named
.<file>.<pid>.<random>.tmp, and that pid is no longer a live process).

--ephemeral runs one node session for a batch system (Slurm), no cron (docs/provisioning.md,
"Ephemeral nodes"): the node is named NAME, else <prefix>-$SLURM_JOB_ID (the prefix from
the master's resource file, else node_prefix), works in DIR, else $TMPDIR/<name>, joins
whatever run waits at any priority, and exits 0 when nothing was wanted of it for
ephemeral_idle seconds or the resource file says every priority is idle or finished (at
once, before its first heartbeat, when it says so at start), 3 when connect_retries
heartbeats in a row failed (connect_retry_delay apart), 2 for a usage error (no name).

Run as root with a job_user set (node.conf), the node runs every job as that account
(cluster.node.jobuser); when it does not exist clusterpull.py says so, naming it and how to
make it, and exits 2 at once: it never runs jobs as root in its stead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from cluster import cron, datatypes
from cluster.cli import common
from cluster.config import Config
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import AlreadyRunning, ClusterError
from cluster.node import caps, ephemeral, jobuser, liveness
from cluster.node.pull import ClusterPull
from cluster.node.transports import make_transport
from cluster.runtime import fsutil
from cluster.runtime.service import install_signal_handlers
from cluster.runtime.singleton import SingleInstance


def cron_tag(cfg: Config) -> str:
    """The crontab tag of this node's entry (see cluster.cron)."""
    return f"clusterpull:{cfg.work_dir.resolve()}"


def cron_entry(args: argparse.Namespace, cfg: Config) -> cron.CronEntry:
    """The node's crontab entry; ConfigError if clusterpull_schedule is not cron syntax."""
    schedule = datatypes.check_schedule("clusterpull_schedule", cfg.clusterpull_schedule)
    options = cron.config_argv(args.config, args.home, args.set, cfg,
                               pin=("work_dir", "master_home"))
    return cron.CronEntry(cron_tag(cfg), schedule,
                          cron.script_command("clusterpull.py", [*options, "--quiet"]))


def clean_work_dir(work_dir: Path) -> list[Path]:
    """Remove the temporary files that killed processes left anywhere under ``work_dir``.

    Called once at start, under the single-instance lock: every writer into work_dir is this
    clusterpull or a child of it (run.py, the jobs), so a temp file whose writer is gone is a
    leftover (see :func:`cluster.runtime.fsutil.remove_dead_temps`).  Returns what it removed.
    """
    removed = fsutil.remove_dead_temps(work_dir, recursive=True)
    if removed:
        logging.getLogger("cluster.pull").info(
            "removed %d temporary file(s) left by killed processes under %s",
            len(removed), work_dir)
    return removed


def _manage_cron(args: argparse.Namespace, cfg: Config) -> int:
    """--install-cron / --remove-cron; the exit status (0 done, 1 crontab failed, 2 config)."""
    return common.manage_cron("clusterpull.py", args.remove_cron, [cron_tag(cfg)],
                              lambda: [cron_entry(args, cfg)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterpull.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one heartbeat, then exit")
    mode.add_argument("--install-cron", action="store_true",
                      help="install (or update) this node's crontab entry, then exit")
    mode.add_argument("--remove-cron", action="store_true",
                      help="remove this node's crontab entry, then exit")
    mode.add_argument("--ephemeral", action="store_true",
                      help="one node session for a batch job, no cron: exit 0 when not "
                           "wanted, 3 when the master is unreachable")
    parser.add_argument("--name", help="with --ephemeral: the node's name (default "
                                       "<prefix>-$SLURM_JOB_ID)")
    parser.add_argument("--work", type=Path, help="with --ephemeral: the work folder "
                                                  "(default $TMPDIR/<name>)")
    parser.add_argument("-v", "--verbose", action="store_true")
    common.add_quiet_option(parser)
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if (args.name is not None or args.work is not None) and not args.ephemeral:
        print("clusterpull.py: --name and --work go with --ephemeral", file=sys.stderr)
        return EXIT_USAGE
    if args.install_cron or args.remove_cron:
        # Before the log and work_dir set-up: managing the crontab must not create them.
        return _manage_cron(args, cfg)
    if not _job_account_usable(cfg):
        return EXIT_USAGE
    if args.ephemeral:
        return _ephemeral(args, cfg)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    common.setup_logging(cfg.work_dir / "log" / "clusterpull.log", args.verbose, args.quiet)
    pull = ClusterPull(cfg, caps.detect().format(), common.config_argv(args),
                       rejoin_delay=cfg.rejoin_delay)
    lock = cfg.work_dir / "clusterpull.lock"
    for attempt in (1, 2):
        try:
            with SingleInstance(lock, "clusterpull.py"):
                clean_work_dir(cfg.work_dir)
                if args.once:
                    pull.tick(pull.clock.monotonic())
                    return EXIT_OK
                install_signal_handlers(pull.stop_flag)
                return pull.run()
        except AlreadyRunning as exc:
            # The usual case under cron (every clusterpull_schedule): logged, and with
            # --quiet not printed, so cron has nothing to mail.  Unless the holder is hung
            # (clusterpull.sh's "checking for timeouts"): then it goes, and this one stays.
            said = None if attempt > 1 else liveness.stop_hung(
                lock, cfg.work_dir, liveness.hung_after(cfg.heartbeat_interval,
                                                        cfg.io_timeout))
            if said is None:
                logging.getLogger("cluster.pull").info("%s; exiting", exc)
                return EXIT_OK
            logging.getLogger("cluster.pull").warning("%s", said)
    return EXIT_OK


def _job_account_usable(cfg: Config) -> bool:
    """Whether the jobs' account can be used (:mod:`cluster.node.jobuser`); when not (the
    node is root and job_user does not exist), the error is printed, naming the account
    and how to make it: a root node never falls back to running jobs as root."""
    try:
        jobuser.job_account(cfg.job_user)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return False
    return True


def _ephemeral(args: argparse.Namespace, cfg: Config) -> int:
    """--ephemeral: one node session (cluster.node.ephemeral); its exit status."""
    log = logging.getLogger("cluster.pull")
    try:
        rel = ephemeral.resource_rel(cfg)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    transport = make_transport(cfg)
    resources = ephemeral.load_resources(transport, rel, time.time(), cfg.resource_interval)
    try:
        name = ephemeral.ephemeral_name(args.name, os.environ,
                                        resources.node.prefix if resources is not None
                                        else cfg.node_prefix)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    work = ephemeral.work_folder(args.work, os.environ, name)
    # The session's name and work folder, as settings: its configuration and run.py's.
    settings = ephemeral.session_settings(cfg, name, work, os.environ)
    args.set = [*args.set, *(f"{key}={value}" for key, value in settings.items())]
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    work.mkdir(parents=True, exist_ok=True)
    common.setup_logging(work / "log" / "clusterpull.log", args.verbose, args.quiet)
    if resources is not None and ephemeral.all_done(resources, time.time(),
                                                    cfg.resource_interval):
        log.info("ephemeral node %s: the resource file says every priority is idle or "
                 "finished; exiting %d", name, ephemeral.EXIT_NOT_WANTED)
        return ephemeral.EXIT_NOT_WANTED
    pull = ClusterPull(cfg, caps.detect().format(), common.config_argv(args),
                       rejoin_delay=cfg.rejoin_delay)
    session = ephemeral.EphemeralSession(
        pull, lambda now: ephemeral.load_resources(transport, rel, now, cfg.resource_interval),
        time.time)
    log.info("ephemeral node %s: working in %s", name, work)
    try:
        with SingleInstance(cfg.work_dir / "clusterpull.lock", "clusterpull.py"):
            clean_work_dir(work)
            install_signal_handlers(pull.stop_flag)
            status = session.run()
            if status == ephemeral.EXIT_NOT_WANTED and pull.heartbeats:
                pull.say_goodbye()  # it leaves the node lists now, not when its lease ends
            return status
    except AlreadyRunning as exc:
        log.error("ephemeral node %s: %s (another session uses the work folder %s)", name,
                  exc, work)
        return EXIT_USAGE
