"""Reading a finished job: the per-job part of readlog.pl (ARTIFEX.md §2.5, §4.6).

A job made by :mod:`cluster.jobs` leaves ``<id>.log`` (product label on the first line, echoed
commands, interpreter output, ``/usr/bin/time -f "%U %S %E %P"`` lines, and a ``---`` line
between the stages of a two-stage test) and ``<id>.md5`` (md5sum output of the final raster).
:func:`classify` turns those texts into a :class:`cluster.records.JobResult`;
:func:`log_entry` formats the block the node appends to its ``$m.log``.

Error codes (ARTIFEX.md §2.5), decided line by line; the first error found wins, except that a
crash supersedes a read error of the same stage and a timeout supersedes everything:

====================================================  =========  =========
log line                                               stage 1    stage 2
====================================================  =========  =========
"Unrecoverable error", "Command exited with non-zero   1          2
status", "Warning interpreter exited with error
code", "Unable to open the initial device", "Couldn't
initialise file" (gs 10 on an unreadable PDF, exit 0),
"Command terminated by signal N" (N != 11)
input missing: "Unable to open ...", "cannot open X:   5          6
No such file" (sh, mutool), gs's "/undefinedfilename
in (X)" (a file named on the command line)
"Segmentation fault", "Backtrace:", "Command           8 (7 in a  9
terminated by signal 11"                               two-stage
                                                       test)
the job was killed (``killed`` or a "killed: timeout"  3          4
line)
no md5 and none of the above                           10
====================================================  =========  =========

The md5 is the last md5 line of the ``.md5`` text, never one from the log (the log of a
two-stage test holds the md5 of the intermediate file, which is informational).  It is
forced to ``"0"`` when the error is not 0.  time1..time3 are the user CPU seconds (%U) of the
time lines of stage 1, stage 2, and any later one.

Deliberate differences from readlog.pl: readlog.pl re-read the node's ``$m.out`` to turn a
shell "Segmentation fault ... temp/<id>.log" message into 7 or 8; our jobs run every binary
under ``/usr/bin/time``, which writes "Command terminated by signal 11" into the log itself.
readlog.pl filled time1, time2, time3 in order of appearance and skipped a zero time; we file
each time line under its stage.  Missing input is recognised from the messages of today's
sh, gs and mutool as well as from "Unable to open", and gs 10's "Couldn't initialise file"
(an unreadable PDF, which gs answers with exit status 0 and no page) is a read error.
"""

from __future__ import annotations

import dataclasses
import re

from cluster.records import (
    ERROR_INTERNAL,
    ERROR_MISSING_INPUT,
    ERROR_MISSING_STAGE2,
    ERROR_NONE,
    ERROR_READ,
    ERROR_READ_STAGE2,
    ERROR_SEGFAULT,
    ERROR_SEGFAULT_STAGE1,
    ERROR_SEGFAULT_STAGE2,
    ERROR_TIMEOUT,
    ERROR_TIMEOUT_STAGE2,
    JobResult,
)

#: The line run.py appends to a killed job's log block (and readlog.pl looked for).
KILLED_LINE = "killed: timeout"
#: How the label of a two-stage test ends (``gs pdfwrite``, ``pcl pdfwrite``, ``gs
#: xpswrite``: cluster.jobs.commands.TWO_STAGE's stage-1 devices; the node side imports no
#: job code, so they are spelled out here).
_TWO_STAGE_LABELS = (" pdfwrite", " ps2write", " xpswrite")
#: The stage divider of two-stage tests.
DIVIDER = "---"

_MD5_LINES = (
    re.compile(r"([0-9a-f]{32})"),                # bare digest
    re.compile(r"([0-9a-f]{32}) [ *](?:-|\S.*)"),  # md5sum: "<hex>  -", "<hex>  ./temp/x"
    re.compile(r"MD5 .+ = ([0-9a-f]{32})"),       # BSD/macOS md5
)
#: /usr/bin/time -f "%U %S %E %P": "0.05 0.01 0:00.07 98%"; %E may be h:mm:ss, %P may be "?",
#: and a node with a non-C locale may write decimal commas.
_TIME_LINE = re.compile(
    r"(\d+[.,]\d+) (\d+[.,]\d+) (?:\d+:)?\d+:\d\d(?:[.,]\d+)? (?:\d+|\?)%\s*$")
_SIGNAL = re.compile(r"Command terminated by signal (\d+)")
_MISSING = (
    re.compile(r"Unable to open(?! the initial device)"),
    re.compile(r"cannot open .+: No such file"),      # dash "sh: 1: cannot open X: No such
    re.compile(r"/undefinedfilename in \("),          # file", mutool; gs naming an argument
)
_READ_ERRORS = ("Unrecoverable error", "Command exited with non-zero status",
                "Warning interpreter exited with error code", "Unable to open the initial device",
                # gs >= 9.55's PDF interpreter on a file it cannot read at all: it says
                # this, renders no page and still exits 0.
                "Couldn't initialise file")
_CRASHES = ("Segmentation fault", "Backtrace:")

_READ, _MISSING_KIND, _CRASH = "read", "missing", "crash"
_CODES = {  # (kind, stage) -> code; stage 1 of a two-stage test crashing is 7
    (_READ, 1): ERROR_READ, (_READ, 2): ERROR_READ_STAGE2,
    (_MISSING_KIND, 1): ERROR_MISSING_INPUT, (_MISSING_KIND, 2): ERROR_MISSING_STAGE2,
    (_CRASH, 1): ERROR_SEGFAULT, (_CRASH, 2): ERROR_SEGFAULT_STAGE2,
}


UNKNOWN_PRODUCT = "unknown"
SHELL_PRODUCT = "shell"
#: The label of a sweep task's log (docs/sweeps.md): the rest of its log is the command's stderr,
#: which says nothing in gs's words, so only the exit status, a timeout and the md5 count.
SWEEP_PRODUCT = "sweep"


def is_sweep_log(log_text: str | bytes | None) -> bool:
    """Whether a job's log is a sweep task's (its first line is :data:`SWEEP_PRODUCT`)."""
    first = _text(log_text).partition("\n")[0]
    return first.strip() == SWEEP_PRODUCT

def _text(value: str | bytes | None) -> str:
    """Log contents as text whatever the node managed to read (never raises)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _line_kind(line: str) -> str | None:
    """Which kind of error a log line reports, if any."""
    for pattern in _MISSING:
        if pattern.search(line):
            return _MISSING_KIND
    m = _SIGNAL.search(line)
    if m:
        return _CRASH if m.group(1) == "11" else _READ
    if any(word in line for word in _CRASHES):
        return _CRASH
    if any(word in line for word in _READ_ERRORS):
        return _READ
    return None


def final_md5(md5_text: str | bytes | None) -> str | None:
    """The last md5 digest in the text of a ``.md5`` file, or None."""
    found = None
    for line in _text(md5_text).splitlines():
        line = line.strip()
        for pattern in _MD5_LINES:
            m = pattern.fullmatch(line)
            if m:
                found = m.group(1)
                break
    return found


def classify(name: str, log_text: str | bytes | None, md5_text: str | bytes | None,
             killed: bool, machine: str = "", exit_status: int | None = None) -> JobResult:
    """The result of job ``name`` from its log and md5 texts (see the module docstring).

    ``exit_status`` is the exit status of the job's shell, where the node knows it.  Only
    products ``shell`` and ``sweep`` use it (a failing command is an error 1; a sweep's log
    is its command's stderr and is not read for gs's words): gs and mupdf jobs report
    their programs' failures through ``/usr/bin/time`` lines, and their shells end with
    housekeeping such as ``rm -f`` whose status says nothing.

    Never raises: empty or garbled input gives error 10 (3 when killed).
    """
    lines = _text(log_text).splitlines()
    # A log without its label line still needs a product for the .tab (and the protocol).
    product = " ".join(lines[0].split()) if lines and lines[0].strip() else UNKNOWN_PRODUCT
    two_stage = product.endswith(_TWO_STAGE_LABELS)
    stage = 1
    error = ERROR_NONE
    error_stage = 0
    times = [0.0, 0.0, 0.0]
    next_slot = 0
    sweep = product == SWEEP_PRODUCT
    for line in lines[1:]:
        line = line.rstrip("\r")
        if sweep:
            # A sweep task is judged by its exit status and the node's kill; only a timeout
            # line counts (the node's own log entry of a killed task carries one).
            killed = killed or line.strip() == KILLED_LINE
            continue
        if line.strip() == DIVIDER:
            stage = 2
            continue
        if line.strip() == KILLED_LINE:
            killed = True
            continue
        m = _TIME_LINE.search(line)
        if m:
            # Stage 1's time goes to time1 and stage 2's to time2 even when one is missing.
            slot = min(max(next_slot, stage - 1), 2)
            times[slot] = float(m.group(1).replace(",", "."))
            next_slot = slot + 1
            continue
        kind = _line_kind(line)
        if kind is None:
            continue
        code = _CODES[kind, stage]
        if kind == _CRASH and stage == 1 and two_stage:
            code = ERROR_SEGFAULT_STAGE1
        if error == ERROR_NONE or (
                kind == _CRASH and error_stage == stage
                and error in (ERROR_READ, ERROR_READ_STAGE2)):
            # A crash is the better diagnosis of a stage that also reported a read error.
            error, error_stage = code, stage
    if product in (SHELL_PRODUCT, SWEEP_PRODUCT) and exit_status and error == ERROR_NONE:
        error = ERROR_READ
    if killed:
        error = ERROR_TIMEOUT_STAGE2 if stage == 2 else ERROR_TIMEOUT
    md5 = final_md5(md5_text)
    if error == ERROR_NONE and md5 is None:
        error = ERROR_INTERNAL
    return JobResult(name=name, error=error, time1=times[0], time2=times[1], time3=times[2],
                     md5=md5 if error == ERROR_NONE and md5 is not None else "0",
                     product=product, machine=machine)


def log_entry(name: str, log_text: str | bytes | None, md5_text: str | bytes | None,
              killed: bool) -> str:
    """The block a node appends to ``$m.log`` for one finished job (ARTIFEX.md §4.6).

    ``===name===``, the log, the md5 text, ``killed: timeout`` when killed, a blank line;
    each part ends with a newline.
    """
    parts = [f"==={name}===\n"]
    for text in (_text(log_text), _text(md5_text)):
        if text:
            parts.append(text if text.endswith("\n") else text + "\n")
    if killed:
        parts.append(KILLED_LINE + "\n")
    parts.append("\n")
    return "".join(parts)


def with_wall_time(result: JobResult, seconds: float) -> JobResult:
    """A ``shell`` job's result with its wall seconds as ``time1`` (docs/results.md).

    A shell command runs under no ``/usr/bin/time``, so its log has no time line and its
    times were all 0: the master could neither order such tests slowest first nor notice
    them getting slower.  The node knows when the job started and ended (its slot's
    clock); that span, to the hundredth, is its time.  Any other product's result is
    returned as it is (its times are its programs' user CPU seconds).
    """
    if result.product != SHELL_PRODUCT or result.time1 or result.time2 or result.time3:
        return result
    return dataclasses.replace(result, time1=round(max(seconds, 0.0), 2))
