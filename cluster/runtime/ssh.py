"""ssh to another machine: one way to connect, run a command, copy a file, build an rsync.

Everything the cluster does over ssh goes through here (the node's ssh transport,
bootstrapping a node, clusterpush from a developer's machine), so that host keys are checked
one way and failures read the same everywhere.

* :class:`SshTarget` names a server: host, port, user, the private key to log in with and the
  known_hosts file its host key must be in.
* :func:`connect` opens a paramiko connection.  The server's host key is checked against
  ``target.known_hosts`` **only** (loaded into a fresh client; the system's known_hosts files
  are never consulted unless that is the file given) and an unknown or changed key is
  refused, never accepted or recorded.  Failures raise :class:`~cluster.errors.SshError`
  whose ``kind`` says why (see there) and whose message names ``user@host:port`` and, for a
  host key, its type and SHA256 fingerprint as ``ssh-keygen -l`` prints it.  Only
  "unreachable" is retried, with exponential backoff capped at :data:`BACKOFF_CAP`; a
  connection that closes during the login is "unreachable", only the server's refusal is
  "auth" (:func:`login_failure_kind`).
* :func:`run_command` / :func:`exec_bytes` run one command on a connection, bounded.
* :func:`ssh_command` is the OpenSSH client argv with the same checks (for ``rsync -e`` and
  subprocesses); :func:`rsync_argv` an rsync over it; :func:`remote_spec` the ``host:path``
  argument.
* :func:`put_atomic` uploads a file over SFTP to a temporary name (named as
  :func:`cluster.runtime.fsutil.temp_file` names its files, so the master's clean-up
  recognises a leftover one), then renames it over the target with ``posix-rename``: a reader
  on the server never sees a partial file.
"""

from __future__ import annotations

import base64
import errno
import getpass
import hashlib
import logging
import os
import secrets
import select
import shlex
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NoReturn

import paramiko
from paramiko.sftp import CMD_EXTENDED

from cluster.errors import SshError
from cluster.runtime import fsutil

log = logging.getLogger("cluster.ssh")

#: Longest pause between two tries of an unreachable server [seconds].
BACKOFF_CAP = 30.0
#: Keepalive interval on an open connection [seconds]: a dead link is noticed by the next
#: write instead of hanging until TCP gives up.
KEEPALIVE = 15
#: Upload chunk size [bytes].
CHUNK = 256 * 1024
#: How often run_command looks at a command that produced no output [seconds].
COMMAND_POLL = 0.05
_TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"


@dataclass(frozen=True)
class SshTarget:
    """An ssh server and how to log in to it.

    ``user`` "" = the server's default for us (OpenSSH: our local user name); ``key`` "" =
    ssh's usual keys (``~/.ssh/id_*`` and an agent); ``known_hosts`` None =
    ``~/.ssh/known_hosts`` of the user running this (the only file consulted either way).
    """

    host: str
    port: int = 22
    user: str = ""
    key: str = ""
    known_hosts: Path | None = None

    def destination(self) -> str:
        """``user@host`` or ``host`` (as ssh and rsync take it)."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def where(self) -> str:
        """``[user@]host:port``, for messages."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"

    def known_hosts_file(self) -> Path:
        """The known_hosts file in force (``~`` expanded)."""
        return Path(os.path.expanduser(str(self.known_hosts or "~/.ssh/known_hosts")))

    def host_key_name(self) -> str:
        """The name the server's key is recorded under: ``host``, or ``[host]:port`` when
        the port is not 22 (as OpenSSH writes and paramiko looks up)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def login_name(self) -> str:
        """The user name paramiko logs in as (``user``, or our own name)."""
        return self.user or getpass.getuser()


def key_fingerprint(key: paramiko.PKey) -> str:
    """``ssh-ed25519 SHA256:...``: a key's type and fingerprint as ``ssh-keygen -l``."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _RefuseUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, with our message: names the host, the fingerprint and the
    file the key is not in."""

    def __init__(self, target: SshTarget, known_hosts: Path, loaded: bool) -> None:
        self.target = target
        self.known_hosts = known_hosts
        self.loaded = loaded

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> NoReturn:
        absent = "" if self.loaded else " (that file does not exist)"
        raise SshError("hostkey-unknown", self.target.where(),
                       f"host key of {hostname} ({key_fingerprint(key)}) is not in "
                       f"{self.known_hosts}{absent}: refused; if this is the right key, add "
                       f"it to that file (e.g. from the server's ssh_host_*_key.pub)")


def connect(target: SshTarget, *, timeout: float = 15.0, retries: int = 1,
            delay: float = 1.0, deadline: float | None = None) -> paramiko.SSHClient:
    """An open, authenticated paramiko connection to ``target``.

    ``timeout`` bounds each phase (TCP connect, banner, authentication) [seconds].
    ``retries`` is the number of tries (at least 1); only an "unreachable" failure is tried
    again, after ``delay`` seconds doubled on each try and capped at :data:`BACKOFF_CAP`.
    ``deadline`` (``time.monotonic()``; None: none) ends the tries sooner: no pause is
    begun that would end past it, so a caller's own bound on its retries (the node's
    ``ssh_retry_time``) holds for the connects made within it too.
    Raises :class:`~cluster.errors.SshError` (see the module docstring); never a paramiko or
    socket exception.
    """
    tries = max(1, retries)
    pause = max(0.0, delay)
    for attempt in range(1, tries + 1):
        try:
            return _connect_once(target, timeout)
        except SshError as exc:
            late = deadline is not None and time.monotonic() + pause > deadline
            if exc.kind != "unreachable" or attempt == tries or late:
                if exc.kind == "unreachable" and attempt > 1:
                    raise SshError(exc.kind, exc.where,
                                   f"{exc.reason} (gave up after {attempt} tries)") from None
                raise
            log.warning("%s; try %d of %d again in %g s", exc, attempt, tries, pause)
            time.sleep(pause)
            pause = min(pause * 2, BACKOFF_CAP) if pause else 0.0
    raise AssertionError("unreachable: the last try returns or raises")  # pragma: no cover


def _connect_once(target: SshTarget, timeout: float) -> paramiko.SSHClient:
    where = target.where()
    known_hosts = target.known_hosts_file()
    client = paramiko.SSHClient()
    loaded = False
    try:
        client.load_host_keys(str(known_hosts))
        loaded = True
    except FileNotFoundError:
        pass  # every key is unknown then; the refusal says the file is missing
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise SshError("hostkey-unknown", where,
                       f"cannot read known_hosts file {known_hosts}: {exc}") from None
    client.set_missing_host_key_policy(_RefuseUnknown(target, known_hosts, loaded))
    key_args: dict[str, object] = {}
    if target.key:
        key = os.path.expanduser(target.key)
        if not os.access(key, os.R_OK):
            raise SshError("auth", where, f"private key {key} does not exist or cannot be "
                                          "read")
        key_args = {"key_filename": [key], "look_for_keys": False, "allow_agent": False}
    try:
        client.connect(target.host, port=target.port, username=target.login_name(),
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                       transport_factory=_Transport, **key_args)  # type: ignore[arg-type]
    except SshError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise SshError("hostkey-changed", where,
                       f"host key of {target.host_key_name()} ({key_fingerprint(exc.key)}) "
                       f"does not match the key recorded in {known_hosts} "
                       f"({key_fingerprint(exc.expected_key)}): refused (possible "
                       "man-in-the-middle; if the server's key really changed, replace its "
                       "line in that file)") from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise SshError("auth", where, f"private key {target.key} needs a passphrase; the "
                                      "cluster logs in unattended: use a key without "
                                      "one") from None
    except paramiko.AuthenticationException as exc:
        transport = client.get_transport()
        kind = login_failure_kind(exc, transport)
        client.close()
        which = f"key {target.key}" if target.key else "our keys (~/.ssh/id_*, agent)"
        if kind == "unreachable":
            raise SshError(kind, where, f"cannot reach the server: the connection was lost "
                                        f"during the login as {target.login_name()} "
                                        f"({exc})") from None
        said = f" (the server ended the login: {transport.disconnect})" \
            if isinstance(transport, _Transport) and transport.disconnect else ""
        raise SshError("auth", where, f"login as {target.login_name()} with {which} "
                                      f"refused: {exc}{said}") from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        client.close()
        kind = classify(exc)
        raise SshError(kind, where, _describe(exc, kind)) from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(KEEPALIVE)
    return client


class _Transport(paramiko.Transport):
    """paramiko's Transport, remembering the server's SSH_MSG_DISCONNECT (paramiko only
    logs it): a server that ends a login with words of its own ("Too many authentication
    failures") has refused it, while a connection that merely closed has not."""

    disconnect = ""

    def _parse_disconnect(self, m: paramiko.Message) -> None:
        code = m.get_int()
        self.disconnect = f"{m.get_text()} (code {code})"
        log.debug("server disconnected: %s", self.disconnect)


def login_failure_kind(exc: paramiko.AuthenticationException,
                       transport: paramiko.Transport | None) -> str:
    """The SshError kind of a login that raised ``exc`` on ``transport``: "auth" only when
    the server refused, else "unreachable" (worth a retry).

    paramiko raises AuthenticationException for three different things (see its
    ``AuthHandler.wait_for_response``): the server's answer USERAUTH_FAILURE for the keys
    offered ("Authentication failed.", or BadAuthenticationType when the server does not
    take public keys at all), after which the connection is still open; no answer within
    ``auth_timeout`` ("Authentication timeout."); and a connection that closed while the
    login waited ("transport shut down or saw EOF": a link cut, an sshd killed or
    restarting).  Only the first is a refusal; the connection's state tells a closed one
    apart (paramiko's words only split a timeout from "failed", both on an open
    connection).  A server that closes the connection with a DISCONNECT message of its
    own (OpenSSH's "Too many authentication failures") refused too.
    """
    if isinstance(exc, (paramiko.BadAuthenticationType, paramiko.PasswordRequiredException)):
        return "auth"
    if transport is not None and transport.is_active():
        # Still connected: either the server answered "failed", or it said nothing at all
        # within auth_timeout (a stalled link or a swamped server: try again).
        return "unreachable" if "timeout" in str(exc).lower() else "auth"
    if isinstance(transport, _Transport) and transport.disconnect:
        return "auth"
    return "unreachable"


def classify(exc: BaseException) -> str:
    """The SshError kind of a paramiko/socket failure on a connection: "unreachable" for a
    connection that could not be made or was lost (worth a retry), else "protocol"."""
    if isinstance(exc, SshError):
        return exc.kind
    if isinstance(exc, (OSError, EOFError)):
        return "unreachable"  # refused, reset, timed out, no route, unknown name, closed
    text = str(exc)
    # paramiko says this when the TCP connection closed or stalled before the ssh
    # greeting (a server starting, its MaxStartups, a link going down): transient.
    if "Error reading SSH protocol banner" in text or "connection dropped" in text.lower() \
            or "Socket is closed" in text or "not active" in text.lower():
        return "unreachable"
    return "protocol"


def _describe(exc: BaseException, kind: str) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        # Its own text ("[Errno None] Unable to connect ...") hides the reason per address.
        text = "; ".join(f"{addr[0]} port {addr[1]}: {getattr(err, 'strerror', None) or err}"
                         for addr, err in exc.errors.items()) or text
    if kind == "unreachable":
        return f"cannot reach the server: {text}"
    return f"the server broke the ssh protocol: {text}"


# ----------------------------------------------------------------------------------------------
# Commands

def exec_bytes(client: paramiko.SSHClient, command: str, timeout: float, *,
               input: bytes | None = None,
               on_out: Callable[[bytes], None] | None = None) -> tuple[int, bytes, bytes]:
    """Run ``command`` (a shell line for the remote user's shell) and return its exit status
    and raw output.  ``input`` is sent to its stdin, which is then closed.  ``on_out``
    takes the standard output as it comes instead (then none is returned).

    Raises SshError "unreachable" if the connection is gone or lost meanwhile, or if the
    command's channel closed without an exit status (the session was cut after the login:
    its sshd process killed, the link lost; paramiko also reports a command killed by a
    signal so, as it ignores ``exit-signal``): a caller retries such a command on a new
    connection.  "timeout" (the command's channel closed) if it runs longer than
    ``timeout`` seconds.  The status returned is always one the server sent (0-255).
    """
    transport = client.get_transport()
    where = _peer(client)
    # Messages name the command by its start: a script passed with -c can be pages long.
    label = repr(command if len(command) <= 80 else command[:77] + "...")
    if transport is None or not transport.is_active():
        raise SshError("unreachable", where, f"connection closed before running {label}")
    deadline = time.monotonic() + timeout
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        chan = transport.open_session(timeout=timeout)
        try:
            chan.settimeout(timeout)
            chan.exec_command(command)
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            chan.settimeout(0.0)
            while True:
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(65536)
                    if on_out is None:
                        out.append(chunk)
                    else:
                        on_out(chunk)
                    got = True
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(65536))
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    # Output that raced with the exit status is drained above first.
                    status = chan.recv_exit_status()
                    if status == -1:
                        # paramiko's value for "none came": the channel closed (or the
                        # transport died) before the server sent exit-status, which it
                        # sends as an unsigned number, so -1 is never the command's own.
                        lost = "connection lost" if not transport.is_active() else \
                            "channel closed without an exit status"
                        raise SshError("unreachable", where,
                                       f"{lost} while running {label} (session cut, "
                                       "or the command killed by a signal)")
                    break
                if not transport.is_active():
                    raise SshError("unreachable", where,
                                   f"connection lost while running {label}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SshError("timeout", where,
                                   f"{label} still ran after {timeout:g} s; abandoned")
                if not got:
                    select.select([chan], [], [], min(COMMAND_POLL, left))
        finally:
            chan.close()
    except SshError:
        raise
    except (paramiko.SSHException, EOFError, OSError) as exc:
        kind = classify(exc)
        raise SshError(kind, where, f"running {label}: {_describe(exc, kind)}") from None
    return status, b"".join(out), b"".join(err)


def run_command(client: paramiko.SSHClient, command: str, timeout: float
                ) -> tuple[int, str, str]:
    """:func:`exec_bytes` with the output decoded as UTF-8 (bad bytes replaced)."""
    status, out, err = exec_bytes(client, command, timeout)
    return status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _peer(client: paramiko.SSHClient) -> str:
    transport = client.get_transport()
    try:
        host, port = transport.getpeername()[:2] if transport is not None else ("?", 0)
    except OSError:
        return "(closed connection)"
    return f"{host}:{port}"


# ----------------------------------------------------------------------------------------------
# OpenSSH and rsync command lines

def _ssh_option_path(path: str) -> str:
    """A path as an ssh ``-o`` value or ``-i`` argument: ssh expands ``%`` tokens in those
    (so ``%`` is doubled) and splits a value on blanks (so one with a blank is quoted)."""
    path = path.replace("%", "%%")
    return f'"{path}"' if any(c.isspace() for c in path) else path


def ssh_command(target: SshTarget) -> list[str]:
    """The OpenSSH client argv (without the destination) that checks what :func:`connect`
    checks: our key only (if one is set), host key in ``target``'s known_hosts only,
    refused if unknown or changed, never a prompt (BatchMode), no user or system
    ssh_config (``-F none``: the same settings paramiko uses), a dead link noticed after
    about a minute."""
    argv = ["ssh", "-F", "none", "-p", str(target.port)]
    if target.key:
        argv += ["-i", _ssh_option_path(os.path.expanduser(target.key)),
                 "-o", "IdentitiesOnly=yes"]
    argv += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={_ssh_option_path(str(target.known_hosts_file()))}",
             "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no",
             "-o", "ConnectTimeout=15",
             "-o", f"ServerAliveInterval={KEEPALIVE}", "-o", "ServerAliveCountMax=4"]
    return argv


def remote_spec(target: SshTarget, path: str) -> str:
    """``[user@]host:path`` as rsync takes a remote path (an IPv6 address bracketed)."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{target.user + '@' if target.user else ''}{host}:{path}"


def rsync_argv(target: SshTarget, src: str, dest: str, *, delete: bool = True,
               extra: Sequence[str] = ()) -> list[str]:
    """``rsync -a [--delete] -e '<ssh_command>' [extra...] src dest``.

    One of ``src``/``dest`` is normally :func:`remote_spec`.  ``--protect-args`` (``-s``):
    remote file names travel inside rsync's protocol, never through the remote shell, so a
    name with a blank or a shell character is taken as it is.
    """
    return ["rsync", "-a", "-s", *(["--delete"] if delete else []),
            "-e", shlex.join(ssh_command(target)), *extra, src, dest]


@dataclass(frozen=True)
class RsyncStats:
    """What one rsync moved, from its ``--stats`` report [bytes unless said otherwise].

    ``received`` and ``sent`` are what crossed the network (file list, checksums and
    data, as the local rsync counted them); ``literal`` is file data sent as it is,
    ``matched`` data the receiver already had; ``total_size`` the size of every file in
    the transfer, ``transferred_size`` of those that were updated.
    """

    files: int = 0
    files_transferred: int = 0
    total_size: int = 0
    transferred_size: int = 0
    literal: int = 0
    matched: int = 0
    sent: int = 0
    received: int = 0

    @property
    def moved(self) -> int:
        """Bytes over the network both ways."""
        return self.sent + self.received


_STATS_FIELDS = {
    "Number of files": "files",
    "Number of regular files transferred": "files_transferred",
    "Total file size": "total_size",
    "Total transferred file size": "transferred_size",
    "Literal data": "literal",
    "Matched data": "matched",
    "Total bytes sent": "sent",
    "Total bytes received": "received",
}


def parse_rsync_stats(text: str) -> RsyncStats:
    """The :class:`RsyncStats` of rsync's ``--stats`` output (fields it lacks stay 0).

    rsync groups digits by the locale (``1,234,567`` or ``1.234.567``); every figure here is
    a whole number, so the separators are dropped.
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        label, sep, rest = line.partition(":")
        field = _STATS_FIELDS.get(label.strip())
        if not sep or field is None:
            continue
        number = rest.strip().split(" ", 1)[0].replace(",", "").replace(".", "")
        if number.isdigit():
            values[field] = int(number)
    return RsyncStats(**values)


# ----------------------------------------------------------------------------------------------
# Uploads

def temp_name(remote: str) -> str:
    """A temporary path beside ``remote``: ``.<name>.<our pid>.<8 random>.tmp``, the form of
    :data:`cluster.runtime.fsutil.TEMP_NAME`, so the master's ``remove_dead_temps`` knows a
    leftover one (and a reader of the directory never takes it for a finished file)."""
    path = PurePosixPath(remote)
    rand = "".join(secrets.choice(_TEMP_CHARS) for _ in range(8))
    name = f".{path.name}.{os.getpid()}.{rand}{fsutil.TEMP_SUFFIX}"
    assert fsutil.TEMP_NAME.fullmatch(name), name
    return str(path.with_name(name))


def makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    """``mkdir -p`` over SFTP (a relative path is relative to the login directory)."""
    path = PurePosixPath(directory)
    missing: list[PurePosixPath] = []
    # Bounded by the path's depth: look up from the leaf for the first that exists.
    for here in (path, *path.parents):
        if str(here) in ("", ".", "/"):
            break
        try:
            st = sftp.stat(str(here))
        except FileNotFoundError:
            missing.append(here)
            continue
        if st.st_mode is not None and not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(here))
        break
    for here in reversed(missing):
        try:
            sftp.mkdir(str(here))
        except OSError:
            # Someone else made it meanwhile (two uploads into one new directory)?
            st = sftp.stat(str(here))
            if st.st_mode is None or not stat.S_ISDIR(st.st_mode):
                raise


def put_atomic(sftp: paramiko.SFTPClient, local: Path, remote: str, *,
               temp: str | None = None) -> None:
    """Upload the local file ``local`` to ``remote`` so that no reader there ever sees a part.

    Parents are created; the data goes to ``temp`` (default :func:`temp_name`), is flushed
    to the server's disk (``fsync@openssh.com`` when the server has it), gets ``local``'s
    permission bits and times, is checked for its full size, and is renamed over ``remote``
    (``posix-rename@openssh.com``: atomic, replacing).  On any failure the temporary file is
    removed if the connection still allows it, and the exception propagates: OSError for
    what the server refused (``IsADirectoryError`` if ``remote`` is a directory), paramiko
    / socket / EOFError if the connection failed.
    """
    st = os.stat(local)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(local))
    remote_path = PurePosixPath(remote)
    makedirs(sftp, str(remote_path.parent))
    try:
        have = sftp.stat(remote)
        if have.st_mode is not None and stat.S_ISDIR(have.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory on the server", remote)
    except FileNotFoundError:
        pass
    tmp = temp or temp_name(remote)
    try:
        with open(local, "rb") as src, sftp.open(tmp, "wbx") as dst:
            dst.set_pipelined(True)
            for _ in range(st.st_size // CHUNK + 2):  # bounded: the size we stat'ed, +EOF
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                dst.write(chunk)
            dst.flush()
            _acknowledged(dst)
            _fsync(sftp, dst)
        sftp.chmod(tmp, stat.S_IMODE(st.st_mode))
        sftp.utime(tmp, (st.st_atime, st.st_mtime))
        size = sftp.stat(tmp).st_size
        if size != st.st_size:
            raise OSError(errno.EIO, f"upload wrote {size} of {st.st_size} bytes", tmp)
        sftp.posix_rename(tmp, remote)
    except BaseException:
        try:
            sftp.remove(tmp)
        except Exception:  # noqa: BLE001 - the connection may be gone; the first error counts
            log.debug("could not remove temporary %s after a failed upload", tmp)
        raise


def _acknowledged(fh: paramiko.SFTPFile) -> None:
    """Wait for the server's answer to each write of ``fh`` still in flight, in order, and
    raise the first that is an error (OSError with the server's words: a full disk, the
    node gate's bound).  paramiko's pipelined writes keep their requests in ``_reqs`` and
    read the answers only when many are pending; an answer read while waiting for another
    request (the fsync, a stat) is dropped unseen, so a refused write would surface only
    as a later, misleading error (the file the server removed "does not exist")."""
    pending = getattr(fh, "_reqs", None)
    while pending:  # bounded: each pass takes one request off
        request = pending.popleft()
        fh.sftp._read_response(request)  # type: ignore[attr-defined]  # raises on an error


def _fsync(sftp: paramiko.SFTPClient, fh: paramiko.SFTPFile) -> None:
    """Ask the server to fsync ``fh`` (OpenSSH's ``fsync@openssh.com``).  paramiko has no
    call for it, so the extended request is sent as paramiko sends its own; a server without
    the extension is logged and the upload goes on (the rename is still atomic)."""
    try:
        sftp._request(CMD_EXTENDED, "fsync@openssh.com", fh.handle)  # type: ignore[attr-defined]
    except OSError as exc:
        log.debug("server did not fsync the upload: %s", exc)
