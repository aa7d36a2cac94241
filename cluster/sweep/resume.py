"""Which tasks a ``resume`` run leaves out: those with a valid result in the run it resumes.

A sweep run queued with ``resume=<run id>`` (docs/sweeps.md, section 8) runs only the tasks
that are not valid in ``archive/<run id>/``.  A task is valid there when all three hold:

* ``archive/<run id>/results.tsv`` (:mod:`cluster.sweep.joblog`) has a row with the task's
  number (``Seq``) and status ``ok`` (once ok stays ok, as :func:`joblog.valid_seqs`);
* that row's parameter columns are the task's, names and values, in the table's order: a
  table whose row 7 changed runs task 7 again, even with the same number;
* ``archive/<run id>/results/<task id>/`` is a folder.  The task id hashes the expanded
  command and the row (:mod:`cluster.sweep.expand`), so a task whose command changed is
  run again too.

Memory stays bounded for a table of a million rows: :class:`ResumeFilter` keeps one 64-bit
key per valid row (a hash of its number and parameters), not the rows, and asks the file
system about a task's folder only when its key is there.  Nothing here lists every task.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from cluster.sweep.expand import Task
from cluster.sweep.joblog import read_joblog

#: The run's table of task rows in its archive folder.
RESULTS_TSV = "results.tsv"
#: The folder of the tasks' result folders in a run's archive folder.
RESULTS_DIR = "results"


def row_key(seq: int, params: Sequence[tuple[str, str]]) -> int:
    """A 64-bit key of a task number and its (column, value) pairs, in order.

    The bytes hashed are unambiguous: the number, then each name and value ended by NUL (a
    name holds no NUL; a value with one never reaches a table).  Two different rows share a
    key with a chance of 2**-64, far below a disk's error rate."""
    digest = hashlib.blake2b(f"{seq}\0".encode(), digest_size=8)
    for name, value in params:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0"
                      + value.encode("utf-8", "surrogateescape") + b"\0")
    return int.from_bytes(digest.digest(), "big")


def valid_keys(results_tsv: Path) -> set[int]:
    """The :func:`row_key` of every row of ``results_tsv`` whose status is ``ok``.

    FileNotFoundError when there is no such file, JoblogError (naming the file and line)
    when it is not in joblog.py's format."""
    return {row_key(row.seq, row.params) for row in read_joblog(results_tsv) if row.ok}


class ResumeFilter:
    """The tasks of a sweep that a resume of the run archived in ``archive`` must run.

    ``header`` is the sweep's table header (its column names in order).  Call the filter
    with a task: True when the task has no valid result in that run (the module's
    docstring says what valid is).  The run's ``results.tsv`` is read once, here
    (FileNotFoundError or JoblogError as :func:`valid_keys`); ``skipped`` and ``kept``
    count the calls' answers, for the run's log line."""

    def __init__(self, archive: Path, header: Sequence[str]) -> None:
        self.archive = archive
        self.header = tuple(header)
        self.results = archive / RESULTS_DIR
        self._valid = valid_keys(archive / RESULTS_TSV)
        self.valid_rows = len(self._valid)
        self.skipped = 0
        self.kept = 0

    def __call__(self, task: Task) -> bool:
        key = row_key(task.number, tuple(zip(self.header, task.row.values, strict=True)))
        if key in self._valid and (self.results / task.task_id).is_dir():
            self.skipped += 1
            return False
        self.kept += 1
        return True

    def summary(self) -> str:
        """``resume: <n> of <total> tasks to run, <m> valid in run <id>``."""
        return (f"resume: {self.kept} of {self.kept + self.skipped} tasks to run, "
                f"{self.skipped} valid in run {self.archive.name}")


__all__ = ["RESULTS_DIR", "RESULTS_TSV", "ResumeFilter", "row_key", "valid_keys"]
