#!/usr/bin/env python3
"""clustermonitor.py -- see cluster/cli/clustermonitor.py for usage."""
import sys

from cluster.cli import clustermonitor

if __name__ == "__main__":
    sys.exit(clustermonitor.main(sys.argv[1:]))
