"""One process runner: every subprocess the cluster starts goes through here.

Contract of :func:`run`:

* the child gets its own session (``start_new_session``), so a terminal's ^C aimed at the
  caller does not reach it, and on timeout the whole tree it started (``make`` and its
  compilers, ``git`` and its ``ssh``, ``rsync`` and its remote shell) can be killed at once;
* ``timeout`` (seconds, ``None`` for none) bounds the wall time; when it passes, the
  process group gets SIGTERM, then SIGKILL after ``kill_grace`` seconds, and the result says
  ``timed_out``: the caller decides whether that is an error;
* stdin is ``/dev/null`` unless ``input`` is given, so no child ever waits on a terminal;
* output is captured (``stdout``/``stderr`` left ``None``) or sent to an open file the
  caller owns (a build log); ``stderr=STDOUT`` merges the two;
* ``stop`` (a :class:`cluster.runtime.service.StopFlag`, or anything with ``is_set()``)
  is looked at every ``service.STOP_POLL`` seconds while the command runs; once set, the group
  is stopped as on a timeout and the result says ``stopped`` (a daemon told to leave does not
  leave a build running behind it);
* the :class:`Result` carries the exit status, what was captured, the elapsed time and
  whether the timeout fired; :meth:`Result.check` turns a failure into
  :class:`ProcessError` whose message names the command, the status and the tail of its
  output.

:func:`spawn` starts a long-lived child in its own session (the supervisor's clustermasters,
a node's run.py, the local cluster's daemons); :func:`kill_tree` signals its whole group;
:func:`wait_exit` waits for its end, woken by the end itself.

The parent watch (opt-in): a child :func:`spawn` starts with ``watch_parent``, or while
:data:`PARENT_WATCH_ENV` is set in the spawner's environment, gets SIGTERM from the kernel
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, set in the child between fork and exec),
and inherits the variable, so what it spawns in turn is watched too.  ``localcluster.py``
opts in: killed with SIGKILL, it takes its daemons with it, and they theirs (the supervisor
its clustermasters, a node its run.py), each leaving as on any SIGTERM.  A supervisor that
cron or systemd started has no such variable, and outlives the shell that launched it.

The kernel sends the signal when the *thread* that forked the child ends, not only the
process; so a child is watched only when spawned from the main thread (which lives as long
as its process); one spawned from another thread is started unwatched.  A parent that died
between the fork and the ``prctl`` is caught by comparing the child's parent with the
spawner's pid after it: the child then exits before it execs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cluster.errors import ClusterError
from cluster.runtime.service import STOP_POLL, StopSignal

#: Pass as ``stderr`` to merge the child's stderr into its stdout.
STDOUT = subprocess.STDOUT
#: Pass as ``stdout``/``stderr`` to throw that stream away.
DEVNULL = subprocess.DEVNULL
#: After a timeout's SIGTERM, how long the group has before SIGKILL [seconds].
KILL_GRACE = 5.0
#: How much of a failed command's output a :class:`ProcessError` message keeps [characters].
TAIL_CHARS = 2000

#: Set (to "1") in a spawner's environment, it has :func:`spawn` watch the parent of every
#: child it starts (see the module docstring).  localcluster.py sets it for what it starts.
PARENT_WATCH_ENV = "CLUSTER_DIE_WITH_PARENT"
#: prctl(2)'s option: the signal this process gets when its parent (thread) dies.
PR_SET_PDEATHSIG = 1
#: The signal a watched child gets: it leaves as on any stop request.
PARENT_DEATH_SIGNAL = signal.SIGTERM
#: Exit status of a watched child whose parent died before its watch was set (it never
#: ran its program).
ORPHANED = 125

Output = IO[Any] | int | None


class ProcessError(ClusterError):
    """A command failed, could not start, or ran past its timeout."""


@dataclass(frozen=True)
class Result:
    """What a finished (or killed) command did."""

    argv: Sequence[str] | str
    returncode: int
    stdout: bytes
    stderr: bytes
    elapsed: float
    timed_out: bool = False
    stopped: bool = False

    @property
    def ok(self) -> bool:
        """Exited with status 0 before the timeout, without being stopped."""
        return self.returncode == 0 and not self.timed_out and not self.stopped

    def text(self, which: str = "stdout") -> str:
        """``stdout`` or ``stderr`` decoded as UTF-8 (bad bytes replaced)."""
        data = self.stdout if which == "stdout" else self.stderr
        return data.decode("utf-8", "replace")

    def describe(self, timeout: float | None = None) -> str:
        """The outcome in words: "exit status 2", "timed out after 60 s", "terminated by ..."."""
        if self.timed_out:
            return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
        if self.stopped:
            return "stopped on request"
        return describe_status(self.returncode)

    def check(self, what: str | None = None, timeout: float | None = None) -> Result:
        """Return self if :attr:`ok`, else raise :class:`ProcessError` with the output tail."""
        if self.ok:
            return self
        name = what or command_text(self.argv)
        tail = (self.text("stderr").strip() or self.text("stdout").strip())[-TAIL_CHARS:]
        raise ProcessError(f"{name}: {self.describe(timeout)}"
                           + (f": {tail}" if tail else " (no output)"))


def describe_status(returncode: int) -> str:
    """A Popen returncode in words: "exit status 2", "terminated by SIGKILL"."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"terminated by {name}"


def command_text(argv: Sequence[str] | str) -> str:
    """A command for messages: a shell line as it is, an argv joined by spaces."""
    return argv if isinstance(argv, str) else " ".join(str(a) for a in argv)


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group ``pid`` leads (a child started here); False if gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def wait_exit(child: subprocess.Popen[Any], timeout: float) -> int | None:
    """Wait up to ``timeout`` seconds for ``child`` to end; its exit status (reaped), or
    None if it is still running.

    Woken by the exit itself, through a pidfd (Linux 5.3): ``Popen.wait`` with a timeout
    looks at doubling intervals up to 0.05 s, so a wait for a child that ends a moment
    after a look lasted up to 0.05 s longer (localcluster.py's exit waits for five
    daemons).  Where pidfds are missing, it is ``Popen.wait``.  The child is not reaped
    before the pidfd is open, so its pid cannot have been reused.
    """
    if child.poll() is not None:
        return child.returncode
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        try:
            return child.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return None
    try:
        select.select([fd], [], [], max(timeout, 0.0))
    finally:
        os.close(fd)
    return child.poll()


def watching_parent(env: Mapping[str, str] | None = None) -> bool:
    """Whether children spawned with ``env`` (None: this process's environment) are to be
    watched by default: :data:`PARENT_WATCH_ENV` is set in it to something other than
    "" or "0"."""
    value = (os.environ if env is None else env).get(PARENT_WATCH_ENV, "")
    return value not in ("", "0")


def _libc_prctl() -> Callable[..., int] | None:
    """libc's prctl, or None where there is none (not Linux, no libc found)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _libc_prctl()


def _parent_watch(parent: int) -> Callable[[], None]:
    """The function the child runs between fork and exec: ask for
    :data:`PARENT_DEATH_SIGNAL` at the parent's death, then make sure ``parent`` (the
    spawner's pid) is still its parent -- if it died before the ``prctl``, no signal will
    ever come, so the child exits (:data:`ORPHANED`) instead of running unwatched.

    Only a C call and two system calls: no lock another thread of the parent may have held
    at the fork is taken."""
    prctl = _PRCTL

    def watch() -> None:  # pragma: no cover - runs in the child; tested through its effects
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(ORPHANED)

    return watch


def spawn(argv: Sequence[str] | str, *, cwd: Path | str | None = None,
          env: Mapping[str, str] | None = None, stdout: Output = DEVNULL,
          stderr: Output = DEVNULL, shell: bool = False,
          watch_parent: bool | None = None, stdin: Output = DEVNULL) -> subprocess.Popen[bytes]:
    """Start a long-lived child in its own session; the caller reaps it (``poll``/``wait``).

    ``watch_parent``: the child gets SIGTERM when this process dies, and so does what it
    spawns (see the module docstring); None (the default): as :func:`watching_parent` says
    of this process's environment.  Ignored (the child is started unwatched) when called
    from a thread other than the main thread, or where prctl is missing.  ``stdin``: what
    the child reads (``/dev/null`` unless given, e.g. an open file).

    Raises :class:`ProcessError` if it cannot start (no such program, no permission).
    """
    if watch_parent is None:
        watch_parent = watching_parent()
    child_env = dict(env) if env is not None else None
    preexec: Callable[[], None] | None = None
    if watch_parent and _PRCTL is not None and \
            threading.current_thread() is threading.main_thread():
        preexec = _parent_watch(os.getpid())
        if not watching_parent(child_env):
            # The child's own children are watched too (they see the variable).
            child_env = {**(os.environ if child_env is None else child_env),
                         PARENT_WATCH_ENV: "1"}
    try:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                cwd=cwd, env=child_env, shell=shell, start_new_session=True,
                                preexec_fn=preexec)
    except OSError as exc:
        raise ProcessError(f"cannot start {command_text(argv)}: {exc}") from None


def run(argv: Sequence[str] | str, *, timeout: float | None, cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None, input: bytes | None = None,
        stdout: Output = None, stderr: Output = None, shell: bool = False,
        kill_grace: float = KILL_GRACE, stop: StopSignal | None = None) -> Result:
    """Run a command to its end or its timeout; see the module docstring for the contract.

    ``timeout`` is required (keyword) so that every call site says how long it may take;
    pass ``None`` only where something else bounds it.  Raises :class:`ProcessError` only
    if the command cannot start; a non-zero status or a timeout is in the result.
    """
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout is None else stdout,
            stderr=subprocess.PIPE if stderr is None else stderr,
            cwd=cwd, env=dict(env) if env is not None else None, shell=shell,
            start_new_session=True)
    except OSError as exc:
        raise ProcessError(f"cannot start {command_text(argv)}: {exc}") from None
    timed_out = stopped = False
    deadline = None if timeout is None else started + timeout
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if stop is not None:
                left = STOP_POLL if left is None else min(left, STOP_POLL)
            try:
                # communicate() may be called again after its timeout: the input already
                # sent and the output already read are kept.
                out, err = proc.communicate(input=input, timeout=left)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    timed_out = True
                elif stop is not None and stop.is_set():
                    stopped = True
                else:
                    continue
                out, err = _stop(proc, kill_grace)
                break
    except BaseException:
        # An interrupt in the caller must not leave the child's tree running.
        kill_tree(proc.pid)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=kill_grace)
        raise
    return Result(argv, proc.returncode, out or b"", err or b"",
                  time.monotonic() - started, timed_out, stopped)


def _stop(proc: subprocess.Popen[bytes], grace: float) -> tuple[bytes, bytes]:
    """SIGTERM the group, SIGKILL it after ``grace``; return what output was left."""
    kill_tree(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            # A grandchild outside the group still holds our pipes: give up on them.
            proc.kill()
            proc.wait()
            out, err = b"", b""
    # The group may outlive its leader (a daemonised grandchild): finish it.
    kill_tree(proc.pid, signal.SIGKILL)
    return out or b"", err or b""
