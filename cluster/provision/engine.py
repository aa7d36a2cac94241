"""The small interface between the provisioner and a batch system (docs/provisioning.md).

An engine starts a command as a batch job (:meth:`Engine.submit`), cancels one
(:meth:`Engine.cancel`) and lists the jobs it holds under a name prefix
(:meth:`Engine.jobs`); it has a name for people (:attr:`Engine.label`, "Slurm") and says
how a job's shell finds its own id (:attr:`Engine.job_id_shell`).  Slurm
(:mod:`cluster.provision.slurm`) and Grid Engine (:mod:`cluster.provision.gridengine`) are
the implementations here; master.conf's ``provision_engine`` picks one, or names a class of
the site's (:mod:`cluster.provision.engines`).  An engine may also submit several jobs at
once (``submit_many``: Grid Engine's array jobs); the provisioner uses it when it is there.
Every failure of the batch system is an :class:`EngineError` that names the command and
quotes its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from cluster.errors import ClusterError

#: The states an :class:`EngineJob` can be in.
PENDING = "pending"
RUNNING = "running"
#: Leaving: Slurm's COMPLETING (the command has ended, the job's clean-up has not).
ENDING = "ending"
#: No longer known to the engine (finished, cancelled, failed).
GONE = "gone"
STATES = (PENDING, RUNNING, ENDING, GONE)


class EngineError(ClusterError):
    """The batch system refused or could not be reached; the message names the command
    (``sbatch``, ``squeue``...) and quotes what it said."""


@dataclass(frozen=True)
class EngineJob:
    """One batch job as the engine reports it.

    ``state`` is one of :data:`STATES`; ``reason`` says why a pending job waits, in the
    engine's words (Slurm's ``Resources``, ``PartitionDown``...), and is ``""`` otherwise.
    """

    job_id: str
    name: str
    state: str
    reason: str = ""


class Engine(Protocol):
    """What the provisioner asks of a batch system.  ``label`` is its name for people
    ("Slurm"): the console says "from Slurm: wanted W..." and "Slurm job 42".
    ``job_id_shell`` is a shell word that, inside a job, expands to the job id that
    :meth:`submit` returned and :meth:`jobs` lists (Slurm's ``$SLURM_JOB_ID``): the pilot
    names its node and its log by it."""

    label: str
    job_id_shell: str

    def submit(self, name: str, argv: list[str], slots: int, *,
               exclude: Sequence[str] = ()) -> str:
        """Start ``argv`` as a job called ``name`` with ``slots`` CPUs, on none of the hosts
        ``exclude`` names; return its job id."""
        ...

    def cancel(self, job_id: str) -> None:
        """Cancel job ``job_id`` (a job already gone is not an error)."""
        ...

    def jobs(self, prefix: str) -> list[EngineJob]:
        """The engine's live jobs whose names are ``<prefix>-*``."""
        ...
