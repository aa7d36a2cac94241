#!/usr/bin/env python3
"""clusterstatus.py -- the status page; see cluster/cli/clusterstatus.py for usage."""
import sys

from cluster.cli import clusterstatus

if __name__ == "__main__":
    sys.exit(clusterstatus.main(sys.argv[1:]))
