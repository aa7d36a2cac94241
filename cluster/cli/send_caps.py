"""send_caps.py -- port of sendCaps.pl: print this node's capability line.

Usage: send_caps.py [--config FILE] [--home DIR] [--set key=value]...

Prints one line of key=value words (see cluster.wire.caps), e.g.

    os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=2 ram_mb=23975 tools=gs,md5sum,mutool

Deviation from sendCaps.pl, which sent the line to the master itself: in the protocol of
seed 001 the caps travel in the ``caps`` header of every node request, so run.py and
clusterpull.py call cluster.node.caps.detect() directly and this script only prints the line
(to send it with a heartbeat: ``heartbeat.py --caps "$(send_caps.py)"``).

Exit status: 0, or 2 for a bad option or configuration.
"""

from __future__ import annotations

import argparse

from cluster.cli import common, progname
from cluster.defaults import EXIT_OK
from cluster.node import caps

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("send_caps.py")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Print this node's "
                                "capability line (port of sendCaps.pl).")
    common.add_config_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    # The configuration is not needed to detect caps; loading it still rejects a bad file,
    # so every script of the node fails the same way on the same mistake.
    parsed = common.parse_with_config(_parser(), argv, "send_caps.py")
    if isinstance(parsed, int):
        return parsed
    print(caps.detect().format())
    return EXIT_OK

