"""How a node reaches the master's files.

Seed 000's nodes use ssh/scp/rsync against the master (ARTIFEX.md §4.2: ``scp`` of the start
file, rsync of the source trees).  Everything the node does to the master home goes through
the small :class:`Transport` interface below, so the file-system default and the ssh
implementation are interchangeable (STYLE.md guideline 9).

Paths on the master are ``rel``: relative to the master home, POSIX separators.  Every
method checks ``rel`` lexically and refuses an absolute path, a ``..`` component or a NUL
byte (TransportError naming the path and the rule).  Symlinks the master's admin placed in
the home itself (``tests -> /data/tests``) are trusted; symlinks found *inside* a fetched
tree are never followed out of it.

Two implementations: :class:`LocalTransport` (the master home is a local directory) and
:class:`~cluster.node.sshtransport.SshTransport` (it is on ``master_host``, reached over
ssh: small files and uploads over one paramiko SFTP connection per process, trees with
``rsync -a --delete`` over OpenSSH; see there).
:func:`cluster.node.transports.make_transport` picks the one node.conf's ``transport``
names (this module does not know the ssh one: it is imported only where it is used).

Usage::

    t = make_transport(cfg)                      # cluster.node.transports
    text = t.read_text("job.start")             # None if absent
    t.fetch_tree("tests", work / "tests")        # like rsync -a --delete
    t.fetch_tree("ghostpdl", dest, exclude=lambda p: p.endswith(".o"), max_size=30_000_000)
    t.upload(local_log, "runs/20190408/node7.log.gz")
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

from cluster import nodekeys
from cluster.errors import ClusterError, TransportError
from cluster.runtime import fsutil, mirror, secretfile
from cluster.runtime.mirror import Exclude

if TYPE_CHECKING:
    pass


class Transport(Protocol):
    """The node's view of the master home."""

    def read_text(self, rel: str) -> str | None:
        """The UTF-8 text of the master-home file ``rel``, or None if it does not exist."""
        ...

    def read_secret(self, rel: str) -> str | None:
        """The text of the master-home secret file ``rel`` (a node's key), or None if
        it does not exist; a ClusterError naming the file if it is a symbolic link or open
        to group or others (:mod:`cluster.runtime.secretfile`)."""
        ...

    def fetch_tree(self, rel: str, dest: Path) -> None:
        """Make ``dest`` an exact copy of the master-home directory ``rel``: new and changed
        files copied, files absent from the master deleted (rsync -a --delete)."""
        ...

    def upload(self, src: Path, rel: str) -> None:
        """Copy the local file ``src`` to the master home at ``rel``, creating parent
        directories; readers on the master never see a partial file."""
        ...

    def move_folder(self, src: Path, rel: str) -> bool:
        """Move the local folder ``src`` to the master home at ``rel`` (its parent made)
        when that is a rename on one file system: nothing copied, the folder appears
        whole.  False, with nothing moved, when it cannot be (another file system, or a
        transport that reaches the master otherwise)."""
        ...


def check_rel(rel: str, action: str = "access") -> PurePosixPath:
    """``rel`` as a relative path that stays inside the master home, or TransportError."""
    if not isinstance(rel, str) or not rel:
        raise TransportError(action, repr(rel), "an empty path names no file in the master home")
    if "\0" in rel:
        raise TransportError(action, repr(rel), "a path must not contain a NUL byte")
    path = PurePosixPath(rel)
    if path.is_absolute():
        raise TransportError(action, rel, "the path must be relative to the master home, "
                                          "not absolute")
    if ".." in path.parts:
        raise TransportError(action, rel, "a '..' component would leave the master home")
    if not path.parts:
        raise TransportError(action, rel, "the path names the master home itself, not a file "
                                          "or directory in it")
    return path


class LocalTransport:
    """The master home is a local directory (shared file system, or the master itself)."""

    def __init__(self, master_home: Path) -> None:
        self.root = Path(master_home)

    def __repr__(self) -> str:
        return f"LocalTransport({str(self.root)!r})"

    def _path(self, rel: str, action: str) -> Path:
        return self.root.joinpath(*check_rel(rel, action).parts)

    # -- read ----------------------------------------------------------------------------------
    def read_text(self, rel: str) -> str | None:
        path = self._path(rel, "read")
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise TransportError("read", rel, "is a directory on the master, not a file") from None
        except UnicodeDecodeError as exc:
            raise TransportError("read", rel, f"not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise TransportError("read", rel, exc.strerror or str(exc)) from None

    def read_secret(self, rel: str) -> str | None:
        """See :meth:`Transport.read_secret`: :func:`~cluster.runtime.secretfile.read_secret_file`
        (O_NOFOLLOW, fstat mode check) on the local file."""
        path = self._path(rel, "read")
        try:
            return secretfile.read_secret_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TransportError("read", rel, exc.strerror or str(exc)) from None

    # -- mirror --------------------------------------------------------------------------------
    def fetch_tree(self, rel: str, dest: Path, exclude: Exclude | None = None,
                   max_size: int | None = None) -> None:
        """Make ``dest`` an exact copy of the directory ``rel`` (rsync -a --delete).

        The Python copy of :mod:`cluster.runtime.mirror` (it needs no rsync on the node):
        without ``exclude`` and ``max_size`` every regular file and directory is mirrored;
        ``exclude`` (see :data:`~cluster.runtime.mirror.Exclude`) and ``max_size`` leave
        entries out, and what is left out is also deleted from ``dest``.
        """
        mirror.copy_tree(self._path(rel, "fetch"), Path(dest), exclude=exclude,
                         max_size=max_size, label=rel)

    def left_out(self, rel: str, exclude: Exclude | None = None,
                 max_size: int | None = None) -> list[str]:
        """What ``fetch_tree(rel, ..., exclude, max_size)`` would leave out beyond
        ``exclude`` (see :func:`cluster.runtime.mirror.left_out`)."""
        return mirror.left_out(self._path(rel, "fetch"), exclude=exclude, max_size=max_size,
                               label=rel)

    # -- write ---------------------------------------------------------------------------------
    def upload(self, src: Path, rel: str) -> None:
        """Copy ``src`` to ``rel`` through a temporary file renamed into place, fsync'ed.

        The temporary file is named as :func:`cluster.runtime.fsutil.temp_file` names its
        files (``.<name>.<pid>.<random>.tmp``, this node process's pid), so a half upload
        never carries its final name, and the one a killed node leaves is recognised and
        removed by the master's clean-up at start (``fsutil.remove_dead_temps``).  fsync'ed:
        the uploaded logs are part of the run's archive, which must survive a crash of the
        master's machine as a whole file or not at all.
        """
        target = self._path(rel, "upload")
        if not Path(src).is_file():
            raise TransportError("upload", rel, f"local file {src} does not exist or is not "
                                                "a regular file")
        if target.is_dir():
            raise TransportError("upload", rel, "is a directory on the master")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fsutil.atomic_copy(Path(src), target, fsync=True)
        except OSError as exc:
            raise TransportError("upload", rel, exc.strerror or str(exc)) from None


    def move_folder(self, src: Path, rel: str) -> bool:
        """Rename the local folder ``src`` to ``rel`` when the master home is on its file
        system (:meth:`Transport.move_folder`); False when it is not (EXDEV) or ``rel``'s
        folder cannot be made."""
        target = self._path(rel, "upload")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(src, target)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EACCES):
                return False
            raise TransportError("upload", rel, exc.strerror or str(exc)) from None
        return True


def read_node_key(transport: Transport, name: str) -> str:
    """The text of node ``name``'s own key (``node-keys/<name>.key`` in the master home,
    :mod:`cluster.nodekeys`), read through ``transport``.  A node on the master's own file
    system (:class:`LocalTransport`) makes it when it is missing; any other node must have
    been set up with one (bootstrap_node.py makes it).  ClusterError naming the file when
    it is missing, a link or open to others."""
    rel = nodekeys.key_rel(name)
    text = transport.read_secret(rel)
    if text is None and isinstance(transport, LocalTransport):
        nodekeys.ensure_node_key(transport.root, name)
        text = transport.read_secret(rel)
    if text is None:
        raise ClusterError(f"the master holds no key for node {name} ({rel} in its home): "
                           "bootstrap_node.py makes it for a node it sets up, the "
                           "provisioner (clusterscale.py) for an ephemeral node's job")
    return text
