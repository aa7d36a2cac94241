"""The jobs of a sweep run (product ``sweep``, issue 23; the user's side is docs/sweeps.md).

One job per task of the sweep (:mod:`cluster.sweep.expand`), made while the table is
streamed (:func:`sweep_jobs` yields them: a table of a million rows is never a list).  The
job's test name is the task id, so it is the same in every run of the sweep; its log is
``__temp__/<task id>.log`` as for every job.  Below, ``<id>`` is ``__temp__/<task id>``.

What a task's job line does on the node, in order (:func:`task_command`):

1. ``<id>.log`` gets the label line ``sweep`` (:data:`LABEL`; readlog then counts only the
   exit status and the timeout line).  The log holds what the job line itself has to say
   (a setup that failed, a result that could not be staged); the command's stderr is
   ``<id>.err``.
2. Setting up, each step's complaint going to the log: what an earlier run of the task on
   this node left is removed (``rm -rf``, only when there is something: a retry starts
   from nothing); the task's folder ``<id>/`` and its result folder ``<id>.res/`` are made
   (one ``mkdir``); the task's folder becomes the current directory and gets a symbolic
   link to each top-level entry of the sweep folder (``__tree__``, dot files included: the
   shell's globs and one ``ln``),
   except the top-level names the ``[inputs]`` write (the inputs win, and no input is ever
   written through a link into the sweep folder), so ``python3 model.py`` works there as
   in the sweep folder; then each ``[inputs]`` file is written: its bytes travel
   base64-encoded in the job line and ``base64 -d`` (coreutils) writes them, so no shell
   ever reads the text; each name is shell-quoted (names are validated relative paths:
   :mod:`cluster.sweep.names`), and its folders are made first (``mkdir -p``).  An empty
   text is ``: > name``.
3. The file-size limit is set (``ulimit -f``, 512-byte blocks: :func:`size_limit_blocks`
   of ``max_result_bytes``), so a command writing 10 GB is stopped by SIGXFSZ once one
   file passes ``max_result_bytes`` (its exit status is then 153, 128 + SIGXFSZ, or the
   stopped file is larger than ``max_result_bytes``: the node fails the task either way,
   :mod:`cluster.node.sweepresults`).
4. The expanded command runs as ``sh -c`` of the decoded command, bounded by the sweep's
   ``timeout`` (GNU ``timeout``, then SIGKILL :data:`KILL_AFTER` seconds later), with
   ``CLUSTER_SWEEP_DIR`` (:data:`SWEEP_DIR_VARIABLE`) the absolute path of the sweep folder
   on the node (the ``__tree__`` placeholder: the node's build folder of the pushed sweep
   folder) and ``CLUSTER_SLOT`` the slot's number (set by the slot shell:
   :mod:`cluster.node.slots`).  The command too travels base64-encoded: it may hold
   newlines (a job line is one line) or text such as ``__bin__`` that the node would
   otherwise replace.  Its stdout goes to ``<id>.out``, its stderr to ``<id>.err``.
5. When ``timeout`` ended it (exit status :data:`TIMEOUT_STATUS`, GNU's convention), the
   line ``killed: timeout`` is added to the log (readlog: error 3).
6. Each ``[results]`` entry is hard-linked into ``<id>.res/`` under its result name:
   ``stdout`` is ``<id>.out``, ``stderr`` is ``<id>.err``, a file is the task folder's file
   only when it and every folder on its way are there and no symbolic link (``[ -L ]``),
   and it is a regular file (``[ -f ]``): a link could point anywhere.  A result that is
   not there is simply missing from ``<id>.res/``.
7. The task's folder, ``<id>.out`` and ``<id>.err`` are removed (one ``rm``); the job's
   exit status is the command's (readlog: error 1 when not 0), or the failed setup's.

The node then reads ``<id>.res/`` (:mod:`cluster.node.sweepresults`).  A failed setup
skips steps 3 to 6: the result folder stays empty.  A task the node itself kills (its
pool timeout, :func:`node_job_timeout`) leaves its folders to the node to remove.

Cost per task, for the 5,000 tiny tasks of bench/sweep.py: besides the command,
``mkdir`` and ``ln``, one ``base64`` per input and one for the command, ``timeout``,
``sh``, one ``ln`` per result and the final ``rm`` (and the first ``rm`` on a retry); the
rest are shell built-ins.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable, Iterator

from cluster.node.readlog import KILLED_LINE
from cluster.node.readlog import SWEEP_PRODUCT as LABEL  # the first line of a task's log
from cluster.records import TEMP, TREE_DIR, Job
from cluster.sweep.expand import Task, tasks
from cluster.sweep.spec import STDERR, STDOUT, Result, SweepSpec

#: The variable holding the sweep folder's absolute path on the node, for the command.
SWEEP_DIR_VARIABLE = "CLUSTER_SWEEP_DIR"
#: GNU timeout's exit status when it ended the command.
TIMEOUT_STATUS = 124
#: Seconds after the timeout's SIGTERM that GNU timeout sends SIGKILL.
KILL_AFTER = 5
#: Seconds a node's own kill of a task waits beyond the sweep's timeout and KILL_AFTER:
#: setting up, staging the results and a busy machine's delays.
NODE_TIMEOUT_MARGIN = 30
#: ``ulimit -f`` counts blocks of this many bytes (POSIX; dash, and bash as ``sh``).
ULIMIT_BLOCK = 512
#: What the job line makes beside ``__temp__/<id>``: the command's stdout and stderr and
#: the folder of the task's results.
OUT_SUFFIX, ERR_SUFFIX, RES_SUFFIX = ".out", ".err", ".res"


def size_limit_blocks(max_result_bytes: int) -> int:
    """The ``ulimit -f`` of a task: the fewest 512-byte blocks more than
    ``max_result_bytes``, so a file stopped at the limit is always larger than
    ``max_result_bytes`` (and failed by its size, whatever the command's exit status),
    while a file of exactly ``max_result_bytes`` is allowed."""
    return max_result_bytes // ULIMIT_BLOCK + 1


def node_job_timeout(timeout: float) -> float:
    """The seconds a node lets a task's job run before it kills it (job.start's
    ``job_timeout`` of a sweep run): the sweep's ``timeout``, GNU timeout's
    :data:`KILL_AFTER` and :data:`NODE_TIMEOUT_MARGIN`, so the node never cuts a task
    before its own timeout has."""
    return float(timeout) + KILL_AFTER + NODE_TIMEOUT_MARGIN


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


def _link_sweep_folder(inputs: tuple[tuple[str, str], ...]) -> str:
    """The step linking each top-level entry of the sweep folder into the current folder,
    except the top-level names of ``inputs``: the entries are gathered by the shell's own
    globs (hidden ones too; a glob that matched nothing is dropped by the ``[ -e ]`` test)
    into ``$@``, then one ``ln`` makes every link."""
    tops = sorted({name.split("/", 1)[0] for name, _ in inputs})
    # Quoted case patterns match literally: an input named ``a*b`` skips only ``a*b``.
    skip = f"{'|'.join(shlex.quote(top) for top in tops)}) ;; " if tops else ""
    return (f"{{ set -- ; for f in {TREE_DIR}/* {TREE_DIR}/.[!.]* {TREE_DIR}/..?* ; do "
            f'case "${{f##*/}}" in {skip}*) {{ [ -e "$f" ] || [ -L "$f" ] ; }} && '
            'set -- "$@" "$f" ;; esac ; done ; [ $# -eq 0 ] || ln -s -t . -- "$@" ; }')


def _stage(result: Result, base: str) -> str:
    """The step hard-linking ``result`` into ``<base>.res/`` (see the module docstring)."""
    target = f"{base}{RES_SUFFIX}/{shlex.quote(result.name)}"
    if result.source == STDOUT:
        return f"ln {base}{OUT_SUFFIX} {target}"
    if result.source == STDERR:
        return f"ln {base}{ERR_SUFFIX} {target}"
    parts = result.source.split("/")
    paths = [f"{base}/{shlex.quote('/'.join(parts[:i]))}" for i in range(1, len(parts) + 1)]
    checks = [f"[ ! -L {path} ]" for path in paths[:-1]]
    checks += [f"[ -f {paths[-1]} ]", f"[ ! -L {paths[-1]} ]"]
    return " && ".join([*checks, f"ln {paths[-1]} {target}"])


def task_command(task: Task, timeout: float, max_result_bytes: int,
                 results: tuple[Result, ...] = ()) -> str:
    """The job command of ``task`` with the sweep's per-task ``timeout`` in seconds, the
    run's ``max_result_bytes`` and the sweep's ``results`` (the module's docstring says
    what it does)."""
    base = f"{TEMP}/{task.task_id}"
    log = f"{base}.log"
    leftovers = (base, f"{base}{RES_SUFFIX}", f"{base}{OUT_SUFFIX}", f"{base}{ERR_SUFFIX}")
    # ``rm`` only when an earlier run left something: the usual first run forks nothing.
    found = " || ".join(f"[ -e {path} ]" for path in leftovers)
    setup = [f"{{ ! {{ {found} ; }} || rm -rf {' '.join(leftovers)} ; }}",
             f"mkdir {base} {base}{RES_SUFFIX}", f"cd {base}",
             _link_sweep_folder(task.inputs), *_write_inputs(task.inputs)]
    command = _decoded(task.command.encode("utf-8"))
    stage = " ; ".join(_stage(result, base) for result in results)
    staged = f"{{ {stage} ; }} 2>> {log} ; " if results else ""
    return (f"echo {LABEL} > {log} ; if {{ {' && '.join(setup)} ; }} 2>> {log} ; then "
            f"ulimit -f {size_limit_blocks(max_result_bytes)} ; "
            f"{SWEEP_DIR_VARIABLE}={TREE_DIR} timeout -k {KILL_AFTER} {float(timeout)!r} "
            f'sh -c "$({command})" > {base}{OUT_SUFFIX} 2> {base}{ERR_SUFFIX} ; s=$? ; '
            f"if [ $s -eq {TIMEOUT_STATUS} ] ; then echo '{KILLED_LINE}' >> {log} ; fi ; "
            f"{staged}else s=$? ; fi ; "
            f"rm -rf {base} {base}{OUT_SUFFIX} {base}{ERR_SUFFIX} ; exit $s")


def task_job(task: Task, timeout: float, max_result_bytes: int,
             results: tuple[Result, ...] = ()) -> Job:
    """The job of ``task``: named by its task id, logging to ``__temp__/<id>.log``."""
    return Job(task.task_id, f"{TEMP}/{task.task_id}.log",
               task_command(task, timeout, max_result_bytes, results))


def sweep_jobs(spec: SweepSpec, max_result_bytes: int,
               keep: Callable[[Task], bool] | None = None) -> Iterator[Job]:
    """The jobs of the sweep ``spec``, one per task in table order, streamed, each bounded
    by ``max_result_bytes`` (master.conf); with ``keep``, only of the tasks it accepts (a
    resume run's selection, :class:`cluster.sweep.resume.ResumeFilter`).  Every task is
    still expanded, so a bad row stops the list whether or not its task is kept:
    :class:`~cluster.errors.SweepError` (from the expansion) for a bad row or pattern."""
    for task in tasks(spec):
        if keep is None or keep(task):
            yield task_job(task, spec.timeout, max_result_bytes, spec.results)
