"""The interface between the provisioner and a batch system (docs/provisioning.md, "The
engine interface").

An engine submits a job running one ephemeral node, cancels one, and lists the jobs whose
name starts with ``<prefix>-``.  Slurm's is ``cluster.provision.slurm.SlurmEngine``; another
system (HTCondor, Kubernetes) is a new class with these three methods, not a rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cluster.errors import ClusterError

#: The states of :class:`EngineJob`: waiting to start, running, ending (Slurm's COMPLETING),
#: or no longer known to the engine.
JOB_STATES = ("pending", "running", "ending", "gone")


class EngineError(ClusterError):
    """A call to the batch system failed; the message names the command and quotes its
    message."""


@dataclass(frozen=True)
class EngineJob:
    """One job of the batch system, as its listing shows it."""

    job_id: str
    name: str
    state: str   # one of JOB_STATES
    reason: str  # why it is pending (Slurm's reason: "Resources", "PartitionDown"...), or ""


class Engine(Protocol):
    """What the provisioner needs of a batch system."""

    def submit(self, name: str, argv: list[str], slots: int) -> str:
        """Start ``argv`` as a job named ``name`` with ``slots`` CPUs; its job id
        (EngineError when refused)."""
        ...

    def cancel(self, job_id: str) -> None:
        """End job ``job_id`` (EngineError when the engine refuses)."""
        ...

    def jobs(self, prefix: str) -> list[EngineJob]:
        """The engine's jobs named ``<prefix>-*`` (EngineError when it cannot be asked)."""
        ...
