#!/usr/bin/env python3
"""monitor_port.py -- port of monitorPort.pl; see cluster/cli/monitor_port.py for usage."""
import sys

from cluster.cli import monitor_port

if __name__ == "__main__":
    sys.exit(monitor_port.main(sys.argv[1:]))
