"""nodegate.py -- the forced command of a restricted node's ssh login on the master.

Usage (in the master account's authorized_keys, written by ``bootstrap_node.py --restrict``)::

    restrict,command="<python> <repo>/nodegate.py --home HOME --node NAME [--config FILE]" <key>

sshd runs it for every session of that key, with what the node asked for in
``SSH_ORIGINAL_COMMAND``.  It lets through only what a node does, within the node's part of
the master home ``HOME`` (cluster/master/gate/gate.py, cluster/master/gate/gatepolicy.py):

* SFTP, served by the gate itself: reading any file of the home except ``cluster.secret``,
  ``node-keys/`` (but ``node-keys/NAME.key``) and ``ssh/``; writing only the node's upload
  area (``runs/<id>/logs/NAME.log``, ``runs/<id>/logs/NAME.build.log``,
  ``runs/<id>/bmpcmp/``, and their temporary names);
* the node's listing of a tree (``python3 -c WALK_SCRIPT DIR PREFIX``) and rsync's sender
  (``rsync --server --sender ...``) on a folder of the home that holds none of those
  secrets.

A run's upload area may hold at most ``max_upload_bytes`` (the master's setting, from
``--config FILE`` and ``--set KEY=VALUE``; without them its default): a write past it is
refused naming the file, the bound and the run, and the partial file removed.

Anything else is refused with one line on stderr naming the command and what is allowed;
refusals are also appended to ``HOME/log/nodegate.log``.

Exit status: that of the command let through (0 for an SFTP session that ended), 1 refused,
2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cluster import configfile
from cluster.datatypes import valid_node_name
from cluster.defaults import EXIT_USAGE
from cluster.errors import ConfigError
from cluster.master.gate.gate import Gate

PROG = "nodegate.py"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", required=True, help="the master home (an absolute path)")
    p.add_argument("--node", required=True, help="the node this login belongs to")
    p.add_argument("--config", type=Path, help="the master's configuration file (INI, see "
                                               "etc/master.conf): max_upload_bytes")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one configuration key")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return int(exc.code or 0)
    if not valid_node_name(args.node):
        print(f"{PROG}: --node {args.node!r}: expected a node name (1-64 of "
              "[A-Za-z0-9._-])", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isabs(args.home) or not os.path.isdir(args.home):
        print(f"{PROG}: --home {args.home!r}: expected the master home's absolute path",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = configfile.load(args.config, configfile.parse_overrides(args.set))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return Gate(args.home, args.node, max_upload_bytes=cfg.max_upload_bytes).run(
        os.environ.get("SSH_ORIGINAL_COMMAND"))
