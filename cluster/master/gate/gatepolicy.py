"""What a restricted node may reach of the master home (the node gate's path policy).

A node set up with ``bootstrap_node.py --restrict`` logs in to the master through the node
gate (:mod:`cluster.master.gate.gate`), which decides every path it asks for here:

* **read**: anything in the master home, except the master's secrets: ``cluster.secret``,
  the ``node-keys/`` folder (but the node's own ``node-keys/<name>.key``) and ``ssh/``
  (localcluster's sshd keys).  Nothing outside the home, wherever a path's links lead,
  except through a link the admin placed directly in the home (``tests -> /data/tests``):
  its target counts as that entry of the home (so ``node-keys -> /secure/keys`` is as
  forbidden as the folder would be).
* **write** (the node's upload area): a run's logs of this node, ``runs/<id>/logs/
  <name>.log`` and ``<name>.build.log``, anything in ``runs/<id>/bmpcmp/``, this node's
  sweep result bundles ``runs/<id>/results/incoming/<name>.<instance>.<n>.tar``
  (:data:`BUNDLE_DIR`, docs/sweeps.md), and the temporary names uploads are written to
  first (:data:`cluster.runtime.fsutil.TEMP_NAME`); the folders ``logs``, ``bmpcmp`` and
  ``results`` may be made in an existing ``runs/<id>/``, and ``incoming`` in its
  ``results/``.  A rename
  only within the upload area.  Nothing else is created, changed or removed.
* **bounded**: what a run's upload area holds -- every regular file in ``runs/<id>/logs``,
  ``runs/<id>/bmpcmp`` and ``runs/<id>/results/incoming``, by its size, whoever wrote it --
  may not pass ``max_upload_bytes`` (master.conf) through a write of the gate: a WRITE that
  would make a file grow past it is refused (``SSH_FX_PERMISSION_DENIED``, naming the file,
  the bound and the run), the file that upload made is removed and its handle closed.
  Checked and written under an ``flock`` on the run's folder, so two nodes' uploads into
  one run cannot pass it together; the count is carried between writes in the run's
  ``.gate-upload-bytes`` (:data:`LEDGER`), so a write does not walk the area each time.
  What else the area holds is never touched: an upload goes to a temporary name first, so
  a refused one leaves the file it would have replaced as it was.

Every path is decided on where it really is (``realpath``; a write on its folder's real
path, the name itself never followed), and the file or folder is then opened and checked
again through ``/proc/self/fd`` so that a link swapped in between cannot lead elsewhere.
:class:`NodeArea` holds the decisions (pure path logic); :class:`GateFileSystem` carries
them out for the SFTP server (:mod:`cluster.runtime.sftpserver`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster import nodekeys
from cluster.config import DEFAULTS
from cluster.datatypes import valid_node_name
from cluster.defaults import BMPCMP_DIR
from cluster.runtime import fsutil
from cluster.runtime.sftpserver import (
    FXF_APPEND,
    FXF_CREAT,
    FXF_EXCL,
    FXF_TRUNC,
    FXF_WRITE,
    Refused,
    SetAttrs,
    write_all,
)

#: Top-level entries of the home a node never reads (the node's own key excepted).
SECRET_ENTRIES = ("cluster.secret", nodekeys.NODE_KEYS_DIR, "ssh")
#: The folders of a run a node uploads into.
LOGS_DIR = "logs"
UPLOAD_DIRS = (LOGS_DIR, BMPCMP_DIR)
#: Where a node uploads a sweep run's result bundles, in the run's folder.
BUNDLE_DIR = ("results", "incoming")
#: Permission bits an upload may carry (no set-id, no sticky bit).
UPLOAD_MODE_MASK = 0o777
#: The folders of a run whose files count against ``max_upload_bytes``: the upload area.
AREA_DIRS = ((LOGS_DIR,), (BMPCMP_DIR,), BUNDLE_DIR)
#: Most entries of a run's upload area the bound's count looks at; past it every write
#: into the run is refused (a bound on the count's walk, far above what a run uploads).
MAX_AREA_ENTRIES = 200_000
#: The gates' running count of what a run's upload area holds, in the run's folder
#: (:class:`GateFileSystem`): a hint that spares a walk of the area at each write.
LEDGER = ".gate-upload-bytes"
#: A gate walks the area again after this many writes on the count alone (so files that
#: came other ways than through the gate are not left out of it for long).
RECOUNT_WRITES = 256


class NodeArea:
    """The decisions for node ``node`` in the master home ``home`` (see the module).

    Paths given to the ``*_verdict`` methods are real (resolved, absolute) paths; each
    returns None when allowed, else the reason, a phrase completing "refused: ...".
    """

    def __init__(self, home: Path | str, node: str) -> None:
        if not valid_node_name(node):
            raise ValueError(f"{node!r} is not a node name (1-64 of [A-Za-z0-9._-])")
        self.node = node
        self.home = os.path.realpath(home)
        self.own_key = nodekeys.key_rel(node)
        #: This node's result bundles' names (cluster.wire.protocol.BUNDLE_NAME's form).
        self.bundle = re.compile(re.escape(node) + r"\.[0-9a-f]{16}\.[0-9]{1,12}\.tar")
        #: Links the admin placed directly in the home: (entry name, real target), the
        #: longest target first so the closest one names a path.
        links: list[tuple[str, str]] = []
        with contextlib.suppress(OSError), os.scandir(self.home) as it:
            for entry in it:
                if entry.is_symlink():
                    links.append((entry.name, os.path.realpath(entry.path)))
        self.links = sorted(links, key=lambda link: -len(link[1]))

    # -- where a real path is ------------------------------------------------------------
    def home_rel(self, real: str) -> str | None:
        """``real`` as a path in the home ("" for the home itself), or None if it is
        outside the home and every admin's link in it."""
        if _inside(real, self.home):
            return os.path.relpath(real, self.home) if real != self.home else ""
        for name, target in self.links:
            if _inside(real, target):
                return name if real == target else f"{name}/{os.path.relpath(real, target)}"
        return None

    def what_is_allowed(self) -> str:
        """The policy in one phrase, for refusals."""
        return (f"node {self.node} may read the master home {self.home} except "
                f"cluster.secret, node-keys/ (but its own {self.own_key}) and ssh/, and "
                f"write only runs/<id>/logs/{self.node}.log, runs/<id>/logs/"
                f"{self.node}.build.log, runs/<id>/{BMPCMP_DIR}/ and runs/<id>/"
                f"{'/'.join(BUNDLE_DIR)}/{self.node}.<instance>.<n>.tar")

    # -- verdicts ------------------------------------------------------------------------
    def read_verdict(self, real: str) -> str | None:
        """Whether the node may read (open, stat) the real path ``real``."""
        rel = self.home_rel(real)
        if rel is None:
            return "it is outside the master home"
        return self._secret(rel)

    def _secret(self, rel: str) -> str | None:
        top = rel.split("/", 1)[0]
        if top in SECRET_ENTRIES and rel != self.own_key:
            return f"{rel} is one of the master's secrets"
        return None

    def tree_verdict(self, real: str) -> str | None:
        """Whether the node may list or fetch the folder ``real`` as a whole: readable, and
        holding none of the secrets (so not the home, nor a folder holding it)."""
        why = self.read_verdict(real)
        if why is not None:
            return why
        for entry in ("", *SECRET_ENTRIES):
            secret = os.path.realpath(os.path.join(self.home, entry))
            if _inside(secret, real):
                what = "the master home" if not entry else entry
                return f"it holds {what} (fetch a folder inside the home)"
        return None

    def upload_verdict(self, real_dir: str, name: str) -> str | None:
        """Whether the node may create, write, change or remove the entry ``name`` of the
        real folder ``real_dir``."""
        rel = self.home_rel(real_dir)
        parts = rel.split("/") if rel else []
        bundles = len(parts) == 4 and parts[0] == "runs" and tuple(parts[2:]) == BUNDLE_DIR
        in_area = bundles or (len(parts) == 3 and parts[0] == "runs"
                              and parts[2] in UPLOAD_DIRS)
        if not in_area or name in ("", ".", "..") or "/" in name:
            return "it is outside the node's upload area"
        temp = fsutil.TEMP_NAME.fullmatch(name)
        target = temp.group("target") if temp else name
        if bundles:
            if not self.bundle.fullmatch(target):
                return f"only this node's result bundles ({self.node}.<instance>.<n>.tar) " \
                       "are written there"
        elif parts[2] == LOGS_DIR:
            if target not in (f"{self.node}.log", f"{self.node}.build.log"):
                return f"only this node's logs ({self.node}.log, {self.node}.build.log) " \
                       "are written there"
        elif target.startswith(".") or not target:
            return "a hidden name that is not an upload's temporary file"
        return None

    def run_of(self, real_dir: str) -> tuple[str, str] | None:
        """(the run id, the run folder's real path) of the upload-area folder ``real_dir``
        (``runs/<id>/logs``, ``runs/<id>/bmpcmp`` or ``runs/<id>/results/incoming``), or
        None for any other folder."""
        rel = self.home_rel(real_dir)
        parts = rel.split("/") if rel else []
        if len(parts) == 3 and parts[0] == "runs" and parts[2] in UPLOAD_DIRS:
            return parts[1], os.path.dirname(real_dir)
        if len(parts) == 4 and parts[0] == "runs" and tuple(parts[2:]) == BUNDLE_DIR:
            return parts[1], os.path.dirname(os.path.dirname(real_dir))
        return None

    def mkdir_verdict(self, real_parent: str, name: str) -> str | None:
        """Whether the node may make the folder ``name`` in the real folder
        ``real_parent``: only ``logs``, ``bmpcmp`` or ``results`` in a run's folder
        ``runs/<id>``, and ``incoming`` in its ``results``."""
        rel = self.home_rel(real_parent)
        parts = rel.split("/") if rel else []
        if len(parts) == 2 and parts[0] == "runs" and name in (*UPLOAD_DIRS, BUNDLE_DIR[0]):
            return None
        if len(parts) == 3 and parts[0] == "runs" and (parts[2], name) == BUNDLE_DIR:
            return None
        return "it is outside the node's upload area (only runs/<id>/logs, " \
               f"runs/<id>/{BMPCMP_DIR}, runs/<id>/{BUNDLE_DIR[0]} and runs/<id>/" \
               f"{'/'.join(BUNDLE_DIR)} are made)"


def _open_new(name: str, flags: int, mode: int, dfd: int) -> tuple[int, bool]:
    """``os.open(name, flags, mode, dir_fd=dfd)``, and whether it made the file: tried
    with ``O_EXCL`` first when ``O_CREAT`` is asked, so the answer is the kernel's."""
    if not flags & os.O_CREAT:
        return os.open(name, flags, mode, dir_fd=dfd), False
    if flags & os.O_EXCL:
        return os.open(name, flags, mode, dir_fd=dfd), True
    try:
        return os.open(name, flags | os.O_EXCL, mode, dir_fd=dfd), True
    except FileExistsError:
        return os.open(name, flags & ~os.O_CREAT, mode, dir_fd=dfd), False


def _inside(path: str, root: str) -> bool:
    """Whether the real path ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def area_bytes(run_dir: str) -> int:
    """The bytes the upload area of the run folder ``run_dir`` holds: the sizes of the
    regular files (links not followed) in its :data:`AREA_DIRS`; a folder not there counts
    0.  Refused past :data:`MAX_AREA_ENTRIES` entries."""
    total = entries = 0
    for parts in AREA_DIRS:
        try:
            it = os.scandir(os.path.join(run_dir, *parts))
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                entries += 1
                if entries > MAX_AREA_ENTRIES:
                    raise Refused(f"nodegate: the upload area of {run_dir} holds more than "
                                  f"{MAX_AREA_ENTRIES} entries; nothing more is written")
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # renamed or removed meanwhile
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


@contextlib.contextmanager
def run_locked(run_dir: str) -> Iterator[int]:
    """An exclusive ``flock`` on the run folder ``run_dir`` while the block runs (given its
    descriptor): the bound's count and the write it allows are one step for every gate of
    the run."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def read_ledger(run_fd: int) -> int | None:
    """The count in the run folder's :data:`LEDGER`, or None (absent, or not a count: a
    gate killed while writing it)."""
    try:
        fd = os.open(LEDGER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=run_fd)
    except OSError:
        return None
    try:
        text = os.read(fd, 64)
    finally:
        os.close(fd)
    return int(text) if text.strip().isdigit() else None


def write_ledger(run_fd: int, held: int | None) -> None:
    """Make the run folder's :data:`LEDGER` say ``held`` (None: remove it, so the next
    write walks the area)."""
    if held is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(LEDGER, dir_fd=run_fd)
        return
    fd = os.open(LEDGER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=run_fd)
    try:
        write_all(fd, b"%d\n" % held, 0)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class _Upload:
    """A file opened for writing in a run's upload area: the client's path, the folder's
    real path and the name in it, the run, whether this open made the file, and the file's
    identity (to remove that file, never another put there since under its name)."""

    full: str
    folder: str
    name: str
    run: str
    run_dir: str
    created: bool
    ident: tuple[int, int]


def fd_path(fd: int) -> str:
    """The real path of what ``fd`` holds open (Linux: ``/proc/self/fd``).  OSError if the
    kernel cannot name it (removed since it was opened: ``... (deleted)``; not a path)."""
    path = os.readlink(f"/proc/self/fd/{fd}")
    if not path.startswith("/") or path.endswith(" (deleted)"):
        raise OSError(errno.ENOENT, f"removed while it was opened ({path})")
    return path


class GateFileSystem:
    """The SFTP server's file system for one node (:class:`cluster.runtime.sftpserver.
    FileSystem`): every request decided by ``area``; refusals name the path, the reason and
    what is allowed."""

    def __init__(self, area: NodeArea, cwd: str | None = None,
                 max_upload_bytes: int = DEFAULTS.max_upload_bytes) -> None:
        self.area = area
        self.cwd = cwd or os.getcwd()
        self.max_upload_bytes = max_upload_bytes
        #: The files open for writing, by descriptor (each entry replaced when open()
        #: hands out its number again; a closed one's entry is never used).
        self._uploads: dict[int, _Upload] = {}
        #: Writes allowed on the ledger's count since this gate last walked an area (its
        #: first write walks: what came into the area other ways since is counted).
        self._on_count = RECOUNT_WRITES

    def _abs(self, path: bytes) -> str:
        text = os.fsdecode(path)
        if "\0" in text or not text:
            raise Refused(f"node {self.area.node}: an empty path or one with a NUL byte")
        return os.path.normpath(os.path.join(self.cwd, text))

    def _refuse(self, action: str, path: str, why: str) -> Refused:
        return Refused(f"nodegate: {action} {path} refused: {why}; {self.area.what_is_allowed()}")

    def _split(self, path: bytes) -> tuple[str, str, str]:
        """(the client's absolute path, its folder's real path, its name)."""
        full = self._abs(path)
        parent, name = os.path.split(full)
        return full, os.path.realpath(parent), name

    @contextlib.contextmanager
    def _upload_dir(self, action: str, path: bytes) -> Iterator[tuple[int, str]]:
        """The folder of an upload-area entry, opened and checked: (its fd, the name)."""
        full, real_dir, name = self._split(path)
        why = self.area.upload_verdict(real_dir, name)
        if why is not None:
            raise self._refuse(action, full, why)
        fd = os.open(real_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            held = fd_path(fd)
            why = self.area.upload_verdict(held, name)
            if why is not None:  # the folder was swapped for a link meanwhile
                raise self._refuse(action, full, why)
            yield fd, name
        finally:
            os.close(fd)

    # -- FileSystem ----------------------------------------------------------------------
    def open(self, path: bytes, pflags: int, mode: int | None) -> int:
        if pflags & (FXF_WRITE | FXF_APPEND | FXF_CREAT | FXF_TRUNC):
            flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_CREAT if pflags & FXF_CREAT else 0
            flags |= os.O_TRUNC if pflags & FXF_TRUNC else 0
            flags |= os.O_EXCL if pflags & FXF_EXCL else 0
            flags |= os.O_APPEND if pflags & FXF_APPEND else 0
            perm = (mode if mode is not None else 0o644) & UPLOAD_MODE_MASK
            with self._upload_dir("writing", path) as (dfd, name):
                fd, created = _open_new(name, flags, perm, dfd)
                folder = fd_path(dfd)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
            run = self.area.run_of(folder)
            assert run is not None, folder  # _upload_dir allowed only the upload area
            self._uploads[fd] = _Upload(self._abs(path), folder, name, run[0], run[1],
                                        created, (st.st_dev, st.st_ino))
            return fd
        full = self._abs(path)
        self._check_read("reading", full, os.path.realpath(full))
        # O_NONBLOCK: a FIFO put there must not hang the gate; checked again on what opened.
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            self._check_read("reading", full, fd_path(fd))
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file (only files are read)")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        self._uploads.pop(fd, None)
        return fd

    def write(self, fd: int, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset``, unless the file would grow past what its run's
        upload area may hold (``max_upload_bytes``, see the module): then the file this
        upload made is removed and Refused names it, the bound and the run.

        What the area holds is counted by a walk of it (:func:`area_bytes`), and carried
        from write to write in the run's :data:`LEDGER`, each gate adding what it wrote,
        all under the run folder's lock: a write is allowed on the ledger's count, and
        refused only on a fresh walk's (a file removed or replaced since only makes the
        ledger count high, never a refusal wrong).  Each gate walks at its first write, then
        every :data:`RECOUNT_WRITES` writes, and whenever the ledger is missing."""
        up = self._uploads.get(fd)
        if up is None:  # every handle opened for writing is an upload: never here
            raise OSError(errno.EBADF, "not a file opened for an upload")
        with run_locked(up.run_dir) as run_fd:
            grow = offset + len(data) - os.fstat(fd).st_size
            if grow <= 0:
                write_all(fd, data, offset)
                return
            held = read_ledger(run_fd) if self._on_count < RECOUNT_WRITES else None
            if held is None or held + grow > self.max_upload_bytes:
                held = area_bytes(up.run_dir)
                self._on_count = 0
            if held + grow > self.max_upload_bytes:
                removed = self._discard(fd, up)
                write_ledger(run_fd, None)
                raise Refused(
                    f"nodegate: writing {up.full} refused: run {up.run}'s uploads may "
                    f"hold at most {self.max_upload_bytes} bytes (max_upload_bytes); "
                    f"they hold {held}, and this write would add {grow}; "
                    + ("the partial file was removed" if removed else
                       "the file keeps what was written before"))
            write_all(fd, data, offset)
            write_ledger(run_fd, held + grow)
            self._on_count += 1

    def _discard(self, fd: int, up: _Upload) -> bool:
        """Remove the file of the refused upload ``up`` if this upload made it and its name
        still names it (a file that was there before is left as it is); whether it was."""
        del self._uploads[fd]
        if not up.created:
            return False
        dfd = os.open(up.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if self.area.upload_verdict(fd_path(dfd), up.name) is not None:
                return False  # the folder was swapped meanwhile: not ours to touch
            st = os.lstat(up.name, dir_fd=dfd)
            if (st.st_dev, st.st_ino) != up.ident:
                return False  # renamed into place, or replaced: someone else's now
            os.unlink(up.name, dir_fd=dfd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(dfd)

    def _check_read(self, action: str, full: str, real: str) -> None:
        why = self.area.read_verdict(real)
        if why is not None:
            raise self._refuse(action, full, why)

    def stat(self, path: bytes, follow: bool) -> os.stat_result:
        full, real_dir, name = self._split(path)
        real = os.path.realpath(full) if follow or name in ("", ".", "..") \
            else os.path.join(real_dir, name)
        self._check_read("stat of", full, real)
        return os.stat(real) if follow else os.lstat(real)

    def setstat(self, path: bytes, attrs: SetAttrs) -> None:
        with self._upload_dir("changing", path) as (dfd, name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
            try:
                self.fsetstat(fd, True, attrs)
            finally:
                os.close(fd)

    def fsetstat(self, fd: int, writable: bool, attrs: SetAttrs) -> None:
        if not writable:
            raise Refused(f"nodegate: changing a file opened for reading refused; "
                          f"{self.area.what_is_allowed()}")
        if attrs.owner is not None or attrs.size is not None:
            raise Refused("nodegate: changing an upload's owner or size refused (only its "
                          "permission bits and times)")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if attrs.mode is not None:
            os.fchmod(fd, attrs.mode & UPLOAD_MODE_MASK)
        if attrs.times is not None:
            os.utime(fd, attrs.times)

    def mkdir(self, path: bytes, mode: int | None) -> None:
        full, real_parent, name = self._split(path)
        why = self.area.mkdir_verdict(real_parent, name)
        if why is not None:
            raise self._refuse("making the folder", full, why)
        fd = os.open(real_parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            why = self.area.mkdir_verdict(fd_path(fd), name)
            if why is not None:
                raise self._refuse("making the folder", full, why)
            os.mkdir(name, 0o755, dir_fd=fd)
        finally:
            os.close(fd)

    def remove(self, path: bytes) -> None:
        with self._upload_dir("removing", path) as (dfd, name):
            os.unlink(name, dir_fd=dfd)

    def rename(self, old: bytes, new: bytes, replace: bool) -> None:
        with self._upload_dir("renaming", old) as (ofd, oname), \
                self._upload_dir("renaming onto", new) as (nfd, nname):
            if not replace:
                with contextlib.suppress(FileNotFoundError):
                    os.lstat(nname, dir_fd=nfd)
                    raise OSError(errno.EEXIST, "the target exists")
            os.rename(oname, nname, src_dir_fd=ofd, dst_dir_fd=nfd)

    def realpath(self, path: bytes) -> bytes:
        # Lexical only: the real target of a link is not the node's business.
        return os.fsencode(self._abs(path or b"."))
