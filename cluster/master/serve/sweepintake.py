"""Taking a sweep run's results with their files (docs/sweeps.md section 9).

A node that sends a sweep task's result has uploaded the task's result files first, in one
*bundle* per call (its format and how it is read: :mod:`cluster.master.serve.sweepbundle`).

:meth:`SweepIntake.take` looks at a request carrying results before
:meth:`~cluster.master.state.runstate.RunState.handle` records them.  For each result of a task
the node was handed and that has no result yet:

1. its files are staged out of the bundle into ``runs/<id>/results/.stage/<task id>/``
   (:class:`~cluster.master.serve.sweepbundle.BundleReader`: nothing is ever written
   outside the staging folder);
2. the try is judged: ``failed: <the node's reason>`` when the node failed the task,
   ``timeout`` when the result's error code is 3, ``failed: result files missing`` when a
   file ``tasks.json`` lists did not arrive whole (no bundle, an unreadable one, a member
   missing, refused or not matching its size and md5), ``failed: results over
   max_result_bytes (<n> bytes)``, else :func:`cluster.sweep.checks.validate` (the exit
   status from ``tasks.json``, the sweep's result names required, ``nonempty``,
   ``match``): ``ok`` or ``invalid: <why>``.  A try those leave ``ok`` in a sweep with a
   check script is *held* (:meth:`SweepIntake._hold`): its files renamed to
   ``results/.pending/<task id>/``, a line of ``results/.pending/.holds`` saying what it
   is, its result withheld from the request, its job no longer the node's
   (:meth:`RunState.judging`), and its script handed to the
   :class:`~cluster.master.serve.checkpool.CheckPool`; the verdict settles it later
   (:meth:`SweepIntake.settle`, the steps below, its result journaled through
   :meth:`RunState.record_judged`).  A copy's result for a task held meanwhile is a
   duplicate;
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
``incoming/`` (a complete bundle stays: its node calls again with it); the tries a killed
master held for their check are judged again.  A run that ends with tries held records
them as failed (:meth:`SweepIntake.abandon`).

The cost: a sweep's request path reads its bundle and places its files (a folder bundle:
one look at each task's folder, one rename); check scripts run off it, in the pool.  The
time it takes is not counted against any node's heartbeat
(:meth:`RunState.pause <cluster.master.state.runstate.RunState.pause>`, called by the handler).
Runs that are not sweeps have no intake and pay nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from cluster.master.files.journal import result_text
from cluster.master.serve.checkpool import CheckPool
from cluster.master.serve.sweepbundle import (
    BundleReader,
    Staged,
    TaskReport,
    own_bundle,
    remove_path,
)
from cluster.master.state.runstate import RunState
from cluster.records import ERROR_READ, ERROR_TIMEOUT
from cluster.runtime import fsutil
from cluster.sweep import checks
from cluster.sweep.attempts import Attempt, AttemptsError, AttemptsWriter, read_attempts
from cluster.sweep.spec import SweepSpec
from cluster.wire import protocol
from cluster.wire.protocol import Request

log = logging.getLogger("cluster.master")

#: The run folder's file of tries, and the folders under ``runs/<id>/``.
ATTEMPTS_FILE = "sweep-attempts.tsv"
RESULTS_DIR = "results"
INCOMING_DIR = "incoming"
STAGE_DIR = ".stage"
#: The tries held for their check script: ``<task id>/`` (the files) and a line each in
#: the holds file.
PENDING_DIR = ".pending"
HOLDS_FILE = ".holds"
#: The statuses of a try that are not a verdict of the checks.
FILES_MISSING = "failed: result files missing"
TIMEOUT = "timeout"
#: The error code of a result line: after the test id.
_ERROR_FIELD = 1
_MD5_FIELD = 5


def files_md5(md5s: Mapping[str, str]) -> str:
    """A task's md5: of the lines ``<result name> <md5 of the file>\\n`` in name order, so a
    change in any result file changes it."""
    text = "".join(f"{name} {md5s[name]}\n" for name in sorted(md5s))
    return hashlib.md5(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Held:
    """A try held for its check script (:mod:`cluster.master.serve.checkpool`): its files
    are ``results/.pending/<task id>/``, this one line of ``results/.pending/.holds``, so
    a successor judges it again.  A task has at most one try held at a time."""

    node: str
    task: str
    text: str  # the result as the node sent it (canonical text)
    report: TaskReport
    md5s: Mapping[str, str]
    receive: int

    def to_json(self) -> bytes:
        """Its line of the holds file (newline-ended)."""
        r = self.report
        return json.dumps({"node": self.node, "task": self.task, "text": self.text,
                           "start": r.start, "runtime": r.runtime, "exit": r.exit_status,
                           "files": {n: list(v) for n, v in r.files.items()},
                           "md5s": dict(self.md5s), "receive": self.receive}
                          ).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Held:
        """ValueError, KeyError or TypeError when ``data`` is not one."""
        d = json.loads(data)
        files = {str(n): (int(v[0]), str(v[1])) for n, v in d["files"].items()}
        report = TaskReport(float(d["start"]), float(d["runtime"]), int(d["exit"]), files)
        return cls(str(d["node"]), str(d["task"]), str(d["text"]), report,
                   {str(n): str(m) for n, m in d["md5s"].items()}, int(d["receive"]))


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
        self.bundles = BundleReader(self.incoming, self.stage_dir, self.result_names,
                                    max_result_bytes)
        self.tries_allowed = 1 + spec.retries
        #: Tries made of each task so far, by every master of the run.
        self.tries: dict[str, int] = {}
        #: The last bundle this master took of each node: a node calling again with it (it
        #: lost the reply; it makes no new call before it has one) gets no second try.
        self.taken: dict[str, str] = {}
        #: The rules judged in the request path: all but the check script.
        self.rules = dataclasses.replace(spec.validate, script="")
        #: The check scripts' pool (None: no script, or run in the request path).
        self.pool: CheckPool | None = None
        self.pending_dir = self.results_dir / PENDING_DIR
        #: The tries held for their check script, by task (one at a time).
        self.held: dict[str, Held] = {}
        #: The holds file (opened at the first hold) and its lines of this request.
        self._holds_fd = -1
        self._hold_lines: list[bytes] = []
        #: The tries judged in this request, written to the attempts log at its end.
        self._batch: list[Attempt] = []

    @classmethod
    def open(cls, run_dir: Path, spec: SweepSpec, max_result_bytes: int,
             state: RunState, workers: int = 0) -> SweepIntake:
        """The intake of the run in ``run_dir``: its folders made, what a killed master
        left cleaned, the tries so far counted and the nodes of each task put back told to
        ``state``.  ``workers``: how many check scripts run at once off the request path
        (master.conf ``sweep_check_workers``); 0 runs each in the request path (tests).
        The tries a killed master held for their check are judged again."""
        results = run_dir / RESULTS_DIR
        (results / INCOMING_DIR).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(results / STAGE_DIR, ignore_errors=True)
        for entry in (results / INCOMING_DIR).iterdir():
            if not protocol.BUNDLE_NAME.fullmatch(entry.name):
                # An upload's temporary file (its node was killed mid-upload): never a
                # bundle a call can name.
                log.info("run %s: removing %s, an unfinished upload", run_dir.name, entry)
                remove_path(entry)
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
        if spec.validate.script and workers:
            intake.pool = CheckPool(workers, intake._check)
        else:
            intake.rules = spec.validate
        intake._reload(state)
        return intake

    def _check(self, folder: Path, stop: Callable[[], bool]) -> checks.Verdict:
        """A pool worker's check (its thread: it reads only the sweep file's values)."""
        return checks.run_script(folder, self.spec.validate.script, self.spec.folder,
                                 self.spec.timeout, stop)

    def _reload(self, state: RunState) -> None:
        """The tries a killed master held for their check, submitted again: each task
        whose folder is in ``.pending/``, with its last line of the holds file; any other
        folder there is removed."""
        try:
            tasks = {e for e in os.listdir(self.pending_dir) if not e.startswith(".")}
        except FileNotFoundError:
            return
        lines: dict[str, Held] = {}
        if tasks:
            try:
                with open(self.pending_dir / HOLDS_FILE, "rb") as fh:
                    for line in fh:  # streamed: only the held tasks' lines are kept
                        try:
                            held = Held.from_json(line)
                        except (ValueError, KeyError, TypeError):
                            continue  # a torn last line
                        if held.task in tasks:
                            lines[held.task] = held
            except FileNotFoundError:
                pass
        for task in sorted(tasks):
            held_try = lines.get(task)
            if held_try is None or self.pool is None or task in state.results:
                remove_path(self.pending_dir / task)
                continue
            self.held[task] = held_try
            self.pool.submit(task, self.pending_dir / task)
        if self.held:
            log.info("run %s: %d tries held for their check script by an earlier master, "
                     "judged again", self.run_dir.name, len(self.held))

    # ------------------------------------------------------------------ a request
    def take(self, req: Request, state: RunState, session: str = "") -> Request:
        """``req`` as the run state is to handle it: its results judged (the module
        docstring), the withheld ones taken out, the last tries' rewritten as failures.
        Files are in place and tries logged when it returns.  ``session``: the sending
        process's (only the results of tasks handed to that process are judged here)."""
        texts = list(req.result_lines) + [result_text(r) for r in req.results]
        if not texts:
            if req.bundle:
                self.bundles.discard(req, "a bundle came with no result")
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
            reports, staged = self.bundles.unpack(req, set(mine))
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
            if self._hold_lines:
                self._write_holds()
            if self._batch:
                self.log.write_many(self._batch)
                self._batch.clear()
            shutil.rmtree(self.stage_dir, ignore_errors=True)
        return _with_results(req, [t for p, t in enumerate(out) if p not in withheld])

    def done(self, req: Request) -> None:
        """``req``'s results are journaled: its bundle (when it is the node's own) is no
        longer needed, whether its files were taken or not (duplicates)."""
        if req.bundle:
            self.bundles.discard(req, "")

    def close(self) -> None:
        """Stop the check scripts (the tries they judge stay held, on disk, for a
        successor), sync and close the attempts log."""
        if self.pool is not None:
            self.pool.close()
        if self._holds_fd >= 0:
            os.close(self._holds_fd)
            self._holds_fd = -1
        self.log.close()

    # ------------------------------------------------------------------ the check pool
    def settle(self, state: RunState, write: Callable[[bytes], None], now: float) -> int:
        """Take the verdicts of the check scripts that ended: each try settled as
        :meth:`_judge` settles one (its result journaled through ``write`` before its
        hold is removed); how many."""
        if self.pool is None:
            return 0
        verdicts = self.pool.drain()
        for task, verdict in verdicts:
            held = self.held.pop(task, None)
            if held is not None:
                self._settle(held, verdict.status, state, write, now)
        return len(verdicts)

    def abandon(self, state: RunState, write: Callable[[bytes], None], now: float,
                why: str) -> int:
        """The run ended (``why``) with tries still held: each is recorded as the task's
        last try, ``failed: not judged (<why>)``, its files kept; how many."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        held = list(self.held.values())
        self.held.clear()
        for h in held:
            self._settle(h, f"failed: not judged ({why})", state, write, now, last=True)
        if held:
            log.warning("run %s: %d tries were not judged before the run ended (%s)",
                        self.run_dir.name, len(held), why)
        return len(held)

    def _hold(self, node: str, task: str, text: str, report: TaskReport, staged: Staged,
              state: RunState) -> None:
        """Hold a try that passed every rule but the check script, and submit the check:
        its folder renamed to ``.pending/<task id>/`` (the script's argument ends in the
        task id, as ``results/<task id>/`` does), its line of the holds file written with
        the request's others before the reply (:meth:`_write_holds`)."""
        assert self.pool is not None
        folder = self.pending_dir / task
        try:
            os.rename(staged.folder, folder)
        except FileNotFoundError:
            self.pending_dir.mkdir(exist_ok=True)
            os.rename(staged.folder, folder)
        except OSError:  # a stale folder a killed master left
            remove_path(folder)
            os.rename(staged.folder, folder)
        held = Held(node, task, text, report, dict(staged.md5s), sum(staged.sizes.values()))
        self._hold_lines.append(held.to_json())
        self.held[task] = held
        state.judging(node, task)
        self.pool.submit(task, folder)

    def _write_holds(self) -> None:
        """Append the request's hold lines to the holds file, in one write."""
        if self._holds_fd < 0:
            self.pending_dir.mkdir(exist_ok=True)
            self._holds_fd = os.open(self.pending_dir / HOLDS_FILE,
                                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                     0o644)
        data = memoryview(b"".join(self._hold_lines))
        self._hold_lines.clear()
        while data:  # bounded: each write takes at least one byte
            data = data[os.write(self._holds_fd, data):]

    def _settle(self, held: Held, status: str, state: RunState,
                write: Callable[[bytes], None], now: float, last: bool = False) -> None:
        task = held.task
        folder = self.pending_dir / task
        if task in state.results:  # another try's result came first: not a try
            state.duplicates += 1
        else:
            tries = self.tries.get(task, 0) + 1
            self.tries[task] = tries
            final = last or status == "ok" or tries >= self.tries_allowed
            report = held.report
            self.log.write(Attempt(task, held.node, report.start, report.runtime,
                                   report.exit_status, held.receive, status, tries, final))
            if final:
                self._place(task, None, folder)
                write(state.record_judged(held.node, task,
                                          _settled_text(held.text, status, held.md5s), now))
                return
            log.info("sweep task %s on node %s: %s (try %d of %d); tried again", task,
                     held.node, status, tries, self.tries_allowed)
            state.retry(held.node, task)
        remove_path(folder)  # the hold is over

    @property
    def dirty(self) -> bool:
        """Whether tries were logged since the last :meth:`sync` (the journal's companion)."""
        return self.log.dirty

    def sync(self) -> None:
        self.log.sync()

    # ------------------------------------------------------------------ one task
    def _judge(self, node: str, task: str, text: str, report: TaskReport | None,
               staged: Staged | None, state: RunState) -> str | None:
        """Judge one try; log it; return the result text to record (None: withheld)."""
        if task in self.held:
            # A copy of a task whose try waits for its check: a duplicate, as a copy after
            # a result is (the task is tried again if that try is not valid).
            state.judging(node, task)
            state.duplicates += 1
            return None
        timed_out = text.split(" ", 2)[_ERROR_FIELD] == str(ERROR_TIMEOUT)
        status = self._status(task, report, staged, timed_out)
        if status == "ok" and self.pool is not None and report is not None \
                and staged is not None:
            self._hold(node, task, text, report, staged, state)
            return None
        tries = self.tries.get(task, 0) + 1
        self.tries[task] = tries
        final = status == "ok" or tries >= self.tries_allowed
        receive = sum(staged.sizes.values()) if staged else 0  # every result file home
        report = report or TaskReport()
        self._batch.append(Attempt(task, node, report.start, report.runtime,
                                   report.exit_status, receive, status, tries, final))
        if not final:
            log.info("sweep task %s on node %s: %s (try %d of %d); tried again", task, node,
                     status, tries, self.tries_allowed)
            state.retry(node, task)
            return None
        self._place(task, staged)
        if status != "ok":
            log.info("sweep task %s on node %s: %s (try %d of %d, the last)", task, node,
                     status, tries, self.tries_allowed)
        return _settled_text(text, status, staged.md5s if staged else {})

    def _status(self, task: str, report: TaskReport | None, staged: Staged | None,
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
        for name in sorted(self.result_names - staged.sizes.keys()):
            return f"invalid: result {name} is missing"
        verdict = checks.validate(staged.folder, report.exit_status, self.rules,
                                  self.spec.folder, self.spec.timeout)
        return verdict.status

    def _place(self, task: str, staged: Staged | None, folder: Path | None = None) -> None:
        """The task's files (``staged``'s, or ``folder``) into ``results/<task id>/``, a
        stale folder replaced (an empty folder when none came)."""
        final = self.results_dir / task
        source = staged.folder if staged is not None else folder
        if source is None:
            if final.exists() or final.is_symlink():
                remove_path(final)
            final.mkdir()
            return
        try:
            # The usual case, one system call: nothing there (or an empty folder).
            os.rename(source, final)
        except OSError:
            fsutil.swap_dir(source, final)


def _settled_text(text: str, status: str, md5s: Mapping[str, str]) -> str:
    """The result ``text`` as recorded for a try of ``status``: error 0 and the md5 of its
    files when ``ok``, else error 1 (3 for ``timeout``) and md5 ``0``."""
    fields = text.split(" ", 6)
    if status == "ok":
        fields[_ERROR_FIELD] = "0"
        fields[_MD5_FIELD] = files_md5(md5s)
    else:
        fields[_ERROR_FIELD] = str(ERROR_TIMEOUT if status == TIMEOUT else ERROR_READ)
        fields[_MD5_FIELD] = "0"
    return " ".join(fields)


def _with_results(req: Request, texts: Iterable[str]) -> Request:
    """``req`` carrying the results ``texts`` (canonical result texts) instead."""
    return dataclasses.replace(req, result_lines=tuple(texts), results=())


