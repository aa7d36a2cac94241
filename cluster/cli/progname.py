"""The name a command goes by in its usage line and its messages: the name it was typed as.

Each user-facing command exists twice: as a top-level script (``clusterpush.py``, kept for
cron lines and the design card) and as the entry point ``pip install`` puts on PATH
(``clusterpush``, pyproject's ``[project.scripts]``).  A person who typed ``clusterpush``
should read ``usage: clusterpush ...`` and ``clusterpush: <problem>``, not the name of a
script they never ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: Each top-level script and the PATH command that runs the same ``main`` (kept equal to
#: pyproject's ``[project.scripts]`` by a unit test).
COMMANDS: dict[str, str] = {
    "bootstrap_node.py": "bootstrap-node",
    "clusteradmin.py": "clusteradmin",
    "clustermonitor.py": "clustermonitor",
    "clusterpush.py": "clusterpush",
    "clusterscale.py": "clusterscale",
    "clusterstatus.py": "clusterstatus",
    "enqueue_auto.py": "enqueue-auto",
    "heartbeat.py": "cluster-heartbeat",
    "localcluster.py": "localcluster",
    "monitor_port.py": "monitor-port",
    "run_clustermaster.py": "run-clustermaster",
    "send_caps.py": "send-caps",
}


def prog(script: str, argv0: str | None = None) -> str:
    """``script``'s PATH command name when the process was started as that command
    (``argv0``, default ``sys.argv[0]``, names it), else ``script`` itself (the top-level
    script, ``python3 -m``, or a test calling ``main`` in-process)."""
    command = COMMANDS.get(script)
    invoked = Path(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")).name
    return command if command is not None and invoked == command else script
