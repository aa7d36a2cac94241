"""The node's job slots: one persistent ``/bin/sh`` per slot, fed one job at a time.

Why not spawn a shell per job: the node is one Python process, and ``posix_spawn`` blocks
it until the child has exec'ed -- about half a millisecond on a busy machine, which for jobs
as small as ``echo 17 | md5sum`` is a third of the job.  A slot's shell instead receives
each job as one line on its stdin and runs it in a subshell (a fork, no exec)::

    ( eval '<command>' ) </dev/null & p=$!; echo "S $p" >&3; wait $p; echo "E $?" >&3

* ``eval`` of a quoted string: a command with a syntax error fails alone (status 2) instead
  of desynchronising the shell's input;
* the subshell keeps one job's ``cd``, variables and ``exit`` from leaking into the next;
* ``S <pid>`` tells the node which process tree to kill on a timeout, ``E <status>`` that
  the job ended and how.

A slot holds up to :data:`DEPTH` jobs: the one its shell runs and the next, already in its
input, so the shell starts the next the moment one ends instead of waiting for the node to
notice (on a busy machine the node's turn can come a millisecond later, as long as the
whole job when jobs are as small as ``echo 17 | md5sum``).  A job's timeout runs from
when it starts: when it was sent to an idle slot, or when the job before it ended.  It is
the pool's, or the job's own when that is shorter (``Job.timeout``: docs/results.md,
"Timeouts that fit each test"; :meth:`SlotPool.limit_of`).  A job
still waiting in a shell's input when that shell has to go (its running job timed out,
or the shell died) never ran: it is handed back (:meth:`SlotPool.take_returned`) for the
node to run again.  A command longer than ``PIPE_BUF`` is only sent to an idle slot, so
writing it can never block the node behind a running job.

Why the shells are started here with ``os.posix_spawn`` and not through
:mod:`cluster.runtime.proc`: ``proc.run`` runs a command to its end, and ``proc.spawn`` gives
a child with stdin at ``/dev/null``; a slot shell instead lives for the whole run, reads job
lines on its stdin and writes its events on a fourth descriptor (3), which neither offers.
It does keep proc's rules: its own session (``setsid``), and its group killed as a whole
with :func:`cluster.runtime.proc.kill_tree`.

A pool given a job account (:mod:`cluster.node.jobuser`: the node runs as root) starts its
shells through :mod:`subprocess` instead, which can change the uid before the exec
(posix_spawn cannot): as that account, umask 077, ``HOME``, ``TMPDIR`` and the working
directory a folder of the slot's own, made afresh for each shell and removed with it; the
same shell otherwise (:func:`_spawn_shell_as`).  That costs a fork per shell, not per job.

A timed-out job gets SIGHUP to its whole process tree (run.pl's ``ps -ef`` walk, here
psutil), then after ``kill_grace`` SIGKILL to the slot's whole process group, which also
catches anything re-parented; the slot then gets a fresh shell.  If the job ends on the
SIGHUP, the group is killed at once all the same: a descendant may ignore HUP.  A shell
that dies on its own ends its job as an internal error and is replaced.

The shells start with SIGXFSZ at its default action (Python ignores it, and children
inherit that): a command past a file-size limit (a sweep task's ``ulimit -f``) is stopped
by the signal instead of going on with failed writes.  SIGPIPE stays as Python leaves it,
as the jobs have always run.

Each slot's shell has its number, 1-based, in ``CLUSTER_SLOT`` (:data:`SLOT_VARIABLE`),
so a job knows which slot runs it (a sweep's ``{%}``).

A job the master withdraws (its result came from another node: docs/results.md,
"Withdrawn copies") is stopped at once, not after ``kill_grace``: the slot's whole group is
killed with SIGKILL and a fresh shell takes the slot (:meth:`SlotPool.withdraw`); a job
behind it in the shell's input never ran and is handed back.  One withdrawn while it waits
in a shell's input behind another job is killed the moment it starts.  Either way it ends
as :attr:`Finished.withdrawn`.

Callers use :meth:`SlotPool.start`, :meth:`SlotPool.wait`, :meth:`SlotPool.take_returned`,
:meth:`SlotPool.check_timeouts`, :meth:`SlotPool.withdraw`, :meth:`SlotPool.kill_all` and
:meth:`SlotPool.close`.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from cluster.node import jobuser
from cluster.node.jobuser import JobAccount
from cluster.records import Job
from cluster.runtime import proc

log = logging.getLogger("cluster.slots")

_RUNNER = '( eval {cmd} ) </dev/null & p=$!; echo "S $p" >&3; wait $p; echo "E $?" >&3\n'

#: ``ulimit -f`` counts blocks of this many bytes (POSIX; dash, and bash as ``sh``).
ULIMIT_BLOCK = 512


def size_limit_blocks(max_bytes: int) -> int:
    """The ``ulimit -f`` that bounds a job's files by ``max_bytes``: the fewest 512-byte
    blocks more than ``max_bytes``, so a file stopped at the limit is always larger than
    ``max_bytes`` (and so failed by its size, whatever the writer's exit status), while a
    file of exactly ``max_bytes`` is allowed.  The one rule: a sweep task's limit
    (:mod:`cluster.jobs.sweepjobs`) is this too."""
    if max_bytes < 0:
        raise ValueError(f"a file-size limit of {max_bytes} bytes: expected 0 or more")
    return max_bytes // ULIMIT_BLOCK + 1


def with_size_limit(command: str, blocks: int) -> str:
    """``command`` run under ``ulimit -f blocks`` (:func:`size_limit_blocks`): a shell
    built-in, so no program is started; it holds for the job's subshell and every process
    it starts, and one writing past it is stopped by SIGXFSZ (the slot shells leave that
    signal at its default).  A node whose own hard limit is lower keeps its own: the
    ``ulimit`` fails (its complaint goes to the slot shell's stderr, ``/dev/null``) and
    the command runs all the same, bounded by that one."""
    return f"ulimit -f {blocks} ; {command}"


#: Jobs a slot holds at once: the one its shell runs and the next one in its input.
DEPTH = 2
#: The environment variable holding a slot's number, 1-based, in its shell and so in every
#: job it runs (a sweep's ``{%}`` is ``${CLUSTER_SLOT}``: cluster.sweep.expand).  A slot
#: replaced after a timeout keeps its number.
SLOT_VARIABLE = "CLUSTER_SLOT"


@dataclass(frozen=True)
class Finished:
    """A job that ended: its exit status (None if its shell died), whether we killed it,
    and when it ``started`` and ``ended`` on the pool's clock, as the node knows them (a
    job started when it was sent to an idle slot, or when the one before it ended; it
    ended when the node read its end)."""

    job: Job
    exit_status: int | None
    killed: bool
    started: float = 0.0
    ended: float = 0.0
    #: Stopped because the master withdrew it (:meth:`SlotPool.withdraw`): no result.
    withdrawn: bool = False


class Slot:
    """One persistent shell and the jobs sent to it (``sent``: the first runs, or is about
    to; the others wait in the shell's input).

    With ``account`` (:mod:`cluster.node.jobuser`) the shell runs as that account, in its
    own folder ``homes/slot<n>`` (made here, the account's, 0700; ``HOME``, ``TMPDIR`` and
    the working directory; removed by :meth:`close`)."""

    def __init__(self, index: int, env: Mapping[str, str],
                 account: JobAccount | None = None, homes: Path | None = None) -> None:
        self.index = index
        # Its number, 1-based, for the jobs it runs (a sweep's {%}: cluster.sweep.expand).
        env = {**env, SLOT_VARIABLE: str(index + 1)}
        self.home: Path | None = None
        self.child: subprocess.Popen[bytes] | None = None  # the shell, when run as account
        cmd_r, cmd_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            if account is None:
                self.pid = _spawn_shell(env, cmd_r, status_w)
            else:
                if homes is None:
                    raise ValueError("a slot run as a job account needs its homes folder")
                self.home = homes / f"slot{index + 1}"
                jobuser.remove_folder(self.home)  # a fresh one: nothing of an earlier job
                jobuser.give_folder(self.home, account)
                env = {**env, "HOME": str(self.home), "TMPDIR": str(self.home)}
                self.child = _spawn_shell_as(account, self.home, env, cmd_r, status_w)
                self.pid = self.child.pid
                os.write(cmd_w, _ACCOUNT_PRELUDE)  # an empty pipe: never blocks
        except BaseException:
            os.close(cmd_w)
            os.close(status_r)
            raise
        finally:
            os.close(cmd_r)
            os.close(status_w)
        self.cmd_fd = cmd_w
        self.status_fd = status_r
        os.set_blocking(status_r, False)
        self.buf = b""
        self.sent: deque[Job] = deque()
        # Of the first job in ``sent``: its process (from "S"), when it started, its
        # deadline, when HUP was sent.
        self.job_pid = 0
        self.started = 0.0
        self.deadline = 0.0
        self.hup_sent = 0.0

    @property
    def job(self) -> Job | None:
        """The job the shell runs (or is about to), None when the slot is idle."""
        return self.sent[0] if self.sent else None

    @staticmethod
    def runner(command: str) -> bytes:
        """The line a slot's shell is given to run ``command``."""
        return _RUNNER.format(cmd=shlex.quote(command)).encode()

    def send(self, job: Job, line: bytes, now: float, limit: float) -> None:
        """Give the shell ``line`` (see :meth:`runner`) for ``job``, whose timeout is
        ``limit`` seconds; if the slot was idle the job starts ``now``, else when the one
        before ends.  BrokenPipeError if the shell has gone (nothing is then recorded)."""
        view = memoryview(line)
        while view:  # a pipe takes 64 KiB at once; longer commands need more writes
            view = view[os.write(self.cmd_fd, view):]
        self.sent.append(job)
        if len(self.sent) == 1:
            self._next(now, limit)

    def _next(self, now: float, limit: float) -> None:
        """The first job in ``sent`` changed: it started ``now`` and may run ``limit``
        seconds."""
        self.job_pid = 0
        self.started = now
        self.deadline = now + limit
        self.hup_sent = 0.0

    def read_events(self) -> tuple[list[bytes], bool]:
        """Complete lines the shell wrote, and whether it has gone (EOF)."""
        gone = False
        while True:
            try:
                chunk = os.read(self.status_fd, 4096)
            except BlockingIOError:
                break
            if not chunk:
                gone = True
                break
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return lines, gone

    def kill_group(self, sig: int) -> None:
        proc.kill_tree(self.pid, sig)

    def close(self) -> None:
        for fd in (self.cmd_fd, self.status_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.kill_group(signal.SIGKILL)
        if self.child is not None:
            self.child.wait()
        else:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        if self.home is not None:
            jobuser.remove_folder(self.home)


#: The first line a slot shell started as a job account reads: SIGPIPE ignored again
#: (subprocess restores its default, posix_spawn leaves Python's "ignored", and the jobs
#: have always run with it ignored), the status pipe (its stdout) moved to descriptor 3 and
#: stdout to /dev/null: the same shell :func:`_spawn_shell` starts.
_ACCOUNT_PRELUDE = b"trap '' PIPE; exec 3>&1 >/dev/null\n"


def _spawn_shell(env: Mapping[str, str], cmd_r: int, status_w: int) -> int:
    """A slot shell as the node's own account: its pid."""
    # SIGXFSZ back to its default (Python ignores it, and an ignored signal stays ignored
    # in every child): a sweep task's file-size limit stops its writer.
    return os.posix_spawn("/bin/sh", ["sh", "-s"], env, setsid=True,
                          setsigdef=(signal.SIGXFSZ,), file_actions=[
        (os.POSIX_SPAWN_DUP2, cmd_r, 0),
        (os.POSIX_SPAWN_DUP2, status_w, 3),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
    ])


def _spawn_shell_as(account: JobAccount, home: Path, env: Mapping[str, str], cmd_r: int,
                    status_w: int) -> subprocess.Popen[bytes]:
    """A slot shell as ``account`` in ``home``.

    posix_spawn cannot change the uid, so subprocess starts it (setgroups, setgid, setuid
    and umask 077 in the child: :meth:`JobAccount.popen_args`), with its own session and
    SIGXFSZ at its default (``restore_signals``, which resets SIGPIPE too: the prelude
    ignores it again).  The status pipe arrives as stdout; :data:`_ACCOUNT_PRELUDE`,
    written before any job, moves it to descriptor 3.
    """
    child = subprocess.Popen(["/bin/sh", "-s"], stdin=cmd_r, stdout=status_w,
                             stderr=subprocess.DEVNULL, env=dict(env), cwd=home,
                             start_new_session=True, restore_signals=True, close_fds=True,
                             **account.popen_args())
    return child


class SlotPool:
    """``count`` slots running jobs with a per-job timeout.  ``clock`` times the jobs (the
    caller's clock: the ``now`` it passes to :meth:`start` and :meth:`check_timeouts`).
    With ``account`` every slot's shell runs as that account, its own folder in ``homes``
    (:class:`Slot`)."""

    def __init__(self, count: int, env: Mapping[str, str], timeout: float,
                 kill_grace: float, clock: Callable[[], float] = time.monotonic, *,
                 account: JobAccount | None = None, homes: Path | None = None) -> None:
        self.env = dict(env)
        self.timeout = timeout
        self.kill_grace = kill_grace
        self.clock = clock
        self.account = account
        self.homes = homes
        self.slots = [self._new_slot(i) for i in range(count)]
        self.by_fd = {s.status_fd: s for s in self.slots}
        self.returned: list[Job] = []
        #: Withdrawn jobs waiting in a shell's input behind another: killed as they start.
        self.doomed: set[str] = set()

    def limit_of(self, job: Job) -> float:
        """How long ``job`` may run: its own timeout when it has one shorter than the
        pool's, else the pool's (a job's own timeout never lengthens the node's limit)."""
        return min(job.timeout, self.timeout) if job.timeout > 0 else self.timeout

    def _new_slot(self, index: int) -> Slot:
        return Slot(index, self.env, self.account, self.homes)

    def free(self) -> int:
        """How many more jobs the slots take now (up to :data:`DEPTH` each)."""
        return sum(DEPTH - len(s.sent) for s in self.slots)

    def running(self) -> int:
        """Jobs sent to the slots that have not ended (running, or next in a shell)."""
        return sum(len(s.sent) for s in self.slots)

    def start(self, job: Job, command: str, now: float) -> bool:
        """Send ``job`` (its command already substituted) to the least busy slot; False
        (nothing sent) when no slot can take it now: all are full, or the command is too
        long to wait in a busy shell's input and no slot is idle."""
        line = Slot.runner(command)
        candidates = [s for s in self.slots if len(s.sent) < DEPTH
                      and (not s.sent or len(line) <= select.PIPE_BUF)]
        if not candidates:
            return False
        for slot in sorted(candidates, key=lambda s: len(s.sent)):
            try:
                slot.send(job, line, now, self.limit_of(job))
                return True
            except BrokenPipeError:
                if slot.sent:
                    continue  # died running a job: wait() sees its end and retires it
                self._replace(slot)  # died while idle: a fresh shell, and try again
                self.slots[slot.index].send(job, line, now, self.limit_of(job))
                return True
        return False

    def next_deadline(self) -> float | None:
        times = [s.deadline if not s.hup_sent else s.hup_sent + self.kill_grace
                 for s in self.slots if s.sent]
        return min(times) if times else None

    def wait(self, timeout: float) -> list[Finished]:
        """Wait up to ``timeout`` seconds for jobs to end; return those that ended.  Jobs
        that were waiting in a shell that had to go are then in :meth:`take_returned`."""
        busy = [s.status_fd for s in self.slots if s.sent]
        if not busy:
            return []
        ready, _, _ = select.select(busy, [], [], max(timeout, 0.0))
        done: list[Finished] = []
        now = self.clock()
        for fd in ready:
            slot = self.by_fd[fd]
            lines, gone = slot.read_events()
            head_ended = False  # the job that was running when the shell went has ended
            for line in lines:
                kind, _, value = line.partition(b" ")
                if kind == b"S" and slot.sent:
                    slot.job_pid = int(value)
                elif kind == b"E" and slot.sent:
                    killed = slot.hup_sent > 0
                    done.append(Finished(slot.sent.popleft(), int(value), killed,
                                         slot.started, now))
                    if slot.sent:  # the next one started just now
                        slot._next(now, self.limit_of(slot.sent[0]))
                        if self.doomed and slot.sent[0].name in self.doomed:
                            # Withdrawn while it waited: the slot goes, and the job with
                            # it (_retire ends it as withdrawn).
                            gone = head_ended = True
                            break
                    if killed:
                        # It ended after SIGHUP, but a descendant may ignore HUP: kill the
                        # slot's whole group (and with it any job started after it) and
                        # start a fresh shell.
                        gone = head_ended = True
                        break
            if gone:
                self._retire(slot, done, head_ended, now)
        return done

    def take_returned(self) -> list[Job]:
        """The jobs handed back since the last call, oldest first: sent to a shell that had
        to go before it started them.  They never ran; the caller runs them again."""
        jobs, self.returned = self.returned, []
        return jobs

    def check_timeouts(self, now: float) -> int:
        """Signal jobs past their deadline; return how many newly timed out."""
        new = 0
        for slot in self.slots:
            job = slot.job
            if job is None:
                continue
            if not slot.hup_sent and now >= slot.deadline:
                new += 1
                slot.hup_sent = now
                log.warning("%s timed out after %.0f s%s; killing its process tree",
                            job.name, self.limit_of(job),
                            " (its own timeout)" if self.limit_of(job) < self.timeout
                            else "")
                if slot.job_pid:
                    _signal_tree(slot.job_pid, signal.SIGHUP)
                else:
                    slot.kill_group(signal.SIGHUP)
            elif slot.hup_sent and now >= slot.hup_sent + self.kill_grace:
                # Whatever is left, re-parented or not: the slot's whole group.  The shell
                # dies too; wait() sees its end and replaces it.
                slot.kill_group(signal.SIGKILL)
        return new

    def withdraw(self, names: set[str], now: float) -> list[Finished]:
        """Stop the jobs named ``names`` (withdrawn by the master): a running one's slot
        group killed with SIGKILL at once and the slot given a fresh shell (the job behind
        it handed back, :meth:`take_returned`, unless withdrawn too); one waiting behind a
        running job killed as it starts (:meth:`wait`).  Returns those stopped now, each
        :attr:`Finished.withdrawn`."""
        done: list[Finished] = []
        for slot in list(self.slots):
            self.doomed.update(job.name for job in slot.sent if job.name in names)
            if slot.sent and slot.sent[0].name in self.doomed:
                self.doomed.discard(slot.sent[0].name)
                done.append(Finished(slot.sent.popleft(), None, True, slot.started, now,
                                     withdrawn=True))
                self._retire(slot, done, True, now)  # the jobs behind it: back, or withdrawn
        return done

    def doom_waiting(self) -> list[str]:
        """Mark every job waiting in a shell's input behind a running one to be killed as
        it starts, as a withdrawn one is (:meth:`wait`): a preempted node gives those back
        to the master instead of running them (docs/protocol.md, "Preemption at job
        boundaries").  Returns their names."""
        names = [job.name for slot in self.slots for job in list(slot.sent)[1:]]
        self.doomed.update(names)
        return names

    def kill_all(self) -> list[Job]:
        """Kill every job (and its slot's shell); return the jobs that were sent."""
        self.doomed.clear()
        jobs = [job for s in self.slots for job in s.sent]
        for slot in list(self.slots):
            if slot.sent:
                slot.sent.clear()
                self._replace(slot)
        return jobs

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []
        self.by_fd = {}

    def _retire(self, slot: Slot, done: list[Finished], head_ended: bool,
                now: float) -> None:
        """``slot``'s shell has gone, or must go: unless it has just ended (``head_ended``),
        its running job ends as lost or killed (exit status None); the jobs behind it are
        handed back (:meth:`take_returned`); a fresh shell takes the slot."""
        if slot.sent and not head_ended:
            done.append(Finished(slot.sent.popleft(), None, slot.hup_sent > 0,
                                 slot.started, now))
        for job in slot.sent:
            if self.doomed and job.name in self.doomed:
                self.doomed.discard(job.name)  # withdrawn: it does not run again
                done.append(Finished(job, None, True, now, now, withdrawn=True))
            else:
                self.returned.append(job)
        slot.sent.clear()
        self._replace(slot)

    def _replace(self, slot: Slot) -> None:
        slot.close()
        del self.by_fd[slot.status_fd]
        fresh = self._new_slot(slot.index)
        self.slots[slot.index] = fresh
        self.by_fd[fresh.status_fd] = fresh


def _signal_tree(pid: int, sig: int) -> None:
    """Signal ``pid`` and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for process in procs:
        try:
            process.send_signal(sig)
        except psutil.Error:
            pass
