#!/usr/bin/env python3
"""clustermaster.py (symlinked as clustermaster1.py and clustermaster2.py).

See cluster/cli/clustermaster.py for usage.
"""
import sys

from cluster.cli import clustermaster

if __name__ == "__main__":
    sys.exit(clustermaster.main(sys.argv[1:], prog=sys.argv[0]))
