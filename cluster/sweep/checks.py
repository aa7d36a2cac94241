"""Is a task's result valid?  The ``[validate]`` rules of a sweep, applied on the master.

:func:`validate` judges one finished task from plain values: its exit status, the folder
that holds its result files (``archive/<run>/results/<task id>/``, one file per result
name), the :class:`~cluster.sweep.rules.ValidateRules`, the sweep folder and the task
timeout.  The rules are applied in this order, and the first that fails is the verdict's
reason (cheap checks first, the check script last, so a task that already failed costs no
process):

1. the exit status is one of ``rules.exit_status`` (an empty tuple accepts any status);
2. every name in ``required`` (the sweep's ``[results]`` names) is a regular file in the
   folder -- it may be empty;
3. every name in ``rules.nonempty`` is present and has at least one byte;
4. every ``rules.match`` pair (result name, regular expression) finds a match in that result
   (:func:`contains`: the whole file is scanned, in bounded windows);
5. ``rules.script``, a path relative to the sweep folder, run with the absolute path of the
   result folder as its only argument and the sweep folder as its working directory, exits 0
   within ``timeout`` seconds (:func:`run_check`: its process group is killed when the time
   is up; at most :data:`CHECK_OUTPUT_BYTES` of its output are kept).

The :class:`Verdict` says ``ok`` or the reason in words a report prints as they are:
``invalid: result out is empty``, ``invalid: check.sh exited 1: row 7 diverged``,
``invalid: check.sh timed out after 120 s``.

What is wrong with the *sweep* rather than with one task -- a result name or script path
that is not a plain relative name, a ``match`` that is not a regular expression -- raises
:class:`ValueError`: the sweep file's parser refuses those at submission, so here they are a
caller's bug, and judging every task invalid for them would hide it.  What is found on disk
at run time (a check script that is missing or not executable) is a task's verdict, so the
report shows it.
"""

from __future__ import annotations

import codecs
import os
import re
import select
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cluster.runtime import proc
from cluster.sweep.rules import ValidateRules

#: How much of a result :func:`contains` reads at a time [bytes].  Memory for a ``match`` is
#: bounded by about twice this plus twice :data:`MATCH_OVERLAP_CHARS`, whatever the size
#: (a result is at most the sweep's ``max_result_bytes``, 64 MiB by default, so reading all
#: of it takes well under a second; a verdict line is as often at the end of a log as at
#: its start, so scanning only the head would be wrong).
MATCH_WINDOW_BYTES = 1 << 20
#: How much text before a window's start is searched again with it [characters]: a match
#: that spans lines across a window boundary is found when it is at most this long.
MATCH_OVERLAP_CHARS = 64 * 1024
#: How much of the check script's output (stdout and stderr merged) is kept [bytes]; the
#: rest is read and dropped, so a script that prints gigabytes neither fills the master's
#: memory nor blocks on a full pipe.
CHECK_OUTPUT_BYTES = 64 * 1024
#: How long a reason quotes the check script's first line [characters].
REASON_LINE_CHARS = 200
#: How often the check script's runner looks at the clock while waiting for output [s].
CHECK_POLL = 0.05
#: How many reads drain the pipe once the script has exited (a child it left behind may
#: keep writing; what it writes after that is not the script's answer).
DRAIN_READS = 64
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Verdict:
    """The judgement of one task: ``ok``, or ``reason`` (words, without ``invalid:``).

    ``output`` is the check script's captured output (at most :data:`CHECK_OUTPUT_BYTES`,
    decoded as UTF-8 with bad bytes replaced), '' when no script ran.
    """

    ok: bool
    reason: str = ""
    output: str = ""

    @property
    def status(self) -> str:
        """The ``status`` column of ``results.tsv``: ``ok`` or ``invalid: <reason>``."""
        return "ok" if self.ok else f"invalid: {self.reason}"

    def __str__(self) -> str:
        return self.status


@dataclass(frozen=True)
class CheckRun:
    """What a check script did: its Popen return code (negative: killed by that signal),
    the first :data:`CHECK_OUTPUT_BYTES` of its output, and whether its time ran out."""

    returncode: int
    output: bytes
    timed_out: bool
    elapsed: float


def validate(task_dir: Path, exit_status: int, rules: ValidateRules, sweep_dir: Path,
             timeout: float, *, required: Iterable[str] = ()) -> Verdict:
    """Judge one task; see the module docstring for the rules, their order and the errors.

    ``task_dir`` holds the task's results, one file per result name; ``exit_status`` is the
    command's Popen-style status (negative: killed by that signal); ``timeout`` bounds the
    check script [seconds].  ``required`` names the results that must exist (the sweep's
    ``[results]``), beyond those ``nonempty`` and ``match`` name.
    """
    if rules.exit_status and exit_status not in rules.exit_status:
        allowed = ", ".join(str(s) for s in rules.exit_status)
        return Verdict(False, f"{proc.describe_status(exit_status)} (allowed: {allowed})")
    for name in required:
        missing = _not_a_file(task_dir, name)
        if missing:
            return Verdict(False, missing)
    for name in rules.nonempty:
        missing = _not_a_file(task_dir, name)
        if missing:
            return Verdict(False, missing)
        if (task_dir / name).stat().st_size == 0:
            return Verdict(False, f"result {name} is empty")
    for name, pattern in rules.match:
        missing = _not_a_file(task_dir, name)
        if missing:
            return Verdict(False, missing)
        if not contains(task_dir / name, compile_match(name, pattern)):
            return Verdict(False, f"result {name} has no match for {pattern!r}")
    if rules.script:
        return _run_script(task_dir, rules.script, sweep_dir, timeout)
    return Verdict(True)


def compile_match(name: str, pattern: str) -> re.Pattern[str]:
    """The ``match`` expression for result ``name``, compiled as :func:`contains` uses it:
    ``re.MULTILINE``, so ``^`` and ``$`` match at each line's start and end, as in grep.
    Raises ValueError naming the result when ``pattern`` is not a regular expression."""
    try:
        return re.compile(pattern, re.MULTILINE)
    except re.error as exc:
        raise ValueError(f"[validate] match for result {name}: {pattern!r} is not a "
                         f"regular expression: {exc}") from None


def contains(path: Path, pattern: re.Pattern[str], *, window: int = MATCH_WINDOW_BYTES,
             overlap: int = MATCH_OVERLAP_CHARS) -> bool:
    """Whether ``pattern`` matches somewhere in the file, read ``window`` bytes at a time.

    The file is decoded as UTF-8 (bad bytes become U+FFFD; a character split between two
    reads is decoded whole).  Each search covers whole lines: the text after the last
    newline read so far waits for the next read, so ``$`` never matches at an arbitrary
    cut and ``^`` only at a real line start.  The last ``overlap`` characters of whole lines
    already searched are searched again with the next window, so a match across a window
    boundary is found when it is at most ``overlap`` long.  Limits, the price of bounded
    memory: a longer match across a boundary is missed, and a single line longer than a
    window is searched in window-sized pieces.
    """
    if window < 1 or overlap < 0:
        raise ValueError(f"window must be >= 1 and overlap >= 0, got {window} and {overlap}")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    carry = ""  # text to search again or not yet searched; starts at a line start
    with path.open("rb") as fh:
        while True:  # bounded: each round reads up to `window` bytes of a finite file
            block = fh.read(window)
            text = carry + decoder.decode(block, final=not block)
            if not block:
                return pattern.search(text) is not None
            cut = text.rfind("\n") + 1
            if len(text) - cut > window + overlap:
                # A line longer than we hold: search it as it is, keep its tail.
                if pattern.search(text):
                    return True
                carry = text[-overlap:] if overlap else ""
                continue
            if cut == 0:
                carry = text  # no whole line yet: wait for its end
                continue
            # Up to the last newline, not including it: `$` then matches only at real line
            # ends (a pattern that ends in the newline itself is found in the next round).
            if pattern.search(text, 0, cut - 1):
                return True
            # Keep whole lines, at most `overlap` characters, before the cut (text[cut-1] is
            # a newline, so find() finds one), and the unfinished line after it.
            keep_from = 0 if cut <= overlap else text.find("\n", cut - overlap - 1, cut) + 1
            carry = text[keep_from:]


def run_check(argv: Sequence[str], *, cwd: Path, timeout: float,
              keep: int = CHECK_OUTPUT_BYTES, kill_grace: float = proc.KILL_GRACE,
              stop: Callable[[], bool] | None = None,
              env: Mapping[str, str] | None = None, stdin: proc.Output = proc.DEVNULL
              ) -> CheckRun:
    """Run a check script with bounded time and bounded captured output.

    The child starts in its own session (:func:`cluster.runtime.proc.spawn`), stderr
    merged into stdout.  Its output is read as it comes (so it never
    blocks on a full pipe); the first ``keep`` bytes are kept, the rest dropped.  When
    ``timeout`` passes, its process group gets SIGTERM, then SIGKILL after ``kill_grace``
    seconds.  Once the script has exited, whatever its group left running (a background
    child holding the pipe) is killed too, and the runner does not wait for it.  Raises
    :class:`cluster.runtime.proc.ProcessError` when the script cannot start.  ``env`` is
    its whole environment (this process's when None); ``stdin`` what it reads (an open
    file; ``/dev/null`` unless given); ``stop``, asked at each poll, ends it early as a
    timeout does (a master that stops).
    """
    started = time.monotonic()
    deadline = started + timeout
    child = proc.spawn(list(argv), cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                       stderr=proc.STDOUT)
    assert child.stdout is not None  # spawn was given a pipe
    fd = child.stdout.fileno()
    kept = bytearray()

    def take(chunk: bytes) -> None:
        room = keep - len(kept)
        if room > 0:
            kept.extend(chunk[:room])

    timed_out = False
    try:
        eof = False
        while True:  # bounded by the deadline
            if child.poll() is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0 or (stop is not None and stop()):
                timed_out = True
                break
            if eof:
                # Its output is closed: it is exiting (or left a child holding nothing).
                try:
                    child.wait(timeout=min(left, CHECK_POLL))
                except subprocess.TimeoutExpired:
                    pass
                continue
            ready, _, _ = select.select([fd], [], [], min(left, CHECK_POLL))
            if ready:
                chunk = os.read(fd, _READ_CHUNK)
                eof = not chunk
                take(chunk)
        for _ in range(DRAIN_READS if not eof else 0):
            ready, _, _ = select.select([fd], [], [], 0)
            chunk = os.read(fd, _READ_CHUNK) if ready else b""
            if not chunk:
                break
            take(chunk)
        if timed_out:
            proc.kill_tree(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=kill_grace)
            except subprocess.TimeoutExpired:
                pass
    finally:
        # The group may outlive its leader (a backgrounded child): finish it, then reap.
        proc.kill_tree(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    return CheckRun(child.returncode, bytes(kept), timed_out, time.monotonic() - started)


def _not_a_file(task_dir: Path, name: str) -> str:
    """'' when result ``name`` is a regular file in ``task_dir``, else why not in words."""
    _check_plain_name(name, "result name")
    try:
        mode = os.lstat(task_dir / name).st_mode
    except FileNotFoundError:
        return f"result {name} is missing"
    if not stat.S_ISREG(mode):
        return f"result {name} is not a regular file"
    return ""


def _check_plain_name(name: str, what: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{what} {name!r}: expected a plain file name (no '/', not '.', "
                         "'..' or empty, no NUL)")


def _script_path(sweep_dir: Path, script: str) -> Path:
    """``script`` inside ``sweep_dir``; ValueError if it is absolute or climbs out."""
    parts = PurePosixPath(script).parts
    if (not script or "\0" in script or PurePosixPath(script).is_absolute()
            or ".." in parts):
        raise ValueError(f"[validate] script {script!r}: expected a path relative to the "
                         "sweep folder, without '..'")
    return sweep_dir / script


def _run_script(task_dir: Path, script: str, sweep_dir: Path, timeout: float) -> Verdict:
    return run_script(task_dir, script, sweep_dir, timeout)


def run_script(task_dir: Path, script: str, sweep_dir: Path, timeout: float,
               stop: Callable[[], bool] | None = None) -> Verdict:
    """Rule 5 alone: the check script ``script`` (relative to ``sweep_dir``) run on the
    result folder ``task_dir`` (its absolute path the only argument, the sweep folder the
    working directory), within ``timeout`` seconds; ``stop`` as for :func:`run_check`."""
    path = _script_path(sweep_dir, script)
    if not path.is_file():
        return Verdict(False, f"check script {script} not found in the sweep folder")
    if not os.access(path, os.X_OK):
        return Verdict(False, f"check script {script} is not executable")
    try:
        ran = run_check([str(path.resolve()), str(task_dir.resolve())],
                        cwd=sweep_dir, timeout=timeout, stop=stop)
    except proc.ProcessError as exc:
        return Verdict(False, f"check script {script} could not start: {exc}")
    output = ran.output.decode("utf-8", "replace")
    if ran.timed_out:
        return Verdict(False, f"{script} timed out after {timeout:g} s", output)
    if ran.returncode == 0:
        return Verdict(True, "", output)
    said = _first_line(output)
    how = (f"exited {ran.returncode}" if ran.returncode > 0
           else proc.describe_status(ran.returncode))
    return Verdict(False, f"{script} {how}" + (f": {said}" if said else " (no output)"),
                   output)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= REASON_LINE_CHARS else line[:REASON_LINE_CHARS] + "..."
    return ""
