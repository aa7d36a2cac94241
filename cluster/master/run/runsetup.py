"""runsetup: a run set up before it is served -- its job.start, its source, its job list.

A clustermaster (:mod:`cluster.master.run.clustermaster`) that serves the run at the head of
its queue first has :class:`RunSetup` put the run in place: job.start reused when it
describes that queue line (a takeover), else a new run id and the run's source made ready
(a commit exported, a pushed tree or an auto sweep's folder snapshotted, a bmpcmp run's
test list taken from the user's last run, a bisection run's from its culprit search, a
repro run's user snapshot linked from its archived run) before job.start is written; then
the job list, the jobs file if it is there (a takeover), else build.py's (a repro run's:
its archived job line as it is, :meth:`RunSetup.repro_jobs`).  Each step leaves the home
as a killed master would: the next master redoes what is missing and nothing twice.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from cluster import datatypes, lanes
from cluster.config import Config
from cluster.defaults import REPO_ROOT
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.jobs import ranks as jobranks
from cluster.jobs.generate import required_programs
from cluster.jobs.sweepjobs import node_job_timeout
from cluster.master.end import culprit, finish
from cluster.master.end.endrun import exported_source
from cluster.master.files import codelock, nodefiles, reprokeep
from cluster.master.model import joborder, jobtimeouts, placement, runlimits
from cluster.master.model.joblist import JobFile
from cluster.node import buildcmd
from cluster.queue import QueueFile
from cluster.runspec import SWEEP, RunSpec
from cluster.runtime import forkrun, fsutil, proc
from cluster.runtime.clock import Clock
from cluster.sweep import spec as sweepspec
from cluster.triggers import auto, push
from cluster.triggers.git.export import export_commit
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

BUILD_SCRIPT = REPO_ROOT / "build.py"
#: job.start's permission bits: the owner's (it names the run's source and build command).
JOB_START_MODE = 0o600
#: build.py understands these queue options; the rest are for the node or the report.
BUILD_OPTIONS = ("lowres", "highres")
#: job.start's ``build`` of a sweep run: nothing to build (a sweep folder's own
#: ``cluster-build`` script still overrides it, cluster.node.buildcmd).
SWEEP_BUILD = "true"


def new_run_id(priority: int, clock: Clock) -> str:
    """A job id as seed 001 suggests (the start time), made unique across priorities."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(clock.time()))
    return f"{stamp}-p{priority}-{secrets.token_hex(2)}"


def _auto_sweep(spec: RunSpec) -> bool:
    """Whether ``spec`` is a nightly or weekly sweep (``sweep <folder>`` in its jobdef)."""
    return spec.kind == "auto" and spec.sweep_file is not None


def write_job_start(path: Path, start: JobStart) -> None:
    """Write ``start`` as job.start, readable by its owner only (0600).  It holds no
    secret: each node signs with its own key (:mod:`cluster.nodekeys`)."""
    fsutil.atomic_write(path, start.format(), mode=JOB_START_MODE)
    os.chmod(path, JOB_START_MODE)  # atomic_write keeps an older file's bits otherwise


class JobListError(ClusterError):
    """build.py could not make the run's job list."""


class NotNow(ClusterError):
    """A run cannot start at this invocation, but may at the next (a push is syncing its
    tree, or the queue's head changed); nothing was written."""


class RunSetupError(ClusterError):
    """A run's source could not be put in place; ``start`` is its (unwritten) job.start."""

    def __init__(self, start: JobStart, problem: str) -> None:
        super().__init__(problem)
        self.start = start


class RunSetup:
    """How the runs of one priority's queue are set up: :meth:`job_start` (the run's id and
    source), :meth:`jobs` (its job list), :meth:`sweep` (a sweep run's sweep file)."""

    def __init__(self, cfg: Config, home: Home, lane: int, queue: QueueFile, clock: Clock,
                 config_args: list[str], job_list_main: forkrun.Main | None = None) -> None:
        self.cfg, self.home, self.queue = cfg, home, queue
        #: The lane whose files and port the run gets, and the priority of its queue.
        self.lane, self.priority = lane, lanes.priority_of(lane)
        self.clock = clock
        #: build.py's extra arguments: the master's own configuration (--config, --set).
        self.config_args = config_args
        #: build.py's main, run in a fork (:mod:`cluster.runtime.forkrun`); without it,
        #: build.py is run as a program of its own.
        self.job_list_main = job_list_main

    def sweep(self, spec: RunSpec, start: JobStart) -> sweepspec.SweepSpec | None:
        """A sweep run's sweep file in the run's snapshot: its results, checks and retries
        (None: not a sweep run).  ClusterError when it cannot be read."""
        if spec.sweep_file is None:
            return None
        return sweepspec.load(self.home.root / start.source / spec.sweep_file)

    def job_start(self, spec: RunSpec) -> JobStart:
        """Reuse job.start if it describes this queue line (takeover), else write a new one.

        Before job.start is written the run's source is in place: a commit run's tree is
        exported at its commit, a bmpcmp run's test list is taken from the user's last run.
        RunSetupError (carrying the unwritten JobStart) when that cannot be done.
        """
        path = self.home.job_start(self.lane)
        try:
            old = JobStart.parse(path.read_text(encoding="utf-8"))
            if old.queue == spec.line():
                self.prepare_source(spec, old)  # a takeover: redo what may be missing
                if old.secret:
                    # Written by a master that gave each run a shared secret: nodes sign
                    # with their own keys now, so the run keeps its id and loses the line.
                    old = dataclasses.replace(old, secret="")
                    write_job_start(path, old)
                return old
        except FileNotFoundError:
            pass
        except ValueError as exc:
            log.warning("%s is unreadable (%s); starting the run afresh", path, exc)
        run_id = new_run_id(self.priority, self.clock)
        start = self.new_start(spec, run_id)
        for stale in (self.home.jobs(self.lane), self.home.results(self.lane)):
            stale.unlink(missing_ok=True)

        def publish() -> None:
            nonlocal start
            # A push may have replaced the waiting line since it was chosen: running the
            # old line now would run it twice (the new one stays queued).
            if spec not in self.queue.read():
                raise NotNow(f"{spec.line()} left {self.queue.path.name} while run "
                             f"{run_id} was set up")
            start = self.sweep_limits(spec, start)  # the sweep file is in place now
            start = runlimits.with_task_timeout(start, runlimits.run_options(spec, self.cfg))
            write_job_start(path, start)

        # The nodes fetch the node code when they see job.start: the one this tick's
        # supervisor publishes, not the one before it (cluster.master.files.codelock).  Waited for
        # here, before the source is set up: a user run's job.start is written under the
        # pushed tree's lock, which the user's next push waits for.
        if not codelock.wait_for_publish(self.home.node_code_lock):
            log.warning("run %s: the node code's publish still holds %s after %.0f s; "
                        "announcing the run with what is published", run_id,
                        self.home.node_code_lock, codelock.WAIT_LIMIT)
        try:
            self.prepare_source(spec, start, publish)
        except NotNow:
            shutil.rmtree(self.home.run_dir(run_id), ignore_errors=True)
            raise
        return start

    def new_start(self, spec: RunSpec, run_id: str) -> JobStart:
        """The job.start of a new run ``run_id`` of queue line ``spec``, before its sweep
        limits and task timeout are known (they are once its source is in place)."""
        # The programs the run's jobs call (``__bin__/<name>``): the build's make targets,
        # and job.start's ``programs`` each node checks after its build.
        programs = tuple(required_programs(self.cfg, spec.products))
        return JobStart(
            id=run_id, priority=self.priority,
            lane_number=self.lane if self.lane != self.priority else -1,
            queue=spec.line(), kind=spec.kind, ref=spec.ref, products=spec.products,
            tree=spec.tree, source=self.source_for(spec, run_id),
            # A sweep folder needs no build unless it brings its own (cluster-build).
            build=SWEEP_BUILD if spec.sweep_file is not None else self.cfg.build_command,
            build_ghostpdl=self.cfg.build_ghostpdl.replace(
                buildcmd.TARGETS, buildcmd.ghostpdl_targets(programs)),
            build_mupdf=self.cfg.build_mupdf,
            tests=self.cfg.tests_dir.as_posix() if not self.cfg.tests_dir.is_absolute()
            else os.path.relpath(self.cfg.tests_dir, self.home.root),
            options=spec.options,
            baseline=spec.tree if finish.is_bmpcmp(spec) else "",
            programs=programs)

    def sweep_limits(self, spec: RunSpec, start: JobStart) -> JobStart:
        """A sweep run's ``start`` with ``max_result_bytes`` (master.conf), the nodes'
        ``job_timeout`` (the sweep's ``timeout`` in the run's snapshot of the folder:
        :func:`cluster.jobs.sweepjobs.node_job_timeout`) and ``sweep_results`` (its
        ``[results]``, which the nodes take from each task's folder); other runs'
        unchanged.  A sweep file that cannot be read leaves the nodes their own
        job_timeout (build.py then refuses it, naming the key)."""
        if spec.sweep_file is None:
            return start
        try:
            sweep = sweepspec.load(self.home.root / start.source / spec.sweep_file)
        except ClusterError:
            return dataclasses.replace(start, max_result_bytes=self.cfg.max_result_bytes)
        return dataclasses.replace(
            start, max_result_bytes=self.cfg.max_result_bytes,
            job_timeout=node_job_timeout(sweep.timeout),
            sweep_results=tuple((r.name, r.source) for r in sweep.results))

    def source_for(self, spec: RunSpec, run_id: str) -> str:
        """The tree the nodes build, relative to the home."""
        if spec.kind == "user" or _auto_sweep(spec):
            # A snapshot of the pushed tree (or of an auto sweep's folder), taken when the
            # run starts: a later push of the same tree (which waits its turn) cannot
            # change what this run builds and reports.
            return f"runs/{run_id}/source/{spec.tree}"
        if spec.kind == "git" and self.repository(spec.tree):
            return f"runs/{run_id}/source/{spec.tree}"  # the commit, exported
        return spec.tree  # the master's own clean tree of that product

    def repository(self, tree: str) -> bool:
        """Whether the master keeps a git clone of ``tree`` (commit runs export from it)."""
        return tree in datatypes.parse_repositories(self.cfg.repositories)

    def prepare_source(self, spec: RunSpec, start: JobStart,
                        publish: Callable[[], None] | None = None) -> None:
        """Write a bmpcmp run's test list; export a commit run's tree or snapshot a user
        run's; check the baseline; then ``publish`` (write job.start), if given.

        A user run's job.start is written while the pushed tree's lock is still held, so
        a push syncing just after the snapshot is queued as a run of its own, never merged
        into this one (:func:`cluster.triggers.push.snapshot_push`).  NotNow when the tree
        stays busy or the queue's head changed meanwhile: the next invocation tries again.
        """
        run_dir = self.home.run_dir(start.id)
        try:
            self.bmpcmp_listing(spec, start, run_dir)
            self.culprit_listing(spec, run_dir)
            dest = self.home.root / start.source
            if exported_source(start):
                if not dest.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    export_commit(self.home, self.cfg, spec.tree, spec.ref, dest)
            elif spec.kind == "user" and spec.repro is not None:
                if not dest.is_dir():
                    self.repro_source(spec, dest)
            elif spec.kind == "user":
                if not dest.is_dir():
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    push.snapshot_push(self.home, spec.ref, spec.tree, dest, then=publish)
                    publish = None  # done under the tree's lock
            elif _auto_sweep(spec):
                if not dest.is_dir():
                    auto.snapshot_sweep(self.home, spec, dest)  # the folder its jobdef names
            elif not dest.is_dir():
                raise ClusterError(f"the master has no tree {start.source!r} to build "
                                   f"(expected {dest})")
        except push.TreeBusy as exc:
            raise NotNow(f"the pushed tree is busy ({exc})") from None
        except NotNow:
            raise
        except ClusterError as exc:
            raise RunSetupError(start, str(exc)) from None
        if publish is not None:
            publish()

    def repro_source(self, spec: RunSpec, dest: Path) -> None:
        """A repro run of a user run: the archived run's snapshot (``archive/<run>/source/
        <tree>``, kept by its end) linked to ``dest`` (files hard links; a half copy is
        never under ``dest``'s name).  ClusterError when the archive kept none."""
        assert spec.repro is not None
        run = spec.repro[0]
        kept = reprokeep.kept_source(self.home.archive / run, spec.tree)
        if kept is None:
            raise ClusterError(f"repro run {spec.line()}: run {run} kept no source snapshot "
                               f"({self.home.archive / run / reprokeep.SOURCE_DIR / spec.tree})")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.",
                                    suffix=fsutil.TEMP_SUFFIX))
        try:
            push.link_tree(kept, tmp)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def repro_jobs(self, spec: RunSpec, out: TextIO) -> None:
        """A repro run's job list: its test's line of the archived run's ``jobs.gz`` as it
        is, its own timeout included (not build.py's line for today's corpus and
        configuration, nor today's timeout fit).  JobListError when it is not there."""
        assert spec.repro is not None
        run, test = spec.repro
        try:
            line = reprokeep.job_line(self.home.archive / run, test)
        except (OSError, EOFError) as exc:
            raise JobListError(f"repro run: run {run}'s {reprokeep.JOBS_NAME} does not "
                               f"read: {exc}") from None
        if line is None:
            raise JobListError(f"repro run: run {run}'s {reprokeep.JOBS_NAME} has no line "
                               f"of test {test}")
        out.write(line + "\n")

    def bmpcmp_listing(self, spec: RunSpec, start: JobStart, run_dir: Path) -> None:
        """A bmpcmp run's tests: the user's last run's changed list (ClusterError if none)."""
        if not finish.is_bmpcmp(spec):
            return
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

    def culprit_listing(self, spec: RunSpec, run_dir: Path) -> None:
        """A bisection run's tests (docs/results.md, "Finding the culprit commit"): its
        step's in its search's record, one a line, for build.py's ``--only``
        (ClusterError when the search or the step is gone)."""
        if spec.culprit is None:
            return
        listing = run_dir / culprit.TESTS_FILE
        if not listing.exists():
            tests = culprit.step_tests(self.home, spec)
            run_dir.mkdir(parents=True, exist_ok=True)
            fsutil.atomic_write(listing, "".join(t + "\n" for t in tests))

    def every_node(self, policy: placement.RunPolicy) -> list[str] | None:
        """The nodes an every_node run's jobs are made for: up (heard from within
        ``heartbeat_timeout``), enabled and placed now (None: not an every_node run)."""
        if not policy.every_node:
            return None
        up = placement.nodes_up(self.home, self.cfg.heartbeat_timeout, self.clock.time(),
                                nodefiles.disabled_nodes(self.home))
        chosen = [n for n in up if policy.placement.may_take(n, policy.groups)]
        log.info("every_node: one copy of each job for each of %d nodes: %s", len(chosen),
                 ", ".join(chosen) or "none")
        return chosen

    def jobs(self, start: JobStart, every_node: list[str] | None = None) -> JobFile:
        """The run's job list: the jobs file if it is there (takeover), else build.py's
        (for a ``num_execution=N`` run, each job as its N ranks:
        :func:`cluster.jobs.ranks.expand_ranks`; for an every_node run, each job once per
        node of ``every_node``: :func:`cluster.master.model.placement.expand_every_node`).

        build.py writes straight into the file (a million job lines are 200 MB or more: the
        master never holds them), which is then indexed (:class:`JobFile`).
        """
        path = self.home.jobs(self.lane)
        queued = RunSpec.parse(start.queue)
        if not path.exists() and queued.repro is not None:
            with fsutil.atomic_writer(path) as out:
                self.repro_jobs(queued, out)
        if not path.exists():
            argv = [*self.config_args, "--home", str(self.home.root)]
            sweep_file = queued.sweep_file
            if "bmpcmp" in start.options:
                argv += ["bmpcmp", "--from", str(self.home.run_dir(start.id) / "bmpcmp.lst")]
            elif sweep_file is not None:
                # The sweep file in the run's snapshot of the pushed sweep folder.
                argv += [SWEEP, "--sweep", str(self.home.root / start.source / sweep_file)]
                if queued.resume is not None:
                    # A resume run: only the tasks not valid in the run it resumes.
                    argv += ["--resume", str(self.home.archive / queued.resume)]
            else:
                argv += [*start.products, *[o for o in start.options
                                            if o in BUILD_OPTIONS or o.startswith("filter=")]]
                if queued.culprit is not None:  # a bisection run: its step's tests only
                    argv += ["--only", str(self.home.run_dir(start.id) / culprit.TESTS_FILE)]
            timeout = self.cfg.build_timeout
            # Straight into the file, fsync'ed before the rename (a takeover reuses it); a
            # failure leaves no jobs file, and the temporary file is removed.
            with fsutil.atomic_writer(path) as out:
                problems, why = self.build_py(argv, out, timeout)
                if why:
                    raise JobListError(f"build.py failed: {why}"
                                       + (f": {problems}" if problems else ""))
            if problems:
                log.warning("build.py: %s", problems)
            ranks = runlimits.run_options(queued, self.cfg).num_execution
            if ranks is not None:  # each job as its ranks (docs/runoptions.md section 7)
                with open(path, encoding="utf-8") as made, fsutil.atomic_writer(path) as out:
                    out.writelines(jobranks.expand_ranks(made, ranks))
            if every_node is not None:
                with open(path, encoding="utf-8") as made, fsutil.atomic_writer(path) as out:
                    out.writelines(placement.expand_every_node(made, every_node))
            elif sweep_file is None:
                # Slowest first, each job with its own timeout (docs/results.md, "Timeouts
                # that fit each test"), written into the file once.
                options = runlimits.run_options(queued, self.cfg)
                joborder.order_run_jobs(path, self.home.tables,
                                        jobtimeouts.fit_for_run(start, options, self.cfg))
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

    def build_py(self, args: list[str], out: TextIO, timeout: float) -> tuple[str, str]:
        """build.py with ``args``, its stdout into ``out``: in a fork when the caller gave
        its main (:mod:`cluster.runtime.forkrun`), else as a program of its own.  Returns
        (its stderr, stripped; why it failed, '' when it did not)."""
        if self.job_list_main is not None:
            made = forkrun.run(self.job_list_main, args, out, timeout)
            problems, ok, timed_out = made.stderr, made.ok, made.timed_out
            why = made.describe(timeout)
        else:
            done = proc.run([sys.executable, str(BUILD_SCRIPT), *args], timeout=timeout,
                            stdout=out)
            problems, ok, timed_out = done.text("stderr"), done.ok, done.timed_out
            why = done.describe(timeout)
        if ok:
            return problems.strip(), ""
        if timed_out:
            why += " (config build_timeout); it was killed"
        return problems.strip(), why
