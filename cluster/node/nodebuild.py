"""A node's BUILD: the corpus and the product's source fetched from the master and built.

The node mirrors the test corpus and the product's source tree from the master (the tree
into ``work_dir/src/<key>``: :mod:`cluster.node.runcontext`), brings the tree's build
folder ``work_dir/build/<key>`` up to date with it (:mod:`cluster.node.buildtree`: only
changed files are written, the build's own files stay, so ``make`` rebuilds only what
changed; the programs the last build left in the binaries' folder are removed, so they
are relinked, never stale), and runs the build command of the tree's kind there
(:mod:`cluster.node.buildcmd`), in a background thread (:mod:`cluster.node.background`).
Each BUILD first removes the least recently built keys beyond ``build_keep`` and what
earlier layouts left in ``work_dir/src`` (:func:`cluster.node.workdir.tidy`, said in the
build log).

When job.start names a ``baseline`` tree (bmpcmp runs), it is mirrored into
``work_dir/baseline/.<name>.src``, copied afresh to ``work_dir/baseline/<name>`` and built
there (a clean build); that build is kept between runs and redone only when the mirrored
tree (paths, sizes, mtimes) or the build command changed since the last successful
baseline build (``.<name>.stamp``, written only after one).  The mirrors are separate so
that mirroring, which deletes what the master lacks, never deletes the build's output.
With ``build_cache`` set (and ccache installed) builds run with ``CC='ccache gcc'`` and
``CCACHE_DIR``.

After a successful build the node looks for job.start's ``programs`` in its build's
binaries' folder and sends the missing ones with every call, beside ``built``
(``unbuilt``): the master hands it no job calling them, and decides whose fault the
missing program is (this node's when another node's build made it, the tree's when no
node's did: :mod:`cluster.master.state.runstate`).  It sends the build digest of each
program it made (``digests``, :mod:`cluster.node.builddigest`) and what changed in their
keys (``keychanges``).

A build (of the product, or of the baseline) that runs longer than ``build_timeout``
seconds is killed with its whole process tree and fails like any failed build.  Whose
fault a failed build is, and so the failure the node reports: :func:`build_failure`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TextIO

from cluster.defaults import FAILURE_BUILD, FAILURE_NETWORK
from cluster.errors import ClusterError, TransportError
from cluster.node import buildcmd, builddigest, buildlog, buildtree, workdir
from cluster.node.buildcmd import BuildPlan
from cluster.node.runcontext import RunContext, job_environment
from cluster.records import BASELINE, BIN, PYTHON, TEMP, TESTS, TREE_DIR
from cluster.runtime import fsutil, proc
from cluster.wire import protocol
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.node")

#: Bytes of a failed build's log read for its error lines at most (its last ones).
BUILD_LOG_READ_LIMIT = 8_000_000


class BuildFailed(ClusterError):
    """The build command failed, timed out or was killed: the source (or its build command)
    is at fault and every node would fail alike, so the node reports failure -1."""


class BuildCannotRunHere(ClusterError):
    """The build command failed for a reason of this node's own (a compiler, make or system
    library it lacks: :attr:`cluster.node.buildlog.Diagnosis.local`): other nodes may build
    the same tree, so the node reports failure 1 and its jobs go to them."""


class BuildStopped(ClusterError):
    """The node was told to stop while its build ran: no failure to report; it leaves."""


def build_failure(exc: BaseException) -> tuple[int, str]:
    """The failure code and reason a node reports for a BUILD that raised ``exc``.

    FAILURE_BUILD (-1, which ends the run for every node) only for :class:`BuildFailed`:
    the build command failed, timed out or was killed, and its log shows nothing that is
    this node's own fault -- a compile error in the tree's own source (``file.c:12:5:
    error:`` on a file of the tree, an ``#include "x.h"`` the tree lacks, an undefined
    reference), or no recognised error line at all.  FAILURE_NETWORK (1: the master drops
    this node, its jobs go to the others and the run goes on) for
    :class:`BuildCannotRunHere`: the command failed and its log shows that this machine
    lacks something -- a program looked up in PATH (``sh: 1: make: not found``, ``make:
    gcc: No such file or directory``, make's ``Error 127``), ``configure: error: ...``, a
    system library (``ld: cannot find -lz``) or system header (``#include <zlib.h>``) --
    and no line that is the tree's fault (the whole rule: :mod:`cluster.node.buildlog`).
    Both reasons quote the deciding line of the build log.  Also FAILURE_NETWORK for a
    fetch from the master that failed (:class:`~cluster.errors.TransportError`) and for
    anything else that went wrong on this node around the build command (a full disk, a
    copy that failed).
    """
    text = str(exc) or type(exc).__name__
    if isinstance(exc, BuildFailed):
        return FAILURE_BUILD, f"build failed: {text}"
    if isinstance(exc, BuildCannotRunHere):
        return FAILURE_NETWORK, f"cannot build on this node: {text}"
    if isinstance(exc, TransportError):
        return FAILURE_NETWORK, f"fetch failed: {text}"
    return FAILURE_NETWORK, f"could not prepare the build on this node: {text}"


class NodeBuild:
    """The run's build: made, or found made for this run by an earlier run.py of the node
    (:attr:`built`), and what it offers the jobs: the placeholders' values
    (:attr:`substitutions`) and the binaries found (:attr:`bins_checked`)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        #: Whether the run's build succeeded (``built`` header).
        self.built = ctx.built_marker.exists()  # built for this run before (a restart)
        #: Binaries of the build (``__bin__/<name>``) found executable: checked once each.
        self.bins_checked: set[str] = set()
        #: job.start's ``programs`` the build did not make (``unbuilt`` header), set once
        #: built (:meth:`check_programs`).
        self.unbuilt: tuple[str, ...] = ()
        #: (program, sha256) of each program the build made, with what it loads and runs
        #: (``digests`` header, sent beside ``built``): set once built.
        self.digests: tuple[tuple[str, str], ...] = ()
        #: What changed in the key of each program whose digest moved since this node last
        #: computed it (``keychanges`` header, beside ``digests``): set with them.
        self.keychanges: protocol.KeyChanges = ()
        #: The job placeholders' values, and the build's binaries' folder (:meth:`use_bins`).
        self.substitutions: tuple[tuple[str, str], ...] = ()
        self.bin_dir = ctx.build_dir / "bin"
        self.use_bins()
        if self.built:
            self.check_programs(ctx.start.programs)
            self.digests = self._program_digests(ctx.start)

    # ------------------------------------------------------------------ after a build
    def succeeded(self) -> None:
        """The BUILD ended well: the binaries are where its plan says, the run is marked
        built, and its programs are looked for and hashed."""
        self.use_bins()
        self.ctx.built_marker.touch()
        self.built = True
        self.check_programs(self.ctx.start.programs)
        self.digests = self._program_digests(self.ctx.start)

    def use_bins(self) -> None:
        """Set the job placeholders, ``__bin__`` and ``__baseline__`` to where the builds'
        binaries are (:func:`cluster.node.buildcmd.plan` of each build folder; ``bin``
        before anything is built).  ``__temp__`` is the run's temp folder in a sweep run;
        in any other, each job's own folder, put in as each job starts."""
        ctx = self.ctx
        subst = {BIN: str(self._bin_dir(ctx.build_dir)),
                 TESTS: str(ctx.tests), PYTHON: shlex.quote(sys.executable),
                 TREE_DIR: str(ctx.build_dir)}
        if ctx.job_dirs is None:
            subst[TEMP] = str(ctx.temp)
        if ctx.baseline_dir is not None:
            subst[BASELINE] = str(self._bin_dir(ctx.baseline_dir))
        self.substitutions = tuple(subst.items())
        self.bin_dir = Path(subst[BIN])

    def _bin_dir(self, tree: Path) -> Path:
        """The binaries' folder of the build in ``tree`` (``tree/bin`` when the tree is not
        there yet or its plan is unreadable: its build failed, or has not run)."""
        try:
            return tree / buildcmd.plan(tree, self.ctx.start, self.ctx.slots).bin_dir
        except ValueError:
            return tree / "bin"

    def check_programs(self, programs: tuple[str, ...]) -> None:
        """After a successful build: which of ``programs`` (job.start's) the build did not
        make (not an executable file in its binaries' folder, :attr:`bin_dir`), into
        :attr:`unbuilt`, sent with every request from now on (beside ``built``).  The master
        hands this node no job calling them and decides whose fault that is:
        this node's when another node's build made the program (it is dropped as failure 1,
        as it would be on its first such job), the tree's when no node's build did (the
        program's tests are not run, and the report says so once).  The programs found are
        not looked at again before jobs (:attr:`bins_checked`)."""
        missing: list[str] = []
        for name in programs:
            path = self.bin_dir / name
            if path.is_file() and os.access(path, os.X_OK):
                self.bins_checked.add(name)
            else:
                missing.append(name)
        self.unbuilt = tuple(missing)
        if missing:
            where = ", ".join(str(self.bin_dir / name) for name in missing)
            log.warning("node %s: the build made no %s; telling the master", self.ctx.name,
                        where)
            with contextlib.suppress(OSError):
                self.ctx.node_log.write(f"node {self.ctx.name}: the build made no {where}\n")

    def _program_digests(self, start: JobStart) -> tuple[tuple[str, str], ...]:
        """The build digest of each of ``start``'s programs the build made, with what it
        loads and runs (:func:`cluster.node.builddigest.build_keys`, its file hashes kept
        in ``work_dir/keycache``), none in a sweep run (its jobs are never reused); sets
        :attr:`keychanges` beside them.  A failure to read them is logged and sends none:
        the master then reuses nothing for this node, never a wrong result."""
        self.keychanges = ()
        programs = start.programs
        if start.max_result_bytes or not programs:
            return ()
        cfg = self.ctx.cfg
        try:
            keys = builddigest.build_keys(
                self.ctx.build_dir, self.bin_dir, programs, run=start.id,
                cache_dir=cfg.work_dir.resolve() / builddigest.KEYCACHE,
                environment=cfg.reuse_environment, env=job_environment())
        except (OSError, ValueError) as exc:
            log.warning("node %s: cannot hash the build's programs (%s); the master will "
                        "reuse no result for this node", self.ctx.name, exc)
            return ()
        for program, count, parts in keys.keychanges:
            log.info("node %s: %s's key changed in %d part(s): %s", self.ctx.name, program,
                     count, ", ".join(parts))
        self.keychanges = keys.keychanges
        self._log_keys(keys.digests)
        return keys.digests

    def _log_keys(self, digests: tuple[tuple[str, str], ...]) -> None:
        """Say the keys of the build in its log (archived with the run): its environment
        digest and each program's digest, which ``clusteradmin repro`` prints and checks."""
        ctx = self.ctx
        try:
            line = builddigest.keys_line(
                ctx.name, ctx.start.id,
                builddigest.environment_digest(job_environment(), ctx.cfg.reuse_environment),
                digests)
            with open(ctx.build_log, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        except OSError as exc:
            log.warning("node %s: cannot write the build's keys to %s: %s", ctx.name,
                        ctx.build_log, exc)

    # ------------------------------------------------------------------ the BUILD itself
    def run(self) -> None:
        """The BUILD (in the background thread): fetch, build the tree, build the
        baseline; raises what :func:`build_failure` judges."""
        ctx = self.ctx
        with open(ctx.build_log, "w", encoding="utf-8") as out:
            out.write(f"node {ctx.name}: building {ctx.start.source} for run {ctx.start.id}\n")
            out.flush()
            tidied = workdir.tidy(ctx.src.parent.parent, ctx.src.name, ctx.cfg.build_keep)
            out.writelines(f"node {ctx.name}: {line}\n" for line in tidied.lines())
            try:
                ctx.transport.fetch_tree(ctx.start.tests, ctx.tests)
                ctx.transport.fetch_tree(ctx.start.source, ctx.src)
                env = self._build_env(out)
                self._build_tree(out, env)
                if ctx.baseline_dir is not None:
                    self._build_baseline(out, env)
            except TransportError as exc:  # a fetch, of the corpus, the tree or the baseline
                # Into the build log too: it is uploaded, and it is where one looks first.
                out.write(f"node {ctx.name}: fetch failed: {exc}\n")
                raise

    def _build_env(self, out: TextIO) -> dict[str, str]:
        """The environment of the build commands: ours, with ccache when ``build_cache`` is
        set; without ccache installed the build log says so (once) and the build goes on
        without it."""
        env = dict(os.environ)
        cache = self.ctx.cfg.build_cache.strip()
        if not cache:
            return env
        ccache = shutil.which("ccache")
        if ccache is None:
            out.write(f"node {self.ctx.name}: build_cache is {cache}, but ccache is not "
                      "installed (not on PATH); building without a compiler cache\n")
            return env
        env["CC"] = "ccache gcc"
        env["CCACHE_DIR"] = os.path.abspath(os.path.expanduser(cache))
        out.write(f"node {self.ctx.name}: compiler cache {env['CCACHE_DIR']} (CC='ccache "
                  f"gcc', {ccache})\n")
        return env

    def _build_tree(self, out: TextIO, env: dict[str, str]) -> None:
        """Bring the run's build folder up to date with the fetched tree and build it there
        (locked: the folder outlives this run, and another run.py of this node may use it)."""
        name, src, tree = self.ctx.name, self.ctx.src, self.ctx.build_dir
        tree.parent.mkdir(parents=True, exist_ok=True)
        with fsutil.flocked(tree.with_name(f".{tree.name}.lock")):
            done = buildtree.overlay(src, tree, tree.with_name(f".{tree.name}.manifest"))
            out.write(f"node {name}: build folder {tree} updated from {src}: "
                      f"{done.written} files written, {done.deleted} deleted\n")
            plan = self._plan(out, tree)
            stale = buildtree.remove_programs(tree / plan.bin_dir, src / plan.bin_dir)
            if stale:
                out.write(f"node {name}: removed the last build's {' '.join(stale)} "
                          f"from {plan.bin_dir}/ (this build makes them again)\n")
            out.write(f"$ {plan.command}\n")
            self._run_build(out, tree, plan, env, "")

    def _plan(self, out: TextIO, tree: Path) -> BuildPlan:
        """The build of ``tree`` (:func:`cluster.node.buildcmd.plan`), written to the build
        log; BuildFailed (the tree's fault) when its own build script is unusable."""
        try:
            plan = buildcmd.plan(tree, self.ctx.start, self.ctx.slots)
        except ValueError as exc:
            out.write(f"node {self.ctx.name}: {exc}\n")
            raise BuildFailed(str(exc)) from None
        out.write(f"node {self.ctx.name}: {plan.kind} tree, build command from "
                  f"{plan.origin}, binaries in {plan.bin_dir}/\n")
        return plan

    def _build_baseline(self, out: TextIO, env: dict[str, str]) -> None:
        """Fetch the baseline tree and build it, unless the cached build is up to date.

        Locked (flock on ``.<name>.lock``) because the cache outlives this run: another
        run.py of this node must never see a half-copied tree.
        """
        assert self.ctx.baseline_dir is not None
        baseline, tree = self.ctx.start.baseline, self.ctx.baseline_dir
        mirror = tree.with_name(f".{tree.name}.src")
        stamp = tree.with_name(f".{tree.name}.stamp")
        tree.parent.mkdir(parents=True, exist_ok=True)
        with fsutil.flocked(tree.with_name(f".{tree.name}.lock")):
            out.write(f"node {self.ctx.name}: fetching baseline {baseline} into {mirror}\n")
            out.flush()
            self.ctx.transport.fetch_tree(baseline, mirror)
            plan = self._plan(out, mirror)
            digest = tree_digest(mirror, f"{plan.command} -> {plan.bin_dir}")
            try:
                previous = stamp.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                previous = ""
            if previous == digest and tree.is_dir():
                out.write(f"baseline {baseline} unchanged since its last build "
                          f"(digest {digest[:12]}); reusing {tree}\n")
                out.flush()
                return
            stamp.unlink(missing_ok=True)  # a failed build must not look built
            if tree.exists():
                shutil.rmtree(tree)
            # A clean copy: the master's clean tree, built from scratch as the master has it
            # (the reference a bmpcmp run compares with owes nothing to an earlier build).
            shutil.copytree(mirror, tree, symlinks=True)
            out.write(f"baseline {baseline} changed (digest {digest[:12]}); "
                      f"building in {tree}\n$ {plan.command}\n")
            self._run_build(out, tree, plan, env,
                            f"baseline build {plan.command!r} of {baseline}")
            # fsync: the stamp says "this build is good"; it must not outlive a lost build.
            fsutil.atomic_write(stamp, digest + "\n")

    def _run_build(self, out: TextIO, cwd: Path, plan: BuildPlan, env: dict[str, str],
                   what: str) -> None:
        """Run ``plan``'s command in ``cwd`` (environment ``env`` and the plan's own), its
        output going to the build log ``out``.

        Bounded by ``build_timeout``: past it the command's whole process tree is killed.
        If it fails or times out: :class:`BuildFailed`, or :class:`BuildCannotRunHere` when
        the command's part of the log shows this node's own fault (build_failure), naming
        the build (``what``, default the command), what happened and the log's deciding
        line; :class:`BuildStopped` if the node was told to stop meanwhile.  The same line
        goes to the build log.
        """
        what = what or repr(plan.command)
        timeout = self.ctx.cfg.build_timeout
        out.flush()  # our lines first: the child appends to the same file
        started_at = self.ctx.build_log.stat().st_size
        began = time.monotonic()
        done = proc.run(plan.command, shell=True, cwd=cwd, env={**env, **dict(plan.env)},
                        stdout=out, stderr=proc.STDOUT, timeout=timeout,
                        stop=self.ctx.stop_flag)
        # The build's wall time, in the log: what a slow or an incremental build cost.
        out.write(f"node {self.ctx.name}: build command ended after "
                  f"{time.monotonic() - began:.1f} s\n")
        problem = _build_problem(done, what, timeout)
        if not problem:
            return
        out.write(f"node {self.ctx.name}: {problem}\n")
        out.flush()
        if done.stopped:
            raise BuildStopped(problem)
        diagnosis = buildlog.diagnose(_read_from(self.ctx.build_log, started_at))
        words = diagnosis.summary()
        reason = f"{problem}: {words}" if words else problem
        # Only a command that ran to its own failure can show the node's fault; a timeout
        # or a kill says nothing about whose it is, and stays the source's (failure -1).
        if diagnosis.local and done.returncode > 0:
            raise BuildCannotRunHere(reason)
        raise BuildFailed(reason)


def _build_problem(done: proc.Result, what: str, timeout: float) -> str:
    """What went wrong with the build command ``what`` that ended as ``done``; "" when it
    succeeded."""
    if done.stopped:
        return f"{what} stopped: the node was told to stop; its process tree was killed"
    if done.timed_out:
        return (f"{what} timed out after {timeout:g} s (build_timeout); its process "
                "tree was killed")
    if done.returncode > 0:
        return f"{what} exited with status {done.returncode}"
    if done.returncode < 0:
        return f"{what} was {proc.describe_status(done.returncode)}"
    return ""


def tree_digest(root: Path, build_command: str) -> str:
    """A digest of the listing of ``root`` (relative paths, sizes, mtimes) and the build
    command: what the cached baseline build was made from.  Contents are not read: the
    mirror copies a file again whenever its size or mtime changes on the master."""
    h = hashlib.sha256(f"build {build_command}\n".encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        h.update(f"d {rel}\n".encode("utf-8", "surrogateescape"))
        for name in sorted(filenames):
            st = os.lstat(os.path.join(dirpath, name))
            h.update(f"f {rel}/{name} {st.st_size} {st.st_mtime_ns}\n"
                     .encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on (at most its last BUILD_LOG_READ_LIMIT
    bytes; undecodable bytes replaced)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(offset, size - BUILD_LOG_READ_LIMIT, 0))
        return fh.read(BUILD_LOG_READ_LIMIT).decode("utf-8", errors="replace")
