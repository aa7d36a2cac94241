"""The node gate: the forced command of a restricted node's login on the master.

``bootstrap_node.py --restrict`` writes, in the master account's ``authorized_keys``::

    restrict,command="<python> <repo>/nodegate.py --home <home> --node <name>" <node's key>

so that sshd runs the gate for everything the node's key asks, with what was asked in
``SSH_ORIGINAL_COMMAND``.  The gate lets through only what a node does (see
:mod:`cluster.node.sshtransport`), each within :mod:`cluster.master.gate.gatepolicy`:

* **SFTP** (the subsystem; ``SSH_ORIGINAL_COMMAND`` is then the server's sftp command,
  ``internal-sftp`` or ``.../sftp-server``): served by the gate itself
  (:mod:`cluster.runtime.sftpserver`), each path decided by the policy: reads of the home
  but its secrets, uploads into the node's upload area, which one run's uploads may fill
  up to ``max_upload_bytes`` (read from the master's configuration, ``--config``);
* **the listing** of a tree before a fetch: exactly ``python3 -c WALK_SCRIPT <dir>
  <temp prefix>`` (:data:`cluster.node.sshtransport.WALK_SCRIPT`, the script itself, not a
  look-alike) on a folder the node may fetch as a whole; run with the master's Python;
* **rsync's sender** (``rsync --server --sender <flags> . <dir>/``, the arguments possibly
  sent on stdin with ``-s``): flags from :data:`RSYNC_FLAGS` only, ``--timeout=N`` the only
  long option, one folder the node may fetch as a whole.  With ``-L`` (``--copy-links``,
  which the node uses) rsync would follow any link in the tree, so the gate excludes, on
  the server's side where no client rule can undo it, every link in the tree that is not a
  link to a regular file inside the tree: what an honest node's listing leaves out anyway.

Anything else is refused with one line on stderr naming the command and what is allowed,
exit status 1; every refusal is also appended to ``log/nodegate.log`` in the home.

Debian's ``rrsync`` is not used for the rsync part: it confines rsync to one folder, which
cannot say "the home but its secrets", and it refuses the ``-s`` and ``-L`` a node sends.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cluster.config import DEFAULTS
from cluster.defaults import REPO_ROOT
from cluster.master.gate.gatepolicy import GateFileSystem, NodeArea
from cluster.runtime import fsutil, mirror
from cluster.runtime.sftpserver import ProtocolError, SftpServer

#: The gate's exit status when it refuses a command.
EXIT_REFUSED = 1
#: rsync's short options a node's fetch may carry (``-a`` without owner, group and devices,
#: ``-L``, ``-s``, and ``-v``); ``k``/``K`` (following links to folders) and the rest are
#: refused.
RSYNC_FLAGS = frozenset("lLtprogDsv")
#: The compact flags argument: options, then rsync's ``e.<capabilities>``.
_RSYNC_FLAGS_ARG = re.compile(r"-(?P<flags>[A-Za-z]+?)(?:e\.(?P<caps>[A-Za-z]*))?")
#: The one long option a node's fetch sends to the sender.
_RSYNC_TIMEOUT = re.compile(r"--timeout=[0-9]{1,6}")
#: Most bytes of the arguments an ``rsync -s`` client sends on stdin.
MAX_PROTECTED_ARGS = 64 * 1024
#: Most entries of a fetched tree the gate looks at for links (a bound on its walk).
MAX_ENTRIES = 2_000_000
#: Most bytes of the exclude rules the gate puts on rsync's command line (the kernel's
#: limit on a command line is 2 MiB).
MAX_RULE_BYTES = 1024 * 1024
#: The gate's log in the home.
LOG_NAME = "nodegate.log"


class GateRefusal(Exception):
    """A command the gate does not let through; the message is the one line said."""


def gate_command(home: Path | str, node: str, *, python: str = sys.executable,
                 repo: Path = REPO_ROOT, config: Path | str | None = None) -> str:
    """The forced command for node ``node`` (a shell line, as sshd runs it); with
    ``config``, the master's configuration file the gate reads its bound from
    (``max_upload_bytes``; without, the default)."""
    argv = [python, str(Path(repo) / "nodegate.py"), "--home", str(home), "--node", node]
    if config is not None:
        argv += ["--config", os.path.abspath(config)]
    return shlex.join(argv)


def user_gate_command(home: Path | str, user: str, *, admin: bool = False,
                      sweeps: bool = False, python: str = sys.executable, repo: Path = REPO_ROOT,
                      config: Path | str | None = None) -> str:
    """The forced command of developer ``user``'s key: the user gate
    (:mod:`cluster.cli.usergate`), ``--admin`` for an administrator."""
    argv = [python, str(Path(repo) / "usergate.py"), "--home", str(home), "--user", user]
    if admin:
        argv.append("--admin")
    if sweeps:
        argv.append("--sweeps")
    if config is not None:
        argv += ["--config", os.path.abspath(config)]
    return shlex.join(argv)


def authorized_line(command: str, public_key: str) -> str:
    """The ``authorized_keys`` line that limits ``public_key`` (``type base64 [comment]``)
    to ``command``: ``restrict`` (no forwarding, no pty, no agent, no X11, no user rc) and
    the forced command, quoted for sshd (``"`` and ``\\`` escaped)."""
    fields = public_key.split()
    if len(fields) < 2 or not _KEY_TYPE.fullmatch(fields[0]):
        raise ValueError(f"{public_key.strip()[:60]!r} is not a public key line (type, "
                         "base64, comment)")
    quoted = command.replace("\\", "\\\\").replace('"', '\\"')
    return f'restrict,command="{quoted}" {" ".join(fields)}'


_KEY_TYPE = re.compile(r"(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp[0-9]+|"
                       r"sk-[a-z0-9-]+@openssh\.com)(-cert-v01@openssh\.com)?")


def _key_blob(line: str) -> str | None:
    """The base64 key of an authorized_keys line (after its options), or None."""
    try:
        words = shlex.split(line, comments=False, posix=True)
    except ValueError:
        words = line.split()
    for i, word in enumerate(words[:-1]):
        if _KEY_TYPE.fullmatch(word):
            return words[i + 1]
    return None


def authorize(authorized_keys: Path, line: str) -> str:
    """Make ``line`` the one line of ``authorized_keys`` for its key: added if the key is
    not there, put in place of the key's other lines (an unrestricted line would let the
    key past the gate: sshd takes the first line that matches), kept if it is there alone.
    The file is rewritten atomically, mode 0600.  Returns "added", "replaced" or
    "unchanged"."""
    blob = _key_blob(line)
    if blob is None:
        raise ValueError(f"{line[:60]!r} carries no public key")
    try:
        have = authorized_keys.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        have = []
    same = [x for x in have if _key_blob(x) == blob]
    if same == [line]:
        return "unchanged"
    kept = [x for x in have if _key_blob(x) != blob]
    authorized_keys.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fsutil.atomic_write(authorized_keys, "".join(x + "\n" for x in [*kept, line]), mode=0o600)
    return "replaced" if same else "added"


# ----------------------------------------------------------------------------------------------
# The gate

class Gate:
    """The forced command for node ``node`` in the master home ``home``; :meth:`run` takes
    ``SSH_ORIGINAL_COMMAND`` and serves or refuses it.  ``exec`` replaces the process (a
    test passes a recorder)."""

    def __init__(self, home: Path | str, node: str, *,
                 execv: Callable[[str, list[str]], object] = os.execv,
                 err: Callable[[str], None] | None = None,
                 max_upload_bytes: int = DEFAULTS.max_upload_bytes) -> None:
        self.area = NodeArea(home, node)
        self.node = node
        self.max_upload_bytes = max_upload_bytes
        self.execv = execv
        self.err = err or (lambda line: print(line, file=sys.stderr, flush=True))

    def log(self, line: str) -> None:
        """Append one line to ``log/nodegate.log`` in the home (best effort: a gate that
        cannot log still refuses)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(os.path.join(self.area.home, "log", LOG_NAME), "a",
                      encoding="utf-8") as fh:
                fh.write(f"{stamp} node {self.node}: {line}\n")
        except OSError:
            pass

    def run(self, original: str | None) -> int:
        """Serve ``original`` (SSH_ORIGINAL_COMMAND; None or "" for a login shell)."""
        try:
            return self._run(original or "")
        except GateRefusal as exc:
            self.log(str(exc))
            self.err(str(exc))
            return EXIT_REFUSED

    def _refuse(self, command: str, why: str) -> GateRefusal:
        shown = command if len(command) <= 120 else command[:117] + "..."
        return GateRefusal(
            f"nodegate: {shown!r} refused for node {self.node}: {why}; a node's login "
            "allows only SFTP, the listing of a tree (python3 -c WALK_SCRIPT) and rsync's "
            f"sender (rsync --server --sender), and {self.area.what_is_allowed()}")

    def _run(self, command: str) -> int:
        if not command.strip():
            raise self._refuse(command, "no shell is given")
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise self._refuse(command, f"it cannot be split into words ({exc})") from None
        if argv[0] == "internal-sftp" or os.path.basename(argv[0]) == "sftp-server":
            return self.sftp()
        if argv[:2] == ["rsync", "--server"]:
            return self.rsync(command, argv)
        if argv[:2] == ["python3", "-c"]:
            return self.listing(command, argv)
        raise self._refuse(command, "not a command a node runs")

    # -- SFTP --------------------------------------------------------------------------------
    def sftp(self) -> int:
        """Serve SFTP on stdin/stdout until the node closes it."""
        server = SftpServer(GateFileSystem(self.area, max_upload_bytes=self.max_upload_bytes),
                            0, 1, log=self.log)
        try:
            server.serve()
        except ProtocolError as exc:
            self.log(f"SFTP session ended: {exc}")
            return EXIT_REFUSED
        except (BrokenPipeError, ConnectionResetError):
            pass  # the node went away
        return 0

    # -- the listing -------------------------------------------------------------------------
    def listing(self, command: str, argv: list[str]) -> int:
        # Here, not at the top: the node's transport imports paramiko (a quarter second).
        from cluster.node.sshtransport import WALK_SCRIPT

        if len(argv) != 5 or argv[2] != WALK_SCRIPT or argv[4] != mirror.TEMP_PREFIX:
            raise self._refuse(command, "a python3 -c that is not the node's listing script "
                                        "with a folder and the mirror's temporary prefix")
        self._tree(command, argv[3])
        self.execv(sys.executable, [sys.executable, "-c", WALK_SCRIPT, argv[3], argv[4]])
        return 0  # only when execv was a test's recorder

    def _tree(self, command: str, path: str) -> str:
        """The real path of the folder ``path`` (relative: to the login folder), if the node
        may list or fetch it as a whole."""
        real = os.path.realpath(path)
        why = self.area.tree_verdict(real)
        if why is not None:
            raise self._refuse(command, f"{path}: {why}")
        return real

    # -- rsync -------------------------------------------------------------------------------
    def rsync(self, command: str, argv: list[str]) -> int:
        """Check a node's ``rsync --server --sender ...`` and run it, without ``-s`` (the
        arguments read from stdin are passed on the command line, never through a shell)
        and with the excludes of the tree's outward links when ``-L`` is given."""
        if argv[:3] != ["rsync", "--server", "--sender"] or len(argv) < 4:
            raise self._refuse(command, "rsync only as the sender (a node only fetches)")
        match = _RSYNC_FLAGS_ARG.fullmatch(argv[3])
        if match is None or not set(match.group("flags")) <= RSYNC_FLAGS:
            raise self._refuse(command, f"rsync flags {argv[3]!r}: only "
                                        f"{''.join(sorted(RSYNC_FLAGS))} are allowed")
        flags = match.group("flags")
        rest = argv[4:]
        if "s" in flags:
            if rest:
                raise self._refuse(command, "rsync -s with arguments on the command line")
            rest = self._protected_args(command)
            flags = flags.replace("s", "")
        options = [a for a in rest if a.startswith("-")]
        paths = [a for a in rest if not a.startswith("-")]
        bad = [a for a in options if not _RSYNC_TIMEOUT.fullmatch(a)]
        if bad:
            raise self._refuse(command, f"rsync option {bad[0]!r}: only --timeout=N is "
                                        "allowed")
        if len(paths) != 2 or paths[0] != "." or not paths[1].endswith("/"):
            raise self._refuse(command, "rsync must send one folder (. <dir>/)")
        real = self._tree(command, paths[1])
        excludes: list[str] = []
        if "L" in flags:
            excludes = self._outward_links(command, real)
        args = ["rsync", "--server", "--sender",
                "-" + flags + (f"e.{match.group('caps')}" if match.group("caps") is not None
                               else ""), *options]
        # On the command line (each rule one word, never split or read as a file): rules
        # given to the server come before the client's, and rsync's first match wins.
        args += [f"--exclude={rule}" for rule in excludes]
        args += [".", paths[1]]
        rsync = shutil.which("rsync") or "/usr/bin/rsync"
        self.execv(rsync, args)
        return 0  # only when execv was a test's recorder

    def _protected_args(self, command: str) -> list[str]:
        """The arguments an ``rsync -s`` client sends first on stdin
        (:func:`read_protected_args`)."""
        try:
            return read_protected_args()
        except ValueError as exc:
            raise self._refuse(command, str(exc)) from None

    def _outward_links(self, command: str, root: str) -> list[str]:
        """The anchored rsync rules excluding every link in the tree ``root`` that is not a
        link to a regular file inside it (what WALK_SCRIPT marks ``L`` or ``N``)."""
        rules: list[str] = []
        stack = [""]
        seen = size = 0
        while stack:  # bounded: links are never descended, so each folder once
            prefix = stack.pop()
            try:
                it = os.scandir(os.path.join(root, prefix) if prefix else root)
            except OSError:
                continue  # vanished or unreadable: rsync says so itself
            with it:
                for entry in it:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        raise self._refuse(command, f"the tree has more than {MAX_ENTRIES} "
                                                    "entries")
                    rel = prefix + entry.name
                    if entry.is_symlink():
                        if not _link_inside(entry.path, root):
                            rules.append(mirror.anchored(rel))
                            size += len(rules[-1]) + 12
                            if size > MAX_RULE_BYTES:
                                raise self._refuse(command, "the tree has too many links "
                                                            "out of it to exclude")
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(rel + "/")
        return rules


def read_protected_args(fd: int = 0) -> list[str]:
    """The arguments an ``rsync -s`` client sends first on ``fd``: NUL-terminated words,
    ``rsync`` first, ended by an empty one; returned without that first word.  Read a byte
    at a time, so that what follows (the protocol) is left for the rsync started next.
    ValueError saying what was wrong."""
    data = bytearray()
    while len(data) < MAX_PROTECTED_ARGS:  # bounded
        byte = os.read(fd, 1)
        if not byte:
            raise ValueError("the stream ended inside rsync's arguments")
        data += byte
        if data.endswith(b"\0\0"):
            words = [os.fsdecode(w) for w in bytes(data[:-2]).split(b"\0")]
            if not words or words[0] != "rsync":
                raise ValueError("rsync's arguments on stdin do not start with rsync")
            return words[1:]
    raise ValueError(f"rsync's arguments on stdin exceed {MAX_PROTECTED_ARGS} bytes")


def _link_inside(link: str, root: str) -> bool:
    """Whether the link ``link`` leads to a regular file inside the real folder ``root``."""
    target = os.path.realpath(link)
    if not (target == root or target.startswith(root.rstrip("/") + "/")):
        return False
    try:
        return stat.S_ISREG(os.stat(target).st_mode)
    except OSError:
        return False

