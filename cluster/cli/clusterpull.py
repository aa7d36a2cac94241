"""clusterpull.py -- the node's resident loop (port of clusterpull.sh).

Usage: clusterpull.py [--config FILE] [--set KEY=VALUE]... [--once]

Single instance per work_dir.  Every heartbeat_interval seconds: heartbeat to the master's
monitor, and when a run waits that this node has not finished, start run.py for it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from cluster import caps
from cluster.cli import common
from cluster.errors import AlreadyRunning, ClusterError
from cluster.pull import ClusterPull
from cluster.singleton import SingleInstance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterpull.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--once", action="store_true", help="one heartbeat, then exit")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return 2
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    common.setup_logging(cfg.work_dir / "log" / "clusterpull.log", args.verbose)
    pull = ClusterPull(cfg, caps.detect().format(), common.config_argv(args))
    try:
        with SingleInstance(cfg.work_dir / "clusterpull.lock", "clusterpull.py"):
            if args.once:
                pull.tick(time.monotonic())
                return 0
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, pull.stop)
            return pull.run()
    except AlreadyRunning as exc:
        print(f"clusterpull.py: {exc}", file=sys.stderr)
        return 0
