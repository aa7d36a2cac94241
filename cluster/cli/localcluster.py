"""localcluster.py -- a complete regression run on a cluster on this machine.

Usage: localcluster.py [--home DIR] [--nodes N] [--corpus DIR] [--product gs|pdfwrite|
                       ps2write|xpswrite|pcl|xps|mupdf|shell] [--tree DIR] [--option OPT]...
                       [--user NAME] [--set KEY=VALUE]... [--timeout SECONDS]
                       [--transport local|ssh]
       localcluster.py [--home DIR] [--nodes N] --sweep path/to/sweep.toml [--resume] ...

Creates a master home (default ./cluster-home), starts the supervisor, the monitor, the
status page (clusterstatus.py, on status_address:status_port, 127.0.0.1:9020 by default; it
prints the page's URL) and N local nodes (default 2), pushes a product tree (default: a demo
tree wrapping the installed ghostscript or mutool; --option adds options to its command
line) against the corpus (default: the ghostpdl examples), waits for the run, prints the
report, stops everything it started and prints the run's archive folder as its last line.

While it waits, a terminal shows one progress line, rewritten in place: jobs done of total,
nodes, results per second and the estimated end.  When stdout is not a terminal (a pipe, a
file) nothing of it is printed.

With --sweep FILE it runs that sweep (docs/sweeps.md) instead of the demo push:
the sweep is checked first as clusterpush.py --sweep checks it (a problem: one line naming
the file and the key, exit status 2, nothing started), then its folder is pushed and run
as product sweep, with the per-run options of its [run] table (docs/runoptions.md);
the report follows and the run's archive folder is the last line, as for any run.
--product, --tree and --option do not go with it.  --resume runs only the tasks without
a valid result in the newest earlier run of the same sweep file in this home, by the
same --user (as clusterpush.py --sweep --resume; none: exit status 2, nothing started).
--run-option WORD adds a word to the run's queue line: lowres, filter=..., or a per-run
option (job_timeout=2h, max_worker_instances=1, exclusive: docs/runoptions.md), checked
before anything starts (a bad one: exit status 2).

With --transport ssh the nodes reach the master's files as nodes on other machines do: over
ssh and rsync, through a private OpenSSH server it starts on a free loopback port with a host
key and a client key it generates in the home (HOME/ssh/; nothing outside the home is
touched).  The default, local, has the nodes read the home directly.

Run it twice: the second run reports no differences.  Run it with --option=-dTextAlphaBits=4
(or any option) and the report names exactly the tests whose output changed.

Before starting anything it checks that its ports (base_port, base_port+1, base_port+2 and
monitor_port on listen_address, status_port on status_address; change them with --set,
status_port=0 for no status page) are free; a port already taken is reported at once,
naming the port and, when it can be told, the process holding it.  If the monitor, the
supervisor or the status service exits while it waits, it stops at once and prints that
process's last log lines.

Everything it starts dies with it: killed even by SIGKILL, its daemons get SIGTERM and leave,
and so do the clustermasters and node runs they started (the parent watch,
cluster.runtime.proc); its ports are free again within moments.  A stop leaves no
clustermaster PID file behind, so running it again in the same home starts the next run at
once.

Exit status: 0 the run completed and its report was printed; 3 the run ended without a
complete result -- it failed (a node's build failed: the report quotes the compiler's
error lines), was aborted or stopped, ran out of time or lost its nodes -- its report is
printed all the same, and a last line on stderr says how it ended and why; 1 the cluster
stopped or the run did not finish within --timeout, or (--sweep) the run completed but
tasks did not end ok -- invalid, failed or timed out: the report is printed and a last
line on stderr counts them (as GNU parallel exits non-zero when jobs failed); 2 bad usage
or set-up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cluster import configfile
from cluster.cli import common, progname
from cluster.configfile import parse_overrides
from cluster.console.progress import ProgressLine
from cluster.datatypes import PRODUCTS
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from cluster.demotree import write_demo_tree
from cluster.errors import ClusterError, LocalClusterError
from cluster.localcluster import DEFAULT_CORPUS, TRANSPORTS, LocalCluster
from cluster.localrunend import RESULTS_TSV, run_end, sweep_not_ok
from cluster.runspec import RunSpec
from cluster.runtime import proc

if TYPE_CHECKING:
    from cluster.triggers.sweeppush import SweepSubmission

#: This command's name in its usage line and messages (see progname).
PROG = progname.prog("localcluster.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=Path("cluster-home"))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--product", choices=PRODUCTS, default="gs")
    parser.add_argument("--tree", type=Path, help="your product tree instead of the demo one")
    common.add_sweep_arguments(
        parser, sweep_help="run the sweep of this sweep file instead of a product tree",
        previous_run="the previous run of the same sweep in this home")
    parser.add_argument("--option", action="append", default=[], metavar="OPT",
                        help="add OPT to the demo product's command line (repeatable; write "
                        "--option=-dFoo so it is not taken for an option)")
    parser.add_argument("--user", default="local")
    parser.add_argument("--run-option", action="append", default=[], metavar="WORD",
                        help="a word of the run's queue line (repeatable): lowres, highres, "
                        "filter=..., or a per-run option such as job_timeout=2h, "
                        "max_worker_instances=1 or exclusive (docs/runoptions.md); with "
                        "--sweep it replaces the sweep file's [run] option of its key")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait")
    parser.add_argument("--transport", choices=TRANSPORTS, default="local",
                        help="how the nodes reach the master's files: local (directly, the "
                        "default) or ssh (a private sshd on loopback, keys in HOME/ssh)")
    parser.add_argument("--provider", choices=("slurm", "gridengine"),
                        help="slurm or gridengine: start no node here; a private single-host "
                        "Slurm (Debian's slurmctld, slurmd, munge) or Grid Engine "
                        "(gridengine-master, -exec, -client) and the provisioner start "
                        "ephemeral nodes as the run waits, at most --nodes of them "
                        "(docs/provisioning.md)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error(f"--nodes {args.nodes}: need at least one node")
    if args.sweep is not None and (args.tree is not None or args.option
                                   or args.product != parser.get_default("product")):
        parser.error("--sweep runs product sweep on the sweep's folder: no --product, "
                     "--tree or --option with it")
    if args.resume and args.sweep is None:
        parser.error("--resume resumes a sweep: it goes with --sweep FILE")
    common.setup_logging(verbose=args.verbose)
    log = logging.getLogger("cluster.localcluster")
    sweep: SweepSubmission | None = None
    try:
        if args.sweep is not None:
            # Here, not at the top: every run waits for this program's start.
            from cluster.triggers.sweeppush import prepare_sweep
            sweep = prepare_sweep(args.sweep)
        overrides = parse_overrides(args.set)
        static = args.nodes
        if args.provider:
            # --nodes is the most the provisioner asks Slurm for; it looks often here.
            overrides = {"max_nodes": str(args.nodes), "resource_interval": "1",
                         **overrides}
            static = 0
        cluster = LocalCluster(args.home, static, args.corpus, overrides,
                               transport=args.transport, provider=args.provider or "")
        settings = configfile.load(None, overrides)
        if sweep is not None and args.resume:
            from cluster.triggers.sweeppush import previous_sweep_run
            resumed = previous_sweep_run(cluster.home, args.user, sweep.file)
            print(f"resume: the tasks without a valid result in run {resumed}", flush=True)
            args.run_option = [*args.run_option, f"resume={resumed}"]
        product, *words = sweep.words_with(args.run_option) if sweep is not None \
            else [args.product, *args.run_option]
        # Checked now, as clusterpush checks them: a bad word is said before anything starts.
        RunSpec.parse(" ".join(["user", args.user, product, *words]), source="--run-option")
    except (ClusterError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        # First of all (the ports are settings, not in the home's file): a port already
        # taken is said at once, not after --timeout.
        cluster.check_ports(settings)
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        cluster.prepare()
    except (ClusterError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tree, products = args.tree, [product]
    if sweep is not None:
        tree = sweep.folder
    elif tree is None:
        tree = write_demo_tree(cluster.home_dir / "demo" / args.product, args.product,
                               args.option)
    # Everything this process starts, through whichever module (the private sshd, a
    # private Slurm's daemons too), is to die with it, even when it is SIGKILLed.
    os.environ[proc.PARENT_WATCH_ENV] = "1"
    with cluster:
        try:
            cluster.start()
            url = cluster.status_url()
            if url is not None:
                print(f"Status page: {url}", flush=True)
            before = cluster.archives()
            spec = cluster.push(tree, args.user, products, words)
            log.info("pushed %s; waiting for the run (logs in %s)", spec.line(),
                     cluster.home.log_dir)
            progress = ProgressLine(sys.stdout, cluster.home, cluster.config(), spec.line())
            try:
                archive = cluster.wait_for_run(spec, before, args.timeout,
                                               on_poll=progress.update)
            finally:
                progress.clear()
        except (LocalClusterError, TimeoutError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    sys.stdout.write((archive / "report.txt").read_text(encoding="utf-8"))
    print(archive, flush=True)
    end = run_end(archive)
    if not end.complete:
        print(f"{PROG}: the run did not complete: {end.describe()} (report: "
              f"{archive / 'report.txt'})", file=sys.stderr)
        return EXIT_RUN_FAILED
    if sweep is not None:
        not_ok = sweep_not_ok(archive)
        if not_ok:
            # As GNU parallel exits with the number that failed: not a clean result.
            print(f"{PROG}: {not_ok} task(s) of the sweep did not end ok: invalid, failed "
                  f"or timed out (results.tsv: {archive / RESULTS_TSV})", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK
