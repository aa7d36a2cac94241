#!/usr/bin/env python3
"""enqueue_auto.py -- see cluster/cli/enqueue_auto.py for usage."""
import sys

from cluster.cli import enqueue_auto

if __name__ == "__main__":
    sys.exit(enqueue_auto.main(sys.argv[1:]))
