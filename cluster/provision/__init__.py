"""Nodes from a batch system: the engine interface, the Slurm engine, a private Slurm.

See docs/provisioning.md.  This room sits beside ``console/``: it reads what lies below
(``wire``, ``runtime``, the core) and nothing of ``console``, ``localcluster`` or ``cli``.
"""
