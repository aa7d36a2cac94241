#!/usr/bin/env python3
"""usergate.py -- see cluster/cli/usergate.py for usage."""
import sys

from cluster.cli import usergate

if __name__ == "__main__":
    sys.exit(usergate.main(sys.argv[1:]))
