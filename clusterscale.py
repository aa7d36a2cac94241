#!/usr/bin/env python3
"""clusterscale.py -- the provisioner; see cluster/cli/clusterscale.py for usage."""
import sys

from cluster.cli import clusterscale

if __name__ == "__main__":
    sys.exit(clusterscale.main(sys.argv[1:]))
