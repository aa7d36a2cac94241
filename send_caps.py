#!/usr/bin/env python3
"""send_caps.py -- port of sendCaps.pl; see cluster/cli/send_caps.py for usage."""
import sys

from cluster.cli import send_caps

if __name__ == "__main__":
    sys.exit(send_caps.main(sys.argv[1:]))
