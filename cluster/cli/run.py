"""run.py -- take part in the running run of one priority (port of run.pl).

Usage: run.py [--config FILE] [--set KEY=VALUE]... [--priority N]

Reads job.start of that priority from the master, then follows the master's orders
(BUILD, JOBS, UPLOAD, CONTINUE, ABORT) until the run is over.  clusterpull.py starts it.
Exit status: 0 run over for this node, 1 failure, 3 master unreachable, 4 aborted (may
rejoin later), 2 bad usage.

At start it removes the temporary files killed processes left in work_dir and
work_dir/baseline (the baseline builds' stamps); clusterpull.py cleans all of work_dir when
it starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cluster import lanes
from cluster.cli import common
from cluster.defaults import EXIT_USAGE, PRIORITIES
from cluster.errors import ClusterError
from cluster.node import caps
from cluster.node.noderun import NodeRun
from cluster.node.runcontext import STOP_SIGNALS
from cluster.node.transports import make_transport
from cluster.runtime import fsutil
from cluster.runtime.service import install_signal_handlers


def clean_work_dir(work_dir: Path) -> list[Path]:
    """Remove the temporary files killed processes left in ``work_dir`` and its
    ``baseline`` folder (not below: the mirrored trees are clusterpull's to clean at its
    start, and walking them at every run would slow the node's start).  Returns them."""
    removed = [*fsutil.remove_dead_temps(work_dir),
               *fsutil.remove_dead_temps(work_dir / "baseline")]
    if removed:
        logging.getLogger("cluster.node").info(
            "removed %d temporary file(s) left by killed processes in %s",
            len(removed), work_dir)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--priority", type=int, choices=PRIORITIES, default=0)
    parser.add_argument("--lane", type=int, choices=lanes.ALL_LANES[len(PRIORITIES):],
                        help="a run in a user lane of priority 0 (job.L.start, port "
                             "base_port + L; docs/runoptions.md, \"Fair share\")")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    common.setup_logging(verbose=args.verbose)
    clean_work_dir(cfg.work_dir)
    lane = args.priority if args.lane is None else args.lane
    if lanes.priority_of(lane) != args.priority:
        print(f"run.py: lane {lane} serves priority {lanes.priority_of(lane)}, not "
              f"{args.priority}", file=sys.stderr)
        return EXIT_USAGE
    run = NodeRun(cfg, make_transport(cfg), lane, caps.detect().format())
    install_signal_handlers(run.stop_flag, STOP_SIGNALS)
    return run.run()
