"""clusterpush: submit a developer's tree as a user run (port of clusterpush.pl).

The tree is mirrored to ``users/<user>/<tree>`` in the master home (``tree`` is ``ghostpdl``
for gs, pdfwrite and ps2write, ``mupdf`` for mupdf), then a ``cluster_command.run``
dropping holding the run's queue line is left beside it.  Priority-0 clustermasters pick
droppings up in phase 1.  ``abort`` is :mod:`cluster.master.abort`.

What is sent (ARTIFEX §6.1/§6.2): the whole tree except what :func:`is_excluded` names
(version control, build outputs, rendered images, the cluster's own droppings) and files
over :data:`MAX_PUSH_BYTES`, each of which is logged with its size.  The mirror is exact:
files gone from the tree, excluded files and oversized files are deleted from the pushed
copy (``rsync --delete --delete-excluded``), so a stale ``bin/`` can never stand in for a
build.  Symlinks follow the transport's rule: one to a regular file inside the tree is sent
as that file, any other (leaving the tree, dangling, naming a directory) is left out.

Two copiers give the same result: ``rsync`` when it is on PATH (what the Perl used, and
quick on a large tree that changed little), else the Python copy with the same exclusions;
both are :func:`cluster.runtime.mirror.mirror`.  The embedded default reaches the master
home as a local (or shared) directory; the ssh route plugs in behind the same function later.
"""

from __future__ import annotations

import logging
import shutil
from fnmatch import fnmatchcase
from pathlib import Path

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.queue import RunSpec
from cluster.runtime import fsutil
from cluster.runtime.mirror import mirror
from cluster.triggers.droppings import DROPPING

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

METHODS = ("auto", "rsync", "copy")


def is_excluded(path: str) -> bool:
    """Whether the tree entry ``path`` is left out of a push.

    ``path`` is POSIX and relative to the tree's top, a directory's with a trailing ``/``
    (the :data:`cluster.node.transport.Exclude` contract).  Only the last component is matched,
    case-sensitively, as rsync matches a pattern without a ``/``.
    """
    is_dir = path.endswith("/")
    name = path.rstrip("/").rpartition("/")[2]
    if is_dir and any(fnmatchcase(name, pattern) for pattern in EXCLUDED_DIRS):
        return True
    return any(fnmatchcase(name, pattern) for pattern in EXCLUDED_NAMES)


def rsync_excludes() -> list[str]:
    """The ``--exclude`` options saying to rsync what :func:`is_excluded` says."""
    return ([f"--exclude={pattern}/" for pattern in EXCLUDED_DIRS]
            + [f"--exclude={pattern}" for pattern in EXCLUDED_NAMES])


def push_tree(home: Home, tree: Path, spec: RunSpec, method: str = "auto") -> Path:
    """Mirror ``tree`` into the user's directory and leave the dropping; return the target.

    ``method``: "rsync" runs rsync (ClusterError if it is not on PATH), "copy" the
    transport's Python mirror, "auto" rsync when it is on PATH, else the copy.  Either way
    the target ends up holding exactly the tree's files less the exclusions (see the module
    docstring); then the dropping is written (atomically), so the sync can never delete it
    and the master never sees a dropping without its tree.  A failed sync (ClusterError)
    leaves no dropping.
    """
    if spec.kind != "user":
        raise ValueError(f"clusterpush submits user runs, not {spec.kind!r}")
    if method not in METHODS:
        raise ValueError(f"push method {method!r}: expected one of {', '.join(METHODS)}")
    rsync = shutil.which("rsync") if method != "copy" else None
    if method == "rsync" and rsync is None:
        raise ClusterError("rsync was asked for but is not on PATH; install it or push with "
                           "the built-in copy (clusterpush.py --copy)")
    target = home.users / spec.ref / spec.tree
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tree.resolve()
    # No timeout: the developer who pushes watches it (^C stops rsync's whole tree, see
    # proc.run), and a first push of a large tree over a slow link may rightly take long.
    mirror(source, target, exclude=is_excluded, max_size=MAX_PUSH_BYTES,
           method="rsync" if rsync else "copy", label=source.name, timeout=None)
    fsutil.atomic_write(target / DROPPING, spec.line() + "\n")
    log.info("queueing %s (tree %s -> %s by %s)", spec.line(), source, target,
             "rsync" if rsync else "copy")
    return target
