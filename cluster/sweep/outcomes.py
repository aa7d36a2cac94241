"""Each task's outcome at the end of a sweep run: the row it gets in ``results.tsv``.

A run's tries are lines of ``sweep-attempts.tsv`` (:mod:`cluster.sweep.attempts`), in the
order they happened, not in task order.  :class:`FinalAttempts` reads them once and keeps,
per task, the try that stands for it and how many tries it had; :func:`outcomes` then walks
the sweep's tasks in task order (a stream from the table) and makes each one's
:class:`~cluster.sweep.joblog.JoblogRow`:

* **a task tried in this run**: from its standing try (below).  ``Host``, ``Starttime``,
  ``JobRuntime``, ``Receive`` and the status are the try's; ``Send`` is the bytes of the
  task's ``[inputs]`` files; ``Exitval`` is the exit status the node saw, ``Signal`` 0 (the
  shell folds a signal into its status as 128+n), except a ``timeout``: ``Exitval`` -1 and
  ``Signal`` 15, as GNU parallel writes a job it timed out; ``attempts`` counts every try.
* **a task a resumed run holds** (``resume=<run id>``: the ``previous`` rows, that run's
  ``results.tsv``): when this run did not try it, its row is the previous run's row with
  the same ``Seq`` whose command and parameters make the same task id (so a changed table
  or command never lends a row to another task).  The row is copied as it is.
* **a task never tried**: status ``failed: not run`` (:data:`NOT_RUN`), ``Host`` empty,
  times 0, ``Exitval`` -1, ``Signal`` 0, ``attempts`` 0.  A run that ended early (aborted,
  out of time) leaves such tasks; a complete run has none.

**The standing try** of a task: its first ``final`` try with status ``ok`` (first valid
result wins: a speculative copy that finished later does not take it away); else its last
``final`` try; else (a run that ended while the task still had tries left) its last try.

**Memory.**  The previous rows and the tasks are streams (both in task order); only
:class:`FinalAttempts` holds one entry per task tried: the task id as 12 bytes and the try
packed into one bytes object (times, exit status, bytes received, indexes of its node and
status in tables of distinct values, the number of tries), about 180 bytes a task with the
dict's own share (measured with tracemalloc): some 180 MB for a million tasks tried, plus
each distinct status text once (a failure reason that names its values is distinct per
task).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.sweep.attempts import Attempt, read_attempts
from cluster.sweep.expand import Task, task_id
from cluster.sweep.joblog import JoblogRow

#: The status of a task that no run tried.
NOT_RUN = "failed: not run"
#: Where a task's row came from.
TRIED = "tried"        # this run tried it
RESUMED = "resumed"    # the run it resumes holds it
UNTRIED = "untried"    # nobody tried it

#: start, runtime, exit status, bytes received, node index, status index, try, final,
#: and the task's number of tries so far.
_PACK = struct.Struct("<ddqqIIH?H")
#: The largest try number and number of tries kept (an unsigned 16-bit field; a task
#: has at most 11 tries and a few speculative copies).
_MAX_COUNT = 0xFFFF
_TIMEOUT = "timeout"
_SIGTERM = 15


@dataclass(frozen=True)
class Standing:
    """A task's standing try (see the module docstring) and how many tries it had."""

    attempt: Attempt
    tries: int


class FinalAttempts:
    """Per task id, the standing try and the number of tries (the module docstring)."""

    def __init__(self) -> None:
        self._by_task: dict[bytes, bytes] = {}
        self._nodes: list[str] = []
        self._node_index: dict[str, int] = {}
        self._statuses: list[str] = []
        self._status_index: dict[str, int] = {}

    @classmethod
    def read(cls, path: Path) -> FinalAttempts:
        """The standing tries of the attempts file ``path`` (none when it is missing)."""
        finals = cls()
        try:
            for attempt in read_attempts(path):
                finals.add(attempt)
        except FileNotFoundError:
            pass
        return finals

    def __len__(self) -> int:
        return len(self._by_task)

    def add(self, attempt: Attempt) -> None:
        """Count one more try of its task; it becomes the standing try by the rule."""
        key = _key(attempt.task)
        held = self._by_task.get(key)
        if held is None:
            self._by_task[key] = self._pack(attempt, 1)
            return
        old = self._unpack(attempt.task, held)
        keep_old = (old.attempt.final and old.attempt.status == "ok") \
            or (old.attempt.final and not attempt.final)
        self._by_task[key] = self._pack(old.attempt if keep_old else attempt, old.tries + 1)

    def get(self, task: str) -> Standing | None:
        """The standing try of ``task`` and its number of tries, or None if never tried."""
        held = self._by_task.get(_key(task))
        return None if held is None else self._unpack(task, held)

    def _pack(self, attempt: Attempt, tries: int) -> bytes:
        return _PACK.pack(attempt.start, attempt.runtime, attempt.exit_status,
                          attempt.receive, _index(self._nodes, self._node_index, attempt.node),
                          _index(self._statuses, self._status_index, attempt.status),
                          min(attempt.attempt, _MAX_COUNT), attempt.final,
                          min(tries, _MAX_COUNT))

    def _unpack(self, task: str, packed: bytes) -> Standing:
        start, runtime, exit_status, receive, node, status, number, final, tries = \
            _PACK.unpack(packed)
        return Standing(Attempt(task, self._nodes[node], start, runtime, exit_status,
                                receive, self._statuses[status], number, final), tries)


def _key(task: str) -> bytes:
    """A task id as few bytes: its 24 hex digits as 12 bytes (any other text as UTF-8)."""
    try:
        return bytes.fromhex(task) if len(task) % 2 == 0 else task.encode("utf-8")
    except ValueError:
        return task.encode("utf-8")


def _index(values: list[str], index: dict[str, int], value: str) -> int:
    found = index.get(value)
    if found is None:
        found = index[value] = len(values)
        values.append(value)
    return found


@dataclass(frozen=True)
class TaskOutcome:
    """A task, its row of ``results.tsv``, and where the row came from (:data:`TRIED`,
    :data:`RESUMED` or :data:`UNTRIED`)."""

    task: Task
    row: JoblogRow
    source: str


def outcomes(tasks: Iterable[Task], header: Sequence[str], finals: FinalAttempts,
             previous: Iterable[JoblogRow] = ()) -> Iterator[TaskOutcome]:
    """Each task's outcome, in the order of ``tasks`` (task order); see the module
    docstring.  ``previous``: the resumed run's rows, in ``Seq`` order (its results.tsv)."""
    header = tuple(header)
    earlier = iter(previous)
    pending = next(earlier, None)
    for task in tasks:
        while pending is not None and pending.seq < task.number:
            pending = next(earlier, None)
        params = tuple(zip(header, task.row.values, strict=True))
        standing = finals.get(task.task_id)
        if standing is not None:
            yield TaskOutcome(task, _tried_row(task, params, standing), TRIED)
        elif pending is not None and pending.seq == task.number \
                and _same_task(pending, task.task_id):
            yield TaskOutcome(task, pending, RESUMED)
        else:
            yield TaskOutcome(task, JoblogRow(task.number, "", 0.0, 0.0, _send(task), 0, -1,
                                              0, task.command, params, NOT_RUN, 0), UNTRIED)


def _tried_row(task: Task, params: tuple[tuple[str, str], ...],
               standing: Standing) -> JoblogRow:
    attempt = standing.attempt
    exitval, signal = ((-1, _SIGTERM) if attempt.status == _TIMEOUT
                       else (attempt.exit_status, 0))
    return JoblogRow(task.number, attempt.node, attempt.start, attempt.runtime, _send(task),
                     attempt.receive, exitval, signal, task.command, params, attempt.status,
                     standing.tries)


def _send(task: Task) -> int:
    """The bytes of the task's input files (GNU parallel's ``Send``)."""
    return sum(len(text.encode("utf-8")) for _, text in task.inputs)


def _same_task(row: JoblogRow, wanted: str) -> bool:
    """Whether ``row`` (of another run) is the task ``wanted``: its command and parameters
    hash to that id."""
    try:
        return task_id(row.command, [n for n, _ in row.params],
                       [v for _, v in row.params]) == wanted
    except ValueError:
        return False
