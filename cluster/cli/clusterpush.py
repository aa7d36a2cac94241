"""clusterpush.py -- submit your tree to the cluster as a user run (port of clusterpush.pl).

Usage: clusterpush.py [--config FILE] [--home DIR] [--set KEY=VALUE]... [--tree DIR]
                      [--user NAME] [--copy] [PRODUCT...] [lowres|highres] [relaxtimeout]
                      [filter=A,B] [bmpcmp] [abort]

PRODUCT is gs, pdfwrite, ps2write, mupdf or shell (the last two alone); the default is
gs.  The user is --user, else $CLUSTER_USER, else $USER.  The tree (default: the current
directory) is mirrored to users/<user>/<ghostpdl|mupdf|shell> in the master home and the
run is queued at priority 0.  The mirror leaves out version control, build and object
directories (bin/, obj/, build/, ...), object files, rendered images and files over 30 MB
(named on stderr), and deletes them from an earlier push.  It uses rsync when rsync is on
PATH; --copy uses the built-in copy instead (same result).  Pushing again while your run
of the same products waits replaces it (same place in the queue; it says so); while it
runs, the new push is queued after it, and the running run keeps the tree it started
with.  A symlink at users/<user> or users/<user>/<tree> in the master home is refused,
never followed.  The report (mailed to you
when the master mails) compares with the baseline and with your previous push, and ends
with the source diff against the master's clean tree.  `bmpcmp` instead renders the tests
that differed in your last run with your build and the clean tree's, and makes a page of
PNG difference images.  `abort` removes your queued runs and stops the one running.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from cluster.cli import common
from cluster.datatypes import PRODUCTS
from cluster.defaults import EXIT_OK, EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.abort import request_abort
from cluster.queue import RunSpec
from cluster.triggers.push import submit_push


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0 queued or aborted, 2 refused)."""
    parser = argparse.ArgumentParser(prog="clusterpush.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_config_options(parser)
    parser.add_argument("--tree", type=Path, default=Path.cwd())
    parser.add_argument("--user", default=os.environ.get("CLUSTER_USER")
                        or os.environ.get("USER") or "")
    parser.add_argument("--copy", action="store_true",
                        help="mirror the tree with the built-in copy, not rsync")
    parser.add_argument("words", nargs="*")
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers:
        # Warnings (files over the size limit, symlinks left out) reach the developer.
        common.setup_logging()
        logging.getLogger().setLevel(logging.WARNING)
    try:
        cfg = common.load_config(args)
        home = Home(cfg.home)
        if not args.user:
            raise ClusterError("no user name: pass --user or set $CLUSTER_USER or $USER")
        if "abort" in args.words:
            outcome = request_abort(home, args.user)
            print(f"dequeueing: removed {outcome.removed} queued run(s) of {args.user}")
            if outcome.running:
                print(f"dequeueing: stopping the running run {outcome.running}")
            return EXIT_OK
        products = [w for w in args.words if w in PRODUCTS] or ["gs"]
        options = [w for w in args.words if w not in PRODUCTS]
        spec = RunSpec.parse(" ".join(["user", args.user, ",".join(products), *options]),
                             source="command line")
        if not args.tree.is_dir():
            raise ClusterError(f"tree {args.tree} is not a directory")
        pushed = submit_push(home, args.tree, spec, method="copy" if args.copy else "auto")
    except ClusterError as exc:
        print(f"clusterpush.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"queueing: {spec.line()}")
    if pushed.note:
        print(pushed.note)
    return EXIT_OK
