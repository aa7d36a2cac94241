"""clusterpush.py -- submit your tree to the cluster as a user run (port of clusterpush.pl).

Usage: clusterpush.py [--config FILE] [--home DIR] [--set KEY=VALUE]... [--tree DIR]
                      [--user NAME] [--copy] [--opt KEY[=VALUE]]... [PRODUCT...]
                      [lowres|highres] [relaxtimeout] [filter=A,B] [bmpcmp] [abort]
       clusterpush.py [--config FILE] [--home DIR] [--user NAME] [--copy]
                      [--opt KEY[=VALUE]]... --sweep path/to/sweep.toml [--resume]
                      [relaxtimeout]
       clusterpush.py --master [USER@]HOST[:HOME] [--ssh-port P] [--ssh-key K]
                      [--known-hosts F] [--master-python PY] [--master-cache DIR]
                      [--tree DIR] [--user NAME] [PRODUCT...] ... [abort]
       clusterpush.py [--master ...] [--user NAME] --fetch RUN [--dest DIR]
                      | --stop RUN [--reason R] | --rerun RUN

PRODUCT is gs, pdfwrite, ps2write, xpswrite, pcl, xps, mupdf or shell (the last two
alone); the default is gs.  The user is --user, else $CLUSTER_USER, else $USER.  The tree
(default: the current directory) is mirrored to users/<user>/<ghostpdl|mupdf|shell> in the
master home and the run is queued at priority 0.  The mirror leaves out version control,
build and object directories (bin/, obj/, build/, ...), object files, rendered images and
files over 30 MB (named on stderr), and deletes them from an earlier push.  It uses rsync
when rsync is on PATH (a tree of at most 100 files and folders goes by the built-in copy,
which is done before rsync has started); --copy uses the built-in copy always (same
result).  Pushing again while your run of the same products waits replaces it (same place
in the queue; it says so); while it runs, the new push is queued after it, and the running
run keeps the tree it started with.  A symlink at users/<user> or users/<user>/<tree> in
the master home is refused, never followed.  The report (mailed to you when the master
mails) compares with the baseline and with your previous push, and ends with the source
diff against the master's clean tree.  `bmpcmp` instead renders the tests that differed in
your last run with your build and the clean tree's, and makes a page of PNG difference
images.  `abort` removes your queued runs and stops the one running.

--opt KEY=VALUE gives the run one of its own per-run options (docs/runoptions.md), e.g.
--opt job_timeout=2h --opt groups=win64 --opt max_worker_instances=1, and a flag as --opt
exclusive (also no_reschedule, every_node); repeat it for more.  Each is checked before
anything is sent or queued: an unknown key, a bad value or an option given twice is one
line naming it and what was expected, exit status 2.  The option becomes a word of the
run's queue line (the same words may also be given as words: job_timeout=2h).

--sweep submits a sweep instead (docs/sweeps.md): the sweep file and every
task of its table are checked first (a problem is one line naming the file and the key,
exit status 2, nothing pushed or queued), then the folder holding the sweep file is the
tree, pushed to users/<user>/sweep, and the run is queued at priority 0 as
`user <user> sweep sweep=<file>`, followed by the per-run options of the sweep file's
[run] table (an --opt of the same key replaces the table's).  It works with --master
too.  --resume queues a run that runs only the tasks without a valid result in your
previous run of the same sweep (your newest archived run with the same sweep file name
that has a results.tsv; none: an error naming you and the sweep file, exit status 2,
nothing pushed or queued): the run's queue line gets `resume=<run id>`.

--master pushes from a machine that does not see the master home: the tree goes to
HOME/users/<user>/<tree> on HOST with rsync over ssh (after a small change, only the change
moves), and the dropping is written there by a second command, only once rsync ended well:
a clusterpush killed, interrupted (^C) or terminated meanwhile queues nothing, and its
rsync dies with it.  `abort` works the same way, and also stops your pushes still
transferring.  HOME defaults to cluster-home; a relative HOME is relative to the ssh
account's home on HOST.  The host key must be in --known-hosts (default
~/.ssh/known_hosts, or the config's ssh_known_hosts): an unknown or changed key is
refused with its fingerprint.  --ssh-port, --ssh-key default to
the config's ssh_port and ssh_key.  The master needs python3 (--master-python) and rsync;
clusterpush ships its own code there (see cluster.triggers.remotepush), so the master side
of the push is the same code as a local push.  Exit status: 0 queued or aborted, 1 the
master could not be reached, 2 refused (a bad argument, a refused key or host key, a failed
transfer or an aborted push: nothing was queued), 130 interrupted, 143 terminated.

--wait follows the run until it ends -- a one-line progress on a terminal,
nothing when stdout is not one -- prints its report and its archive folder, and exits 0
when nothing changed, 1 when tests changed (confirmed differences or new errors) or, for
a sweep, tasks did not end ok (invalid, failed or timed out: its results.tsv), 3 when
the run did not complete (a last line on stderr says how) or did not end within
--wait-timeout SECONDS (default a day; the run goes on).  --junit FILE and --json FILE
write the run's JUnit XML and JSON result to FILE (docs/operating.md, "Waiting for a
run from CI").  With --master the master follows the run and the report and files come
over the same ssh.

--fetch RUN [--dest DIR] brings your finished run RUN's report.txt, RUN.tab, CI files, a
sweep's results/ and collected/ and the bmpcmp images into DIR/RUN/ (default: the current
directory); --stop RUN [--reason R] stops your running run RUN; --rerun RUN queues your
finished run RUN again with your tree as last pushed.  Each goes alone, with --master or
on a master home this machine sees.  With --master, a key restricted to the master's user
gate (usergate.py, clusteradmin adduser) is detected and no code is shipped; the gate
lets you act only on your own runs (docs/operating.md, "The user gate").
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from cluster import runoptions
from cluster.cli import common, progname, pushfollow, pushwait
from cluster.config import Config
from cluster.console.progress import ProgressLine
from cluster.datatypes import PRODUCTS
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from cluster.errors import ClusterError, SshError
from cluster.home import Home
from cluster.localrunend import run_end
from cluster.master.files.abort import request_abort
from cluster.report import cifiles
from cluster.runoptions import RunOptionError
from cluster.runspec import SWEEP_ONLY_OPTIONS, RunSpec
from cluster.runtime.ssh import SshTarget
from cluster.triggers.push import submit_push
from cluster.triggers.pushreceive import abort_pushes
from cluster.triggers.remotepush import (
    REMOTE_CACHE,
    CommitInterrupted,
    parse_master,
    remote_abort,
    remote_previous_sweep,
    remote_push,
)
from cluster.triggers.sweeppush import prepare_sweep, previous_sweep_run

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("clusterpush.py")

#: How long --wait waits for the run by default [seconds]: generous, a full run's day.
DEFAULT_WAIT_TIMEOUT = 24 * 3600.0

#: The exit status after ^C (SIGINT), and after SIGTERM: 128 + the signal, as a shell says.
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as ^C is, so that what runs (rsync and its ssh)
    is stopped on the way out (:func:`cluster.triggers.remotepush.run_bound`)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 queued or aborted, 1 the master could not
    be reached, 2 refused, 130 interrupted by ^C, 143 terminated by SIGTERM).

    Interrupted or terminated, it stops what it runs and says so in one line on stderr, no
    traceback; a push interrupted before its dropping was written queues nothing (a remote
    one: before the master's commit step; when interrupted during that step the line says
    the push may be queued).  SIGKILL cannot be caught: a remote push's rsync dies with
    this process all the same, and nothing is queued (see cluster.triggers.remotepush)."""
    words = sys.argv[1:] if argv is None else argv
    what = "" if "abort" in words else "; nothing was queued"
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return _main(argv)
    except CommitInterrupted as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"{PROG}: terminated (SIGTERM){what}", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (^C){what}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--tree", type=Path, default=None,
                        help="the tree to push (default: the current directory)")
    parser.add_argument("--user", default=os.environ.get("CLUSTER_USER")
                        or os.environ.get("USER") or "")
    parser.add_argument("--copy", action="store_true",
                        help="mirror the tree with the built-in copy, not rsync")
    parser.add_argument("--master", metavar="[USER@]HOST[:HOME]",
                        help="push over ssh to the master home HOME on HOST")
    parser.add_argument("--ssh-port", type=int, help="the master's sshd port (default: the "
                        "config's ssh_port, 22)")
    parser.add_argument("--ssh-key", help="private key to log in with (default: the config's "
                        "ssh_key, else ssh's usual keys)")
    parser.add_argument("--known-hosts", type=Path, help="known_hosts file the master's host "
                        "key must be in (default: the config's ssh_known_hosts)")
    parser.add_argument("--master-python", default="python3",
                        help="the Python 3 on the master (default: python3 on its PATH)")
    parser.add_argument("--master-cache", default=REMOTE_CACHE,
                        help="where on the master clusterpush keeps the code it ships there "
                        f"(default: {REMOTE_CACHE} in the ssh account's home)")
    common.add_sweep_arguments(
        parser, sweep_help="submit the sweep of this sweep file (its folder is the tree)",
        previous_run="your previous run of the same sweep")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a per-run option of the run (repeatable; a flag as --opt "
                        "exclusive): job_timeout=2h, groups=win64, max_worker_instances=1, "
                        "... (docs/runoptions.md)")
    parser.add_argument("--wait", action="store_true",
                        help="follow the run to its end, print its report; exit 0 nothing "
                        "changed, 1 tests changed, 3 the run did not complete")
    parser.add_argument("--wait-timeout", type=float, default=DEFAULT_WAIT_TIMEOUT,
                        metavar="SECONDS", help="with --wait: give up after this long, exit "
                        f"3 (default {DEFAULT_WAIT_TIMEOUT:.0f})")
    parser.add_argument("--junit", type=Path, metavar="FILE",
                        help="with --wait: write the run's JUnit XML to FILE")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="with --wait: write the run's result as JSON to FILE")
    parser.add_argument("--fetch", metavar="RUN",
                        help="bring your finished run RUN's report, .tab, sweep results "
                        "and bmpcmp images to --dest (default: the current directory)")
    parser.add_argument("--dest", type=Path, metavar="DIR", help="with --fetch: where")
    parser.add_argument("--stop", metavar="RUN", help="stop your running run RUN")
    parser.add_argument("--reason", default="", help="with --stop: why (the report says)")
    parser.add_argument("--rerun", metavar="RUN",
                        help="queue your finished run RUN again, with your tree as last "
                        "pushed")
    parser.add_argument("words", nargs="*")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        # Warnings (files over the size limit, symlinks left out) reach the developer.
        common.setup_logging()
        logging.getLogger().setLevel(logging.WARNING)
    try:
        cfg = common.load_config(args)
        if not args.user:
            raise ClusterError("no user name: pass --user or set $CLUSTER_USER or $USER")
        if args.resume and args.sweep is None:
            raise ClusterError("--resume resumes a sweep: it goes with --sweep FILE")
        follow = [o for o in ("fetch", "stop", "rerun") if getattr(args, o)]
        if follow:
            return _follow(args, cfg, follow)
        if args.dest is not None:
            raise ClusterError("--dest says where --fetch puts a run's files")
        args.words = [*args.words, *check_opts(args.opt, args.words)]
        _check_wait(args)
        if args.sweep is not None:
            _use_sweep(args)
        elif args.tree is None:
            args.tree = Path.cwd()
        if args.master is None:
            if args.ssh_port is not None or args.ssh_key is not None \
                    or args.known_hosts is not None:
                raise ClusterError("--ssh-port, --ssh-key and --known-hosts go with --master")
            return _local(Home(cfg.home), cfg, args)
        return _remote(args, cfg.ssh_port, cfg.ssh_key, cfg.ssh_known_hosts)
    except SshError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED if exc.kind in ("unreachable", "timeout") else EXIT_USAGE
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _follow(args: argparse.Namespace, cfg: Config, follow: list[str]) -> int:
    """--fetch, --stop or --rerun (one of them, alone), locally or with --master."""
    if len(follow) > 1 or args.words or args.wait or args.sweep is not None:
        raise ClusterError(f"--{follow[0]} RUN goes alone (no products, words, --wait, "
                           "--sweep, or another of --fetch, --stop and --rerun)")
    if args.master is None:
        home, target, remote_home = Home(cfg.home), None, ""
    else:
        home = None
        target, remote_home = _target(args, cfg.ssh_port, cfg.ssh_key, cfg.ssh_known_hosts)
    ssh = {"python": args.master_python, "cache": args.master_cache}
    if args.fetch:
        return pushfollow.fetch(args, home, target, remote_home, ssh)
    return pushfollow.stop_or_rerun(args, home, target, remote_home, ssh)


def _check_wait(args: argparse.Namespace) -> None:
    """--wait's options: --junit, --json and --wait-timeout go with it; not with abort."""
    if not args.wait:
        if args.junit is not None or args.json is not None:
            raise ClusterError("--junit and --json write the result of the run: they go "
                               "with --wait")
        return
    if "abort" in args.words:
        raise ClusterError("abort removes your runs; there is no run to --wait for")
    if args.wait_timeout <= 0:
        raise ClusterError(f"--wait-timeout {args.wait_timeout:g}: expected a number of "
                           "seconds above 0")


def check_opts(opts: list[str], words: list[str]) -> list[str]:
    """The ``--opt`` values ``opts`` as option words of the queue line, each checked with
    :mod:`cluster.runoptions`; ClusterError naming the option and what was expected for an
    unknown key, a bad value, an option given twice or with ``abort``.  ``words`` are the
    command line's other words (an ``--opt`` may not repeat one of their options)."""
    if opts and "abort" in words:
        raise ClusterError("abort removes your runs; it takes no --opt")
    seen: dict[str, str] = {word.partition("=")[0]: word for word in words}
    for opt in opts:
        key, eq, value = opt.partition("=")
        if key not in runoptions.KEYS:
            raise ClusterError(f"--opt {opt}: {key!r} is not a per-run option; expected one "
                               f"of {', '.join(runoptions.KEYS)} (docs/runoptions.md)")
        if key in seen:
            raise ClusterError(f"--opt {opt}: option {key} is also given as {seen[key]!r}; "
                               "expected it once")
        try:
            runoptions.check_word(key, value if eq else None)
        except RunOptionError as exc:
            raise ClusterError(f"--opt: {exc}") from None
        seen[key] = opt
    try:
        runoptions.check_words(opts)
    except RunOptionError as exc:
        raise ClusterError(f"--opt: {exc}") from None
    return list(opts)


def _use_sweep(args: argparse.Namespace) -> None:
    """``--sweep FILE``: check the sweep (SweepError, a ClusterError, when it cannot run)
    and make its folder the tree and ``sweep sweep=<file>`` the run's words."""
    if "abort" in args.words:
        raise ClusterError("--sweep submits a sweep; abort takes no --sweep")
    products = [w for w in args.words if w in PRODUCTS]
    if products:
        raise ClusterError(f"--sweep runs product sweep alone; got {' '.join(products)}")
    for key in SWEEP_ONLY_OPTIONS:
        if any(w.startswith(f"{key}=") for w in args.words):
            raise ClusterError(f"--sweep and --resume make the {key}= option; give no "
                               f"{key}= word")
    if args.tree is not None:
        raise ClusterError("--sweep pushes the sweep file's folder; give no --tree")
    submission = prepare_sweep(args.sweep)
    print(f"sweep: {submission.tasks} task(s) from {args.sweep}")
    args.tree = submission.folder
    args.words = submission.words_with(args.words)


def _resume_words(args: argparse.Namespace, run_id: str) -> None:
    """Add ``resume=<run_id>`` to the run's words, and say so."""
    print(f"resume: the tasks without a valid result in your run {run_id}")
    args.words = [*args.words, f"resume={run_id}"]


def _spec(args: argparse.Namespace) -> RunSpec:
    products = [w for w in args.words if w in PRODUCTS] or ["gs"]
    options = [w for w in args.words if w not in PRODUCTS]
    return RunSpec.parse(" ".join(["user", args.user, ",".join(products), *options]),
                         source="command line")


def _local(home: Home, cfg: Config, args: argparse.Namespace) -> int:
    """A push (or abort) into a master home this machine sees."""
    if "abort" in args.words:
        stopped = abort_pushes(home, args.user)
        outcome = request_abort(home, args.user)
        if stopped:
            print(f"dequeueing: stopped {stopped} push(es) of {args.user} not yet queued")
        print(f"dequeueing: removed {outcome.removed} queued run(s) of {args.user}")
        if outcome.running:
            print(f"dequeueing: stopping the running run {outcome.running}")
        return EXIT_OK
    if args.resume:
        _resume_words(args, previous_sweep_run(home, args.user, args.sweep.name))
    spec = _spec(args)
    if not args.tree.is_dir():
        raise ClusterError(f"tree {args.tree} is not a directory")
    before = pushwait.archived(home) if args.wait else set()
    pushed = submit_push(home, args.tree, spec, method="copy" if args.copy else "auto")
    print(f"queueing: {spec.line()}", flush=True)
    if pushed.note:
        print(pushed.note, flush=True)
    if not args.wait:
        return EXIT_OK
    return _wait(home, cfg, spec, before, args)


def _wait(home: Home, cfg: Config, spec: RunSpec, before: set[str],
          args: argparse.Namespace) -> int:
    """--wait: follow the run to its end (a progress line on a terminal), print its report,
    copy its CI files to --junit and --json; the exit status of :func:`pushwait.verdict`,
    or 3 when it did not end within --wait-timeout."""
    progress = ProgressLine(sys.stdout, home, cfg, spec.line())
    try:
        archive = pushwait.wait_for_archive(home, spec.line(), before, args.wait_timeout,
                                            on_poll=progress.update)
    finally:
        progress.clear()
    if archive is None:
        print(f"{PROG}: the run {spec.line()!r} did not end within --wait-timeout "
              f"{args.wait_timeout:g} s; it goes on (clusterpush abort stops it)",
              file=sys.stderr)
        return EXIT_RUN_FAILED
    sys.stdout.write((archive / "report.txt").read_text(encoding="utf-8", errors="replace"))
    print(archive, flush=True)
    for wanted, kind in ((args.junit, "junit"), (args.json, "json")):
        if wanted is None:
            continue
        if not cifiles.has_ci(archive):
            print(f"{PROG}: the run has no {cifiles.KINDS[kind]} (a sweep or bmpcmp run): "
                  f"{wanted} not written", file=sys.stderr)
            continue
        cifiles.write(archive, kind, wanted)
    status = pushwait.verdict(archive)
    if status == EXIT_RUN_FAILED:
        print(f"{PROG}: the run did not complete: {run_end(archive).describe()} (report: "
              f"{archive / 'report.txt'})", file=sys.stderr)
    return status


def _target(args: argparse.Namespace, port: int, key: str,
            known_hosts: Path) -> tuple[SshTarget, str]:
    """The ssh target and the master home on it (``--master``, the ssh options)."""
    if args.home is not None:
        raise ClusterError("--home names a master home this machine sees; with --master give "
                           "the home on the master as --master HOST:HOME")
    master = parse_master(args.master)
    port = args.ssh_port if args.ssh_port is not None else port
    if not 1 <= port <= 65535:
        raise ClusterError(f"--ssh-port {port}: expected a TCP port between 1 and 65535")
    target = SshTarget(master.host, port, master.user,
                       args.ssh_key if args.ssh_key is not None else key,
                       Path(os.path.expanduser(args.known_hosts or known_hosts)))
    return target, master.home


def _remote(args: argparse.Namespace, port: int, key: str, known_hosts: Path) -> int:
    """A push (or abort) over ssh (``--master``); the config gives the ssh defaults."""
    if args.copy:
        raise ClusterError("--copy mirrors into a master home this machine sees; with "
                           "--master the tree always goes by rsync over ssh")
    target, home = _target(args, port, key, known_hosts)
    master = parse_master(args.master)
    if "abort" in args.words:
        aborted = remote_abort(target, master.home, args.user, python=args.master_python,
                               cache=args.master_cache)
        if aborted.stopped:
            print(f"dequeueing: stopped {aborted.stopped} push(es) of {args.user} not yet "
                  "queued")
        print(f"dequeueing: removed {aborted.removed} queued run(s) of {args.user}")
        if aborted.running:
            print(f"dequeueing: stopping the running run {aborted.running}")
        return EXIT_OK
    if args.resume:
        _resume_words(args, remote_previous_sweep(
            target, master.home, args.user, args.sweep.name, python=args.master_python,
            cache=args.master_cache))
    spec = _spec(args)
    pushed = remote_push(target, master.home, args.tree, spec, python=args.master_python,
                         cache=args.master_cache)
    print(f"queueing: {spec.line()}", flush=True)
    if pushed.files is not None:
        print(f"sent {pushed.files} changed file(s), {pushed.size} bytes "
              f"({pushed.literal} literal) to {target.where()}:{pushed.target}")
    if pushed.note:
        print(pushed.note, flush=True)
    if args.wait:
        return pushfollow.wait_remote(target, home, spec, pushed, args,
                                      {"python": args.master_python,
                                       "cache": args.master_cache})
    return EXIT_OK
