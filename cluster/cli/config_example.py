"""``python3 -m cluster.cli.config_example [master|node]``: print an example configuration.

Writes to stdout the commented INI text of :func:`cluster.configfile.example` for the section
(default master): every key of that section with its meaning, unit and default.  That is
how ``etc/master.conf`` and ``etc/node.conf`` are made::

    python3 -m cluster.cli.config_example master > etc/master.conf
    python3 -m cluster.cli.config_example node > etc/node.conf

Exit status: 0 done, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys

from cluster import config, configfile
from cluster.defaults import EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python3 -m cluster.cli.config_example",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("section", nargs="?", choices=(config.MASTER, config.NODE),
                        default=config.MASTER)
    args = parser.parse_args(argv)
    sys.stdout.write(configfile.example(args.section))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
