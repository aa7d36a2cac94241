#!/usr/bin/env python3
"""clusterpush.py -- see cluster/cli/clusterpush.py for usage."""
import sys

from cluster.cli import clusterpush

if __name__ == "__main__":
    sys.exit(clusterpush.main(sys.argv[1:]))
