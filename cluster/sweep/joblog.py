"""The rows of ``archive/<run>/results.tsv``: one per task, GNU parallel's joblog and more.

The file is TAB-separated, UTF-8, one header line then one line per task, each ending in
``\\n``.  Its columns:

* GNU parallel's ``--joblog`` columns, formatted as parallel (20221122) writes them:
  ``Seq`` (the task number, 1-based), ``Host`` (the node that ran the attempt reported),
  ``Starttime`` (seconds since the epoch, ``%.3f``), ``JobRuntime`` (seconds, ``%10.3f``:
  right-aligned in ten characters, as parallel pads it), ``Send`` and ``Receive`` (bytes of
  input files sent and of result files received), ``Exitval`` and ``Signal`` (see
  :func:`exit_columns`), ``Command`` (the command line as run);
* the parameter columns, in the table's header order, with the task's values;
* ``status``: ``ok``, ``invalid: <why>``, ``failed: <why>`` or ``timeout``;
* ``attempts``: how many times the task was run (0 for one never started).

Escaping: in every field, header included, a backslash is written ``\\\\``, a TAB ``\\t``, a
newline ``\\n`` and a carriage return ``\\r`` (the text format of PostgreSQL's COPY), so every
line has exactly the header's number of fields and a value never breaks a row.  A field
without these characters is written as it is.  (GNU parallel itself writes a newline in a
command as NUL and leaves TABs alone; a command with a TAB there shifts its columns.)
Text that is not valid UTF-8 (a file name's bytes) goes through as ``surrogateescape``.

Writing (:class:`JoblogWriter`, :func:`open_joblog`) appends one row per task, in the order
tasks finish (as parallel does: not necessarily ``Seq`` order), and flushes each, so a
reader (the status page, ``resume``) sees every finished task; a writer killed mid-row
leaves at most one unfinished last line, which :func:`read_joblog` skips and
:func:`open_joblog` cuts off before appending. Reading (:func:`read_joblog`) streams the
rows, so a million-row file takes constant memory; :func:`valid_seqs` gives the task numbers
whose status is ``ok`` (what ``resume`` need not run again).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cluster.errors import ClusterError

#: GNU parallel's joblog columns, first in every row.
JOBLOG_COLUMNS = ("Seq", "Host", "Starttime", "JobRuntime", "Send", "Receive", "Exitval",
                  "Signal", "Command")
#: The sweep's own columns, last in every row.
STATUS_COLUMNS = ("status", "attempts")
#: The status prefixes a row may carry (``ok`` and ``timeout`` stand alone).
STATUS_PREFIXES = ("invalid: ", "failed: ")
#: How far back :func:`open_joblog` reads in one step while looking for the last newline.
_TAIL_STEP = 64 * 1024
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


class JoblogError(ClusterError):
    """``results.tsv`` is not in the format this module writes (names the file and line)."""


@dataclass(frozen=True)
class JoblogRow:
    """One task's row.  ``params`` are (column name, value) pairs in the header's order;
    ``start`` is epoch seconds, ``runtime`` seconds; ``status`` as the module docstring
    says (checked by :func:`check_status`)."""

    seq: int
    host: str
    start: float
    runtime: float
    send: int
    receive: int
    exitval: int
    signal: int
    command: str
    params: tuple[tuple[str, str], ...]
    status: str
    attempts: int

    @property
    def ok(self) -> bool:
        """Whether the task has a valid result."""
        return self.status == "ok"

    @property
    def parameters(self) -> dict[str, str]:
        """The parameter values by column name."""
        return dict(self.params)


def exit_columns(returncode: int, timed_out: bool = False) -> tuple[int, int]:
    """(``Exitval``, ``Signal``) for a Popen return code, as GNU parallel fills them: an exit
    gives (status, 0); death by a signal gives (0, signal number), or (-1, signal number)
    when the signal was the timeout's kill (parallel writes -1 for a job it timed out)."""
    if returncode >= 0:
        return returncode, 0
    return (-1 if timed_out else 0), -returncode


def check_status(status: str) -> str:
    """Return ``status`` if it is one a row may carry, else raise ValueError."""
    if status in ("ok", "timeout") or (
            status.startswith(STATUS_PREFIXES)
            and status.split(": ", 1)[1].strip()):
        return status
    raise ValueError(f"status {status!r}: expected 'ok', 'timeout', 'invalid: <why>' or "
                     "'failed: <why>'")


def escape(field: str) -> str:
    """A field as written: backslash, TAB, newline and CR as two-character escapes."""
    if not any(c in field for c in _ESCAPES):
        return field
    return "".join(_ESCAPES.get(c, c) for c in field)


def unescape(field: str) -> str:
    """The inverse of :func:`escape`; ValueError on a backslash not followed by one of
    ``\\ t n r``."""
    if "\\" not in field:
        return field
    out: list[str] = []
    chars = iter(field)
    for c in chars:  # bounded by the field's length
        if c != "\\":
            out.append(c)
            continue
        nxt = next(chars, "")
        if nxt not in _UNESCAPES:
            raise ValueError(f"bad escape '\\{nxt}' in {field!r}: expected \\\\, \\t, \\n "
                             "or \\r")
        out.append(_UNESCAPES[nxt])
    return "".join(out)


def header(parameters: Sequence[str]) -> str:
    """The header line (with its newline) for a table with these column names."""
    return "\t".join(escape(c) for c in (*JOBLOG_COLUMNS, *parameters, *STATUS_COLUMNS)) + "\n"


def format_row(row: JoblogRow, parameters: Sequence[str]) -> str:
    """``row`` as one line (with its newline); ValueError if its parameters are not exactly
    ``parameters`` in that order, its status is not one a row may carry, or a number is out
    of its range (a negative count, a time that is not finite)."""
    names = tuple(name for name, _ in row.params)
    if names != tuple(parameters):
        raise ValueError(f"task {row.seq}: parameters {list(names)}, expected "
                         f"{list(parameters)} (the header's columns, in order)")
    check_status(row.status)
    if row.seq < 1 or row.send < 0 or row.receive < 0 or row.attempts < 0 or row.signal < 0:
        raise ValueError(f"task {row.seq}: Seq must be >= 1 and Send, Receive, Signal and "
                         f"attempts >= 0, got {row}")
    if not (math.isfinite(row.start) and math.isfinite(row.runtime)):
        raise ValueError(f"task {row.seq}: Starttime and JobRuntime must be finite, got "
                         f"{row.start} and {row.runtime}")
    fields = (str(row.seq), escape(row.host), f"{row.start:.3f}", f"{row.runtime:10.3f}",
              str(row.send), str(row.receive), str(row.exitval), str(row.signal),
              escape(row.command), *(escape(value) for _, value in row.params),
              escape(row.status), str(row.attempts))
    return "\t".join(fields) + "\n"


def parse_header(line: str) -> tuple[str, ...]:
    """The parameter column names of a header line (without its newline); ValueError if
    the fixed columns are not where they belong."""
    fields = [unescape(f) for f in line.split("\t")]
    fixed, tail = len(JOBLOG_COLUMNS), len(STATUS_COLUMNS)
    if (len(fields) < fixed + tail or tuple(fields[:fixed]) != JOBLOG_COLUMNS
            or tuple(fields[-tail:]) != STATUS_COLUMNS):
        raise ValueError(f"expected a header {'/'.join(JOBLOG_COLUMNS)}/<parameters>/"
                         f"{'/'.join(STATUS_COLUMNS)}, got {fields}")
    return tuple(fields[fixed:-tail])


def parse_row(line: str, parameters: Sequence[str]) -> JoblogRow:
    """One data line (without its newline); ValueError naming the field that is wrong."""
    fields = line.split("\t")
    expected = len(JOBLOG_COLUMNS) + len(parameters) + len(STATUS_COLUMNS)
    if len(fields) != expected:
        raise ValueError(f"{len(fields)} fields, expected {expected} as in the header")
    values = [unescape(f) for f in fields]
    numbers: dict[str, float] = {}
    for index, name, kind in ((0, "Seq", int), (2, "Starttime", float),
                              (3, "JobRuntime", float), (4, "Send", int), (5, "Receive", int),
                              (6, "Exitval", int), (7, "Signal", int), (-1, "attempts", int)):
        try:
            numbers[name] = kind(values[index].strip())
        except ValueError:
            raise ValueError(f"{name} {values[index]!r} is not "
                             f"{'an integer' if kind is int else 'a number'}") from None
    row = JoblogRow(int(numbers["Seq"]), values[1], numbers["Starttime"],
                    numbers["JobRuntime"], int(numbers["Send"]), int(numbers["Receive"]),
                    int(numbers["Exitval"]), int(numbers["Signal"]), values[8],
                    tuple(zip(parameters, values[9:-2], strict=True)), values[-2],
                    int(numbers["attempts"]))
    check_status(row.status)
    return row


class JoblogWriter:
    """Appends rows to an open text file (opened by the caller, or by :func:`open_joblog`).

    Writes the header first when the file is empty (its position is 0).  Each row is one
    ``write`` of a whole line followed by ``flush``: a reader never waits for a buffer, and
    a killed writer leaves at most its last line unfinished.  Not for two writers at once
    (the master's end of a run is the one writer of a run's file).
    """

    def __init__(self, stream: IO[str], parameters: Sequence[str]) -> None:
        self.stream = stream
        self.parameters = tuple(parameters)
        if len(set(self.parameters)) != len(self.parameters):
            raise ValueError(f"parameter columns {list(self.parameters)}: a name is repeated")
        if stream.tell() == 0:
            stream.write(header(self.parameters))
            stream.flush()

    def write(self, row: JoblogRow) -> None:
        """Append ``row`` (see :func:`format_row` for what is refused) and flush it."""
        self.stream.write(format_row(row, self.parameters))
        self.stream.flush()


@contextlib.contextmanager
def open_joblog(path: Path, parameters: Sequence[str]) -> Iterator[JoblogWriter]:
    """A :class:`JoblogWriter` appending to ``path`` (created if missing), closed at the end.

    An existing non-empty file must have the header these ``parameters`` make (JoblogError
    otherwise: rows of another table must not be mixed in); an unfinished last line (a
    writer killed mid-row) is cut off first, so the new rows do not glue onto it.
    """
    with contextlib.suppress(FileNotFoundError):
        _check_and_trim(path, parameters)
    with path.open("a", encoding=_ENCODING, errors=_ERRORS, newline="\n") as stream:
        yield JoblogWriter(stream, parameters)


def _check_and_trim(path: Path, parameters: Sequence[str]) -> None:
    with path.open("rb+") as fh:
        first = fh.readline()
        if not first:
            return
        if not first.endswith(b"\n"):
            fh.truncate(0)  # even the header is unfinished: start over
            return
        if first.decode(_ENCODING, _ERRORS) != header(parameters):
            raise JoblogError(f"{path}: its header {first!r} is not the one for the "
                              f"parameters {list(parameters)}; expected "
                              f"{header(parameters)!r}")
        end = fh.seek(0, os.SEEK_END)
        position = end
        while position > 0:  # bounded: steps back through a finite file
            step = min(_TAIL_STEP, position)
            fh.seek(position - step)
            chunk = fh.read(step)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                last_end = position - step + newline + 1
                if last_end != end:
                    fh.truncate(last_end)
                return
            position -= step


def read_joblog(path: Path) -> Iterator[JoblogRow]:
    """The rows of ``path`` in file order, read one line at a time.

    Raises JoblogError (naming the file and line number) for a missing or malformed header
    or a malformed complete line; an unfinished last line (no newline: its writer was
    killed mid-row) is skipped.  FileNotFoundError if there is no file.
    """
    with path.open("r", encoding=_ENCODING, errors=_ERRORS, newline="\n") as fh:
        first = fh.readline()
        if not first.endswith("\n"):
            raise JoblogError(f"{path}: line 1: expected the header line, got {first!r}")
        try:
            parameters = parse_header(first[:-1])
        except ValueError as exc:
            raise JoblogError(f"{path}: line 1: {exc}") from None
        for lineno, line in enumerate(fh, start=2):  # bounded by the file
            if not line.endswith("\n"):
                return  # the unfinished row of a killed writer
            try:
                yield parse_row(line[:-1], parameters)
            except ValueError as exc:
                raise JoblogError(f"{path}: line {lineno}: {exc}") from None


def read_parameters(path: Path) -> tuple[str, ...]:
    """The parameter column names of ``path``'s header (JoblogError as :func:`read_joblog`)."""
    with path.open("r", encoding=_ENCODING, errors=_ERRORS, newline="\n") as fh:
        first = fh.readline()
    if not first.endswith("\n"):
        raise JoblogError(f"{path}: line 1: expected the header line, got {first!r}")
    try:
        return parse_header(first[:-1])
    except ValueError as exc:
        raise JoblogError(f"{path}: line 1: {exc}") from None


def valid_seqs(path: Path) -> set[int]:
    """The task numbers with a row whose status is ``ok``: the tasks ``resume`` need not run
    again.  Once ok stays ok: a later row of the same task with another status (a
    speculative copy that lost) does not take the valid result away."""
    return {row.seq for row in read_joblog(path) if row.ok}
