"""``python3 -m cluster.bmpcmp``: job lines call it; the command line is cluster.cli.bmpcmp."""

import sys

from cluster.cli.bmpcmp import main

if __name__ == "__main__":
    sys.exit(main())
