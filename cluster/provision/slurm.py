"""The Slurm engine (docs/provisioning.md, "The engine interface").

A placeholder with the constructor the provisioner uses, until the Slurm engine's own
module lands (issue 24's Slurm part replaces this file whole; it keeps
``SlurmEngine.from_config``).
"""

from __future__ import annotations

from cluster.config import Config
from cluster.provision.engine import EngineError, EngineJob


class SlurmEngine:
    """Slurm through sbatch, scancel and squeue: not in this branch yet."""

    @classmethod
    def from_config(cls, cfg: Config) -> SlurmEngine:
        raise EngineError("the Slurm engine (cluster/provision/slurm.py) is not built yet: "
                          "expected issue 24's Slurm part")

    def submit(self, name: str, argv: list[str], slots: int) -> str:
        raise EngineError("sbatch: not built yet")

    def cancel(self, job_id: str) -> None:
        raise EngineError("scancel: not built yet")

    def jobs(self, prefix: str) -> list[EngineJob]:
        raise EngineError("squeue: not built yet")
