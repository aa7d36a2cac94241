"""The Slurm engine: :class:`cluster.provision.engine.Engine` over ``sbatch``, ``scancel``
and ``squeue``.

* :meth:`SlurmEngine.submit` runs ``sbatch --parsable --job-name NAME --cpus-per-task SLOTS
  [--partition P] [--account A] [--time T] [--exclude HOSTS] [options...] --output OUT
  --wrap 'exec ARGV'``:
  the command line is shell-quoted, and ``exec`` makes it the job's main process, so that
  Slurm's signals (``scancel``, the time limit) reach it and its exit status is the job's
  (an ephemeral node's 3 is what ``RequeueExit=3`` acts on).  ``OUT`` is ``/dev/null``, or
  ``<output_dir>/%x-%j.out`` (the job's name and id) when a folder is given.
* :meth:`SlurmEngine.cancel` runs ``scancel ID``; a job Slurm no longer knows is not an error.
* :meth:`SlurmEngine.jobs` runs ``squeue --me --noheader --format=...`` and keeps the jobs
  named ``<prefix>-*`` (:func:`parse_squeue`; states by :func:`engine_state`).

Every command runs through :func:`cluster.runtime.proc.run`, bounded by ``timeout``, with
``env`` added to this process's environment (a site's ``SLURM_CONF``; ``PATH`` decides which
Slurm commands run).  A command that is missing, fails (the controller down, a refused
submission) or runs past its timeout is an :class:`EngineError` that names it and quotes
what it said; one not on ``PATH`` at all is ``sbatch: not found on PATH (...)``.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from cluster.config import Config
from cluster.provision.engine import ENDING, GONE, PENDING, RUNNING, EngineError, EngineJob
from cluster.runtime import proc

SBATCH = "sbatch"
SCANCEL = "scancel"
SQUEUE = "squeue"
#: How long one Slurm command may take [seconds] (a client retries an unreachable
#: controller for a while before it gives up).
COMMAND_TIMEOUT = 60.0
#: squeue's columns: job id, name, state (long form), reason; a tab between them, which a
#: job name given by :meth:`SlurmEngine.submit` never holds.
SQUEUE_FORMAT = "%i\t%j\t%T\t%r"
#: What scancel says of a job id the controller does not know (the job has left).
UNKNOWN_JOB = "Invalid job id specified"

#: Slurm's job states (squeue's long form) as engine states.  A state not listed counts as
#: pending, with the state as its reason: a job Slurm still holds is never left uncounted.
_STATES = {
    "PENDING": PENDING, "REQUEUED": PENDING, "REQUEUE_HOLD": PENDING,
    "REQUEUE_FED": PENDING, "SPECIAL_EXIT": PENDING,
    "RUNNING": RUNNING, "CONFIGURING": RUNNING, "SUSPENDED": RUNNING, "STOPPED": RUNNING,
    "RESIZING": RUNNING,
    "COMPLETING": ENDING, "SIGNALING": ENDING, "STAGE_OUT": ENDING,
    "COMPLETED": GONE, "CANCELLED": GONE, "FAILED": GONE, "TIMEOUT": GONE,
    "NODE_FAIL": GONE, "PREEMPTED": GONE, "BOOT_FAIL": GONE, "DEADLINE": GONE,
    "OUT_OF_MEMORY": GONE, "REVOKED": GONE,
}


def engine_state(slurm_state: str) -> tuple[str, str]:
    """A Slurm state (``PENDING``, ``RUNNING``...) as (engine state, reason for an unknown
    state, else "")."""
    state = _STATES.get(slurm_state.strip().upper())
    if state is None:
        return PENDING, f"Slurm state {slurm_state.strip() or '(empty)'}"
    return state, ""


def parse_squeue(text: str, prefix: str) -> list[EngineJob]:
    """The jobs named ``<prefix>-*`` in squeue's output (format :data:`SQUEUE_FORMAT`, no
    header), in squeue's order.  A pending job's reason is Slurm's (``Resources``,
    ``PartitionDown``...), "" when Slurm gives none (``None``); a running or ending job's is
    "".  EngineError for a line that does not have the four columns."""
    jobs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0].strip():
            raise EngineError(f"squeue: line {lineno} is not 'id<TAB>name<TAB>state<TAB>"
                              f"reason': {line!r}")
        job_id, name, slurm_state, reason = (f.strip() for f in fields)
        if not name.startswith(prefix + "-"):
            continue
        state, unknown = engine_state(slurm_state)
        if state == PENDING:
            reason = unknown or ("" if reason == "None" else reason)
        else:
            reason = ""
        jobs.append(EngineJob(job_id, name, state, reason))
    return jobs


def parse_job_id(text: str) -> str:
    """The job id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``); EngineError if
    it printed none."""
    first = text.strip().split(";", 1)[0].strip()
    if not first.isdigit():
        raise EngineError(f"sbatch: expected a job id from --parsable, got {text.strip()!r}")
    return first


class SlurmEngine:
    """Slurm as an :class:`cluster.provision.engine.Engine` (see the module docstring).

    ``partition``, ``account`` and ``time_limit`` are given to sbatch when not empty;
    ``options`` are more sbatch words, put before ``--wrap`` (master.conf's
    ``slurm_options``, split as a shell would); ``env`` is added to the environment of every
    Slurm command; ``output_dir`` keeps each job's output there (else ``/dev/null``).
    """

    #: The batch system's name for people (the console's "from Slurm: ...").
    label = "Slurm"
    #: A job's id, as its shell sees it.
    job_id_shell = "$SLURM_JOB_ID"

    def __init__(self, partition: str = "", account: str = "", time_limit: str = "",
                 options: Sequence[str] = (), env: Mapping[str, str] | None = None, *,
                 output_dir: Path | None = None, timeout: float = COMMAND_TIMEOUT) -> None:
        self.partition = partition
        self.account = account
        self.time_limit = time_limit
        self.options = tuple(options)
        self.env = dict(env or {})
        self.output_dir = output_dir
        self.timeout = timeout

    @classmethod
    def from_config(cls, cfg: Config) -> SlurmEngine:
        """The engine with ``cfg``'s ``slurm_*`` settings (``slurm_options`` split as a
        shell would)."""
        return cls(partition=cfg.slurm_partition, account=cfg.slurm_account,
                   time_limit=cfg.slurm_time_limit, options=shlex.split(cfg.slurm_options))

    def __repr__(self) -> str:
        return (f"SlurmEngine(partition={self.partition!r}, account={self.account!r}, "
                f"time_limit={self.time_limit!r}, options={self.options!r})")

    def sbatch_argv(self, name: str, argv: Sequence[str], slots: int,
                    exclude: Sequence[str] = ()) -> list[str]:
        """The sbatch command line that :meth:`submit` runs."""
        if not argv:
            raise EngineError(f"sbatch: job {name!r} has no command to run")
        if slots < 1:
            raise EngineError(f"sbatch: job {name!r} asks for {slots} slots, expected >= 1")
        if not name or any(c.isspace() for c in name):
            raise EngineError(f"sbatch: job name {name!r} must be one word")
        out = (str(self.output_dir / "%x-%j.out") if self.output_dir is not None
               else os.devnull)
        words = [SBATCH, "--parsable", "--job-name", name, "--cpus-per-task", str(slots)]
        for flag, value in (("--partition", self.partition), ("--account", self.account),
                            ("--time", self.time_limit)):
            if value:
                words += [flag, value]
        if exclude:
            words += ["--exclude", ",".join(exclude)]
        return [*words, *self.options, "--output", out,
                "--wrap", "exec " + shlex.join(argv)]

    def submit(self, name: str, argv: list[str], slots: int, *,
               exclude: Sequence[str] = ()) -> str:
        """Submit ``argv`` as job ``name`` with ``slots`` CPUs, on none of the hosts
        ``exclude``; its Slurm job id."""
        return parse_job_id(self._run(self.sbatch_argv(name, argv, slots, exclude)))

    def cancel(self, job_id: str) -> None:
        """scancel ``job_id``; a job Slurm no longer knows is already gone."""
        if not job_id.isdigit():
            raise EngineError(f"scancel: job id {job_id!r} is not a Slurm job id")
        self._run([SCANCEL, job_id], gone_ok=True)

    def jobs(self, prefix: str) -> list[EngineJob]:
        """This user's live Slurm jobs named ``<prefix>-*``."""
        return parse_squeue(self._run([SQUEUE, "--me", "--noheader",
                                       f"--format={SQUEUE_FORMAT}"]), prefix)

    def _run(self, argv: list[str], gone_ok: bool = False) -> str:
        """Run one Slurm command; its stdout, or EngineError naming it with its message."""
        name = argv[0]
        env = {**os.environ, **self.env}
        search = env.get("PATH", os.defpath)
        if shutil.which(name, path=search) is None:
            # The usual way Slurm is absent: said plainly, not as a failed exec.
            raise EngineError(f"{name}: not found on PATH ({search or '(empty)'}); is "
                              "Slurm's client (slurm-client) installed?")
        try:
            done = proc.run(argv, timeout=self.timeout, env=env)
        except proc.ProcessError as exc:
            raise EngineError(f"{name}: cannot run it ({exc}); is Slurm's client "
                              "(slurm-client) installed and on PATH?") from None
        if done.ok:
            return done.text()
        message = (done.text("stderr").strip() or done.text().strip())[-proc.TAIL_CHARS:]
        if gone_ok and UNKNOWN_JOB in message:
            return ""
        raise EngineError(f"{name}: {done.describe(self.timeout)}: "
                          f"{message or '(no message)'}")
