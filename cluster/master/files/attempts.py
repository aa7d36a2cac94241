"""How many times a queued run was tried and given up on: ``attempts[.p]`` in the home.

Seed 000: "If we drop too many nodes, we try again."  A run that loses its nodes ends with
the outcome ``retry``: its queue line stays at the head and the next clustermaster starts
it afresh under a new id.  This file remembers those tries per queue line, so that after
``max_tries`` the run is reported as failed and dequeued instead of tried forever.

Lines are ``<run id> <queue line>``, one per try given up on: recording a try is
idempotent (a master killed after recording it and before noting the step done records
the same id again, and it counts once).  The file is rewritten atomically by the one
master holding the priority's PID file; a queue line's tries leave it when its run is
dequeued.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.runtime import fsutil

log = logging.getLogger("cluster.master")


class Attempts:
    """The tries file of one priority.  Callers use :meth:`count`, :meth:`add`, :meth:`clear`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> list[tuple[str, str]]:
        entries: list[tuple[str, str]] = []
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return entries
        for lineno, line in enumerate(text.splitlines(), start=1):
            run_id, _, queue_line = line.partition(" ")
            if not run_id or not queue_line:
                log.warning("%s:%d: not '<run id> <queue line>'; ignored: %.80r", self.path,
                            lineno, line)
                continue
            entries.append((run_id, queue_line))
        return entries

    def _save(self, entries: list[tuple[str, str]]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        fsutil.atomic_write(self.path, "".join(f"{i} {line}\n" for i, line in entries))

    def count(self, queue_line: str) -> int:
        """How many earlier tries of ``queue_line`` were given up on."""
        return sum(1 for _, line in self._load() if line == queue_line)

    def add(self, queue_line: str, run_id: str) -> int:
        """Record that try ``run_id`` of ``queue_line`` was given up on; return the count."""
        entries = self._load()
        if (run_id, queue_line) not in entries:
            entries.append((run_id, queue_line))
            self._save(entries)
        return sum(1 for _, line in entries if line == queue_line)

    def clear(self, queue_line: str) -> None:
        """Forget ``queue_line``'s tries (its run left the queue)."""
        entries = self._load()
        kept = [e for e in entries if e[1] != queue_line]
        if len(kept) != len(entries):
            self._save(kept)
