"""clustermaster: one invocation does phase 1, phase 2 and at most one run (seed 000).

* Phase 1 -- queue scan: the discoverers of this priority turn new work into queue lines
  (priority 0: clusterpush droppings; priority 1: commit polling and priority 2: cron
  plug in through :data:`cluster.discovery.DISCOVERERS`).
* Phase 2 -- the PID-file dance (:mod:`cluster.pidfile`).
* Phase 3 -- the run at the head of the queue: job.start, build.py -> jobs, serve nodes on
  base_port + priority until every job has a result and the nodes have uploaded, collate,
  report, archive, dequeue, remove the PID file.

The master's state survives its own death: job.start keeps the run id, the jobs file is
reused, and every accepted result is in the journal before the node hears back.  A master
that takes over a run whose journal it finds serves only the jobs that have no result yet.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import caps, discovery, journal, protocol, report, tab
from cluster.clock import Clock, SystemClock
from cluster.config import Config
from cluster.errors import ClusterError, ProtocolError
from cluster.home import Home
from cluster.joblist import JobFile
from cluster.jobstart import JobStart
from cluster.pidfile import PidDecision, PidFile
from cluster.queuefiles import QueueFile, RunSpec
from cluster.runstate import RunState, Settings
from cluster.server import NodeServer

log = logging.getLogger("cluster.master")

REPO = Path(__file__).resolve().parents[1]
#: How often the master looks for nodes whose lease lapsed [seconds].
LIVENESS_INTERVAL = 0.25
BUILD_SCRIPT = REPO / "build.py"
#: build.py understands these queue options; the rest are for the node or the report.
BUILD_OPTIONS = ("lowres", "highres")


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename: never torn."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def new_run_id(priority: int, clock: Clock) -> str:
    """A job id as seed 001 suggests (the start time), made unique across priorities."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(clock.time()))
    return f"{stamp}-p{priority}-{secrets.token_hex(2)}"


class JobListError(ClusterError):
    """build.py could not make the run's job list."""


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
            return 0
        try:
            spec = self.queue.head()
            if spec is None:
                return 0
            self.run(spec, pid)
        finally:
            pid.release()
        return 0

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

        def bind(state: RunState, jrnl: journal.Journal) -> None:
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
             bind: Callable[[RunState, journal.Journal], None]) -> RunOutcome:
        home, p = self.home, self.priority
        start = self._job_start(spec)
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
        settings = Settings(heartbeat_timeout=self.cfg.heartbeat_timeout,
                            batch_per_slot=self.cfg.batch_per_slot,
                            batch_seconds=self.cfg.batch_seconds,
                            speculate_tail=self.cfg.speculate_tail,
                            upload_timeout=self.cfg.upload_timeout)
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
            archive = self._finish(spec, start, state, started)
            # The run is over: nodes that call in now learn it and leave.
            self._unlink(home.job_start(p))
            self._linger(server, state)
        finally:
            jrnl.close()
            jobs.close()
        self.queue.remove(spec)
        for path in (home.jobs(p), home.results(p)):
            self._unlink(path)
        shutil.rmtree(run_dir, ignore_errors=True)
        atomic_write(home.status(p), f"idle - last run {run_id} finished "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.clock.time()))} "
                     "UTC\n")
        log.info("run %s: archived in %s", run_id, archive)
        return RunOutcome(run_id, archive, failed=state.fatal)

    def _job_start(self, spec: RunSpec) -> JobStart:
        """Reuse job.start if it describes this queue line (takeover), else write a new one."""
        path = self.home.job_start(self.priority)
        try:
            old = JobStart.parse(path.read_text(encoding="utf-8"))
            if old.queue == spec.line():
                return old
        except FileNotFoundError:
            pass
        except ValueError as exc:
            log.warning("%s is unreadable (%s); starting the run afresh", path, exc)
        tree = spec.tree
        start = JobStart(
            id=new_run_id(self.priority, self.clock), priority=self.priority,
            queue=spec.line(), kind=spec.kind, ref=spec.ref, products=spec.products,
            tree=tree, source=self._source_for(spec), build=self.cfg.build_command,
            tests=self.cfg.tests_dir.as_posix() if not self.cfg.tests_dir.is_absolute()
            else os.path.relpath(self.cfg.tests_dir, self.home.root),
            options=spec.options)
        for stale in (self.home.jobs(self.priority), self.home.results(self.priority)):
            self._unlink(stale)
        atomic_write(path, start.format())
        return start

    def _source_for(self, spec: RunSpec) -> str:
        if spec.kind == "user":
            return f"users/{spec.ref}/{spec.tree}"
        return spec.tree  # the master's own clean tree of that product

    def _jobs(self, start: JobStart) -> JobFile:
        """The run's job list: the jobs file if it is there (takeover), else build.py's.

        build.py writes straight into the file (a million job lines are 200 MB or more: the
        master never holds them), which is then indexed (:class:`JobFile`).
        """
        path = self.home.jobs(self.priority)
        if not path.exists():
            argv = [sys.executable, str(BUILD_SCRIPT), *self.config_args,
                    "--home", str(self.home.root), *start.products,
                    *[o for o in start.options if o in BUILD_OPTIONS or o.startswith("filter=")]]
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                with open(tmp, "wb") as out:
                    done = subprocess.run(argv, stdout=out, stderr=subprocess.PIPE, text=True,
                                          check=False)
                    if done.returncode == 0:
                        out.flush()
                        os.fsync(out.fileno())
                if done.returncode != 0:
                    raise JobListError(f"build.py failed with status {done.returncode}: "
                                       f"{done.stderr.strip()}")
                if done.stderr.strip():
                    log.warning("build.py: %s", done.stderr.strip())
                os.replace(tmp, path)
            finally:
                self._unlink(tmp)
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
                atomic_write(self.home.status(self.priority),
                             f"run {state.run_id} - {state.status_line()}\n")
                next_tick = now + 1.0
            if now >= next_pid:
                next_pid = now + self.cfg.pid_check_interval
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
    def _finish(self, spec: RunSpec, start: JobStart, state: RunState, started: float) -> Path:
        """Collate, compare, report and archive the run; return its archive folder."""
        home = self.home
        run_id = state.run_id
        archive = home.archive / run_id
        archive.mkdir(parents=True, exist_ok=True)
        logs = home.run_dir(run_id) / "logs"
        if logs.is_dir():
            shutil.copytree(logs, archive / "logs", dirs_exist_ok=True)
        elapsed = self.clock.time() - started
        nodes = sum(1 for n in state.nodes.values() if n.results)
        if state.fatal:
            text = failure_report(spec, state, archive / "logs")
        else:
            # The table is made from the results' journal lines as it is read: a million
            # rows as objects would not fit the master's memory budget.
            current = state.results.table(run_id)
            run_tab = archive / f"{run_id}.tab"
            tab.write_tab_lines(run_tab, current.lines())
            stream = self._stream_table(spec)
            previous = tab.read_tab(stream) if stream.exists() else None
            facts = report.RunFacts(tests=len(current), seconds=elapsed, nodes=nodes,
                                    lost_nodes=tuple(state.lost), duplicates=state.duplicates,
                                    header=run_header(spec, run_id))
            text = report.compare(current, previous, facts, skip_missing=spec.kind == "user")
            self._update_stream(stream, previous, current, spec.products, run_tab)
        atomic_write(archive / "report.txt", text)
        atomic_write(archive / "run.info", start.format() + f"elapsed {elapsed:.1f}\n")
        return archive

    def _abandon(self, spec: RunSpec, start: JobStart, reason: str) -> RunOutcome:
        """End a run that cannot start: a report saying why, then dequeue it."""
        archive = self.home.archive / start.id
        archive.mkdir(parents=True, exist_ok=True)
        atomic_write(archive / "report.txt", "\n".join([
            run_header(spec, start.id), "",
            "The run could not start: its job list could not be made.", f"  {reason}", ""]))
        atomic_write(archive / "run.info", start.format())
        self.queue.remove(spec)
        for path in (self.home.job_start(self.priority), self.home.jobs(self.priority),
                     self.home.results(self.priority)):
            self._unlink(path)
        return RunOutcome(start.id, archive, failed=reason)

    def _stream_table(self, spec: RunSpec) -> Path:
        """The table a run is compared with: the user's previous push, or the baseline."""
        if spec.kind == "user":
            return self.home.tables / f"user-{spec.ref}.tab"
        return self.home.tables / "current.tab"

    def _update_stream(self, stream: Path, previous: tab.Table | None,
                       current: Mapping[str, tab.TabRow], products: tuple[str, ...],
                       run_tab: Path) -> None:
        """Merge the run into its stream's table (tab.merge_baseline), streaming the lines.

        With no previous table the merge is the run's own table: its file is copied.
        """
        stream.parent.mkdir(parents=True, exist_ok=True)
        if stream.name == "current.tab" and stream.exists():
            # Baselines rotate: current -> previous -> previous2 (ARTIFEX §2.8).
            prev = stream.with_name("previous.tab")
            if prev.exists():
                os.replace(prev, stream.with_name("previous2.tab"))
            shutil.copy2(stream, prev)
        if previous:
            tab.write_tab_lines(stream, tab.merged_lines(previous, current, products))
        else:
            with open(run_tab, encoding="utf-8") as fh:
                tab.write_tab_lines(stream, (line.rstrip("\n") for line in fh))

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def run_header(spec: RunSpec, run_id: str) -> str:
    if spec.kind == "user":
        return (f"User regression: user {spec.ref} products {','.join(spec.products)} "
                f"options {' '.join(spec.options) or '-'} run {run_id}")
    return f"Regression {spec.kind} {spec.ref} products {','.join(spec.products)} run {run_id}"


def failure_report(spec: RunSpec, state: RunState, logs: Path, tail: int = 100) -> str:
    """The report of a run that a node's fatal failure stopped (build failure)."""
    lines = [run_header(spec, state.run_id), "",
             "An error occurred that prevented the local cluster run from finishing:",
             f"  {state.fatal}", ""]
    for path in sorted(logs.glob("*")) if logs.is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
        lines.append(f"---- last {min(tail, len(text))} lines of {path.name} ----")
        lines.extend(text[-tail:])
        lines.append("")
    return "\n".join(lines) + "\n"
