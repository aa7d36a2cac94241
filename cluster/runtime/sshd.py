"""A private OpenSSH server: the master's sshd for tests and ``localcluster --transport ssh``.

:class:`PrivateSshd` runs Debian's ``/usr/sbin/sshd`` in the foreground on one address and
port, with everything it needs kept inside one directory ``root`` that the caller owns:

* ``root/ssh_host_ed25519_key`` (and ``.pub``): the host key, generated with ``ssh-keygen``
  the first time and reused afterwards (a restart keeps the server's identity; delete the
  two files before :meth:`PrivateSshd.start` to give the server a new one);
* ``root/client_key`` (and ``.pub``): an ed25519 key the clients log in with, authorised in
  ``root/authorized_keys`` (:meth:`PrivateSshd.authorize` adds more keys);
* ``root/known_hosts``: one line for ``[address]:port`` (``address`` alone on port 22) with
  the host key, for the client side's ``StrictHostKeyChecking``;
* ``root/sshd_config``: only ``user`` may log in, only with a key in ``authorized_keys``
  (no passwords, no keyboard-interactive, no forwarding), sftp served in-process
  (``internal-sftp``);
* ``root/sshd.log``: the server's log (``-e``, verbose: every connection and refusal).

sshd itself requires its privilege-separation directory ``/run/sshd``; it is created if
missing (0755, as the Debian package does).  Nothing else outside ``root`` is touched.

With ``netns`` the server runs inside that network namespace (``ip netns exec NAME``); the
caller creates and removes the namespace.  Port 0 picks a free port (inside the namespace
when there is one).  :meth:`PrivateSshd.start` returns once the server listens (bounded);
:meth:`PrivateSshd.stop` ends the server and the connections it serves, and reaps it.
A context manager: ``with PrivateSshd(tmp) as sshd: ...``.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import psutil

from cluster.errors import ClusterError
from cluster.runtime import proc

#: The OpenSSH server (Debian's openssh-server); it must be run by its absolute path
#: (it re-executes itself for every connection).
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
#: sshd's privilege-separation directory (compiled into Debian's sshd).
PRIVSEP_DIR = Path("/run/sshd")
#: How long a stopped server has after SIGTERM before SIGKILL [seconds].
STOP_GRACE = 5.0
#: The line sshd logs once its socket listens (``-e``: on stderr, which goes to the log).
LISTENING = "Server listening on"
#: How often :meth:`PrivateSshd.start` looks whether the server listens [seconds].
POLL = 0.05
#: Tries to start on a port 0 picked free that another process took meanwhile.
PORT_TRIES = 5


class SshdError(ClusterError):
    """The private sshd could not be set up, started or did not listen in time."""


def fingerprint(public_line: str) -> str:
    """The ``SHA256:...`` fingerprint (as ``ssh-keygen -l`` prints it) of a public key line
    (``ssh-ed25519 AAAA... comment``)."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The host name a known_hosts line needs for ``address:port`` (``[a]:p``, or ``a``
    on port 22), as OpenSSH and paramiko look it up."""
    return address if port == 22 else f"[{address}]:{port}"


class PrivateSshd:
    """One private sshd (see the module docstring).

    Attributes once constructed: ``root``, ``address``, ``port`` (the real one after
    :meth:`start` when 0 was asked for), ``user``, ``netns``, ``host_key``, ``client_key``
    (a private key file the clients use), ``authorized_keys``, ``known_hosts``,
    ``config``, ``log_path``; after :meth:`start`: ``host_fingerprint`` (``SHA256:...``)
    and ``host_public`` (the host key's public line).
    """

    def __init__(self, root: Path, *, address: str = "127.0.0.1", port: int = 0,
                 user: str | None = None, netns: str | None = None) -> None:
        if not 0 <= port <= 65535:
            raise SshdError(f"private sshd: port {port} is not 0 (pick one) or a TCP port")
        self.root = Path(root).resolve()
        self.address = address
        self.port = port
        self.user = user or getpass.getuser()
        self.netns = netns
        self.host_key = self.root / "ssh_host_ed25519_key"
        self.client_key = self.root / "client_key"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.config = self.root / "sshd_config"
        self.log_path = self.root / "sshd.log"
        self.host_public = ""
        self.host_fingerprint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._asked_port = port

    def __repr__(self) -> str:
        where = f" in netns {self.netns}" if self.netns else ""
        return f"PrivateSshd({self.address}:{self.port}{where}, root={str(self.root)!r})"

    # -- set-up --------------------------------------------------------------------------------
    def _keygen(self, path: Path, comment: str) -> None:
        if path.exists() and path.with_suffix(".pub").exists():
            return
        for stale in (path, path.with_suffix(".pub")):
            stale.unlink(missing_ok=True)
        done = proc.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment,
                         "-f", str(path)], timeout=60)
        try:
            done.check(f"ssh-keygen for {path}", 60)
        except proc.ProcessError as exc:
            raise SshdError(f"private sshd: cannot make key {path}: {exc}") from None

    def authorize(self, public_key: str | Path) -> None:
        """Let the holder of ``public_key`` (a public key line, or a ``.pub`` file) log in;
        takes effect for the next connection, also while the server runs."""
        line = (Path(public_key).read_text(encoding="utf-8")
                if isinstance(public_key, Path) else public_key).strip()
        if len(line.split()) < 2 or "\n" in line:
            raise SshdError(f"private sshd: {public_key!r} is not one public key line")
        have = (self.authorized_keys.read_text(encoding="utf-8").splitlines()
                if self.authorized_keys.exists() else [])
        if line not in have:
            with open(self.authorized_keys, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # sshd refuses to start without its privilege-separation directory.
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._keygen(self.host_key, f"private-sshd-host@{self.address}")
        self._keygen(self.client_key, f"private-sshd-client@{self.address}")
        self.authorize(self.client_key.with_suffix(".pub"))
        self.host_public = " ".join(
            self.host_key.with_suffix(".pub").read_text(encoding="utf-8").split()[:2])
        self.host_fingerprint = fingerprint(self.host_public)

    def _write_config(self) -> None:
        root_login = "prohibit-password" if self.user == "root" else "no"
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            f"HostKey {self.host_key}",
            "PidFile none",
            f"AuthorizedKeysFile {self.authorized_keys}",
            # Our files live in a test's or a home's directory, whose modes sshd's owner
            # checks were not made for; authorized_keys is ours alone anyway.
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            f"PermitRootLogin {root_login}",
            f"AllowUsers {self.user}",
            # PAM: without it sshd refuses an account whose password is locked ("!"), as
            # useradd leaves a service account.
            "UsePAM yes",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PermitTunnel no",
            "PrintMotd no",
            "PrintLastLog no",
            # Many nodes connect at once at the start of a run.
            "MaxStartups 200:30:400",
            "MaxSessions 50",
            "ClientAliveInterval 15",
            "ClientAliveCountMax 4",
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
        ]
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _write_known_hosts(self) -> None:
        self.known_hosts.write_text(
            f"{known_hosts_name(self.address, self.port)} {self.host_public}\n", encoding="utf-8")

    def _netns_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def _free_port(self) -> int:
        """A port free on ``address`` now (in the namespace, if any)."""
        if not self.netns:
            family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((self.address, 0))
                return int(s.getsockname()[1])
        code = ("import socket,sys;a=sys.argv[1];"
                "s=socket.socket(socket.AF_INET6 if ':' in a else socket.AF_INET);"
                "s.bind((a,0));print(s.getsockname()[1])")
        done = proc.run([*self._netns_prefix(), "python3", "-c", code, self.address],
                        timeout=30)
        try:
            return int(done.check(f"finding a free port in netns {self.netns}", 30).text())
        except (proc.ProcessError, ValueError) as exc:
            raise SshdError(f"private sshd: no free port on {self.address} in netns "
                            f"{self.netns}: {exc}") from None

    # -- run -----------------------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> PrivateSshd:
        """Set up ``root``, start sshd and return once it listens (SshdError otherwise,
        with the tail of its log).  Returns self."""
        if self._proc is not None:
            raise SshdError(f"{self!r} is already running")
        self._prepare()
        tries = PORT_TRIES if self._asked_port == 0 else 1
        for attempt in range(1, tries + 1):
            self.port = self._asked_port or self._free_port()
            self._write_config()
            self._write_known_hosts()
            try:
                self._spawn_and_wait(timeout)
                return self
            except SshdError:
                in_use = "Address already in use" in self._log_tail()
                if not (in_use and attempt < tries):
                    raise
        raise AssertionError("unreachable: the last try re-raises")  # pragma: no cover

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def _spawn_and_wait(self, timeout: float) -> None:
        # Test the configuration first: a bad one should fail with sshd's own words.
        check = proc.run([SSHD, "-t", "-f", str(self.config)], timeout=30)
        if not check.ok:
            raise SshdError(f"private sshd: {self.config} is refused by sshd -t: "
                            f"{check.text('stderr').strip()}")
        # Where this start's lines begin: the log is appended to across restarts.
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            argv = [*self._netns_prefix(), SSHD, "-D", "-e", "-f", str(self.config)]
            self._proc = proc.spawn(argv, stdout=log, stderr=log)
        listening = f"{LISTENING} {self.address} port {self.port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                status = proc.describe_status(self._proc.returncode)
                self._proc = None
                raise SshdError(f"private sshd on {self.address}:{self.port} exited "
                                f"({status}); its log {self.log_path} ends:\n{self._log_tail()}")
            if self._listening(listening, start):
                return
            time.sleep(POLL)
        self.stop()
        raise SshdError(f"private sshd on {self.address}:{self.port} did not listen within "
                        f"{timeout:g} s; its log {self.log_path} ends:\n{self._log_tail()}")

    def _listening(self, line: str, start: int) -> bool:
        with open(self.log_path, "rb") as fh:
            fh.seek(start)
            if line.encode() not in fh.read():
                return False
        if self.netns:
            return True  # the log line is the proof: we cannot connect from out here
        try:
            with socket.create_connection((self.address, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        """True while the server process lives."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """End the server and every connection it serves (their sshd processes left its
        process group, so they are found as its descendants), and reap it.  Idempotent."""
        if self._proc is None:
            return
        pid = self._proc.pid
        try:
            children = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            children = []
        proc.kill_tree(pid, signal.SIGTERM)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        try:
            self._proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill_tree(pid, signal.SIGKILL)
            self._proc.wait(timeout=STOP_GRACE)
        _gone, alive = psutil.wait_procs(children, timeout=STOP_GRACE)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        self._proc = None

    def __enter__(self) -> PrivateSshd:
        return self.start() if self._proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
