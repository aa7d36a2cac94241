"""A node's work folder kept in bounds: the build folders of the trees it built, and what
earlier layouts of the folder left behind.

The layout (:mod:`cluster.node.runcontext`): ``work_dir/src/<key>`` is the mirror of a tree,
``work_dir/build/<key>`` its kept build folder (:mod:`cluster.node.buildtree`), and beside
the latter ``build/.<key>.manifest`` (the overlay's record, rewritten by every build of the
key), ``build/.<key>.lock`` (held while the folder is updated and built) and
``build/.<key>.use`` (held shared by every run.py whose run uses the key, from its start to
its end: :class:`UseHold`).  A ghostpdl build folder is some 200 MB and every user's tree
is a key of its own, so without a bound they pile up.

:func:`tidy`, at the start of each BUILD:

* keeps at most ``build_keep`` build folders: the run's own and the most recently built
  others (by the manifest's mtime); each older one is removed with its mirror and its
  manifest, lock and use files;
* removes what earlier layouts left in ``src/``: an entry with no build folder of its name.
  Before build folders were kept, a node built in ``src/<source path>`` itself, one folder
  per run for each pushed or committed tree (``src/runs__<id>__source__<tree>``), which
  nothing used again or removed;
* never removes what a run uses: a key goes only while this process holds its ``.use`` file
  exclusively (taken without waiting), which no run.py using the key can then hold.  A key
  that is busy is kept and said to be.

Removal problems (a file that will not go) are reported, never raised: tidying must not fail
a build.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

#: The folders of work_dir holding the trees' mirrors and their build folders.
SRC, BUILD = "src", "build"
#: Suffixes of the files beside ``build/<key>`` (``.<key><suffix>``).
MANIFEST, LOCK, USE = ".manifest", ".lock", ".use"
#: Most names of ``src/`` and ``build/`` one tidy looks at: the bound of its loops.
MAX_NAMES = 10_000
#: How many times a use file replaced between our open and our lock is reopened: each retry
#: means a tidy removed the key meanwhile, which happens once, not in a loop.
MAX_REOPEN = 50


def side_file(build_root: Path, key: str, suffix: str) -> Path:
    """``build_root/.<key><suffix>``: the manifest, lock or use file of ``key``."""
    return build_root / f".{key}{suffix}"


def _lock(path: Path, operation: int) -> int | None:
    """A descriptor of ``path`` (created if missing) holding ``flock(operation)``; None
    when ``operation`` has LOCK_NB and the lock is held elsewhere.

    The lock is checked, once granted, to be on the file now at ``path``: a tidy may have
    removed the file while we waited, and a lock on a removed file guards nothing.  OSError
    when the file keeps being replaced (MAX_REOPEN times)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(MAX_REOPEN):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        held = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)
    raise OSError(errno.EAGAIN, f"{path} was replaced {MAX_REOPEN} times while being locked; "
                                "expected a use file that only a tidy of the work folder "
                                "removes, once")


class UseHold:
    """A run.py's mark that it uses a key's mirror and build folder: a shared lock on
    ``build/.<key>.use``, taken at the run's start (waiting while a tidy removes the key)
    and held until :meth:`release` or the process's end, so no tidy removes the folder whose
    binaries the run's jobs call."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def take(self, build_root: Path, key: str) -> None:
        """Hold ``key`` (releasing a key held before); OSError as :func:`_lock`."""
        self.release()
        self._fd = _lock(side_file(build_root, key, USE), fcntl.LOCK_SH)

    def release(self) -> None:
        """Let the key go (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class Tidied:
    """What :func:`tidy` did: keys whose build folders it removed (least recently built
    first), earlier layouts' entries of ``src/`` it removed, the names it had to keep because
    a run uses them, and the removals that failed (name and why)."""

    keep: int
    removed: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The build log's lines about it (none when there was nothing to do)."""
        out = []
        if self.removed:
            out.append(f"removed the least recently built build folder(s) (build_keep "
                       f"{self.keep}) and their mirrors: {' '.join(self.removed)}")
        if self.leftovers:
            out.append(f"removed what an earlier layout of the work folder left in {SRC}/: "
                       f"{' '.join(self.leftovers)}")
        if self.busy:
            out.append(f"kept, in use by another run: {' '.join(self.busy)}")
        out += [f"could not remove {name}: {why}" for name, why in self.failed]
        return out


def _names(folder: Path, dirs_only: bool) -> list[str]:
    """The names in ``folder`` that are not dot files (of directories only, when asked),
    sorted; at most MAX_NAMES; [] when it is missing."""
    try:
        with os.scandir(folder) as scan:
            entries = sorted(itertools.islice(scan, MAX_NAMES), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [e.name for e in entries if not e.name.startswith(".")
            and (not dirs_only or e.is_dir(follow_symlinks=False))]


def _last_built(build_root: Path, key: str) -> int:
    """When ``key`` was last built (ns): its manifest's mtime, else its folder's."""
    for path in (side_file(build_root, key, MANIFEST), build_root / key):
        try:
            return os.stat(path, follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:
            continue
    return 0


def _delete(path: Path) -> None:
    """Remove a folder (not following links) or a file at ``path``, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _remove_key(work: Path, key: str, tidied: Tidied) -> bool:
    """Remove ``key``'s build folder, mirror and side files unless a run uses it; whether
    it was removed (busy and failed ones are noted in ``tidied``)."""
    build_root = work / BUILD
    use = side_file(build_root, key, USE)
    try:
        fd = _lock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        tidied.failed.append((key, str(exc)))
        return False
    if fd is None:
        tidied.busy.append(key)
        return False
    try:
        for path in (build_root / key, work / SRC / key,
                     side_file(build_root, key, MANIFEST), side_file(build_root, key, LOCK)):
            _delete(path)
        use.unlink()  # last, while held: a run waiting for it then reopens a new one
        return True
    except OSError as exc:
        tidied.failed.append((key, str(exc)))
        return False
    finally:
        os.close(fd)


def tidy(work: Path, current: str, keep: int) -> Tidied:
    """Bound ``work``'s build folders to ``keep`` (0: no bound), ``current`` (the run's key,
    used or about to be) always among them, and remove earlier layouts' leftovers in
    ``src/`` (module docstring).  Never raises for a removal that fails: see
    :attr:`Tidied.failed`."""
    tidied = Tidied(keep)
    build_root = work / BUILD
    builds = _names(build_root, dirs_only=True)
    if keep > 0:
        others = sorted((k for k in builds if k != current),
                        key=lambda k: _last_built(build_root, k), reverse=True)
        for key in reversed(others[keep - 1:]):  # the least recently built first
            if _remove_key(work, key, tidied):
                tidied.removed.append(key)
    kept = set(builds)
    for name in _names(work / SRC, dirs_only=False):
        if name != current and name not in kept and _remove_key(work, name, tidied):
            tidied.leftovers.append(name)
    return tidied
