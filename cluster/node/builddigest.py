"""What a node's build made, as one digest per program (issue 26: the build part of a job's
key in the master's result cache).

After a successful build the node hashes each program of job.start's ``programs`` that the
build made (``<bin_dir>/<prog>``), together with the resource files that program reads at
run time from the tree (:data:`RESOURCE_DIRS`, by the tree's kind), and sends the digests
in the ``digests`` request header beside ``built``.  Per program, not per tree: a rebuilt
gs changes the key of the gs jobs only, never of the mutool jobs (and a doc-only commit,
which rebuilds nothing, changes no key).  Contents are hashed, not the source tree: two
nodes whose compilers make different binaries get different digests, so each keeps its
own keys.

What is not hashed (so a change there is not seen): shared libraries the program loads
from outside its binaries' folder, and programs a wrapper script calls (the demo trees'
``bin/gs`` is a wrapper around the installed gs: its digest covers the wrapper's text,
options included, not the installed gs).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from cluster.node.buildcmd import GHOSTPDL, MUPDF, OTHER

#: Folders (relative to the tree's top) whose files a kind's programs read at run time:
#: ghostpdl's init files, fonts and colour profiles when they are not compiled in.
RESOURCE_DIRS: dict[str, tuple[str, ...]] = {
    GHOSTPDL: ("Resource", "lib", "iccprofiles"),
    MUPDF: (),
    OTHER: (),
}
#: Read size when hashing [bytes].
_CHUNK = 1 << 20
#: The most resource files hashed per tree (a bound on the walk; beyond it the digest
#: still changes with the count, as the listing is part of it).
MAX_RESOURCE_FILES = 200_000


def _hash_file(digest: hashlib._Hash, path: Path) -> None:
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)


def resources_digest(tree: Path, kind: str) -> str:
    """The sha256 of the resource files of ``tree`` (a tree of ``kind``): each regular
    file under :data:`RESOURCE_DIRS`, in path order, by its relative path, size and
    content; a link by its target.  "" for a kind that has none."""
    dirs = RESOURCE_DIRS.get(kind, ())
    if not dirs:
        return ""
    digest = hashlib.sha256(b"resources 1\n")
    seen = 0
    for top in dirs:
        root = tree / top
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                seen += 1
                if seen > MAX_RESOURCE_FILES:
                    digest.update(b"truncated\n")
                    return digest.hexdigest()
                path = Path(dirpath, name)
                rel = path.relative_to(tree).as_posix()
                if path.is_symlink():
                    digest.update(f"link {rel} {os.readlink(path)}\n".encode(
                        "utf-8", "surrogateescape"))
                elif path.is_file():
                    digest.update(f"file {rel} {path.stat().st_size}\n".encode(
                        "utf-8", "surrogateescape"))
                    _hash_file(digest, path)
    return digest.hexdigest()


def program_digests(tree: Path, bin_dir: Path, kind: str,
                    programs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(program, sha256 hex) of each of ``programs`` that is a regular file in
    ``bin_dir`` (the build's binaries' folder in ``tree``), sorted by program: the hash of
    the program's bytes and of its tree's resource files (:func:`resources_digest`).  A
    program missing or unreadable is left out (the master then runs its jobs: no key)."""
    resources: str | None = None
    out: list[tuple[str, str]] = []
    for name in sorted(set(programs)):
        path = bin_dir / name
        if not path.is_file():
            continue
        if resources is None:
            resources = resources_digest(tree, kind)
        digest = hashlib.sha256(f"program 1 {name}\n".encode())
        try:
            _hash_file(digest, path)
        except OSError:
            continue
        digest.update(f"\nresources {resources}\n".encode())
        out.append((name, digest.hexdigest()))
    return tuple(out)
