"""The results journal: every result the master accepts, on disk before the node hears back.

Format: a first line ``run <id>``, then one line per result,
``<machine> result <test> <error> <t1> <t2> <t3> <md5> <product>`` (the protocol's result
header with the machine in front).  Each batch of results is written with a single
``write()`` on an O_APPEND descriptor before the reply goes out, so a master that is killed
loses nothing a node was told had arrived (the kernel holds the bytes); ``fsync`` runs in
batches, at most every ``sync_interval`` seconds, which covers a machine crash up to that
window.  A torn last line (the machine died mid-write) is dropped on load.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from cluster.protocol import format_result, parse_result
from cluster.records import JobResult

log = logging.getLogger("cluster.journal")


def load(path: Path, run_id: str) -> list[JobResult] | None:
    """Results journaled for ``run_id``; None if the file is absent or for another run."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    lines = data.split(b"\n")
    if not lines or lines[0].decode("utf-8", "replace") != f"run {run_id}":
        return None
    results: list[JobResult] = []
    body = lines[1:]
    if body and body[-1] != b"":
        log.warning("%s: dropping a torn last line (%d bytes)", path, len(body[-1]))
    for lineno, raw in enumerate(body[:-1], 2):
        text = raw.decode("utf-8", "replace")
        machine, _, rest = text.partition(" ")
        verb, _, value = rest.partition(" ")
        try:
            if verb != "result":
                raise ValueError("expected '<machine> result ...'")
            results.append(parse_result(value, machine))
        except ValueError as exc:
            log.warning("%s:%d: skipping bad journal line: %s", path, lineno, exc)
    return results


class Journal:
    """Append-only results file of one run.  Use append(), sync_if_due(), close()."""

    def __init__(self, path: Path, run_id: str, sync_interval: float = 1.0) -> None:
        """Open the journal of ``run_id``, keeping what it holds if it is for that run."""
        self.path = path
        self.sync_interval = sync_interval
        existing = load(path, run_id)
        if existing is None:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(f"run {run_id}\n", encoding="utf-8")
            os.replace(tmp, path)
            self.loaded: list[JobResult] = []
        else:
            self.loaded = existing
            self._trim_torn_tail()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.dirty = False
        self.last_sync = 0.0

    def _trim_torn_tail(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):
            os.truncate(self.path, cut)

    def append(self, results: Iterable[JobResult]) -> None:
        """Write a batch with one write() call (not yet fsync'ed)."""
        text = "".join(f"{r.machine or '-'} {format_result(r)}\n" for r in results)
        if not text:
            return
        data = text.encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.dirty = True

    def sync_if_due(self, now: float) -> None:
        if self.dirty and now - self.last_sync >= self.sync_interval:
            os.fsync(self.fd)
            self.dirty = False
            self.last_sync = now

    def close(self) -> None:
        if self.fd >= 0:
            if self.dirty:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
