"""The supervisor loop: port of runClustermaster.sh (seed 000, ARTIFEX.md §2.6).

Seed 000: runClustermaster.sh "checks to see if another instance ... is already running - if
it is it just exits.  If not it goes into an infinite loop, kicking off clustermaster.pl,
clustermaster1.pl and clustermaster2.pl every 10 seconds."  Every clustermaster invocation
does phase 1 (queue discovery) and then the PID-file dance of phase 2, so starting each
priority's master every tick, even while an earlier one is running a run, is the design: the
extra invocations queue new work and exit.  Ours leaves out those that surely have nothing
to do (below).

:class:`Supervisor` owns the children it starts:

* :meth:`Supervisor.tick` reaps finished children, then starts one process per command;
* :meth:`Supervisor.run` calls ``tick`` every ``interval`` seconds on a drift-corrected
  schedule (tick k is due at ``start + k * interval``; periods missed because a tick ran
  long are skipped, never run in a burst) and reaps between ticks, so no zombie outlives a
  poll slice;
* on stop, running clustermasters are left to finish their run (they are in their own
  sessions, so a terminal's ^C does not reach them either); with ``kill_children`` their
  process groups get SIGTERM -- each then finishes the step it is in or leaves its serving
  loop, removes its PID file and exits, so the next invocation takes its run over at once
  (docs/architecture.md, "Stopping") -- and a second stop request during the grace period
  SIGKILLs them (STYLE guideline 5);
* the clustermasters are started with :func:`cluster.runtime.proc.spawn`, so where the
  supervisor's environment asks for the parent watch (a local cluster's supervisor) they
  get SIGTERM when it dies, however it dies; a supervisor that cron or systemd started
  has no such variable, and its masters outlive it as before.

Idle priorities (docs/deviations.md): with ``idle`` -- run_clustermaster.py passes
:func:`cluster.master.run.idle.surely_idle` -- neither a tick nor a wake starts the
command of a priority that a few stat calls show has nothing to do: nothing phase 1 could
find, and either a live master holds its PID file (the invocation would exit busy) or
nothing is queued, no PID file exists and no run end waits to be finished.  Such an
invocation would only have started Python, found nothing and exited: three every 10 s
were what a cluster at rest cost its master machine, and during a run the idle
priorities' copies, and the busy priority's, took CPU time from the jobs.  A priority
with anything that might be work is started as before.

Publishing the node code: with ``on_tick`` -- run_clustermaster.py passes a
:class:`NodeCodePublisher` -- each tick makes the home's ``node-code/`` match the
node side of the repo this master runs from (:func:`cluster.node.code.publish`: ~12 ms of
stat calls when nothing changed; each published copy is hashed at the supervisor's start and
again whenever its stat, ctime included, changed, so a tamper is undone at the next tick),
so a change to a node-side module on the master reaches the nodes at their next clusterpull
cycle, and the run a tick starts runs the code published at that tick: with ``tick_lock``
(run_clustermaster.py passes ``<home>/node-code.lock``) the publish runs right after the
tick's starts, under the lock, while the clustermasters start Python, and each waits for the
lock before it announces a run (:mod:`cluster.master.files.codelock`).  It runs at the
first tick (the supervisor's start) and every ``interval`` after; a failure is logged and
the tick goes on.  The first publish into a new home copies the node side's bytecode from
the bytecode cache (:mod:`cluster.node.bytecodecache`) rather than compiling it, except the
first time on a machine.

Periodic hooks (docs/provisioning.md): each ``(interval, hook)`` of ``periodic`` --
run_clustermaster.py passes the resource file's writer
(:class:`cluster.master.files.resources.ResourceWriter`) every ``resource_interval`` -- runs at
the first tick and then whenever ``interval`` seconds have passed, checked every ``poll``,
between ticks too; a failure is logged and the loop goes on.  Periods missed (a long tick)
are skipped, never run in a burst.

Signal handlers (:func:`install_signal_handlers`) only record the request in a
:class:`StopFlag`; the loop sees it within ``poll`` seconds.  The single-instance lock is
the caller's business (see :mod:`cluster.cli.run_clustermaster`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cluster.config import DEFAULTS
from cluster.master.files import codelock
from cluster.node import code
from cluster.runtime import proc
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.proc import describe_status
from cluster.runtime.service import STOP_POLL, StopFlag, StopSignal, drain

logger = logging.getLogger("cluster.supervisor")

#: With kill_children: how long to wait for SIGTERMed clustermasters to exit [seconds].
DEFAULT_KILL_GRACE = 30.0
#: With kill_children: the first wait before looking whether they exited [seconds]; each
#: later one doubles, up to the loop's poll.
KILL_FIRST_LOOK = 0.002
#: At most this many copies of one clustermaster alive at once: the one running a run,
#: and one more doing phase 1 and the PID-file check (which is how a hung run is found).
MAX_ALIVE_PER_COMMAND = 2
#: Warn when a copy that is not the runner has been alive this long (a hung phase 1?) [s].
HANG_WARNING = 60.0
#: A wake waits at most this long for a copy of its command started that recently to claim
#: its priority's work (see Supervisor) [seconds]; a slower phase 1 is judged as before.
WAKE_WAIT = 5.0


@dataclass
class Child:
    """A process started by the supervisor and not reaped yet."""

    proc: subprocess.Popen[bytes]
    command: tuple[str, ...]
    started: float  # monotonic

    @property
    def pid(self) -> int:
        return self.proc.pid


class Supervisor:
    """Starts every command each tick and keeps its children reaped.

    Callers use :meth:`run` (the daemon) or :meth:`initialize` / :meth:`tick` /
    :meth:`shutdown` (tests and ``--once``).  ``commands`` are argv lists, one per priority,
    e.g. ``[[sys.executable, "clustermaster.py", "--home", h], ...]``.  Children write their
    stdout and stderr to ``log_path`` (appended, shared) or to /dev/null.

    ``wakeup``, if given, is asked every ``poll`` seconds between ticks which commands have
    new work (their indexes); those are started at once instead of at the next tick, so a
    run starts within a poll of being queued however long the interval.  It must be cheap
    (a few stat calls): it runs in the supervisor's own loop.

    ``idle``, if given, is asked at each tick for each command's index, and for each index
    ``wakeup`` gives, whether that command would surely find nothing to do; such a command
    is not started then.  It must be cheap too; if it raises, the command is started.

    ``claimed``, if given, says whether command ``index``'s work is claimed (its PID file
    exists: a copy has passed phase 1 and holds the priority).  A wake for a command of which
    a copy started less than :data:`WAKE_WAIT` seconds ago is still alive waits while the work
    is not claimed: that copy is in its phase 1 and will queue what woke it, as the first
    tick's clustermaster queues the push that started a local cluster (its queueing is the
    very change the watcher reports).  Once it is claimed, or the copy ended, or the wait is
    over, the wake is judged by ``idle`` as any other.  Without it, each such wake started a
    second copy that found the first busy and exited: a Python start on the path to the run.

    ``interval`` defaults to the configuration's ``supervisor_interval`` (seed 000: "every
    10 seconds"), ``poll`` to :data:`cluster.runtime.service.STOP_POLL`.
    """

    def __init__(self, commands: Sequence[Sequence[str]], *, clock: Clock | None = None,
                 interval: float = DEFAULTS.supervisor_interval, log_path: Path | None = None,
                 kill_children: bool = False, kill_grace: float = DEFAULT_KILL_GRACE,
                 poll: float = STOP_POLL, cwd: Path | None = None,
                 env: dict[str, str] | None = None,
                 wakeup: Callable[[], Iterable[int]] | None = None,
                 on_tick: Callable[[], object] | None = None,
                 idle: Callable[[int], bool] | None = None,
                 claimed: Callable[[int], bool] | None = None,
                 tick_lock: Path | None = None,
                 periodic: Sequence[tuple[float, Callable[[], object]]] = ()) -> None:
        if interval <= 0:
            raise ValueError(f"supervisor interval {interval!r}: expected seconds > 0")
        if poll <= 0:
            raise ValueError(f"supervisor poll {poll!r}: expected seconds > 0")
        self.commands = [tuple(c) for c in commands]
        self.clock: Clock = clock or SystemClock()
        self.interval = interval
        self.log_path = log_path
        self.kill_children = kill_children
        self.kill_grace = kill_grace
        self.poll = poll
        self.cwd = cwd
        self.env = env
        self.wakeup = wakeup
        self.on_tick = on_tick
        self.idle = idle
        self.claimed = claimed
        self.tick_lock = tick_lock
        #: Commands woken and not judged yet (waiting for a young copy's phase 1).
        self.waking: set[int] = set()
        for every, _ in periodic:
            if not every > 0:
                raise ValueError(f"periodic hook interval {every!r}: expected seconds > 0")
        self.periodic = [Periodic(every, hook) for every, hook in periodic]
        self.children: list[Child] = []
        self.ticks = 0
        self.last_tick: float | None = None
        self._log: IO[bytes] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def initialize(self) -> None:
        """Open the children's log file (appending); idempotent."""
        if self._log is None and self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # closed in shutdown()

    def tick(self, now: float) -> None:
        """One step: reap what finished, start every command once (except those ``idle``
        says have nothing to do), run ``on_tick`` and the periodic hooks that are due.

        With ``tick_lock`` the lock is held from before the starts until the hooks returned,
        so their work (the node code's publish, the resource file) overlaps the new
        clustermasters' start and still ends before any of them announces a run
        (:mod:`cluster.master.files.codelock`), and so before one writes its own resource file.
        Without it, or when it cannot be taken (logged), the hooks run before the starts.
        ``now`` is the monotonic time the tick is for.  A command that cannot be started is
        logged and the others are still started.
        """
        self.ticks += 1
        self.last_tick = now
        self.reap()
        with contextlib.ExitStack() as held:
            locked = self._hold_tick_lock(held)
            if not locked:
                self._run_tick_hooks(now)
            self._start_all(now)
            if locked:
                self._run_tick_hooks(now)

    def _run_tick_hooks(self, now: float) -> None:
        """``on_tick``, then the periodic hooks that are due."""
        self._run_on_tick()
        self.run_periodic(now)

    def _hold_tick_lock(self, stack: contextlib.ExitStack) -> bool:
        """Take ``tick_lock`` into ``stack``; False without one or when it cannot be taken
        (logged: then the hooks run before the starts, as they did before the lock)."""
        if self.tick_lock is None:
            return False
        try:
            stack.enter_context(codelock.publishing(self.tick_lock))
        except OSError as exc:
            logger.error("cannot lock %s (%s); publishing before the starts",
                         self.tick_lock, exc)
            return False
        return True

    def _run_on_tick(self) -> None:
        if self.on_tick is not None:
            try:
                self.on_tick()
            except Exception:  # its own business; the clustermasters must still start
                logger.exception("the per-tick hook failed")

    def _start_all(self, now: float) -> None:
        for index, command in enumerate(self.commands):
            if not self._is_idle(index):
                self._start(command, now)

    def _is_idle(self, index: int) -> bool:
        """Whether ``idle`` says command ``index`` has nothing to do (False without it, or
        when it fails: then the command is started, as it always was)."""
        if self.idle is None:
            return False
        try:
            idle = self.idle(index)
        except Exception:  # its own business; starting the command is always safe
            logger.exception("the idle check of %s failed", _short(self.commands[index]))
            return False
        if idle:
            logger.debug("not starting %s: nothing to do", _short(self.commands[index]))
        return idle

    def run_periodic(self, now: float) -> None:
        """Run each periodic hook that is due at monotonic time ``now``."""
        for job in self.periodic:
            if job.due is not None and now < job.due:
                continue
            # The next one an interval on; one that came a period late or more counts
            # from now, so missed periods are skipped, not run in a burst.
            nxt = now + job.every if job.due is None else job.due + job.every
            job.due = nxt if nxt > now else now + job.every
            try:
                job.hook()
            except Exception:  # its own business; the loop must go on
                logger.exception("the periodic hook %r failed", job.hook)

    def reap(self) -> int:
        """Collect every finished child (no zombies); return how many were reaped."""
        reaped = 0
        alive: list[Child] = []
        for child in self.children:
            code = child.proc.poll()
            if code is None:
                alive.append(child)
                continue
            reaped += 1
            level = logging.DEBUG if code == 0 else logging.WARNING
            logger.log(level, "pid %d (%s) ended: %s", child.pid, _short(child.command),
                       describe_status(code))
        self.children = alive
        return reaped

    def shutdown(self, stop: StopSignal | None = None) -> None:
        """Stop supervising: reap, kill the children if asked, close the log."""
        try:
            self.reap()
            if self.children and self.kill_children:
                self._kill_all(stop)
            if self.children:
                logger.info("leaving %d clustermaster(s) running to finish their run: %s",
                            len(self.children), " ".join(str(c.pid) for c in self.children))
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def run(self, stop: StopSignal) -> None:
        """Tick every ``interval`` seconds until ``stop.is_set()``; shut down in any case."""
        self.initialize()
        logger.info("supervising %d command(s) every %gs", len(self.commands), self.interval)
        # A stop ends the wait at once where the flag has a wakeup fd: a local cluster's
        # exit waits for the supervisor's.
        wakeup: int | None = getattr(stop, "wakeup_fd", None)
        try:
            due = self.clock.monotonic()
            while not stop.is_set():
                now = self.clock.monotonic()
                if now >= due:
                    self.tick(now)
                    due = self._next_due(due, self.clock.monotonic())
                    continue
                self.reap()  # the per-iteration housekeeping hook (STYLE guideline 4)
                if self.wakeup is not None:
                    self.waking.update(self.wakeup())
                self._judge_wakes(now)
                self.run_periodic(now)
                if self.clock.wait_readable(wakeup, min(self.poll, due - now)) \
                        and wakeup is not None:
                    drain(wakeup)
            logger.info("stop requested%s; supervisor stopping",
                        _signal_text(getattr(stop, "signum", None)))
        finally:
            self.shutdown(stop)

    # --- internals -------------------------------------------------------------------------
    def _judge_wakes(self, now: float) -> None:
        """Start each woken command that ``idle`` does not call idle, except those whose
        young copy has not claimed the work yet (they stay in :attr:`waking`)."""
        for index in sorted(self.waking):
            if self._unclaimed_young_copy(index, now):
                continue
            self.waking.discard(index)
            if not self._is_idle(index):
                self._start(self.commands[index], now)

    def _unclaimed_young_copy(self, index: int, now: float) -> bool:
        """Whether a copy of command ``index`` started less than :data:`WAKE_WAIT` ago is
        alive and ``claimed`` says its work is not claimed yet."""
        if self.claimed is None:
            return False
        command = self.commands[index]
        if not any(c.command == command and now - c.started < WAKE_WAIT
                   and c.proc.poll() is None for c in self.children):
            return False
        try:
            return not self.claimed(index)
        except Exception:  # its own business; judging the wake at once is always safe
            logger.exception("the claim check of %s failed", _short(command))
            return False

    def _next_due(self, due: float, now: float) -> float:
        """The tick after the one due at ``due``, skipping periods already missed."""
        nxt = due + self.interval
        if now > nxt:
            missed = math.ceil((now - nxt) / self.interval)
            logger.warning("tick ran %.1fs, past %d period(s) of %gs; skipping them",
                           now - due, missed, self.interval)
            nxt += missed * self.interval
        return nxt

    def _start(self, command: tuple[str, ...], now: float) -> None:
        same = sum(1 for c in self.children if c.command == command)
        if same >= MAX_ALIVE_PER_COMMAND:
            # One copy runs a run (it lives for the whole run), one more is enough to
            # check the PID file and scan for new work.  More would only pile up on a
            # loaded machine and make it slower still.
            youngest = max(c.started for c in self.children if c.command == command)
            if now - youngest >= HANG_WARNING:
                logger.warning("not starting %s: %d copies alive, the younger for %.0f s; "
                               "is phase 1 hanging?", _short(command), same, now - youngest)
            else:
                logger.debug("not starting %s: %d copies alive", _short(command), same)
            return
        out: IO[bytes] | int = self._log if self._log is not None else proc.DEVNULL
        try:
            # Own session (spawn's contract): a ^C or SIGHUP aimed at the supervisor's
            # terminal does not cut a run short, and --kill-children can signal the
            # master's whole tree.
            child = proc.spawn(command, stdout=out, stderr=out, cwd=self.cwd, env=self.env)
        except proc.ProcessError as exc:
            logger.error("%s", exc)
            return
        self.children.append(Child(child, command, now))
        logger.debug("started pid %d: %s", child.pid, _short(command))

    def _kill_all(self, stop: StopSignal | None) -> None:
        """SIGTERM every child's process group; SIGKILL on a hard stop; wait out the grace.

        The looks at the children start 2 ms apart and double up to ``poll``: a
        clustermaster told to stop usually ends within milliseconds (or had already ended:
        a local cluster is stopped right after its run), and a whole poll slice was most of
        the supervisor's stop.
        """
        logger.info("sending SIGTERM to %d clustermaster(s)", len(self.children))
        self._signal_all(signal.SIGTERM)
        deadline = self.clock.monotonic() + self.kill_grace
        killed = False
        look = KILL_FIRST_LOOK
        self.reap()
        while self.children and self.clock.monotonic() < deadline:
            if not killed and isinstance(stop, StopFlag) and stop.hard:
                logger.warning("second stop request: sending SIGKILL to %d clustermaster(s)",
                               len(self.children))
                self._signal_all(signal.SIGKILL)
                killed = True
            self.clock.sleep(min(look, self.poll, max(0.0, deadline - self.clock.monotonic())))
            look *= 2
            self.reap()
        if self.children:
            logger.warning("%d clustermaster(s) still running %gs after SIGTERM: %s",
                           len(self.children), self.kill_grace,
                           " ".join(str(c.pid) for c in self.children))

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            # Only unreaped children are listed, so the pid (= the group id, own session)
            # cannot have been recycled.
            if child.proc.returncode is not None:
                continue
            proc.kill_tree(child.pid, signum)


@dataclass
class Periodic:
    """A hook run every ``every`` seconds; ``due``: when next (monotonic), None: at once."""

    every: float
    hook: Callable[[], object]
    due: float | None = None


class NodeCodePublisher:
    """Calling it publishes ``repo_root``'s node code into ``dest`` (the home's
    ``node-code/``); a failure is logged (once per distinct message, then again when it
    changes or clears) and never raised.  Returns whether anything changed."""

    def __init__(self, repo_root: Path, dest: Path) -> None:
        self.repo_root = repo_root
        self.dest = dest
        self.last_error = ""

    def __call__(self) -> bool:
        try:
            changed = code.publish(self.repo_root, self.dest)
        except (code.NodeCodeError, OSError) as exc:
            if str(exc) != self.last_error:
                logger.error("cannot publish the node code into %s: %s", self.dest, exc)
            self.last_error = str(exc)
            return False
        if self.last_error:
            logger.info("node code published into %s again", self.dest)
            self.last_error = ""
        return changed


def _short(command: Sequence[str]) -> str:
    """A command for log lines: the script rather than the interpreter."""
    words = list(command)
    if len(words) > 1 and Path(words[0]).name.startswith("python"):
        words = words[1:]
    text = " ".join(words)
    return text if len(text) <= 120 else text[:117] + "..."


def _signal_text(signum: int | None) -> str:
    if signum is None:
        return ""
    try:
        return f" ({signal.Signals(signum).name})"
    except ValueError:
        return f" (signal {signum})"
