"""Self-updating nodes: which copy of the node code the next run.py starts from.

The master publishes its node code in ``node-code/`` of its home with a ``MANIFEST``
(:mod:`cluster.node.code`).  Before clusterpull starts run.py it calls
:meth:`SelfUpdate.choose`, which:

1. reads ``node-code/MANIFEST`` through the node's transport (one small read: the cheap
   check; nothing else is read when the version is already here);
2. names the version by the manifest's md5 and looks for ``work_dir/code/<version>/``; a
   copy already there is checked against the manifest (md5 of every file, ~0.3 MB) and used;
3. otherwise fetches ``node-code/`` into a staging directory ``work_dir/code/.fetch-<pid>``
   with the transport's ``fetch_tree`` (rsync over ssh, or the Python mirror), seeded with
   a copy of the last good version so that only the changed files travel; checks that the
   fetched ``MANIFEST`` is the one read in step 1 and that the files are exactly those it
   lists, each with its md5 (the master's bytecode among them, :mod:`cluster.node.code`);
   compiles the modules that have no bytecode for this node's Python (:func:`compile_copy`:
   none when the node runs the master's Python); and renames the staging directory to
   ``code/<version>/``;
4. records the version chosen in ``work_dir/code/CURRENT``.

A copy that fails the check is refused: logged (the file, the md5 expected and found) and
removed, and the next run.py starts from the last good version (``CURRENT``), or from the
installed copy if there is none.  The next cycle tries again (a seeded fetch first, then one
from empty, since a file could keep its size and mtime while its content changed; a
manifest that changed while it was fetched -- the master published meanwhile -- is read
again), at most :data:`FETCH_TRIES` fetches per cycle.  No manifest published (or
``self_update = no``) means the installed copy, as before this existed.

run.py then runs as ``python3 <version dir>/run.py ...`` with ``PYTHONPATH=<version dir>``
(:meth:`CodeChoice.env`), so the slot shells' ``python3 -m cluster.bmpcmp`` imports the same
copy.  A run.py already under way keeps the version it started with: versions are never
changed in place, only added.  :meth:`SelfUpdate.prune` removes version directories beyond
the newest :data:`KEEP_VERSIONS` (newest = chosen most recently) that no live process uses
(no process's command line names a file in them), and staging directories whose fetcher
is gone.

clusterpull itself is not replaced: the node owner installs clusterpull and node.conf by
hand (seed 000); see docs/deviations.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import py_compile
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.defaults import REPO_ROOT
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.node import code
from cluster.node.transport import Transport
from cluster.runtime import fsutil

log = logging.getLogger("cluster.selfupdate")

#: work_dir's subdirectory holding the fetched versions.
CODE_DIR = "code"
#: The file in it naming the last version that passed the check.
CURRENT = "CURRENT"
#: Version directories kept besides those in use.
KEEP_VERSIONS = 2
#: Fetches per choose() at most (seeded, from empty, once more if the manifest moved).
FETCH_TRIES = 3
#: The manifest in the master home, as the transport names it.
MANIFEST_REL = f"{Home.NODE_CODE}/{code.MANIFEST}"
#: Where Python keeps bytecode.  A file there that the manifest does not list is the node's
#: own (its Python's, written by compile_copy or by Python itself): allowed, not checked.
_BYTECODE_DIR = "__pycache__"
_VERSION = re.compile(r"[0-9a-f]{32}")
_STAGING = re.compile(r"\.fetch-(?P<pid>[0-9]+)")


@dataclass(frozen=True)
class CodeChoice:
    """The copy of the node code a run.py starts from."""

    root: Path
    #: The manifest md5 of a fetched version; None for the installed copy.
    version: str | None = None

    @property
    def run_script(self) -> Path:
        return self.root / "run.py"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str] | None:
        """The environment run.py needs: ``base`` (default os.environ) with the version's
        directory first on PYTHONPATH; None (inherit unchanged) for the installed copy."""
        if self.version is None:
            return None
        env = dict(os.environ if base is None else base)
        old = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(self.root) + (os.pathsep + old if old else "")
        return env


INSTALLED = CodeChoice(REPO_ROOT)


class CodeCheckError(ClusterError):
    """A fetched copy does not match its manifest (names the copy and the file)."""


def check_copy(root: Path, manifest_text: str) -> None:
    """CodeCheckError unless ``root`` holds exactly the files ``manifest_text`` lists, each
    with its md5, and a MANIFEST equal to ``manifest_text``.  Besides them, a bytecode
    directory (``__pycache__``) may hold files the manifest does not list: the bytecode the
    node's own Python wrote into a copy it runs from."""
    try:
        expected = code.parse_manifest(manifest_text, f"{root}/{code.MANIFEST}")
    except code.NodeCodeError as exc:
        raise CodeCheckError(str(exc)) from None
    try:
        found = (root / code.MANIFEST).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CodeCheckError(f"{root}/{code.MANIFEST}: unreadable ({exc})") from None
    if found != manifest_text:
        raise CodeCheckError(f"{root}/{code.MANIFEST}: differs from the manifest read first "
                             "(the master published meanwhile?)")
    present: set[str] = set()
    for folder, _dirs, names in os.walk(root):
        for name in names:
            rel = (Path(folder) / name).relative_to(root).as_posix()
            if rel != code.MANIFEST:
                present.add(rel)
    extra = sorted(rel for rel in present - set(expected)
                   if Path(rel).parent.name != _BYTECODE_DIR)
    if extra:
        raise CodeCheckError(f"{root}: {len(extra)} file(s) not in the manifest, e.g. "
                             f"{extra[0]}")
    for rel, md5 in sorted(expected.items()):
        path = root / rel
        if rel not in present:
            raise CodeCheckError(f"{path}: missing (the manifest lists it with md5 {md5})")
        actual = code.file_md5(path)
        if actual != md5:
            raise CodeCheckError(f"{path}: md5 {actual}, the manifest says {md5}")


def compile_copy(staging: Path, final: Path) -> list[Path]:
    """Write the bytecode of every module of a checked copy (``staging``, to be renamed to
    ``final``, the name tracebacks show) that has none for this node's Python, once, when
    it is fetched; return the modules compiled.

    The master ships bytecode for its own Python (:func:`cluster.node.code.bytecode_file`),
    so a node running the same Python compiles nothing.  Every run.py, and every ``python3
    -m cluster.bmpcmp`` of a job, starts from this copy; with the bytecode there, none of
    them compiles the node's modules again (a tenth of a second of each run.py start, on
    the path from job.start to the node's first call).  Python writes the same files itself
    on first use, except where PYTHONDONTWRITEBYTECODE is set; the copy is the node's own,
    made by this code, so writing into it is no surprise to anyone.  A module that does not
    compile is left to fail where it is imported, with Python's own message; nothing here
    refuses the copy.
    """
    compiled: list[Path] = []
    if sys.implementation.cache_tag is None:
        return compiled  # a Python that reads and writes no bytecode
    # The package's modules only: Python never reads bytecode for a script it runs.
    for module in sorted((staging / code.PACKAGE).rglob("*.py")):
        if module.parent.name == _BYTECODE_DIR:
            continue
        cfile = Path(importlib.util.cache_from_source(str(module), optimization=""))
        if cfile.is_file():
            continue
        with contextlib.suppress(py_compile.PyCompileError):
            py_compile.compile(str(module), cfile=str(cfile), doraise=True,
                               dfile=str(final / module.relative_to(staging)))
            compiled.append(module)
    return compiled


def _in_use(directory: Path) -> bool:
    """Whether a live process's command line names a file under ``directory`` (a run.py
    started from it; its slot shells die with it)."""
    import psutil  # here: only pruning needs it

    prefix = str(directory) + os.sep
    for proc in psutil.process_iter(["cmdline"]):  # bounded: the processes that exist
        cmdline = proc.info.get("cmdline") or []
        if any(arg.startswith(prefix) for arg in cmdline):
            return True
    return False


class SelfUpdate:
    """Chooses and fetches the node code for run.py (see the module docstring).

    ``transport`` is called for a transport when one is needed; it is closed (if it has a
    ``close``) at the end of each :meth:`choose`, so an ssh connection lasts one cycle.
    ``installed`` is the copy used when nothing is published (the checkout clusterpull
    itself runs from).
    """

    def __init__(self, transport: Callable[[], Transport], work_dir: Path,
                 installed: CodeChoice = INSTALLED) -> None:
        self._make_transport = transport
        self._transport: Transport | None = None
        self.code_dir = Path(work_dir).absolute() / CODE_DIR
        self.installed = installed
        #: The last choice made (logged when it changes).
        self.last: CodeChoice | None = None

    # -- the choice ------------------------------------------------------------------------
    def choose(self) -> CodeChoice:
        """The copy the next run.py starts from; never raises for a transport or check
        failure (it falls back, logged), only for a local file system error."""
        try:
            choice = self._choose()
        finally:
            # One connection per cycle, not one held open for clusterpull's life: a master
            # serving a thousand nodes would otherwise keep a thousand idle sshd processes.
            self._drop_transport()
        if choice != self.last:
            where = (f"version {choice.version} ({choice.root})" if choice.version
                     else f"the installed copy ({choice.root})")
            log.info("node code: run.py starts from %s", where)
        self.last = choice
        with contextlib.suppress(OSError):
            self.prune()
        return choice

    def _choose(self) -> CodeChoice:
        try:
            text = self._transport_now().read_text(MANIFEST_REL)
        except ClusterError as exc:
            self._drop_transport()
            log.warning("node code: cannot read %s from the master: %s; using the last "
                        "good version", MANIFEST_REL, exc)
            return self.last_good()
        if text is None:
            return self.installed  # nothing published: the installed copy, as before
        for attempt in range(1, FETCH_TRIES + 1):
            try:
                code.parse_manifest(text, MANIFEST_REL)
            except code.NodeCodeError as exc:
                log.error("node code: the master's manifest is unusable (%s); using the last "
                          "good version", exc)
                return self.last_good()
            version = code.manifest_version(text)
            target = self.code_dir / version
            if target.is_dir():
                try:
                    check_copy(target, text)
                    return self._use(version)
                except CodeCheckError as exc:
                    log.error("node code: the copy of version %s is damaged (%s); fetching "
                              "it again", version, exc)
                    _remove_tree(target)
            try:
                self._fetch(text, version, seeded=attempt == 1)
                return self._use(version)
            except CodeCheckError as exc:
                log.error("node code: refusing the fetched version %s: %s", version, exc)
            except ClusterError as exc:
                self._drop_transport()
                log.error("node code: fetching version %s failed: %s", version, exc)
                return self.last_good()
            try:
                newer = self._transport_now().read_text(MANIFEST_REL)
            except ClusterError as exc:
                self._drop_transport()
                log.error("node code: cannot read %s again: %s", MANIFEST_REL, exc)
                return self.last_good()
            if newer is None:
                return self.installed
            text = newer
        log.error("node code: no fetched copy passed the check after %d tries; using the last "
                  "good version, and trying again next cycle", FETCH_TRIES)
        return self.last_good()

    def last_good(self) -> CodeChoice:
        """The version CURRENT names if its copy is still whole, else the installed copy."""
        try:
            version = (self.code_dir / CURRENT).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return self.installed
        target = self.code_dir / version
        if not _VERSION.fullmatch(version) or not target.is_dir():
            return self.installed
        try:
            text = (target / code.MANIFEST).read_text(encoding="utf-8")
            if code.manifest_version(text) != version:
                raise CodeCheckError(f"{target}/{code.MANIFEST} is not version {version}")
            check_copy(target, text)
        except (CodeCheckError, OSError, UnicodeDecodeError) as exc:
            log.error("node code: the last good version %s is damaged too (%s); using the "
                      "installed copy", version, exc)
            return self.installed
        return CodeChoice(target, version)

    def _use(self, version: str) -> CodeChoice:
        target = self.code_dir / version
        os.utime(target)  # "chosen most recently": prune keeps the newest
        fsutil.atomic_write(self.code_dir / CURRENT, version + "\n", fsync=False)
        return CodeChoice(target, version)

    # -- fetching --------------------------------------------------------------------------
    def _fetch(self, text: str, version: str, *, seeded: bool) -> None:
        """Fetch node-code/ as ``version`` and check it against ``text``; CodeCheckError or
        TransportError (the staging directory removed either way)."""
        self.code_dir.mkdir(parents=True, exist_ok=True)
        staging = self.code_dir / f".fetch-{os.getpid()}"
        _remove_tree(staging)
        seed = self.last_good() if seeded else self.installed
        try:
            if seed.version is not None:
                # A copy with the files' mtimes (copy2), so the fetch's quick check
                # (size + mtime, as rsync's) moves only what changed: the master's bytecode
                # of an unchanged module is unchanged too.  The node's own bytecode in it
                # goes with the fetch (the master has no such file).
                shutil.copytree(seed.root, staging, copy_function=shutil.copy2)
            transport = self._transport_now()
            transport.fetch_tree(Home.NODE_CODE, staging)
            check_copy(staging, text)
            compile_copy(staging, self.code_dir / version)
            os.rename(staging, self.code_dir / version)
            log.info("node code: fetched version %s into %s", version,
                     self.code_dir / version)
        finally:
            _remove_tree(staging)

    def _transport_now(self) -> Transport:
        if self._transport is None:
            self._transport = self._make_transport()
        return self._transport

    def _drop_transport(self) -> None:
        transport, self._transport = self._transport, None
        close = getattr(transport, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()

    # -- pruning ---------------------------------------------------------------------------
    def versions(self) -> list[Path]:
        """The version directories, the most recently chosen first."""
        try:
            found = [p for p in self.code_dir.iterdir()
                     if p.is_dir() and not p.is_symlink() and _VERSION.fullmatch(p.name)]
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)

    def prune(self, keep: int = KEEP_VERSIONS) -> list[Path]:
        """Remove version directories beyond the newest ``keep`` that no live process uses,
        and staging directories of fetchers that are gone; return what was removed."""
        removed: list[Path] = []
        for old in self.versions()[keep:]:
            if _in_use(old):
                log.debug("node code: keeping %s, a run.py still uses it", old)
                continue
            _remove_tree(old)
            removed.append(old)
        with contextlib.suppress(FileNotFoundError):
            for entry in self.code_dir.iterdir():
                match = _STAGING.fullmatch(entry.name)
                if match and int(match["pid"]) != os.getpid() \
                        and not fsutil.writer_alive(int(match["pid"])):
                    _remove_tree(entry)
                    removed.append(entry)
        for path in removed:
            log.info("node code: removed %s", path)
        return removed


def _remove_tree(path: Path) -> None:
    """Remove the directory ``path`` if it exists (what cannot be removed is logged)."""
    if path.is_symlink():
        path.unlink()
        return
    if not path.exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        log.warning("node code: cannot remove all of %s", path)
