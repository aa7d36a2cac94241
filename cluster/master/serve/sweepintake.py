"""Taking a sweep run's results with their files (docs/sweeps.md section 9).

A node that sends a sweep task's result has uploaded the task's result files first, in one
*bundle* per call: ``runs/<id>/results/incoming/<node>.<instance>.<n>.tar`` named by the
request's ``bundle`` header (:data:`cluster.wire.protocol.BUNDLE_NAME`).  The bundle is an
uncompressed tar whose first member is ``tasks.json`` (what the node says of each task: its
start, runtime, exit status, files with their sizes and md5s, and a reason when it failed
the task itself) and then ``<task id>/<result name>`` for each file.

:meth:`SweepIntake.take` looks at a request carrying results before
:meth:`~cluster.master.state.runstate.RunState.handle` records them.  For each result of a task
the node was handed and that has no result yet:

1. its files are copied out of the bundle member by member into a staging folder
   ``runs/<id>/results/.stage/<task id>/`` (never with tarfile's extraction): a member is
   refused, with a log line naming it and what was expected, unless it is a regular file
   named ``<task id>/<result name>`` of a task of this request and a result name of the
   sweep, listed in ``tasks.json``, not seen before in the bundle, and within
   ``max_result_bytes`` for its task.  Every name is checked against those two grammars
   (no ``/`` in either), and each file is created with ``O_EXCL | O_NOFOLLOW`` in a folder
   this module just made, so nothing is ever written outside the staging folder;
2. the try is judged: ``failed: <the node's reason>`` when the node failed the task,
   ``timeout`` when the result's error code is 3, ``failed: result files missing`` when a
   file ``tasks.json`` lists did not arrive whole (no bundle, an unreadable one, a member
   missing, refused or not matching its size and md5), ``failed: results over
   max_result_bytes (<n> bytes)``, else :func:`cluster.sweep.checks.validate` (the exit
   status from ``tasks.json``, the sweep's result names required, the check script run
   here with the sweep's ``timeout`` in the run snapshot's sweep folder): ``ok`` or
   ``invalid: <why>``;
3. a valid try's folder is renamed to ``runs/<id>/results/<task id>/`` (a stale one from a
   killed master replaced) and its result recorded with error 0 and the md5 of the lines
   ``<result name> <md5 of the file>`` in name order (:func:`files_md5`);
4. a try that is not valid, with tries left (1 + the sweep's ``retries`` in all), is
   dropped: its stage removed, its result withheld from the request and its job put back
   by :meth:`RunState.retry <cluster.master.state.runstate.RunState.retry>` (another node takes
   it when one that has not tried it is up).  The last try is recorded as the task's
   result with error 1 (3 for a timeout) and md5 ``0``, its files kept in
   ``results/<task id>/`` for reading;
5. every try is one line of ``runs/<id>/sweep-attempts.tsv``
   (:mod:`cluster.sweep.attempts`), written before the result is journaled and synced with
   the journal (:meth:`cluster.master.files.journal.Journal.attach`).

A result for a task that already has one (a speculative copy: the first valid result
wins), for a task never handed to the node, or for an unknown test is left to
``RunState`` as it is (counted as a duplicate or refused there); its files are not
taken and no try is counted.  A request naming the bundle this master last took of its node
(the node did not get the reply and called again) has its unsettled results withheld
without a second try.  The bundle is removed once the request's results are journaled
(:meth:`SweepIntake.done`).

A master that takes the run over (:meth:`SweepIntake.open`) counts the tries in
``sweep-attempts.tsv`` and tells the run state which nodes tried each task put back; it
removes the staging folder a killed master left, and the unfinished uploads in
``incoming/`` (a complete bundle stays: its node calls again with it).

The cost: a sweep's request path reads its bundle and writes its files, and runs the
check script when there is one, bounded by the sweep's ``timeout`` per task; the master
serves nothing else meanwhile, and that time is not counted against any node's heartbeat
(:meth:`RunState.pause <cluster.master.state.runstate.RunState.pause>`, called by the handler).
Runs that are not sweeps have no intake and pay nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cluster.master.files.journal import result_text
from cluster.master.state.runstate import RunState
from cluster.records import ERROR_READ, ERROR_TIMEOUT
from cluster.runtime import fsutil
from cluster.sweep import checks
from cluster.sweep.attempts import Attempt, AttemptsError, AttemptsWriter, read_attempts
from cluster.sweep.spec import RESULT_NAME, SweepSpec
from cluster.wire import protocol
from cluster.wire.protocol import Request

log = logging.getLogger("cluster.master")

#: The run folder's file of tries, and the folders under ``runs/<id>/``.
ATTEMPTS_FILE = "sweep-attempts.tsv"
RESULTS_DIR = "results"
INCOMING_DIR = "incoming"
STAGE_DIR = ".stage"
#: A bundle's first member.
MANIFEST = "tasks.json"
#: The largest ``tasks.json`` read [bytes].
MAX_MANIFEST_BYTES = 16 << 20
#: How many refused members of one bundle are logged one by one (then one count).
LOGGED_REFUSALS = 10
#: The statuses of a try that are not a verdict of the checks.
FILES_MISSING = "failed: result files missing"
TIMEOUT = "timeout"
#: A bundle's name after ``<node>.``: the node's instance and the bundle's number.
_AFTER_NODE = re.compile(r"[0-9a-f]{16}\.[0-9]{1,12}\.(tar|d)")
#: The end of a folder bundle's name.
FOLDER_SUFFIX = ".d"
#: Copying a member: bytes read at a time.
_CHUNK = 1 << 20
#: The error code of a result line: after the test id.
_ERROR_FIELD = 1
_MD5_FIELD = 5


def files_md5(md5s: Mapping[str, str]) -> str:
    """A task's md5: of the lines ``<result name> <md5 of the file>\\n`` in name order, so a
    change in any result file changes it."""
    text = "".join(f"{name} {md5s[name]}\n" for name in sorted(md5s))
    return hashlib.md5(text.encode("utf-8")).hexdigest()


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
class _Staged:
    """One task's files as they came out of the bundle."""

    folder: Path
    md5s: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    total: int = 0            # bytes the members of the task declared, taken or not
    over: bool = False        # a member passed max_result_bytes
    refused: set[str] = field(default_factory=set)
    foreign: bool = False     # a folder bundle's task folder held more than result files


class SweepIntake:
    """The intake of one sweep run: :meth:`open` it (a takeover included), :meth:`take`
    each request with results before the run state handles it, :meth:`done` once its
    results are journaled, :meth:`close` at the end."""

    def __init__(self, run_dir: Path, spec: SweepSpec, max_result_bytes: int,
                 writer: AttemptsWriter) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.max_result_bytes = max_result_bytes
        self.log = writer
        self.results_dir = run_dir / RESULTS_DIR
        self.incoming = self.results_dir / INCOMING_DIR
        self.stage_dir = self.results_dir / STAGE_DIR
        self.result_names = frozenset(r.name for r in spec.results)
        self.tries_allowed = 1 + spec.retries
        #: Tries made of each task so far, by every master of the run.
        self.tries: dict[str, int] = {}
        #: The last bundle this master took of each node: a node calling again with it (it
        #: lost the reply; it makes no new call before it has one) gets no second try.
        self.taken: dict[str, str] = {}

    @classmethod
    def open(cls, run_dir: Path, spec: SweepSpec, max_result_bytes: int,
             state: RunState) -> SweepIntake:
        """The intake of the run in ``run_dir``: its folders made, what a killed master
        left cleaned, the tries so far counted and the nodes of each task put back told to
        ``state``."""
        results = run_dir / RESULTS_DIR
        (results / INCOMING_DIR).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(results / STAGE_DIR, ignore_errors=True)
        for entry in (results / INCOMING_DIR).iterdir():
            if not protocol.BUNDLE_NAME.fullmatch(entry.name):
                # An upload's temporary file (its node was killed mid-upload): never a
                # bundle a call can name.
                log.info("run %s: removing %s, an unfinished upload", run_dir.name, entry)
                _remove(entry)
        path = run_dir / ATTEMPTS_FILE
        intake = cls(run_dir, spec, max_result_bytes, AttemptsWriter(path))
        count = 0
        try:
            for attempt in read_attempts(path):
                intake.tries[attempt.task] = max(intake.tries.get(attempt.task, 0),
                                                 attempt.attempt)
                if not attempt.final:
                    state.retry(attempt.node, attempt.task)
                count += 1
        except AttemptsError as exc:
            log.error("run %s: %s; the tries after it are not counted", run_dir.name, exc)
        if count:
            log.info("run %s: %d tries of %d tasks read from %s", run_dir.name, count,
                     len(intake.tries), ATTEMPTS_FILE)
        return intake

    # ------------------------------------------------------------------ a request
    def take(self, req: Request, state: RunState, session: str = "") -> Request:
        """``req`` as the run state is to handle it: its results judged (the module
        docstring), the withheld ones taken out, the last tries' rewritten as failures.
        Files are in place and tries logged when it returns.  ``session``: the sending
        process's (only the results of tasks handed to that process are judged here)."""
        texts = list(req.result_lines) + [result_text(r) for r in req.results]
        if not texts:
            if req.bundle:
                self._discard(req, "a bundle came with no result")
            return req
        mine: dict[str, int] = {}  # task -> its position in texts: the results judged here
        for position, text in enumerate(texts):
            task = text.partition(" ")[0]
            if (task not in mine and task in state.jobs.index and task not in state.results
                    and state.leased_to(req.node, task, session)):
                mine[task] = position
        if req.bundle and self.taken.get(req.node) == req.bundle:
            # A call made again after a lost reply: its tries were counted the first time
            # (a try put back then is no longer the node's lease, but it is not a stray).
            again = {position for position, text in enumerate(texts)
                     if text.partition(" ")[0] in mine
                     or req.node in state.tried_by(text.partition(" ")[0])}
            if again:
                return _with_results(req, [t for p, t in enumerate(texts)
                                           if p not in again])
        if not mine or not state.takes_results_from(req.node):
            return req
        out = list(texts)
        withheld: set[int] = set()
        try:
            reports, staged = self._unpack(req, set(mine))
            if own_bundle(req.node, req.bundle):
                self.taken[req.node] = req.bundle  # never another node's: its call takes it
            for task, position in mine.items():
                taken = self._judge(req.node, task, texts[position], reports.get(task),
                                    staged.get(task), state)
                if taken is None:
                    withheld.add(position)
                else:
                    out[position] = taken
        finally:
            shutil.rmtree(self.stage_dir, ignore_errors=True)
        return _with_results(req, [t for p, t in enumerate(out) if p not in withheld])

    def done(self, req: Request) -> None:
        """``req``'s results are journaled: its bundle (when it is the node's own) is no
        longer needed, whether its files were taken or not (duplicates)."""
        if req.bundle:
            self._discard(req, "")

    def close(self) -> None:
        """Sync and close the attempts log."""
        self.log.close()

    @property
    def dirty(self) -> bool:
        """Whether tries were logged since the last :meth:`sync` (the journal's companion)."""
        return self.log.dirty

    def sync(self) -> None:
        self.log.sync()

    # ------------------------------------------------------------------ one task
    def _judge(self, node: str, task: str, text: str, report: TaskReport | None,
               staged: _Staged | None, state: RunState) -> str | None:
        """Judge one try; log it; return the result text to record (None: withheld)."""
        fields = text.split(" ", 6)
        timed_out = fields[_ERROR_FIELD] == str(ERROR_TIMEOUT)
        status = self._status(task, report, staged, timed_out)
        tries = self.tries.get(task, 0) + 1
        self.tries[task] = tries
        final = status == "ok" or tries >= self.tries_allowed
        receive = sum(staged.sizes.values()) if staged else 0  # every result file home
        report = report or TaskReport()
        self.log.write(Attempt(task, node, report.start, report.runtime, report.exit_status,
                               receive, status, tries, final))
        if not final:
            log.info("sweep task %s on node %s: %s (try %d of %d); tried again", task, node,
                     status, tries, self.tries_allowed)
            state.retry(node, task)
            return None
        self._place(task, staged)
        if status == "ok":
            fields[_ERROR_FIELD] = "0"
            fields[_MD5_FIELD] = files_md5(staged.md5s if staged else {})
        else:
            log.info("sweep task %s on node %s: %s (try %d of %d, the last)", task, node,
                     status, tries, self.tries_allowed)
            fields[_ERROR_FIELD] = str(ERROR_TIMEOUT if status == TIMEOUT else ERROR_READ)
            fields[_MD5_FIELD] = "0"
        return " ".join(fields)

    def _status(self, task: str, report: TaskReport | None, staged: _Staged | None,
                timed_out: bool) -> str:
        """The try's status (the module docstring's order)."""
        if report is not None and report.failed:
            return f"failed: {report.failed}"
        if timed_out:
            return TIMEOUT
        if report is None or staged is None:
            return FILES_MISSING
        if staged.over:
            return (f"failed: results over max_result_bytes ({staged.total} bytes)")
        if staged.foreign:
            return FILES_MISSING
        for name, (size, md5) in report.files.items():
            if staged.sizes.get(name) != size or staged.md5s.get(name) != md5:
                why = ("refused" if name in staged.refused else
                       "missing" if name not in staged.sizes else
                       f"{staged.sizes[name]} bytes, md5 {staged.md5s[name]}; "
                       f"tasks.json says {size} bytes, md5 {md5}")
                log.warning("sweep task %s: result file %s: %s", task, name, why)
                return FILES_MISSING
        verdict = checks.validate(staged.folder, report.exit_status, self.spec.validate,
                                  self.spec.folder, self.spec.timeout,
                                  required=sorted(self.result_names))
        return verdict.status

    def _place(self, task: str, staged: _Staged | None) -> None:
        """The task's files into ``results/<task id>/``, a stale folder replaced (an
        empty folder when none came)."""
        final = self.results_dir / task
        if staged is None:
            if final.exists() or final.is_symlink():
                _remove(final)
            final.mkdir()
        else:
            fsutil.swap_dir(staged.folder, final)

    # ------------------------------------------------------------------ the bundle
    def _unpack(self, req: Request, tasks: set[str]
                ) -> tuple[dict[str, TaskReport], dict[str, _Staged]]:
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
                       ) -> tuple[dict[str, TaskReport], dict[str, _Staged]]:
        """:meth:`_unpack` of a folder bundle (a node on the master home's file system
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
            return reports, {task: self._check_folder(dfd, path, task, req.node)
                             for task in reports}
        except (BundleError, OSError) as exc:
            log.warning("node %s: bundle %s is unreadable: %s; its results' files are "
                        "missing", req.node, req.bundle, exc)
            return {}, {}
        finally:
            os.close(dfd)

    def _check_folder(self, dfd: int, path: Path, task: str, node: str) -> _Staged:
        """Task ``task``'s folder in the folder bundle open as ``dfd`` (at ``path``):
        its files read, anything that is not a result file removed."""
        try:
            tfd = os.open(task, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd)
        except FileNotFoundError:
            # The task left no files: an empty folder of its own, to judge and place.
            self.stage_dir.mkdir(parents=True, exist_ok=True)
            (self.stage_dir / task).mkdir()
            return _Staged(self.stage_dir / task)
        staged = _Staged(path / task)
        try:
            with os.scandir(tfd) as listing:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in listing]
            for name, is_dir in entries:
                why = "" if name in self.result_names else "not a result name of the sweep"
                if not why and not is_dir:
                    why = self._read_entry(tfd, name, staged)
                elif not why:
                    why = "a folder, not a file"
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
        finally:
            os.close(tfd)
        return staged

    def _read_entry(self, tfd: int, name: str, staged: _Staged) -> str:
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
              ) -> tuple[dict[str, TaskReport], dict[str, _Staged]]:
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
            staged: dict[str, _Staged] = {}
            for task in reports:  # a task id is a test id: a plain name, no '/'
                folder = self.stage_dir / task
                folder.mkdir()
                staged[task] = _Staged(folder)
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
                     reports: Mapping[str, TaskReport], staged: dict[str, _Staged]) -> str:
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

    def _discard(self, req: Request, why: str) -> None:
        """Remove ``req``'s bundle (only one named for its node)."""
        if not own_bundle(req.node, req.bundle):
            return
        _remove(self.incoming / req.bundle)  # a file, or a folder bundle and what is left
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


def _with_results(req: Request, texts: Iterable[str]) -> Request:
    """``req`` carrying the results ``texts`` (canonical result texts) instead."""
    return dataclasses.replace(req, result_lines=tuple(texts), results=())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
