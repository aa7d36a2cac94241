#!/usr/bin/env python3
"""nodegate.py -- see cluster/cli/nodegate.py for usage."""
import sys

from cluster.cli import nodegate

if __name__ == "__main__":
    sys.exit(nodegate.main(sys.argv[1:]))
