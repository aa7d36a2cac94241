"""clusterpush from a developer's machine: the tree and the dropping over ssh to the master.

``clusterpush.py --master [user@]host[:home]`` reaches a master home that is not mounted on
the developer's machine.  The tree goes to ``<home>/users/<user>/<tree>`` with
``rsync -a --delete`` over OpenSSH (only what changed moves), the dropping
``cluster_command.run`` is written beside it, and ``abort`` writes what a local abort
writes; the outcome on the master is exactly a local push's (:mod:`cluster.triggers.push`).

How the master-side guarantees are kept remotely
------------------------------------------------
A local push holds the tree's lock (``users/<user>/.<tree>.lock``, the two-level flock of
:mod:`cluster.runtime.pathlock`) while it changes the tree and writes the dropping, and
never goes through a symlink below the home.  Neither can be had from outside the master:
an SFTP write or rsync's own server follows symlinks in its paths, and ``flock(1)`` around
rsync's server (``--rsync-path="flock LOCK rsync"``) would take neither the directory lock
nor the checks, nor write the dropping under the lock.  So the master-side part runs *the
same Python code as a local push*, on the master:

* the developer's own copy of the ``cluster`` package is shipped as one zip
  (:func:`code_zip`; about 0.4 MB, content-addressed, uploaded once per version to
  :data:`REMOTE_CACHE` in the ssh account's home, and reused) and run there as
  ``python3 cluster-<hash>.pyz`` (:mod:`cluster.cli.pushremote`).  The developer's machine
  needs to know nothing of the master's install (where it is, which version), and the code
  that writes the master home is the code a local push on a shared file system runs, as
  before;
* a push is two steps, and only a living client makes the second
  (:func:`cluster.triggers.pushreceive.receive_push`,
  :func:`cluster.triggers.pushreceive.commit_push`).
  The transfer: that program is rsync's ``--rsync-path``; it checks the way to
  ``users/<user>/<tree>``, stages a copy of hard links to it
  (``users/<user>/.<tree>.incoming.<token>``) under the tree's lock, and runs rsync's
  server into that (its working directory set through a descriptor opened without
  following a symlink; the client's destination is ``.``), without the lock; it queues
  nothing.  The commit: a second command over the paramiko connection, sent only when
  rsync returned 0, which under the tree's lock puts the staged tree in place and writes
  the dropping.  So the master's snapshot never sees a half-synced tree, and a failed,
  interrupted or killed push leaves no dropping;
* rsync dies with clusterpush (:func:`run_bound`: ``PR_SET_PDEATHSIG``, and its process
  group stopped on ^C or SIGTERM), so a push whose client is gone never reaches the
  commit; the master's side, whose rsync server then fails, removes the staged tree;
* ``abort`` (:func:`remote_abort`) renames the user's staged trees, which stops their
  transfers and makes their commits refuse (:func:`cluster.triggers.pushreceive.abort_pushes`);
* a run's snapshot shares files with the pushed tree by hard links, and so does a staged
  tree; rsync chmods in place a file whose mode alone changed, so the developer's file
  modes go up first (one small file, :func:`cluster.triggers.pushreceive.write_modes`) and such
  shared files are unlinked in the staged tree before rsync runs (what ``_unshare`` does
  for a local push);
* owner and group are not carried (``--no-owner --no-group``): the files on the master
  belong to the ssh account, whatever their numbers on the developer's machine.

Before anything is written on the master, one paramiko connection checks the host key
against the known_hosts file (an unknown or changed key is refused with its fingerprint),
and the login; rsync's OpenSSH then checks the same file
(:func:`cluster.runtime.ssh.ssh_command`).  A bad ``--master``, an unreachable host, a
refused key or a refused host key therefore fail before the master home is touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import paramiko

import cluster
from cluster.errors import ClusterError, SshError
from cluster.runspec import RunSpec
from cluster.runtime import proc
from cluster.runtime.mirror import _walk, anchored
from cluster.runtime.ssh import SshTarget, connect, exec_bytes, put_atomic, remote_spec, rsync_argv
from cluster.triggers.push import MAX_PUSH_BYTES, PUSH_LOCK_WAIT, is_excluded
from cluster.triggers.pushreceive import source_modes, write_modes
from cluster.triggers.remotegate import GATE_WORD, hello

log = logging.getLogger("cluster.push")

#: The master home when ``--master`` names none: the clustermaster's default home
#: (config key ``home``), relative to the ssh account's home.
DEFAULT_HOME = "cluster-home"
#: Where the shipped code and the modes lists go on the master, relative to the ssh
#: account's home (not the master home: nothing there is the cluster's to clean up).
REMOTE_CACHE = ".cache/cluster-push"
#: What carries the remote program's outcome (:data:`cluster.cli.pushremote.MARKER`).
MARKER = "clusterpush-remote: "
#: A shipped zip not used for this long is removed by the next push [s]; each use
#: refreshes its time.
PRUNE_AGE = 7 * 86400
#: A modes list left by a push killed before rsync's server ran is removed after [s].
STALE_MODES_AGE = 86400
#: The remote abort's time limit [s]: the queue's lock, a few small files, and each of the
#: user's trees' lock (:data:`cluster.triggers.pushreceive.ABORT_LOCK_WAIT`).
ABORT_TIMEOUT = 300.0
#: The commit's time limit [s]: the tree's lock (a run's snapshot holds it for seconds, a
#: local push of the same tree for as long as it syncs), two renames, the old tree's
#: removal, the dropping.
COMMIT_TIMEOUT = PUSH_LOCK_WAIT + 120.0
#: After SIGTERM, how long rsync and its ssh have before SIGKILL [s].
KILL_GRACE = 5.0
#: prctl(2)'s option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1

#: rsync's statistics lines that :class:`RemotePushed` keeps (``--stats``).
_STATS = {
    "files": re.compile(r"^Number of regular files transferred: ([\d,]+)", re.M),
    "bytes": re.compile(r"^Total transferred file size: ([\d,]+)", re.M),
    "literal": re.compile(r"^Literal data: ([\d,]+)", re.M),
}
#: ``[user@]host[:home]``: user and host as ssh takes them (no leading ``-``, nothing a
#: shell or ssh would read as more than a name); an IPv6 address in brackets.
_MASTER = re.compile(r"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]{0,63})@)?"
                     r"(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.%a-z0-9]+\])"
                     r"(?::(?P<home>.*))?")


@dataclass(frozen=True)
class MasterAddress:
    """``--master`` parsed: ``user`` ("" = ssh's default), ``host`` (no brackets) and the
    master home's path on the host (relative = to the ssh account's home)."""

    user: str
    host: str
    home: str


def parse_master(text: str, default_home: str = DEFAULT_HOME) -> MasterAddress:
    """Parse ``[user@]host[:home]``; ClusterError saying what was expected otherwise.

    ``home`` may start with ``~/`` (the ssh account's home, as a relative path is); it may
    not hold a NUL or a line break.  An empty or missing home is ``default_home``.
    """
    m = _MASTER.fullmatch(text)
    if m is None:
        raise ClusterError(f"--master {text!r}: expected [user@]host[:home] (a host name or "
                           "address, an IPv6 address in brackets, a user name of letters, "
                           "digits, '.', '_' or '-')")
    home = m.group("home") or default_home
    if any(c in home for c in "\0\n\r"):
        raise ClusterError(f"--master {text!r}: the home path holds a NUL or a line break")
    if home == "~":
        home = "."
    elif home.startswith("~/"):
        home = home[2:] or "."
    elif home.startswith("~"):
        raise ClusterError(f"--master {text!r}: '~user' paths are not supported; give the "
                           "home's path (absolute, or relative to the ssh account's home)")
    host = m.group("host")
    if host.startswith("["):
        host = host[1:-1]
    return MasterAddress(m.group("user") or "", host, home)


@dataclass(frozen=True)
class RemotePushed:
    """A push done over ssh: the tree's path on the master, the queue note (None: a new
    run, as :class:`cluster.triggers.push.Pushed`), and from rsync's statistics the number
    of files it sent, their size and the literal (non-delta) bytes [None if not printed]."""

    target: str
    note: str | None
    files: int | None
    size: int | None
    literal: int | None
    stats: str
    #: When the master committed the push (its clock) [epoch s], None if it did not say.
    committed: float | None = None


@dataclass(frozen=True)
class RemoteAborted:
    """What a remote abort did (as :class:`cluster.master.files.abort.AbortOutcome`), and how
    many pushes in flight or not yet queued it stopped
    (:func:`cluster.triggers.pushreceive.abort_pushes`)."""

    removed: int
    running: str | None
    stopped: int = 0


class PushRefused(ClusterError):
    """A push failed or was aborted before its commit: nothing was queued.  ``aborted``:
    ``clusterpush abort`` stopped it."""

    def __init__(self, message: str, *, aborted: bool = False) -> None:
        super().__init__(message)
        self.aborted = aborted


class CommitInterrupted(ClusterError):
    """Interrupted (^C) while the master committed the push: it may have been queued."""


# ----------------------------------------------------------------------------------------------
# The code shipped to the master

@lru_cache(maxsize=1)
def code_zip() -> bytes:
    """The ``cluster`` package this process runs, as :func:`build_zip` makes it (built once
    per process, so every push of one process ships the same code)."""
    return build_zip(Path(cluster.__file__).resolve().parent)


def build_zip(package: Path) -> bytes:
    """The package in directory ``package`` as a zip that ``python3 FILE`` runs
    (``__main__`` calls :func:`cluster.cli.pushremote.main`): its ``*.py`` files (no
    caches).  Deterministic: the same sources give the same bytes (sorted names, fixed
    times), so its hash names a version."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
        add("__main__.py", b"from cluster.cli.pushremote import main\n"
                           b"raise SystemExit(main())\n")
        files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
        for path in files:  # bounded: the package's files
            add(f"{package.name}/" + path.relative_to(package).as_posix(), path.read_bytes())
    return buf.getvalue()


def _remote_code(sftp: paramiko.SFTPClient, cache: str) -> str:
    """Make sure :func:`code_zip` is on the master; its path there (relative to the login
    directory).  Uploaded atomically when missing or of another size, else only touched
    (its time says when it was last used)."""
    data = code_zip()
    path = f"{cache}/cluster-{hashlib.sha256(data).hexdigest()[:20]}.pyz"
    try:
        have = sftp.stat(path)
    except FileNotFoundError:
        have = None
    if have is not None and have.st_size == len(data):
        now = time.time()
        sftp.utime(path, (now, now))
    else:
        _upload(sftp, data, path, 0o644)
    _prune(sftp, cache, keep=path)
    return path


def _upload(sftp: paramiko.SFTPClient, data: bytes, remote: str, mode: int) -> None:
    with tempfile.TemporaryDirectory(prefix="clusterpush-") as tmp:
        local = Path(tmp) / "upload"
        local.write_bytes(data)
        os.chmod(local, mode)
        put_atomic(sftp, local, remote)


def _prune(sftp: paramiko.SFTPClient, cache: str, keep: str) -> None:
    """Remove shipped zips unused for :data:`PRUNE_AGE` and stale modes lists."""
    now = time.time()
    try:
        entries = sftp.listdir_attr(cache)
    except OSError:
        return
    for entry in entries:  # bounded: one directory
        name = entry.filename
        path = f"{cache}/{name}"
        age = now - (entry.st_mtime or now)
        old = (name.startswith("cluster-") and name.endswith(".pyz") and path != keep
               and age > PRUNE_AGE) or (name.startswith("modes.") and age > STALE_MODES_AGE)
        if old and entry.st_mode is not None and stat.S_ISREG(entry.st_mode):
            try:
                sftp.remove(path)
            except OSError as exc:
                log.debug("could not remove %s on the master: %s", path, exc)


# ----------------------------------------------------------------------------------------------
# Push and abort

def _connect(target: SshTarget, timeout: float, retries: int) -> paramiko.SSHClient:
    """The paramiko connection that checks host key and login before anything is written."""
    return connect(target, timeout=timeout, retries=retries, delay=1.0)


def _outcome(text: str, where: str) -> dict[str, object] | None:
    """The remote program's outcome line in ``text``, or None if it printed none."""
    found: dict[str, object] | None = None
    for line in text.splitlines():
        if line.startswith(MARKER):
            try:
                value = json.loads(line[len(MARKER):])
            except ValueError:
                raise ClusterError(f"master {where}: unreadable outcome line {line!r}") from None
            if isinstance(value, dict):
                found = value
    return found


def _tail(text: str, lines: int = 12) -> str:
    kept = [line for line in text.strip().splitlines() if not line.startswith(MARKER)]
    return "\n".join(kept[-lines:])


def _stat(text: str, key: str) -> int | None:
    m = _STATS[key].search(text)
    return int(m.group(1).replace(",", "")) if m else None


def remote_push(target: SshTarget, home: str, tree: Path, spec: RunSpec, *,
                python: str = "python3", io_timeout: float = 60.0,
                connect_timeout: float = 15.0, retries: int = 1,
                cache: str = REMOTE_CACHE) -> RemotePushed:
    """Push ``tree`` as the user run ``spec`` to the master home ``home`` on ``target``.

    The same result on the master as :func:`cluster.triggers.push.submit_push` there (see
    the module docstring for how), with what a push sends decided here by the same rules
    (:func:`cluster.triggers.push.is_excluded`, :data:`MAX_PUSH_BYTES`, symlinks).
    ``python`` is the master's Python 3 (a name on the ssh account's PATH, or a path).
    ``io_timeout`` plus :data:`~cluster.triggers.push.PUSH_LOCK_WAIT` is rsync's
    ``--timeout`` (a transfer stalled that long ends; see :func:`_rsync`).  ``cache``
    is where on the master the shipped code and the modes list go (relative = to the ssh
    account's home).

    Two steps: the transfer (rsync, staged on the master), then, only once rsync ended
    well, the commit (a command of its own) that puts the tree in place and writes the
    dropping.  rsync dies with this process (:func:`_rsync`), so a push whose client is
    killed or interrupted before the commit queues nothing.  Raises
    :class:`~cluster.errors.SshError` when the master cannot be reached or refuses us (then
    nothing was written there), :class:`PushRefused` when the transfer, the commit or the
    master's side failed or an abort stopped the push (then no dropping was written:
    nothing is queued), :class:`CommitInterrupted` when interrupted while the master
    committed.
    """
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    if not tree.is_dir():
        raise ClusterError(f"tree {tree} is not a directory")
    if shutil.which("rsync") is None:
        raise ClusterError("rsync is not on PATH; a push to another machine needs it "
                           "(install rsync)")
    source = tree.resolve()
    where = target.where()
    skipped, excluded = _walk(source, is_excluded, MAX_PUSH_BYTES, source.name)
    rules = b"".join(os.fsencode(anchored(p)) + b"\0" for p in skipped + excluded)
    modes = write_modes(source_modes(source))
    client = _connect(target, connect_timeout, retries)
    modes_path = f"{cache}/modes.{os.getpid()}.{os.urandom(6).hex()}"
    token = os.urandom(8).hex()
    try:
        steps = [f"--line={spec.line()}", f"--token={token}"]
        if hello(client) is not None:  # the user gate: the master's code, no zip
            _gate_modes(client, token, modes, where)
            server = shlex.join([GATE_WORD, "receive", *steps, "--"])
            done, out = _rsync(target, source, home, server, rules, io_timeout)
            commit = shlex.join([GATE_WORD, "commit", *steps])
        else:
            with _sftp_step(where, "upload the push's code and file modes"):
                sftp = client.open_sftp()
            try:
                with _sftp_step(where, "upload the push's code and file modes"):
                    code = _remote_code(sftp, cache)
                    _upload(sftp, modes, modes_path, 0o600)
                # --opt=value: a value starting with "-" is never taken for an option.
                server = shlex.join([python, code, "receive", f"--home={home}", *steps,
                                     f"--modes={modes_path}", "--"])
                done, out = _rsync(target, source, home, server, rules, io_timeout)
            finally:
                with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
                    sftp.remove(modes_path)  # the master's side removes it once read
                sftp.close()
            commit = shlex.join([python, code, "commit", f"--home={home}", *steps])
        try:
            outcome = _commit(client, commit, where, home)
        except KeyboardInterrupt:
            raise CommitInterrupted(
                f"interrupted while {where} committed the push: it may be queued "
                "(clusterpush.py --master ... abort withdraws it)") from None
    finally:
        client.close()
    note = outcome.get("note")
    stamp = outcome.get("time")
    return RemotePushed(str(outcome.get("target")), str(note) if note else None,
                        _stat(out, "files"), _stat(out, "bytes"), _stat(out, "literal"), out,
                        float(stamp) if isinstance(stamp, int | float) else None)


def _gate_modes(client: paramiko.SSHClient, token: str, modes: bytes, where: str) -> None:
    """Hand the modes list to the gate (it keeps it for the push's receive)."""
    status, out, err = exec_bytes(client, shlex.join([GATE_WORD, "modes", "--token", token]),
                                  ABORT_TIMEOUT, input=modes)
    if status != 0:
        raise PushRefused(f"push to {where} refused; nothing was queued: "
                          f"{_tail((out + err).decode('utf-8', 'replace'))}")


@contextlib.contextmanager
def _sftp_step(where: str, what: str) -> Iterator[None]:
    """SFTP failures as SshError "unreachable" (the connection broke) or ClusterError (the
    master refused a file operation)."""
    try:
        yield
    except (paramiko.SSHException, EOFError, ConnectionError, TimeoutError) as exc:
        raise SshError("unreachable", where, f"cannot {what}: {exc}") from None
    except OSError as exc:  # the SFTP server's refusal (permission, disk full, ...)
        raise ClusterError(f"{where}: cannot {what}: {exc}") from None


def _rsync(target: SshTarget, source: Path, home: str, server: str, rules: bytes,
           io_timeout: float) -> tuple[proc.Result, str]:
    """Run the transfer of :func:`remote_push`; (its result, its stdout) once the master's
    side staged the tree, else :class:`PushRefused`."""
    where = target.where()
    argv = rsync_argv(target, f"{source}/", remote_spec(target, "."), delete=True, extra=[
        "--no-owner", "--no-group", "--copy-links", "--no-D", "--delete-excluded",
        f"--max-size={MAX_PUSH_BYTES}", "--from0", "--exclude-from=-",
        # rsync's --timeout also runs while its server waits for the tree's lock, before
        # the protocol starts: it must outlast the wait a local push allows.  A dead link
        # is noticed sooner, by ssh's keepalive (ssh_command: about a minute).
        f"--timeout={max(1, round(io_timeout + PUSH_LOCK_WAIT))}", "--stats",
        f"--rsync-path={server}"])
    log.debug("running %s", proc.command_text(argv))
    done = run_bound(argv, rules)
    err = done.text("stderr")
    for line in err.splitlines():
        if line.startswith("master: "):
            log.warning("%s", line)
    outcome = _outcome(err, where)
    if outcome is None or "error" in outcome or "staged" not in outcome:
        reason = (str(outcome["error"]) if outcome is not None and "error" in outcome
                  else f"rsync {done.describe()}:\n{_tail(err)}")
        raise PushRefused(f"push to {where}:{home} failed; nothing was queued: {reason}",
                          aborted=bool(outcome and outcome.get("aborted")))
    if not done.ok:
        # The master's side staged the whole tree, but the client saw an error at the end:
        # not sure it is what the developer has, so it is not committed.
        raise PushRefused(f"push to {where}:{home} failed; nothing was queued: rsync "
                          f"{done.describe()}:\n{_tail(err)}")
    return done, done.text()


def _commit(client: paramiko.SSHClient, command: str, where: str,
            home: str) -> dict[str, object]:
    """Send the commit step; its outcome ({"target", "note"}), else :class:`PushRefused`."""
    status, out, err = exec_bytes(client, command, COMMIT_TIMEOUT)
    text = out.decode("utf-8", "replace")
    for line in err.decode("utf-8", "replace").splitlines():
        if line.startswith("master: "):
            log.warning("%s", line)
    outcome = _outcome(text, where)
    if outcome is None or "error" in outcome:
        reason = (str(outcome["error"]) if outcome is not None else
                  f"exit status {status}:\n{_tail(text + err.decode('utf-8', 'replace'))}")
        raise PushRefused(f"push to {where}:{home} was not committed; nothing was queued: "
                          f"{reason}", aborted=bool(outcome and outcome.get("aborted")))
    return outcome


@lru_cache(maxsize=1)
def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, looked up in the parent: the child between fork and exec must not
    load anything (another thread, paramiko's, may hold the loader's lock at the fork)."""
    return ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent(prctl: Callable[..., int], parent: int) -> None:
    """In the child before exec: ask the kernel for SIGKILL when the parent dies
    (``prctl(PR_SET_PDEATHSIG)``, kept across exec), then leave at once if it died
    already."""
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def run_bound(argv: list[str], input: bytes) -> proc.Result:
    """Run ``argv`` (rsync and its ssh) bound to this process's life, with ``input`` on its
    stdin and its output captured.

    In a session of its own (a terminal's ^C reaches only us), with the kernel told to
    SIGKILL it when this process dies by any signal, SIGKILL included (its ssh then sees
    its pipes close and leaves too); and when this process is interrupted or terminated
    (an exception: KeyboardInterrupt, or what a SIGTERM handler raises) the whole group,
    ssh included, gets SIGTERM, then SIGKILL after :data:`KILL_GRACE` s, before the
    exception goes on.  No timeout: rsync's own ``--timeout`` bounds it."""
    started = time.monotonic()
    parent, prctl = os.getpid(), _prctl()
    try:
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=lambda: _die_with_parent(prctl, parent))
    except OSError as exc:
        raise ClusterError(f"cannot start {argv[0]}: {exc}") from None
    try:
        out, err = child.communicate(input)
    except BaseException:
        _stop_group(child)
        raise
    return proc.Result(argv, child.returncode, out, err, time.monotonic() - started)


def _stop_group(child: subprocess.Popen[bytes]) -> None:
    proc.kill_tree(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        pass
    proc.kill_tree(child.pid, signal.SIGKILL)  # ssh too, if it outlived rsync
    child.wait()


def run_step(target: SshTarget, home: str, words: list[str], *, python: str = "python3",
             connect_timeout: float = 15.0, retries: int = 1, cache: str = REMOTE_CACHE,
             timeout: float = ABORT_TIMEOUT, on_out: Callable[[bytes], None] | None = None
             ) -> tuple[int, bytes, bytes]:
    """Run the remote step ``words`` (its name, then its options but ``--home``) on the
    master: through the user gate when the key is restricted to it, else by the push's
    shipped code (uploaded first when missing) with ``--home``.  (exit status, stdout,
    stderr), within ``timeout``; ``on_out`` takes stdout as it comes (see
    :func:`~cluster.runtime.ssh.exec_bytes`).  SshError when the master cannot be reached
    or refuses us."""
    client = _connect(target, connect_timeout, retries)
    try:
        if hello(client) is not None:
            command = shlex.join([GATE_WORD, *words])
        else:
            with _sftp_step(target.where(), "upload the push's code"):
                with client.open_sftp() as sftp:
                    code = _remote_code(sftp, cache)
            command = shlex.join([python, code, words[0], f"--home={home}", *words[1:]])
        return exec_bytes(client, command, timeout, on_out=on_out)
    finally:
        client.close()


def remote_abort(target: SshTarget, home: str, user: str, *, python: str = "python3",
                 connect_timeout: float = 15.0, retries: int = 1,
                 cache: str = REMOTE_CACHE) -> RemoteAborted:
    """``clusterpush.py --master ... abort``: on the master, what a local abort does
    (:func:`cluster.master.files.abort.request_abort`, by the shipped code).  SshError when the
    master cannot be reached or refuses us, ClusterError when the abort failed there."""
    where = target.where()
    status, out, err = run_step(target, home, ["abort", f"--user={user}"], python=python,
                                connect_timeout=connect_timeout, retries=retries,
                                cache=cache)
    text = out.decode("utf-8", "replace")
    outcome = _outcome(text, where)
    if outcome is None or "error" in outcome:
        reason = (str(outcome["error"]) if outcome is not None else
                  f"exit status {status}:\n{_tail(text + err.decode('utf-8', 'replace'))}")
        raise ClusterError(f"abort on {where}:{home} failed: {reason}")
    running = outcome.get("running")
    removed = outcome.get("removed")
    stopped = outcome.get("stopped")
    return RemoteAborted(int(removed) if isinstance(removed, int) else 0,
                         str(running) if running else None,
                         int(stopped) if isinstance(stopped, int) else 0)


def remote_previous_sweep(target: SshTarget, home: str, user: str, sweep_file: str, *,
                          python: str = "python3", connect_timeout: float = 15.0,
                          retries: int = 1, cache: str = REMOTE_CACHE) -> str:
    """``clusterpush.py --master ... --sweep FILE --resume``: the id of the run to resume,
    found on the master by the shipped code as a local push finds it
    (:func:`cluster.triggers.sweeppush.previous_sweep_run`).  SshError when the master
    cannot be reached or refuses us, ClusterError (the master's reason: no such run) when
    it found none.  Nothing is written in the master home."""
    where = target.where()
    status, out, err = run_step(target, home, ["previous", f"--user={user}",
                                               f"--sweep={sweep_file}"], python=python,
                                connect_timeout=connect_timeout, retries=retries,
                                cache=cache)
    text = out.decode("utf-8", "replace")
    outcome = _outcome(text, where)
    if outcome is None or "error" in outcome or not isinstance(outcome.get("run"), str):
        reason = (str(outcome["error"]) if outcome is not None and "error" in outcome else
                  f"exit status {status}:\n{_tail(text + err.decode('utf-8', 'replace'))}")
        raise ClusterError(f"{where}:{home}: {reason}")
    return str(outcome["run"])
