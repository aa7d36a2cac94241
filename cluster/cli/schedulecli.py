"""``clusteradmin schedule add|ls|rm`` (docs/operating.md, "Schedules"): named schedules of
a run, a sweep or a whole graph of runs at any cron expression, each a real crontab entry
(:mod:`cluster.triggers.schedules`, :mod:`cluster.cron`).

``add NAME CRON (--run LINE | --sweep PATH | --dag FILE)`` checks the name, the cron
expression (a bad field is named with what it takes) and what is scheduled before it
writes ``auto/cron/NAME/`` and installs the entry; any problem is one line on stderr,
exit 2, and nothing written, installed or queued.  A crontab that cannot be written
leaves no folder behind either (exit 1).  ``ls`` lists the schedules with their next times
(as ``clusteradmin cron`` does); ``rm NAME`` takes the entry and the folder away.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from cluster import cron
from cluster.config import Config
from cluster.console import cronlist
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.triggers import schedules


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``clusteradmin schedule``."""
    parser.add_argument("action", choices=("add", "ls", "rm"))
    parser.add_argument("name", metavar="NAME", nargs="?")
    parser.add_argument("cron", metavar="CRON", nargs="?",
                        help="a cron expression in quotes ('0 3 * * 0') or an @nickname")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--run", metavar="LINE",
                      help="'<products> [option ...]': queued as auto cron-NAME, priority 2")
    what.add_argument("--sweep", metavar="PATH", type=Path,
                      help="a sweep folder or its sweep file (docs/sweeps.md)")
    what.add_argument("--dag", metavar="FILE", type=Path,
                      help="a .dag file: its whole graph queued, all or none")
    parser.add_argument("--json", action="store_true", help="print JSON (ls)")


def _line(args: argparse.Namespace) -> str:
    if args.run is not None:
        return schedules.run_line(args.name, args.run)
    if args.sweep is not None:
        return schedules.path_line("sweep", args.sweep)
    if args.dag is not None:
        return schedules.path_line("dag", args.dag)
    raise schedules.ScheduleError(f"schedule {args.name}: nothing to schedule; expected "
                                  "--run LINE, --sweep PATH or --dag FILE")


def _add(home: Home, cfg: Config, args: argparse.Namespace, prog: str) -> int:
    if args.name is None or args.cron is None:
        print(f"{prog}: schedule add needs NAME and CRON (in quotes: '0 3 * * 0')",
              file=sys.stderr)
        return EXIT_USAGE
    options = cron.config_argv(args.config, args.home, args.set, cfg, pin=("home",))
    try:
        schedules.check_name(args.name)
        schedules.check_cron(args.name, args.cron)
        added = schedules.add(home, args.name, args.cron, _line(args))
    except schedules.ScheduleError as exc:
        print(f"{prog}: {exc}; nothing installed", file=sys.stderr)
        return EXIT_USAGE
    try:
        [line] = cron.install([schedules.entry(home, added, options)])
    except ClusterError as exc:
        schedules.remove(home, added.name)  # all or none: no folder without its entry
        print(f"{prog}: {exc}; schedule {added.name} not added", file=sys.stderr)
        return EXIT_FAILED
    print(f"installed: {line}")
    when = cron.next_time(added.cron, dt.datetime.now())
    print(f"schedule {added.name} ({added.what}: {added.line}) next: "
          + ("never" if when is None else when.strftime("%Y-%m-%d %H:%M")))
    return EXIT_OK


def _rm(home: Home, args: argparse.Namespace, prog: str) -> int:
    if args.name is None or args.cron is not None:
        print(f"{prog}: schedule rm takes one NAME", file=sys.stderr)
        return EXIT_USAGE
    try:
        folder = schedules.folder_of(home, schedules.check_name(args.name))
        count = cron.remove([schedules.tag(home, args.name)])
        if not folder.is_dir():  # an entry left without its folder goes all the same
            if not count:
                raise schedules.ScheduleError(f"no schedule {args.name} in {home.root} "
                                              "(clusteradmin schedule ls lists them)")
        else:
            schedules.remove(home, args.name)
    except ClusterError as exc:  # a ScheduleError, or the crontab's CronError
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"removed schedule {args.name}: {folder} and {count} crontab "
          f"entr{'y' if count == 1 else 'ies'}")
    return EXIT_OK


def main(home: Home, cfg: Config, args: argparse.Namespace, prog: str) -> int:
    """``clusteradmin schedule ...``; the exit status (see the module docstring)."""
    if args.action == "add":
        return _add(home, cfg, args, prog)
    if args.action == "rm":
        return _rm(home, args, prog)
    if args.name is not None or args.cron is not None:
        print(f"{prog}: schedule ls takes no NAME or CRON", file=sys.stderr)
        return EXIT_USAGE
    data = cronlist.listing(home)
    data["entries"] = [e for e in data["entries"] if "name" in e]
    if args.json:
        json.dump(data, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    elif not data["entries"]:
        print(f"no schedule in {home.root} (clusteradmin schedule add NAME CRON --run ...)")
    else:
        for text in cronlist.format_listing(data):
            print(text)
    return EXIT_OK
