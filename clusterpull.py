#!/usr/bin/env python3
"""clusterpull.py -- see cluster/cli/clusterpull.py for usage."""
import sys

from cluster.cli import clusterpull

if __name__ == "__main__":
    sys.exit(clusterpull.main(sys.argv[1:]))
