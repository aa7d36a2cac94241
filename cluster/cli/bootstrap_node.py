"""bootstrap_node.py -- set up a node machine over ssh (seed 002's initialisation).

Usage: bootstrap_node.py HOST --name NODE [--user U] [--key K] [--port P]
                         [--known-hosts F] [--dir REMOTE_DIR] [--python PY]
                         [--master-host H] [--master-home PATH] [--master-user U]
                         [--master-port P] [--master-key FILE | --send-master-key LOCAL]
                         [--master-known-hosts FILE | --send-master-known-hosts LOCAL]
                         [--transport ssh|local] [--node-set KEY=VALUE]...
                         [--job-user NAME] [--allow-job-cron]
                         [--restrict [--node-public-key FILE] [--authorized-keys FILE]]
                         [--config FILE] [--home DIR] [--set KEY=VALUE]...

Run on the master (or any machine with the repo and an ssh key the node accepts).  Two
directions of ssh are involved:

* this machine -> the node (HOST): ``--user``, ``--key``, ``--port``, ``--known-hosts``
  (default: your ssh user name, your usual keys, 22, ~/.ssh/known_hosts).  The node's host
  key must already be in that known_hosts file: an unknown key is refused, never added;
* the node -> the master, written into the node's ``node.conf``: ``--master-host`` (default:
  this machine's host name), ``--master-home`` (an absolute path on the master; default: the
  home of ``--config``/``--home`` here), ``--master-user`` (default: your user name here),
  ``--master-port`` (22), and the node's key and known_hosts file for it: paths on the node
  (``--master-key``, ``--master-known-hosts``), or local files to upload there
  (``--send-master-key`` -> REMOTE_DIR/master_key, mode 0600; ``--send-master-known-hosts``
  -> REMOTE_DIR/known_hosts).  ``--node-set KEY=VALUE`` adds any other [node] key.

When the node's account is root, its jobs run as ``--job-user`` (default ``cluster-job``):
the bootstrap makes it a system account with no login (``useradd --system
--no-create-home --shell /usr/sbin/nologin``) unless it exists, and writes ``job_user`` into
node.conf; the account must be able to enter REMOTE_DIR, so give a root node ``--dir
/opt/cluster-node`` (root's home is closed to others).  ``--job-user ''`` keeps jobs as
root.  The job account is denied cron and at (its name added to /etc/cron.deny, and to
/etc/at.deny where at is installed), so a job cannot schedule anything to run after its run;
``--allow-job-cron`` leaves those files alone (the node still removes the account's crontab
and at jobs at the start and end of each run).  node.conf is written mode 0600.

Steps (cluster/node/bootstrap.py): connect and run ``true``; list missing tools (gs,
mutool, make, md5sum, rsync, crontab, python3 and the Python modules the node code
imports); copy the node code into REMOTE_DIR (default ``cluster-node`` in the login
directory), only the files that differ; write REMOTE_DIR/node.conf if it differs; install
the clusterpull crontab entry (``clusterpull.py --install-cron``); run send_caps once and
print its line.  Every step prints what it changed; a second run prints "nothing changed"
and writes nothing.

``--restrict`` (run on the master, as the account the nodes log in to) limits the node's
login on the master to what a node does: it adds, or puts in place of the key's other
lines, one line in that account's ``--authorized-keys`` (default ~/.ssh/authorized_keys)::

    restrict,command="<python> <repo>/nodegate.py --home <home> --node <name>" <key>

for the node's public key (``--node-public-key FILE``; default: the ``.pub`` beside
``--send-master-key``, or derived from it).  Through the gate (nodegate.py,
cluster/master/gate/gate.py) the node reads the master home over SFTP but ``cluster.secret``,
``node-keys/`` other than its own key, and ``ssh/``; lists and fetches (rsync) folders of the
home; writes only its upload area (``runs/<id>/logs/<name>.log``, ``.build.log``,
``runs/<id>/bmpcmp/``); and runs nothing else.

Exit status: 0 done (missing tools are listed but not fatal), 1 a step on the node failed
(or its Python lacks modules), 2 bad usage, 3 the host is unreachable, 4 the host refused
the key, 5 the host key is unknown (not in known_hosts), 6 the host key changed, 7 another
ssh failure (protocol, time-out).
"""

from __future__ import annotations

import argparse
import getpass
import posixpath
import socket
import sys
from pathlib import Path

from cluster import config, configfile, datatypes, nodekeys
from cluster.cli import common, progname
from cluster.defaults import EXIT_FAILED, EXIT_USAGE
from cluster.errors import ClusterError, ConfigError
from cluster.master.gate import gate
from cluster.node import bootstrap
from cluster.node.bootstrap import Bootstrap, NodeSettings
from cluster.runtime import proc
from cluster.runtime.ssh import SshTarget

PROG = progname.prog("bootstrap_node.py")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("host", metavar="HOST", help="the node machine")
    p.add_argument("--name", required=True, help="the node's name (node_name)")
    p.add_argument("--user", default="", help="login on HOST (default: yours)")
    p.add_argument("--key", default="", help="private key for HOST (default: your usual keys)")
    p.add_argument("--port", type=int, default=22, help="HOST's ssh port (22)")
    p.add_argument("--known-hosts", type=Path, default=None,
                   help="known_hosts file holding HOST's key (~/.ssh/known_hosts)")
    p.add_argument("--dir", default=bootstrap.DEFAULT_DIR, dest="remote_dir",
                   help="the node's directory on HOST (relative: to the login directory)")
    p.add_argument("--python", default="python3",
                   help="the Python on HOST that runs the node (python3)")
    p.add_argument("--timeout", type=float, default=15.0, help="ssh connect timeout [s]")
    p.add_argument("--transport", choices=config.TRANSPORTS, default="ssh",
                   help="how the node reaches the master's files (ssh)")
    p.add_argument("--master-host", default="", help="the master as the node reaches it")
    p.add_argument("--master-home", default="", help="the master home's absolute path")
    p.add_argument("--master-user", default="", help="account on the master (yours)")
    p.add_argument("--master-port", type=int, default=22, help="the master's ssh port (22)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--master-key", default="", help="the node's key for the master "
                     "(a path on the node)")
    key.add_argument("--send-master-key", type=Path, help="a local private key to upload as "
                     "the node's key for the master")
    known = p.add_mutually_exclusive_group()
    known.add_argument("--master-known-hosts", default="", help="known_hosts on the node "
                       "holding the master's key (a path on the node)")
    known.add_argument("--send-master-known-hosts", type=Path, help="a local known_hosts "
                       "file to upload for the node")
    p.add_argument("--job-user", default=bootstrap.DEFAULT_JOB_USER, metavar="NAME",
                   help="on a root node, the account its jobs run as, made if missing "
                        "(default %(default)s; '' = jobs run as root)")
    p.add_argument("--allow-job-cron", action="store_true",
                   help="do not deny the job account cron and at (default: its name goes "
                        "into /etc/cron.deny and, where at is installed, /etc/at.deny)")
    p.add_argument("--node-set", action="append", default=[], metavar="KEY=VALUE",
                   help="another [node] key for node.conf")
    p.add_argument("--restrict", action="store_true", help="limit the node's key to the node "
                   "gate in this account's authorized_keys (run on the master)")
    p.add_argument("--node-public-key", type=Path, default=None, help="the public key of the "
                   "node's key for the master (default: from --send-master-key)")
    p.add_argument("--authorized-keys", type=Path, default=None, help="the master account's "
                   "authorized_keys (~/.ssh/authorized_keys)")
    common.add_config_options(p)
    return p


def _settings(args: argparse.Namespace) -> NodeSettings:
    """node.conf's settings from the options; ConfigError for a bad one."""
    if not datatypes.valid_node_name(args.name):
        raise ConfigError("--name", args.name, "letters, digits, '.', '_' or '-' (max 64)")
    home = args.master_home
    if not home:
        home = str(common.load_config(args).home.resolve())
    if not posixpath.isabs(home):
        raise ConfigError("--master-home", home, "an absolute path on the master")
    if args.job_user and not config.ACCOUNT_NAME.fullmatch(args.job_user):
        raise ConfigError("--job-user", args.job_user, "an account name (a lower-case letter "
                          "or '_', then up to 31 of a-z 0-9 _ -), or ''")
    extra = configfile.parse_overrides(args.node_set)
    table = {name for name, _ in config.Config.__dataclass_fields__.items()}
    for name in extra:
        if name not in table:
            raise ConfigError("--node-set", name, "a configuration key (see etc/node.conf)")
    settings = NodeSettings(
        node_name=args.name, transport=args.transport,
        master_host=args.master_host or socket.gethostname(), master_home=home,
        ssh_port=args.master_port, ssh_user=args.master_user or getpass.getuser(),
        ssh_key=args.master_key, ssh_known_hosts=args.master_known_hosts,
        extra=tuple(extra.items()))
    # What the node will load must load: check the text with the real loader here.
    _check_conf(settings.conf_text())
    return settings


def _check_conf(text: str) -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "node.conf"
        path.write_text(text, encoding="utf-8")
        configfile.load(path)


def _node_key(settings: NodeSettings) -> str:
    """Make the node's own key in the master home (docs/protocol.md, "Signed messages"; each
    node signs with a key of its own), when that home is on this machine, as it is when
    bootstrap_node.py runs on the master; the line saying so.  A home that is not here: a
    line saying where the key must be made.  ClusterError if it cannot be made."""
    home = Path(settings.master_home)
    rel = nodekeys.key_rel(settings.node_name)
    if not home.is_dir():
        return (f"node key: {home} is not on this machine; run bootstrap_node.py on the "
                f"master, or the node will find no {rel} there")
    existed = nodekeys.key_path(home, settings.node_name).exists()
    nodekeys.ensure_node_key(home, settings.node_name)
    return f"node key: {rel} {'kept' if existed else 'made'} (mode 0600)"


def _public_key(args: argparse.Namespace) -> str:
    """The node's public key line for the master: ``--node-public-key``, else the ``.pub``
    beside ``--send-master-key``, else derived from that key (``ssh-keygen -y``)."""
    if args.node_public_key is not None:
        try:
            return args.node_public_key.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError("--node-public-key", str(args.node_public_key),
                              f"a readable public key file ({exc.strerror})") from None
    key = args.send_master_key
    if key is None:
        raise ConfigError("--restrict", "", "the node's public key: --node-public-key FILE, "
                                            "or --send-master-key LOCAL")
    pub = Path(f"{key}.pub")
    if pub.is_file():
        return pub.read_text(encoding="utf-8").strip()
    done = proc.run(["ssh-keygen", "-y", "-f", str(key)], timeout=30)
    if not done.ok:
        raise ConfigError("--send-master-key", str(key), "a private key ssh-keygen -y can "
                                                         f"read: {done.text('stderr').strip()}")
    return done.text().strip()


def _restrict_line(args: argparse.Namespace, settings: NodeSettings) -> str:
    """The node gate's authorized_keys line for the node's key (see the module docstring);
    ConfigError when the home is not here or the public key is not known."""
    home = Path(settings.master_home)
    if not home.is_dir():
        raise ConfigError("--restrict", str(home), "a master home on this machine (run "
                                                   "bootstrap_node.py on the master)")
    try:
        # The master's configuration, so that the gate bounds uploads by its
        # max_upload_bytes (without --config: the default).
        return gate.authorized_line(gate.gate_command(home, settings.node_name,
                                                      config=args.config),
                                    _public_key(args))
    except ValueError as exc:
        raise ConfigError("--node-public-key", "", str(exc)) from None


def _restrict(args: argparse.Namespace, settings: NodeSettings, line: str) -> str:
    """Put ``line`` into the master account's authorized_keys; the line saying what was
    done.  ClusterError if the file cannot be written."""
    keys = args.authorized_keys or Path.home() / ".ssh" / "authorized_keys"
    try:
        done = gate.authorize(keys, line)
    except OSError as exc:
        raise ClusterError(f"cannot write {keys}: {exc.strerror or exc}") from None
    return f"restricted login: {done} in {keys} (node gate for {settings.node_name})"


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad option (argparse printed why)
        return int(exc.code or 0)
    try:
        settings = _settings(args)
        for option in (args.send_master_key, args.send_master_known_hosts):
            if option is not None and not option.is_file():
                raise ConfigError("--send-master-*", str(option), "a readable local file")
        if not 1 <= args.port <= 65535:
            raise ConfigError("--port", args.port, "a TCP port between 1 and 65535")
        restricted = _restrict_line(args, settings) if args.restrict else ""
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        print(_node_key(settings), flush=True)
        if restricted:
            print(_restrict(args, settings, restricted), flush=True)
    except ClusterError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    target = SshTarget(args.host, args.port, args.user, args.key, args.known_hosts)
    job = Bootstrap(target, settings, remote_dir=args.remote_dir, python=args.python,
                    upload_key=args.send_master_key,
                    upload_known_hosts=args.send_master_known_hosts, timeout=args.timeout,
                    out=lambda line: print(line, flush=True), job_user=args.job_user,
                    deny_job_cron=not args.allow_job_cron)
    return job.run().exit_code
