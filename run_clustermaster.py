#!/usr/bin/env python3
"""run_clustermaster.py -- port of runClustermaster.sh; see cluster/cli/run_clustermaster.py."""
import sys

from cluster.cli import run_clustermaster

if __name__ == "__main__":
    sys.exit(run_clustermaster.main(sys.argv[1:]))
