#!/usr/bin/env python3
"""run.py -- see cluster/cli/run.py for usage."""
import sys

from cluster.cli import run

if __name__ == "__main__":
    sys.exit(run.main(sys.argv[1:]))
