"""monitor_port.py -- port of monitorPort.pl: the master's heartbeat listener.

Usage: monitor_port.py [--config FILE] [--home DIR] [--set key=value]... [-q] [--nodes]

Listens on ``listen_address``:``monitor_port`` for heartbeats (see cluster.wire.heartbeat for
the wire format), records them in ``home``/nodes/ and answers with the runs waiting in
``home``.  Like the Perl, it first makes sure it is the only one: if another monitor holds
``home``/monitor_port.lock it logs "already running" and exits 0, so cron can start it
every few minutes.  It logs to ``home``/log/monitor_port.log and to stderr; --quiet (for
the crontab line) prints only warnings and errors.  SIGTERM or SIGINT stops it cleanly.

``--nodes`` prints instead what the monitor has learnt, one node per line:
``<name> <seconds since last heartbeat> <status>``.

Deviations from monitorPort.pl: port 9010 instead of 9001 (priority 1's master port), and
the request/answer format of cluster.wire.heartbeat instead of "machine name, file suffix, file
contents" / "1 or 0".

Exit status, at once and without retrying:

    0  stopped, or another monitor of this home already runs
    2  bad configuration, or an address that cannot be used (the system's error is logged)
    5  another program holds the port (cluster.defaults.EXIT_PORT_TAKEN); the message
       reads "cannot listen for heartbeats on <address>:<port>: the port is taken ..."
       (localcluster stops on it instead of waiting for nodes that cannot report)
"""

from __future__ import annotations

import argparse

from cluster.cli import common, progname
from cluster.defaults import EXIT_OK
from cluster.home import Home
from cluster.master.daemon import monitor
from cluster.master.files import nodefiles
from cluster.runtime.service import StopFlag, install_signal_handlers

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("monitor_port.py")

#: The monitor's log, in the master home's log folder.
LOG_NAME = "monitor_port.log"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The master's heartbeat "
                                "listener (port of monitorPort.pl).")
    common.add_config_options(p)
    common.add_quiet_option(p)
    p.add_argument("--nodes", action="store_true",
                   help="print the nodes seen and their status, then exit")
    return p


def main(argv: list[str] | None = None) -> int:
    parsed = common.parse_with_config(_parser(), argv, "monitor_port.py")
    if isinstance(parsed, int):
        return parsed
    args, cfg = parsed
    home = Home(cfg.home)
    if args.nodes:
        for name, (age, status) in sorted(nodefiles.nodes_seen(home).items()):
            print(f"{name} {age:.0f} {status}".rstrip())
        return EXIT_OK
    common.setup_logging(home.log_dir / LOG_NAME, quiet=args.quiet)
    # The handlers only record the request; the daemon loop sees it within its poll interval.
    stop = StopFlag()
    install_signal_handlers(stop)
    return monitor.run(home, (cfg.listen_address, cfg.monitor_port), stop.is_set,
                       wakeup_fd=stop.wakeup_fd)
