"""The numbers and names every room shares: priorities, ports, exit codes, the repo root.

A leaf module: it imports nothing from the project, so anything may import it.  The
configuration keys' defaults live in the table in :mod:`cluster.config` (each once, with its
unit); this module holds only what is not configurable.
"""

from __future__ import annotations

from pathlib import Path

#: The project checkout (the folder holding ``cluster/``, ``etc/`` and the scripts).
REPO_ROOT = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------------
# Priorities (seed 000): which queue a run is in, and which clustermaster serves it.

#: A developer's pushed tree (clusterpush).
USER_PRIORITY = 0
#: A git commit (the hook or the poller).
COMMIT_PRIORITY = 1
#: Nightly and weekly runs from cron (enqueue_auto).
AUTO_PRIORITY = 2
#: Every priority, highest first.
PRIORITIES = (USER_PRIORITY, COMMIT_PRIORITY, AUTO_PRIORITY)

# ----------------------------------------------------------------------------------------------
# Exit codes shared by the scripts (each script's docstring says which it uses).

#: Done; nothing went wrong.
EXIT_OK = 0
#: The work failed (a run, a build, git, the home); the message is on stderr.
EXIT_FAILED = 1
#: Bad usage or configuration; nothing was done.
EXIT_USAGE = 2
#: A command that waited for a run (localcluster.py, clusteradmin stop --wait): the run
#: ended without a complete result (failed, aborted, timed out, gave up); it says how.
EXIT_RUN_FAILED = 3

# run.py (a node's part in one run): 0 done, 1 failed, 3 master unreachable, 4 aborted,
# 5 moved to a more urgent run (preempted: it may come back to this one at once).
NODE_EXIT_DONE = EXIT_OK
NODE_EXIT_FAILED = EXIT_FAILED
NODE_EXIT_UNREACHABLE = 3
NODE_EXIT_ABORTED = 4
NODE_EXIT_MOVED = 5

# heartbeat.py: 0 nothing waits, 1 a run waits (so clusterpull starts run.py), 2 error.
HEARTBEAT_EXIT_NONE = 0
HEARTBEAT_EXIT_JOB_WAITS = 1
HEARTBEAT_EXIT_ERROR = 2

# ----------------------------------------------------------------------------------------------
# Failure codes a node reports for a whole run (run.pl's "failure" header).

#: The build failed or timed out (``build_timeout``) and not for the node's own reasons
#: (nodebuild.build_failure); the report quotes the build log's error lines.
FAILURE_BUILD = -1
#: The node cannot take part: it could not reach the master, upload its logs or fetch the
#: corpus or source, or its build failed on the node around the build command.
FAILURE_NETWORK = 1
#: Too many jobs timed out.
FAILURE_TIMEOUTS = 2

# ----------------------------------------------------------------------------------------------
# bmpcmp runs (ARTIFEX.md §5.7): jobs write difference images, the node uploads them, the
# master puts them on a page in the archive.

#: The folder of a run's bmpcmp image sets: under the node's ``__temp__`` (where the jobs
#: write them), under ``runs/<run id>/`` (where the node uploads them) and in the archive.
BMPCMP_DIR = "bmpcmp"
#: monitor_port.py: another program holds the port (the message names address and port).
EXIT_PORT_TAKEN = 5
