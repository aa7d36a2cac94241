#!/usr/bin/env python3
"""bootstrap_node.py -- see cluster/cli/bootstrap_node.py for usage."""
import sys

from cluster.cli import bootstrap_node

if __name__ == "__main__":
    sys.exit(bootstrap_node.main(sys.argv[1:]))
