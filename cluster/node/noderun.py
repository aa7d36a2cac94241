"""run.py's engine: one node taking part in one run (port of run.pl, on seed 001's protocol).

The node reads job.start, then talks to the master on base_port + priority:

* BUILD: mirror the test corpus and the product's source tree from the master (the tree into
  ``work_dir/src/<key>``), bring the tree's build folder ``work_dir/build/<key>`` up to date
  with it (:mod:`cluster.node.buildtree`: only changed files are written, the build's own
  files stay, so ``make`` rebuilds only what changed; the programs the last build left in
  the binaries' folder are removed, so they are relinked, never stale), and run the build
  command of the tree's kind there (:mod:`cluster.node.buildcmd`) in a background thread;
  meanwhile every call says ``busy build``. ``<key>`` is the source path, or for a run's
  snapshot (``runs/<id>/source/<tree>``) the run's kind, the user of a user run, and the
  tree: the same for every run of that user's tree. The run holds its key
  (:class:`cluster.node.workdir.UseHold`) from its start to its end, and each BUILD first
  removes the least recently built keys beyond ``build_keep`` and what earlier layouts
  left in ``work_dir/src`` (:func:`cluster.node.workdir.tidy`, said in the build log).
  When job.start names a ``baseline`` tree (bmpcmp runs), it is mirrored into
  ``work_dir/baseline/.<name>.src``, copied afresh to ``work_dir/baseline/<name>`` and
  built there (a clean build); that build is kept between runs and redone only when the
  mirrored tree (paths, sizes, mtimes) or the build command changed since the last
  successful baseline build (``.<name>.stamp``, written only after one). The mirrors are
  separate so that mirroring, which deletes what the master lacks, never deletes the
  build's output. With ``build_cache`` set (and ccache installed) builds
  run with ``CC='ccache gcc'`` and ``CCACHE_DIR``.
  After a successful build the node looks for job.start's ``programs`` in its build's
  binaries' folder and sends the missing ones with every call, beside ``built``
  (``unbuilt``): the master hands it no job calling them, and decides whose fault
  the missing program is (this node's when another node's build made it, the tree's when
  no node's did: :mod:`cluster.master.state.runstate`).
* JOBS: jobs go into a local queue and run in ``slots`` persistent slot shells
  (:mod:`cluster.node.slots`); one running longer than ``job_timeout`` seconds is killed as a
  whole tree (SIGHUP, then SIGKILL).  A node running as root with ``job_user`` set runs
  them as that account (:mod:`cluster.node.jobuser`): the run's ``temp`` folder is the
  account's, each slot has a folder of its own in ``runs/<id>/homes/``, and every process
  of the account is killed at the start and the end of the run and before its UPLOAD.  The
  node reads what a job wrote never through a link (``O_NOFOLLOW``, regular files only),
  as it may be root.  The BUILD still runs as the node's account.
* Results are classified as they finish (readlog rules) and sent back with the next call;
  a call is made as soon as results wait longer than ``report_interval``, or at once when
  no job runs any more (nothing else could join them: the last results of a run go
  without delay), when the local queue falls below one job per slot (so the node never
  idles between batches), and at least every ``poll_interval`` seconds (the node's
  heartbeat).  A node with free slots told CONTINUE (nothing for it now: the tail of a
  run, or the master deciding on a confirm phase) asks again after
  :data:`CONTINUE_FIRST_WAIT`, doubling at each further CONTINUE up to
  ``min(poll_interval, 0.5 s)``, and from the first wait again after a call that got jobs
  or carried the node's last results (no job of its running): a short wait (another
  node's last job) ends within a fraction of itself, a long one costs the master two
  calls a second per node.
* Sweep runs (job.start has ``max_result_bytes``): each task's result files are read
  when it ends and kept in the run's outbox (:mod:`cluster.node.sweepresults`); its result
  line's md5 is that of its results.  Before a call carrying sweep results the node packs
  them into one bundle, uploads it through the transport to
  ``runs/<id>/results/incoming/<node>.<instance>.<n>.tar`` and names it in the call's
  ``bundle`` header; a failed upload is a failed call (the results stay and go in a new
  bundle).  After the reply the sent results' files and the bundle are removed.
  job.start's ``job_timeout`` replaces the node's own for such a run.
* UPLOAD: the node's log and build log go to the master (busy meanwhile), and the image
  sets bmpcmp jobs left in ``temp/bmpcmp/`` go to ``runs/<id>/bmpcmp/``: whole sets in
  name order until :data:`BMPCMP_UPLOAD_LIMIT` bytes; the sets after that are not sent and
  ``runs/<id>/bmpcmp/DROPPED.<node>`` lists their files.
* ABORT: everything running is killed and the node leaves.

Placeholders in job commands (:mod:`cluster.records`): ``__temp__``, ``__bin__``,
``__tests__``, ``__tree__`` (the run's build folder: a sweep's folder), ``__baseline__``
(the baseline build's binaries; left as is without a
baseline, so a job using it fails visibly) and ``__python__`` (this interpreter, quoted; the
slot shells get the project on ``PYTHONPATH`` so ``__python__ -m cluster.bmpcmp`` imports
from any directory, installed or not).

Every call is signed with this node's run key: derived from the node's own key
(``node-keys/<name>.key`` in the master home, read through the transport; see
:mod:`cluster.nodekeys`) and the run id, so no other node can sign for this name, and the
master's reply is believed only once its signature, bound to the
call's nonce, verifies (:mod:`cluster.wire.signing`).  A reply that does not verify is not
acted upon in any way -- no job line of it runs -- and counts as a failed call: retried
after ``connect_retry_delay``, and after ``connect_retries`` the node exits 3 as for an
unreachable master (never failure -1, which would end everyone's run).  Except when the run
is over: a node cut off while its run ended finds on the port either another run's master,
which refuses this run's id unsigned, or no master at all (the connection is refused).
After such a reply or refusal the node reads job.start through its transport, and when
job.start is gone or names another run it leaves at once (exit 0: the run is over for it)
instead of retrying.  The reply itself decides nothing.

Results are dropped from the node's memory only after the master's reply has been read, so
a failed call sends them again (the master records the first copy and counts the rest).

A build (of the product, or of the baseline) that runs longer than ``build_timeout`` seconds
is killed with its whole process tree and fails like any failed build: failure -1, the build
log uploaded, and a reason saying it timed out after that many seconds.  Failure -1 ends the
run for every node, so it is reported only when the build *command* failed (the source is at
fault: every node would fail alike); the reason quotes the build log's deciding error line
(:mod:`cluster.node.buildlog`).  A build command that failed for a reason of this node's own
(a compiler, make or system library it lacks, by the rule in :func:`build_failure`) reports
failure 1 with the same quoted words.  A BUILD that could not fetch the corpus or the source
(the tree missing on the master, the mirror failing) or failed on this node for any other
reason before or around the command reports failure 1 (FAILURE_NETWORK): the master drops
this node and the others go on.  A build ended because the node was told to stop is no
failure at all: the node leaves the run.  However the node leaves a run (ABORT, a signal, a
failure), a BUILD or UPLOAD still running is stopped and waited for first, so its build log
ends with how it ended ("... stopped: the node was told to stop") and no build command
outlives run.py.

Exit codes (cluster.defaults NODE_EXIT_*): 0 the run is over for this node, 1 failure, 3 the
master could not be reached, 4 aborted for a reason that may pass (the node may join again
later).  TERM, INT and HUP only set :attr:`NodeRun.stop_flag`; the loop then leaves the run
(STYLE §5).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

from cluster import nodekeys
from cluster.bmpcmp import DROPPED_NOTE, SET_FILE
from cluster.config import Config
from cluster.defaults import (
    BMPCMP_DIR,
    FAILURE_BUILD,
    FAILURE_NETWORK,
    FAILURE_TIMEOUTS,
    NODE_EXIT_ABORTED,
    NODE_EXIT_DONE,
    NODE_EXIT_FAILED,
    NODE_EXIT_UNREACHABLE,
    REPO_ROOT,
)
from cluster.errors import ClusterError, MasterUnreachable, ProtocolError, TransportError
from cluster.home import suffixed
from cluster.node import (
    buildcmd,
    builddigest,
    buildlog,
    buildtree,
    jobdirs,
    jobuser,
    readlog,
    sweepresults,
    workdir,
)
from cluster.node.buildcmd import BuildPlan
from cluster.node.jobdirs import JOBS_DIR, JobDirs
from cluster.node.slots import Finished, SlotPool, size_limit_blocks, with_size_limit
from cluster.node.transport import Transport, read_node_key
from cluster.records import (
    BASELINE,
    BIN,
    ERROR_INTERNAL,
    ERROR_NONE,
    ERROR_READ,
    PYTHON,
    TEMP,
    TESTS,
    TREE_DIR,
    Job,
    JobResult,
)
from cluster.runtime import fsutil, proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.service import StopFlag
from cluster.wire import protocol, signing
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.node")

#: How long, beyond kill_grace, a node leaving its run waits for a stopped BUILD or
#: UPLOAD thread to end [s] (NodeRun._end_background).
BACKGROUND_END_WAIT = 5.0
#: The signals that make run.py leave its run cleanly (see :attr:`NodeRun.stop_flag`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
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
#: ABORT reasons (prefixes) after which this node must not join the same run again.
FINAL_ABORTS = protocol.FINAL_ABORTS
#: ABORT reasons, matched whole, that are *not* final although they start with one of
#: FINAL_ABORTS: the run goes on elsewhere and this node should come back to it.  The master
#: answers ``run aborted: <RunState.fatal>``, and a master that finds the PID file no longer
#: its own sets fatal to protocol.REPLACED ("clustermaster replaced"): its
#: successor resumes the same run under the same id (seed 001: a node may start again from
#: scratch and rejoin), so the node exits NODE_EXIT_ABORTED and clusterpull rejoins it after
#: its rejoin_delay.  A user's abort ("run aborted: aborted by its user ..."), a failed or
#: stopped run and a finished one stay final.
REJOIN_ABORTS = protocol.REJOIN_ABORTS
SAFE_PATH = re.compile(r"[A-Za-z0-9_./+,@%=:-]+")
#: A baseline tree's folder name under work_dir/baseline (``/`` written as ``__``); it
#: starts with a letter or digit, so it never clashes with the dot files beside it.
BASELINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+,@%=-]*")
RELAXED_TIMEOUT = 1800.0  # relaxtimeout, per clusterpush.txt: 30 minutes
#: After a CONTINUE, a node with free slots asks again this soon [seconds]; the wait doubles
#: at each further CONTINUE, up to :data:`CONTINUE_LONGEST_WAIT` (or ``poll_interval``).
CONTINUE_FIRST_WAIT = 0.05
CONTINUE_LONGEST_WAIT = 0.5
#: What a job writes in the temp folder beside its name: its log, the md5sum output of its
#: raster, and (product shell) its raw output, whose md5 is its result.
JOB_LOG, JOB_MD5, JOB_OUT = ".log", ".md5", ".out"
#: How the command of a job of product shell starts (:func:`cluster.jobs.commands.
#: shell_command`: its log's label line): such a job runs under ``ulimit -f`` of
#: ``max_output_bytes``, and its output file is hashed by the node only within that bound.
SHELL_JOB_START = f"echo {readlog.SHELL_PRODUCT} > {TEMP}/"
#: The run folder's folder of the slots' own folders (their HOME and TMPDIR) when jobs run
#: as job_user (:mod:`cluster.node.slots`).
SLOT_HOMES = "homes"
#: Where a sweep run's result bundles go in the run's folder on the master.
BUNDLE_DIR = "results/incoming"
#: Bytes of bmpcmp images one node uploads per run (ARTIFEX.md §5.7: checkSize.pl, 10 MB).
BMPCMP_UPLOAD_LIMIT = 10_000_000
#: The file in work_dir holding the node's instance id (``instance`` header): made once,
#: kept across restarts of the node, different on every machine set up from one node.conf.
INSTANCE_FILE = "instance"
#: Exit statuses of a shell or of /usr/bin/time that mean the command could not be run at
#: all (126: found but not executable; 127: not found, or its loader failed): never a test
#: result.
CANNOT_RUN_STATUSES = (126, 127)
#: What a job's log says when its program could not be started (GNU time, then sh).
_CANNOT_RUN = re.compile(r"^(?:\S*time: cannot run .*|Command exited with non-zero status "
                         r"12[67]|(?:\S*/)?(?:ba|da)?sh: (?:line )?\d+: \S+: "
                         r"(?:command )?not found)$", re.M)
#: The binaries a job line names in the node's build (``__bin__/<name>``).
_BIN_NAME = re.compile(re.escape(BIN) + r"/([A-Za-z0-9_.+-]+)")


def cut_from_outside(done: Finished) -> bool:
    """Whether the job ``done`` ended the way a stop signal sent to the node's whole process
    tree ends one, not by this node's hand: its slot's shell died (no exit status), or its
    status is 128 + one of :data:`OUTSIDE_STOP_SIGNALS`."""
    if done.killed:
        return False
    status = done.exit_status
    return status is None or status - 128 in OUTSIDE_STOP_SIGNALS


class BuildFailed(ClusterError):
    """The build command failed, timed out or was killed: the source (or its build command)
    is at fault and every node would fail alike, so the node reports failure -1."""


class CannotRunJobs(ClusterError):
    """This node cannot run the run's jobs (its build lacks the product's binary, its corpus
    lacks a test's input, a job's program could not be started): the node is at fault, not
    the test, so it reports failure 1 and no result of it reaches the table."""


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


@dataclass
class Background:
    """A BUILD or UPLOAD running in a thread; ``error`` (and ``exception``) set if it failed."""

    what: str
    thread: threading.Thread
    error: str = ""
    exception: Exception | None = None
    done: bool = False
    #: Set with ``done``: the node's loop waits on it, so it hears of the end at once.
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class Counters:
    started: int = 0
    finished: int = 0
    timeouts: int = 0


class NodeRun:
    """One node in one run.  Callers use :meth:`run` (returns an exit code) and :meth:`stop`
    (or :attr:`stop_flag`, for ``cluster.runtime.service.install_signal_handlers``).

    ``clock`` gives the loop's time (deadlines, report and poll intervals, its idle sleep).
    """

    def __init__(self, cfg: Config, transport: Transport, priority: int, caps: str,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        self.clock = clock or SystemClock()
        self.transport = transport
        self.priority = priority
        self.caps = caps
        self.name = cfg.effective_node_name()
        self.slots = cfg.effective_slots()
        self.queue: collections.deque[Job] = collections.deque()
        self.unsent: list[JobResult] = []
        self.first_unsent = 0.0
        self.counters = Counters()
        self.background: Background | None = None
        self.failure = 0
        self.failure_reason = ""
        self.stop_flag = StopFlag()
        self.next_contact = 0.0
        self.hungry_after = 0.0  # do not ask for work before this (after an empty answer)
        self.continue_wait = CONTINUE_FIRST_WAIT  # after the next CONTINUE (doubling)
        self.low_water = self.slots  # ask for more when fewer jobs than this wait
        self.built = False
        self.consecutive_failures = 0
        self.start: JobStart | None = None
        self.key = b""  # the run's secret (job.start), set by _prepare
        self.nonces = signing.NonceSource()
        self.instance = ""  # work_dir/instance, set by _prepare
        #: Binaries of the build (``__bin__/<name>``) found executable: checked once each.
        self.bins_checked: set[str] = set()
        self.cannot_run = False  # set by _cannot_run: this node fails its part in the run
        #: job.start's ``programs`` its build did not make (``unbuilt`` header), set once
        #: built (:meth:`_check_programs`).
        self.unbuilt: tuple[str, ...] = ()
        #: (program, sha256) of each program the build made, with what it loads and runs
        #: (``digests`` header, sent beside ``built``): set once built (_program_digests).
        self.digests: tuple[tuple[str, str], ...] = ()
        #: What changed in the key of each program whose digest moved since this node last
        #: computed it (``keychanges`` header, beside ``digests``): set with them.
        self.keychanges: protocol.KeyChanges = ()
        self.in_use = workdir.UseHold()  # the key of the build this run uses, held
        #: A sweep run's results waiting to be sent (set by _prepare; None in other runs).
        self.outbox: sweepresults.Outbox | None = None
        #: The account jobs run as (job_user, the node being root), None for the node's own
        #: (set by _prepare: :mod:`cluster.node.jobuser`).
        self.account: jobuser.JobAccount | None = None
        #: Each job's own folder, its ``__temp__`` (set by _prepare; None in a sweep run,
        #: whose tasks have folders of their own: :mod:`cluster.node.jobdirs`).
        self.job_dirs: JobDirs | None = None
        #: ``ulimit -f`` of a shell job (512-byte blocks) from ``max_output_bytes``.
        self.output_blocks = size_limit_blocks(cfg.max_output_bytes)

    # ------------------------------------------------------------------ setup
    def stop(self) -> None:
        """Signal-safe: ask the loop to leave the run at its next pass."""
        self.stop_flag.set()

    def _prepare(self) -> JobStart:
        text = self.transport.read_text(suffixed("job.start", self.priority))
        if text is None:
            raise ClusterError(f"no {suffixed('job.start', self.priority)} on the master")
        start = JobStart.parse(text)
        self.key = signing.run_key(self._node_key(), start.id)
        work = self.cfg.work_dir.resolve()
        if not SAFE_PATH.fullmatch(str(work)):
            raise ClusterError(f"work_dir {work} must be a path of [A-Za-z0-9_./+,@%=:-] "
                               "(it is pasted into shell commands)")
        self.account = jobuser.job_account(self.cfg.job_user)
        if self.account is not None:
            self._open_for_jobs(work)
        elif os.geteuid() == 0:
            log.warning("node %s runs as root and job_user is empty: its jobs run as root "
                        "and can read node.conf and the node's keys; set job_user "
                        "(docs/security.md)", self.name)
        self.instance = node_instance(work)
        self.run_dir = work / "runs" / start.id
        self.temp = self.run_dir / "temp"
        self.temp.mkdir(parents=True, exist_ok=True)
        sweep = bool(start.max_result_bytes)
        if self.account is not None:
            if sweep:
                # Where a sweep's tasks write their streams and the node makes their
                # folders; the run folder above stays root's.
                jobuser.give_folder(self.temp, self.account)
            else:
                # Root's: a job writes in its own folder below only (jobdirs).
                os.chown(self.temp, 0, 0, follow_symlinks=False)
                os.chmod(self.temp, 0o711, follow_symlinks=False)
            (self.run_dir / SLOT_HOMES).mkdir(exist_ok=True)
        # A node killed in this run before (it rejoins) may have left temporary files.
        fsutil.remove_dead_temps(self.run_dir, recursive=True)
        if not sweep:
            self.job_dirs = JobDirs(self.temp / JOBS_DIR, self.account)
        key = build_key(start)
        if not BASELINE_NAME.fullmatch(key):
            raise ClusterError(f"job.start source {start.source!r} gives the build folder name "
                               f"{key!r}; expected [A-Za-z0-9_.+,@%=-] starting with a letter "
                               "or digit")
        self.src = work / workdir.SRC / key  # the mirror of the master's tree
        self.build_dir = work / workdir.BUILD / key  # where it is built (buildtree)
        self.in_use.take(self.build_dir.parent, key)  # no tidy removes it meanwhile
        self.tests = work / "tests"
        self.node_log_path = self.run_dir / f"{self.name}.log"
        self.build_log = self.run_dir / f"{self.name}.build.log"
        self.built_marker = self.run_dir / "built"
        self.baseline_dir: Path | None = None
        if start.baseline:
            key = start.baseline.strip("/").replace("/", "__")
            if not BASELINE_NAME.fullmatch(key):
                raise ClusterError(f"job.start baseline {start.baseline!r} is not a tree "
                                   "path of [A-Za-z0-9_.+,@%=-] and / starting with a letter "
                                   "or digit")
            # Kept across runs (unlike src): the cache of the baseline build.
            self.baseline_dir = work / "baseline" / key
        self.node_log = open(self.node_log_path, "a", encoding="utf-8")  # noqa: SIM115
        relaxed = "relaxtimeout" in start.options
        self.job_timeout = RELAXED_TIMEOUT if relaxed else self.cfg.job_timeout
        if start.job_timeout:
            self.job_timeout = start.job_timeout  # a sweep's: never before its own timeout
        #: A folder bundle moved to the master whose call failed: it goes again.
        self.outstanding: sweepresults.Bundle | None = None
        #: Whether result bundles go as folders (until the transport cannot move one).
        self.folder_bundles = True
        #: A sweep run's sweep folder entries, linked into each task's folder (read when
        #: the first task is prepared).
        self.sweep_entries: list[tuple[Path, bool]] | None = None
        self.outbox = None if not start.max_result_bytes else sweepresults.Outbox(
            self.run_dir / sweepresults.OUTBOX_DIR, self.name, self.instance,
            start.max_result_bytes)
        self.built = self.built_marker.exists()  # built for this run before (a restart)
        self._use_bins(start)
        if self.built:
            self._check_programs(start.programs)
            self.digests = self._program_digests(start)
        self.pool = SlotPool(self.slots, _job_environment(), self.job_timeout,
                             self.cfg.kill_grace, clock=self.clock.monotonic,
                             account=self.account, homes=self.run_dir / SLOT_HOMES)
        return start

    def _open_for_jobs(self, work: Path) -> None:
        """The node is root and its jobs run as :attr:`account`: what the node makes from
        now on is readable by all but its secrets (umask 022: the corpus mirror, the
        builds, the run folders), ``work_dir`` and ``work_dir/runs`` can be entered, and
        the folders above must let the account through (ClusterError naming the one that
        does not).  A Python or node code the account cannot reach is warned of (only
        ``__python__`` jobs need them).  Processes of the account an earlier run left are
        killed."""
        assert self.account is not None
        os.umask(0o022)
        work.mkdir(parents=True, exist_ok=True)
        for folder in (work, work / "runs"):
            folder.mkdir(exist_ok=True)
            os.chmod(folder, os.stat(folder).st_mode | 0o711)
        blocked = jobuser.blocked_folder(work, self.account)
        if blocked is not None:
            raise ClusterError(
                f"job_user {self.account.name} cannot enter {blocked} (mode "
                f"{os.stat(blocked).st_mode & 0o7777:04o}), above work_dir {work}: its "
                "jobs could not reach their inputs; let others search it (chmod o+x) or "
                "put work_dir elsewhere")
        for what, folder in (("Python", Path(sys.executable).parent),
                             ("node code", REPO_ROOT)):
            blocked = jobuser.blocked_folder(folder, self.account)
            if blocked is not None:
                # Only the jobs calling __python__ (bmpcmp's) need them: said, not refused.
                log.warning("node %s: job_user %s cannot enter %s, so it cannot use the "
                            "node's %s in %s: jobs calling %s (bmpcmp) will fail; install "
                            "them where others may enter", self.name, self.account.name,
                            blocked, what, folder, PYTHON)
        killed = jobuser.kill_leftovers(self.account)
        if killed:
            log.warning("node %s: killed %d process(es) of %s an earlier run left",
                        self.name, killed, self.account.name)
        # A run that ended without its own clean-up (the node was killed) may have left
        # what its jobs scheduled.
        for done in jobuser.remove_schedules(self.account):
            log.warning("node %s: %s (left by an earlier run)", self.name, done)

    def _node_key(self) -> bytes:
        """This node's own key, read through the transport (:func:`read_node_key`)."""
        text = read_node_key(self.transport, self.name)
        try:
            return signing.parse_secret(text)
        except ValueError as exc:
            raise ClusterError(f"{nodekeys.key_rel(self.name)} on the master: {exc}") from None

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.in_use.release()

    def _run(self) -> int:
        try:
            self.start = self._prepare()
        except MasterUnreachable as exc:  # after the transport's own connect_retries
            log.error("node %s: cannot start: %s", self.name, exc)
            return NODE_EXIT_UNREACHABLE
        except (ClusterError, ValueError, OSError) as exc:
            log.error("node %s: cannot start: %s", self.name, exc)
            return NODE_EXIT_FAILED
        log.info("node %s: joining run %s with %d slots", self.name, self.start.id, self.slots)
        try:
            return self._loop()
        finally:
            self._end_background()
            self.pool.close()
            self._end_jobs()
            self.node_log.close()

    def _end_background(self) -> None:
        """Leaving the run (told ABORT, stopped, failed): a BUILD or UPLOAD still running
        is stopped (its process tree killed, through :attr:`stop_flag`) and its thread
        waited for, at most :data:`BACKGROUND_END_WAIT` s after the kill's grace: the build
        log then ends with how its build ended, and no build outlives the node process."""
        bg = self.background
        if bg is None or bg.done:
            return
        self.stop_flag.set()
        bg.thread.join(self.cfg.kill_grace + BACKGROUND_END_WAIT)
        if bg.thread.is_alive():
            log.warning("node %s: the %s did not stop within %.0f s of being told to",
                        self.name, bg.what, self.cfg.kill_grace + BACKGROUND_END_WAIT)

    def _end_jobs(self) -> None:
        """Remove the job folders; as the job account, first kill every process of it
        left (a job's background child, a ``setsid``), then remove what it scheduled (its
        crontab and at jobs: :func:`cluster.node.jobuser.remove_schedules`) and the slots'
        folders.  As the node's own account, the slots' sessions, killed with the pool,
        were all its processes, and what a job scheduled is the node's own account's."""
        if self.account is not None:
            killed = jobuser.kill_leftovers(self.account)
            said = []
            if killed:
                said.append(f"killed {killed} process(es) of {self.account.name} left by "
                            "the run's jobs")
            said += jobuser.remove_schedules(self.account)
            for line in said:
                log.warning("node %s: %s", self.name, line)
                with contextlib.suppress(OSError, ValueError):
                    self.node_log.write(f"node {self.name}: {line}\n")
            jobuser.remove_folder(self.run_dir / SLOT_HOMES)
        if self.job_dirs is not None:
            self.job_dirs.close()

    def _loop(self) -> int:
        while True:
            now = self.clock.monotonic()
            self._spawn(now)
            if self.stop_flag.is_set():
                self._kill_all()
                self._contact(now, leaving=True)
                return NODE_EXIT_ABORTED
            if self._contact_due(now):
                code = self._contact(now)
                if code is not None:
                    return code
                continue
            self._wait(self._next_wakeup(now) - now)
            self._check_timeouts(self.clock.monotonic())
            if self._too_many_timeouts() and not self.failure:
                self.failure = FAILURE_TIMEOUTS
                self.failure_reason = f"{self.counters.timeouts} tests timed out"
                log.error("node %s: %s; failing", self.name, self.failure_reason)
                self.queue.clear()
                self._kill_all()
                self.next_contact = 0.0

    def _contact_due(self, now: float) -> bool:
        if now >= self.next_contact:
            return True
        if self.consecutive_failures:
            return False  # retrying on the fixed schedule of run.pl (connect_retry_delay)
        if self.failure:
            return True
        if self.unsent and (now - self.first_unsent >= self.cfg.report_interval
                            or not self.pool.running()):
            return True
        if self.background is not None:
            return self.background.done
        hungry = len(self.queue) < self.low_water and now >= self.hungry_after
        return hungry and self.built

    def _next_wakeup(self, now: float) -> float:
        wake = self.next_contact
        if self.unsent:
            wake = min(wake, self.first_unsent + self.cfg.report_interval)
        if len(self.queue) < self.low_water and self.built:
            wake = min(wake, self.hungry_after)
        deadline = self.pool.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        if self.background is not None:
            wake = min(wake, now + 0.05)
        return max(wake, now)

    # ------------------------------------------------------------------ talking to the master
    def _request(self, leaving: bool) -> protocol.Request:
        busy = ""
        if self.background is not None and not self.background.done:
            busy = self.background.what
        status = (f"{busy}ing" if busy else
                  f"{self.counters.finished} tests completed, {self.pool.running()} running")
        return protocol.Request(
            node=self.name, job_id=self.start.id if self.start else "", caps=self.caps,
            pending=len(self.queue), running=self.pool.running(), slots=self.slots, busy=busy,
            built=self.start.id if self.start and self.built else "",
            unbuilt=self.unbuilt if self.built else (),
            digests=self.digests if self.built else (),
            keychanges=self.keychanges if self.built else (), instance=self.instance,
            failure=self.failure, failure_reason=self.failure_reason, status=status,
            timeouts=self.counters.timeouts, max_timeouts=self._timeout_limit(),
            results=tuple(self.unsent[:self._batch()]), leaving=leaving)

    def _batch(self) -> int:
        """How many of the unsent results the next call carries: all, except in a sweep
        run, where one bundle holds each task once and is bounded in bytes
        (:meth:`cluster.node.sweepresults.Outbox.batch`); the rest go with the next.  A
        folder bundle already on the master after a failed call goes again with exactly
        its tasks (the first unsent)."""
        if self.outbox is None:
            return len(self.unsent)
        if self.outstanding is not None:
            return len(self.outstanding.tasks)
        return self.outbox.batch([result.name for result in self.unsent])

    def _contact(self, now: float, leaving: bool = False) -> int | None:
        """One call to the master; returns an exit code when the node must stop."""
        self._settle_background()
        req = self._request(leaving)
        bundle = None
        if self.outbox is not None and req.results:
            try:
                bundle = self._upload_bundle(req)
            except (ClusterError, OSError) as exc:
                log.error("node %s: could not upload the results of %d task(s): %s",
                          self.name, len(req.results), exc)
                return self._failed_call(now, leaving, exc)
            req = dataclasses.replace(req, bundle=bundle.name)
        try:
            reply = self._exchange(protocol.format_request(req))
        except signing.SignatureError as exc:
            # Not from a master holding this run's secret (or altered on the way): nothing
            # of it is acted upon, and it counts as a failed call (retried; in the end the
            # node gives up as for an unreachable master, never with failure -1).
            log.error("node %s: reply from %s:%d refused, nothing of it run: %s", self.name,
                      self.cfg.master_host, self.cfg.port_for(self.priority), exc)
            self._unsent_bundle(bundle)
            return self._failed_call(now, leaving, exc)
        except (OSError, ProtocolError) as exc:
            self._unsent_bundle(bundle)
            return self._failed_call(now, leaving, exc)
        self.consecutive_failures = 0
        sent = len(req.results)
        if sent:
            del self.unsent[:sent]  # the master has them now
            self.first_unsent = self.clock.monotonic()
            if not self.pool.running():
                # Its last results: a CONTINUE now is the start of a new wait (for another
                # node's last job, which may end any moment), not one more of the waits
                # that grew while its own jobs ran.  (A node with jobs running calls again
                # when one ends anyway.)
                self.continue_wait = CONTINUE_FIRST_WAIT
        if bundle is not None and self.outbox is not None:
            self.outbox.sent(bundle)  # and their files
            self.outstanding = None
        self.next_contact = self.clock.monotonic() + self.cfg.poll_interval
        return self._obey(reply)

    def _upload_bundle(self, req: protocol.Request) -> sweepresults.Bundle:
        """Pack the sweep results of ``req`` into a bundle and put it in
        ``runs/<id>/results/incoming/``: as a folder moved there when the transport can
        (the master home on this file system: nothing copied), else as a tar file uploaded
        (the transport renames it into place whole).  A folder bundle left there by a
        failed call is named again as it is.  ClusterError or OSError when that fails:
        the call fails, the results stay."""
        assert self.outbox is not None and self.start is not None
        if self.outstanding is not None:
            return self.outstanding
        names = [result.name for result in req.results]
        where = f"runs/{self.start.id}/{BUNDLE_DIR}"
        if self.folder_bundles:
            bundle = self.outbox.pack_folder(names)
            try:
                moved = self.transport.move_folder(bundle.path, f"{where}/{bundle.name}")
            except BaseException:
                self.outbox.unpack_folder(bundle)
                raise
            if moved:
                return bundle
            self.outbox.unpack_folder(bundle)
            self.folder_bundles = False  # another file system: tar files from now on
            log.info("node %s: the master home is not on this file system; result bundles "
                     "go as tar files", self.name)
        bundle = self.outbox.pack(names)
        try:
            self.transport.upload(bundle.path, f"{where}/{bundle.name}")
        except BaseException:
            self.outbox.discard(bundle)
            raise
        return bundle

    def _unsent_bundle(self, bundle: sweepresults.Bundle | None) -> None:
        """The call carrying ``bundle`` failed: a tar file goes, its results stay unsent
        (the next call packs them into a new bundle); a folder bundle, already moved to
        the master, goes again with the next call."""
        if bundle is None or self.outbox is None:
            return
        if bundle.folder:
            self.outstanding = bundle
        else:
            self.outbox.discard(bundle)

    def _run_ended(self) -> str | None:
        """Why this node's run is over, or None when job.start still names it (or cannot be
        read now).

        Read from the master's job.start through the transport (the master removes it when
        the run ends; the next run writes its own), never from a reply: an unverified reply
        may be anyone's, and must not be able to send nodes away from a run.
        """
        name = suffixed("job.start", self.priority)
        try:
            text = self.transport.read_text(name)
        except TransportError as exc:
            log.warning("node %s: cannot read %s to see whether its run goes on: %s",
                        self.name, name, exc)
            return None
        if text is None:
            return f"{name} is gone from the master (the run has ended)"
        try:
            current = JobStart.parse(text).id
        except ValueError:
            return None  # being rewritten, or damaged: the next failed call looks again
        if self.start is not None and current != self.start.id:
            return f"{name} now describes run {current}"
        return None

    def _failed_call(self, now: float, leaving: bool, exc: Exception) -> int | None:
        """Count a failed call: retry after ``connect_retry_delay``, or give up (exit 3)
        after ``connect_retries`` in a row (at once when leaving).

        Unless the run is over (:meth:`_run_ended`): then leave it at once (exit 0).  That
        is looked at only when the master's machine answered, but not as this run's master
        (a reply that does not verify, or a refused connection): the usual cause is that
        the run ended while this node was cut off, and the port now has another run's
        master (which refuses this run's id unsigned) or none.  Then job.start is cheap to
        read; after a timeout the transport would only wait out its own retries.
        """
        if isinstance(exc, (signing.SignatureError, ConnectionRefusedError)):
            ended = self._run_ended()
            if ended is not None:
                assert self.start is not None
                log.info("node %s: leaving run %s: %s (%d results not sent)", self.name,
                         self.start.id, ended, len(self.unsent))
                self._kill_all()
                return NODE_EXIT_DONE
        self.consecutive_failures += 1
        if leaving or self.consecutive_failures >= self.cfg.connect_retries:
            log.error("node %s: master unreachable after %d tries: %s", self.name,
                      self.consecutive_failures, exc)
            return NODE_EXIT_UNREACHABLE
        log.warning("node %s: call to master failed (%s); retrying in %g s", self.name,
                    exc, self.cfg.connect_retry_delay)
        self.next_contact = now + self.cfg.connect_retry_delay
        return None

    def _exchange(self, data: bytes) -> protocol.Reply:
        """Sign ``data``, send it, and return the reply once its signature verified
        (SignatureError otherwise: no line of it is parsed before)."""
        port = self.cfg.port_for(self.priority)
        nonce = self.nonces.next()
        data = signing.sign_request(data, self.key, nonce)
        with socket.create_connection((self.cfg.master_host, port),
                                      timeout=self.cfg.io_timeout) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(data)
            chunks = []
            while True:
                chunk = sock.recv(262144)
                if not chunk:
                    break
                chunks.append(chunk)
        return protocol.parse_reply(signing.verify_reply(b"".join(chunks), self.key, nonce))

    def _obey(self, reply: protocol.Reply) -> int | None:
        verb = reply.verb
        if verb == protocol.ABORT:
            self._kill_all()
            final = is_final_abort(reply.reason) or self.failure != 0
            log.info("node %s: told ABORT (%s)", self.name, reply.reason or "no reason")
            if self.failure:
                return NODE_EXIT_FAILED
            return NODE_EXIT_DONE if final else NODE_EXIT_ABORTED
        if verb == protocol.BUILD:
            if self.built:
                self.next_contact = 0.0  # already built for this run (master took over)
            elif self.background is None:
                self._start_background("build", self._do_build)
        elif verb == protocol.UPLOAD:
            if self.background is None:
                self._start_background("upload", self._do_upload)
        elif verb == protocol.JOBS:
            # Ask again when half of this batch is used up (at least one job per slot).
            self.low_water = max(self.slots, len(reply.jobs) // 2)
            for line in reply.jobs:
                try:
                    self.queue.append(Job.parse(line))
                except ValueError as exc:
                    # Answer it with an internal error so the run can still complete.
                    name = line.split(" ", 1)[0]
                    log.error("node %s: bad job line from master (%s): %r", self.name, exc,
                              line[:120])
                    if protocol.TEST_ID.fullmatch(name):
                        self._add_result(JobResult(name, ERROR_INTERNAL, 0, 0, 0, "0",
                                                   "unknown", self.name))
            if not reply.jobs:
                self.hungry_after = self.clock.monotonic() + min(self.cfg.poll_interval, 1.0)
            else:
                self.continue_wait = CONTINUE_FIRST_WAIT
        else:  # CONTINUE: nothing new; ask again soon, then less and less often
            self.hungry_after = self.clock.monotonic() + self.continue_wait
            self.continue_wait = min(self.continue_wait * 2, CONTINUE_LONGEST_WAIT,
                                     self.cfg.poll_interval)
        return None

    # ------------------------------------------------------------------ BUILD and UPLOAD
    def _start_background(self, what: str, target: Callable[[], None]) -> None:
        bg = Background(what, threading.Thread(target=self._background_main,
                                               args=(target,), daemon=True))
        self.background = bg
        bg.thread.start()
        self.next_contact = 0.0  # report busy at once

    def _background_main(self, target: Callable[[], None]) -> None:
        bg = self.background
        assert bg is not None
        try:
            target()
        except Exception as exc:  # reported to the master as a failure
            if isinstance(exc, ClusterError):  # expected: the message says it all
                log.error("node %s: %s failed: %s", self.name, bg.what, exc)
            else:
                log.exception("node %s: %s failed", self.name, bg.what)
            bg.error = str(exc) or type(exc).__name__
            bg.exception = exc
        bg.done = True
        bg.ended.set()

    def _settle_background(self) -> None:
        bg = self.background
        if bg is None or not bg.done:
            return
        self.background = None
        if bg.what == "build":
            if isinstance(bg.exception, BuildStopped):
                log.info("node %s: build stopped; leaving the run", self.name)
            elif bg.exception is not None:
                self.failure, self.failure_reason = build_failure(bg.exception)
                self._upload_logs()  # seed 001: the failure logs are uploaded first
            else:
                assert self.start is not None
                self._use_bins(self.start)
                self.built_marker.touch()
                self.built = True
                self._check_programs(self.start.programs)
                self.digests = self._program_digests(self.start)
        elif bg.what == "upload":
            if bg.error:
                self.failure = FAILURE_NETWORK
                self.failure_reason = f"upload failed: {bg.error}"
            else:
                self.failure = 0

    def _use_bins(self, start: JobStart) -> None:
        """Set the job placeholders, ``__bin__`` and ``__baseline__`` to where the builds'
        binaries are (:func:`cluster.node.buildcmd.plan` of each build folder; ``bin``
        before anything is built).  ``__temp__`` is the run's temp folder in a sweep run;
        in any other, each job's own folder, put in by :meth:`_spawn`."""
        subst = {BIN: str(self._bin_dir(self.build_dir, start)),
                 TESTS: str(self.tests), PYTHON: shlex.quote(sys.executable),
                 TREE_DIR: str(self.build_dir)}
        if self.job_dirs is None:
            subst[TEMP] = str(self.temp)
        if self.baseline_dir is not None:
            subst[BASELINE] = str(self._bin_dir(self.baseline_dir, start))
        self.substitutions = tuple(subst.items())
        self.bin_dir = Path(subst[BIN])

    def _bin_dir(self, tree: Path, start: JobStart) -> Path:
        """The binaries' folder of the build in ``tree`` (``tree/bin`` when the tree is not
        there yet or its plan is unreadable: its build failed, or has not run)."""
        try:
            return tree / buildcmd.plan(tree, start, self.slots).bin_dir
        except ValueError:
            return tree / "bin"

    def _build_env(self, out: TextIO) -> dict[str, str]:
        """The environment of the build commands: ours, with ccache when ``build_cache`` is
        set; without ccache installed the build log says so (once) and the build goes on
        without it."""
        env = dict(os.environ)
        cache = self.cfg.build_cache.strip()
        if not cache:
            return env
        ccache = shutil.which("ccache")
        if ccache is None:
            out.write(f"node {self.name}: build_cache is {cache}, but ccache is not installed "
                      "(not on PATH); building without a compiler cache\n")
            return env
        env["CC"] = "ccache gcc"
        env["CCACHE_DIR"] = os.path.abspath(os.path.expanduser(cache))
        out.write(f"node {self.name}: compiler cache {env['CCACHE_DIR']} (CC='ccache gcc', "
                  f"{ccache})\n")
        return env

    def _do_build(self) -> None:
        assert self.start is not None
        with open(self.build_log, "w", encoding="utf-8") as out:
            out.write(f"node {self.name}: building {self.start.source} for run {self.start.id}\n")
            out.flush()
            tidied = workdir.tidy(self.src.parent.parent, self.src.name, self.cfg.build_keep)
            out.writelines(f"node {self.name}: {line}\n" for line in tidied.lines())
            try:
                self.transport.fetch_tree(self.start.tests, self.tests)
                self.transport.fetch_tree(self.start.source, self.src)
                env = self._build_env(out)
                self._build_tree(out, env)
                if self.baseline_dir is not None:
                    self._build_baseline(out, env)
            except TransportError as exc:  # a fetch, of the corpus, the tree or the baseline
                # Into the build log too: it is uploaded, and it is where one looks first.
                out.write(f"node {self.name}: fetch failed: {exc}\n")
                raise

    def _build_tree(self, out: TextIO, env: dict[str, str]) -> None:
        """Bring the run's build folder up to date with the fetched tree and build it there
        (locked: the folder outlives this run, and another run.py of this node may use it)."""
        tree = self.build_dir
        tree.parent.mkdir(parents=True, exist_ok=True)
        with fsutil.flocked(tree.with_name(f".{tree.name}.lock")):
            done = buildtree.overlay(self.src, tree, tree.with_name(f".{tree.name}.manifest"))
            out.write(f"node {self.name}: build folder {tree} updated from {self.src}: "
                      f"{done.written} files written, {done.deleted} deleted\n")
            plan = self._plan(out, tree)
            stale = buildtree.remove_programs(tree / plan.bin_dir, self.src / plan.bin_dir)
            if stale:
                out.write(f"node {self.name}: removed the last build's {' '.join(stale)} "
                          f"from {plan.bin_dir}/ (this build makes them again)\n")
            out.write(f"$ {plan.command}\n")
            self._run_build(out, tree, plan, env, "")

    def _plan(self, out: TextIO, tree: Path) -> BuildPlan:
        """The build of ``tree`` (:func:`cluster.node.buildcmd.plan`), written to the build
        log; BuildFailed (the tree's fault) when its own build script is unusable."""
        assert self.start is not None
        try:
            plan = buildcmd.plan(tree, self.start, self.slots)
        except ValueError as exc:
            out.write(f"node {self.name}: {exc}\n")
            raise BuildFailed(str(exc)) from None
        out.write(f"node {self.name}: {plan.kind} tree, build command from {plan.origin}, "
                  f"binaries in {plan.bin_dir}/\n")
        return plan

    def _build_baseline(self, out: TextIO, env: dict[str, str]) -> None:
        """Fetch the baseline tree and build it, unless the cached build is up to date.

        Locked (flock on ``.<name>.lock``) because the cache outlives this run: another
        run.py of this node must never see a half-copied tree.
        """
        assert self.start is not None and self.baseline_dir is not None
        tree = self.baseline_dir
        mirror = tree.with_name(f".{tree.name}.src")
        stamp = tree.with_name(f".{tree.name}.stamp")
        tree.parent.mkdir(parents=True, exist_ok=True)
        with fsutil.flocked(tree.with_name(f".{tree.name}.lock")):
            out.write(f"node {self.name}: fetching baseline {self.start.baseline} "
                      f"into {mirror}\n")
            out.flush()
            self.transport.fetch_tree(self.start.baseline, mirror)
            plan = self._plan(out, mirror)
            digest = tree_digest(mirror, f"{plan.command} -> {plan.bin_dir}")
            try:
                previous = stamp.read_text(encoding="utf-8").strip()
            except FileNotFoundError:
                previous = ""
            if previous == digest and tree.is_dir():
                out.write(f"baseline {self.start.baseline} unchanged since its last build "
                          f"(digest {digest[:12]}); reusing {tree}\n")
                out.flush()
                return
            stamp.unlink(missing_ok=True)  # a failed build must not look built
            if tree.exists():
                shutil.rmtree(tree)
            # A clean copy: the master's clean tree, built from scratch as the master has it
            # (the reference a bmpcmp run compares with owes nothing to an earlier build).
            shutil.copytree(mirror, tree, symlinks=True)
            out.write(f"baseline {self.start.baseline} changed (digest {digest[:12]}); "
                      f"building in {tree}\n$ {plan.command}\n")
            self._run_build(out, tree, plan, env, f"baseline build {plan.command!r} of "
                                                  f"{self.start.baseline}")
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
        assert self.start is not None
        what = what or repr(plan.command)
        timeout = self.cfg.build_timeout
        out.flush()  # our lines first: the child appends to the same file
        started_at = self.build_log.stat().st_size
        began = time.monotonic()
        done = proc.run(plan.command, shell=True, cwd=cwd, env={**env, **dict(plan.env)},
                        stdout=out, stderr=proc.STDOUT, timeout=timeout, stop=self.stop_flag)
        # The build's wall time, in the log: what a slow or an incremental build cost.
        out.write(f"node {self.name}: build command ended after "
                  f"{time.monotonic() - began:.1f} s\n")
        if done.stopped:
            problem = f"{what} stopped: the node was told to stop; its process tree was killed"
        elif done.timed_out:
            problem = (f"{what} timed out after {timeout:g} s (build_timeout); its process "
                       "tree was killed")
        elif done.returncode > 0:
            problem = f"{what} exited with status {done.returncode}"
        elif done.returncode < 0:
            problem = f"{what} was {proc.describe_status(done.returncode)}"
        else:
            return
        out.write(f"node {self.name}: {problem}\n")
        out.flush()
        if done.stopped:
            raise BuildStopped(problem)
        diagnosis = buildlog.diagnose(_read_from(self.build_log, started_at))
        words = diagnosis.summary()
        reason = f"{problem}: {words}" if words else problem
        # Only a command that ran to its own failure can show the node's fault; a timeout
        # or a kill says nothing about whose it is, and stays the source's (failure -1).
        if diagnosis.local and done.returncode > 0:
            raise BuildCannotRunHere(reason)
        raise BuildFailed(reason)

    def _do_upload(self) -> None:
        self.node_log.flush()
        if self.account is not None:
            # Nothing of a job may change what is uploaded while it is read.
            jobuser.kill_leftovers(self.account)
        self._upload_bmpcmp()
        self._upload_logs(strict=True)

    def _upload_bmpcmp(self) -> None:
        """Upload ``temp/bmpcmp/`` to ``runs/<id>/bmpcmp/`` within BMPCMP_UPLOAD_LIMIT.

        Whole image sets in name order, each set's ``.meta`` last (the master shows a set
        once its ``.meta`` is there).  Once a set would pass the limit, it and every later
        one stay behind and ``DROPPED.<node>`` (one file per node, so nodes never overwrite
        each other's note) lists their files.  Raises ClusterError when an upload fails.
        """
        assert self.start is not None
        folder = self.temp / BMPCMP_DIR
        # A job made this folder and its files: a link to elsewhere is never followed (the
        # node may be root, and a job's link could point at the node's secrets).
        if folder.is_symlink() or not folder.is_dir():
            return
        groups: dict[str, list[Path]] = {}
        for path in sorted(folder.iterdir()):
            # A bmpcmp job killed mid-write leaves a temporary file: never uploaded.
            if (path.is_file() and not path.is_symlink()
                    and not fsutil.TEMP_NAME.fullmatch(path.name)):
                m = SET_FILE.fullmatch(path.name)
                groups.setdefault(m.group("stem") if m else path.name, []).append(path)
        dest = f"runs/{self.start.id}/{BMPCMP_DIR}"
        total = 0
        dropped: list[Path] = []
        for stem in sorted(groups):
            files = sorted(groups[stem], key=lambda p: (p.name.endswith(".meta"), p.name))
            size = sum(p.stat().st_size for p in files)
            if dropped or total + size > BMPCMP_UPLOAD_LIMIT:
                dropped.extend(files)
                continue
            for path in files:
                self.transport.upload(path, f"{dest}/{path.name}")
            total += size
        if dropped:
            note = self.run_dir / f"{DROPPED_NOTE}.{self.name}"
            note.write_text(
                f"# node {self.name}: bmpcmp images past {BMPCMP_UPLOAD_LIMIT} bytes were "
                f"not uploaded ({len(dropped)} file(s))\n"
                + "".join(p.name + "\n" for p in dropped), encoding="utf-8")
            self.transport.upload(note, f"{dest}/{note.name}")
            log.warning("node %s: %d bmpcmp file(s) past the %d-byte limit not uploaded",
                        self.name, len(dropped), BMPCMP_UPLOAD_LIMIT)

    def _upload_logs(self, strict: bool = False) -> None:
        assert self.start is not None
        for path in (self.node_log_path, self.build_log):
            if not path.exists():
                continue
            try:
                self.transport.upload(path, f"runs/{self.start.id}/logs/{path.name}")
            except ClusterError as exc:
                if strict:
                    raise
                log.error("node %s: could not upload %s: %s", self.name, path.name, exc)

    # ------------------------------------------------------------------ running jobs
    def _spawn(self, now: float) -> None:
        pool = self.pool
        while self.queue and pool.free() and not self.failure:
            job = self.queue.popleft()
            command = job.command
            if BIN in command and not self._bins_present(job):
                return
            if self.job_dirs is not None:
                try:
                    folder = self.job_dirs.take(job)
                except OSError as exc:
                    self.queue.appendleft(job)
                    self._cannot_run(f"cannot make a job folder in {self.job_dirs.root}: "
                                     f"{exc}")
                    return
                command = command.replace(TEMP, folder)
            for placeholder, value in self.substitutions:
                command = command.replace(placeholder, value)
            if self.outbox is not None and not self._prepare_task(job):
                return
            if job.command.startswith(SHELL_JOB_START):
                # Its output is hashed by the node: bounded as a sweep task's files are.
                command = with_size_limit(command, self.output_blocks)
            if not pool.start(job, command, now):
                self.queue.appendleft(job)  # a long command waits for an idle slot
                self._release(job)
                break
            self.counters.started += 1

    def _job_temp(self, job: Job) -> str:
        """What ``__temp__`` is in ``job``'s command: its own folder, or in a sweep run the
        run's temp folder."""
        if self.job_dirs is None:
            return str(self.temp)
        return self.job_dirs.folder(job)

    def _release(self, job: Job) -> None:
        """``job``'s folder cleared and free for a later job (:mod:`cluster.node.jobdirs`);
        in a sweep run, what a start of its may have written beside its task folder goes."""
        if self.job_dirs is not None:
            self.job_dirs.release(job)
            return
        base = f"{self.temp}/{job.name}"
        for suffix in (JOB_LOG, JOB_MD5, JOB_OUT):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(base + suffix)

    def _prepare_task(self, job: Job) -> bool:
        """Make the folder of sweep task ``job`` with the sweep folder linked into it
        (:func:`cluster.node.sweepresults.prepare_task`); False when it cannot be made:
        then this node cannot run the run's jobs (:meth:`_cannot_run`) and ``job`` goes
        back unrun."""
        if self.sweep_entries is None:
            # The sweep folder's top-level entries, read once (the build has made it), its
            # files made read-only first.
            try:
                sweepresults.make_read_only(self.build_dir)
                self.sweep_entries = sweepresults.entries(self.build_dir)
            except OSError as exc:
                self.queue.appendleft(job)
                self._cannot_run(f"cannot read the sweep folder {self.build_dir}: {exc}")
                return False
        try:
            sweepresults.prepare_task(self.temp / job.name, self.sweep_entries)
            if self.account is not None:
                jobuser.give_folder(self.temp / job.name, self.account)
        except OSError as exc:
            self.queue.appendleft(job)
            self._cannot_run(f"cannot make the folder of task {job.name}: {exc}")
            return False
        return True

    def _check_programs(self, programs: tuple[str, ...]) -> None:
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
            log.warning("node %s: the build made no %s; telling the master", self.name, where)
            with contextlib.suppress(OSError):
                self.node_log.write(f"node {self.name}: the build made no {where}\n")

    def _program_digests(self, start: JobStart) -> tuple[tuple[str, str], ...]:
        """The build digest of each of ``start``'s programs the build made, with what it
        loads and runs (:func:`cluster.node.builddigest.build_keys`, its file hashes kept
        in ``work_dir/keycache``), none in a sweep run (its jobs are never reused); sets
        :attr:`keychanges` beside them.  A failure to read them is logged and sends none:
        the master then reuses nothing for this node, never a wrong result.  ``start`` is
        passed, not read from ``self.start``: a run.py restarted for a run already built
        takes them while it prepares, before ``self.start`` is set."""
        self.keychanges = ()
        programs = start.programs
        if start.max_result_bytes or not programs:
            return ()
        try:
            keys = builddigest.build_keys(
                self.build_dir, self.bin_dir, programs, run=start.id,
                cache_dir=self.cfg.work_dir.resolve() / builddigest.KEYCACHE,
                environment=self.cfg.reuse_environment, env=_job_environment())
        except (OSError, ValueError) as exc:
            log.warning("node %s: cannot hash the build's programs (%s); the master will "
                        "reuse no result for this node", self.name, exc)
            return ()
        for program, count, parts in keys.keychanges:
            log.info("node %s: %s's key changed in %d part(s): %s", self.name, program,
                     count, ", ".join(parts))
        self.keychanges = keys.keychanges
        return keys.digests

    def _bins_present(self, job: Job) -> bool:
        """Whether every ``__bin__/<name>`` of ``job`` is an executable file of this node's
        build; if not, the node fails (:meth:`_cannot_run`) and ``job`` goes back unrun."""
        for name in _BIN_NAME.findall(job.command):
            if name in self.bins_checked:
                continue
            path = self.bin_dir / name
            if not (path.is_file() and os.access(path, os.X_OK)):
                self.queue.appendleft(job)
                self._cannot_run(f"{path} is missing or not executable (the build did not "
                                 "make it)")
                return False
            self.bins_checked.add(name)
        return True

    def _cannot_run(self, why: str) -> None:
        """Fail this node (:class:`CannotRunJobs`): failure 1, its jobs stop and go back
        to the master's list, and its next call says so at once."""
        if self.failure:
            return
        self.cannot_run = True
        self.failure = FAILURE_NETWORK
        self.failure_reason = f"cannot run jobs: {why}"
        log.error("node %s: %s; failing (its jobs go to other nodes)", self.name,
                  self.failure_reason)
        self._kill_all()
        self.next_contact = 0.0

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
        found = _CANNOT_RUN.search(log_text)
        if found is not None or done.exit_status in CANNOT_RUN_STATUSES:
            what = found.group(0).strip()[:200] if found else f"exit status {done.exit_status}"
            return f"job {done.job.name} could not start its program: {what}"
        tests = f"{self.tests}/"
        if tests in log_text:
            for match in re.finditer(re.escape(tests) + r"[^\s'\"()<>;|&:]+", log_text):
                if not os.path.exists(match.group(0)):
                    return (f"job {done.job.name}: input {match.group(0)} is missing from "
                            "this node's corpus")
        return None

    def _wait(self, timeout: float) -> None:
        """Sleep until a job ends or ``timeout`` passes, collecting what ended."""
        if not self.pool.running():
            timeout = max(min(timeout, 0.5), 0)
            if self.background is not None:
                # A BUILD ends when it ends: go on at that moment, not at the next poll
                # slice (two of them were a tenth of a second before a node's first JOBS).
                self.clock.wait(self.background.ended, timeout)
            else:
                self.clock.sleep(timeout)
            return
        finished = self.pool.wait(timeout)
        self._take_back(self.pool.take_returned())
        if finished:
            # Refill the freed slots before reading the results: reading a result's files
            # costs more than the job itself when jobs are as small as ``echo 17 | md5sum``.
            self._spawn(self.clock.monotonic())
        for done in finished:
            self._finish(done)

    def _take_back(self, jobs: list[Job]) -> None:
        """Jobs a slot handed back unrun (its shell had to go first): first in line again,
        in their order, with anything a start of theirs may have written removed."""
        for job in reversed(jobs):
            self._release(job)
            self.queue.appendleft(job)
            self.counters.started -= 1

    def _stopping(self, done: Finished) -> bool:
        """Whether the node is being stopped.  A job :func:`cut_from_outside` may have been
        signalled a moment before this process (a batch system signals every process of
        its job, in no set order): then the node waits up to :data:`STOP_SETTLE` for its
        own stop signal before the job's end counts as a result (docs/provisioning.md; a
        pilot ended by its time limit reported its cut job as error 10)."""
        if self.stop_flag.is_set() or not cut_from_outside(done):
            return self.stop_flag.is_set()
        deadline = self.clock.monotonic() + STOP_SETTLE
        while not self.stop_flag.is_set() and self.clock.monotonic() < deadline:
            self.clock.sleep(STOP_SETTLE_POLL)
        return self.stop_flag.is_set()

    def _finish(self, done: Finished) -> None:
        try:
            self._collect(done)
        finally:
            self._release(done.job)

    def _collect(self, done: Finished) -> None:
        """What the job that ended as ``done`` left in its folder (or, in a sweep run, the
        run's temp folder), read: its result added, or the node failed."""
        name = done.job.name
        base = f"{self._job_temp(done.job)}/{name}"
        if self._stopping(done):
            # The node is being stopped, and the signal that stops it (a batch system's
            # scancel signals every process of the job) may have cut this job too, even
            # if its shell went on: its result says nothing sure of the test.  None is
            # sent: the job goes back with the node's leaving call.
            log.info("node %s: job %s ended by the node's own stop; given back", self.name,
                     name)
            return
        if self.outbox is not None:
            self._finish_task(done)  # a sweep task's job writes no log (jobs.sweepjobs)
            return
        log_text = _read_and_remove(base + JOB_LOG)
        md5_text = _read_and_remove(base + JOB_MD5)
        limit = self.cfg.max_output_bytes
        digest, size = _md5_and_remove(base + JOB_OUT, limit)
        shell = done.job.command.startswith(SHELL_JOB_START)
        over = size > limit or (shell and done.exit_status == sweepresults.XFSZ_STATUS)
        if over:
            # Stopped by its ulimit, or larger all the same: never hashed, never a result.
            log_text += (f"node {self.name}: {name}'s output is over max_output_bytes "
                         f"({limit} bytes): the job failed, its output not hashed\n")
        elif digest is not None:
            md5_text += f"{digest}  -\n"  # the job's raw output is its result (product shell)
        result = readlog.with_wall_time(
            readlog.classify(name, log_text, md5_text, done.killed, self.name,
                             done.exit_status), done.ended - done.started)
        if over and not done.killed:
            result = dataclasses.replace(result, error=ERROR_READ, md5="0")
        if self.job_dirs is not None and self.baseline_dir is not None:
            self._collect_bmpcmp(self.job_dirs.folder(done.job), name)  # a bmpcmp run
        self.node_log.write(readlog.log_entry(name, log_text, md5_text, done.killed))
        if result.error != ERROR_NONE and not self.cannot_run:
            fault = self._infrastructure_fault(done, log_text)
            if fault is not None:
                # Not a test result: withheld, and the node fails so that the job and the
                # others it holds are run by a node that can.
                self._cannot_run(fault)
        if self.cannot_run:
            return  # this node cannot run jobs: no result of it after that counts
        self.counters.finished += 1
        self._add_result(result)

    def _collect_bmpcmp(self, folder: str, name: str) -> None:
        """The image sets bmpcmp job ``name`` left in ``bmpcmp/`` of its ``folder`` into
        the run's ``temp/bmpcmp/``, where UPLOAD takes them from, after the sets an
        earlier try of the same test left there are removed (as bmpcmp itself does in its
        output folder).  Its temporary files, links and anything else stay behind, for
        the folder's clearing."""
        source = os.path.join(folder, BMPCMP_DIR)
        if not os.path.isdir(source):
            return
        dest = self.temp / BMPCMP_DIR
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
        assert self.outbox is not None
        name = done.job.name
        base = f"{self.temp}/{name}"
        log_text = f"{readlog.SWEEP_PRODUCT}\n"
        # The slot's clock is this node's monotonic one: its start as an epoch time.
        started = self.clock.time() - (self.clock.monotonic() - done.started)
        # A task the node killed (its timeout) brings what it wrote so far, for reading.
        results = self.start.sweep_results if self.start is not None else ()
        task = self.outbox.take(name, Path(base), results, done.exit_status, started,
                                max(done.ended - done.started, 0.0))
        md5_text = "" if task.failed else f"{task.md5}  -\n"
        result = readlog.classify(name, log_text, md5_text, done.killed, self.name,
                                  done.exit_status)
        if task.failed and result.error == ERROR_NONE:
            result = dataclasses.replace(result, error=ERROR_READ, md5="0")
        if task.failed:
            log_text += f"{task.failed}\n"
        self.node_log.write(readlog.log_entry(name, log_text, md5_text, done.killed))
        if self.cannot_run:
            self.outbox.discard_task(task)
            return
        self.counters.finished += 1
        self._add_result(result)

    def _add_result(self, result: JobResult) -> None:
        if not self.unsent:
            self.first_unsent = self.clock.monotonic()
        self.unsent.append(result)

    def _check_timeouts(self, now: float) -> None:
        self.counters.timeouts += self.pool.check_timeouts(now)

    def _timeout_limit(self) -> int:
        return max(self.cfg.max_timeouts, math.ceil(self.counters.started / 100))

    def _too_many_timeouts(self) -> bool:
        # A sweep task's timeout is its own outcome (the sweep's ``timeout``), not a sign
        # that this node is sick: it never fails the node.
        return self.outbox is None and self.counters.timeouts > self._timeout_limit()

    def _kill_all(self) -> None:
        self.pool.kill_all()
        self.queue.clear()
        if self.job_dirs is not None:
            self.job_dirs.release_all()  # none of them runs any more


def node_instance(work_dir: Path) -> str:
    """This node's instance id: 16 hex digits in ``work_dir``/:data:`INSTANCE_FILE`, made
    the first time (atomically: two first starts agree on one).  A damaged file is made
    anew."""
    path = work_dir / INSTANCE_FILE
    try:
        value = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        value = ""
    if protocol.INSTANCE.fullmatch(value):
        return value
    work_dir.mkdir(parents=True, exist_ok=True)
    fresh = os.urandom(8).hex()
    fsutil.atomic_write(path, fresh + "\n")
    return fresh


def is_final_abort(reason: str) -> bool:
    """Whether an ABORT with ``reason`` ends this run for the node for good (clusterpull never
    rejoins it) rather than for now (see :data:`FINAL_ABORTS` and :data:`REJOIN_ABORTS`)."""
    reason = reason.strip()
    if reason in REJOIN_ABORTS:
        return False
    return reason.startswith(FINAL_ABORTS)


def build_key(start: JobStart) -> str:
    """The name of the node's mirror and build folder of ``start``'s source (see the module
    docstring): the same for every run of one tree, so its build is reused.  A run's
    snapshot ``runs/<id>/source/<tree...>`` is keyed by the run's kind, a user run's user
    and the tree; any other source by its path; ``/`` written as ``__``."""
    parts = start.source.strip("/").split("/")
    if len(parts) > 3 and parts[0] == "runs" and parts[2] == "source":
        parts = [start.kind, *([start.ref] if start.kind == "user" else []), *parts[3:]]
    return "__".join(parts)


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


def _job_environment() -> dict[str, str]:
    """The slot shells' environment: ours, with the project first on PYTHONPATH."""
    env = dict(os.environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + old if old else "")
    return env


#: Bytes of a failed build's log read for its error lines at most (its last ones).
BUILD_LOG_READ_LIMIT = 8_000_000


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on (at most its last BUILD_LOG_READ_LIMIT
    bytes; undecodable bytes replaced)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(offset, size - BUILD_LOG_READ_LIMIT, 0))
        return fh.read(BUILD_LOG_READ_LIMIT).decode("utf-8", errors="replace")


def _open_job_file(path: str) -> IO[bytes] | None:
    """A file a job wrote, opened for reading; None when there is none, or when it is a
    link or not a regular file (then it is removed: the node, maybe root, never reads
    through a job's link, which could point at its secrets)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # ELOOP: a link
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return os.fdopen(fd, "rb")


def _read_and_remove(path: str) -> str:
    """The text of a job's file, which is then removed ("" if there is none, or it is not
    a regular file: :func:`_open_job_file`)."""
    fh = _open_job_file(path)
    if fh is None:
        return ""
    with fh:
        data = fh.read()
    os.unlink(path)
    return data.decode("utf-8", errors="replace")


def _md5_and_remove(path: str, limit: int) -> tuple[str | None, int]:
    """The md5 of a job's raw output file and its size; the file is then removed.  (None,
    0) if there is none, or it is not a regular file (:func:`_open_job_file`); (None, its
    size) when it is larger than ``limit`` bytes: such a file (a 10 GB sparse one) is not
    read at all."""
    digest = hashlib.md5(usedforsecurity=False)
    fh = _open_job_file(path)
    if fh is None:
        return None, 0
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= limit:
            # Read at most one byte more than the limit: a writer left running may still
            # be appending.
            size = 0
            while chunk := fh.read(min(1 << 20, limit + 1 - size)):
                digest.update(chunk)
                size += len(chunk)
                if size > limit:
                    break
    os.unlink(path)
    return (digest.hexdigest() if size <= limit else None), size
