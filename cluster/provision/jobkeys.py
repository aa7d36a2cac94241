"""The keys of the provisioner's ephemeral nodes: ``node-keys/<prefix>-<job id>.key``.

docs/provisioning.md, "Its key".  An ephemeral node is named ``<prefix>-<batch job id>``
and signs with its own key in the master home, as every node does (docs/protocol.md, "Signed
messages").  A node with ``transport = local`` can make its key itself; one that logs in
over ssh cannot, so the provisioner, which runs beside the master home, makes it: for each
job it submits, as soon as the batch system has given the id, and for each job of its prefix
it finds (a restarted provisioner adopting jobs submitted before) whose key is missing.

:class:`JobKeys` is the hook :class:`cluster.provision.scaler.Provisioner` calls with those
job ids.  It never raises: a key that cannot be made is a WARNING naming the node and the
path (its node's heartbeats fail until it exists), and the next look tries again.  Keys are
never removed here: a job id is not reused by the batch system, and the master's
``node-keys/`` is the site's to prune.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from cluster import nodekeys
from cluster.errors import ClusterError

logger = logging.getLogger("cluster.provision")


class JobKeys:
    """Makes the key of node ``<prefix>-<job id>`` in the master home ``home`` for each job
    id it is given, unless it is there (:func:`cluster.nodekeys.ensure_node_key`)."""

    def __init__(self, home: Path, prefix: str) -> None:
        self.home = Path(home)
        self.prefix = prefix
        # The job ids whose key is known to be there, so that a look at 1,000 jobs does
        # not touch 1,000 files; cut back to the jobs listed at each look (bounded).
        self._known: set[str] = set()

    def node_name(self, job_id: str) -> str:
        """The name the node of job ``job_id`` gives itself."""
        return f"{self.prefix}-{job_id}"

    def __call__(self, job_ids: Iterable[str], *, listed: bool = False) -> list[Path]:
        """Make the keys missing among ``job_ids``; the paths of the keys made.

        ``listed``: ``job_ids`` are every job of the prefix the engine lists now, so the
        memory of keys known forgets the jobs that have left."""
        ids = list(job_ids)
        if listed:
            self._known &= set(ids)
        made: list[Path] = []
        for job_id in ids:  # bounded by the jobs given
            if job_id in self._known:
                continue
            name = self.node_name(job_id)
            try:
                path = nodekeys.key_path(self.home, name)
            except ValueError as exc:  # a job id that makes no node name
                logger.warning("job %s: no key made: %s", job_id, exc)
                continue
            existed = path.exists()
            try:
                nodekeys.ensure_node_key(self.home, name)
            except ClusterError as exc:  # names the node and the path
                logger.warning("%s; node %s is not served until it exists (the next look "
                               "tries again)", exc, name)
                continue
            self._known.add(job_id)
            if not existed:
                made.append(path)
                logger.info("made the key of node %s (job %s) at %s", name, job_id, path)
        return made
