"""send_caps.py -- port of sendCaps.pl: print this node's capability line.

Usage: send_caps.py [--config FILE] [--home DIR] [--set key=value]...

Prints one line of key=value words (see cluster.wire.caps), e.g.

    os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=2 ram_mb=23975 tools=gs,md5sum,mutool

Deviation from sendCaps.pl, which sent the line to the master itself: in the protocol of
seed 001 the caps travel in the ``caps`` header of every node request, so run.py and
clusterpull.py call cluster.caps.detect() directly and this script only prints the line
(to send it with a heartbeat: ``heartbeat.py --caps "$(send_caps.py)"``).

Exit status: 0, or 2 for a bad option or configuration.
"""

from __future__ import annotations

import argparse
import sys

from cluster.cli import common
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.node import caps


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="send_caps.py", description="Print this node's "
                                "capability line (port of sendCaps.pl).")
    common.add_config_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return int(exc.code or 0)
    try:
        # The configuration is not needed to detect caps; loading it still rejects a bad
        # file, so every script of the node fails the same way on the same mistake.
        common.load_config(args)
    except ClusterError as exc:
        print(f"send_caps.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(caps.detect().format())
    return EXIT_OK

