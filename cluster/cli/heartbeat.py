"""heartbeat.py -- port of heartbeat.pl: tell the master's monitor this node lives.

Usage: heartbeat.py [--config FILE] [--home DIR] [--set key=value]... [--status TEXT]
                    [--caps LINE] [--wait SECONDS] [--skip RUN_ID]...

Sends one heartbeat (node ``node_name``, or the host name) to the monitor at
``master_host``:``monitor_port`` and prints the runs waiting to be joined, one per line::

    <priority> <job id>

Exit status, as seed 000 has clusterpull read it ("if heartbeat.pl returns with a non-zero
exit code, it knows that there is a job to start"):

    0  nothing waits
    1  at least one run waits (printed)
    2  error: bad configuration, monitor unreachable, or a reply not understood

The heartbeat is signed with a key derived from the node's own key, ``node-keys/<name>.key``
in the master home, read through the node's transport (``transport`` in node.conf), and
the answer is believed only if its signature verifies (docs/protocol.md).

``--caps`` sends a capability line along (e.g. ``--caps "$(send_caps.py)"``); the monitor
stores it as nodes/<name>.caps.

``--wait SECONDS`` asks the monitor to hold its answer (long-poll) until a run waits that is
not named by a ``--skip RUN_ID``, or until the wait ends (the monitor grants at most 30 s);
a shell loop like clusterpull.sh then learns of a new run at once.  The exit status is the
same: it says whether any run waits, skipped ones included.
"""

from __future__ import annotations

import argparse
import sys

from cluster.cli import common, progname
from cluster.defaults import HEARTBEAT_EXIT_ERROR as EXIT_ERROR
from cluster.defaults import HEARTBEAT_EXIT_JOB_WAITS as EXIT_JOB_WAITS
from cluster.defaults import HEARTBEAT_EXIT_NONE as EXIT_NONE
from cluster.errors import ClusterError
from cluster.node.heartbeat import HeartbeatError, node_secret, send_heartbeat

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("heartbeat.py")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Send one heartbeat to the "
                                "master's monitor (port of heartbeat.pl).")
    common.add_config_options(p)
    p.add_argument("--status", metavar="TEXT", default="",
                   help="free-text status for the dashboards")
    p.add_argument("--caps", metavar="LINE", default="", help="capability line to send")
    p.add_argument("--wait", metavar="SECONDS", type=float, default=0.0,
                   help="let the monitor hold the answer up to this long until a run waits")
    p.add_argument("--skip", metavar="RUN_ID", action="append", default=[],
                   help="a waiting run that must not end the --wait (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return EXIT_NONE if not exc.code else EXIT_ERROR
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not 0 <= args.wait < float("inf"):
        print(f"{PROG}: --wait {args.wait}: expected a number of seconds >= 0",
              file=sys.stderr)
        return EXIT_ERROR
    try:
        jobs = send_heartbeat(cfg.master_host, cfg.monitor_port, cfg.effective_node_name(),
                              status=args.status, caps=args.caps, timeout=cfg.io_timeout,
                              wait=args.wait, skip=args.skip, secret=node_secret(cfg))
    except HeartbeatError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for priority, job_id in jobs:
        print(f"{priority} {job_id}")
    return EXIT_JOB_WAITS if jobs else EXIT_NONE
