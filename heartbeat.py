#!/usr/bin/env python3
"""heartbeat.py -- port of heartbeat.pl; see cluster/cli/heartbeat.py for usage."""
import sys

from cluster.cli import heartbeat

if __name__ == "__main__":
    sys.exit(heartbeat.main(sys.argv[1:]))
