"""The jobs of a sweep run (product ``sweep``; the user's side is docs/sweeps.md).

One job per task of the sweep (:mod:`cluster.sweep.expand`), made while the table is
streamed (:func:`sweep_jobs` yields them: a table of a million rows is never a list).  The
job's test name is the task id, so it is the same in every run of the sweep; its log is
``__temp__/<task id>.log`` as for every job.  Below, ``<id>`` is ``__temp__/<task id>``.

What a task's job line does on the node (:func:`task_command`), once the node has made
the task's folder ``<id>/`` afresh with the sweep folder linked into it
(:func:`cluster.node.sweepresults.prepare_task`), all in the slot's subshell of the job
and with the shell's built-ins only -- no program is started but the command's own:

1. The job's stderr goes to ``<id>.err`` when ``stderr`` is one of the sweep's
   ``[results]``, else to ``/dev/null``; its stdout likewise to ``<id>.out`` or
   ``/dev/null``.  So a task whose streams are not results makes no file for them.
2. It goes into the task's folder and writes each ``[inputs]`` file there with ``printf``,
   its text the printf format :func:`printf_format` makes of it, single-quoted by
   :func:`quote_for_node`.  Whatever the sweep folder put in the folder under an input's
   top-level name is removed first (``rm`` runs only then): the input wins, and nothing is
   ever written through a link into the sweep folder.  An input's folders are made first
   (``mkdir -p``).
3. It sets the file-size limit (``ulimit -f``, 512-byte blocks: :func:`size_limit_blocks`
   of ``max_result_bytes``), so a command writing 10 GB is stopped by SIGXFSZ once one
   file passes ``max_result_bytes`` (its exit status is then 153, 128 + SIGXFSZ, or the
   stopped file is larger than ``max_result_bytes``: the node fails the task either way),
   sets and exports ``CLUSTER_SWEEP_DIR`` (:data:`SWEEP_DIR_VARIABLE`) to the absolute path
   of the sweep folder on the node (the ``__tree__`` placeholder), and runs the expanded
   command by ``eval`` -- what ``sh -c`` would do, without starting another shell.
   ``CLUSTER_SLOT`` is the slot's number (set by the slot shell: :mod:`cluster.node.slots`).
   The job's exit status is the command's (readlog: error 1 when not 0), or that of the
   setup step that failed (its complaint in ``<id>.err`` when stderr is a result).

Texts reach the shell single-quoted with every ``__`` written ``_''_`` (the same text to
the shell), so the node's placeholders (``__temp__``, ``__bin__``, ...) are never found
in a user's command or input; a command holding a newline or carriage return (a job line
is one line) is given to ``eval`` through ``printf`` in a command substitution.

The sweep's ``timeout`` is the node's own kill of the job (job.start's ``job_timeout`` of
a sweep run, :func:`node_job_timeout`): SIGHUP to the job's process tree, then SIGKILL,
and readlog reports it as a timeout (error 3).  The node then takes the results from the
task's folder, ``<id>.out`` and ``<id>.err`` and removes the rest
(:meth:`cluster.node.sweepresults.Outbox.take`).  The job's log ``<id>.log`` is never
written: the node knows a sweep run's tasks by job.start.

Cost per task, for the 5,000 tiny tasks of bench/sweep.py: nothing but the slot's
subshell (a fork, no program started) and the command's own work; ``mkdir -p`` only for
an input in a subfolder, ``rm`` only for an input that replaces an entry of the sweep
folder.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator

# One rule for every job's file-size limit, a sweep task's and a shell job's (the node's).
from cluster.node.slots import size_limit_blocks as size_limit_blocks
from cluster.records import TEMP, TREE_DIR, Job
from cluster.sweep.expand import Task, tasks
from cluster.sweep.spec import STDERR, STDOUT, SweepSpec

#: The variable holding the sweep folder's absolute path on the node, for the command.
SWEEP_DIR_VARIABLE = "CLUSTER_SWEEP_DIR"
#: What the job line makes beside ``__temp__/<id>``: the command's stdout and stderr.
OUT_SUFFIX, ERR_SUFFIX = ".out", ".err"


def node_job_timeout(timeout: float) -> float:
    """The seconds a node lets a task's job run before it kills it (job.start's
    ``job_timeout`` of a sweep run): the sweep's own ``timeout``."""
    return float(timeout)


def quote_for_node(text: str) -> str:
    """``text`` as one shell word that no node placeholder (``__x__``) can be found in:
    single-quoted (:func:`shlex.quote`), every ``__`` written ``_''_``, which the shell
    reads as the same two underscores."""
    return shlex.quote(text).replace("__", "_''_")


def printf_format(text: str) -> str:
    """A printf format printing ``text`` exactly, on one line: ``\\`` and ``%`` doubled,
    every control character (newline included), and a leading ``-``, as a three-digit octal
    escape."""
    out = text.replace("\\", "\\\\").replace("%", "%%")
    out = "".join(f"\\{ord(c):03o}" if ord(c) < 32 or ord(c) == 127 else c for c in out)
    # A format starting with '-' would be read as an option.
    return f"\\055{out[1:]}" if out.startswith("-") else out


def _write_inputs(inputs: tuple[tuple[str, str], ...]) -> list[str]:
    """The shell steps writing ``inputs`` (name, text) in the current folder."""
    steps: list[str] = []
    made: set[str] = set()
    for top in dict.fromkeys(name.split("/", 1)[0] for name, _ in inputs):
        quoted = shlex.quote(top)
        # What the sweep folder put there by that name goes first (``[`` is a built-in:
        # ``rm`` runs only when there is something).
        steps.append(f"{{ ! {{ [ -e {quoted} ] || [ -L {quoted} ] ; }} || "
                     f"rm -rf -- {quoted} ; }}")
    for name, text in inputs:
        folder = name.rpartition("/")[0]
        if folder and folder not in made:
            steps.append(f"mkdir -p -- {shlex.quote(folder)}")
            made.add(folder)
        quoted = shlex.quote(name)
        steps.append(f"printf {quote_for_node(printf_format(text))} > {quoted}" if text
                     else f": > {quoted}")
    return steps


def _command_word(command: str) -> str:
    """What ``eval`` gets of ``command`` in the job line (see the module docstring)."""
    if "\n" in command or "\r" in command:
        return f'"$(printf {quote_for_node(printf_format(command))})"'
    return quote_for_node(command)


def task_command(task: Task, max_result_bytes: int, stdout: bool = True,
                 stderr: bool = True) -> str:
    """The job command of ``task`` with the run's ``max_result_bytes``; ``stdout`` and
    ``stderr``: whether those streams are results of the sweep, kept in ``<id>.out`` and
    ``<id>.err`` (else they go to ``/dev/null``).  The module's docstring says what it
    does."""
    base = f"{TEMP}/{task.task_id}"
    out = f"{base}{OUT_SUFFIX}" if stdout else "/dev/null"
    err = f"{base}{ERR_SUFFIX}" if stderr else "/dev/null"
    steps = [f"cd {base}", *_write_inputs(task.inputs),
             f"ulimit -f {size_limit_blocks(max_result_bytes)}",
             f"{SWEEP_DIR_VARIABLE}={TREE_DIR}", f"export {SWEEP_DIR_VARIABLE}",
             f"eval {_command_word(task.command)} > {out}"]
    return f"{{ {' && '.join(steps)} ; }} 2> {err}"


def task_job(task: Task, max_result_bytes: int, stdout: bool = True,
             stderr: bool = True) -> Job:
    """The job of ``task`` (:func:`task_command`): named by its task id; its log,
    ``__temp__/<id>.log``, is never written (the protocol's job line names one)."""
    return Job(task.task_id, f"{TEMP}/{task.task_id}.log",
               task_command(task, max_result_bytes, stdout, stderr))


def sweep_jobs(spec: SweepSpec, max_result_bytes: int,
               keep: Callable[[Task], bool] | None = None) -> Iterator[Job]:
    """The jobs of the sweep ``spec``, one per task in table order, streamed, each bounded
    by ``max_result_bytes`` (master.conf); with ``keep``, only of the tasks it accepts (a
    resume run's selection, :class:`cluster.sweep.resume.ResumeFilter`).  Every task is
    still expanded, so a bad row stops the list whether or not its task is kept:
    :class:`~cluster.errors.SweepError` (from the expansion) for a bad row or pattern."""
    sources = {result.source for result in spec.results}
    stdout, stderr = STDOUT in sources, STDERR in sources
    for task in tasks(spec):
        if keep is None or keep(task):
            yield task_job(task, max_result_bytes, stdout, stderr)
