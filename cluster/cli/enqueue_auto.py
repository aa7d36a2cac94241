"""enqueue_auto.py -- queue the nightly or weekly auto runs (port of enqueueAuto.pl).

Usage: enqueue_auto.py [--config FILE] [--home DIR] [--set KEY=VALUE]... [-q]
                       nightly|weekly|cron [NAME...]
       enqueue_auto.py [--config FILE] [--home DIR] [--set KEY=VALUE]... --install-cron
       enqueue_auto.py [--config FILE] [--home DIR] [--set KEY=VALUE]... --remove-cron

Reads <home>/auto/<schedule>/<name>/jobdef.txt (first line: `<products> [option ...]`, or
`sweep <folder> [option ...]` for a sweep, the folder absolute or relative to the jobdef's
folder: docs/sweeps.md section 8) and appends one `auto <schedule>-<name> ...` run per job
to the priority-2 queue, where clustermaster2.py picks it up.  A sweep is checked first as
clusterpush.py --sweep checks it; a bad one is not queued.  Typically run from cron.

`cron NAME...` queues the named schedules NAME (<home>/auto/cron/NAME/jobdef.txt, each with
its own cron expression in schedule.toml beside it: docs/operating.md, "Schedules"); a
jobdef line `dag <file>` queues that whole graph of runs, each at its own priority, all or
none.

--install-cron puts two entries in the current user's crontab, nightly_schedule and
weekly_schedule, and one per named schedule at its own cron expression, each running this
script with the same --config/--home/--set options and --quiet (which leaves out the
"queued:" lines, so cron mails only problems); running it again replaces them (never
duplicates).  A named schedule that is bad (its cron expression, its jobdef) is named and
nothing is installed.  --remove-cron takes them all out.  Neither queues anything.  The
entries are tagged with the master home, so each home has its own.
With no job definition for the schedule it says where it looked (the directory, the master
home and where that came from: --home, a --set, the `home` key of --config, or the default)
and exits 1: the run the caller asked for cannot happen (a wrong --home or configuration,
most likely), just as when a named job is missing; cron mails the message either way.
Exit status: 0 done, 1 no job definition, a named job was not found, a jobdef was bad or
the crontab could not be changed, 2 bad usage or configuration, or a bad named schedule
(--install-cron: nothing installed).
"""

from __future__ import annotations

import argparse
import logging
import sys

from cluster import cron, datatypes
from cluster.cli import common, progname
from cluster.config import Config
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.triggers import auto, schedules

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("enqueue_auto.py")


def cron_tags(cfg: Config) -> list[str]:
    """The crontab tags of this master's entries, one per schedule (see cluster.cron)."""
    return [auto.cron_tag(Home(cfg.home), schedule) for schedule in auto.SCHEDULES]


def cron_entries(args: argparse.Namespace, cfg: Config) -> list[cron.CronEntry]:
    """The nightly and weekly crontab entries; ConfigError if a schedule is not cron syntax."""
    options = cron.config_argv(args.config, args.home, args.set, cfg, pin=("home",))
    when = {"nightly": datatypes.check_schedule("nightly_schedule", cfg.nightly_schedule),
            "weekly": datatypes.check_schedule("weekly_schedule", cfg.weekly_schedule)}
    return [cron.CronEntry(tag, when[schedule],
                           cron.script_command("enqueue_auto.py",
                                               [*options, "--quiet", schedule]))
            for schedule, tag in zip(auto.SCHEDULES, cron_tags(cfg), strict=True)]


def _manage_cron(args: argparse.Namespace, cfg: Config) -> int:
    """--install-cron / --remove-cron; the exit status (0 done, 1 crontab failed, 2 config
    or a bad named schedule: then nothing is installed)."""
    home = Home(cfg.home)
    tags = cron_tags(cfg)
    try:
        named = [schedules.read(home, name) for name in schedules.names(home)]
        if args.remove_cron:
            tags += [schedules.tag(home, s.name) for s in named]
            tags += schedules.stale_tags(home, cron.listed())
    except schedules.ScheduleError as exc:
        print(f"{PROG}: {exc}; nothing installed", file=sys.stderr)
        return EXIT_USAGE
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    options = cron.config_argv(args.config, args.home, args.set, cfg, pin=("home",))
    return common.manage_cron(
        "enqueue_auto.py", args.remove_cron, tags,
        lambda: cron_entries(args, cfg) + [schedules.entry(home, s, options) for s in named])


def home_source(args: argparse.Namespace) -> str:
    """Where the master home of this invocation came from, for messages."""
    if args.home is not None:
        return "the --home option"
    if any(pair.partition("=")[0].strip() == "home" for pair in args.set):
        return "a --set home=... option"
    if args.config is not None:
        return f"the 'home' key of {args.config} (or its default if the file has none)"
    return "the default of the 'home' key (no --config, --home or --set home= given)"


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (see the module docstring)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    manage = parser.add_mutually_exclusive_group()
    manage.add_argument("--install-cron", action="store_true",
                        help="install (or update) the nightly and weekly crontab entries")
    manage.add_argument("--remove-cron", action="store_true",
                        help="remove this master home's crontab entries")
    common.add_quiet_option(parser)
    parser.add_argument("schedule", nargs="?", choices=auto.JOBDEF_FOLDERS)
    parser.add_argument("names", nargs="*", metavar="NAME")
    args = parser.parse_args(argv)
    cron_mode = args.install_cron or args.remove_cron
    if cron_mode and args.schedule is not None:
        parser.error("--install-cron/--remove-cron take no schedule or NAME")
    if not cron_mode and args.schedule is None:
        parser.error("a schedule is required: nightly, weekly or cron (with the names of "
                     "named schedules)")
    try:
        cfg = common.load_config(args)
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    common.setup_logging(quiet=args.quiet)
    if cron_mode:
        return _manage_cron(args, cfg)
    errors = common.ErrorCounter()
    logging.getLogger("cluster.auto").addHandler(errors)
    home = Home(cfg.home)
    for spec in auto.enqueue(home, args.schedule, args.names):
        if not args.quiet:
            print(f"queued: {spec.line()}")
    if not auto.definitions(home, args.schedule):
        # auto.enqueue logged where it looked; say where that home came from.
        print(f"{PROG}: the master home {home.root} comes from {home_source(args)}",
              file=sys.stderr)
    return EXIT_FAILED if errors.count else EXIT_OK
