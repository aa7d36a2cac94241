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

Why the shells are started here with ``os.posix_spawn`` and not through
:mod:`cluster.runtime.proc`: ``proc.run`` runs a command to its end, and ``proc.spawn`` gives
a child with stdin at ``/dev/null``; a slot shell instead lives for the whole run, reads job
lines on its stdin and writes its events on a fourth descriptor (3), which neither offers.
It does keep proc's rules: its own session (``setsid``), and its group killed as a whole
with :func:`cluster.runtime.proc.kill_tree`.

A timed-out job gets SIGHUP to its whole process tree (run.pl's ``ps -ef`` walk, here
psutil), then after ``kill_grace`` SIGKILL to the slot's whole process group, which also
catches anything re-parented; the slot then gets a fresh shell.  If the job ends on the
SIGHUP, the group is killed at once all the same: a descendant may ignore HUP.  A shell
that dies on its own ends its job as an internal error and is replaced.

Callers use :meth:`SlotPool.start`, :meth:`SlotPool.wait`, :meth:`SlotPool.check_timeouts`,
:meth:`SlotPool.kill_all` and :meth:`SlotPool.close`.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from cluster.records import Job
from cluster.runtime import proc

log = logging.getLogger("cluster.slots")

_RUNNER = '( eval {cmd} ) </dev/null & p=$!; echo "S $p" >&3; wait $p; echo "E $?" >&3\n'


@dataclass(frozen=True)
class Finished:
    """A job that ended: its exit status (None if its shell died) and whether we killed it."""

    job: Job
    exit_status: int | None
    killed: bool


class Slot:
    """One persistent shell and the job it runs (if any)."""

    def __init__(self, index: int, env: Mapping[str, str]) -> None:
        self.index = index
        cmd_r, cmd_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            self.pid = os.posix_spawn("/bin/sh", ["sh", "-s"], env, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, cmd_r, 0),
                (os.POSIX_SPAWN_DUP2, status_w, 3),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ])
        finally:
            os.close(cmd_r)
            os.close(status_w)
        self.cmd_fd = cmd_w
        self.status_fd = status_r
        os.set_blocking(status_r, False)
        self.buf = b""
        self.job: Job | None = None
        self.job_pid = 0
        self.deadline = 0.0
        self.hup_sent = 0.0

    def send(self, job: Job, command: str, deadline: float) -> None:
        self.job = job
        self.job_pid = 0
        self.deadline = deadline
        self.hup_sent = 0.0
        data = _RUNNER.format(cmd=shlex.quote(command)).encode()
        view = memoryview(data)
        while view:  # a pipe takes 64 KiB at once; longer commands need more writes
            view = view[os.write(self.cmd_fd, view):]

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
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class SlotPool:
    """``count`` slots running jobs with a per-job timeout."""

    def __init__(self, count: int, env: Mapping[str, str], timeout: float,
                 kill_grace: float) -> None:
        self.env = dict(env)
        self.timeout = timeout
        self.kill_grace = kill_grace
        self.slots = [Slot(i, self.env) for i in range(count)]
        self.by_fd = {s.status_fd: s for s in self.slots}

    def free(self) -> int:
        return sum(1 for s in self.slots if s.job is None)

    def running(self) -> int:
        return sum(1 for s in self.slots if s.job is not None)

    def start(self, job: Job, command: str, now: float) -> None:
        """Run ``job`` (its command already substituted) in a free slot."""
        for slot in self.slots:
            if slot.job is None:
                try:
                    slot.send(job, command, now + self.timeout)
                except BrokenPipeError:  # its shell died while idle: replace it, try again
                    self._replace(slot)
                    self.slots[slot.index].send(job, command, now + self.timeout)
                return
        raise RuntimeError("no free slot")

    def next_deadline(self) -> float | None:
        times = [s.deadline if not s.hup_sent else s.hup_sent + self.kill_grace
                 for s in self.slots if s.job is not None]
        return min(times) if times else None

    def wait(self, timeout: float) -> list[Finished]:
        """Wait up to ``timeout`` seconds for jobs to end; return those that ended."""
        busy = [s.status_fd for s in self.slots if s.job is not None]
        if not busy:
            return []
        ready, _, _ = select.select(busy, [], [], max(timeout, 0.0))
        done: list[Finished] = []
        for fd in ready:
            slot = self.by_fd[fd]
            lines, gone = slot.read_events()
            for line in lines:
                kind, _, value = line.partition(b" ")
                if kind == b"S":
                    slot.job_pid = int(value)
                elif kind == b"E" and slot.job is not None:
                    done.append(Finished(slot.job, int(value), slot.hup_sent > 0))
                    slot.job = None
                    if slot.hup_sent:
                        # It ended after SIGHUP, but a descendant may ignore HUP: kill the
                        # slot's whole group and start a fresh shell.
                        gone = True
            if gone:
                if slot.job is not None:
                    done.append(Finished(slot.job, None, slot.hup_sent > 0))
                    slot.job = None
                self._replace(slot)
        return done

    def check_timeouts(self, now: float) -> int:
        """Signal jobs past their deadline; return how many newly timed out."""
        new = 0
        for slot in self.slots:
            if slot.job is None:
                continue
            if not slot.hup_sent and now >= slot.deadline:
                new += 1
                slot.hup_sent = now
                log.warning("%s timed out after %.0f s; killing its process tree",
                            slot.job.name, self.timeout)
                if slot.job_pid:
                    _signal_tree(slot.job_pid, signal.SIGHUP)
                else:
                    slot.kill_group(signal.SIGHUP)
            elif slot.hup_sent and now >= slot.hup_sent + self.kill_grace:
                # Whatever is left, re-parented or not: the slot's whole group.  The shell
                # dies too; wait() sees its end and replaces it.
                slot.kill_group(signal.SIGKILL)
        return new

    def kill_all(self) -> list[Job]:
        """Kill every running job (and its slot's shell); return the jobs that were running."""
        jobs = [s.job for s in self.slots if s.job is not None]
        for slot in list(self.slots):
            if slot.job is not None:
                slot.job = None
                self._replace(slot)
        return jobs

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []
        self.by_fd = {}

    def _replace(self, slot: Slot) -> None:
        slot.close()
        del self.by_fd[slot.status_fd]
        fresh = Slot(slot.index, self.env)
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
