"""What made a program's output on this node, as one digest per program: the build part of
a job's key in the master's result cache (docs/results.md, "A job's key").

After a successful build the node computes, for each program of job.start's ``programs``
that the build made (``<bin_dir>/<prog>``), a digest over the program's **parts**, each a
name and a value:

* what the program loads and runs (:mod:`cluster.node.loadset`): the program file itself,
  for an ELF program its shared libraries as this node's loader resolves them, for a
  script or wrapper its interpreter and the executables it names, followed to their own
  libraries; each file by its content's sha256, named by its absolute path, or
  ``tree:<path>`` when it lies in the build tree (the program: ``tree:bin/gs``);
  ``missing:<library>`` for a library the loader does not find;
* ``tree``: the digest of the tree's run-time files (:mod:`cluster.node.treefiles`: the
  whole build tree but what the build made from it, or the tree's declared list), one for
  all programs of the tree; when it moves, the files that changed are named
  ``tree:<path>``;
* ``os`` (the sha256 of ``/etc/os-release``) and ``arch`` (the machine, ``x86_64``);
* ``env:<VAR>`` for the environment variables that steer the loader and the products
  (:data:`ENV_VARS`), as the jobs get them;
* each file of the node's ``reuse_environment`` setting (files or folders: fonts, a
  licence file), by its absolute path: what cannot be found by looking.

Per program, not per tree: a rebuilt gpcl6 changes the key of the pcl jobs only (the
binaries' folder is not part of the tree part).  Contents are hashed, not the source
tree's history: two nodes whose compilers make different binaries, or whose libraries
differ, get different digests, so each keeps its own keys.

**Fast.** File hashes are remembered per build tree in the node's work folder
(``work_dir/keycache/<tree>.hashes``, :class:`cluster.node.hashcache.HashCache`): a file
is read again only when its size, mtime, ctime or inode moved, so a second computation
over an unchanged ghostpdl tree only stats its files (docs/results.md gives the
figures).

**What changed.** Beside it, ``work_dir/keycache/<tree>.keys`` keeps each program's last
parts and the tree's file list.  When a program's digest moved since, :func:`build_keys`
names the parts that changed (``keychanges`` header: how many, and the first
:data:`cluster.wire.protocol.MAX_KEY_PARTS`; files outside the tree first), which the
master's report quotes.  A node restarted within the same run sends the same changes again.

A program whose parts cannot be known (unreadable, a loader that fails) gets no digest:
the master then runs its jobs.  A tree file or ``reuse_environment`` file that cannot be
read is a part ``unreadable`` (its repair changes the key).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.node import treefiles
from cluster.node.hashcache import HashCache
from cluster.node.loadset import LoadSetError, Resolver
from cluster.runtime import fsutil
from cluster.wire.protocol import MAX_KEY_PARTS, KeyChanges

log = logging.getLogger("cluster.builddigest")

#: The folder of the caches, in the node's work_dir.
KEYCACHE = "keycache"
#: Suffixes of a tree's two cache files in it.
HASHES, KEYS = ".hashes", ".keys"
#: Format of the ``.keys`` file.
KEYS_VERSION = 1
#: Environment variables that are parts of every program's key: the loader's, and those
#: ghostpdl reads for its search paths and default options.
ENV_VARS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "GS_LIB", "GS_FONTPATH", "GS_OPTIONS",
            "GS_DEVICE")
#: Where the OS release is described (the first that exists).
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")
#: The most files the ``reuse_environment`` paths give in all (a bound on their walk).
MAX_ENVIRONMENT_FILES = 200_000
#: The prefix of a tree file's part name.
TREE = "tree:"


@dataclass(frozen=True)
class BuildKeys:
    """The digests of a build's programs, and what changed in each whose digest moved
    since this node last computed it (both sorted by program)."""

    digests: tuple[tuple[str, str], ...]
    keychanges: KeyChanges


def build_keys(tree: Path, bin_dir: Path, programs: Iterable[str], *,
               cache_dir: Path | None = None, run: str = "",
               environment: Sequence[str | Path] = (),
               env: Mapping[str, str] | None = None) -> BuildKeys:
    """The digest of each of ``programs`` that is a regular file in ``bin_dir`` (the
    build's binaries' folder in ``tree``), and the key changes (module docstring).

    ``cache_dir``: where the file hashes and last parts are kept (None: nothing kept, no
    changes named); ``run``: the run's id (a restart within it names the same changes);
    ``environment``: the node's ``reuse_environment`` paths; ``env``: the jobs'
    environment (default: this process's).  A program missing, unreadable or whose
    libraries cannot be known is left out (logged).  OSError when the tree cannot be
    walked, ValueError for a bad run-time list: the caller then sends no digests."""
    env = dict(os.environ if env is None else env)
    tree, bin_dir = tree.absolute(), bin_dir.absolute()  # parts are named by absolute paths
    hashes_path = keys_path = None
    if cache_dir is not None:
        _prune(cache_dir, tree.parent)
        hashes_path = cache_dir / (tree.name + HASHES)
        keys_path = cache_dir / (tree.name + KEYS)
    cache = HashCache(hashes_path)
    old = _read_keys(keys_path)
    listing = treefiles.runtime_files(tree, bin_dir)
    tree_files = _tree_values(tree, listing, cache)
    tree_digest = _digest_of(["tree 1", listing.declared, listing.truncated,
                              sorted(tree_files.items())])
    common = _node_parts(env, environment, cache)
    common["tree"] = tree_digest
    resolver = Resolver(cache, env)
    prefixes = _tree_prefixes(tree)
    digests: list[tuple[str, str]] = []
    changes: list[tuple[str, int, tuple[str, ...]]] = []
    programs_old = old.get("programs", {})
    programs_new = dict(programs_old)
    named: tuple[str, ...]
    for name in sorted(set(programs)):
        path = bin_dir / name
        if not path.is_file():
            continue
        try:
            loaded = resolver.load_set(path)
        except (OSError, LoadSetError) as exc:
            log.warning("program %s left out of the result cache's keys: %s", path, exc)
            continue
        parts = dict(common)
        for where, value in loaded.items():
            parts[_part_name(where, prefixes)] = value
        digest = _digest_of(["program 2", name, sorted(parts.items())])
        digests.append((name, digest))
        previous = programs_old.get(name)
        count, named = 0, ()
        if isinstance(previous, dict) and previous.get("digest") != digest:
            count, named = _changed(previous.get("parts"), parts, old.get("tree"), tree_files)
        elif isinstance(previous, dict) and run and previous.get("run") == run:
            count, named = _stored_changes(previous.get("changes"))
        if count:
            changes.append((name, count, tuple(named)))
        programs_new[name] = {"digest": digest, "run": run, "parts": parts,
                              "changes": [count, list(named)]}
    cache.save()
    new_tree = {"digest": tree_digest, "files": tree_files}
    if keys_path is not None and (programs_new != programs_old or old.get("tree") != new_tree):
        _write_keys(keys_path, {"version": KEYS_VERSION, "programs": programs_new,
                                "tree": new_tree})
    return BuildKeys(tuple(digests), tuple(changes))


def environment_digest(env: Mapping[str, str] | None = None,
                       environment: Sequence[str | Path] = ()) -> str:
    """The digest of the parts every program of this node shares, and nothing of the build:
    ``os``, ``arch``, the ``env:<VAR>`` of the jobs' environment ``env`` (default: this
    process's) and the ``reuse_environment`` files ``environment``.  Two machines with the
    same environment digest differ, for a program's key, only in what it loads and its
    tree.  Each file is read (no hash cache): a few files, unless ``environment`` names
    large folders."""
    parts = _node_parts(dict(os.environ if env is None else env), environment, HashCache(None))
    return _digest_of(["environment 1", sorted(parts.items())])


#: How a node's build log says the keys it sent (:func:`keys_line`).
KEYS_LINE = re.compile(r"node (\S+): keys of run (\S+): environment ([0-9a-f]{64})"
                       r"((?: [A-Za-z0-9_.+-]+=[0-9a-f]{64})*)$")


def keys_line(node: str, run: str, environment: str,
              digests: Iterable[tuple[str, str]]) -> str:
    """The build log's line of a node's keys for a run: its environment digest and each
    program's digest (``clusteradmin repro`` reads it from the archived build log)."""
    words = "".join(f" {program}={digest}" for program, digest in digests)
    return f"node {node}: keys of run {run}: environment {environment}{words}"


def parse_keys_line(line: str) -> tuple[str, str, str, tuple[tuple[str, str], ...]] | None:
    """(node, run, environment digest, program digests) of a :func:`keys_line`; None for
    any other line."""
    m = KEYS_LINE.match(line.rstrip("\n"))
    if m is None:
        return None
    digests = tuple(tuple(w.split("=", 1)) for w in m.group(4).split())
    return m.group(1), m.group(2), m.group(3), digests  # type: ignore[return-value]


def program_digests(tree: Path, bin_dir: Path, programs: Iterable[str], *,
                    cache_dir: Path | None = None,
                    environment: Sequence[str | Path] = ()) -> tuple[tuple[str, str], ...]:
    """The digests alone (:func:`build_keys`)."""
    return build_keys(tree, bin_dir, programs, cache_dir=cache_dir,
                      environment=environment).digests


def _digest_of(value: object) -> str:
    """The sha256 hex of ``value`` as canonical JSON (paths with any bytes included:
    surrogates are escaped, never merged)."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _tree_prefixes(tree: Path) -> tuple[str, ...]:
    """The tree's path as named and resolved, each with a final ``/``."""
    named = str(tree.absolute()).rstrip("/") + "/"
    real = str(tree.resolve()).rstrip("/") + "/"
    return (named,) if named == real else (named, real)


def _part_name(path: str, prefixes: tuple[str, ...]) -> str:
    """A loaded file's part name: ``tree:<relative path>`` inside the tree, else the path."""
    for prefix in prefixes:
        if path.startswith(prefix):
            return TREE + path[len(prefix):]
    return path


def _file_value(cache: HashCache, path: str) -> str:
    """A file's part value: its content's sha256, ``missing`` or ``unreadable``."""
    try:
        return cache.sha256(path)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "unreadable"


def _tree_values(tree: Path, listing: treefiles.TreeFiles,
                 cache: HashCache) -> dict[str, str]:
    """relative path -> value (sha256, or ``link:<target>``) of the tree's run-time files."""
    out: dict[str, str] = {}
    base = str(tree.absolute()).rstrip("/") + "/"
    for rel, target in listing.files:
        out[rel] = f"link:{target}" if target is not None else _file_value(cache, base + rel)
    return out


def _node_parts(env: Mapping[str, str], environment: Sequence[str | Path],
                cache: HashCache) -> dict[str, str]:
    """The parts every program of this node shares: ``os``, ``arch``, ``env:<VAR>`` and
    the ``reuse_environment`` files."""
    parts: dict[str, str] = {"arch": platform.machine() or "unknown", "os": "unknown"}
    for release in OS_RELEASE:
        if os.path.isfile(release):
            parts["os"] = _file_value(cache, release)
            break
    for var in ENV_VARS:
        if var in env:
            parts[f"env:{var}"] = env[var]
    count = 0
    for entry in environment:
        top = os.path.abspath(os.path.expanduser(str(entry)))
        if os.path.isdir(top):
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames.sort()
                for name in sorted(filenames):
                    count += 1
                    if count > MAX_ENVIRONMENT_FILES:
                        parts["environment:truncated"] = "yes"
                        return parts
                    path = os.path.join(dirpath, name)
                    parts[path] = _file_value(cache, path)
        elif os.path.lexists(top):
            parts[top] = _file_value(cache, top)
        else:
            parts[top] = "missing"
    return parts


def _changed(old_parts: object, parts: dict[str, str], old_tree: object,
             tree_files: dict[str, str]) -> tuple[int, tuple[str, ...]]:
    """How many parts differ between a program's last parts and ``parts``, and the first
    :data:`MAX_KEY_PARTS` of them: files outside the tree and the node's parts first, then
    the tree's files (``tree:<path>``; just ``tree`` when the last file list kept is not
    the one the program's last key was made with)."""
    old = old_parts if isinstance(old_parts, dict) else {}
    moved = sorted(k for k in set(old) | set(parts) if old.get(k) != parts.get(k))
    outside = [k for k in moved if not k.startswith(TREE) and k != "tree"]
    inside = [k for k in moved if k.startswith(TREE)]
    tree_moved: list[str] = []
    if "tree" in moved:
        last = old_tree if isinstance(old_tree, dict) else {}
        files = last.get("files")
        if last.get("digest") == old.get("tree") and isinstance(files, dict):
            tree_moved = [TREE + rel for rel in sorted(set(files) | set(tree_files))
                          if files.get(rel) != tree_files.get(rel)]
        if not tree_moved:
            tree_moved = ["tree"]
    named = outside + inside + tree_moved
    return len(named), tuple(named[:MAX_KEY_PARTS])


def _stored_changes(value: object) -> tuple[int, tuple[str, ...]]:
    """The ``changes`` a ``.keys`` entry kept: (count, names); (0, ()) when malformed."""
    if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and all(isinstance(n, str) for n in value[1])):
        return value[0], tuple(value[1][:MAX_KEY_PARTS])
    return 0, ()


def _read_keys(path: Path | None) -> dict[str, Any]:
    """The ``.keys`` file's content; empty when there is none or it does not read back."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("key cache %s unreadable (%s): no changes named this time", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("version") != KEYS_VERSION:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _write_keys(path: Path, data: dict[str, object]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.atomic_write(path, json.dumps(data, separators=(",", ":")), fsync=False)
    except OSError as exc:
        log.warning("cannot write the key cache %s: %s", path, exc)


def _prune(cache_dir: Path, build_root: Path) -> None:
    """Remove the cache files of trees no longer in ``build_root`` (a build folder the
    work folder's tidy removed)."""
    with contextlib.suppress(OSError), os.scandir(cache_dir) as it:
        for entry in it:
            for suffix in (HASHES, KEYS):
                if entry.name.endswith(suffix) and not entry.name.startswith("."):
                    stem = entry.name[:-len(suffix)]
                    if not (build_root / stem).is_dir():
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
