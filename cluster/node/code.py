"""The node side of the package as a set of files, its manifest, and publishing it.

Seed 000: clusterpull.sh pulled fresh copies of heartbeat.pl, sendCaps.pl and run.pl from
the master every cycle, so a change made on the master reached every node by itself.  Here
the master publishes the node's code into its home (``node-code/``, :attr:`Home.node_code`)
with a manifest, and each node's clusterpull fetches what changed before it starts run.py
(:mod:`cluster.node.selfupdate`).

Which files: :func:`node_files` computes the set, it is not kept by hand.  It starts from
:data:`NODE_PACKAGES` (every module of the node, wire, bmpcmp and runtime rooms: job lines
run ``python3 -m cluster.bmpcmp`` on the node), :data:`NODE_CLI` (the command lines of the
node's scripts) and :data:`NODE_SCRIPTS` (the top-level scripts), and adds every module
they import, read with :mod:`ast` (imports inside functions and under ``TYPE_CHECKING``
included: the set must work however the code runs), and the ``__init__.py`` of every
package on the way, until nothing new is found.  A ``cluster.*`` import that names no file
is an error (:class:`NodeCodeError`): a set that would fail on the node is never published.

The manifest (:func:`manifest`): one ``<md5>  <path>`` line per file (md5sum's format, so
``md5sum -c MANIFEST`` checks a copy), sorted by path.  Its own md5 names a version.

The bytecode travels with the sources (:func:`bytecode_file`): :func:`publish` compiles
each module of the package once, with the master's Python, into the published copy's
``__pycache__`` and lists it in the manifest like any other file.  Without it each node
compiled its fetched copy itself, a seventh of a second of CPU per node on the path from a
new run to its first job, and on one machine the nodes of a local cluster all did it at
once.  The bytecode is hash-checked (PEP 552, ``CHECKED_HASH``): it holds its source's hash,
not its mtime, so it stays valid in a copy whatever times the copy's files got, and compiling
the same source gives the same bytes, so an unchanged module keeps its md5 and a new master
process publishes the same version.  What a publish compiled is kept across processes
(:mod:`cluster.node.bytecodecache`), so a new supervisor's first publish into a new home
copies it instead of compiling again.  A node whose Python has another cache tag ignores it
(Python looks for its own file name) and compiles the copy itself
(:func:`cluster.node.selfupdate.compile_copy`).

:func:`publish` makes ``dest`` (the home's ``node-code/``) hold exactly the set and a
``MANIFEST`` that describes it:

* a changed or new file is copied atomically (``fsutil.atomic_copy``: a reader sees the old
  file or the new one), files that left the set are deleted, and ``MANIFEST`` is written
  last, only when its text changes.  A node that reads the old MANIFEST while files change
  under it finds an md5 that does not match and refuses that copy (it reads the manifest
  again and retries, a bounded number of times, then keeps its last good version until its
  next cycle: selfupdate's contract), so no node ever runs a mixed version;
* it is cheap when nothing changed, because the supervisor calls it every loop (10 s): a
  source file whose size and mtime equal its published copy's is taken as unchanged, and its
  md5 is read from the current MANIFEST instead of computed, once the published copy's own
  content is known to match that md5 (:func:`_published_intact`: hashed at the first call
  in a process and again whenever the copy's stat key, ctime included, changed; so a tamper
  of the published copy that keeps its size and mtime is undone at the next call).  That
  quick check is trusted only when the copy was made clearly after the source's last
  change (the copy's ctime at least :data:`RACY_WINDOW` past the source's mtime); otherwise
  a change within the same clock tick as the copy could keep size and mtime, so the file
  is hashed (git's "racy clean" rule).  The import scan is redone each call, so a new
  import reaches the nodes too; a file's parse is remembered while its stat is unchanged
  (:func:`imported_modules`), which leaves ~12 ms of stat calls for ~50 files.  What the
  parses found is also kept on disk (:mod:`cluster.node.scancache`), so a new supervisor's
  first publish parses only what changed since any earlier scan of the same files.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import logging
import os
import py_compile
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from cluster.errors import ClusterError
from cluster.node import bytecodecache, scancache
from cluster.runtime import fsutil

log = logging.getLogger("cluster.nodecode")

#: The package the node code belongs to.
PACKAGE = "cluster"
#: Every module in these packages is node code (subpackages included).
NODE_PACKAGES = ("cluster/node", "cluster/wire", "cluster/bmpcmp", "cluster/runtime")
#: The command lines of the node's scripts (cli/ holds every command line).
NODE_CLI = ("cluster/cli/run.py", "cluster/cli/clusterpull.py", "cluster/cli/heartbeat.py",
            "cluster/cli/send_caps.py", "cluster/cli/bmpcmp.py")
#: The node's top-level scripts (three lines each, calling cli/).
NODE_SCRIPTS = ("run.py", "clusterpull.py", "heartbeat.py", "send_caps.py")
#: The manifest's name inside a published or fetched copy.
MANIFEST = "MANIFEST"
#: A published copy whose ctime is less than this after its source's mtime is not trusted
#: by the quick check [seconds]; file times come from a coarse clock (a jiffy or more).
RACY_WINDOW = 2.0
#: Bound on the import scan's rounds (each round adds at least one file; the package has
#: a few hundred files at most).
MAX_SCAN_FILES = 2000


class NodeCodeError(ClusterError):
    """The node code cannot be computed or published (names the file and the problem)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def __str__(self) -> str:
        return f"node code: {self.path}: {self.problem}"


# ----------------------------------------------------------------------------------------------
# The set of files

def _module_file(repo_root: Path, module: str,
                 memo: dict[str, str | None] | None = None) -> str | None:
    """The repo-relative POSIX path of ``module`` (``a.b`` -> ``a/b.py`` or
    ``a/b/__init__.py``), or None if neither exists.  ``memo`` keeps the answers of one
    scan: the same names come up in file after file (1,600 lookups for ~150 names)."""
    if memo is not None and module in memo:
        return memo[module]
    base = module.replace(".", "/")
    root = os.fspath(repo_root)
    found = None
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if os.path.isfile(os.path.join(root, candidate)):
            found = candidate
            break
    if memo is not None:
        memo[module] = found
    return found


def _package_of(rel: str) -> str:
    """The dotted package a repo-relative module file lives in (``a/b/c.py`` -> ``a.b``)."""
    return ".".join(PurePosixPath(rel).parent.parts)


#: What each file imports, by absolute path: (the stat key it was read under, the modules
#: it surely imports, the names that are modules only if such a file exists).  Saves the
#: parsing when publish runs every supervisor loop and nothing changed; filled from the
#: scan cache on disk (:mod:`cluster.node.scancache`) at a process's first scan.
_IMPORTS: dict[str, scancache.Entry] = {}
#: Whether the scan cache on disk was read into _IMPORTS (once per process), and whether a
#: parse since added what it lacks.
_DISK = {"loaded": False, "dirty": False}


def imported_modules(repo_root: Path, rel: str,
                     memo: dict[str, str | None] | None = None) -> set[str]:
    """The dotted names of the modules of :data:`PACKAGE` that the file ``rel`` imports,
    anywhere in it (``from a.b import c`` counts ``a.b``, and ``a.b.c`` when that is a
    module file).  NodeCodeError if the file cannot be read or does not parse.

    The parse is remembered per file under its inode, size, mtime and ctime, and only when
    the ctime was at least :data:`RACY_WINDOW` old when the file was read (a later write in
    the same clock tick could otherwise keep all four).  ``memo``: see :func:`_module_file`.
    """
    path = repo_root / rel
    where = str(path.absolute())
    try:
        before = path.stat()
        key = (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns)
        cached = _IMPORTS.get(where)
        if cached is not None and cached[0] == key:
            sure, maybe = cached[1], cached[2]
        else:
            tree = ast.parse(path.read_bytes(), filename=str(path))
            sure, maybe = _imports_in(rel, tree)
            if time.time_ns() - before.st_ctime_ns >= RACY_WINDOW * 1e9:
                _IMPORTS[where] = (key, sure, maybe)
                _DISK["dirty"] = True
    except (OSError, SyntaxError, ValueError) as exc:
        raise NodeCodeError(rel, f"cannot be read as Python ({exc})") from None
    found = set(sure) | {name for name in maybe
                         if _module_file(repo_root, name, memo) is not None}
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def _imports_in(rel: str, tree: ast.AST) -> tuple[frozenset[str], frozenset[str]]:
    """The modules the parsed file ``rel`` imports, and the ``from`` names that may be
    modules (see :func:`imported_modules`)."""
    sure: set[str] = set()
    maybe: set[str] = set()
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            sure.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # The package of a/b/c.py and of a/b/__init__.py is a.b; level 1 is that.
                parts = _package_of(rel).split(".")
                keep = len(parts) - (node.level - 1)
                if keep < 1:
                    raise NodeCodeError(rel, f"relative import level {node.level} leaves "
                                             "the package")
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            sure.add(base)
            maybe.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return frozenset(sure), frozenset(maybe)


#: The fields of a node that hold statements (bodies of functions, classes, if, for, while,
#: with, try and its handlers, match cases): the only places an import can be.
_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every statement of ``tree``, at any depth (an import is a statement; expressions,
    most of a module's nodes, are not walked: the supervisor's start parses the whole node
    side, and a full :func:`ast.walk` made it three times slower)."""
    todo: list[ast.AST] = [tree]
    while todo:  # bounded: each node of the tree is taken once
        node = todo.pop()
        yield node
        for name in _BODIES:
            todo.extend(getattr(node, name, ()))


def _package_inits(rel: str) -> list[str]:
    """The ``__init__.py`` of every package containing the file ``rel``."""
    parts = PurePosixPath(rel).parent.parts
    return [str(PurePosixPath(*parts[:i], "__init__.py")) for i in range(1, len(parts) + 1)]


def node_files(repo_root: Path) -> list[str]:
    """The node side of the package and its scripts: repo-relative POSIX paths, sorted.

    See the module docstring for how the set is made; it is closed under ``cluster.*``
    imports.  NodeCodeError names a file that is missing or unreadable, or an import that
    resolves to no file.
    """
    repo_root = Path(repo_root)
    cache = scancache.cache_path()
    if not _DISK["loaded"]:
        _DISK["loaded"] = True
        _IMPORTS.update({where: entry for where, entry in scancache.load(cache).items()
                         if where not in _IMPORTS})
    files = _scan(repo_root)
    if _DISK["dirty"]:
        _DISK["dirty"] = False
        scancache.save(cache, _IMPORTS)
    return files


def _scan(repo_root: Path) -> list[str]:
    """:func:`node_files` without the scan cache on disk."""
    start: list[str] = []
    for package in NODE_PACKAGES:
        folder = repo_root / package
        if not folder.is_dir():
            raise NodeCodeError(package, f"no such package directory under {repo_root}")
        start += sorted(str(p.relative_to(repo_root).as_posix()) for p in folder.rglob("*.py")
                        if "__pycache__" not in p.parts)
    for rel in (*NODE_CLI, *NODE_SCRIPTS):
        if not (repo_root / rel).is_file():
            raise NodeCodeError(rel, f"missing under {repo_root}")
        start.append(rel)
    files: set[str] = set()
    memo: dict[str, str | None] = {}
    todo = list(start)
    while todo:
        if len(files) > MAX_SCAN_FILES:
            raise NodeCodeError(str(repo_root), f"more than {MAX_SCAN_FILES} node files: "
                                                "is the repo root right?")
        rel = todo.pop()
        if rel in files:
            continue
        files.add(rel)
        todo += [init for init in _package_inits(rel)
                 if PurePosixPath(init).parts[0] == PACKAGE and init not in files]
        for module in imported_modules(repo_root, rel, memo):
            target = _module_file(repo_root, module, memo)
            if target is None:
                raise NodeCodeError(rel, f"imports {module}, which is no file under "
                                         f"{repo_root}")
            if target not in files:
                todo.append(target)
    return sorted(files)


def third_party_modules(repo_root: Path, files: Iterable[str] | None = None) -> list[str]:
    """The top-level modules outside the standard library and :data:`PACKAGE` that the node
    files import anywhere (``paramiko``, ``psutil``, ...): what a node's Python must have.
    Sorted."""
    repo_root = Path(repo_root)
    names: set[str] = set()
    for rel in files if files is not None else node_files(repo_root):
        tree = ast.parse((repo_root / rel).read_bytes(), filename=rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(n for n in names
                  if n != PACKAGE and n not in sys.stdlib_module_names and n != "__future__")


# ----------------------------------------------------------------------------------------------
# The manifest

def bytecode_file(rel: str) -> str | None:
    """The repo-relative path of the bytecode :func:`publish` ships for the node file ``rel``
    (``cluster/a/b.py`` -> ``cluster/a/__pycache__/b.cpython-311.pyc``: this Python's cache
    tag, no optimisation level), or None: a top-level script (Python compiles the script it
    runs every time and never reads bytecode for it) or a Python that writes no bytecode."""
    if not rel.startswith(PACKAGE + "/") or sys.implementation.cache_tag is None:
        return None
    return importlib.util.cache_from_source(rel, optimization="")


def published_files(files: Iterable[str]) -> list[str]:
    """What :func:`publish` puts beside MANIFEST for the node files ``files`` when every
    module compiles: each file and its bytecode (:func:`bytecode_file`), sorted."""
    out = set(files)
    out.update(pyc for rel in out.copy() if (pyc := bytecode_file(rel)) is not None)
    return sorted(out)


def file_md5(path: Path) -> str:
    """The hex MD5 of the file ``path``'s content."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def format_manifest(md5s: dict[str, str]) -> str:
    """``<md5>  <path>`` lines sorted by path (md5sum's format), each ending in a newline."""
    return "".join(f"{md5s[rel]}  {rel}\n" for rel in sorted(md5s))


def manifest(root: Path, files: Iterable[str]) -> str:
    """The manifest of ``files`` (paths relative to ``root``): see :func:`format_manifest`."""
    return format_manifest({rel: file_md5(Path(root) / rel) for rel in files})


def parse_manifest(text: str, source: str = MANIFEST) -> dict[str, str]:
    """``{path: md5}`` from a manifest's text.  NodeCodeError, naming ``source`` and the
    line, for a line that is not ``<32 hex>  <relative path>``, a path that is absolute or
    has a ``..`` component, or a path listed twice."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        md5, sep, rel = line.partition("  ")
        where = f"{source} line {number}"
        if (not sep or len(md5) != 32 or any(c not in "0123456789abcdef" for c in md5)
                or not rel):
            raise NodeCodeError(where, f"{line!r}: expected '<32 hex md5>  <path>'")
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or "\0" in rel or str(path) != rel:
            raise NodeCodeError(where, f"{rel!r}: expected a plain relative path")
        if rel in out:
            raise NodeCodeError(where, f"{rel!r} is listed twice")
        out[rel] = md5
    return out


def manifest_version(text: str) -> str:
    """The version a manifest names: the hex MD5 of its text."""
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


# ----------------------------------------------------------------------------------------------
# Publishing

def _quick_same(src: os.stat_result, dst: os.stat_result) -> bool:
    """Whether the published copy ``dst`` may be taken to hold ``src``'s content unhashed."""
    return (stat.S_ISREG(dst.st_mode) and src.st_size == dst.st_size
            and src.st_mtime_ns == dst.st_mtime_ns
            and dst.st_ctime_ns - src.st_mtime_ns >= RACY_WINDOW * 1e9)


#: The published copies whose content was hashed and found to match the MANIFEST, by
#: absolute path: (the copy's stat key when it was hashed, that md5).  A write to the copy
#: (content, or ``os.utime`` putting its mtime back) stamps its ctime with the current time,
#: which no unprivileged process can set back, so an unchanged key means unchanged content.
_VERIFIED: dict[str, tuple[tuple[int, int, int, int, int], str]] = {}


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _published_intact(dst: Path, dst_stat: os.stat_result, md5: str) -> bool:
    """Whether the published copy ``dst`` (a regular file, lstat ``dst_stat``) holds the
    content whose md5 the MANIFEST lists, ``md5``.

    The copy is hashed the first time this process sees it and whenever its stat key
    (device, inode, size, mtime, ctime) changed since it was last found intact, so a tamper
    that keeps size and mtime (``os.utime``) is caught at the next call by its ctime.  The
    result is remembered only when the ctime was at least :data:`RACY_WINDOW` old when the
    copy was hashed (a write in the same clock tick could keep the ctime too).  Cost: one
    dict lookup per file when nothing changed; one hash of every published file (~60
    files, ~0.5 MB) at the first call in a process."""
    where = str(dst.absolute())
    key = _stat_key(dst_stat)
    if _VERIFIED.get(where) == (key, md5):
        return True
    try:
        intact = file_md5(dst) == md5
    except OSError:
        return False
    if intact and time.time_ns() - dst_stat.st_ctime_ns >= RACY_WINDOW * 1e9:
        _VERIFIED[where] = (key, md5)
    else:
        _VERIFIED.pop(where, None)
    return intact


def _read_published(dest: Path) -> dict[str, str]:
    """The current MANIFEST of ``dest`` as ``{path: md5}``; {} if missing or unreadable."""
    try:
        return parse_manifest((dest / MANIFEST).read_text(encoding="utf-8"),
                              str(dest / MANIFEST))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, NodeCodeError) as exc:
        log.warning("node code: ignoring the unreadable %s (%s); rewriting it",
                    dest / MANIFEST, exc)
        return {}


def _remove_stale(dest: Path, keep: set[str]) -> list[str]:
    """Delete from ``dest`` every file not in ``keep`` (nor MANIFEST), then the directories
    left empty; return the deleted files' relative paths."""
    removed: list[str] = []
    for folder, dirs, names in os.walk(dest, topdown=False):
        here = Path(folder)
        for name in names:
            rel = (here / name).relative_to(dest).as_posix()
            if rel != MANIFEST and rel not in keep:
                (here / name).unlink()
                removed.append(rel)
        for name in dirs:
            sub = here / name
            if sub.is_symlink():
                sub.unlink()
                removed.append(sub.relative_to(dest).as_posix())
            elif not any(sub.iterdir()):
                sub.rmdir()
    return removed


def publish(repo_root: Path, dest: Path) -> bool:
    """Make ``dest`` hold exactly the node files of ``repo_root`` and their MANIFEST.

    Returns True if anything in ``dest`` changed.  See the module docstring for the order
    of writes and the quick check.  NodeCodeError if the set cannot be computed (nothing is
    changed then); OSError if ``dest`` cannot be written.
    """
    repo_root, dest = Path(repo_root), Path(dest)
    files = node_files(repo_root)
    published = _read_published(dest)
    md5s: dict[str, str] = {}
    copied: list[str] = []
    for rel in files:
        src, dst = repo_root / rel, dest / rel
        src_stat = src.stat()
        try:
            dst_stat: os.stat_result | None = dst.lstat()
        except FileNotFoundError:
            dst_stat = None
        if (dst_stat is not None and rel in published and _quick_same(src_stat, dst_stat)
                and _published_intact(dst, dst_stat, published[rel])):
            md5s[rel] = published[rel]
            continue
        md5 = file_md5(src)
        md5s[rel] = md5
        if (dst_stat is not None and stat.S_ISREG(dst_stat.st_mode)
                and published.get(rel) == md5 and file_md5(dst) == md5):
            # Same content, only too recent to trust: set the copy's mtime to the source's
            # (the quick check compares it); the utime also stamps its ctime now, so once
            # the source is RACY_WINDOW old the quick check trusts the copy again.
            os.utime(dst, ns=(dst_stat.st_atime_ns, src_stat.st_mtime_ns))
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst_stat is not None and stat.S_ISDIR(dst_stat.st_mode):
            raise NodeCodeError(str(dst), "is a directory where a node file belongs")
        # copy2 inside: the copy keeps the source's mtime, which the quick check compares.
        fsutil.atomic_copy(src, dst, fsync=False)
        copied.append(rel)
    compiled = _publish_bytecode(dest, files, published, md5s)
    removed = _remove_stale(dest, set(md5s))
    text = format_manifest(md5s)
    manifest_changed = published != md5s or not (dest / MANIFEST).is_file()
    if manifest_changed:
        dest.mkdir(parents=True, exist_ok=True)
        fsutil.fsync_dir(dest)
        fsutil.atomic_write(dest / MANIFEST, text)
    if copied or compiled or removed or manifest_changed:
        log.info("published node code %s into %s: %d file(s) copied, %d compiled, %d removed",
                 manifest_version(text), dest, len(copied), len(compiled), len(removed))
        return True
    return False


def _publish_bytecode(dest: Path, files: list[str], published: dict[str, str],
                      md5s: dict[str, str]) -> list[str]:
    """Give every module among ``files``, already published in ``dest`` with the md5s in
    ``md5s``, its bytecode there (:func:`bytecode_file`), and add each bytecode file's md5
    to ``md5s``; return the bytecode files written.

    A module whose source has the md5 the current MANIFEST (``published``) lists keeps the
    bytecode listed with it, when that file is intact: the same source compiles to the same
    bytes.  Otherwise the bytecode comes from the bytecode cache
    (:mod:`cluster.node.bytecodecache`: compiled by an earlier publish of the same source on
    this machine), or is compiled and added to it.  A module that does not compile gets no
    bytecode (logged): the node fails where it imports it, with Python's own message.
    OSError if ``dest`` cannot be written."""
    written: list[str] = []
    cache = bytecodecache.BytecodeCache()
    for rel in files:
        pyc = bytecode_file(rel)
        if pyc is None:
            continue
        dst = dest / pyc
        try:
            dst_stat: os.stat_result | None = dst.lstat()
        except FileNotFoundError:
            dst_stat = None
        if (dst_stat is not None and stat.S_ISREG(dst_stat.st_mode)
                and published.get(rel) == md5s[rel] and pyc in published
                and _published_intact(dst, dst_stat, published[pyc])):
            md5s[pyc] = published[pyc]
            continue
        cached = cache.fetch(rel, md5s[rel], dst)
        if cached is not None:
            md5s[pyc] = cached
            written.append(pyc)
            continue
        try:
            # Written atomically (a temporary file renamed), as the sources are copied.
            py_compile.compile(str(dest / rel), cfile=str(dst), dfile=rel, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        except py_compile.PyCompileError as exc:
            log.warning("node code: %s does not compile; published without bytecode (%s)",
                        rel, exc.msg.strip())
            continue
        md5s[pyc] = file_md5(dst)
        cache.store(rel, md5s[rel], dst, md5s[pyc])
        written.append(pyc)
    return written
