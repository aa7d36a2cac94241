"""Nodes on demand from a batch system (issue 24, docs/provisioning.md): the engine
interface and its Slurm implementation, and the provisioner's decisions."""
