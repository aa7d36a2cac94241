"""enqueue_auto.py -- queue the nightly or weekly auto runs (port of enqueueAuto.pl).

Usage: enqueue_auto.py [--config FILE] [--home DIR] [--set KEY=VALUE]... nightly|weekly [NAME...]

Reads <home>/auto/<schedule>/<name>/jobdef.txt (first line: `<products> [option ...]`) and
appends one `auto <schedule>-<name> ...` run per job to the priority-2 queue, where
clustermaster2.py picks it up.  Typically run from cron.
Exit status: 0 done, 1 a named job was not found or a jobdef was bad, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys

from cluster import auto
from cluster.cli import common
from cluster.errors import ClusterError
from cluster.home import Home


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enqueue_auto.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("schedule", choices=auto.SCHEDULES)
    parser.add_argument("names", nargs="*", metavar="NAME")
    args = parser.parse_args(argv)
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"enqueue_auto.py: {exc}", file=sys.stderr)
        return 2
    common.setup_logging()
    errors = _ErrorCounter()
    logging.getLogger("cluster.auto").addHandler(errors)
    for spec in auto.enqueue(Home(cfg.home), args.schedule, args.names):
        print(f"queued: {spec.line()}")
    return 1 if errors.count else 0
