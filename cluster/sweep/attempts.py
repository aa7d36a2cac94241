"""``runs/<id>/sweep-attempts.tsv``: one line per try of a sweep task, as the master judged it.

The master (:mod:`cluster.master.serve.sweepintake`) appends a line for every result of a sweep
task it takes, valid or not; a master that takes the run over reads the file back for the
tries made so far, and the end of the run (the report room, which never imports the
master) reads each task's last line for ``results.tsv``.  This module is the format, so
both sides share it: :class:`Attempt`, :func:`format_attempt`, :func:`parse_attempt`,
:func:`read_attempts`, and the appending :class:`AttemptsWriter`.

The file is TAB-separated, UTF-8, a header line (:data:`HEADER`) then one line per try,
each ending in ``\\n``.  The columns, in this order (docs/sweeps.md section 9):

1. ``task``: the task id;
2. ``node``: the node that ran the try;
3. ``start``: when the command started, seconds since the epoch (``%.3f``; 0 when the node
   sent no description of the task);
4. ``runtime``: how long it ran, seconds (``%.3f``);
5. ``exit``: the exit status of the task's shell, as the node's readlog saw it;
6. ``received``: the bytes of the task's result files that came home, together (0 when none
   did): GNU parallel's ``Receive`` column, which counts a job's stdout and the files it
   returns (``--return``);
7. ``status``: ``ok``, ``invalid: <why>``, ``failed: <why>`` or ``timeout``
   (:func:`cluster.sweep.joblog.check_status`);
8. ``attempt``: the try's number, 1 for the first;
9. ``end``: ``final`` when this try settled the task (valid, or the last try), ``retry``
   when the task was put back to be tried again.

Fields are escaped as in ``results.tsv`` (:func:`cluster.sweep.joblog.escape`: backslash,
TAB, newline and CR as two-character escapes), so a reason never breaks a line.  A writer
killed mid-line leaves at most one unfinished last line: :func:`read_attempts` skips it and
:class:`AttemptsWriter` cuts it off before appending.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ClusterError
from cluster.sweep.joblog import check_status, escape, unescape

#: The columns of every line, in order.
ATTEMPT_COLUMNS = ("task", "node", "start", "runtime", "exit", "received", "status",
                   "attempt", "end")
#: The first line of the file.
HEADER = "\t".join(ATTEMPT_COLUMNS) + "\n"
#: The ``end`` column's two values.
FINAL = "final"
RETRY = "retry"
#: How far back :class:`AttemptsWriter` reads in one step while looking for the last newline.
_TAIL_STEP = 64 * 1024
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"


class AttemptsError(ClusterError, ValueError):
    """``sweep-attempts.tsv`` is not in this module's format (names the file and line); a
    ValueError too, as readers of the other sweep files expect of a malformed file."""


@dataclass(frozen=True)
class Attempt:
    """One try of one task: the columns of the module docstring, in order.  ``receive`` is
    the ``received`` column; ``final`` is True for ``final``, False for ``retry``."""

    task: str
    node: str
    start: float
    runtime: float
    exit_status: int
    receive: int
    status: str
    attempt: int
    final: bool

    @property
    def ok(self) -> bool:
        """Whether the try was valid."""
        return self.status == "ok"


def format_attempt(attempt: Attempt) -> str:
    """The line (with its newline) of ``attempt``; ValueError for a status no line may
    carry, a try number below 1, or a negative size."""
    check_status(attempt.status)
    if attempt.attempt < 1 or attempt.receive < 0:
        raise ValueError(f"expected attempt >= 1 and received >= 0, got {attempt}")
    fields = (escape(attempt.task), escape(attempt.node), f"{attempt.start:.3f}",
              f"{attempt.runtime:.3f}", str(attempt.exit_status), str(attempt.receive),
              escape(attempt.status), str(attempt.attempt), FINAL if attempt.final else RETRY)
    return "\t".join(fields) + "\n"


def parse_attempt(line: str) -> Attempt:
    """The Attempt of one line (without its newline); ValueError saying what is wrong."""
    fields = line.split("\t")
    if len(fields) != len(ATTEMPT_COLUMNS):
        raise ValueError(f"expected {len(ATTEMPT_COLUMNS)} TAB-separated fields "
                         f"({', '.join(ATTEMPT_COLUMNS)}), got {len(fields)}")
    task, node, start, runtime, exit_status, receive, status, number, end = fields
    if end not in (FINAL, RETRY):
        raise ValueError(f"end {end!r}: expected {FINAL!r} or {RETRY!r}")
    try:
        attempt = Attempt(unescape(task), unescape(node), float(start), float(runtime),
                          int(exit_status), int(receive), check_status(unescape(status)),
                          int(number), end == FINAL)
    except ValueError as exc:
        raise ValueError(f"bad field: {exc}") from None
    if attempt.attempt < 1 or attempt.receive < 0 or not attempt.task:
        raise ValueError(f"expected a task id, attempt >= 1 and received >= 0, got "
                         f"{line!r}")
    return attempt


def read_attempts(path: Path) -> Iterator[Attempt]:
    """The tries in ``path``, in file order, streamed (a million lines take constant memory).

    A missing file has none.  The header line is skipped; so is an unfinished last line (its
    writer was killed mid-line).  AttemptsError names the file and line of a malformed
    complete line or a wrong header.
    """
    try:
        fh = path.open("r", encoding=_ENCODING, errors=_ERRORS, newline="\n")
    except FileNotFoundError:
        return
    with fh:
        for lineno, line in enumerate(fh, start=1):  # bounded by the file
            if not line.endswith("\n"):
                return  # the unfinished line of a killed writer
            if lineno == 1:
                if line != HEADER:
                    raise AttemptsError(f"{path}: line 1: expected the header {HEADER!r}, "
                                        f"got {line!r}")
                continue
            try:
                yield parse_attempt(line[:-1])
            except ValueError as exc:
                raise AttemptsError(f"{path}: line {lineno}: {exc}") from None


class AttemptsWriter:
    """Appends tries to one ``sweep-attempts.tsv``: each :meth:`write` is one ``write()``
    on an O_APPEND descriptor (a reader never sees half a line unless the writer dies);
    :meth:`sync` fsyncs what was written since the last one (the master syncs it with its
    journal).  Opening writes the header into an empty file and cuts off an unfinished last
    line.  The caller closes it (:meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.dirty = False
        size = os.fstat(self.fd).st_size
        if size == 0:
            self._write(HEADER.encode(_ENCODING))
        else:
            self._trim_torn_tail(size)

    def _trim_torn_tail(self, size: int) -> None:
        position = size
        while position > 0:  # bounded: steps back through a finite file
            step = min(_TAIL_STEP, position)
            chunk = os.pread(self.fd, step, position - step)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                end = position - step + newline + 1
                if end != size:
                    os.ftruncate(self.fd, end)
                return
            position -= step
        os.ftruncate(self.fd, 0)  # not even the header is whole: start over
        self._write(HEADER.encode(_ENCODING))

    def write(self, attempt: Attempt) -> None:
        """Append ``attempt``'s line (ValueError, nothing written, if it has none)."""
        self._write(format_attempt(attempt).encode(_ENCODING, _ERRORS))

    def write_many(self, attempts: Iterable[Attempt]) -> None:
        """Append the lines of ``attempts`` in one write."""
        self._write("".join(map(format_attempt, attempts)).encode(_ENCODING, _ERRORS))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # bounded: each write takes at least one byte
            view = view[os.write(self.fd, view):]
        self.dirty = True

    def sync(self) -> None:
        """fsync the lines written since the last sync."""
        if self.dirty and self.fd >= 0:
            os.fsync(self.fd)
            self.dirty = False

    def close(self) -> None:
        """Sync and close (idempotent)."""
        if self.fd >= 0:
            self.sync()
            os.close(self.fd)
            self.fd = -1
