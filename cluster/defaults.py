"""The numbers and names every room shares: priorities, ports, exit codes, the repo root.

A leaf module: it imports nothing from the project, so anything may import it.  The
configuration keys' defaults live in the table in :mod:`cluster.config` (each once, with its
unit); this module holds only what is not configurable.
"""

from __future__ import annotations

from pathlib import Path

#: The project checkout (the folder holding ``cluster/``, ``etc/`` and the scripts).
REPO_ROOT = Path(__file__).resolve().parents[1]
