#!/usr/bin/env python3
"""build.py -- see cluster/cli/build.py for usage."""
import sys

from cluster.cli import build

if __name__ == "__main__":
    sys.exit(build.main(sys.argv[1:]))
