"""The jobs of a sweep run (product ``sweep``, issue 23; the user's side is docs/sweeps.md).

One job per task of the sweep (:mod:`cluster.sweep.expand`), made while the table is
streamed (:func:`sweep_jobs` yields them: a table of a million rows is never a list).  The
job's test name is the task id, so it is the same in every run of the sweep; its log is
``__temp__/<task id>.log`` as for every job.

What a task's job line does on the node, in order (:func:`task_command`):

1. ``__temp__/<id>.log`` gets the label line ``sweep`` (:data:`LABEL`; readlog then reads
   the rest of the log as the command's stderr and counts only the exit status, the
   timeout and the md5).
2. The task's folder ``__temp__/<id>/`` is made afresh (``rm -rf`` first: a task run again
   on the same node, after a retry or a slot's restart, starts from nothing) and becomes
   the current directory.
3. Each ``[inputs]`` file is written there: its bytes travel base64-encoded in the job line
   and ``base64 -d`` (coreutils) writes them, so no shell ever reads the text; each name is
   shell-quoted (names are validated relative paths: :mod:`cluster.sweep.names`), and its
   folders are made first (``mkdir -p``).  An empty text is ``: > name``.
4. The expanded command runs as ``sh -c`` of the decoded command, bounded by the sweep's
   ``timeout`` (GNU ``timeout``, then SIGKILL :data:`KILL_AFTER` seconds later), with
   ``CLUSTER_SWEEP_DIR`` (:data:`SWEEP_DIR_VARIABLE`) the absolute path of the sweep folder
   on the node (the ``__tree__`` placeholder: the node's build folder of the pushed sweep
   folder) and ``CLUSTER_SLOT`` the slot's number (set by the slot shell:
   :mod:`cluster.node.slots`).  The command too travels base64-encoded: it may hold
   newlines (a job line is one line) or text such as ``__bin__`` that the node would
   otherwise replace.  Its stdout goes to ``__temp__/<id>.out`` (the node takes its md5 as
   the job's result and removes it, as for product ``shell``), its stderr to the log.
5. When ``timeout`` ended it (exit status :data:`TIMEOUT_STATUS`, GNU's convention), the
   line ``killed: timeout`` is added to the log (readlog: error 3).  The job's exit status
   is the command's (readlog: error 1 when not 0).

Setting up (steps 2 and 3) writes its complaints to the log and stops the job before the
command; no ``.out`` is then written, and the job's result is an error.

The layout on the node, ready for results to come home (a later step of issue 23): the
task's folder holds its inputs and what the command leaves there (the ``[results]``
files); its stdout is ``<id>.out`` and its stderr the log after the label, both beside
the folder, so nothing the command writes can be taken for them.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable, Iterator

from cluster.node.readlog import KILLED_LINE
from cluster.node.readlog import SWEEP_PRODUCT as LABEL  # the first line of a task's log
from cluster.records import TEMP, TREE_DIR, Job
from cluster.sweep.expand import Task, tasks
from cluster.sweep.spec import SweepSpec

#: The variable holding the sweep folder's absolute path on the node, for the command.
SWEEP_DIR_VARIABLE = "CLUSTER_SWEEP_DIR"
#: GNU timeout's exit status when it ended the command.
TIMEOUT_STATUS = 124
#: Seconds after the timeout's SIGTERM that GNU timeout sends SIGKILL.
KILL_AFTER = 5


def _decoded(data: bytes) -> str:
    """Shell code printing ``data``: ``printf %s <base64> | base64 -d``.  The base64
    alphabet holds no character a shell or the node's placeholders (``__x__``) treat
    specially, so the text is never interpreted on the way."""
    return f"printf %s {base64.b64encode(data).decode('ascii')} | base64 -d"


def _write_inputs(inputs: tuple[tuple[str, str], ...]) -> list[str]:
    """The shell steps writing ``inputs`` (name, text) in the current folder."""
    steps: list[str] = []
    made: set[str] = set()
    for name, text in inputs:
        folder = name.rpartition("/")[0]
        if folder and folder not in made:
            steps.append(f"mkdir -p -- {shlex.quote(folder)}")
            made.add(folder)
        data = text.encode("utf-8")
        quoted = shlex.quote(name)
        steps.append(f"{_decoded(data)} > {quoted}" if data else f": > {quoted}")
    return steps


def task_command(task: Task, timeout: float) -> str:
    """The job command of ``task`` with the sweep's per-task ``timeout`` in seconds (the
    module's docstring says what it does)."""
    base = f"{TEMP}/{task.task_id}"
    log = f"{base}.log"
    setup = [f"rm -rf {base}", f"mkdir {base}", f"cd {base}", *_write_inputs(task.inputs)]
    command = _decoded(task.command.encode("utf-8"))
    return (f"echo {LABEL} > {log} ; {{ {' && '.join(setup)} ; }} 2>> {log} && "
            f"{SWEEP_DIR_VARIABLE}={TREE_DIR} timeout -k {KILL_AFTER} {float(timeout)!r} "
            f'sh -c "$({command})" > {base}.out 2>> {log} ; s=$? ; '
            f"if [ $s -eq {TIMEOUT_STATUS} ] ; then echo '{KILLED_LINE}' >> {log} ; fi ; "
            "exit $s")


def task_job(task: Task, timeout: float) -> Job:
    """The job of ``task``: named by its task id, logging to ``__temp__/<id>.log``."""
    return Job(task.task_id, f"{TEMP}/{task.task_id}.log", task_command(task, timeout))


def sweep_jobs(spec: SweepSpec,
               keep: Callable[[Task], bool] | None = None) -> Iterator[Job]:
    """The jobs of the sweep ``spec``, one per task in table order, streamed; with
    ``keep``, only of the tasks it accepts (a resume run's selection,
    :class:`cluster.sweep.resume.ResumeFilter`).  Every task is still expanded, so a bad row
    stops the list whether or not its task is kept: :class:`~cluster.errors.SweepError`
    (from the expansion) for a bad row or pattern."""
    for task in tasks(spec):
        if keep is None or keep(task):
            yield task_job(task, spec.timeout)
