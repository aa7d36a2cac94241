#!/usr/bin/env python3
"""localcluster.py -- see cluster/cli/localcluster.py for usage."""
import sys

from cluster.cli import localcluster

if __name__ == "__main__":
    sys.exit(localcluster.main(sys.argv[1:]))
