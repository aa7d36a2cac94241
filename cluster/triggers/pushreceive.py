"""The master's side of ``clusterpush.py --master``: a pushed tree received and committed.

A push from a machine that does not see the master home is two steps, run on the master by
the push's own shipped code (:mod:`cluster.triggers.remotepush`,
:mod:`cluster.cli.pushremote`): :func:`receive_push` (rsync's server fills the staged tree
``users/<user>/.<tree>.incoming.<token>``, hard-linked to the pushed tree so only what
changed is sent) and :func:`commit_push` (the staged tree put in place and the dropping
written under the tree's lock, as a local push does: :mod:`cluster.triggers.push`).
:func:`abort_pushes` stops a user's transfers and withdraws their droppings.  The modes list
(:func:`source_modes`, :func:`write_modes`, :func:`read_modes`) carries the developer's
permission bits, so a file shared with a run's snapshot whose mode changes is unlinked
before rsync would chmod it in place.  Like :mod:`cluster.triggers.push`, this module imports
nothing beyond the standard library (the master's ``python3`` runs it without the package's
dependencies).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.triggers.droppings import DROPPING, DROPPINGS
from cluster.triggers.push import (
    PUSH_LOCK_WAIT,
    Pushed,
    SymlinkInHome,
    TreeBusy,
    is_excluded,
    link_tree,
    queue_note,
    tree_locked,
    user_tree,
)

log = logging.getLogger("cluster.push")

#: The most bytes a modes list (:func:`read_modes`) may hold: a path and a mode per file
#: of a tree whose files are each at most MAX_PUSH_BYTES; a source tree has well under a
#: million files.
MAX_MODES_BYTES = 256 * 1024 * 1024


#: A push's token (made by the client, names its staged tree): 16 lowercase hex digits.
PUSH_TOKEN = re.compile(r"[0-9a-f]{16}")
#: A staged tree nobody holds (its receive ended) and untouched this long [s] is a push
#: whose client died before committing it: the next receive of that user removes it.
#: A living client commits within seconds of its transfer's end.
STALE_STAGED_AGE = 600.0
#: How often the master's side of a transfer looks whether an abort took its staged
#: tree away [s].
ABORT_POLL = 0.5
#: How long rsync's server has to leave after SIGTERM before SIGKILL [s].
SERVER_GRACE = 5.0
#: How long an abort waits for each of the user's trees' lock to withdraw a dropping [s].
ABORT_LOCK_WAIT = 60.0
#: ``.<tree>.<state>.<token>`` in ``users/<user>``: the staged trees of remote pushes.
_STAGED = re.compile(r"\.(?P<tree>[^/]+)\.(?P<state>incoming|aborted|old)\."
                     r"(?P<token>[0-9a-f]{16})")


class PushAborted(ClusterError):
    """The push's staged tree was taken away by ``clusterpush abort``: nothing is queued."""


def staged_tree(home: Home, user: str, tree: str, token: str, state: str = "incoming") -> Path:
    """``users/<user>/.<tree>.<state>.<token>``: where a remote push's transfer lands
    ("incoming"), what an abort renames it to ("aborted"), or where a commit moves the
    tree it replaces ("old")."""
    if not PUSH_TOKEN.fullmatch(token):
        raise ClusterError(f"push token {token!r}: expected 16 lowercase hex digits")
    return home.users / user / f".{tree}.{state}.{token}"


def receive_push(home: Home, spec: RunSpec, server_argv: Sequence[str], *, token: str,
                 modes: Mapping[str, int] | None = None, rsync: str = "rsync") -> Path:
    """The transfer half of the master's side of ``clusterpush.py --master``: run on the
    master, by the remote shell, as rsync's ``--rsync-path`` (see
    :mod:`cluster.triggers.remotepush`).  Returns the staged tree; queues nothing.

    ``server_argv`` is what the rsync client asked its server to run (``--server ...``;
    its stdin and stdout, inherited from this process, are the ssh channel).  Contract:

    * the way to ``users/<user>/<tree>`` is checked to hold no symlink and made; under the
      tree's lock (:func:`tree_locked`, held only for this) the staged trees of pushes
      whose client died are removed (:func:`_remove_stale`), and the push's own staged tree
      ``users/<user>/.<tree>.incoming.<token>`` (:func:`staged_tree`) is made and filled
      with hard links to the pushed tree (as a run's snapshot is), so rsync sends only what
      changed;
    * rsync's server then receives into the staged tree, without the tree's lock: the
      pushed tree, what a run's snapshot copies, is not touched by a transfer.  The server
      runs with its working directory set to the staged tree through a descriptor (the
      client names ``.`` as its destination), so no path is looked up again by name;
    * this process holds an flock on the staged tree while the transfer runs, so no other
      push takes it for abandoned;
    * a transfer that fails (the client died, the link broke: the server's non-zero
      status) or that an abort stopped (:func:`abort_pushes` renamed the staged tree; seen
      every :data:`ABORT_POLL` s, then the server is terminated) removes the staged tree and
      raises ClusterError (:class:`PushAborted` for an abort).

    Only :func:`commit_push`, a separate command the client sends once its transfer ended
    well, puts the staged tree in place and writes the dropping.  ``modes`` (relative POSIX
    path -> permission bits of the developer's file) lets the files the staged tree shares
    with the pushed tree and a run's snapshot be unlinked before rsync would chmod them in
    place (what :func:`_unshare` does for a local push, which can stat the source itself).
    """
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    if not server_argv or server_argv[0] != "--server" or "--sender" in server_argv:
        raise ClusterError(f"remote push: expected rsync's receiving server arguments "
                           f"('--server ...' without --sender), got {list(server_argv)[:4]!r}")
    staged = staged_tree(home, spec.ref, spec.tree, token)
    user_tree(home, spec.ref, spec.tree, create=True)
    with tree_locked(home, spec.ref, spec.tree, PUSH_LOCK_WAIT):
        target = user_tree(home, spec.ref, spec.tree, create=True)
        _remove_stale(home, spec.ref, spec.tree)
        try:
            os.mkdir(staged, 0o700)
        except FileExistsError:
            raise ClusterError(f"remote push: {staged} exists; expected a new push token") from None
        fd = os.open(staged, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # new, ours alone: never waits
            link_tree(target, staged)
        except BaseException:
            os.close(fd)
            shutil.rmtree(staged, ignore_errors=True)
            raise
    try:
        if modes:
            _unshare_modes(fd, staged, modes)
        status, aborted = _serve(fd, staged, [rsync, *server_argv])
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    finally:
        os.close(fd)
    if aborted:
        shutil.rmtree(staged_tree(home, spec.ref, spec.tree, token, "aborted"),
                      ignore_errors=True)
        raise PushAborted(f"remote push into {target} was aborted (clusterpush abort) while "
                          "it transferred; nothing was queued")
    if status != 0:
        shutil.rmtree(staged, ignore_errors=True)
        raise ClusterError(f"remote push: rsync's server on the master exited with status "
                           f"{status} while receiving into {staged}; nothing was queued")
    log.info("received %s into %s (waiting for the client's commit)", spec.line(), staged)
    return staged


def _serve(fd: int, staged: Path, argv: list[str]) -> tuple[int, bool]:
    """Run rsync's server ``argv`` in the directory open as ``fd``; (its exit status,
    whether an abort renamed ``staged`` meanwhile, in which case the server was stopped)."""
    ino = os.fstat(fd).st_ino
    try:
        # Plain Popen, not proc.run: the server must inherit our stdin and stdout (the ssh
        # channel to the client).  No timeout here: the client passes rsync's --timeout,
        # which its server honours too, so a stalled link ends it.
        server = subprocess.Popen(argv, cwd=f"/proc/self/fd/{fd}", pass_fds=(fd,))
    except OSError as exc:
        raise ClusterError(f"remote push: cannot run {argv[0]} on the master: "
                           f"{exc.strerror or exc}; expected rsync on its PATH") from None
    aborted = False
    try:
        # Bounded by the server's life (its --timeout ends a stalled transfer).
        while True:
            try:
                return server.wait(timeout=ABORT_POLL), aborted
            except subprocess.TimeoutExpired:
                pass
            if not aborted and not _same_dir(staged, ino):
                aborted = True
                log.warning("the push was aborted: stopping its transfer")
                server.terminate()
                try:
                    server.wait(timeout=SERVER_GRACE)
                except subprocess.TimeoutExpired:
                    server.kill()
    finally:
        if server.poll() is None:  # we are leaving (a signal): the server goes too
            server.kill()
            server.wait()


def _same_dir(path: Path, ino: int) -> bool:
    try:
        return os.lstat(path).st_ino == ino
    except OSError:
        return False


def commit_push(home: Home, spec: RunSpec, token: str) -> Pushed:
    """The commit half of the master's side of ``clusterpush.py --master``: put the tree
    :func:`receive_push` staged under ``token`` in place and write the dropping; the same
    result as a local push (:func:`submit_push`).

    The client sends this as a command of its own only after its transfer ended well, so a
    client that dies (any signal) queues nothing.  Under the tree's lock: the staged tree
    must still be there (:class:`PushAborted` if an abort renamed it, a ClusterError if it
    is gone), it replaces ``users/<user>/<tree>`` (two renames; the old tree is removed),
    the note is worked out and the dropping written.  A run's snapshot, which takes the
    same lock, sees the old tree or the new, never a mix.
    """
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    staged = staged_tree(home, spec.ref, spec.tree, token)
    aborted = staged_tree(home, spec.ref, spec.tree, token, "aborted")
    old = staged_tree(home, spec.ref, spec.tree, token, "old")
    user_tree(home, spec.ref, spec.tree, create=True)
    with tree_locked(home, spec.ref, spec.tree, PUSH_LOCK_WAIT):
        target = user_tree(home, spec.ref, spec.tree, create=True)
        try:
            st = os.lstat(staged)
        except FileNotFoundError:
            if os.path.lexists(aborted):
                shutil.rmtree(aborted, ignore_errors=True)
                raise PushAborted(f"the push into {target} was aborted (clusterpush abort) "
                                  "before it was committed; nothing was queued") from None
            raise ClusterError(f"no staged tree {staged} to commit; expected the tree this "
                               "push transferred (removed as abandoned, or never "
                               "received): nothing was queued") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SymlinkInHome(staged, "something other than a directory")
        unqueued = [name for name in DROPPINGS if os.path.lexists(target / name)]
        fsutil.swap_dir(staged, target, aside=old)  # "old": _remove_stale's after a crash
        note = queue_note(home, spec, replaces_dropping=bool(unqueued))
        fsutil.atomic_write(target / DROPPING, spec.line() + "\n")
    log.info("queueing %s (tree pushed from another machine -> %s)", spec.line(), target)
    return Pushed(target, note)


def abort_pushes(home: Home, user: str, *, timeout: float = ABORT_LOCK_WAIT) -> int:
    """What ``clusterpush abort`` does to ``user``'s pushes before the queue: every remote
    push of the user still transferring or not yet committed is stopped (its staged tree
    renamed ``.<tree>.aborted.<token>``: its receive stops the transfer, its commit
    queues nothing), and every dropping not yet taken by the scan is removed, under its
    tree's lock (so a commit that won the race with the rename is withdrawn too, and a
    dropping the scan took meanwhile is in the queue, which the caller withdraws from
    next).  Returns how many pushes (staged trees and droppings) it stopped.  A tree whose
    lock is not granted within ``timeout`` (a local push syncing) is named in a warning."""
    user_dir = home.users / user
    try:
        st = os.lstat(user_dir)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        raise SymlinkInHome(user_dir, "something other than a directory")
    stopped = 0
    names = sorted(os.listdir(user_dir))
    for name in names:  # bounded: one directory
        m = _STAGED.fullmatch(name)
        if m is None or m.group("state") != "incoming":
            continue
        try:
            os.rename(user_dir / name, user_dir / f".{m.group('tree')}.aborted.{m.group('token')}")
        except FileNotFoundError:
            continue  # committed or failed meanwhile
        stopped += 1
    for name in names:
        if name.startswith(".") or not (user_dir / name).is_dir() \
                or (user_dir / name).is_symlink():
            continue
        try:
            with tree_locked(home, user, name, timeout):
                for dropping in DROPPINGS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(user_dir / name / dropping)
                        stopped += 1
        except TreeBusy as exc:
            log.warning("%s", exc)
    return stopped


def _remove_stale(home: Home, user: str, tree: str) -> None:
    """Remove the staged trees of ``tree`` that no push will commit: an "old" one (a commit
    killed between its renames), and an "incoming" or "aborted" one no receive holds and
    untouched for :data:`STALE_STAGED_AGE` (its client died after the transfer).  The
    caller holds the tree's lock, as a commit does."""
    user_dir = home.users / user
    now = time.time()
    for name in sorted(os.listdir(user_dir)):  # bounded: one directory
        m = _STAGED.fullmatch(name)
        if m is None or m.group("tree") != tree:
            continue
        path = user_dir / name
        if m.group("state") != "old":
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its transfer runs
            finally:
                os.close(fd)
            # ctime: rsync sets the top directory's times when its transfer ends.
            if now - os.lstat(path).st_ctime < STALE_STAGED_AGE:
                continue
        log.info("removing %s, a push its client never committed", path)
        shutil.rmtree(path, ignore_errors=True)


def _unshare_modes(fd: int, target: Path, modes: Mapping[str, int]) -> int:
    """:func:`cluster.triggers.push._unshare` for a tree open as ``fd`` whose source is on
    another machine: unlink the regular files another link shares whose permission bits
    differ from the developer's (``modes``); return how many.  Owner and group are not
    compared: a remote push does not carry them (the files belong to the account that
    receives them)."""
    unlinked = 0
    for dirpath, _dirs, names, dir_fd in os.fwalk(".", dir_fd=fd):  # no symlink followed
        for name in names:
            rel = os.path.normpath(os.path.join(dirpath, name))
            want = modes.get(rel)
            if want is None:
                continue  # not sent: rsync deletes it, or leaves it (never chmods it)
            try:
                have = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(have.st_mode) and have.st_nlink > 1 \
                    and stat.S_IMODE(have.st_mode) != stat.S_IMODE(want):
                os.unlink(name, dir_fd=dir_fd)
                unlinked += 1
    if unlinked:
        log.debug("%s: %d file(s) shared with a snapshot unlinked before rsync changes their "
                  "mode", target, unlinked)
    return unlinked


def source_modes(source: Path) -> dict[str, int]:
    """The permission bits of each file a push of ``source`` may send, by relative POSIX
    path (a symlink: of the file it names), for :func:`receive_push`.  Excluded directories
    are not walked; listing a file that is not sent is harmless."""
    modes: dict[str, int] = {}
    root = source.resolve()
    for dirpath, dirs, names in os.walk(root):  # bounded by the tree; no symlink followed
        rel_dir = os.path.relpath(dirpath, root)
        prefix = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirs[:] = [d for d in dirs if not is_excluded(f"{prefix}{d}/")]
        for name in names:
            if is_excluded(prefix + name):
                continue
            try:
                modes[prefix + name] = stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode)
            except OSError:
                continue  # dangling, or gone: not sent
    return modes


def write_modes(modes: Mapping[str, int]) -> bytes:
    """``modes`` as :func:`read_modes` reads it: ``<octal mode>\\0<path>\\0`` per file
    (a NUL ends each field: any other byte may be in a file name)."""
    return b"".join(f"{mode:o}".encode() + b"\0" + os.fsencode(path) + b"\0"
                    for path, mode in sorted(modes.items()))


def read_modes(data: bytes) -> dict[str, int]:
    """Parse :func:`write_modes`'s bytes; ClusterError for anything else."""
    if len(data) > MAX_MODES_BYTES:
        raise ClusterError(f"modes list of {len(data)} bytes: expected at most "
                           f"{MAX_MODES_BYTES}")
    fields = data.split(b"\0")
    if fields[-1] != b"" or len(fields) % 2 != 1:
        raise ClusterError("modes list: expected NUL-terminated pairs of an octal mode and a "
                           "path")
    modes: dict[str, int] = {}
    for i in range(0, len(fields) - 1, 2):
        try:
            mode = int(fields[i], 8)
        except ValueError:
            raise ClusterError(f"modes list: {fields[i][:20]!r} is not an octal mode") from None
        path = os.fsdecode(fields[i + 1])
        if not path or path.startswith("/") or ".." in path.split("/"):
            raise ClusterError(f"modes list: {path!r} is not a path inside the tree")
        modes[path] = mode & 0o7777
    return modes


