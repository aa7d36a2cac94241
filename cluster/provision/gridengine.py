"""The Grid Engine engine: :class:`cluster.provision.engine.Engine` over ``qsub``, ``qdel``
and ``qstat`` (Son of Grid Engine 8.1, Debian's ``gridengine-client``; the same commands on
other Grid Engines).

* :meth:`GridEngine.submit_many` submits ``count`` pilots as **one array job**: ``qsub
  -terse -N NAME -t 1-COUNT -V -cwd -j y -o /dev/null -S /bin/sh [-q QUEUE] [-pe PE SLOTS]
  [-l h=!HOST or h=!(H1|H2)] [options...]`` with the job script on stdin (``exec ARGV``, so
  the command is the job's main process and its exit status the task's).  ``-V`` hands the
  job the provisioner's environment, as Slurm's ``sbatch`` does by default.  Each task is
  one job of the provisioner: its id is ``<job>.<task>`` (``42.3``), which the task's shell
  sees as ``$JOB_ID.$SGE_TASK_ID`` (:attr:`GridEngine.job_id_shell`).  One slot needs no
  parallel environment; more ask for ``-pe <gridengine_pe> SLOTS``.
* :meth:`GridEngine.cancel` runs ``qdel <job>.<task>`` (one task of the array); a job Grid
  Engine no longer knows is already gone, not an error.
* :meth:`GridEngine.jobs` runs ``qstat -xml -u <user>`` and keeps the jobs named
  ``<prefix>-*`` (:func:`parse_qstat`): a pending array's task ranges (``1-4:1``, ``3,5``)
  become one job each.  States: ``qw`` (and holds: ``hqw``) pending, ``Eqw`` pending with
  the reason ``error state (qstat -j JOB says why)``, ``r``, ``t``, ``R`` and suspended ones
  running, ``d...`` (being deleted) ending.

Every command runs bounded (:data:`COMMAND_TIMEOUT`), with ``env`` added to this process's
environment (the site's ``SGE_ROOT``, ``SGE_CELL``, ports); one missing is ``qsub: not
found on PATH (...)``, one that fails is an :class:`EngineError` quoting its message.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence

from cluster.config import Config
from cluster.provision.engine import ENDING, PENDING, RUNNING, EngineError, EngineJob
from cluster.runtime import proc

QSUB = "qsub"
QDEL = "qdel"
QSTAT = "qstat"
COMMAND_TIMEOUT = 60.0
#: What qdel says of a job it does not know.
UNKNOWN_JOB = "does not exist"
#: ``qsub -terse`` of an array job: ``42.1-3:1``; of a plain job: ``42``.
_TERSE = re.compile(r"^(\d+)(?:\.(\d+)-(\d+):(\d+))?$")
#: A host name qsub may be asked to avoid (it goes into a resource expression).
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def expand_tasks(text: str) -> list[str]:
    """Grid Engine's task list (``1-4:1``, ``3,5``, ``7``) as task numbers."""
    tasks: list[str] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not match:
            raise EngineError(f"qstat: task list {text!r} is not like 1-4:1 or 3,5")
        first = int(match.group(1))
        last = int(match.group(2) or first)
        step = max(1, int(match.group(3) or 1))
        tasks += [str(t) for t in range(first, last + 1, step)]
    return tasks


def engine_state(code: str) -> tuple[str, str]:
    """A qstat state code (``qw``, ``r``, ``Eqw``, ``dr``...) as (engine state, reason)."""
    if "d" in code:
        return ENDING, ""
    if "E" in code:
        return PENDING, "error state (qstat -j JOB says why)"
    if "h" in code:
        return PENDING, "held"
    if "q" in code or "w" in code:
        return PENDING, ""
    if code and set(code) <= set("rtRsSTz"):
        return RUNNING, ""
    return PENDING, f"Grid Engine state {code or '(empty)'}"


def parse_qstat(text: str, prefix: str) -> list[EngineJob]:
    """The jobs named ``<prefix>-*`` in ``qstat -xml`` output, one per array task (ids
    ``<job>.<task>``; a job without tasks keeps its number)."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as exc:
        raise EngineError(f"qstat: its XML cannot be read: {exc}") from None
    jobs: list[EngineJob] = []
    for item in root.iter("job_list"):
        number = (item.findtext("JB_job_number") or "").strip()
        name = (item.findtext("JB_name") or "").strip()
        code = (item.findtext("state") or "").strip()
        if not number.isdigit():
            raise EngineError(f"qstat: a job without a job number: {name!r}")
        if not name.startswith(prefix + "-"):
            continue
        state, reason = engine_state(code)
        tasks = (item.findtext("tasks") or "").strip()
        ids = [f"{number}.{t}" for t in expand_tasks(tasks)] if tasks else [number]
        jobs += [EngineJob(job_id, name, state, reason) for job_id in ids]
    return jobs


def parse_submitted(text: str, count: int) -> list[str]:
    """The task ids of ``qsub -terse`` output (``42.1-3:1`` -> 42.1, 42.2, 42.3)."""
    match = _TERSE.match(text.strip())
    if not match:
        raise EngineError(f"qsub: expected a job id from -terse, got {text.strip()!r}")
    job, first, last, step = match.groups()
    if first is None:
        return [job] if count == 1 else [f"{job}.{t}" for t in range(1, count + 1)]
    return [f"{job}.{t}" for t in range(int(first), int(last) + 1, int(step))]


class GridEngine:
    """Grid Engine as an :class:`cluster.provision.engine.Engine` (module docstring).
    ``queue`` (``-q``), ``pe`` (the parallel environment of a job of more than one slot)
    and ``options`` (more qsub words) come from the ``gridengine_*`` settings."""

    label = "Grid Engine"
    job_id_shell = "$JOB_ID.$SGE_TASK_ID"

    def __init__(self, queue: str = "", pe: str = "smp", options: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, *,
                 timeout: float = COMMAND_TIMEOUT) -> None:
        self.queue = queue
        self.pe = pe
        self.options = tuple(options)
        self.env = dict(env or {})
        self.timeout = timeout

    @classmethod
    def from_config(cls, cfg: Config) -> GridEngine:
        return cls(queue=cfg.gridengine_queue, pe=cfg.gridengine_pe,
                   options=shlex.split(cfg.gridengine_options))

    def __repr__(self) -> str:
        return f"GridEngine(queue={self.queue!r}, pe={self.pe!r}, options={self.options!r})"

    def qsub_argv(self, name: str, slots: int, count: int,
                  exclude: Sequence[str] = ()) -> list[str]:
        """The qsub command line of :meth:`submit_many` (the script goes on stdin)."""
        if slots < 1 or count < 1:
            raise EngineError(f"qsub: job {name!r} asks for {slots} slots x {count} tasks, "
                              "expected >= 1 of each")
        if not name or any(c.isspace() for c in name):
            raise EngineError(f"qsub: job name {name!r} must be one word")
        bad = [h for h in exclude if not _HOST.match(h)]
        if bad:
            raise EngineError(f"qsub: cannot exclude host {bad[0]!r}: not a host name")
        words = [QSUB, "-terse", "-N", name, "-t", f"1-{count}", "-V", "-cwd", "-j", "y",
                 "-o", os.devnull, "-S", "/bin/sh"]
        if self.queue:
            words += ["-q", self.queue]
        if slots > 1:
            words += ["-pe", self.pe, str(slots)]
        if exclude:
            hosts = list(exclude)
            words += ["-l", f"h=!{hosts[0]}" if len(hosts) == 1
                      else f"h=!({'|'.join(hosts)})"]
        return [*words, *self.options]

    def submit_many(self, name: str, argv: list[str], slots: int, count: int, *,
                    exclude: Sequence[str] = ()) -> list[str]:
        """Submit ``count`` tasks of one array job running ``argv``; their ids."""
        if not argv:
            raise EngineError(f"qsub: job {name!r} has no command to run")
        script = "#!/bin/sh\nexec " + shlex.join(argv) + "\n"
        out = self._run(self.qsub_argv(name, slots, count, exclude), input=script.encode())
        return parse_submitted(out, count)

    def submit(self, name: str, argv: list[str], slots: int, *,
               exclude: Sequence[str] = ()) -> str:
        return self.submit_many(name, argv, slots, 1, exclude=exclude)[0]

    def cancel(self, job_id: str) -> None:
        if not re.fullmatch(r"\d+(\.\d+)?", job_id):
            raise EngineError(f"qdel: job id {job_id!r} is not a Grid Engine job id")
        self._run([QDEL, job_id], gone_ok=True)

    def jobs(self, prefix: str) -> list[EngineJob]:
        return parse_qstat(self._run([QSTAT, "-xml", "-u", getpass.getuser()]), prefix)

    def _run(self, argv: list[str], gone_ok: bool = False, input: bytes | None = None) -> str:
        name = argv[0]
        env = {**os.environ, **self.env}
        search = env.get("PATH", os.defpath)
        if shutil.which(name, path=search) is None:
            raise EngineError(f"{name}: not found on PATH ({search or '(empty)'}); is Grid "
                              "Engine's client (gridengine-client) installed?")
        try:
            done = proc.run(argv, timeout=self.timeout, env=env, input=input)
        except proc.ProcessError as exc:
            raise EngineError(f"{name}: cannot run it ({exc})") from None
        message = (done.text("stderr").strip() or done.text().strip())[-proc.TAIL_CHARS:]
        if done.ok:
            return done.text()
        if gone_ok and UNKNOWN_JOB in message:
            return ""
        raise EngineError(f"{name}: {done.describe(self.timeout)}: "
                          f"{message or '(no message)'}")
