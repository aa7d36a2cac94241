"""The end of a run, step by step, each step once (:mod:`cluster.master.files.ending`).

:meth:`RunEnder.end` takes a run's end record and does the steps it has not done yet:

* ``sweep``: a sweep run's task folders, ``results.tsv`` and collected files into
  ``archive/<id>/`` (:func:`cluster.master.end.sweepend.end_sweep`; nothing for other runs
  and for a run that could not start);
* ``report``: the node logs, the run's ``.tab``, ``report.txt``, ``run.info`` and the
  compressed job list ``jobs.gz`` (:mod:`cluster.master.files.reprokeep`) into
  ``archive/<id>/``, and the stream's new tables staged in ``runs/<id>/tables``
  (:func:`cluster.master.end.finish.finish`).  The report counts the whole run: every node that
  sent a result and the time of every master that served it.  ``run.info`` is the run's
  job.start (no secret) and the lines ``elapsed <s>``, ``outcome <outcome>``, ``nodes <n>``
  (machines that sent results), and, when the report states them, ``differences <d>`` and
  ``errors <e>`` (:class:`cluster.master.end.finish.Report`): what the console lists of recent
  runs without reading their tables; a run with a ``name=`` is recorded as the latest
  ended run of that name (``names/<name>``, :func:`cluster.deps.record_end`);
* ``tables``: the staged tables replace the old ones (the baseline rotates once);
* ``cache``: the "seen before" cache is rebuilt after a baseline run;
* ``mail``: the report is mailed (not for a run queued again);
* ``culprit``: a commit run with confirmed differences and untested commits before it
  starts a culprit search, and a bisection run's results narrow its search
  (:mod:`cluster.master.end.culprit`; docs/results.md, "Finding the culprit commit");
* ``tree``: a commit run's exported tree becomes the master's clean tree;
* ``dequeue``: the queue line leaves the queue, or stays for another attempt;

A run outside the stream (:func:`cluster.runspec.outside_stream`: a bisection run, queue
option ``culprit=``, or a repro run, ``repro=``) skips ``tables``, ``cache``, ``mail`` and
``tree``: it never becomes the stream's baseline nor the clean tree; only a search's
follow-up report is mailed, and a repro run's report is read by the clusteradmin that
queued it.  Then a user run's source snapshot is moved to
``archive/<id>/source/`` (a rename; for ``clusteradmin repro``) and the run's files (job
list, journal, its folder and the record) are removed (a run that left its queue unstarted,
``queue-timeout``, has only its folder: the job list and journal are those of the run being
served meanwhile).  The
master that served the run calls it with the run's state in hand; a successor that finds
the record calls it without, and the state is rebuilt from the job list and the journal
only if the report still has to be made.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster import datatypes, deps, lanes
from cluster.config import Config
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.cache import reuse
from cluster.master.cache.resultcache import FileDigests, ResultCache
from cluster.master.end import culprit, finish, streamtables, sweepend
from cluster.master.files import abort, ending, journal, reprokeep
from cluster.master.files.attempts import Attempts
from cluster.master.files.ending import EndRecord, Outcome
from cluster.master.model.joblist import JobFile
from cluster.master.state.livestatus import remove_if_run
from cluster.master.state.runcore import Settings
from cluster.master.state.runstate import RunState
from cluster.queue import QueueFile
from cluster.report import cifiles, mail
from cluster.report.ciresult import incomplete_result
from cluster.report.slowdowns import SlowdownRule
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock
from cluster.triggers.git.info import commit_info
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: Folder of a run's staged stream tables, inside its run folder.
STAGE_DIR = "tables"


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: its id, its archive, and whether it failed (and why)."""

    run_id: str
    archive: Path | None
    replaced: bool = False
    failed: str = ""
    outcome: Outcome | None = None


def write_status(path: Path, line: str) -> None:
    """Replace the status file (what the dashboard shows) with ``line``.

    Atomic, so a reader never sees half a line, but not fsync'ed: it is rewritten every
    second and harmless to lose in a crash (fsutil's contract for status lines).
    """
    fsutil.atomic_write(path, line + "\n", fsync=False)


class RunEnder:
    """Ends the runs of one lane (cluster.lanes: a priority's own lane is its number).
    Callers use :meth:`end`."""

    def __init__(self, cfg: Config, home: Home, lane: int, queue: QueueFile,
                 clock: Clock) -> None:
        self.cfg = cfg
        self.home = home
        self.lane = lane
        self.priority = lanes.priority_of(lane)
        self.queue = queue
        self.clock = clock
        self.attempts = Attempts(home.per_priority("attempts", lane))

    def end(self, record: EndRecord, state: list[RunState] | None = None) -> RunOutcome:
        """Do the steps of ``record`` not yet done; return what became of the run.

        ``state``: a one-item list holding the run's state, if the caller has it; it is
        emptied once the report is made, so the state's memory (most of the master's, with a
        million jobs) is free for the cache rebuild.
        """
        home, start = self.home, record.start
        run_id = start.id
        spec = RunSpec.parse(start.queue, source=str(record.path))
        _unlink_if_run(home.job_start(self.lane), run_id)  # nodes now learn it is over
        remove_if_run(home.live(self.lane), run_id)  # no longer live (a killed master's)
        archive = home.archive / run_id
        outcome = record.outcome
        # A bisection or repro run is no part of the stream: no baseline, cache, mail or
        # clean tree (the one predicate: cluster.runspec.outside_stream).
        regular = not spec.outside_stream
        if not record.is_done(ending.SWEEP):
            if outcome.started:
                sweepend.end_sweep(home, start, spec)
            record.mark(ending.SWEEP)
        if not record.is_done(ending.REPORT):
            if not outcome.started:
                self._report(record, spec, None)  # it has no job list, and needs none
            else:
                held = state.pop() if state else self._load_state(start)
                try:
                    self._report(record, spec, held)
                finally:
                    held.jobs.close()
                    del held
            # Before the dequeue: a run's name is never neither queued nor ended (deps).
            deps.record_end(home, deps.run_name(spec), run_id, outcome.value)
            record.mark(ending.REPORT)
        if not record.is_done(ending.TABLES):
            if outcome.changes_tables and regular:
                moved = streamtables.install_tables(home.run_dir(run_id) / STAGE_DIR, home.tables)
                if moved:
                    log.info("run %s: tables %s installed", run_id, ", ".join(moved))
            record.mark(ending.TABLES)
        if not record.is_done(ending.CACHE):
            if (outcome.changes_tables and spec.kind in ending.BASELINE_KINDS
                    and spec.sweep_file is None and regular):
                finish.rebuild_cache(home)
            record.mark(ending.CACHE)
        if not record.is_done(ending.MAIL):
            if outcome is not Outcome.RETRY and regular:
                self._mail(spec, start, archive, record)
            record.mark(ending.MAIL)
        if not record.is_done(ending.CULPRIT):
            culprit.after_run(self.cfg, home, start, spec, outcome, record.reason)
            record.mark(ending.CULPRIT)
        if not record.is_done(ending.TREE):
            if outcome is not Outcome.RETRY and regular:
                self._adopt_clean_tree(spec, start)
            record.mark(ending.TREE)
        abort.clear(home, run_id)
        if not record.is_done(ending.DEQUEUE):
            self._dequeue(record, spec)
            record.mark(ending.DEQUEUE)
        if outcome is not Outcome.QUEUE_TIMEOUT:
            # A run that left its queue unstarted may end while another run is served:
            # the job list, journal and status line are that run's.
            for path in (home.jobs(self.lane), home.results(self.lane)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        if spec.kind == "user" and spec.sweep_file is None and outcome.started:
            # A rename: the snapshot's hard links kept.
            self._keep_for_repro(lambda: reprokeep.keep_source(home.root / start.source,
                                                               archive), run_id)
        shutil.rmtree(home.run_dir(run_id), ignore_errors=True)  # the record goes last
        if outcome is not Outcome.QUEUE_TIMEOUT:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.clock.time()))
            write_status(home.status(self.lane),
                         f"idle - last run {run_id} {outcome.value} {stamp} UTC")
        log.info("run %s: %s, archived in %s", run_id, outcome.value, archive)
        failed = "" if outcome is Outcome.DONE else (record.reason or outcome.value)
        return RunOutcome(run_id, archive, failed=failed, outcome=outcome)

    # ------------------------------------------------------------------ report
    def _load_state(self, start: JobStart) -> RunState:
        """The run's state from its job list and journal (a successor ending the run)."""
        path = self.home.jobs(self.lane)
        try:
            jobs = JobFile(path)
        except (OSError, ValueError) as exc:
            raise ClusterError(f"run {start.id}: cannot end it: its job list {path} is "
                               f"unreadable ({exc})") from None
        lines = journal.load_lines(self.home.results(self.lane), start.id) or []
        return RunState(start.id, jobs, self.clock.monotonic(), Settings.from_config(self.cfg),
                        done=lines)

    def _report(self, record: EndRecord, spec: RunSpec, state: RunState | None) -> None:
        """Write the archive: logs, the run's table, report.txt, run.info; stage tables."""
        home, start = self.home, record.start
        archive = home.archive / start.id
        archive.mkdir(parents=True, exist_ok=True)
        logs = home.run_dir(start.id) / "logs"
        if logs.is_dir():
            shutil.copytree(logs, archive / "logs", dirs_exist_ok=True)
        audit = home.audit_log(start.id)
        if audit.exists():  # every node connection and refusal (docs/protocol.md)
            fsutil.atomic_copy(audit, archive / audit.name)
        header = self._header(spec, start.id)
        if state is None:
            what = ("The run did not start" if record.outcome is Outcome.QUEUE_TIMEOUT
                    else "The run could not start")
            made = finish.Report("\n".join([header, "", f"{what}: {record.reason}.", ""]))
            nodes = 0
        else:
            made = finish.finish(home, finish.FinishedRun(
                spec=spec, start=start, state=state, elapsed=record.elapsed,
                archive=archive, header=header,
                stage=home.run_dir(start.id) / STAGE_DIR, outcome=record.outcome,
                reason=record.reason, lost_nodes=record.lost,
                indeterminate_keep=self.cfg.indeterminate_keep,
                slowdown=SlowdownRule(self.cfg.slowdown_factor, self.cfg.slowdown_min_seconds,
                                      self.cfg.slowdown_runs)))
            nodes = len(state.machines)
            self._keep_for_repro(lambda: reprokeep.keep_jobs(home.jobs(self.lane),
                                                             archive), start.id)
            if record.outcome is Outcome.DONE and reuse.stores(self.cfg, spec, start):
                self._store_results(start, state)
        fsutil.atomic_write(archive / "report.txt", made.text)
        ci = made.ci
        if ci is None and record.outcome is not Outcome.DONE:
            ci = incomplete_result(start.id, record.elapsed, f"{record.outcome.value}: "
                                   f"{record.reason}" if record.reason
                                   else record.outcome.value)
        if ci is not None:  # before run.info: a waiter takes run.info for the end
            cifiles.save(archive, ci)
        fsutil.atomic_write(archive / "run.info", run_info(
            start, record, nodes, made, state.reused if state is not None else None))

    @staticmethod
    def _keep_for_repro(keep: Callable[[], object], run_id: str) -> None:
        """What ``clusteradmin repro`` needs kept in the archive (:mod:`cluster.master.files.
        reprokeep`): best effort, never what stops a run's end (a full disk is logged; repro
        of that run then says what is missing)."""
        try:
            keep()
        except OSError as exc:
            log.warning("run %s: not kept for clusteradmin repro: %s", run_id, exc)

    def _store_results(self, start: JobStart, state: RunState) -> None:
        """A complete run's keyed results into the result cache (docs/results.md, "Results
        reused"), the oldest runs beyond ``result_cache_runs`` removed."""
        stored = reuse.store_run(
            ResultCache(self.home.result_cache, self.cfg.result_cache_runs),
            start.id, state.jobs, state.results, self.home.run_dir(start.id),
            FileDigests(self.home.root / start.tests))
        log.info("run %s: %d results stored in the result cache", start.id, stored)

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
        if spec.culprit is not None:
            search, step = spec.culprit
            header += (f"\nBisection run (step {step}) of the culprit search for run "
                       f"{search}: only the tests it searches; never the baseline, not "
                       "mailed (docs/results.md, \"Finding the culprit commit\")")
        lines = [header, "", f"commit {info.sha}", f"Author: {info.author}",
                 f"Date:   {info.date}", "", *("    " + line for line in
                                                 info.message.rstrip().splitlines()),
                 "", "Changed files:", *(f"  {path}" for path in info.changed_paths), "",
                 f"Products tested: {' '.join(spec.products)}"]
        return "\n".join(lines)

    def _repository(self, tree: str) -> bool:
        return tree in datatypes.parse_repositories(self.cfg.repositories)

    # ------------------------------------------------------------------ after the report
    def _mail(self, spec: RunSpec, start: JobStart, archive: Path, record: EndRecord) -> None:
        """Mail the report (when smtp_host is set); the outcome is noted in mail.log.

        The subject starts ``STOPPED:`` for a run an admin stopped (the report says who),
        ``NOT STARTED:`` for a run that waited past its ``queue_timeout``, ``FAILED:`` for
        any other run that did not complete."""
        if not self.cfg.smtp_host:
            return
        text = (archive / "report.txt").read_text(encoding="utf-8", errors="replace")
        if record.outcome is Outcome.DONE:
            prefix = ""
        elif record.outcome is Outcome.ABORTED and record.reason.startswith(abort.STOPPED_BY):
            prefix = "STOPPED: "
        elif record.outcome is Outcome.QUEUE_TIMEOUT:
            prefix = "NOT STARTED: "
        else:
            prefix = "FAILED: "
        subject = prefix + (
            f"bmpcmp finished {spec.line()}" if finish.is_bmpcmp(spec) else spec.line())
        try:
            mail.send_report(self.cfg, self.home, spec.kind, spec.ref, subject, text)
            note = f"mailed {subject!r}\n"
        except mail.MailError as exc:
            log.error("run %s: report not mailed: %s", start.id, exc)
            note = f"not mailed: {exc}\n"
        with open(archive / "mail.log", "a", encoding="utf-8") as fh:
            fh.write(note)

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
        fsutil.swap_dir(exported, clean)
        log.info("clean tree %s is now commit %s", clean, spec.ref)

    def _dequeue(self, record: EndRecord, spec: RunSpec) -> None:
        """Take the run's line off the queue, or leave it for another attempt."""
        line = spec.line()
        if record.outcome is Outcome.RETRY:
            tries = self.attempts.add(line, record.run_id)
            log.warning("run %s: %s; queued again (attempt %d of %d given up)", record.run_id,
                        record.reason, tries, self.cfg.max_tries)
            return
        self.queue.remove(spec)
        self.attempts.clear(line)


def run_info(start: JobStart, record: EndRecord, nodes: int, made: finish.Report,
             reused: int | None = None) -> str:
    """The text of ``archive/<id>/run.info``: job.start without its secret, then ``elapsed``,
    ``outcome``, ``reason`` (why a run that is not done ended so, on one line; only when
    there is one), ``nodes``, ``reused`` (results taken from the result cache,
    docs/results.md, "Results reused"; for a run that had jobs) and the report's
    ``differences``, ``errors`` and ``indeterminate`` (each only when the report states it).
    JobStart.parse reads it (it skips keys it does not know)."""
    lines = [f"elapsed {record.elapsed:.1f}", f"outcome {record.outcome.value}"]
    reason = " ".join(record.reason.split())
    if reason:
        lines.append(f"reason {reason}")
    lines.append(f"nodes {nodes}")
    if reused is not None:
        lines.append(f"reused {reused}")
    if made.differences is not None:
        lines.append(f"differences {made.differences}")
    if made.errors is not None:
        lines.append(f"errors {made.errors}")
    if made.indeterminate is not None:
        lines.append(f"indeterminate {made.indeterminate}")
    return start.format() + "\n".join(lines) + "\n"


def _unlink_if_run(path: Path, run_id: str) -> None:
    """Remove job.start if it is ``run_id``'s (never a later run's)."""
    try:
        current = JobStart.parse(path.read_text(encoding="utf-8")).id
    except FileNotFoundError:
        return
    except ValueError:
        current = run_id  # unreadable: it cannot describe a later run the nodes could join
    if current == run_id:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def exported_source(start: JobStart) -> bool:
    """Whether the run builds a commit the master exported."""
    return start.kind == "git" and start.source.startswith("runs/")


def run_header(spec: RunSpec, run_id: str) -> str:
    if spec.sweep_file is not None:
        others = [o for o in spec.options if not o.startswith("sweep=")]
        return (f"Sweep: {spec.kind} {spec.ref} sweep file {spec.sweep_file} options "
                f"{' '.join(others) or '-'} run {run_id}")
    if spec.kind == "user":
        return (f"User regression: user {spec.ref} products {','.join(spec.products)} "
                f"options {' '.join(spec.options) or '-'} run {run_id}")
    return f"Regression {spec.kind} {spec.ref} products {','.join(spec.products)} run {run_id}"
