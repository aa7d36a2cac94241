#!/usr/bin/env python3
"""clusteradmin.py -- see cluster/cli/clusteradmin.py for usage."""
import sys

from cluster.cli import clusteradmin

if __name__ == "__main__":
    sys.exit(clusteradmin.main(sys.argv[1:]))
