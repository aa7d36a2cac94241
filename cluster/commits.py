"""Entry module kept for ``python3 -m cluster.commits`` (installed git hooks call it).

The code lives in :mod:`cluster.triggers.git` and the command line in :mod:`cluster.cli.commits`.
"""

import sys

from cluster.cli.commits import main

if __name__ == "__main__":
    sys.exit(main())
