"""clusteradmin.py -- watch and steer the cluster from the master home (seed 003's admin).

Usage: clusteradmin.py [--config FILE] [--home DIR] [--set KEY=VALUE]... COMMAND ...

  stat [--json]                   the queues, the running runs (done/total, rate,
                                  estimated end), node counts and, with a provisioner,
                                  its last look ("from Slurm: wanted W, pending P,
                                  running R", its jobs, its trouble)
  ls [--json]                     the nodes: name, state (up, down, disabled), last heard,
                                  run, jobs done in it, capabilities
  info RUN [--json]               one run, queued, running or archived: its description,
                                  its per-run options (run_options), tests per node,
                                  failed tests
  stop RUN [--reason R] [--wait S]
                                  a running run: the master ends it as aborted, its report
                                  saying who stopped it ($USER@host) and why; a waiting
                                  run: taken off its queue.  --wait: until its report is
                                  written (at most S seconds)
  stop --group G [--reason R]     stop every run placed on group G (its groups= names
                                  G): running ones as stop RUN does, waiting ones
                                  withdrawn
  stopall [--reason R]            stop every running run, withdraw every waiting one
  order RUN N                     give a run order=N (-100..100, lower starts first,
                                  default 0): a waiting run's queue line is rewritten so
                                  its master takes it in that order; for the running run
                                  it is recorded and shown.  Logged in log/admin.log
  node disable NAME [--reason R]  the master gives node NAME no work until enabled
  node enable NAME
  group ls [G] [--json]           the node groups (groups/<name> in the home) and their
                                  nodes, or only group G
  group create G | delete G       make an empty group, remove one
  group add G NODE... | remove G NODE...
                                  put nodes in a group, take them out (a run with
                                  groups=G is served only by its nodes)
  history TEST [--json]           every archived run in which TEST's md5 or error code
                                  changed, newest first, with its commit, user or schedule
  bless RUN [TEST...] --reason R  accept an intended change once: the md5s and error
                                  codes of TEST (default: every test RUN reported as
                                  changed) in archived run RUN become the rows of the
                                  tables RUN was compared with (the baseline; a user
                                  run's previous push too); audited in
                                  tables/blessings.tsv and shown by history
  repro RUN TEST [--node N [--queue] [--wait-timeout S] | --here] [--work DIR]
                                  run one job of archived run RUN again, as its node ran
                                  it: prints the job line, the node, the build key, the
                                  build and environment digests (now and the run's), then
                                  "md5 <new>  run <old>  same|DIFFERENT" and the output
                                  kept (a raster that differs from the baseline's is
                                  compared with it by bmpcmp when the clean tree renders
                                  the baseline's md5).  Default: on the node that made the
                                  result; --node N: on node N, in its work folder when
                                  that is on this machine, else (or with --queue) as a
                                  one-job repro run queued at priority 0 that only N may
                                  take, waited for up to S seconds (default 3600), its
                                  node's log block printed; --here: the run's source
                                  built in DIR (default ~/.cache/cluster-repro), run here
  culprit RUN [--json]            the culprit search of commit run RUN (or of the search
                                  bisection run RUN belongs to): the commits searched,
                                  each bisection run (commit, run id, state), each
                                  changed test's range or culprit
  flaky [--json]                  the tests found indeterminate (a second run gave
                                  another output), newest first: when, run, nodes, md5s
  history TEST --times [--json]   TEST's times (time1..3 and their sum) in every archived
                                  run that has it, newest first, with the node
  cron [--json]                   every scheduled entry of the cluster in this user's
                                  crontab (enqueue_auto's nightly and weekly ones, with the
                                  named runs each queues from auto/<schedule>/<name>/, and
                                  clusterpull's) with its schedule and next time (local
                                  time, as cron); a schedule with jobs but no entry is
                                  listed as not installed
  adduser NAME KEYFILE [--admin] [--sweeps] [--authorized-keys FILE]
                                  restrict the ssh key in KEYFILE (a .pub) to the user
                                  gate as user NAME (usergate.py; --admin: any user's
                                  runs, and clusteradmin; --sweeps: may queue sweeps,
                                  whose check scripts run on the master), in the master account's
                                  authorized_keys (docs/operating.md, "The user gate")
  dag FILE                        queue a graph of runs at once, all or none: one run per
                                  line as a queue line, with name= and after= and an
                                  optional priority=N (default: user 0, git 1, auto 2);
                                  a cycle, a name given twice or an after= naming no run
                                  is refused, naming it (docs/runoptions.md section 5)
  schedule add NAME CRON (--run LINE | --sweep PATH | --dag FILE)
                                  queue a run ('<products> [option ...]', as auto
                                  cron-NAME, priority 2), a sweep or a whole .dag graph
                                  at the cron expression CRON ('0 3 * * 0', '@daily'):
                                  writes auto/cron/NAME/ and installs its crontab entry;
                                  a bad name, field or line is refused, naming it, with
                                  nothing installed (docs/operating.md, "Schedules")
  schedule ls [--json]            the named schedules, their lines and next times
  schedule rm NAME                remove its crontab entry and auto/cron/NAME/

RUN is a run id (as stat, info and the reports show it), a waiting run's p<priority>:<n>
(its place in queue <priority>, from stat), or its queue line in quotes
("user alice gs").  TEST is a test id (tests__ex__golfer.eps.ppmraw.72.0) or as the
reports show it (tests/ex/golfer.eps.ppmraw.72.0).  The options before COMMAND may also
follow it.

repro's exit status: 0 the same md5 (and error code) as the run's, 1 a different one, 2
an unknown run, test or node, 3 the job could not be run (no job list kept, a failed
build, a repro run that failed, whose node never came, or that did not end in time).

Exit status: 0 done (for stop --wait: the run ended as stopped, or completed first);
1 an unknown run, node or test, a run or test that cannot be blessed, a run without a
culprit search, a crontab that
could not be read, or a stop --wait that timed out (the message names it);
2 bad usage or configuration, a bad order N (nothing changed), a refused .dag file
(nothing queued) or a refused schedule
(nothing written or installed); 1 also for schedule rm of no schedule, or a schedule whose
crontab entry could not be installed (its folder taken back); 3 stop --wait: the
run ended otherwise before the stop took effect (failed, timed out, lost its nodes), which
its last line says.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.cli import common, progname, reprocli, schedulecli
from cluster.config import Config
from cluster.console import admin, bless, cronlist, culprit, reorder
from cluster.datatypes import valid_node_name
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from cluster.errors import ClusterError, ConfigError
from cluster.home import Home
from cluster.master.files import groups
from cluster.master.gate import gate
from cluster.runoptions import RunOptionError
from cluster.triggers import dag

PROG = progname.prog("clusteradmin.py")


class UsageError(ClusterError):
    """A command line argparse accepts but the command does not (exit 2)."""


def _config_options(parser: argparse.ArgumentParser) -> None:
    """--config, --home, --set after the command too; SUPPRESS keeps the values given
    before it (a subcommand's defaults would overwrite them)."""
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS,
                        help="INI configuration file (see etc/)")
    parser.add_argument("--home", type=Path, default=argparse.SUPPRESS,
                        help="master home (overrides the config)")
    parser.add_argument("--set", action="append", default=argparse.SUPPRESS,
                        metavar="KEY=VALUE", help="override one configuration key")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, json_option: bool = False
                ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _config_options(p)
        if json_option:
            p.add_argument("--json", action="store_true", help="print JSON")
        return p

    command("stat", "queues, running runs, node counts", json_option=True)
    command("ls", "the nodes", json_option=True)
    command("info", "one run", json_option=True).add_argument("run", metavar="RUN")
    p = command("stop", "stop a running run or withdraw a waiting one")
    p.add_argument("run", metavar="RUN", nargs="?")
    p.add_argument("--group", metavar="G", help="stop every run placed on group G")
    p.add_argument("--reason", default="", help="why (the report says it)")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="wait until the stopped run's report is written")
    command("stopall", "stop every run, withdraw every waiting run").add_argument(
        "--reason", default="", help="why (the reports say it)")
    p = command("order", "change a run's order= (lower starts first)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("value", metavar="N", help="a whole number from -100 to 100")
    p = command("node", "disable or enable a node")
    p.add_argument("action", choices=("disable", "enable"))
    p.add_argument("name", metavar="NAME")
    p.add_argument("--reason", default="", help="why (kept in nodes/NAME.down)")
    p = command("group", "list and change the node groups")
    p.add_argument("action", choices=("ls", "create", "delete", "add", "remove"))
    p.add_argument("group", metavar="G", nargs="?")
    p.add_argument("nodes", metavar="NODE", nargs="*")
    p.add_argument("--json", action="store_true", help="print JSON (group ls)")
    p = command("history", "the runs in which a test changed", json_option=True)
    p.add_argument("test", metavar="TEST")
    p.add_argument("--times", action="store_true",
                   help="the test's times in every archived run instead")
    p = command("bless", "accept a run's outputs as the baseline's (audited)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("tests", metavar="TEST", nargs="*")
    p.add_argument("--reason", default="", help="why (recorded, shown by history)")
    p = command("repro", "run one job of an archived run again, on its node or here")
    p.add_argument("run", metavar="RUN")
    p.add_argument("test", metavar="TEST")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--node", metavar="N", help="run it on node N (default: the node "
                       "that made the run's result)")
    where.add_argument("--here", action="store_true",
                       help="build the run's source on this machine and run it here")
    p.add_argument("--work", type=Path, metavar="DIR",
                   help="the repro work folder: builds and outputs "
                        "(default ~/.cache/cluster-repro)")
    p.add_argument("--queue", action="store_true",
                   help="run it on the node as a repro run through the master even when "
                        "the node's work folder is on this machine")
    p.add_argument("--wait-timeout", type=float, metavar="S", default=reprocli.WAIT_TIMEOUT,
                   help="the longest a repro run may wait and run, in seconds "
                        f"(default {reprocli.WAIT_TIMEOUT:g})")
    command("cron", "the scheduled entries and their next times", json_option=True)
    command("flaky", "the tests found indeterminate, newest first", json_option=True)
    command("culprit", "a commit run's culprit search", json_option=True).add_argument(
        "run", metavar="RUN")
    command("dag", "queue a graph of runs (a .dag file), all or none").add_argument(
        "file", metavar="FILE", type=Path)
    p = command("adduser", "let a developer's ssh key in through the user gate")
    p.add_argument("name", metavar="NAME")
    p.add_argument("keyfile", metavar="KEYFILE", type=Path)
    p.add_argument("--admin", action="store_true",
                   help="an administrator: any user's runs, and clusteradmin")
    p.add_argument("--sweeps", action="store_true",
                   help="may queue sweeps (whose check scripts run on the master)")
    p.add_argument("--authorized-keys", type=Path, metavar="FILE",
                   help="the master account's authorized_keys (default ~/.ssh/"
                   "authorized_keys)")
    schedulecli.add_arguments(command("schedule", "named schedules at any cron expression: "
                                      "add, ls, rm"))
    return parser


def _dag(home: Home, path: Path) -> int:
    try:
        runs = dag.read_dag(path)
        dag.queue_dag(home, runs)
    except dag.DagError as exc:
        print(f"{PROG}: {exc}; nothing queued", file=sys.stderr)
        return EXIT_USAGE
    for run in runs:
        print(f"queued at priority {run.priority}: {run.spec.line()}")
    return EXIT_OK


def _print(data: Any, as_json: bool, text: Callable[[Any], list[str]]) -> None:
    if as_json:
        json.dump(data, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        for line in text(data):
            print(line)


def _group(home: Home, args: argparse.Namespace, as_json: bool) -> int:
    action, name, nodes = args.action, args.group, args.nodes
    if action == "ls":
        if nodes:
            raise UsageError("group ls takes at most one group name")
        _print(admin.group_ls(home, name), as_json, admin.format_group_ls)
        return EXIT_OK
    if name is None:
        raise UsageError(f"group {action} needs a group name G")
    if action in ("create", "delete"):
        if nodes:
            raise UsageError(f"group {action} takes one group name, not nodes")
        print(groups.create(home, name) if action == "create" else groups.delete(home, name))
        return EXIT_OK
    if not nodes:
        raise UsageError(f"group {action} needs at least one NODE")
    print(groups.add(home, name, nodes) if action == "add"
          else groups.remove(home, name, nodes))
    return EXIT_OK


def _stop(home: Home, args: argparse.Namespace) -> int:
    if (args.run is None) == (args.group is None):
        raise UsageError("stop needs RUN or --group G (one of them)")
    if args.group is not None:
        stopped = admin.stop_group(home, args.group, admin.who_am_i(), args.reason)
        for item in stopped:
            print(item.message())
        if not stopped:
            print(f"no run is placed on group {args.group}")
        return EXIT_OK
    done = admin.stop(home, args.run, admin.who_am_i(), args.reason)
    print(done.message())
    if args.wait is None or done.action != "stop requested":
        return EXIT_OK
    outcome = admin.wait_finished(home, done.run, args.wait)
    if outcome is None:
        print(f"{PROG}: run {done.run} has no report after {args.wait:g} s",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"run {done.run} ended: {outcome}; report: "
          f"{home.archive / done.run / 'report.txt'}")
    # Aborted is what was asked (and done: it finished first); any other end is a failure
    # of the run the caller waited for, and a script waiting on it must see so.
    return EXIT_OK if outcome in ("aborted", "done") else EXIT_RUN_FAILED


def _adduser(home: Home, args: argparse.Namespace) -> int:
    """Write the authorized_keys line that restricts a developer's key to the user gate."""
    if not valid_node_name(args.name):
        raise UsageError(f"user {args.name!r}: expected 1-64 of [A-Za-z0-9._-]")
    try:
        key = args.keyfile.read_text(encoding="utf-8").strip()
        line = gate.authorized_line(gate.user_gate_command(
            home.root.resolve(), args.name, admin=args.admin, sweeps=args.sweeps,
            config=getattr(args, "config", None)), key)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{args.keyfile}: {exc}") from None
    keys = args.authorized_keys or Path.home() / ".ssh" / "authorized_keys"
    done = gate.authorize(keys, line)
    print(f"{done}: {args.name}'s key in {keys} -> the user gate"
          + (" (administrator)" if args.admin else ""))
    return EXIT_OK


def _bless(home: Home, args: argparse.Namespace) -> int:
    if not args.reason.strip():
        raise UsageError("bless needs --reason R: every blessing is audited")
    done = bless.bless(home, args.run, args.tests, args.reason, admin.who_am_i())
    tables = ", ".join(done[0].tables)
    print(f"blessed {len(done)} test(s) of run {args.run} into {tables}:")
    for b in done:
        print(f"  {b.test}  error {b.error} md5 {b.md5}")
    return EXIT_OK


def run_command(cfg: Config, args: argparse.Namespace) -> int:
    home = Home(cfg.home)
    if not home.root.is_dir():
        raise ConfigError("home", str(home.root), "the folder of an existing master home "
                          "(--home or the config's home)")
    as_json = getattr(args, "json", False)
    match args.command:
        case "stat":
            _print(admin.stat(home, cfg), as_json, admin.format_stat)
        case "ls":
            _print(admin.nodes(home, cfg), as_json, admin.format_nodes)
        case "info":
            _print(admin.info(home, args.run), as_json, admin.format_info)
        case "history":
            if args.times:
                _print(admin.history_times(home, args.test), as_json,
                       admin.format_history_times)
            else:
                _print(admin.history(home, args.test), as_json, admin.format_history)
        case "bless":
            return _bless(home, args)
        case "repro":
            if args.queue and args.here:
                raise UsageError("--queue sends the job to a node; --here runs it "
                                        "here: expected one of them")
            if not 0 < args.wait_timeout <= reprocli.MAX_WAIT:
                raise UsageError(f"--wait-timeout {args.wait_timeout:g}: expected "
                                        f"more than 0 and at most {reprocli.MAX_WAIT:g} s")
            return reprocli.main(home, cfg, args.run, args.test, args.node, args.here,
                                 args.work, args.queue, args.wait_timeout)
        case "cron":
            _print(cronlist.listing(home), as_json, cronlist.format_listing)
        case "flaky":
            _print(admin.flaky(home), as_json, admin.format_flaky)
        case "culprit":
            _print(culprit.search(home, args.run), as_json, culprit.format_search)
        case "stop":
            return _stop(home, args)
        case "stopall":
            done = admin.stop_all(home, admin.who_am_i(), args.reason)
            for item in done:
                print(item.message())
            if not done:
                print("nothing runs or waits")
        case "order":
            try:
                reordered = reorder.set_order(home, args.run, args.value,
                                              admin.who_am_i())
            except RunOptionError as exc:
                raise UsageError(f"{exc}; nothing changed") from exc
            print(reordered.message())
        case "group":
            return _group(home, args, as_json)
        case "dag":
            return _dag(home, args.file)
        case "adduser":
            return _adduser(home, args)
        case "schedule":
            return schedulecli.main(home, cfg, args, PROG)
        case "node":
            if args.action == "disable":
                print(admin.disable_node(home, args.name, admin.who_am_i(), args.reason))
            else:
                print(admin.enable_node(home, args.name))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 done, 1 unknown run/node/test, 2 bad
    usage or configuration)."""
    parsed = common.parse_with_config(_parser(), argv, PROG)
    if isinstance(parsed, int):
        return parsed
    args, cfg = parsed
    try:
        return run_command(cfg, args)
    except (ConfigError, UsageError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # | head
        return EXIT_OK
