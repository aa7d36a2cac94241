"""usergate.py -- the forced command of a developer's ssh key on the master.

Usage (in the master account's authorized_keys; ``clusteradmin adduser`` writes it)::

    restrict,command="<python> <repo>/usergate.py --home HOME --user NAME [--admin]
        [--sweeps] [--config FILE]" <key>

sshd runs it for every session of that key, with what the client asked for in
``SSH_ORIGINAL_COMMAND``.  It runs no code the client sends: it reads the request as words
and runs the master's own installed code for it (docs/operating.md, "The user gate"), with
the user fixed to NAME:

``clusterpush-gate hello``
    answers :data:`MARKER` and ``{"gate": PROTOCOL, "user": NAME, "admin": bool}``: how
    ``clusterpush --master`` knows it talks to the gate (and ships no code);
``clusterpush-gate modes --token T``
    the push's file modes list on stdin, kept for its receive (``users/NAME/.modes.T``);
``clusterpush-gate receive|commit|abort|previous|wait|report|fetch|stop|rerun ...``
    the steps of :mod:`cluster.cli.pushremote`, parsed with its parser and run with its
    :func:`~cluster.cli.pushremote.execute`, the home the gate's; a queue line must be
    ``user NAME ...``, a ``--user`` NAME, a run named by id NAME's run, and a sweep
    (whose check script runs on the master) needs ``--sweeps``.  ``receive`` is
    rsync's receiving server: its flags and options are checked (:data:`RECEIVE_FLAGS`,
    :data:`_RECEIVE_OPTION`), the arguments an ``rsync -s`` client sends on stdin are read
    and passed on the command line, and it receives only into ``.`` (the staged tree of
    ``users/NAME/``);
``clusteradmin ...`` (``--admin`` only)
    :mod:`cluster.cli.clusteradmin` on the home (no ``--home``, ``--config`` or ``--set``).
    An administrator's gate also lets a step name another user or another user's run.

Anything else is refused: one line on stderr naming the request, the user and why, exit
status 1, a line in ``HOME/log/usergate.log``.  Every request, let through or refused, is
one line of the append-only ``HOME/log/usergate-audit.tsv`` (UTC time, user, ``allowed`` or
``refused``, the step, its subject, the reason).

Exit status: the step's (0 done, 2 it failed), 1 refused, 2 bad usage of the gate itself.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cluster.cli import clusteradmin, pushremote, pushsteps
from cluster.datatypes import valid_node_name
from cluster.defaults import EXIT_USAGE
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.gate.gate import read_protected_args
from cluster.runspec import RunSpec
from cluster.triggers.pushreceive import MAX_MODES_BYTES, PUSH_TOKEN

PROG = "usergate.py"
#: The first word of every request of ``clusterpush --master`` through the gate (on a plain
#: login no such command exists: that is how the client tells the two apart).
GATE_WORD = "clusterpush-gate"
#: The gate's protocol version (``hello``'s answer).
PROTOCOL = 1
MARKER = pushremote.MARKER
#: The gate's exit status when it refuses a request.
EXIT_REFUSED = 1
LOG_NAME = "usergate.log"
AUDIT_NAME = "usergate-audit.tsv"
#: rsync's short options a push's receiving server may carry.
RECEIVE_FLAGS = frozenset("ltprogDvLs")
_RSYNC_FLAGS_ARG = re.compile(r"-(?P<flags>[A-Za-z]+?)(?:e\.(?P<caps>[A-Za-z]*))?")
#: The long options a push sends its receiving server (remotepush's rsync command).
_RECEIVE_OPTION = re.compile(r"--(?:timeout|max-size)=[0-9]{1,15}|--delete(?:-excluded|"
                             r"-during|-after|-delay)?|--stats")
#: Options a gated ``clusteradmin`` may not carry: the gate's home and configuration hold.
_ADMIN_FIXED = ("--home", "--config", "--set")


class Refused(Exception):
    """A request the gate does not let through; the message is the line said."""


class UserGate:
    """The gate of user ``user`` in the master home ``home`` (see the module docstring);
    :meth:`run` takes ``SSH_ORIGINAL_COMMAND``."""

    def __init__(self, home: Path | str, user: str, *, admin: bool = False,
                 sweeps: bool = False, config: Path | None = None, stdin_fd: int = 0,
                 err: Callable[[str], None] | None = None) -> None:
        self.home = Home(Path(home))
        self.user = user
        self.admin = admin
        self.sweeps = sweeps or admin
        self.config = config
        self.stdin_fd = stdin_fd
        self.err = err or (lambda line: print(line, file=sys.stderr, flush=True))

    # -- logs ------------------------------------------------------------------------------
    def _append(self, name: str, line: str) -> None:
        """One line appended to ``log/<name>`` (best effort: a gate that cannot log still
        refuses); one write of an O_APPEND file, so concurrent gates never mix lines."""
        try:
            os.makedirs(self.home.root / "log", exist_ok=True)
            fd = os.open(self.home.root / "log" / name,
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass

    def audit(self, verdict: str, step: str, subject: str, reason: str = "") -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        fields = [stamp, self.user + (" (admin)" if self.admin else ""), verdict, step,
                  subject, reason]
        self._append(AUDIT_NAME, "\t".join(" ".join(f.split())[:300] for f in fields) + "\n")

    def _refuse(self, command: str, why: str) -> Refused:
        shown = command if len(command) <= 120 else command[:117] + "..."
        return Refused(f"usergate: {shown!r} refused for user {self.user}: {why}")

    # -- the request -------------------------------------------------------------------------
    def run(self, original: str | None) -> int:
        """Serve ``original`` (SSH_ORIGINAL_COMMAND; None or "" for a login shell)."""
        command = original or ""
        try:
            return self._run(command)
        except Refused as exc:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            self._append(LOG_NAME, f"{stamp} user {self.user}: {exc}\n")
            words = command.split()
            self.audit("refused", " ".join(words[:2])[:60], command[:200],
                       str(exc).split(": ", 2)[-1])
            self.err(str(exc))
            return EXIT_REFUSED

    def _run(self, command: str) -> int:
        if not command.strip():
            raise self._refuse(command, "no shell is given; a developer's key runs "
                                        f"'{GATE_WORD} <step>' (clusterpush --master)")
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise self._refuse(command, f"it cannot be split into words ({exc})") from None
        if words[0] == "clusteradmin":
            return self._clusteradmin(command, words[1:])
        if words[0] != GATE_WORD or len(words) < 2:
            raise self._refuse(command, f"not a request of the user gate (expected "
                                        f"'{GATE_WORD} <step> ...'"
                                        + (" or 'clusteradmin ...'" if self.admin else "")
                                        + ")")
        if words[1:] == ["hello"]:
            self.audit("allowed", "hello", "")
            print(MARKER + json.dumps({"gate": PROTOCOL, "user": self.user,
                                       "admin": self.admin}), flush=True)
            return 0
        if words[1] == "modes":
            return self._modes(command, words[2:])
        return self._step(command, words[1:])

    def _clusteradmin(self, command: str, args: list[str]) -> int:
        if not self.admin:
            raise self._refuse(command, "clusteradmin is for an administrator's key "
                                        "(usergate.py --admin)")
        # argparse takes any unambiguous start of an option: --hom is --home.
        fixed = [a for a in args if a.startswith("--") and len(a.split("=", 1)[0]) > 2
                 and any(f.startswith(a.split("=", 1)[0]) for f in _ADMIN_FIXED)]
        if fixed:
            raise self._refuse(command, f"{fixed[0]!r}: the gate's home and configuration "
                                        "hold")
        self.audit("allowed", "clusteradmin", " ".join(args))
        base = ["--home", str(self.home.root)]
        if self.config is not None:
            base = ["--config", str(self.config), *base]
        return clusteradmin.main([*base, *args])

    def _modes(self, command: str, args: list[str]) -> int:
        if len(args) != 2 or args[0] != "--token" or not PUSH_TOKEN.fullmatch(args[1]):
            raise self._refuse(command, "expected modes --token <16 hex digits>")
        data = bytearray()
        while True:  # bounded: MAX_MODES_BYTES
            chunk = os.read(self.stdin_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_MODES_BYTES:
                raise self._refuse(command, f"a modes list over {MAX_MODES_BYTES} bytes")
        user_dir = self.home.users / self.user
        for folder in (self.home.users, user_dir):  # never through a link planted there
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755)
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise self._refuse(command, f"{folder} is not a directory (a symlink?)")
        try:
            fd = os.open(self._modes_path(args[1]),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            raise self._refuse(command, f"the push {args[1]} has a modes list already; "
                                        "expected a new push token") from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(bytes(data))
        self.audit("allowed", "modes", args[1])
        return 0

    def _modes_path(self, token: str) -> Path:
        return self.home.users / self.user / f".modes.{token}"

    def _step(self, command: str, words: list[str]) -> int:
        args, server = pushremote.split_server(words)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                opts = pushremote.parser().parse_args(args)
        except SystemExit:
            raise self._refuse(command, "not a step of clusterpush --master (receive, "
                                        "commit, abort, previous, wait, report, fetch, "
                                        "stop, rerun) with its options") from None
        if opts.home is not None:
            raise self._refuse(command, "--home: the gate's home holds")
        opts.home = str(self.home.root)
        step = opts.step
        subject = self._check(command, opts, server)
        if hasattr(opts, "token") and not PUSH_TOKEN.fullmatch(opts.token):
            raise self._refuse(command, f"--token {opts.token!r}: expected 16 lowercase hex "
                                        "digits")
        if step == "receive":
            server = self._receive_server(command, server)
            modes = self._modes_path(opts.token)
            opts.modes = str(modes) if modes.exists() else None
        elif server:
            raise self._refuse(command, f"{step} takes no rsync arguments")
        self.audit("allowed", step, subject)
        return pushremote.execute(opts, server, user=None if self.admin else self.user,
                                  who=f"{self.user} (clusterpush through the user gate)",
                                  config=self.config)

    def _check(self, command: str, opts: argparse.Namespace, server: list[str]) -> str:
        """Refuse what is not this user's; the request's subject, for the audit."""
        if hasattr(opts, "user"):
            if opts.user is None:
                opts.user = self.user
            elif opts.user != self.user and not self.admin:
                raise self._refuse(command, f"--user {opts.user}: this key is user "
                                            f"{self.user}'s")
        if hasattr(opts, "line"):
            try:
                spec = RunSpec.parse(opts.line, source="the request")
            except ValueError as exc:
                raise self._refuse(command, f"--line: {exc}") from None
            if spec.kind != "user" or (spec.ref != self.user and not self.admin):
                raise self._refuse(command, f"--line {opts.line!r}: this key queues only "
                                            f"'user {self.user} ...' runs")
            self._check_sweep(command, spec)
            if getattr(opts, "rsync", "rsync") != "rsync":
                raise self._refuse(command, "--rsync: the gate runs the master's rsync")
            if getattr(opts, "modes", None) is not None:
                raise self._refuse(command, "--modes: the gate keeps the modes list itself "
                                            f"({GATE_WORD} modes)")
            return opts.line
        if hasattr(opts, "run"):
            try:
                line = pushsteps.check_owner(self.home, opts.run,
                                             None if self.admin else self.user)
                spec = RunSpec.parse(line, source=f"run {opts.run}")
            except (ClusterError, ValueError) as exc:
                raise self._refuse(command, str(exc)) from None
            if opts.step == "rerun":
                self._check_sweep(command, spec)
            return opts.run
        return str(getattr(opts, "user", ""))

    def _check_sweep(self, command: str, spec: RunSpec) -> None:
        """A sweep's check script runs on the master as its account (docs/security.md):
        only a key given ``--sweeps`` (or ``--admin``) queues sweeps."""
        if "sweep" in spec.products and not self.sweeps:
            raise self._refuse(command, "a sweep's check script runs on the master: this "
                                        "key may not queue sweeps (usergate.py --sweeps)")

    def _receive_server(self, command: str, server: list[str]) -> list[str]:
        """rsync's receiving server arguments, checked, with those an ``rsync -s`` client
        sends on stdin read and put on the command line."""
        if len(server) < 2 or server[0] != "--server" or "--sender" in server:
            raise self._refuse(command, "receive runs rsync's receiving server only "
                                        "(-- --server FLAGS)")
        match = _RSYNC_FLAGS_ARG.fullmatch(server[1])
        if match is None or not set(match.group("flags")) <= RECEIVE_FLAGS:
            raise self._refuse(command, f"rsync flags {server[1]!r}: only "
                                        f"{''.join(sorted(RECEIVE_FLAGS))} are allowed")
        flags = match.group("flags")
        rest = server[2:]
        if "s" in flags:
            if rest:
                raise self._refuse(command, "rsync -s with arguments on the command line")
            try:
                rest = read_protected_args(self.stdin_fd)
            except ValueError as exc:
                raise self._refuse(command, str(exc)) from None
            flags = flags.replace("s", "")
        options = [a for a in rest if a.startswith("-")]
        paths = [a for a in rest if not a.startswith("-")]
        bad = [a for a in options if not _RECEIVE_OPTION.fullmatch(a)]
        if bad:
            raise self._refuse(command, f"rsync option {bad[0]!r}: a push's receiving "
                                        "server takes only --timeout, --max-size, --delete* "
                                        "and --stats")
        if paths != [".", "."]:
            raise self._refuse(command, "rsync must receive into '.' (the staged tree)")
        caps = match.group("caps")
        return ["--server", "-" + flags + (f"e.{caps}" if caps is not None else ""),
                *options, ".", "."]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", required=True, help="the master home (an absolute path)")
    p.add_argument("--user", required=True, help="the developer this key belongs to")
    p.add_argument("--admin", action="store_true",
                   help="an administrator: any user's runs, and clusteradmin")
    p.add_argument("--sweeps", action="store_true",
                   help="may queue sweeps (whose check scripts run on the master)")
    p.add_argument("--config", type=Path, help="the master's configuration file")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not valid_node_name(args.user):
        print(f"{PROG}: --user {args.user!r}: expected a user name (1-64 of "
              "[A-Za-z0-9._-])", file=sys.stderr)
        return EXIT_USAGE
    if not os.path.isabs(args.home) or not os.path.isdir(args.home):
        print(f"{PROG}: --home {args.home!r}: expected the master home's absolute path",
              file=sys.stderr)
        return EXIT_USAGE
    return UserGate(args.home, args.user, admin=args.admin, sweeps=args.sweeps,
                    config=args.config).run(
        os.environ.get("SSH_ORIGINAL_COMMAND"))
