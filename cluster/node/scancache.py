"""The node-code import scan remembered on disk, across processes.

:func:`cluster.node.code.node_files` parses every module of the node side to find what it
imports (:mod:`ast`: about 1.3 ms a file, 0.1 s for the whole node side).  The supervisor
does it at its start, before its first clustermaster, and so did every test cluster's
supervisor: on a two-core machine under load that was 0.2 s before a queued run could start.
A parse depends only on the file's bytes, so what it found is kept here, per file, under the
same stat key the in-memory cache uses (inode, size, mtime, ctime: a file changed since has
another key, and its entry is ignored), like Python's own ``__pycache__``.

The file is JSON, ``{"version": 1, "files": {"<absolute path>": [ino, size, mtime_ns,
ctime_ns, [sure...], [maybe...]]}}``, at ``$CLUSTER_SCAN_CACHE`` or
``$XDG_CACHE_HOME/regression-cluster/node-code-scan.json`` (``~/.cache`` without it).  It is
only a cache: a missing, unreadable, corrupt or foreign file is taken as empty, a write that
fails (read-only home, full disk) is skipped, and it is replaced atomically, so concurrent
writers leave one whole file.  At most :data:`MAX_ENTRIES` files are kept.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from cluster.runtime import fsutil

log = logging.getLogger("cluster.nodecode")

#: The stat key of a file: inode, size, mtime and ctime (ns).
StatKey = tuple[int, int, int, int]
#: What the scan found in one file: its stat key when read, the modules it surely imports,
#: the ``from`` names that are modules only if such a file exists.
Entry = tuple[StatKey, frozenset[str], frozenset[str]]

VERSION = 1
#: Bound on the files remembered (the node side has about 75; several checkouts share it).
MAX_ENTRIES = 5000
#: The environment variable naming the cache file (tests, or a site's own place).
ENV = "CLUSTER_SCAN_CACHE"


def cache_root() -> Path:
    """The folder of the node code's caches on disk (this one and
    :mod:`cluster.node.bytecodecache`): ``$XDG_CACHE_HOME/regression-cluster``, with
    ``~/.cache`` for ``$XDG_CACHE_HOME`` when it is not set."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "regression-cluster"


def cache_path() -> Path:
    """Where the cache lives (module docstring)."""
    explicit = os.environ.get(ENV)
    return Path(explicit) if explicit else cache_root() / "node-code-scan.json"


def load(path: Path) -> dict[str, Entry]:
    """The entries of the cache file ``path``; empty when it is missing or not a cache of
    this version (never an error: it is only a cache).  Entries of the wrong shape are
    left out one by one."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION \
            or not isinstance(data.get("files"), dict):
        return {}
    entries: dict[str, Entry] = {}
    for where, value in data["files"].items():
        entry = _entry(value)
        if entry is not None:
            entries[where] = entry
    return entries


def _entry(value: object) -> Entry | None:
    """One file's entry from its JSON form; None unless it has exactly the right shape."""
    if not isinstance(value, list) or len(value) != 6:
        return None
    *numbers, sure, maybe = value
    if not all(type(n) is int for n in numbers):
        return None
    if not all(isinstance(names, list) and all(isinstance(n, str) for n in names)
               for names in (sure, maybe)):
        return None
    ino, size, mtime, ctime = numbers
    return (ino, size, mtime, ctime), frozenset(sure), frozenset(maybe)


def save(path: Path, entries: dict[str, Entry]) -> None:
    """Replace the cache file ``path`` with those of ``entries`` whose file still exists
    (the newest :data:`MAX_ENTRIES` by insertion order: a test's copy of the repo leaves
    with its folder); a failure is logged at debug level and otherwise ignored."""
    kept = [item for item in entries.items() if os.path.exists(item[0])][-MAX_ENTRIES:]
    files = {where: [*key, sorted(sure), sorted(maybe)] for where, (key, sure, maybe) in kept}
    text = json.dumps({"version": VERSION, "files": files}, separators=(",", ":"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.atomic_write(path, text, fsync=False)
    except OSError as exc:
        log.debug("node code: scan cache %s not written (%s)", path, exc)
