"""clusterpush: submit a developer's tree as a user run (port of clusterpush.pl).

The tree is mirrored to ``users/<user>/<tree>`` in the master home (``tree`` is ``ghostpdl``
for gs, pdfwrite and ps2write, ``mupdf`` for mupdf), then a ``cluster_command.run``
dropping holding the run's queue line is left beside it.  Priority-0 clustermasters pick
droppings up in phase 1.  ``abort`` is :mod:`cluster.master.files.abort`.

What is sent (ARTIFEX §6.1/§6.2): the whole tree except what :func:`is_excluded` names
(version control, build outputs, rendered images, the cluster's own droppings) and files
over :data:`MAX_PUSH_BYTES`, each of which is logged with its size.  The mirror is exact:
files gone from the tree, excluded files and oversized files are deleted from the pushed
copy (``rsync --delete --delete-excluded``), so a stale ``bin/`` can never stand in for a
build.  Symlinks follow the transport's rule: one to a regular file inside the tree is sent
as that file, any other (leaving the tree, dangling, naming a directory) is left out.

Two copiers give the same result: ``rsync`` when it is on PATH (what the Perl used, and
quick on a large tree that changed little), else the Python copy with the same exclusions;
both are :func:`cluster.runtime.mirror.mirror`.  That reaches the master home as a local (or
shared) directory.  From a machine that does not see it, ``clusterpush.py --master`` sends the
tree with rsync over ssh and runs :func:`cluster.triggers.pushreceive.receive_push` (the
transfer, staged) and then :func:`cluster.triggers.pushreceive.commit_push` (the tree put in
place, the dropping) on the master for the master's side (:mod:`cluster.triggers.remotepush`):
the same lock, checks and dropping.  This module therefore imports nothing beyond the
standard library (the master's ``python3`` runs it without the package's dependencies).

Pushes never get lost or mixed up: the sync and the dropping happen under the
tree's lock (``users/<user>/.<tree>.lock``); :func:`snapshot_push` copies a pushed tree for
the run that builds it under the same lock, so a later push never changes what a running run
builds and diffs; a push of the same user and products as a waiting run replaces it
(:func:`queue_note` says so to the developer).  Nothing below the home is ever a symlink
that a push follows (:func:`user_tree`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from cluster.defaults import USER_PRIORITY
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.queue import QueueFile, running_indices
from cluster.runspec import RunSpec
from cluster.runtime import fsutil, pathlock
from cluster.runtime.mirror import TEMP_PREFIX, auto_method, mirror
from cluster.triggers import droppings
from cluster.triggers.droppings import DROPPING, DROPPINGS, LEGACY_DROPPINGS, REJECTED_SUFFIX

log = logging.getLogger("cluster.push")

#: Files larger than this many bytes are not sent (clusterpush.pl's ``--max-size``: 2.5 MB
#: in 2011, 10 MB later in 2011, 30 MB since 2018).  Big files in a source tree are test
#: outputs or data, and would make every push slow.
MAX_PUSH_BYTES = 30_000_000

#: Directory names never sent, at any depth (rsync ``--exclude=NAME/``): a *file* of that
#: name is sent, as in the Perl, which excluded ``bin`` only as a directory.  Adapted from
#: the lists of clusterpush.pl (§6.1, §6.2) to the products we build: version control;
#: autotools' droppings; the build and object directories of every variant (``bin``,
#: ``obj``, ``debugobj``..., ``*-bin``/``*-obj`` for the per-product and sanitizer ones,
#: ``build``, mupdf's ``debug``/``release``/``generated``).  A node builds from scratch, so
#: a pushed build directory would only cost time, or worse be used instead of the build.
EXCLUDED_DIRS: tuple[str, ...] = (
    ".git", ".svn", ".hg", "CVS",
    ".deps", ".libs", "autom4te.cache",
    "bin", "obj", "debugobj", "pgobj", "sobin", "soobj", "*-bin", "*-obj",
    "build", "debug", "release", "generated",
)

#: Names (shell patterns) never sent at any depth, files or directories (rsync
#: ``--exclude=PATTERN``): configure's log, object files, rendered images (a developer's
#: test outputs can be gigabytes), and the cluster's own droppings: a ``cluster_command.run``
#: in the tree (or ``.rejected`` beside it) must never reach the master as a run request;
#: push_tree writes the real one after the sync.
EXCLUDED_NAMES: tuple[str, ...] = (
    "config.log", "*.o",
    "*.png", "*.ppm", "*.pkm", "*.pgm", "*.pbm", "*.pam", "*.tif", "*.bmp",
    f"{DROPPING}*",
)

#: File names never sent from the top of the tree: the legacy droppings (and the names they
#: are set aside under), which would be taken for run requests there; deeper down, or as
#: directories, they are ordinary entries.
TOP_EXCLUDED_NAMES: tuple[str, ...] = tuple(
    n for name in LEGACY_DROPPINGS for n in (name, f"{name}{REJECTED_SUFFIX}"))

METHODS = ("auto", "rsync", "copy")

#: How long a push waits for its tree's lock [s]: a run's snapshot of the tree (hard links,
#: seconds) or an earlier push of the same user still syncing.
PUSH_LOCK_WAIT = 600.0
#: How long a run's snapshot waits for its tree's lock by default [s]: a push syncing the
#: tree may take long, and the master has its PID file to refresh; TreeBusy tells it to try
#: again at its next invocation.
SNAPSHOT_LOCK_WAIT = 60.0


def is_excluded(path: str) -> bool:
    """Whether the tree entry ``path`` is left out of a push.

    ``path`` is POSIX and relative to the tree's top, a directory's with a trailing ``/``
    (the :data:`cluster.node.transport.Exclude` contract).  Only the last component is matched,
    case-sensitively, as rsync matches a pattern without a ``/``; the legacy droppings
    (:data:`TOP_EXCLUDED_NAMES`) only at the top.
    """
    is_dir = path.endswith("/")
    parent, _, name = path.rstrip("/").rpartition("/")
    if is_dir and any(fnmatchcase(name, pattern) for pattern in EXCLUDED_DIRS):
        return True
    if not parent and not is_dir and name in TOP_EXCLUDED_NAMES:
        return True
    return any(fnmatchcase(name, pattern) for pattern in EXCLUDED_NAMES)


def rsync_excludes() -> list[str]:
    """The ``--exclude`` options saying to rsync what :func:`is_excluded` says."""
    return ([f"--exclude={pattern}/" for pattern in EXCLUDED_DIRS]
            + [f"--exclude={pattern}" for pattern in EXCLUDED_NAMES]
            # Anchored, and files only (rsync has no such rule: "/name" also matches a
            # directory; mirror() passes each left-out entry to rsync literally instead).
            + [f"--exclude=/{name}" for name in TOP_EXCLUDED_NAMES])


# ----------------------------------------------------------------------------------------------
# The user's directories in the master home

class SymlinkInHome(ClusterError):
    """A symlink (or another non-directory) stands where a directory of the home belongs."""

    def __init__(self, path: Path, found: str) -> None:
        super().__init__(str(path), found)
        self.path = path
        self.found = found

    def __str__(self) -> str:
        return (f"{self.path}: {self.found} was found where a directory was expected; "
                "refusing to go through it (nothing was synced, copied or deleted); "
                "an administrator should remove it")


class TreeBusy(ClusterError):
    """A user tree's lock was not granted in time (a push or a snapshot holds it)."""


def _real_dir(path: Path, create: bool, wanted: Path) -> None:
    """Make sure ``path`` is a directory itself, not a symlink; create it if asked.
    ``wanted`` is the tree the caller is after (for the message when one is missing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise ClusterError(f"{wanted} does not exist ({path} is missing); expected a "
                               "tree pushed by clusterpush") from None
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            os.mkdir(path)
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        try:
            where = f"a symlink (to {os.readlink(path)})"
        except OSError:
            where = "a symlink"
        raise SymlinkInHome(path, where)
    if not stat.S_ISDIR(st.st_mode):
        raise SymlinkInHome(path, "a file that is not a directory")


def user_tree(home: Home, user: str, tree: str, *, create: bool = False) -> Path:
    """``users/<user>/<tree>`` once every component below the home is checked with lstat.

    Each of ``users``, ``users/<user>`` and ``users/<user>/<tree>`` must be a directory
    itself: :class:`SymlinkInHome` names the first that is a symlink (or a file), so nothing
    ever syncs, deletes or copies through a link planted there.  The home itself may be a
    symlink (an administrator's choice).  ``create`` makes the missing ones; else a
    missing one is a ClusterError.
    """
    path = home.root
    for part in ("users", user, tree):
        path = path / part
        _real_dir(path, create, home.user_tree(user, tree))
    return path


@contextlib.contextmanager
def tree_locked(home: Home, user: str, tree: str, timeout: float) -> Iterator[None]:
    """Hold ``users/<user>/.<tree>.lock`` (see :func:`cluster.runtime.pathlock.locked`).

    Taken by a push while it syncs and writes the dropping, by a run's snapshot while it
    copies, and (without waiting) by the dropping scan.  :class:`TreeBusy` after
    ``timeout`` seconds.  ``users/<user>`` must have been checked (:func:`user_tree`).
    """
    lock = home.user_tree_lock(user, tree)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(pathlock.locked(lock, timeout=timeout))
        except pathlock.LockTimeout as exc:
            raise TreeBusy(f"{home.user_tree(user, tree)} is locked ({lock}) by a push or a "
                           f"run's snapshot for more than {timeout:g} s; expected it sooner: "
                           "try again later") from exc
        except OSError as exc:  # e.g. a symlink planted at the lock's name (O_NOFOLLOW)
            raise ClusterError(f"cannot lock {lock}: {exc.strerror or exc}; expected a "
                               "regular lock file (an administrator should remove what is "
                               "there)") from exc
        yield


# ----------------------------------------------------------------------------------------------
# The push

@dataclass(frozen=True)
class Pushed:
    """A push done: where the tree went, and what it does to the queue (None: a new run)."""

    target: Path
    note: str | None


def push_tree(home: Home, tree: Path, spec: RunSpec, method: str = "auto") -> Path:
    """:func:`submit_push`, returning only the target."""
    return submit_push(home, tree, spec, method).target


def submit_push(home: Home, tree: Path, spec: RunSpec, method: str = "auto") -> Pushed:
    """Mirror ``tree`` into the user's directory and leave the dropping.

    ``method``: "rsync" runs rsync (ClusterError if it is not on PATH), "copy" the
    transport's Python mirror, "auto" rsync when it is on PATH and the tree is not small
    (:func:`cluster.runtime.mirror.auto_method`), else the copy.  Either way
    the target ends up holding exactly the tree's files less the exclusions (see the module
    docstring); then the dropping is written (atomically), so the sync can never delete it
    and the master never sees a dropping without its tree.  A failed sync (ClusterError)
    leaves no dropping.

    First every directory below the home on the way to the target is checked not to be a
    symlink (:func:`user_tree`: :class:`SymlinkInHome`, nothing touched).  The sync and the
    dropping happen under the tree's lock (:func:`tree_locked`, waiting at most
    :data:`PUSH_LOCK_WAIT`), so a run's snapshot never sees half a push and the scan never
    takes a dropping while its tree changes.  The result's note says, from the queue and
    ``job.start`` as they are just before the dropping is written, whether this push
    replaces a waiting run of the same push, or waits for the running one.
    """
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    if method not in METHODS:
        raise ValueError(f"push method {method!r}: expected one of {', '.join(METHODS)}")
    if method == "rsync" and shutil.which("rsync") is None:
        raise ClusterError("rsync was asked for but is not on PATH; install it or push with "
                           "the built-in copy (clusterpush.py --copy)")
    source = tree.resolve()
    rsync = method == "rsync" or (method == "auto" and auto_method(source) == "rsync")

    def sync(target: Path) -> None:
        if rsync:
            _unshare(source, target)
        # No timeout: the developer who pushes watches it (^C stops rsync's whole tree, see
        # proc.run), and a first push of a large tree over a slow link may rightly take long.
        mirror(source, target, exclude=is_excluded, max_size=MAX_PUSH_BYTES,
               method="rsync" if rsync else "copy", label=source.name, timeout=None)

    pushed = _push_locked(home, spec, sync)
    log.info("queueing %s (tree %s -> %s by %s)", spec.line(), source, pushed.target,
             "rsync" if rsync else "copy")
    if pushed.note:
        log.info("%s", pushed.note)
    return pushed


def _push_locked(home: Home, spec: RunSpec, sync: Callable[[Path], None]) -> Pushed:
    """The part of a push that happens in the master home, local or remote alike: check the
    way to ``users/<user>/<tree>`` (:func:`user_tree`), take the tree's lock, call
    ``sync(target)`` to fill the tree, then work out the note and write the dropping, all
    under the lock.  An exception from ``sync`` leaves no dropping."""
    user_tree(home, spec.ref, spec.tree, create=True)
    with tree_locked(home, spec.ref, spec.tree, PUSH_LOCK_WAIT):
        # Again under the lock: what was checked before waiting may have changed.
        target = user_tree(home, spec.ref, spec.tree, create=True)
        unqueued = [name for name in DROPPINGS if os.path.lexists(target / name)]
        sync(target)
        note = queue_note(home, spec, replaces_dropping=bool(unqueued))
        fsutil.atomic_write(target / DROPPING, spec.line() + "\n")
    return Pushed(target, note)


def queue_note(home: Home, spec: RunSpec, *, replaces_dropping: bool = False) -> str | None:
    """What pushing ``spec`` now does to the priority-0 queue, for the developer; None when
    it simply queues a new run.

    The same rule as the scan (:func:`cluster.triggers.droppings.submit`): a waiting run of
    the same push is replaced in place, a running one is waited for.  ``replaces_dropping``:
    an earlier push's dropping was still waiting for the scan (this push replaces it).
    """
    runs = QueueFile.for_priority(home, USER_PRIORITY).read()
    now = droppings.running(home)
    # Every running run (one per busy lane of priority 0), as the scan's submit sees them.
    busy = running_indices(list(enumerate(runs)), now.specs, now.unknown)
    same = droppings.same_push(spec)
    for i, run in enumerate(runs):
        if i in busy or not same(run):
            continue
        if run == spec:
            return (f"your run '{run}' already waits at position {i + 1} in the queue; it "
                    "will build the tree as pushed now")
        return (f"replacing your waiting run '{run}' (position {i + 1} in the queue) with "
                f"'{spec}'")
    mine = next((runs[i] for i in sorted(busy) if same(runs[i])), None)
    if mine is not None:
        return (f"your run '{mine}' is running (it keeps the tree it started with); "
                "this push is queued after it")
    if replaces_dropping:
        return "this push replaces your previous push, which was not queued yet"
    return None


def _unshare(source: Path, target: Path) -> int:
    """Unlink the files of ``target`` that rsync would change in place; return how many.

    rsync writes a file whose content changed to a new inode (a temp file renamed over it),
    so a run's snapshot hard-linked to the old one keeps it; but a file whose content is
    unchanged and whose mode (or owner) differs is chmod'ed in place, which would change
    the snapshot's copy too.  Only files another link shares (``st_nlink`` > 1) are
    affected, and rsync copies them again.  The Python copy only ever replaces files by
    rename, so it needs none of this.
    """
    unlinked = 0
    for dirpath, _dirs, names in os.walk(target):  # bounded by the tree; no symlink followed
        for name in names:
            path = Path(dirpath) / name
            try:
                have = os.lstat(path)
                if not stat.S_ISREG(have.st_mode) or have.st_nlink < 2:
                    continue
                # Follows a symlink, as rsync --copy-links does.
                want = os.stat(source / path.relative_to(target))
            except OSError:
                continue  # gone from the source: rsync deletes it
            if (stat.S_IMODE(want.st_mode), want.st_uid, want.st_gid) != \
                    (stat.S_IMODE(have.st_mode), have.st_uid, have.st_gid):
                os.unlink(path)
                unlinked += 1
    if unlinked:
        log.debug("%s: %d file(s) shared with a snapshot unlinked before rsync changes their "
                  "mode", target, unlinked)
    return unlinked


# ----------------------------------------------------------------------------------------------
# A run's snapshot of the pushed tree

def snapshot_push(home: Home, user: str, tree: str, dest: Path, *,
                  timeout: float = SNAPSHOT_LOCK_WAIT,
                  then: Callable[[], None] | None = None) -> None:
    """Copy ``users/<user>/<tree>`` to ``dest``: the source a user run builds and diffs.

    A later push (which replaces files by rename, see :func:`_unshare`) never changes the
    snapshot.  Contract:

    * ``dest`` must not exist (ClusterError); its parent is made if missing.  The copy is
      made in a temporary directory beside it (``.<dest name>.<pid>.<random>.tmp``) and
      renamed to ``dest`` when complete, so a killed master leaves no half snapshot under
      the final name (and the next call removes the temporary directories of dead
      processes);
    * files are hard links where the file system allows (``cp -al``), else copies (across
      devices, or where the kernel refuses a link to another user's file);
    * the droppings, and whatever a push leaves out (:func:`is_excluded`), are not copied;
      a symlink is copied as the file it names if that is a regular file inside the tree,
      else left out (never followed out of the tree); special files are left out;
    * every directory below the home on the way must be a real directory
      (:class:`SymlinkInHome`); the copy is made under the tree's lock
      (:func:`tree_locked`), so it never sees half a push: :class:`TreeBusy` after
      ``timeout`` seconds of a push holding it.

    ``then``, if given, is called once the snapshot is in place, before the tree's lock is
    released: write ``job.start`` there (or before calling this).  The scan decides whether
    a push is merged into a waiting run or queued after a running one from job.start, and
    it takes a dropping only under the tree's lock; so a push whose sync follows the
    snapshot is always queued as a run of its own, never merged into this run, which would
    not build it.  (Written after the lock is released, job.start leaves a window in which
    such a push is merged and lost.)
    """
    user_tree(home, user, tree)
    dest = Path(dest)
    if os.path.lexists(dest):
        raise ClusterError(f"snapshot destination {dest} exists; expected a new path")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_snapshots(dest)
    with tree_locked(home, user, tree, timeout):
        src = user_tree(home, user, tree)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.{os.getpid()}.",
                                    suffix=fsutil.TEMP_SUFFIX))
        try:
            linked, copied = link_tree(src, tmp)
            os.chmod(tmp, stat.S_IMODE(os.stat(src).st_mode))
            if os.path.lexists(dest):
                raise ClusterError(f"snapshot destination {dest} appeared while copying; "
                                   "expected one snapshot per run")
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("snapshot of %s in %s: %d file(s) linked, %d copied", src, dest, linked,
                 copied)
        if then is not None:
            then()


def _remove_dead_snapshots(dest: Path) -> None:
    """Remove the temporary directories of snapshots of ``dest`` whose maker is dead."""
    pattern = re.compile(re.escape(f".{dest.name}.") + r"([0-9]+)\.[a-z0-9_]{8}"
                         + re.escape(fsutil.TEMP_SUFFIX))
    try:
        with os.scandir(dest.parent) as it:
            leftovers = [(e.path, int(m.group(1))) for e in it
                         if (m := pattern.fullmatch(e.name)) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for path, pid in leftovers:
        if pid != os.getpid() and not _alive(pid):
            log.info("removing %s, a snapshot left half made by process %d", path, pid)
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's live process
    return True


def link_tree(src: Path, dst: Path) -> tuple[int, int]:
    """Fill the empty directory ``dst`` with ``src``'s snapshot; (files linked, copied)."""
    root = src.resolve()
    linked = copied = 0
    modes: list[tuple[Path, int]] = []
    stack: list[tuple[Path, Path, str]] = [(src, dst, "")]
    while stack:  # bounded: each real directory of the finite tree is pushed once
        here, there, prefix = stack.pop()
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            if entry.name.startswith(TEMP_PREFIX):
                continue  # a copy in flight of a killed push
            if entry.is_symlink():
                if is_excluded(rel):
                    continue
                target = _file_inside(Path(entry.path), root)
                if target is None:
                    log.debug("snapshot %s: leaving out symlink %s (not a file inside the "
                              "tree)", src, rel)
                    continue
                file_src = target
            elif entry.is_dir(follow_symlinks=False):
                if is_excluded(rel + "/"):
                    continue
                sub = there / entry.name
                os.mkdir(sub)
                # Modes last: a read-only directory must be filled first.
                modes.append((sub, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode)))
                stack.append((Path(entry.path), sub, rel + "/"))
                continue
            elif entry.is_file(follow_symlinks=False):
                if is_excluded(rel):
                    continue
                file_src = Path(entry.path)
            else:
                continue  # a fifo, socket or device is never part of a pushed tree
            if _link_or_copy(file_src, there / entry.name):
                linked += 1
            else:
                copied += 1
    for path, mode in reversed(modes):
        os.chmod(path, mode)
    return linked, copied


def _file_inside(link: Path, root: Path) -> Path | None:
    """The regular file inside ``root`` that symlink ``link`` names, or None."""
    try:
        target = link.resolve(strict=True)
        target.relative_to(root)
        return target if stat.S_ISREG(os.stat(target).st_mode) else None
    except (OSError, ValueError, RuntimeError):
        return None


#: errno values of os.link that mean "copy instead" (another device, a file system without
#: hard links, too many links, the kernel's protected_hardlinks refusing another user's file).
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.EOPNOTSUPP)


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` at ``dst`` (True), or copy it with its mode and times (False)."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return True
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    shutil.copy2(src, dst, follow_symlinks=False)
    return False


def requeue(home: Home, spec: RunSpec) -> Pushed:
    """Queue ``spec`` again with the tree as last pushed (``clusterpush --rerun``): the
    dropping written under the tree's lock, as a push writes it, the tree left as it is.
    ClusterError when the user has no pushed tree for it."""
    target = user_tree(home, spec.ref, spec.tree)
    if not target.is_dir():
        raise ClusterError(f"{spec.ref} has no pushed {spec.tree} tree to run again "
                           f"({target} is missing); push it")
    return _push_locked(home, spec, lambda tree: None)
