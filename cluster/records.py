"""The records every part of the cluster shares: a job line and a job's result.

A job line is seed 000's format ``<test> <logfile> true ; <command string>``.  The command
string is for ``sh`` and may use the placeholders a node substitutes before running it:

``__temp__``   the job's own temporary folder on the node (a sweep task's: the run's)
``__bin__``    the ``bin`` directory of the product the node built
``__tests__``  the node's mirror of the test corpus
``__baseline__``  the ``bin`` directory of the baseline build (job.start ``baseline``;
               bmpcmp jobs only; left as is when the run has no baseline)
``__python__`` the node's own Python interpreter, shell-quoted; the node puts the project
               on ``PYTHONPATH`` so ``__python__ -m cluster.bmpcmp`` works from any directory
``__tree__``   the node's build folder of the run's tree (the fetched tree, built there):
               for a sweep run, the sweep folder (docs/sweeps.md)

The master may put a job's own timeout in place of ``true``: ``<test> <logfile>
timeout=<seconds> ; <command string>`` (docs/results.md, "Timeouts that fit each test";
written into the run's jobs file once, when the master orders it); the node kills that job
after the shorter of it and its own limit.  :data:`JOB_TIMEOUT_WORD` is the word's prefix,
:func:`timed_line` writes it and :func:`untimed_line` takes it out again.

A result carries what the 10-column ``.tab`` of ARTIFEX.md §2.5 needs, less the run's
revision, which the master adds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TEMP = "__temp__"
BIN = "__bin__"
TESTS = "__tests__"
BASELINE = "__baseline__"
PYTHON = "__python__"
TREE_DIR = "__tree__"
#: Every placeholder a node substitutes (no test id may contain one).
PLACEHOLDERS = (TEMP, BIN, TESTS, BASELINE, PYTHON, TREE_DIR)

#: Test ids: no whitespace, no control characters, nothing a shell would expand unquoted.
TEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+,@%=-]{0,400}")
MD5 = re.compile(r"[0-9a-f]{32}")

#: How the third word of a job line starts when it carries the job's own timeout.
JOB_TIMEOUT_WORD = "timeout="
#: The largest own timeout a job line may carry [s] (a day: the node's ``job_timeout``'s
#: bound).
MAX_OWN_TIMEOUT = 86400.0


def timed_line(line: str, seconds: float) -> str:
    """The job line ``line`` (``<test> <logfile> true ; <command>``) carrying its own timeout
    ``seconds`` in place of ``true``; unchanged when ``seconds`` is 0 (no own timeout)."""
    if not seconds:
        return line
    name, logfile, rest = line.split(" ", 2)
    return f"{name} {logfile} {JOB_TIMEOUT_WORD}{seconds:.6g} {rest[len('true '):]}"


def untimed_line(line: str) -> str:
    """The job line ``line`` with ``true`` in place of its own timeout, if it has one: what
    the job runs, whatever its timeout (a result cache key, :mod:`cluster.master.cache`)."""
    if " " + JOB_TIMEOUT_WORD not in line:  # the usual line: one scan, no split
        return line
    name, logfile, third, rest = line.split(" ", 3)
    if not third.startswith(JOB_TIMEOUT_WORD):
        return line
    return f"{name} {logfile} true {rest}"


#: Error codes of ARTIFEX.md §2.5 (readlog.pl).
ERROR_NONE = 0
ERROR_READ = 1
ERROR_READ_STAGE2 = 2
ERROR_TIMEOUT = 3
ERROR_TIMEOUT_STAGE2 = 4
ERROR_MISSING_INPUT = 5
ERROR_MISSING_STAGE2 = 6
ERROR_SEGFAULT_STAGE1 = 7
ERROR_SEGFAULT = 8
ERROR_SEGFAULT_STAGE2 = 9
ERROR_INTERNAL = 10
#: Not from a node: the master's row for a job whose node was lost in a run with
#: ``no_reschedule`` (docs/runoptions.md, section 3): the job is never handed out again
#: (machine: the lost node).
ERROR_LOST = -1
#: The product column of such a row (the master does not know what the job would have run).
LOST_PRODUCT = "lost"

#: The words of each code in reports.  The stage-2 codes and 7 cover every two-stage test:
#: stage 1 (gs, gpcl6 or gxps) runs pdfwrite, ps2write or xpswrite and generates a PDF, PS
#: or XPS file.
ERROR_NAMES = {
    0: "none",
    1: "error reading input",
    2: "error reading the generated PDF/PS/XPS",
    3: "timeout",
    4: "timeout reading the generated PDF/PS/XPS",
    5: "input missing",
    6: "generated PDF/PS/XPS missing",
    7: "segfault during pdfwrite/ps2write/xpswrite",
    8: "segfault",
    9: "segfault reading the generated PDF/PS/XPS",
    10: "internal error (no md5 produced)",
    -1: "lost with its node, not run again (no_reschedule)",
}
SEGFAULTS = frozenset({7, 8, 9})


@dataclass(frozen=True, slots=True)
class Job:
    """One line of a jobs file; ``timeout``: the job's own timeout in seconds, 0 for none
    (the node's limit; only a JOBS reply's line carries one: :func:`timed_line`)."""

    name: str
    logfile: str
    command: str
    timeout: float = 0.0

    @property
    def line(self) -> str:
        return timed_line(f"{self.name} {self.logfile} true ; {self.command}", self.timeout)

    @classmethod
    def parse(cls, line: str) -> Job:
        """Parse ``<test> <logfile> true ; <command>`` (or ``timeout=<seconds>`` in place of
        ``true``, a number more than 0 and at most :data:`MAX_OWN_TIMEOUT`); ValueError
        names what is wrong."""
        parts = line.rstrip("\n").split(" ", 4)
        if len(parts) < 5 or parts[3] != ";" or not (
                parts[2] == "true" or parts[2].startswith(JOB_TIMEOUT_WORD)):
            raise ValueError("expected '<test> <logfile> true ; <command>'")
        name, logfile, third, _, command = parts
        if not TEST_ID.fullmatch(name):
            raise ValueError(f"test id {name!r} has characters outside [A-Za-z0-9_.+,@%=-]")
        if not command.strip():
            raise ValueError("empty command")
        timeout = 0.0
        if third != "true":
            try:
                timeout = float(third[len(JOB_TIMEOUT_WORD):])
            except ValueError:
                timeout = -1.0
            if not 0 < timeout <= MAX_OWN_TIMEOUT:  # also false for nan
                raise ValueError(f"job timeout {third[:40]!r}: expected timeout=<seconds>, "
                                 f"more than 0 and at most {MAX_OWN_TIMEOUT:g}")
        return cls(name, logfile, command, timeout)


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a node found out by running one job."""

    name: str
    error: int
    time1: float
    time2: float
    time3: float
    md5: str
    product: str
    machine: str = ""

    def tab_line(self, rev: str) -> str:
        """The 10 TAB-separated columns of ARTIFEX.md §2.5 (md5 forced to 0 on error)."""
        md5 = self.md5 if self.error == 0 else "0"
        return "\t".join((self.name, str(self.error), f"{self.time1:.2f}", f"{self.time2:.2f}",
                          f"{self.time3:.2f}", "0", md5, rev, self.product, self.machine))
