"""A node's build folder of a tree: kept between runs, updated from the tree's mirror.

The transport's fetch makes the mirror an exact copy of the master's tree (rsync ``-a
--delete``, or the local copy: both keep modification times and leave unchanged files
alone), so it would delete whatever a build wrote into it.  The build therefore runs in a
folder of its own that :func:`overlay` updates from the mirror: only what changed since the
last overlay is written, what the master no longer has is deleted, and what the build made
(objects, the Makefile configure wrote, the binaries) stays, so ``make`` rebuilds only what
changed.

A file new to the build folder keeps the master's mtime (a fresh tree looks exactly as
pushed: the timestamps autotools compares stay in order).  A file that changed gets the
later of the master's mtime and now: newer than every object the last build made from it,
even when the change carries an older mtime (a reverted file, an unpacked archive).  What
the last overlay wrote is recorded in a manifest beside the folder (path, size, mtime, mode
as the mirror had them), which is how a change, and a deletion, is recognised.

Before each build the programs the last one left in the binaries' folder are removed
(:func:`remove_programs`): the jobs never run a stale binary that this build did not make.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.runtime import fsutil
from cluster.runtime.mirror import TEMP_PREFIX

#: Most entries a tree may hold (a ghostpdl tree has about 10,000 files): the walk's bound.
MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class OverlayResult:
    """What :func:`overlay` did: files (and links) written, and deleted."""

    written: int
    deleted: int


def overlay(mirror: Path, build: Path, manifest: Path) -> OverlayResult:
    """Bring ``build`` up to date with ``mirror`` (module docstring); ``manifest`` records
    the state written.  Without a readable manifest the build folder is made afresh (a full
build).  OSError propagates (a full disk); ValueError when the mirror holds
    more than MAX_ENTRIES entries."""
    previous = _load(manifest)
    current = _listing(mirror)
    if not previous and build.exists():
        # Without the record nothing tells a stale file from a current one: start afresh.
        shutil.rmtree(build)
    build.mkdir(parents=True, exist_ok=True)
    now_ns = time.time_ns()
    written = deleted = 0
    for rel in sorted(previous.keys() - current.keys(), reverse=True):
        target = build / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
            deleted += 1
    for rel, sig in sorted(current.items()):
        target = build / rel
        if sig[0] == "d":
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
            continue
        if previous.get(rel) == sig and (target.is_symlink() or target.exists()):
            continue
        changed = rel in previous
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        _write(mirror / rel, target, sig, now_ns if changed else None)
        written += 1
    fsutil.atomic_write(manifest, json.dumps(current, sort_keys=True) + "\n")
    return OverlayResult(written, deleted)


def _write(src: Path, target: Path, sig: list[str | int], fresh_ns: int | None) -> None:
    """Copy ``src`` (a file or a link) to ``target`` through a temporary name.  A file keeps
    its mode, and its mtime, made at least ``fresh_ns`` when that is given."""
    tmp = target.with_name(f"{TEMP_PREFIX}{target.name}")
    tmp.unlink(missing_ok=True)
    if sig[0] == "l":
        os.symlink(os.readlink(src), tmp)
    else:
        shutil.copy2(src, tmp)
        if fresh_ns is not None:
            mtime = max(os.stat(tmp).st_mtime_ns, fresh_ns)
            os.utime(tmp, ns=(mtime, mtime))
    os.replace(tmp, target)


def _listing(root: Path) -> dict[str, list[str | int]]:
    """Every entry under ``root`` by relative path: ``["d"]`` for a folder, ``["l",
    target]`` for a link, ``["f", size, mtime_ns, mode]`` for a file (other kinds and the
    mirror's own temporary files are skipped)."""
    entries: dict[str, list[str | int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root)
        for name in [*dirnames, *filenames]:
            if name.startswith(TEMP_PREFIX):
                continue
            st = os.lstat(base / name)
            rel = (rel_dir / name).as_posix()
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ["l", os.readlink(base / name)]
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ["d"]
            elif stat.S_ISREG(st.st_mode):
                entries[rel] = ["f", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode)]
            if len(entries) > MAX_ENTRIES:
                raise ValueError(f"{root} holds more than {MAX_ENTRIES} entries; expected a "
                                 "source tree")
    return entries


def _load(manifest: Path) -> dict[str, list[str | int]]:
    """The last overlay's listing ({} when there is none, or it is unreadable: then the
    build folder is made afresh)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remove_programs(bin_dir: Path, source_bin: Path) -> list[str]:
    """Remove the programs an earlier build left in ``bin_dir`` (regular files with an
    execute bit directly in it), except those the tree itself has (in ``source_bin``, the
    mirror's folder of the same name); returns their names, sorted.

    So the binaries a run's jobs call were made by this run's build: a build that no
    longer makes one (a target gone, a broken rule) leaves it missing, never stale.  Only
    the link step is redone; the objects stay.
    """
    if not bin_dir.is_dir() or bin_dir.is_symlink():
        return []
    removed = []
    for entry in sorted(bin_dir.iterdir(), key=lambda p: p.name)[:MAX_ENTRIES]:
        st = entry.lstat()
        if (stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
                and not (source_bin / entry.name).exists()):
            entry.unlink()
            removed.append(entry.name)
    return removed
