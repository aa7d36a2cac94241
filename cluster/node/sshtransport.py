"""The ssh transport: a node reaching a master home on another machine.

Small files and uploads go over one paramiko SFTP connection per process, reused across
calls (an upload to a temporary name, then renamed, so the master never sees half a file);
trees are mirrored with ``rsync -a --delete`` over OpenSSH after a listing made on the
master.  Host keys are checked against known_hosts only.  Split from
:mod:`cluster.node.transport` so that a node on the local transport never imports
paramiko (a quarter of a second at every run.py start):
:func:`~cluster.node.transports.make_transport` imports this module only when node.conf
says ``transport = ssh``.
"""

from __future__ import annotations

import itertools
import logging
import os
import shlex
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, TypeVar

import paramiko

from cluster.config import DEFAULTS
from cluster.errors import MasterUnreachable, SshError, TransportError
from cluster.node.transport import check_rel
from cluster.runtime import mirror, proc, secretfile, ssh
from cluster.runtime.mirror import Exclude

if TYPE_CHECKING:
    from cluster.config import Config



log = logging.getLogger("cluster.transport")

#: Longest a whole tree fetch (the remote listing plus rsync) may take [seconds]; rsync's
#: own ``--timeout`` (``io_timeout``) ends a stalled one much sooner.
FETCH_TIMEOUT = 3 * 3600.0
#: Longest the listing of a tree on the master may take [seconds] (never less than
#: ``io_timeout``); a listing of 100,000 files takes seconds, so past this the link is
#: taken for dead and the connection is made again.
WALK_TIMEOUT = 180.0
#: rsync exit statuses that mean the connection, not the transfer, failed: worth a retry
#: (rsync(1) "EXIT VALUES"): 5 protocol start-up, 10 socket I/O, 12 data stream, 30 I/O
#: timeout, 35 daemon timeout, 255 ssh itself failed (OpenSSH's status, passed on by rsync:
#: what a session cut at its login or mid-transfer gives, see tests/component/
#: test_ssh_blinks.py).
RSYNC_RETRY = frozenset({5, 10, 12, 30, 35, 255})
#: The pauses before the second, third, ... try of one call (a read, an upload, a listing,
#: an rsync) whose connection broke under it [seconds], each try on a new connection: short
#: at first (a blink is over in a moment), then longer; the last pause repeats until the
#: call's ``ssh_retry_time`` is spent (:class:`Patience`).
RETRY_PAUSES = (0.2, 0.5, 1.0, 2.0, 5.0)
#: ssh's words for failures a retry cannot mend (the key or the host key was refused).
SSH_FATAL = ("Host key verification failed", "Permission denied",
             "REMOTE HOST IDENTIFICATION HAS CHANGED", "No ED25519 host key is known",
             "host key for", "Too many authentication failures")

#: The listing a fetch starts with, run on the master as ``python3 -c WALK_SCRIPT root
#: temp_prefix``: the same decisions as :func:`cluster.runtime.mirror._kind`, made where the
#: files are.  One record per entry, NUL-terminated: a kind byte, a decimal size, a blank,
#: the path relative to root (bytes as they are).  Kinds: ``d`` directory (descended),
#: ``f`` regular file or a link to one inside the tree (size of the file), ``t`` another
#: copier's temp file, ``L`` a link that leaves the tree or dangles, ``N`` a link to
#: something not a regular file, ``S`` neither file nor directory, ``V`` vanished.  Exit 3:
#: root is not a directory.  Symlinked directories are never descended, so the walk ends.
WALK_SCRIPT = r"""
import os, stat, sys
root = os.fsencode(sys.argv[1]); temp = os.fsencode(sys.argv[2])
if not os.path.isdir(root):
    sys.stderr.write("no such directory\n"); sys.exit(3)
real = os.path.realpath(root)
out = sys.stdout.buffer
def rec(kind, size, rel):
    out.write(kind + b"%d " % size + rel + b"\0")
stack = [b""]
while stack:
    prefix = stack.pop()
    with os.scandir(os.path.join(root, prefix) if prefix else root) as it:
        for e in it:
            rel = prefix + e.name
            if e.name.startswith(temp):
                rec(b"t", 0, rel); continue
            try:
                if e.is_symlink():
                    try:
                        target = os.path.realpath(e.path)
                        if os.path.commonpath([target, real]) != real:
                            raise ValueError(target)
                        st = os.stat(target)
                    except (OSError, ValueError):
                        rec(b"L", 0, rel); continue
                    rec(b"f" if stat.S_ISREG(st.st_mode) else b"N", st.st_size, rel); continue
                if e.is_dir(follow_symlinks=False):
                    rec(b"d", 0, rel); stack.append(rel + b"/"); continue
                if e.is_file(follow_symlinks=False):
                    rec(b"f", e.stat(follow_symlinks=False).st_size, rel); continue
            except FileNotFoundError:
                rec(b"V", 0, rel); continue
            rec(b"S", 0, rel)
out.flush()
"""

_SKIP_WHY = {"t": "another copier's temporary file", "L": "a symlink that leaves the tree or "
             "dangles", "N": "a symlink to something not a regular file", "S": "not a regular "
             "file or directory", "V": "vanished while listed"}

T = TypeVar("T")


def retry_time(cfg: Config) -> float:
    """How long one call of the node's ssh transport may keep trying [seconds]:
    ``ssh_retry_time``, and at most half of ``heartbeat_timeout``.

    A node's file gives ``heartbeat_timeout`` only when it holds the master's settings too
    (localcluster's one file for both); otherwise it is the default (180 s), which the
    default ``ssh_retry_time`` (60 s) is well below.  Half, not all: the try under way when
    the budget runs out still takes its own time (bounded by ``io_timeout``)."""
    return min(cfg.ssh_retry_time, cfg.heartbeat_timeout / 2)


class Patience:
    """How long one call of the transport keeps trying after its connection broke: pauses
    of :data:`RETRY_PAUSES` (the last repeated), none begun that would end more than
    ``budget`` seconds after the call began.

    The bound is the node's ``ssh_retry_time``, which must stay below the master's
    ``heartbeat_timeout``: a node uploading its result bundle says nothing to its master
    while the upload is tried again, and it must give up (and report, or leave, as
    before) before the master takes its silence for death.  Bounded: at most
    ``len(RETRY_PAUSES) + budget / RETRY_PAUSES[-1]`` pauses.
    """

    def __init__(self, budget: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.budget = max(0.0, budget)
        self.began = clock()
        self.deadline = self.began + self.budget
        self.pauses = 0

    def next_pause(self) -> float | None:
        """The pause before the next try, or None: the budget does not allow another."""
        pause = RETRY_PAUSES[min(self.pauses, len(RETRY_PAUSES) - 1)]
        if self.clock() + pause > self.deadline:
            return None
        self.pauses += 1
        return pause

    def spent(self) -> float:
        """Seconds since the call began."""
        return self.clock() - self.began


@dataclass(frozen=True)
class TreePlan:
    """What a fetch of one tree sends: ``skipped`` (left out for the mirror's own reasons,
    as :func:`cluster.runtime.mirror.left_out` lists them), ``excluded`` (what ``exclude``
    named, directories with a trailing ``/``), and the number and bytes of the files sent."""

    skipped: list[str]
    excluded: list[str]
    files: int
    size: int


class SshTransport:
    """The master home on ``master_host``, reached over ssh (node.conf ``transport = ssh``).

    * One paramiko connection (and one SFTP session on it) per process, opened on first
      use and reused.  The master's host key must be in ``target.known_hosts``; an unknown
      or changed key is refused (see :func:`cluster.runtime.ssh.connect`).
    * :meth:`read_text` and :meth:`upload` go over SFTP; an upload is written to a
      temporary name beside the target (``fsutil.TEMP_NAME``'s form) and renamed over it.
    * :meth:`fetch_tree` lists the tree on the master (a small Python walk over the same
      connection, deciding as :mod:`cluster.runtime.mirror` does), applies ``exclude`` and
      ``max_size`` here, and runs ``rsync -a --delete`` over OpenSSH leaving out exactly what
      :class:`LocalTransport` would: the two give the same tree.  What rsync moved is kept in
      :attr:`last_fetch_stats`.
    * A connection lost during a call (EOF, reset, a stalled read past ``io_timeout``, a
      remote command's channel closed without an exit status) is dropped and the call made
      again on a new connection after a pause of :data:`RETRY_PAUSES` (0.2, 0.5, 1, 2, 5,
      5, ... s), for at most ``retry_time`` seconds from the call's start (node.conf's
      ``ssh_retry_time``, below the master's ``heartbeat_timeout``: :class:`Patience`).
      An rsync whose connection failed (an exit status in :data:`RSYNC_RETRY`) is run again
      on the same schedule.  A login that fails for want of a connection is tried again
      by :func:`cluster.runtime.ssh.connect`: ``connect_retries`` tries
      ``connect_retry_delay`` seconds apart, doubling (capped), within the same
      ``retry_time``.  A master that stays out of reach, or a link that keeps breaking, is
      :class:`~cluster.errors.MasterUnreachable`.
    * Every failure is a :class:`~cluster.errors.TransportError` naming the action, the path
      and the master (``user@host:port``); an unreachable master therefore makes the node
      report failure 1 (network), never an uncaught paramiko exception.

    Paths: ``master_home / rel``, where a relative ``master_home`` is relative to the ssh
    user's home on the master (a leading ``~/`` is accepted and means the same).
    """

    def __init__(self, target: ssh.SshTarget, master_home: str | PurePosixPath, *,
                 connect_retries: int = 10, connect_retry_delay: float = 5.0,
                 io_timeout: float = 60.0, connect_timeout: float = 15.0,
                 fetch_timeout: float = FETCH_TIMEOUT,
                 retry_time: float = DEFAULTS.ssh_retry_time) -> None:
        home = str(master_home)
        if home == "~":
            home = "."
        elif home.startswith("~/"):
            home = home[2:] or "."
        self.target = target
        self.home = PurePosixPath(home)
        self.connect_retries = max(1, connect_retries)
        self.connect_retry_delay = connect_retry_delay
        self.io_timeout = io_timeout
        self.connect_timeout = connect_timeout
        self.fetch_timeout = fetch_timeout
        self.retry_time = retry_time
        #: What the last successful :meth:`fetch_tree` moved (rsync's --stats).
        self.last_fetch_stats: ssh.RsyncStats | None = None
        #: The plan of the last :meth:`fetch_tree` (what it sent and left out).
        self.last_fetch_plan: TreePlan | None = None
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._pid = 0
        self.connects = 0  # connections opened (a test sees the reuse)

    @classmethod
    def from_config(cls, cfg: Config) -> SshTransport:
        """The transport node.conf describes (``master_host``, ``ssh_*``, ``master_home``,
        ``connect_retries``, ``connect_retry_delay``, ``io_timeout``, ``ssh_retry_time``)."""
        target = ssh.SshTarget(
            host=cfg.master_host, port=cfg.ssh_port, user=cfg.ssh_user, key=cfg.ssh_key,
            known_hosts=Path(os.path.expanduser(str(cfg.ssh_known_hosts))))
        return cls(target, PurePosixPath(str(cfg.master_home)),
                   connect_retries=cfg.connect_retries,
                   connect_retry_delay=cfg.connect_retry_delay, io_timeout=cfg.io_timeout,
                   retry_time=retry_time(cfg))

    def __repr__(self) -> str:
        return f"SshTransport({self.target.where()}:{str(self.home)!r})"

    def remote_path(self, rel: str, action: str = "access") -> str:
        """The path on the master of the master-home path ``rel`` (checked by
        :func:`check_rel`)."""
        return str(self.home.joinpath(*check_rel(rel, action).parts))

    # -- the connection ------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        with self._lock:
            client, self._client, self._sftp = self._client, None, None
            if client is not None and self._pid == os.getpid():
                client.close()

    def _session(self, action: str, rel: str, patience: Patience | None = None
                 ) -> tuple[paramiko.SSHClient, paramiko.SFTPClient]:
        """The open connection and SFTP session, opened (with retries, none begun past
        ``patience``'s deadline) if need be."""
        if self._client is not None and self._pid != os.getpid():
            # A forked child must not share its parent's ssh stream: forget it, unclosed.
            self._client = self._sftp = None
        if self._client is not None and self._sftp is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client, self._sftp
            self.close()
        try:
            client = ssh.connect(self.target, timeout=self.connect_timeout,
                                 retries=self.connect_retries, delay=self.connect_retry_delay,
                                 deadline=patience.deadline if patience else None)
        except SshError as exc:
            error = MasterUnreachable if exc.kind == "unreachable" else TransportError
            spent = f"; {patience.spent():.1f} s of ssh_retry_time {self.retry_time:g} s " \
                    "spent" if patience is not None and exc.kind == "unreachable" else ""
            raise error(action, rel, f"master {exc.where}: {exc.reason}{spent}") from None
        try:
            sftp = client.open_sftp()
            # A read that waits longer than this on a dead link raises instead of hanging.
            sftp.get_channel().settimeout(self.io_timeout)  # type: ignore[union-attr]
        except (paramiko.SSHException, OSError, EOFError) as exc:
            transport = client.get_transport()
            cut = transport is None or not transport.is_active()
            client.close()
            if cut:  # lost right after the login: _call tries again on a new connection
                raise SshError("unreachable", self.target.where(),
                               f"connection lost while starting SFTP: {exc}") from None
            raise TransportError(action, rel, f"master {self.target.where()}: cannot start "
                                              f"SFTP: {exc}") from None
        self._client, self._sftp, self._pid = client, sftp, os.getpid()
        self.connects += 1
        log.debug("connected to %s (connection %d)", self.target.where(), self.connects)
        return client, sftp

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by a call on the connection) means the connection broke,
        rather than the master refusing what was asked (a missing file, no permission)."""
        if isinstance(exc, SshError):
            # A command that outran its time on a live connection is as good as a dead link.
            return exc.kind in ("unreachable", "timeout")
        if isinstance(exc, (EOFError, paramiko.SSHException, TimeoutError, ConnectionError)):
            return True
        transport = self._client.get_transport() if self._client is not None else None
        return transport is None or not transport.is_active()

    def _call(self, action: str, rel: str,
              fn: Callable[[paramiko.SSHClient, paramiko.SFTPClient], T],
              on_retry: Callable[[paramiko.SFTPClient], None] | None = None) -> T:
        """``fn(client, sftp)`` under the lock; again on a new connection if the connection
        broke, or a remote command's channel closed without an exit status, after the
        pauses of :class:`Patience` within ``retry_time``.  ``fn`` must be safe to repeat (a
        read, a listing, an upload to a fresh temporary name; ``on_retry`` removes what a
        cut try left).  ``fn`` raises TransportError for what the master refused, and
        OSError it leaves to us is named with the master."""
        with self._lock:
            patience = Patience(self.retry_time)
            # Bounded: Patience allows a bounded number of pauses, each try ends in a
            # return, a raise, or one of them.
            for attempt in itertools.count(1):
                try:
                    client, sftp = self._session(action, rel, patience)
                    if attempt > 1 and on_retry is not None:
                        on_retry(sftp)
                    return fn(client, sftp)
                except TransportError:
                    raise
                except (OSError, EOFError, paramiko.SSHException, SshError) as exc:
                    if not self._lost(exc):
                        why = exc.strerror if isinstance(exc, OSError) and exc.strerror \
                            else str(exc)
                        raise TransportError(action, rel, f"{why} (on the master "
                                                          f"{self.target.where()})") from None
                    self.close()
                    pause = patience.next_pause()
                    if pause is None:
                        raise MasterUnreachable(
                            action, rel, f"connection to the master {self.target.where()} "
                                         f"lost {attempt} times in {patience.spent():.1f} s "
                                         f"(ssh_retry_time {self.retry_time:g} s): "
                                         f"{exc or type(exc).__name__}") from None
                    log.warning("%s %s: connection to %s lost (%s); try %d on a new "
                                "connection in %g s", action, rel, self.target.where(),
                                exc or type(exc).__name__, attempt + 1, pause)
                    time.sleep(pause)
        raise AssertionError("unreachable: the loop returns or raises")

    # -- read ----------------------------------------------------------------------------------
    def read_text(self, rel: str) -> str | None:
        """The UTF-8 text of ``rel`` on the master (over SFTP), or None if it does not
        exist."""
        path = self.remote_path(rel, "read")

        def read(_client: paramiko.SSHClient, sftp: paramiko.SFTPClient) -> bytes | None:
            try:
                st = sftp.stat(path)
            except FileNotFoundError:
                return None
            if st.st_mode is not None and stat.S_ISDIR(st.st_mode):
                raise TransportError("read", rel, "is a directory on the master, not a file")
            try:
                with sftp.open(path, "rb") as fh:
                    return fh.read()
            except FileNotFoundError:
                return None  # removed between the stat and the open
        data = self._call("read", rel, read)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TransportError("read", rel, f"not UTF-8 text (byte {exc.start})") from None

    def read_secret(self, rel: str) -> str | None:
        """The text of the secret file ``rel`` on the master, or None if it does not exist.

        Refused (:class:`~cluster.runtime.secretfile.SecretFileError` naming the master and
        the file) if SFTP's ``lstat`` shows a link or group/other permission bits, and again
        if the opened file's ``stat`` does (SFTP has no O_NOFOLLOW: a link swapped in
        after the lstat shows there as its target's mode, which must then be 0600 too)."""
        path = self.remote_path(rel, "read")
        where = f"{self.target.where()}:{path}"

        def read(_client: paramiko.SSHClient, sftp: paramiko.SFTPClient) -> bytes | None:
            try:
                secretfile.check_secret_mode(where, sftp.lstat(path).st_mode or 0)
                with sftp.open(path, "rb") as fh:
                    secretfile.check_secret_mode(where, fh.stat().st_mode or 0)
                    return fh.read(secretfile.MAX_SECRET_BYTES + 1)
            except FileNotFoundError:
                return None
        data = self._call("read", rel, read)
        if data is None:
            return None
        if len(data) > secretfile.MAX_SECRET_BYTES:
            raise secretfile.SecretFileError(where, f"is larger than "
                                                    f"{secretfile.MAX_SECRET_BYTES} bytes")
        try:
            return data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise secretfile.SecretFileError(where, f"is not ASCII text (byte {exc.start})") \
                from None

    # -- write ---------------------------------------------------------------------------------
    def move_folder(self, src: Path, rel: str) -> bool:
        """Never: the master home is on another machine (:meth:`Transport.move_folder`)."""
        return False

    def upload(self, src: Path, rel: str) -> None:
        """Copy the local ``src`` to ``rel`` on the master: SFTP to a temporary name in the
        target's directory (``.<name>.<pid>.<random>.tmp``), fsync'ed, renamed over the
        target (:func:`cluster.runtime.ssh.put_atomic`); parents created."""
        path = self.remote_path(rel, "upload")
        if not Path(src).is_file():
            raise TransportError("upload", rel, f"local file {src} does not exist or is not "
                                                "a regular file")
        temps: list[str] = []

        def put(_client: paramiko.SSHClient, sftp: paramiko.SFTPClient) -> None:
            temps.append(ssh.temp_name(path))
            try:
                ssh.put_atomic(sftp, Path(src), path, temp=temps[-1])
            except IsADirectoryError:
                raise TransportError("upload", rel, "is a directory on the master") from None
            except NotADirectoryError as exc:
                raise TransportError("upload", rel, f"{exc.filename} is a file on the "
                                                    "master, not a directory") from None

        def forget_temp(sftp: paramiko.SFTPClient) -> None:
            # The temp file of the try the lost connection cut short, if the server kept it.
            for temp in temps:
                try:
                    sftp.remove(temp)
                except OSError:
                    pass  # gone with the connection, or never made
        self._call("upload", rel, put, on_retry=forget_temp)

    # -- mirror --------------------------------------------------------------------------------
    def plan(self, rel: str, exclude: Exclude | None = None, max_size: int | None = None,
             action: str = "fetch") -> TreePlan:
        """List ``rel`` on the master and decide, as :mod:`cluster.runtime.mirror` does, what
        a fetch sends and what it leaves out (logging each entry left out, as the mirror
        does)."""
        path = self.remote_path(rel, action)
        command = shlex.join(["python3", "-c", WALK_SCRIPT, path, mirror.TEMP_PREFIX])
        timeout = max(self.io_timeout, WALK_TIMEOUT)

        def walk(client: paramiko.SSHClient, _sftp: paramiko.SFTPClient
                 ) -> tuple[int, bytes, bytes]:
            return ssh.exec_bytes(client, command, timeout)
        status, out, err = self._call(action, rel, walk)
        if status == 3:
            raise TransportError(action, rel, f"no such directory {path} on the master "
                                              f"{self.target.where()}")
        if status != 0:
            why = "python3 is not on the master's PATH" if status == 127 else \
                "\n".join(err.decode("utf-8", "replace").strip().splitlines()[-5:])
            raise TransportError(action, rel, f"listing {path} on the master "
                                              f"{self.target.where()} failed (status "
                                              f"{status}): {why}")
        return _plan(out, exclude, max_size, rel)

    def left_out(self, rel: str, exclude: Exclude | None = None,
                 max_size: int | None = None) -> list[str]:
        """What ``fetch_tree(rel, ..., exclude, max_size)`` would leave out beyond
        ``exclude`` (as :meth:`LocalTransport.left_out`)."""
        return sorted(self.plan(rel, exclude, max_size).skipped)

    def fetch_tree(self, rel: str, dest: Path, exclude: Exclude | None = None,
                   max_size: int | None = None) -> None:
        """Make ``dest`` an exact copy of ``rel`` on the master with ``rsync -a --delete``
        over ssh; the same result as :meth:`LocalTransport.fetch_tree` (see the class).

        Everything the plan leaves out is an anchored literal ``--exclude`` rule (fed on
        stdin, NUL-separated) with ``--delete-excluded``: so ``exclude`` may be any
        predicate, not only an rsync pattern, and ``--copy-links`` only ever dereferences a
        link to a file inside the tree.  ``--max-size`` stays as the backstop for a file
        that grew since the listing.  rsync's ``--stats`` are kept in
        :attr:`last_fetch_stats`.
        """
        plan = self.plan(rel, exclude, max_size)
        dest = Path(dest)
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransportError("fetch", rel, f"cannot make {dest}: {exc.strerror}") from None
        source = ssh.remote_spec(self.target, self.remote_path(rel, "fetch") + "/")
        timeout = max(1, round(self.io_timeout))
        argv = ssh.rsync_argv(self.target, source, f"{dest.resolve()}/", extra=[
            "--copy-links", "--no-D", "--delete-excluded", f"--timeout={timeout}",
            # As LocalTransport's copy: the files belong to the node's user, whoever owns
            # them on the master (-a as root would give them the master's owners).
            "--no-owner", "--no-group",
            *([f"--max-size={max_size}"] if max_size is not None else []),
            "--stats", "--from0", "--exclude-from=-"])
        rules = b"".join(os.fsencode(mirror.anchored(p)) + b"\0"
                         for p in plan.skipped + plan.excluded)
        done = self._rsync(argv, rules, rel)
        self.last_fetch_plan = plan
        self.last_fetch_stats = ssh.parse_rsync_stats(done.text())
        log.debug("fetched %s from %s into %s: %s", rel, self.target.where(), dest,
                  self.last_fetch_stats)

    def _rsync(self, argv: list[str], rules: bytes, rel: str) -> proc.Result:
        """Run the fetch's rsync; again, after the pauses of :class:`Patience` within
        ``retry_time``, while it fails for its connection (:data:`RSYNC_RETRY`, and none
        of ssh's words for a refusal, :data:`SSH_FATAL`).  Its ssh logs in anew each time,
        so its tries also count as connects: at most ``connect_retries`` in all."""
        patience = Patience(self.retry_time)
        for attempt in range(1, self.connect_retries + 1):
            try:
                done = proc.run(argv, input=rules, timeout=self.fetch_timeout)
            except proc.ProcessError as exc:
                raise TransportError("fetch", rel, str(exc)) from None
            if done.ok:
                return done
            err = done.text("stderr").strip()
            if done.returncode == mirror.RSYNC_VANISHED and not done.timed_out:
                log.warning("rsync %s: some files vanished on the master during the "
                            "transfer: %s", rel, err)
                return done
            tail = "\n".join(err.splitlines()[-10:])
            retry = (done.returncode in RSYNC_RETRY and not done.timed_out
                     and not any(word in err for word in SSH_FATAL))
            pause = patience.next_pause() if retry and attempt < self.connect_retries \
                else None
            if pause is None:
                tries = f" after {attempt} tries in {patience.spent():.1f} s " \
                        f"(connect_retries {self.connect_retries}, ssh_retry_time " \
                        f"{self.retry_time:g} s)" if attempt > 1 else ""
                error = MasterUnreachable if retry else TransportError
                raise error("fetch", rel, f"rsync from the master {self.target.where()} "
                                          f"failed{tries} "
                                          f"({done.describe(self.fetch_timeout)}):\n{tail}")
            log.warning("fetch %s: rsync from %s failed (%s), try %d again in %g s: %s",
                        rel, self.target.where(), done.describe(), attempt + 1, pause, tail)
            time.sleep(pause)
        raise AssertionError("unreachable: the last try returns or raises")


def _plan(listing: bytes, exclude: Exclude | None, max_size: int | None, label: str) -> TreePlan:
    """Apply ``exclude`` and ``max_size`` to the master's listing (see :data:`WALK_SCRIPT`)
    exactly as :func:`cluster.runtime.mirror._listing` does to a local directory: the
    predicate sees a directory's path with a trailing ``/`` and an excluded directory is not
    descended; a file over ``max_size`` is left out and logged with its size."""
    children: dict[str, list[tuple[str, int, str]]] = {}
    for record in listing.split(b"\0"):
        if not record:
            continue
        kind = chr(record[0])
        size_text, _, raw = record[1:].partition(b" ")
        path = os.fsdecode(raw)  # as os.scandir names a local entry (surrogateescape)
        parent, _, name = path.rpartition("/")
        children.setdefault(parent + "/" if parent else "", []).append(
            (kind, int(size_text), name))
    skipped: list[str] = []
    excluded: list[str] = []
    files = size = 0
    pending = [""]
    while pending:  # bounded: each directory of the listing is pending at most once
        prefix = pending.pop()
        for kind, nbytes, name in children.get(prefix, ()):
            path = prefix + name
            if kind == "d":
                if exclude is None or not exclude(path + "/"):
                    pending.append(path + "/")
                else:
                    excluded.append(path + "/")
            elif kind != "f":
                log.warning("fetch %s: skipping %s: %s", label, path,
                            _SKIP_WHY.get(kind, "unknown kind"))
                skipped.append(path)
            elif exclude is not None and exclude(path):
                excluded.append(path)
            elif max_size is not None and nbytes > max_size:
                log.warning("fetch %s: not copying %s: %d bytes, over the %d-byte limit",
                            label, path, nbytes, max_size)
                skipped.append(path)
            else:
                files += 1
                size += nbytes
    return TreePlan(skipped, excluded, files, size)
