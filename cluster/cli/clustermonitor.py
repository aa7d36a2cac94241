"""clustermonitor.py -- the cluster in a terminal (port of clustermonitor.pl).

Usage: clustermonitor.py [--config FILE] [--home DIR] [--set KEY=VALUE]... [--interval S]
                         [--once]

Shows a status line per running run (jobs done of total, results per second, estimated
end, nodes, time since start), one line per node (``--DOWN--`` and since when once it has
not been heard from for node_down_after seconds, 300 by default; ``--DISABLED--`` for a
node clusteradmin disabled; a node a batch job runs with its job id) and the queued runs,
then the newest runs.  When a provisioner (clusterscale.py) runs, its last look comes
before the nodes: "from Slurm: wanted W, pending P, running R", its jobs, the message of a
failed call to Slurm, or that it is not running.  On a terminal the view is redrawn in
place every --interval seconds (default 2) until Ctrl-C; with --once, or when the output
is not a terminal, it is printed once.

Exit status: 0; 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import shutil
import sys

from cluster.cli import common, progname
from cluster.console import status, terminal
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.home import Home
from cluster.runtime.service import StopFlag, install_signal_handlers

PROG = progname.prog("clustermonitor.py")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between redraws (default 2)")
    parser.add_argument("--once", action="store_true",
                        help="print the view once and exit (also when not on a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0, or 2 bad usage or configuration)."""
    parsed = common.parse_with_config(_parser(), argv, PROG)
    if isinstance(parsed, int):
        return parsed
    args, cfg = parsed
    if not args.interval > 0:
        print(f"{PROG}: --interval {args.interval}: expected a positive number of seconds",
              file=sys.stderr)
        return EXIT_USAGE
    home = Home(cfg.home)
    if not home.root.is_dir():
        print(f"{PROG}: master home {home.root} does not exist (expected the home of a "
              f"master: --home or the config's home)", file=sys.stderr)
        return EXIT_USAGE
    tty = sys.stdout.isatty()
    stop = StopFlag()
    restore = install_signal_handlers(stop)
    try:
        terminal.watch(lambda: status.snapshot(home, cfg), sys.stdout, args.interval,
                       once=args.once or not tty, stop=stop.is_set, wait=stop.wait,
                       columns=lambda: shutil.get_terminal_size().columns if tty else None)
    except BrokenPipeError:  # | head
        pass
    finally:
        restore()
    return EXIT_OK
