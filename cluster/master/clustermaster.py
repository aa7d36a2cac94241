"""clustermaster: one invocation does phase 1, phase 2 and at most one run (seed 000).

* Phase 1 -- queue scan: the discoverers of this priority turn new work into queue lines
  (priority 0: clusterpush droppings; priority 1: commit polling and priority 2: cron
  plug in through :data:`cluster.triggers.discovery.DISCOVERERS`).
* Phase 2 -- the PID-file dance (:mod:`cluster.master.pidfile`).
* Phase 3 -- the run at the head of the queue: job.start, build.py -> jobs, serve nodes on
  base_port + priority until every job has a result and the nodes have uploaded, collate,
  report, archive, dequeue, remove the PID file.

The master's state survives its own death: job.start keeps the run id, the jobs file is
reused, and every accepted result is in the journal before the node hears back.  A master
that takes over a run whose journal it finds serves only the jobs that have no result yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import datatypes
from cluster.config import Config
from cluster.defaults import EXIT_OK, REPO_ROOT, USER_PRIORITY
from cluster.errors import ClusterError, ProtocolError
from cluster.home import Home
from cluster.master import abort, finish, journal
from cluster.master.joblist import JobFile
from cluster.master.pidfile import PidDecision, PidFile
from cluster.master.runstate import RunState, Settings
from cluster.master.server import NodeServer
from cluster.queue import QueueFile, RunSpec
from cluster.report import mail
from cluster.runtime import fsutil, proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.triggers import discovery
from cluster.triggers.git.export import export_commit
from cluster.triggers.git.info import commit_info
from cluster.wire import caps, protocol
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: How often the master looks for nodes whose lease lapsed [seconds].
LIVENESS_INTERVAL = 0.25
BUILD_SCRIPT = REPO_ROOT / "build.py"
#: RunState.fatal of a run its user stopped with clusterpush abort.
USER_ABORT = "aborted by its user (clusterpush abort)"
#: build.py understands these queue options; the rest are for the node or the report.
BUILD_OPTIONS = ("lowres", "highres")


def new_run_id(priority: int, clock: Clock) -> str:
    """A job id as seed 001 suggests (the start time), made unique across priorities."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(clock.time()))
    return f"{stamp}-p{priority}-{secrets.token_hex(2)}"


def write_status(path: Path, line: str) -> None:
    """Replace the status file (what the dashboard shows) with ``line``.

    Atomic, so a reader never sees half a line, but not fsync'ed: it is rewritten every
    second and harmless to lose in a crash (fsutil's contract for status lines).
    """
    fsutil.atomic_write(path, line + "\n", fsync=False)


class JobListError(ClusterError):
    """build.py could not make the run's job list."""


class RunSetupError(ClusterError):
    """A run's source could not be put in place; ``start`` is its (unwritten) job.start."""

    def __init__(self, start: JobStart, problem: str) -> None:
        super().__init__(problem)
        self.start = start


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    archive: Path | None
    replaced: bool = False
    failed: str = ""


class ClusterMaster:
    """One clustermaster invocation at one priority.  Callers use :meth:`main`."""

    def __init__(self, cfg: Config, priority: int, config_args: list[str] | None = None,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.priority = priority
        self.config_args = config_args or []
        self.clock = clock or SystemClock()
        self.home = Home(cfg.home)
        self.queue = QueueFile(self.home.queue(priority), self.home.queue_lock(priority))

    # ------------------------------------------------------------------ phases
    def main(self) -> int:
        self.home.create()
        self.phase1()
        pid = PidFile(self.home.pid_file(self.priority), self.clock,
                      stale_after=self.cfg.pid_stale, wait=self.cfg.pid_wait)
        decision = pid.acquire()
        if decision is not PidDecision.RUN:
            log.debug("priority %d: %s, exiting", self.priority, decision.value)
            return EXIT_OK
        try:
            spec = self.queue.head()
            if spec is None:
                return EXIT_OK
            self.run(spec, pid)
        finally:
            pid.release()
        return EXIT_OK

    def phase1(self) -> None:
        """Queue scan: let this priority's discoverers append new runs to the queue."""
        for discover in discovery.DISCOVERERS.get(self.priority, ()):
            try:
                for spec in discover(self.home, self.cfg, self.queue):
                    log.info("priority %d: queued %s", self.priority, spec.line())
            except Exception:  # one broken discoverer must not stop the run
                log.exception("priority %d: discoverer %s failed", self.priority,
                              getattr(discover, "__name__", discover))

    # ------------------------------------------------------------------ phase 3
    def run(self, spec: RunSpec, pid: PidFile) -> RunOutcome:
        """Run ``spec`` to the end (or until another master replaces this one)."""
        p = self.priority
        # Listen before job.start exists: a node that reads job.start at once then finds
        # the port open (its call waits in the backlog while build.py makes the job list)
        # instead of being refused and retrying connect_retry_delay later.  The handler
        # only runs from _serve, once ``state`` and ``jrnl`` below exist.
        parse = protocol.parse_request
        max_line, max_lines = self.cfg.max_line_bytes, self.cfg.max_request_lines
        monotonic = self.clock.monotonic
        live: dict[str, Any] = {}  # "state" and "journal", set by bind() before serving

        def bind(state: RunState | None, jrnl: journal.Journal | None) -> None:
            """Give the handler the run to serve (None, None: the serving is over)."""
            live["state"], live["journal"] = state, jrnl

        def handler(data: bytes, peer: str) -> bytes:
            state, jrnl = live["state"], live["journal"]
            try:
                req = parse(data, max_line, max_lines, canonical=True)
            except ProtocolError as exc:
                log.warning("peer %s: bad request: %s", peer, exc)
                return protocol.format_reply(protocol.Reply(protocol.ABORT,
                                                            reason=f"bad request: {exc}"))
            outcome = state.handle(req, monotonic())
            for note in outcome.notes:
                log.warning("peer %s: %s", peer, note)
            if outcome.journal:
                jrnl.write(outcome.journal)  # on disk before the node hears back
            return protocol.format_reply(outcome.reply)

        try:
            server = NodeServer((self.cfg.listen_address, self.cfg.port_for(p)), handler,
                                max_line=self.cfg.max_line_bytes,
                                max_lines=self.cfg.max_request_lines,
                                deadline=self.cfg.connection_deadline)
        except OSError as exc:
            # Another program holds the port: leave everything as it is and try again at
            # the next invocation (a run in progress keeps its id and journal).
            log.error("priority %d: cannot listen on %s:%d: %s", p, self.cfg.listen_address,
                      self.cfg.port_for(p), exc)
            return RunOutcome("", None, replaced=True)
        try:
            return self._run(spec, pid, server, bind)
        finally:
            server.close()

    def _run(self, spec: RunSpec, pid: PidFile, server: NodeServer,
             bind: Callable[[RunState | None, journal.Journal | None], None]) -> RunOutcome:
        home, p = self.home, self.priority
        try:
            start = self._job_start(spec)
        except RunSetupError as exc:
            log.error("run %s: %s", exc.start.id, exc)
            return self._abandon(spec, exc.start, str(exc), "its source could not be made")
        run_id = start.id
        try:
            jobs = self._jobs(start)
        except JobListError as exc:
            # Retrying cannot help (bad corpus, bad configuration): report and dequeue,
            # or the run would block its queue forever.
            log.error("run %s: %s", run_id, exc)
            return self._abandon(spec, start, str(exc))
        run_dir = home.run_dir(run_id)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        jrnl = journal.Journal(home.results(p), run_id, self.cfg.journal_sync_interval)
        if jrnl.loaded:
            log.info("run %s: taking over, %d results already journaled", run_id,
                     len(jrnl.loaded))
        settings = Settings.from_config(self.cfg)
        needs = self.cfg.required_tools

        def suitable(caps_text: str) -> tuple[bool, str]:
            return caps.suitable(caps_text, needs, self.cfg.min_ram_mb)

        state = RunState(run_id, jobs, self.clock.monotonic(), settings, suitable,
                         done=jrnl.lines)
        jrnl.lines = []  # the state has them now
        bind(state, jrnl)
        started = self.clock.time()
        log.info("run %s: %s, %d jobs (%d to do), port %d", run_id, spec.line(), len(jobs),
                 state.remaining, self.cfg.port_for(p))
        try:
            replaced = self._serve(server, state, jrnl, pid)
            if replaced:
                log.warning("run %s: the PID file is no longer ours; aborting nodes, exiting",
                            run_id)
                return RunOutcome(run_id, None, replaced=True)
            archive, text = self._finish(spec, start, state, started)
            # The run is over: nodes that call in now learn it and leave.
            self._unlink(home.job_start(p))
            self._linger(server, state)
        finally:
            jrnl.close()
            jobs.close()
        fatal = state.fatal
        # The run's state and job index, most of the master's memory with a million jobs,
        # are done with: the md5 cache rebuild below reuses their memory instead of adding
        # to it.  (The server is no longer served, so its handler needs no state.)
        bind(None, None)
        del state, jobs
        abort.clear(home, run_id)
        self._adopt_clean_tree(spec, start)
        self._mail(spec, start, archive, text, failed=bool(fatal))
        if spec.kind in finish.BASELINE_KINDS and not fatal:
            # After the nodes have gone: reading 50 big tables takes a while.
            finish.rebuild_cache(home)
        self.queue.remove(spec)
        for path in (home.jobs(p), home.results(p)):
            self._unlink(path)
        shutil.rmtree(run_dir, ignore_errors=True)
        write_status(home.status(p), f"idle - last run {run_id} finished "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.clock.time()))} "
                     "UTC")
        log.info("run %s: archived in %s", run_id, archive)
        return RunOutcome(run_id, archive, failed=fatal)

    def _job_start(self, spec: RunSpec) -> JobStart:
        """Reuse job.start if it describes this queue line (takeover), else write a new one.

        Before job.start is written the run's source is in place: a commit run's tree is
        exported at its commit, a bmpcmp run's test list is taken from the user's last run.
        RunSetupError (carrying the unwritten JobStart) when that cannot be done.
        """
        path = self.home.job_start(self.priority)
        try:
            old = JobStart.parse(path.read_text(encoding="utf-8"))
            if old.queue == spec.line():
                self._prepare_source(spec, old)  # a takeover: redo what may be missing
                return old
        except FileNotFoundError:
            pass
        except ValueError as exc:
            log.warning("%s is unreadable (%s); starting the run afresh", path, exc)
        run_id = new_run_id(self.priority, self.clock)
        start = JobStart(
            id=run_id, priority=self.priority,
            queue=spec.line(), kind=spec.kind, ref=spec.ref, products=spec.products,
            tree=spec.tree, source=self._source_for(spec, run_id),
            build=self.cfg.build_command,
            tests=self.cfg.tests_dir.as_posix() if not self.cfg.tests_dir.is_absolute()
            else os.path.relpath(self.cfg.tests_dir, self.home.root),
            options=spec.options,
            baseline=spec.tree if finish.is_bmpcmp(spec) else "")
        for stale in (self.home.jobs(self.priority), self.home.results(self.priority)):
            self._unlink(stale)
        self._prepare_source(spec, start)
        fsutil.atomic_write(path, start.format())
        return start

    def _source_for(self, spec: RunSpec, run_id: str) -> str:
        """The tree the nodes build, relative to the home."""
        if spec.kind == "user":
            return f"users/{spec.ref}/{spec.tree}"
        if spec.kind == "git" and self._repository(spec.tree):
            return f"runs/{run_id}/source/{spec.tree}"  # the commit, exported
        return spec.tree  # the master's own clean tree of that product

    def _repository(self, tree: str) -> bool:
        """Whether the master keeps a git clone of ``tree`` (commit runs export from it)."""
        return tree in datatypes.parse_repositories(self.cfg.repositories)

    def _prepare_source(self, spec: RunSpec, start: JobStart) -> None:
        """Export a commit run's tree; write a bmpcmp run's test list; check the baseline."""
        run_dir = self.home.run_dir(start.id)
        try:
            if exported_source(start):
                dest = self.home.root / start.source
                if not dest.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    export_commit(self.home, self.cfg, spec.tree, spec.ref, dest)
            elif spec.kind != "user" and not (self.home.root / start.source).is_dir():
                raise ClusterError(f"the master has no tree {start.source!r} to build "
                                   f"(expected {self.home.root / start.source})")
            if finish.is_bmpcmp(spec):
                if not (self.home.root / start.baseline).is_dir():
                    raise ClusterError(f"bmpcmp needs the master's clean tree "
                                       f"{self.home.root / start.baseline} as its baseline")
                listing = run_dir / "bmpcmp.lst"
                if not listing.exists():
                    previous = finish.last_user_run(self.home, spec.ref)
                    if previous is None:
                        raise ClusterError(f"user {spec.ref} has no earlier run to bmpcmp")
                    run_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(previous / finish.CHANGED_LIST, listing)
        except ClusterError as exc:
            raise RunSetupError(start, str(exc)) from None

    def _jobs(self, start: JobStart) -> JobFile:
        """The run's job list: the jobs file if it is there (takeover), else build.py's.

        build.py writes straight into the file (a million job lines are 200 MB or more: the
        master never holds them), which is then indexed (:class:`JobFile`).
        """
        path = self.home.jobs(self.priority)
        if not path.exists():
            argv = [sys.executable, str(BUILD_SCRIPT), *self.config_args,
                    "--home", str(self.home.root)]
            if "bmpcmp" in start.options:
                argv += ["bmpcmp", "--from", str(self.home.run_dir(start.id) / "bmpcmp.lst")]
            else:
                argv += [*start.products, *[o for o in start.options
                                            if o in BUILD_OPTIONS or o.startswith("filter=")]]
            timeout = self.cfg.build_timeout
            # Straight into the file, fsync'ed before the rename (a takeover reuses it); a
            # failure leaves no jobs file, and the temporary file is removed.
            with fsutil.atomic_writer(path) as out:
                done = proc.run(argv, timeout=timeout, stdout=out)
                problems = done.text("stderr").strip()
                if not done.ok:
                    why = done.describe(timeout)
                    if done.timed_out:
                        why += " (config build_timeout); its process tree was killed"
                    raise JobListError(f"build.py failed: {why}"
                                       + (f": {problems}" if problems else ""))
            if problems:
                log.warning("build.py: %s", problems)
        try:
            jobs = JobFile(path)
        except ValueError as exc:
            raise JobListError(str(exc)) from None
        for problem in jobs.problems:
            log.warning("%s", problem)
        if jobs.skipped > len(jobs.problems):
            log.warning("%s: %d more bad job lines skipped", path,
                        jobs.skipped - len(jobs.problems))
        return jobs

    def _serve(self, server: NodeServer, state: RunState, jrnl: journal.Journal,
               pid: PidFile) -> bool:
        """Serve nodes until the run is finished; True if another master replaced us."""
        next_tick = next_live = next_pid = 0.0
        while True:
            server.serve_once(LIVENESS_INTERVAL)
            now = self.clock.monotonic()
            if now >= next_live:
                # Often, so a dead node is dropped within heartbeat_timeout plus one poll;
                # a pass over 1,000 nodes costs a fraction of a millisecond.
                for note in state.tick(now):
                    log.warning("%s", note)
                next_live = now + LIVENESS_INTERVAL
            if now >= next_tick:
                jrnl.sync_if_due(now)
                write_status(self.home.status(self.priority),
                             f"run {state.run_id} - {state.status_line()}")
                next_tick = now + 1.0
            if now >= next_pid:
                next_pid = now + self.cfg.pid_check_interval
                if self.priority == USER_PRIORITY and not state.fatal and \
                        abort.requested(self.home, state.run_id):
                    # clusterpush abort: every node is told ABORT at its next call, and
                    # the run ends now with an "aborted" report.
                    state.fatal = USER_ABORT
                    log.warning("run %s: aborted by its user", state.run_id)
                    return False
                if not pid.still_mine():
                    state.fatal = "clustermaster replaced"
                    self._linger(server, state, limit=min(self.cfg.linger, 5.0))
                    return True
            if state.finished(now):
                return False

    def _linger(self, server: NodeServer, state: RunState, limit: float | None = None) -> None:
        """Keep answering (ABORT) until every live node has been told, or ``linger`` passes."""
        deadline = self.clock.monotonic() + (self.cfg.linger if limit is None else limit)
        while not state.everyone_told() and self.clock.monotonic() < deadline:
            server.serve_once(0.25)

    # ------------------------------------------------------------------ collation
    def _finish(self, spec: RunSpec, start: JobStart, state: RunState,
                started: float) -> tuple[Path, str]:
        """Collate, compare, report and archive the run; return its archive and report."""
        home = self.home
        run_id = state.run_id
        archive = home.archive / run_id
        archive.mkdir(parents=True, exist_ok=True)
        logs = home.run_dir(run_id) / "logs"
        if logs.is_dir():
            shutil.copytree(logs, archive / "logs", dirs_exist_ok=True)
        elapsed = self.clock.time() - started
        text = finish.finish(home, finish.FinishedRun(
            spec=spec, start=start, state=state, elapsed=elapsed, archive=archive,
            header=self._header(spec, run_id), aborted=state.fatal == USER_ABORT))
        fsutil.atomic_write(archive / "report.txt", text)
        fsutil.atomic_write(archive / "run.info", start.format() + f"elapsed {elapsed:.1f}\n")
        return archive, text

    def _header(self, spec: RunSpec, run_id: str) -> str:
        """The report's first lines; a commit run's name the commit and what it changed."""
        header = run_header(spec, run_id)
        if spec.kind != "git" or not self._repository(spec.tree):
            return header
        try:
            info = commit_info(self.home, self.cfg, spec.tree, spec.ref)
        except ClusterError as exc:
            log.warning("run %s: no commit details: %s", run_id, exc)
            return header
        lines = [header, "", f"commit {info.sha}", f"Author: {info.author}",
                 f"Date:   {info.date}", "", *("    " + line for line in
                                                 info.message.rstrip().splitlines()),
                 "", "Changed files:", *(f"  {path}" for path in info.changed_paths), "",
                 f"Products tested: {' '.join(spec.products)}"]
        return "\n".join(lines)

    def _adopt_clean_tree(self, spec: RunSpec, start: JobStart) -> None:
        """After a commit run, its exported tree becomes the master's clean tree.

        The clean tree is what auto runs build, what user pushes are diffed against and
        what bmpcmp renders as the baseline: it matches the baseline table (as the Perl
        moved its working copy to the revision after the report, build failure or not).
        """
        if not exported_source(start):
            return
        exported = self.home.root / start.source
        if not exported.is_dir():
            return
        clean = self.home.root / spec.tree
        old = clean.with_name(f".{clean.name}.old.{os.getpid()}")
        if clean.exists():
            os.replace(clean, old)
        os.replace(exported, clean)
        shutil.rmtree(old, ignore_errors=True)
        log.info("clean tree %s is now commit %s", clean, spec.ref)

    def _mail(self, spec: RunSpec, start: JobStart, archive: Path, text: str,
              failed: bool) -> None:
        """Mail the report (when smtp_host is set); the outcome is noted in mail.log."""
        if not self.cfg.smtp_host:
            return
        subject = ("FAILED: " if failed else "") + (
            f"bmpcmp finished {spec.line()}" if finish.is_bmpcmp(spec) else spec.line())
        try:
            mail.send_report(self.cfg, self.home, spec.kind, spec.ref, subject, text)
            note = f"mailed {subject!r}\n"
        except mail.MailError as exc:
            log.error("run %s: report not mailed: %s", start.id, exc)
            note = f"not mailed: {exc}\n"
        with open(archive / "mail.log", "a", encoding="utf-8") as fh:
            fh.write(note)

    def _abandon(self, spec: RunSpec, start: JobStart, reason: str,
                 what: str = "its job list could not be made") -> RunOutcome:
        """End a run that cannot start: a report saying why, then dequeue it."""
        archive = self.home.archive / start.id
        archive.mkdir(parents=True, exist_ok=True)
        text = "\n".join([run_header(spec, start.id), "",
                          f"The run could not start: {what}.", f"  {reason}", ""])
        fsutil.atomic_write(archive / "report.txt", text)
        fsutil.atomic_write(archive / "run.info", start.format())
        self._mail(spec, start, archive, text, failed=True)
        self.queue.remove(spec)
        for path in (self.home.job_start(self.priority), self.home.jobs(self.priority),
                     self.home.results(self.priority)):
            self._unlink(path)
        shutil.rmtree(self.home.run_dir(start.id), ignore_errors=True)
        return RunOutcome(start.id, archive, failed=reason)

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def exported_source(start: JobStart) -> bool:
    """Whether the run builds a commit the master exported (see _source_for)."""
    return start.kind == "git" and start.source.startswith("runs/")


def run_header(spec: RunSpec, run_id: str) -> str:
    if spec.kind == "user":
        return (f"User regression: user {spec.ref} products {','.join(spec.products)} "
                f"options {' '.join(spec.options) or '-'} run {run_id}")
    return f"Regression {spec.kind} {spec.ref} products {','.join(spec.products)} run {run_id}"
