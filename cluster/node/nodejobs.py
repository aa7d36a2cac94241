"""A node's JOBS: the jobs the master handed it run in its slots, and their results read.

Jobs go into a local queue and run in ``slots`` persistent slot shells
(:mod:`cluster.node.slots`); one running longer than ``job_timeout`` seconds (or its own,
shorter timeout from the master: docs/results.md, "Timeouts that fit each test") is killed as
a whole tree (SIGHUP, then SIGKILL).  A node running as root with ``job_user`` set runs them
as that account (:mod:`cluster.node.jobuser`), and every process of the account is killed
at the end of the run.  The node reads what a job wrote never through a link
(:mod:`cluster.node.jobfiles`), as it may be root.

Placeholders in job commands (:mod:`cluster.records`): ``__temp__`` (each job's own
folder, :mod:`cluster.node.jobdirs`; a sweep run's temp folder), ``__bin__``,
``__tests__``, ``__tree__`` (the run's build folder: a sweep's folder), ``__baseline__``
(the baseline build's binaries; left as is without a baseline, so a job using it fails
visibly) and ``__python__`` (this interpreter, quoted; the slot shells get the project on
``PYTHONPATH`` so ``__python__ -m cluster.bmpcmp`` imports from any directory, installed or
not).  Their values come from the build (:class:`cluster.node.nodebuild.NodeBuild`).

Results are classified as they finish (readlog rules) and wait in :attr:`NodeJobs.unsent`
for the next call (:mod:`cluster.node.mastercontact`).  In a sweep run (job.start has
``max_result_bytes``) each task's result files are read when it ends and kept in the run's
outbox (:mod:`cluster.node.sweepresults`); its result line's md5 is that of its results.

A job the master withdraws (``withdraw`` in a reply: another node's copy of it gave its
result first; docs/results.md, "Withdrawn copies") is dropped from the queue or killed in
its slot at once, sends no result, and its slot takes the next job (:meth:`NodeJobs.withdraw`).

A job that says nothing of its test, only that this node cannot run it (its program could
not be started, an input is missing from the node's corpus, a binary its build lacks),
fails the node (:class:`CannotRunJobs`): failure 1, and its jobs go to the other nodes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from cluster.bmpcmp import SET_FILE
from cluster.defaults import BMPCMP_DIR, FAILURE_NETWORK, FAILURE_TIMEOUTS
from cluster.errors import ClusterError
from cluster.node import jobdirs, jobuser, readlog, sweepresults
from cluster.node.jobfiles import md5_and_remove, read_and_remove
from cluster.node.nodebuild import NodeBuild
from cluster.node.runcontext import SLOT_HOMES, STOP_SIGNALS, RunContext
from cluster.node.slots import Finished, SlotPool, with_size_limit
from cluster.records import BIN, ERROR_NONE, ERROR_READ, TEMP, Job, JobResult
from cluster.runtime import fsutil

log = logging.getLogger("cluster.node")

#: Signals that stop a whole process tree from outside (a batch system's scancel or time
#: limit signals every process of its job; SIGKILL comes ``KillWait`` later): a job ended by
#: one of them, not by this node's hand, may be the first sign of the node's own stop.
OUTSIDE_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGKILL)
#: How long the end of such a job waits for the node's own stop signal before it counts as
#: a result [seconds].  The signals of one stop reach every process of the tree in one
#: sweep, the node's jobs first as often as not: the node's follows within milliseconds.
STOP_SETTLE = 1.0
#: How often that wait looks at the stop flag [seconds].
STOP_SETTLE_POLL = 0.05
#: What a job writes in the temp folder beside its name: its log, the md5sum output of its
#: raster, and (product shell) its raw output, whose md5 is its result.
JOB_LOG, JOB_MD5, JOB_OUT = ".log", ".md5", ".out"
#: How the command of a job of product shell starts (:func:`cluster.jobs.commands.
#: shell_command`: its log's label line): such a job runs under ``ulimit -f`` of
#: ``max_output_bytes``, and its output file is hashed by the node only within that bound.
SHELL_JOB_START = f"echo {readlog.SHELL_PRODUCT} > {TEMP}/"
#: Exit statuses of a shell or of /usr/bin/time that mean the command could not be run at
#: all (126: found but not executable; 127: not found, or its loader failed): never a test
#: result.
CANNOT_RUN_STATUSES = (126, 127)
#: What a job's log says when its program could not be started (GNU time, then sh).
CANNOT_RUN = re.compile(r"^(?:\S*time: cannot run .*|Command exited with non-zero status "
                        r"12[67]|(?:\S*/)?(?:ba|da)?sh: (?:line )?\d+: \S+: "
                        r"(?:command )?not found)$", re.M)
#: The binaries a job line names in the node's build (``__bin__/<name>``).
BIN_NAME = re.compile(re.escape(BIN) + r"/([A-Za-z0-9_.+-]+)")


def cut_from_outside(done: Finished) -> bool:
    """Whether the job ``done`` ended the way a stop signal sent to the node's whole process
    tree ends one, not by this node's hand: its slot's shell died (no exit status), or its
    status is 128 + one of :data:`OUTSIDE_STOP_SIGNALS`."""
    if done.killed:
        return False
    status = done.exit_status
    return status is None or status - 128 in OUTSIDE_STOP_SIGNALS


class CannotRunJobs(ClusterError):
    """This node cannot run the run's jobs (its build lacks the product's binary, its corpus
    lacks a test's input, a job's program could not be started): the node is at fault, not
    the test, so it reports failure 1 and no result of it reaches the table."""


@dataclass
class Counters:
    started: int = 0
    finished: int = 0
    timeouts: int = 0


class NodeJobs:
    """The run's jobs in ``pool``, with the binaries and placeholders of ``build``."""

    def __init__(self, ctx: RunContext, pool: SlotPool, build: NodeBuild) -> None:
        self.ctx = ctx
        self.pool = pool
        self.build = build
        self.queue: collections.deque[Job] = collections.deque()
        #: Results not yet sent, and when the first of them came (monotonic).
        self.unsent: list[JobResult] = []
        self.first_unsent = 0.0
        self.counters = Counters()
        #: Set by :meth:`fail_cannot_run` (:class:`CannotRunJobs`): no result counts after.
        self.cannot_run = False
        #: A sweep run's sweep folder entries, linked into each task's folder (read when
        #: the first task is prepared).
        self.sweep_entries: list[tuple[Path, bool]] | None = None
        #: Jobs given back unrun by a preempted node (:meth:`give_back_waiting`).
        self.given_back: set[str] = set()

    # ------------------------------------------------------------------ starting jobs
    def spawn(self, now: float) -> None:
        """Start queued jobs in the free slots (none once the node failed)."""
        while self.queue and self.pool.free() and not self.ctx.status.failure:
            job = self.queue.popleft()
            command = self._command(job)
            if command is None:
                return  # the node cannot run it (fail_cannot_run), and it went back
            if not self.pool.start(job, command, now):
                self.queue.appendleft(job)  # a long command waits for an idle slot
                self.release(job)
                break
            self.counters.started += 1

    def _command(self, job: Job) -> str | None:
        """``job``'s command as its slot runs it (placeholders put in, its folder made),
        or None when this node cannot run it."""
        command = job.command
        if BIN in command and not self._bins_present(job):
            return None
        job_dirs = self.ctx.job_dirs
        if job_dirs is not None:
            try:
                folder = job_dirs.take(job)
            except OSError as exc:
                self.queue.appendleft(job)
                self.fail_cannot_run(f"cannot make a job folder in {job_dirs.root}: {exc}")
                return None
            command = command.replace(TEMP, folder)
        for placeholder, value in self.build.substitutions:
            command = command.replace(placeholder, value)
        if self.ctx.outbox is not None and not self._prepare_task(job):
            return None
        if job.command.startswith(SHELL_JOB_START):
            # Its output is hashed by the node: bounded as a sweep task's files are.
            command = with_size_limit(command, self.ctx.output_blocks)
        return command

    def _job_temp(self, job: Job) -> str:
        """What ``__temp__`` is in ``job``'s command: its own folder, or in a sweep run the
        run's temp folder."""
        if self.ctx.job_dirs is None:
            return str(self.ctx.temp)
        return self.ctx.job_dirs.folder(job)

    def release(self, job: Job) -> None:
        """``job``'s folder cleared and free for a later job (:mod:`cluster.node.jobdirs`);
        in a sweep run, what a start of its may have written beside its task folder goes."""
        if self.ctx.job_dirs is not None:
            self.ctx.job_dirs.release(job)
            return
        base = f"{self.ctx.temp}/{job.name}"
        for suffix in (JOB_LOG, JOB_MD5, JOB_OUT):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)

    def _prepare_task(self, job: Job) -> bool:
        """Make the folder of sweep task ``job`` with the sweep folder linked into it
        (:func:`cluster.node.sweepresults.prepare_task`); False when it cannot be made:
        then this node cannot run the run's jobs (:meth:`fail_cannot_run`) and ``job``
        goes back unrun."""
        ctx = self.ctx
        if self.sweep_entries is None:
            # The sweep folder's top-level entries, read once (the build has made it), its
            # files made read-only first.
            try:
                sweepresults.make_read_only(ctx.build_dir)
                self.sweep_entries = sweepresults.entries(ctx.build_dir)
            except OSError as exc:
                self.queue.appendleft(job)
                self.fail_cannot_run(f"cannot read the sweep folder {ctx.build_dir}: {exc}")
                return False
        try:
            sweepresults.prepare_task(ctx.temp / job.name, self.sweep_entries)
            if ctx.account is not None:
                jobuser.give_folder(ctx.temp / job.name, ctx.account)
        except OSError as exc:
            self.queue.appendleft(job)
            self.fail_cannot_run(f"cannot make the folder of task {job.name}: {exc}")
            return False
        return True

    def _bins_present(self, job: Job) -> bool:
        """Whether every ``__bin__/<name>`` of ``job`` is an executable file of this node's
        build; if not, the node fails (:meth:`fail_cannot_run`) and ``job`` goes back
        unrun."""
        checked = self.build.bins_checked
        for name in BIN_NAME.findall(job.command):
            if name in checked:
                continue
            path = self.build.bin_dir / name
            if not (path.is_file() and os.access(path, os.X_OK)):
                self.queue.appendleft(job)
                self.fail_cannot_run(f"{path} is missing or not executable (the build did "
                                     "not make it)")
                return False
            checked.add(name)
        return True

    def fail_cannot_run(self, why: str) -> None:
        """Fail this node (:class:`CannotRunJobs`): failure 1, its jobs stop and go back
        to the master's list, and its next call says so at once."""
        status = self.ctx.status
        if status.failure:
            return
        self.cannot_run = True
        status.failure = FAILURE_NETWORK
        status.failure_reason = f"cannot run jobs: {why}"
        log.error("node %s: %s; failing (its jobs go to other nodes)", self.ctx.name,
                  status.failure_reason)
        self.kill_all()
        status.next_contact = 0.0

    # ------------------------------------------------------------------ jobs ending
    def wait(self, timeout: float) -> None:
        """Wait until a job ends or ``timeout`` passes (jobs run), collecting what ended."""
        finished = self.pool.wait(timeout)
        self._take_back(self.pool.take_returned())
        if finished:
            # Refill the freed slots before reading the results: reading a result's files
            # costs more than the job itself when jobs are as small as ``echo 17 | md5sum``.
            self.spawn(self.ctx.clock.monotonic())
        for done in finished:
            self.finish(done)

    def withdraw(self, names: tuple[str, ...]) -> int:
        """Stop the jobs ``names`` the master withdrew: dropped from the queue, or killed
        in their slot at once (:meth:`SlotPool.withdraw`; one waiting in a shell's input
        as it starts); none sends a result, and the freed slots take the next jobs.  A
        name the node does not hold (its job ended, its result sent) is ignored.  Returns
        how many were stopped now."""
        wanted = set(names)
        queued = [job for job in self.queue if job.name in wanted]
        if queued:
            kept = [job for job in self.queue if job.name not in wanted]
            self.queue.clear()
            self.queue.extend(kept)
        now = self.ctx.clock.monotonic()
        stopped = self.pool.withdraw(wanted, now)
        for done in stopped:
            self.finish(done)
        self._take_back(self.pool.take_returned())
        for job in queued:
            self._note_withdrawn(job.name, "dropped from the queue")
        self.spawn(now)
        return len(queued) + len(stopped)

    def give_back_waiting(self) -> list[str]:
        """A preempted node's jobs waiting in a slot shell's input behind a running one:
        killed as they start (:meth:`SlotPool.doom_waiting`), no result sent, so the
        master hands them out again when the node leaves; their names."""
        names = self.pool.doom_waiting()
        self.given_back.update(names)
        return names

    def _note_withdrawn(self, name: str, how: str) -> None:
        why = ("given back: the node leaves for another run" if name in self.given_back
               else "withdrawn by the master (its result came from another node)")
        log.info("node %s: job %s %s: %s", self.ctx.name, name, why, how)
        self.ctx.node_log.write(f"node {self.ctx.name}: job {name} {why}: {how}\n")

    def _take_back(self, jobs: list[Job]) -> None:
        """Jobs a slot handed back unrun (its shell had to go first): first in line again,
        in their order, with anything a start of theirs may have written removed."""
        for job in reversed(jobs):
            self.release(job)
            self.queue.appendleft(job)
            self.counters.started -= 1

    def _stopping(self, done: Finished) -> bool:
        """Whether the node is being stopped.  A job :func:`cut_from_outside` may have been
        signalled a moment before this process (a batch system signals every process of
        its job, in no set order): then the node waits up to :data:`STOP_SETTLE` for its
        own stop signal before the job's end counts as a result (docs/provisioning.md; a
        pilot ended by its time limit reported its cut job as error 10)."""
        stop_flag, clock = self.ctx.stop_flag, self.ctx.clock
        if stop_flag.is_set() or not cut_from_outside(done):
            return stop_flag.is_set()
        deadline = clock.monotonic() + STOP_SETTLE
        while not stop_flag.is_set() and clock.monotonic() < deadline:
            clock.sleep(STOP_SETTLE_POLL)
        return stop_flag.is_set()

    def finish(self, done: Finished) -> None:
        """The job that ended as ``done``: its result read (:meth:`_collect`), its folder
        released whatever happened."""
        try:
            self._collect(done)
        finally:
            self.release(done.job)

    def _collect(self, done: Finished) -> None:
        """What the job that ended as ``done`` left in its folder (or, in a sweep run, the
        run's temp folder), read: its result added, or the node failed."""
        ctx, name = self.ctx, done.job.name
        if done.withdrawn:
            # Another node's copy gave its result first: nothing of this one is sent.
            self._note_withdrawn(name, "its process tree killed")
            if ctx.outbox is not None:
                sweepresults.clear_task(ctx.temp / name)
            return
        if self._stopping(done):
            # The node is being stopped, and the signal that stops it (a batch system's
            # scancel signals every process of the job) may have cut this job too, even
            # if its shell went on: its result says nothing sure of the test.  None is
            # sent: the job goes back with the node's leaving call.
            log.info("node %s: job %s ended by the node's own stop; given back", ctx.name,
                     name)
            return
        if ctx.outbox is not None:
            self._finish_task(done)  # a sweep task's job writes no log (jobs.sweepjobs)
            return
        log_text, md5_text, result = self._read_result(done)
        if ctx.job_dirs is not None and ctx.baseline_dir is not None:
            self._collect_bmpcmp(ctx.job_dirs.folder(done.job), name)  # a bmpcmp run
        ctx.node_log.write(readlog.log_entry(name, log_text, md5_text, done.killed))
        if result.error != ERROR_NONE and not self.cannot_run:
            fault = self._infrastructure_fault(done, log_text)
            if fault is not None:
                # Not a test result: withheld, and the node fails so that the job and the
                # others it holds are run by a node that can.
                self.fail_cannot_run(fault)
        if self.cannot_run:
            return  # this node cannot run jobs: no result of it after that counts
        self.counters.finished += 1
        self.add_result(result)

    def _read_result(self, done: Finished) -> tuple[str, str, JobResult]:
        """The log and md5 text of the job that ended as ``done``, read and removed from
        its folder, and its result: classified by readlog; an output over
        ``max_output_bytes`` is never hashed, and is an error."""
        name = done.job.name
        base = f"{self._job_temp(done.job)}/{name}"
        log_text = read_and_remove(base + JOB_LOG)
        md5_text = read_and_remove(base + JOB_MD5)
        limit = self.ctx.cfg.max_output_bytes
        digest, size = md5_and_remove(base + JOB_OUT, limit)
        shell = done.job.command.startswith(SHELL_JOB_START)
        over = size > limit or (shell and done.exit_status == sweepresults.XFSZ_STATUS)
        if over:
            # Stopped by its ulimit, or larger all the same: never hashed, never a result.
            log_text += (f"node {self.ctx.name}: {name}'s output is over max_output_bytes "
                         f"({limit} bytes): the job failed, its output not hashed\n")
        elif digest is not None:
            md5_text += f"{digest}  -\n"  # the job's raw output is its result (product shell)
        result = readlog.with_wall_time(
            readlog.classify(name, log_text, md5_text, done.killed, self.ctx.name,
                             done.exit_status), done.ended - done.started)
        if over and not done.killed:
            result = dataclasses.replace(result, error=ERROR_READ, md5="0")
        return log_text, md5_text, result

    def _infrastructure_fault(self, done: Finished, log_text: str) -> str | None:
        """Why the job that ended as ``done`` (its log ``log_text``) says nothing of the
        test, only that this node cannot run it, or None.  Its program could not be started
        (exit 126/127, GNU time's "cannot run", the shell's "not found"), or a test input
        named under this node's corpus is not there (its mirror of the master's corpus is
        incomplete)."""
        if done.killed or readlog.is_sweep_log(log_text):
            # A sweep task's command is the user's own: its "not found" or exit status 127
            # is the task's result on every node, not this node's fault.
            return None
        found = CANNOT_RUN.search(log_text)
        if found is not None or done.exit_status in CANNOT_RUN_STATUSES:
            what = found.group(0).strip()[:200] if found else f"exit status {done.exit_status}"
            return f"job {done.job.name} could not start its program: {what}"
        tests = f"{self.ctx.tests}/"
        if tests in log_text:
            for match in re.finditer(re.escape(tests) + r"[^\s'\"()<>;|&:]+", log_text):
                if not os.path.exists(match.group(0)):
                    return (f"job {done.job.name}: input {match.group(0)} is missing from "
                            "this node's corpus")
        return None

    def _collect_bmpcmp(self, folder: str, name: str) -> None:
        """The image sets bmpcmp job ``name`` left in ``bmpcmp/`` of its ``folder`` into
        the run's ``temp/bmpcmp/``, where UPLOAD takes them from, after the sets an
        earlier try of the same test left there are removed (as bmpcmp itself does in its
        output folder).  Its temporary files, links and anything else stay behind, for
        the folder's clearing."""
        source = os.path.join(folder, BMPCMP_DIR)
        if not os.path.isdir(source):
            return
        dest = self.ctx.temp / BMPCMP_DIR
        with contextlib.suppress(FileNotFoundError), os.scandir(dest) as listing:
            for entry in listing:
                m = SET_FILE.fullmatch(entry.name)
                if m and m.group("test") == name:
                    os.unlink(entry.path)
        jobdirs.move_files(source, dest, lambda entry: not fsutil.TEMP_NAME.fullmatch(entry))

    def _finish_task(self, done: Finished) -> None:
        """A sweep task's job ended: its results into the outbox
        (:mod:`cluster.node.sweepresults`), its result line from its exit status, its
        timeout and its results' md5; a task over ``max_result_bytes`` is an error 1.  Its
        job writes no log: readlog reads the label alone (the exit status and the node's
        kill decide)."""
        ctx = self.ctx
        assert ctx.outbox is not None
        name = done.job.name
        log_text = f"{readlog.SWEEP_PRODUCT}\n"
        # The slot's clock is this node's monotonic one: its start as an epoch time.
        started = ctx.clock.time() - (ctx.clock.monotonic() - done.started)
        # A task the node killed (its timeout) brings what it wrote so far, for reading.
        task = ctx.outbox.take(name, ctx.temp / name, ctx.start.sweep_results,
                               done.exit_status, started, max(done.ended - done.started, 0.0))
        md5_text = "" if task.failed else f"{task.md5}  -\n"
        result = readlog.classify(name, log_text, md5_text, done.killed, ctx.name,
                                  done.exit_status)
        if task.failed and result.error == ERROR_NONE:
            result = dataclasses.replace(result, error=ERROR_READ, md5="0")
        if task.failed:
            log_text += f"{task.failed}\n"
        ctx.node_log.write(readlog.log_entry(name, log_text, md5_text, done.killed))
        if self.cannot_run:
            ctx.outbox.discard_task(task)
            return
        self.counters.finished += 1
        self.add_result(result)

    def add_result(self, result: JobResult) -> None:
        """``result`` waits for the next call."""
        if not self.unsent:
            self.first_unsent = self.ctx.clock.monotonic()
        self.unsent.append(result)

    # ------------------------------------------------------------------ timeouts, the end
    def check_timeouts(self, now: float) -> None:
        """Kill the jobs past ``job_timeout``; past too many of them the node fails
        (failure 3: its next call says so at once)."""
        self.counters.timeouts += self.pool.check_timeouts(now)
        status = self.ctx.status
        if self._too_many_timeouts() and not status.failure:
            status.failure = FAILURE_TIMEOUTS
            status.failure_reason = f"{self.counters.timeouts} tests timed out"
            log.error("node %s: %s; failing", self.ctx.name, status.failure_reason)
            self.queue.clear()
            self.kill_all()
            status.next_contact = 0.0

    def timeout_limit(self) -> int:
        """How many timeouts fail the node (``max_timeouts``, or 1% of the jobs started)."""
        return max(self.ctx.cfg.max_timeouts, math.ceil(self.counters.started / 100))

    def _too_many_timeouts(self) -> bool:
        # A sweep task's timeout is its own outcome (the sweep's ``timeout``), not a sign
        # that this node is sick: it never fails the node.
        return self.ctx.outbox is None and self.counters.timeouts > self.timeout_limit()

    def kill_all(self) -> None:
        """Every job killed, the queue emptied, every job folder free."""
        self.pool.kill_all()
        self.queue.clear()
        if self.ctx.job_dirs is not None:
            self.ctx.job_dirs.release_all()  # none of them runs any more

    def end(self) -> None:
        """Remove the job folders; as the job account, first kill every process of it
        left (a job's background child, a ``setsid``), then remove what it scheduled (its
        crontab and at jobs: :func:`cluster.node.jobuser.remove_schedules`) and the slots'
        folders.  As the node's own account, the slots' sessions, killed with the pool,
        were all its processes, and what a job scheduled is the node's own account's."""
        ctx = self.ctx
        if ctx.account is not None:
            killed = jobuser.kill_leftovers(ctx.account)
            said = []
            if killed:
                said.append(f"killed {killed} process(es) of {ctx.account.name} left by "
                            "the run's jobs")
            said += jobuser.remove_schedules(ctx.account)
            for line in said:
                log.warning("node %s: %s", ctx.name, line)
                with contextlib.suppress(OSError, ValueError):
                    ctx.node_log.write(f"node {ctx.name}: {line}\n")
            jobuser.remove_folder(ctx.run_dir / SLOT_HOMES)
        if ctx.job_dirs is not None:
            ctx.job_dirs.close()
