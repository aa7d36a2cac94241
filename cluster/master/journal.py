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

from cluster.records import JobResult
from cluster.wire.protocol import canonical_result, format_result, parse_result

log = logging.getLogger("cluster.journal")


def load_lines(path: Path, run_id: str) -> list[str] | None:
    """The results journaled for ``run_id`` as journal lines (without newlines).

    None if the file is absent or for another run.  Each line is
    ``<machine> result <canonical result>`` (see :func:`cluster.protocol.canonical_result`);
    bad lines are logged and skipped, a torn last line is dropped.
    """
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return None
    out: list[str] = []
    with fh:
        first = fh.readline()
        if first.rstrip(b"\n").decode("utf-8", "replace") != f"run {run_id}":
            return None
        for lineno, raw in enumerate(fh, 2):  # streamed: a journal may be 100 MB
            if not raw.endswith(b"\n"):
                log.warning("%s: dropping a torn last line (%d bytes)", path, len(raw))
                break
            text = raw[:-1].decode("utf-8", "replace")
            machine, _, rest = text.partition(" ")
            verb, _, value = rest.partition(" ")
            try:
                if verb != "result":
                    raise ValueError("expected '<machine> result ...'")
                canon = canonical_result(value)
            except ValueError as exc:
                log.warning("%s:%d: skipping bad journal line: %s", path, lineno, exc)
                continue
            out.append(text if canon is value else f"{machine} result {canon}")
    return out


def _result(line: str) -> JobResult:
    machine, _, rest = line.partition(" ")
    return parse_result(rest[7:], machine)


def load(path: Path, run_id: str) -> list[JobResult] | None:
    """Results journaled for ``run_id``; None if the file is absent or for another run."""
    lines = load_lines(path, run_id)
    return None if lines is None else [_result(line) for line in lines]


class Journal:
    """Append-only results file of one run.  Use append(), sync_if_due(), close()."""

    def __init__(self, path: Path, run_id: str, sync_interval: float = 1.0) -> None:
        """Open the journal of ``run_id``, keeping what it holds if it is for that run."""
        self.path = path
        self.sync_interval = sync_interval
        existing = load_lines(path, run_id)
        if existing is None:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(f"run {run_id}\n", encoding="utf-8")
            os.replace(tmp, path)
            #: What the journal held when opened, as journal lines (see load_lines).
            self.lines: list[str] = []
        else:
            self.lines = existing
            self._trim_torn_tail()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.dirty = False
        self.last_sync = 0.0

    def _trim_torn_tail(self) -> None:
        """Cut a torn last line off the file, reading only its tail."""
        with open(self.path, "rb") as fh:
            size = end = fh.seek(0, os.SEEK_END)
            cut = 0
            while end > 0:
                start = max(0, end - 65536)
                fh.seek(start)
                nl = fh.read(end - start).rfind(b"\n")
                if nl >= 0:
                    cut = start + nl + 1
                    break
                end = start
        if cut < size:
            os.truncate(self.path, cut)

    @property
    def loaded(self) -> list[JobResult]:
        """What the journal held when opened, as JobResults."""
        return [_result(line) for line in self.lines]

    def append(self, results: Iterable[JobResult]) -> None:
        """Write a batch with one write() call (not yet fsync'ed)."""
        text = "".join(f"{r.machine or '-'} {format_result(r)}\n" for r in results)
        if text:
            self.write(text.encode("utf-8"))

    def write(self, data: bytes) -> None:
        """Write journal lines, already formatted (newlines included), with one write()."""
        if not data:
            return
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
