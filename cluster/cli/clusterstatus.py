"""clusterstatus.py -- the master's status page and its JSON API.

Usage: clusterstatus.py [--config FILE] [--home DIR] [--set key=value]... [-q]

Serves the status page on ``status_address``:``status_port`` (loopback port 9020 by
default; ``status_port = 0``: not served, it exits at once): ``/`` the page, which refreshes
itself every 2 s; ``/api/status``, ``/api/nodes`` and ``/api/runs/<id>`` the JSON it is
drawn from; ``/archive/<id>/...`` a finished run's report, .tab and bmpcmp page (see
cluster/console/httpd.py).  Like monitor_port.py it first makes sure it is the only one: if
another clusterstatus holds ``home``/clusterstatus.lock it logs "already running" and exits
0, so cron can start it every minute.  It logs to ``home``/log/clusterstatus.log and to
stderr; --quiet (for the crontab line) prints only warnings and errors.  SIGTERM or SIGINT
stops it cleanly.

To let others see the page, keep it on loopback behind a reverse proxy (nginx, Apache)
that adds authentication, or set ``status_address = 0.0.0.0`` on a trusted network: the
page shows user names, commits, queue lines and node capabilities, and has no
login of its own.  It only reads the home; it can change nothing.

Exit status, at once and without retrying:

    0  stopped, status_port is 0, or another clusterstatus of this home already runs
    2  bad configuration, or an address that cannot be used (the system's error is logged)
    5  another program holds the port; the message reads "cannot serve the status page on
       <address>:<port>: the port is taken ..." (localcluster stops on it)
"""

from __future__ import annotations

import argparse

from cluster.cli import common, progname
from cluster.console import httpd
from cluster.home import Home
from cluster.runtime.service import StopFlag, install_signal_handlers

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("clusterstatus.py")

#: The status service's log, in the master home's log folder.
LOG_NAME = "clusterstatus.log"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The master's status "
                                "page and JSON API (port of clustermonitor.cgi and "
                                "dashboard.html).")
    common.add_config_options(p)
    common.add_quiet_option(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parsed = common.parse_with_config(_parser(), argv, "clusterstatus.py")
    if isinstance(parsed, int):
        return parsed
    args, cfg = parsed
    home = Home(cfg.home)
    common.setup_logging(home.log_dir / LOG_NAME, quiet=args.quiet)
    # The handlers only record the request; the daemon loop sees it at once (the wakeup fd).
    stop = StopFlag()
    install_signal_handlers(stop)
    return httpd.run(home, cfg, stop.is_set, wakeup_fd=stop.wakeup_fd)
