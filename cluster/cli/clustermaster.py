"""clustermaster.py -- one clustermaster invocation (port of clustermaster.pl).

Usage: clustermaster.py [--config FILE] [--home DIR] [--set KEY=VALUE]... [--priority N]
                        [--lane L]

The priority comes from the name the script was invoked by: clustermaster.py is 0,
clustermaster1.py (a symlink) is 1, clustermaster2.py is 2; --priority overrides it.
``--lane L`` (3 and up, up to ``user_lanes`` lanes for priority 0) is one of the more
clustermasters that serve priority 0's queue, each one run of a different user
(docs/runoptions.md, "Fair share"); its log is ``clustermaster.L.log``.
Each invocation does phase 1 (queue scan), phase 2 (the PID-file dance) and, if it wins,
one run from the head of its queue (seed 000), then exits.  run_clustermaster.py starts
each every supervisor_interval seconds when it may have work, and at once when its queue
changes.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from cluster import lanes
from cluster.cli import common
from cluster.defaults import EXIT_FAILED, EXIT_USAGE, PRIORITIES
from cluster.errors import ClusterError
from cluster.home import suffixed
from cluster.master.run import invocation


def priority_from_name(argv0: str) -> int:
    """0 for clustermaster.py, N for clustermasterN.py (seed 000's symlink trick)."""
    match = re.fullmatch(r"clustermaster(\d*)(\.py)?", Path(argv0).name)
    return int(match.group(1)) if match and match.group(1) else 0


def build_main(argv: list[str]) -> int:
    """build.py's main, imported only when a run's job list is made (an idle invocation,
    nearly every one, never needs it): the master calls it in a fork of itself
    (:mod:`cluster.runtime.forkrun`) instead of starting build.py."""
    from cluster.cli import build
    return build.main(argv)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--priority", type=int, choices=PRIORITIES)
    parser.add_argument("--lane", type=int, choices=lanes.ALL_LANES[len(PRIORITIES):],
                        help="a user lane of priority 0 (docs/runoptions.md, \"Fair share\")")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    priority = args.priority if args.priority is not None else priority_from_name(
        prog or sys.argv[0])
    if priority not in PRIORITIES:
        print(f"clustermaster: priority {priority} from the program name is not one of "
              f"{PRIORITIES}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"clustermaster: {exc}", file=sys.stderr)
        return EXIT_USAGE
    lane = priority if args.lane is None else args.lane
    if lanes.priority_of(lane) != priority:
        print(f"clustermaster: lane {lane} serves priority {lanes.priority_of(lane)}, not "
              f"{priority}", file=sys.stderr)
        return EXIT_USAGE
    if lane not in lanes.served_lanes(cfg.user_lanes):
        print(f"clustermaster: lane {lane} is not served with user_lanes = "
              f"{cfg.user_lanes} (lanes {', '.join(map(str, lanes.served_lanes(cfg.user_lanes)))})",
              file=sys.stderr)
        return EXIT_USAGE
    common.setup_logging(cfg.home / "log" / suffixed("clustermaster.log", lane), args.verbose)
    try:
        return invocation.invoke(cfg, lane, common.config_argv(args),
                                 job_list_main=build_main)
    except ClusterError as exc:
        logging.getLogger("cluster.master").error("%s", exc)
        return EXIT_FAILED
