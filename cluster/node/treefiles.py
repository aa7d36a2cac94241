"""The files of a build tree that its programs may read at run time: the tree part of every
program's key (docs/results.md, "A job's key").

Which files, by default: **every file of the build tree except what the build made from
it and version control's own**, since a product can read any file of its tree at run
time (ghostpdl's ``Resource/``, ``lib/`` and ``iccprofiles/`` when they are not compiled
in, but also anything a test or a build option points it at).  Left out:

* folders, at any depth, of version control and build tools: :data:`SKIP_DIRS`;
* at the tree's top, the build's object and binary folders: any folder whose name ends in
  ``obj`` or ``bin`` (ghostpdl's ``obj``, ``debugobj``, ``soobj``, ``bin``, ``sobin``, ...)
  and the top folder the binaries land in (``build/`` for MuPDF): the programs themselves
  are parts of their own keys, each of its own (so a rebuilt gpcl6 leaves gs's key alone);
* object files and archives by suffix (:data:`OBJECT_SUFFIXES`), and configure's logs
  (:data:`SKIP_NAMES`: they hold the time and the host, never read by a product).

So a source edit changes every program's key, even one that rebuilds byte-identical
binaries: the price of never missing a file read at run time.  A tree that knows better
**declares** its run-time files in a file :data:`RUNTIME_LIST` at its top (in the spirit of
its ``cluster-build`` script, :mod:`cluster.node.buildcmd`): one glob pattern per line,
relative to the top, ``#`` comments and blank lines ignored; ``*`` and ``?`` stay within a
path component, ``**`` crosses them, and a pattern naming a folder takes everything under
it (``Resource``, ``lib/*.ps``, ``examples/**/*.pdf``).  Then the files matching a pattern,
and the list itself, are the tree part (only :data:`SKIP_DIRS` left out).  An empty list
declares that the programs read nothing of their tree.

Symbolic links are taken by their target's text, never followed.  The walk is bounded:
:data:`MAX_TREE_FILES` files (beyond it the listing says it was cut).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: The file by which a tree declares its run-time files (module docstring).
RUNTIME_LIST = "cluster-runtime-files"
#: Longest run-time list read [bytes].
RUNTIME_LIST_LIMIT = 64 * 1024
#: Folders never walked, at any depth: version control's and build tools' own.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".deps", ".libs", "__pycache__",
                       "autom4te.cache"})
#: At the tree's top (default rule): the build's object and binary folders.
_TOP_OUTPUT = re.compile(r"[^/]*(obj|bin)")
#: Build outputs by suffix (default rule).
OBJECT_SUFFIXES = (".o", ".a", ".lo", ".la", ".obj", ".pyc")
#: Build logs by name (default rule).
SKIP_NAMES = frozenset({"config.log", "config.status"})
#: The most files a tree's part lists.
MAX_TREE_FILES = 200_000


@dataclass(frozen=True)
class TreeFiles:
    """A tree's run-time files: ``files`` (relative path, link target or None for a
    regular file) in path order; ``declared``: taken from :data:`RUNTIME_LIST`;
    ``truncated``: :data:`MAX_TREE_FILES` cut the walk."""

    files: tuple[tuple[str, str | None], ...]
    declared: bool
    truncated: bool


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of one :data:`RUNTIME_LIST` pattern, matched against a whole
    relative path; ValueError for an absolute pattern or one with a ``..`` component."""
    text = pattern.strip().rstrip("/")
    if not text or text.startswith("/") or ".." in PurePosixPath(text).parts:
        raise ValueError(f"{pattern!r} is not a relative glob pattern within the tree")
    out = []
    i = 0
    while i < len(text):
        if text.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif text.startswith("**", i):
            out.append(".*")
            i += 2
        elif text[i] == "*":
            out.append("[^/]*")
            i += 1
        elif text[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(text[i]))
            i += 1
    return re.compile("".join(out) + "(?:/.*)?", re.S)


def read_runtime_list(path: Path) -> list[re.Pattern[str]]:
    """The patterns of a :data:`RUNTIME_LIST` file; ValueError naming the file and the line
    for a bad one, or a file over :data:`RUNTIME_LIST_LIMIT` bytes."""
    data = path.read_bytes()
    if len(data) > RUNTIME_LIST_LIMIT:
        raise ValueError(f"{path}: {len(data)} bytes; a run-time list is at most "
                         f"{RUNTIME_LIST_LIMIT}")
    out = []
    for number, line in enumerate(data.decode("utf-8", "surrogateescape").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(glob_regex(line))
        except ValueError as exc:
            raise ValueError(f"{path} line {number}: {exc}") from None
    return out


def runtime_files(tree: Path, bin_dir: Path) -> TreeFiles:
    """The run-time files of ``tree``, whose programs are in ``bin_dir`` (module
    docstring).  OSError when the tree cannot be walked; ValueError for a bad
    :data:`RUNTIME_LIST`."""
    listed = tree / RUNTIME_LIST
    patterns = read_runtime_list(listed) if listed.is_file() else None
    skip_top: set[str] = set()
    try:
        rel_bin = bin_dir.resolve().relative_to(tree.resolve())
        if rel_bin.parts:
            skip_top.add(rel_bin.parts[0])
    except ValueError:
        pass  # binaries outside the tree: nothing of it to leave out
    out: list[tuple[str, str | None]] = []
    truncated = _walk(tree, "", patterns, skip_top, out)
    return TreeFiles(tuple(out), patterns is not None, truncated)


def _wanted(rel: str, name: str, patterns: list[re.Pattern[str]] | None) -> bool:
    if patterns is None:
        return not name.endswith(OBJECT_SUFFIXES) and name not in SKIP_NAMES
    return rel == RUNTIME_LIST or any(p.fullmatch(rel) for p in patterns)


def _walk(folder: Path, prefix: str, patterns: list[re.Pattern[str]] | None,
          skip_top: set[str], out: list[tuple[str, str | None]]) -> bool:
    """Append ``folder``'s run-time files to ``out`` in path order; True when
    :data:`MAX_TREE_FILES` was reached."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIP_DIRS:
                continue
            if not prefix and patterns is None and (
                    entry.name in skip_top or _TOP_OUTPUT.fullmatch(entry.name)):
                continue
            if _walk(Path(entry.path), rel + "/", patterns, skip_top, out):
                return True
            continue
        if entry.is_symlink():
            target: str | None = os.readlink(entry.path)
        elif entry.is_file(follow_symlinks=False):
            target = None
        else:
            continue  # a fifo, a socket: nothing a program reads as a file
        if not _wanted(rel, entry.name, patterns):
            continue
        if len(out) >= MAX_TREE_FILES:
            return True
        out.append((rel, target))
    return False
