"""A sweep node's bundle of result files, read and staged (docs/sweeps.md section 9).

A node that sends a sweep task's result has uploaded the task's result files first, in one
*bundle* per call: ``runs/<id>/results/incoming/<node>.<instance>.<n>.tar`` named by the
request's ``bundle`` header (:data:`cluster.wire.protocol.BUNDLE_NAME`).  The bundle is an
uncompressed tar whose first member is ``tasks.json`` (what the node says of each task: its
start, runtime, exit status, files with their sizes and md5s, and a reason when it failed
the task itself) and then ``<task id>/<result name>`` for each file.  A node on the master
home's file system moves a *folder bundle* ``<node>.<instance>.<n>.d`` there instead: its
``tasks.json`` and a folder ``<task id>/`` of each task's files.

:meth:`BundleReader.unpack` reads the ``tasks.json`` of a request's bundle and its tasks'
files: they are copied out of the bundle member by member into a staging folder
``runs/<id>/results/.stage/<task id>/`` (never with tarfile's extraction): a member is
refused, with a log line naming it and what was expected, unless it is a regular file named
``<task id>/<result name>`` of a task of this request and a result name of the sweep,
listed in ``tasks.json``, not seen before in the bundle, and within ``max_result_bytes``
for its task.  Every name is checked against those two grammars (no ``/`` in either), and
each file is created with ``O_EXCL | O_NOFOLLOW`` in a folder this module just made, so
nothing is ever written outside the staging folder.  A folder bundle's task folders are
checked where they lie, nothing copied.

What is staged is only read here; judging the tries it holds, and placing their files, is
:mod:`cluster.master.serve.sweepintake`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cluster.sweep.spec import RESULT_NAME
from cluster.wire.protocol import Request

log = logging.getLogger("cluster.master")

#: A bundle's first member.
MANIFEST = "tasks.json"
#: The largest ``tasks.json`` read [bytes].
MAX_MANIFEST_BYTES = 16 << 20
#: How many refused members of one bundle are logged one by one (then one count).
LOGGED_REFUSALS = 10
#: A bundle's name after ``<node>.``: the node's instance and the bundle's number.
_AFTER_NODE = re.compile(r"[0-9a-f]{16}\.[0-9]{1,12}\.(tar|d)")
#: The end of a folder bundle's name.
FOLDER_SUFFIX = ".d"
#: Copying a member: bytes read at a time.
_CHUNK = 1 << 20


@dataclass(frozen=True)
class TaskReport:
    """What ``tasks.json`` says of one task."""

    start: float = 0.0
    runtime: float = 0.0
    exit_status: int = 0
    #: result name -> (size, md5) of each file the node sent.
    files: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    failed: str = ""


class BundleError(Exception):
    """A bundle that cannot be read at all (its message says what was expected)."""


@dataclass
class Staged:
    """One task's files as they came out of the bundle."""

    folder: Path
    md5s: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    total: int = 0            # bytes the members of the task declared, taken or not
    over: bool = False        # a member passed max_result_bytes
    refused: set[str] = field(default_factory=set)
    foreign: bool = False     # a folder bundle's task folder held more than result files


class BundleReader:
    """Reads the bundles of one sweep run's nodes from ``incoming`` and stages their files
    under ``stage_dir`` (which the caller removes once it has placed what it keeps)."""

    def __init__(self, incoming: Path, stage_dir: Path, result_names: frozenset[str],
                 max_result_bytes: int) -> None:
        self.incoming = incoming
        self.stage_dir = stage_dir
        self.result_names = result_names
        self.max_result_bytes = max_result_bytes

    def unpack(self, req: Request, tasks: set[str]
                ) -> tuple[dict[str, TaskReport], dict[str, Staged]]:
        """The bundle's ``tasks.json`` entries and staged files of ``tasks``; both empty
        when there is no bundle or it cannot be read (logged: every task's files are then
        missing)."""
        name = req.bundle
        if not name:
            log.warning("node %s sent %d sweep result(s) without a bundle (expected a "
                        "'bundle' header naming its uploaded files)", req.node, len(tasks))
            return {}, {}
        if not own_bundle(req.node, name):
            log.warning("node %s named bundle %s, which is not its own (expected "
                        "'%s.<instance>.<n>.tar' or '.d'); its results' files are missing",
                        req.node, name, req.node)
            return {}, {}
        path = self.incoming / name
        if name.endswith(FOLDER_SUFFIX):
            return self._unpack_folder(req, path, tasks)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("node %s: bundle %s cannot be opened (%s); its results' files are "
                        "missing", req.node, path, exc.strerror or exc)
            return {}, {}
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                log.warning("node %s: bundle %s is not a regular file; its results' files "
                            "are missing", req.node, path)
                return {}, {}
            self.stage_dir.mkdir(parents=True, exist_ok=True)
            try:
                return self._read(fh, req.node, name, tasks)
            except (BundleError, tarfile.TarError, OSError, EOFError) as exc:
                log.warning("node %s: bundle %s is unreadable: %s; its results' files are "
                            "missing", req.node, name, exc)
                return {}, {}

    def _unpack_folder(self, req: Request, path: Path, tasks: set[str]
                       ) -> tuple[dict[str, TaskReport], dict[str, Staged]]:
        """:meth:`unpack` of a folder bundle (a node on the master home's file system
        moved it here): its ``tasks.json`` and, for each task, its folder ``<task id>/``
        checked where it is (every entry a regular file with no other link, named as a
        result the task lists; anything else removed and the task's files counted
        missing), so a valid task's folder is renamed into ``results/`` with nothing
        copied."""
        try:
            dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("node %s: bundle %s cannot be opened as a folder (%s); its results' "
                        "files are missing", req.node, path, exc.strerror or exc)
            return {}, {}
        try:
            reports = _manifest(_read_at(dfd, MANIFEST, MAX_MANIFEST_BYTES), req.node)
            reports = {t: r for t, r in reports.items() if t in tasks}
            return reports, {task: self._check_folder(dfd, path, task, req.node, report)
                             for task, report in reports.items()}
        except (BundleError, OSError) as exc:
            log.warning("node %s: bundle %s is unreadable: %s; its results' files are "
                        "missing", req.node, req.bundle, exc)
            return {}, {}
        finally:
            os.close(dfd)

    def _check_folder(self, dfd: int, path: Path, task: str, node: str,
                      report: TaskReport) -> Staged:
        """Task ``task``'s folder in the folder bundle open as ``dfd`` (at ``path``):
        its files looked at, anything that is not a result file removed.

        A file ``tasks.json`` lists is checked by one ``lstat`` -- a regular file with no
        other link, of the size listed -- and its md5 is the one listed: reading it back
        would prove nothing, since a node that moves folders into the master home can
        write there anyway.  A file it does not list is read."""
        try:
            tfd = os.open(task, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd)
        except FileNotFoundError:
            # The task left no files: an empty folder of its own, to judge and place.
            self.stage_dir.mkdir(parents=True, exist_ok=True)
            (self.stage_dir / task).mkdir()
            return Staged(self.stage_dir / task)
        try:
            return self._check_task_folder(tfd, path, task, node, report)
        finally:
            os.close(tfd)

    def _check_task_folder(self, tfd: int, path: Path, task: str, node: str,
                           report: TaskReport) -> Staged:
        """:meth:`_check_folder` of the task folder open as ``tfd``."""
        staged = Staged(path / task)
        listed = report.files
        with os.scandir(tfd) as listing:
            entries = list(listing)
        for entry in entries:
            name = entry.name
            why = "" if name in self.result_names else "not a result name of the sweep"
            is_dir = False
            if not why:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    info = None
                    why = f"cannot be looked at ({exc.strerror or exc})"
                if info is not None:
                    is_dir = stat.S_ISDIR(info.st_mode)
                    if is_dir:
                        why = "a folder, not a file"
                    elif not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                        why = "expected a regular file with no other link"
                    elif name in listed and listed[name][0] == info.st_size:
                        staged.total += info.st_size
                        if staged.total > self.max_result_bytes:
                            staged.over = True
                            why = ("the task's files pass max_result_bytes "
                                   f"({self.max_result_bytes})")
                        else:
                            staged.sizes[name] = info.st_size
                            staged.md5s[name] = listed[name][1]
                    else:
                        why = self._read_entry(tfd, name, staged)
            if why:
                staged.foreign = True
                staged.refused.add(name)
                log.warning("node %s: bundle folder %s/%s: entry %r removed: %s", node,
                            path.name, task, name, why)
                if is_dir:
                    shutil.rmtree(path / task / name, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=tfd)
        return staged

    def _read_entry(self, tfd: int, name: str, staged: Staged) -> str:
        """Read the result file ``name`` of a task folder open as ``tfd`` into ``staged``
        (size, md5); '' when taken, else why not."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=tfd)
        except OSError as exc:
            return f"cannot be opened as a file ({exc.strerror or exc})"
        with os.fdopen(fd, "rb") as stream:
            info = os.fstat(stream.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                return "expected a regular file with no other link"
            staged.total += info.st_size
            if staged.total > self.max_result_bytes:
                staged.over = True
                return f"the task's files pass max_result_bytes ({self.max_result_bytes})"
            digest = hashlib.md5()
            size = 0
            for _ in range(info.st_size // _CHUNK + 2):  # bounded by the file's size
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
        staged.sizes[name] = size
        staged.md5s[name] = digest.hexdigest()
        return ""

    def _read(self, fh: IO[bytes], node: str, bundle: str, tasks: set[str]
              ) -> tuple[dict[str, TaskReport], dict[str, Staged]]:
        with tarfile.open(fileobj=fh, mode="r:") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isreg():
                raise BundleError(f"expected {MANIFEST} as its first member, a regular file")
            if first.size > MAX_MANIFEST_BYTES:
                raise BundleError(f"{MANIFEST} has {first.size} bytes, more than "
                                  f"{MAX_MANIFEST_BYTES}")
            source = tar.extractfile(first)
            assert source is not None  # a regular file
            reports = _manifest(source.read(), node)
            reports = {t: r for t, r in reports.items() if t in tasks}
            staged: dict[str, Staged] = {}
            for task in reports:  # a task id is a test id: a plain name, no '/'
                folder = self.stage_dir / task
                folder.mkdir()
                staged[task] = Staged(folder)
            refusals = 0
            # Bounded: at most one member per listed file is taken, and reading stops a
            # little past that many members.
            limit = sum(len(r.files) for r in reports.values()) + LOGGED_REFUSALS
            for _ in range(limit + 1):
                member = tar.next()
                if member is None:
                    break
                why = self._take_member(tar, member, reports, staged)
                if why:
                    refusals += 1
                    if refusals <= LOGGED_REFUSALS:
                        log.warning("node %s: bundle %s: member %r refused: %s", node,
                                    bundle, member.name, why)
            else:
                log.warning("node %s: bundle %s has more members than the %d files its "
                            "tasks.json lists; the rest are not read", node, bundle,
                            limit - LOGGED_REFUSALS)
            if refusals > LOGGED_REFUSALS:
                log.warning("node %s: bundle %s: %d members refused in all", node, bundle,
                            refusals)
            return reports, staged

    def _take_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo,
                     reports: Mapping[str, TaskReport], staged: dict[str, Staged]) -> str:
        """Stage one member; '' when taken, else why it is refused."""
        parts = member.name.split("/")
        if len(parts) != 2 or parts[0] not in reports or not RESULT_NAME.fullmatch(parts[1]):
            return ("expected '<task id>/<result name>' for a task of this request and a "
                    "result name of the sweep")
        task, name = parts
        if name not in self.result_names:
            names = ", ".join(sorted(self.result_names))
            return f"{name!r} is not a result name of the sweep ({names})"
        if name not in reports[task].files:
            return f"tasks.json lists no file {name} for task {task}"
        entry = staged[task]
        if not member.isreg():
            entry.refused.add(name)
            return "expected a regular file (not a link, device, folder or fifo)"
        entry.total += member.size
        if entry.total > self.max_result_bytes:
            entry.over = True
            entry.refused.add(name)
            return (f"task {task}'s files pass max_result_bytes ({entry.total} > "
                    f"{self.max_result_bytes} bytes)")
        source = tar.extractfile(member)
        assert source is not None  # a regular file
        try:
            fd = os.open(entry.folder / name,
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644)
        except FileExistsError:
            entry.refused.add(name)
            return "it appears twice in the bundle"
        digest = hashlib.md5()
        size = 0
        with os.fdopen(fd, "wb") as out:
            for _ in range(member.size // _CHUNK + 2):  # bounded by the member's size
                chunk = source.read(_CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        entry.sizes[name] = size
        entry.md5s[name] = digest.hexdigest()
        return ""

    def discard(self, req: Request, why: str) -> None:
        """Remove ``req``'s bundle (only one named for its node)."""
        if not own_bundle(req.node, req.bundle):
            return
        remove_path(self.incoming / req.bundle)  # a file, or a folder bundle and what is left
        if why:
            log.info("node %s: bundle %s removed: %s", req.node, req.bundle, why)



def own_bundle(node: str, name: str) -> bool:
    """Whether bundle ``name`` is node ``node``'s: ``<node>.<16 hex>.<n>.tar`` or ``.d``
    exactly (so node ``n1`` cannot name node ``n1.b``'s bundle
    ``n1.b.<instance>.<n>.tar``)."""
    return name.startswith(node + ".") and _AFTER_NODE.fullmatch(name, len(node) + 1) is not None


def _read_at(dfd: int, name: str, limit: int) -> bytes:
    """The regular file ``name`` of the folder open as ``dfd``, at most ``limit`` bytes;
    BundleError when it is no regular file or larger."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except OSError as exc:
        raise BundleError(f"expected {name}, a regular file ({exc.strerror or exc})") \
            from None
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            raise BundleError(f"expected {name}, a regular file")
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise BundleError(f"{name} has more than {limit} bytes")
    return data


def _manifest(data: bytes, node: str) -> dict[str, TaskReport]:
    """The tasks of a ``tasks.json``; BundleError saying what was expected."""
    try:
        doc: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{MANIFEST} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list):
        raise BundleError(f'{MANIFEST}: expected {{"node": ..., "tasks": [...]}}')
    if doc.get("node") != node:
        raise BundleError(f"{MANIFEST} names node {doc.get('node')!r}, expected {node!r}")
    reports: dict[str, TaskReport] = {}
    for number, entry in enumerate(doc["tasks"], start=1):
        try:
            task, report = _task_report(entry)
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{MANIFEST}: task entry {number}: expected task, start, "
                              f"runtime, exit, files and failed ({exc})") from None
        reports[task] = report
    return reports


#: The exit status written for a task whose node saw none (``"exit": null``: its slot's
#: shell died); such a task is failed.
NO_EXIT_STATUS = -1


def _task_report(entry: Any) -> tuple[str, TaskReport]:
    task = entry["task"]
    if not isinstance(task, str):
        raise TypeError("task is not a string")
    start, runtime = float(entry["start"]), float(entry["runtime"])
    if not (math.isfinite(start) and math.isfinite(runtime)):
        raise ValueError("start and runtime must be finite numbers")
    exit_status = entry["exit"]
    if exit_status is not None and (not isinstance(exit_status, int)
                                    or isinstance(exit_status, bool)):
        raise TypeError("exit is not an integer or null")
    failed = entry.get("failed", "")
    if not isinstance(failed, str):
        raise TypeError("failed is not a string")
    failed = failed.strip()  # a reason of blanks is none
    if exit_status is None:
        # The node's slot shell died under the task: no exit status to judge.
        exit_status = NO_EXIT_STATUS
        failed = failed or "the node's slot shell died while the task ran"
    files: dict[str, tuple[int, str]] = {}
    for name, pair in dict(entry["files"]).items():
        size, md5 = pair
        if not isinstance(size, int) or size < 0 or not isinstance(md5, str):
            raise ValueError(f"file {name!r}: expected [<size>, <md5>]")
        files[str(name)] = (size, md5)
    return task, TaskReport(start, runtime, exit_status, files, failed)



def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
