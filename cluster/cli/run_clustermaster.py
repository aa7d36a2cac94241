"""run_clustermaster.py -- port of runClustermaster.sh: keep the clustermasters coming.

Usage: run_clustermaster.py [--config FILE] [--home DIR] [--set key=value]...
                            [--interval SECONDS] [--once] [--kill-children] [-q]

Seed 000: "checks to see if another instance of runClustermaster.sh is already running - if
it is it just exits.  If not it goes into an infinite loop, kicking off clustermaster.pl,
clustermaster1.pl and clustermaster2.pl every 10 seconds."  Here:

* the single-instance check is a non-blocking flock on ``<home>/run_clustermaster.lock``;
  a second instance logs that another one runs and exits at once with status 0, so cron
  can start this every minute;
* every ``--interval`` seconds (default: config ``supervisor_interval``, 10 s) the repo's
  top-level ``clustermaster.py``, ``clustermaster1.py`` and ``clustermaster2.py`` are started
  with this interpreter and the same ``--config``/``--home``/``--set`` arguments; their output
  is appended to ``<home>/log/run_clustermaster.children.log``.  A priority that surely has
  nothing to do is not started at that round: nothing its phase 1 could find, and either a
  live master holding its PID file, or no queued run, no PID file and no run end to finish
  (:func:`cluster.master.run.idle.surely_idle`);
* a priority whose queue changes is started at once, between rounds;
* SIGTERM or SIGINT stops the loop.  Running clustermasters are left to finish their run,
  unless ``--kill-children`` is given: then they get SIGTERM (a second signal: SIGKILL).
* every round publishes the node side of this repo into ``<home>/node-code/`` with its
  MANIFEST (:class:`cluster.master.daemon.supervisor.NodeCodePublisher`), which the nodes'
  clusterpull fetches when it changed (self_update); it does so while the round's
  clustermasters start, holding ``<home>/node-code.lock``, and a run is announced only once
  the publish let go of it (:mod:`cluster.master.files.codelock`);
* every ``resource_interval`` seconds (and at the first round) it rewrites the resource file
  (``resource_file``, default ``<home>/resources.json``) for provisioners and ephemeral
  nodes (:class:`cluster.master.files.resources.ResourceWriter`; docs/provisioning.md);
* ``--once`` starts each of the three once, idle or not, and exits (for tests and manual
  use);
* it logs to ``<home>/log/run_clustermaster.log`` and to stderr; ``--quiet`` (for crontab
  lines: cron mails whatever a job prints) prints only warnings and errors.

Exit status: 0 (also when another instance runs), 2 for a bad option or configuration.

Deviation: the shell script's loop is a plain ``sleep 10``; ours is drift-corrected and
skips missed periods, and its children run in their own sessions.
"""

from __future__ import annotations

import argparse
import compileall
import logging
import os
import sys
from pathlib import Path

from cluster import lanes
from cluster.cli import common, progname
from cluster.defaults import EXIT_OK, EXIT_USAGE, REPO_ROOT
from cluster.errors import ClusterError, ConfigError
from cluster.master.daemon.supervisor import NodeCodePublisher, Supervisor
from cluster.master.files.resources import ResourceWriter
from cluster.master.run import idle
from cluster.runtime.service import StopFlag, install_signal_handlers
from cluster.triggers.discovery import WorkWatcher

logger = logging.getLogger("cluster.supervisor")

PROG = progname.prog("run_clustermaster.py")
#: One script per priority, 0, 1, 2 (seed 000: clustermaster.pl, clustermaster1.pl, ...).
SCRIPTS = ("clustermaster.py", "clustermaster1.py", "clustermaster2.py")
LOCK_NAME = "run_clustermaster.lock"
CHILD_LOG_NAME = "run_clustermaster.children.log"
LOG_NAME = "run_clustermaster.log"
#: How often the supervisor asks its WorkWatcher whether a run waits [seconds]: a run
#: starts within this of being queued.  The watcher costs a few stat calls, so 20 looks a
#: second are nothing, and they take a tenth of a second off every run's start (the
#: default slice, 0.25 s, cost 0.125 s on average).
WAKEUP_POLL = 0.05


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Start clustermaster 0, 1 and 2 every "
                                "few seconds (port of runClustermaster.sh).")
    common.add_config_options(p)
    p.add_argument("--interval", metavar="SECONDS", type=float,
                   help="seconds between rounds (default: config supervisor_interval)")
    p.add_argument("--once", action="store_true", help="start each clustermaster once, exit")
    common.add_quiet_option(p)
    p.add_argument("--kill-children", action="store_true",
                   help="on stop, SIGTERM the running clustermasters instead of leaving them")
    return p


def clustermaster_commands(root: Path, args: list[str], user_lanes: int = 1
                           ) -> list[list[str]]:
    """One argv per lane (:func:`cluster.lanes.served_lanes`; its index is the lane's
    number): this interpreter running ``root``'s clustermaster scripts, a user lane as
    ``clustermaster.py --lane L``."""
    commands = [[sys.executable, str(root / script), *args] for script in SCRIPTS]
    commands += [[sys.executable, str(root / SCRIPTS[0]), *args, "--lane", str(lane)]
                 for lane in lanes.served_lanes(user_lanes)[len(SCRIPTS):]]
    return commands


def compile_package(root: Path) -> None:
    """Write the bytecode of ``root``'s cluster package now, once.

    The supervisor starts clustermaster processes all day (every run's, and at each tick
    those that may have work); each would
    otherwise compile the modules it imports where PYTHONDONTWRITEBYTECODE is set (about a
    third of an idle invocation's CPU time, and a tenth of a second on a run's start).
    Python writes the same files itself on first use elsewhere; files already up to date
    are left alone.  A checkout this user cannot write to is logged and served as it is.
    """
    if not compileall.compile_dir(str(root / "cluster"), quiet=2, workers=1):
        logger.warning("could not write the bytecode of %s/cluster (read-only?); each "
                       "clustermaster compiles what it imports", root)


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return int(exc.code or 0)
    try:
        cfg = common.load_config(args)
        interval = cfg.supervisor_interval if args.interval is None else args.interval
        if not interval > 0:
            raise ConfigError("--interval", interval, "seconds > 0")
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    started = common.start_master_daemon(cfg, PROG, LOG_NAME, LOCK_NAME, args.quiet, logger)
    if isinstance(started, int):
        return started
    home, guard = started
    # Temporary files of processes killed before this start (the whole home, once).
    for left in home.clean_temps():
        logger.info("removed %s, left by a killed process", left)
    compile_package(REPO_ROOT)

    def nothing_to_do(lane: int) -> bool:
        return idle.surely_idle(cfg, home, lane)

    def claimed(lane: int) -> bool:
        return os.path.lexists(home.pid_file(lane))

    served = lanes.served_lanes(cfg.user_lanes)
    watcher = WorkWatcher(home)

    def woken() -> list[int]:
        # The watcher says which priorities have work; each of their lanes looks.
        found = set(watcher())
        return [lane for lane in served if lanes.priority_of(lane) in found]

    try:
        supervisor = Supervisor(clustermaster_commands(REPO_ROOT, common.config_argv(args),
                                                       cfg.user_lanes),
                                interval=interval, log_path=home.log_dir / CHILD_LOG_NAME,
                                kill_children=args.kill_children, wakeup=woken,
                                poll=WAKEUP_POLL,
                                on_tick=NodeCodePublisher(REPO_ROOT, home.node_code),
                                idle=None if args.once else nothing_to_do,
                                claimed=claimed, tick_lock=home.node_code_lock,
                                periodic=[(cfg.resource_interval, ResourceWriter(cfg))])
        if args.once:
            supervisor.initialize()
            try:
                supervisor.tick(supervisor.clock.monotonic())
            finally:
                supervisor.shutdown()
            return EXIT_OK
        stop = StopFlag()
        restore = install_signal_handlers(stop)
        try:
            supervisor.run(stop)
        finally:
            restore()
        return EXIT_OK
    finally:
        guard.release()
