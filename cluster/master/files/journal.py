"""The results journal: every result the master accepts, on disk before the node hears back.

Format (owned here: :func:`journal_line`, :func:`split_line`, :func:`journal_result`): a
first line ``run <id>``, then one line per result,
``<machine> result <test> <error> <t1> <t2> <t3> <md5> <product>`` (the protocol's result
header with the machine in front, ``-`` for none).  Each batch of results is written with a
single ``write()`` on an O_APPEND descriptor before the reply goes out, so a master that is
killed loses nothing a node was told had arrived (the kernel holds the bytes); ``fsync`` runs
in batches, at most every ``sync_interval`` seconds, which covers a machine crash up to that
window.  A torn last line (the machine died mid-write) is dropped on load.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from cluster.records import JobResult
from cluster.runtime import fsutil
from cluster.wire.protocol import canonical_result, format_result, parse_result

log = logging.getLogger("cluster.journal")

#: The word between the machine and the result on every result line.
RESULT_VERB = "result"
#: What :func:`cluster.wire.protocol.format_result` puts before the canonical result text.
_HEADER_PREFIX = RESULT_VERB + " "


def line_prefix(machine: str) -> str:
    """What every journal line of ``machine``'s results starts with (``-``: no machine).

    For callers that make many lines of one machine: ``line_prefix(m) + text`` is
    :func:`journal_line` without a call per line.
    """
    return f"{machine or '-'} {_HEADER_PREFIX}"


def journal_line(machine: str, text: str) -> str:
    """The journal line (no newline) of canonical result ``text`` from ``machine``."""
    return line_prefix(machine) + text


def result_text(result: JobResult) -> str:
    """The canonical text of ``result``: a journal line without its machine and verb."""
    return format_result(result)[len(_HEADER_PREFIX):]


def format_line(result: JobResult) -> str:
    """The journal line (no newline) of ``result``."""
    return journal_line(result.machine, result_text(result))


def split_line(line: str) -> tuple[str, str]:
    """(machine, result text) of a journal line; ValueError if it is not one."""
    machine, _, rest = line.partition(" ")
    verb, _, text = rest.partition(" ")
    if verb != RESULT_VERB:
        raise ValueError(f"expected '<machine> {RESULT_VERB} ...'")
    return machine, text


def journal_result(line: str) -> JobResult:
    """The JobResult of a journal line (ValueError if it is not one)."""
    machine, text = split_line(line)
    return parse_result(text, machine)


def load_lines(path: Path, run_id: str) -> list[str] | None:
    """The results journaled for ``run_id`` as journal lines (without newlines).

    None if the file is absent or for another run.  Each line is
    ``<machine> result <canonical result>`` (see :func:`cluster.wire.protocol.canonical_result`);
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
            line = raw[:-1].decode("utf-8", "replace")
            try:
                machine, text = split_line(line)
                canon = canonical_result(text)
            except ValueError as exc:
                log.warning("%s:%d: skipping bad journal line: %s", path, lineno, exc)
                continue
            out.append(line if canon is text else journal_line(machine, canon))
    return out


def load(path: Path, run_id: str) -> list[JobResult] | None:
    """Results journaled for ``run_id``; None if the file is absent or for another run."""
    lines = load_lines(path, run_id)
    return None if lines is None else [journal_result(line) for line in lines]


class Companion(Protocol):
    """A file synced with the journal (:meth:`Journal.attach`): a sweep's attempts log."""

    @property
    def dirty(self) -> bool: ...

    def sync(self) -> None: ...


class Journal:
    """Append-only results file of one run.  Use append(), sync_if_due(), close()."""

    def __init__(self, path: Path, run_id: str, sync_interval: float = 1.0) -> None:
        """Open the journal of ``run_id``, keeping what it holds if it is for that run."""
        self.path = path
        self.sync_interval = sync_interval
        existing = load_lines(path, run_id)
        if existing is None:
            # A new run's journal replaces another run's whole.  fsync: the results appended
            # next are synced through this file, so its first line must reach the disk too.
            fsutil.atomic_write(path, f"run {run_id}\n", fsync=True)
            #: What the journal held when opened, as journal lines (see load_lines).
            self.lines: list[str] = []
        else:
            self.lines = existing
            self._trim_torn_tail()
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.dirty = False
        self.last_sync = 0.0
        #: Files synced whenever the journal is (:meth:`attach`); none for most runs.
        self.companions: list[Companion] = []

    def attach(self, companion: Companion) -> None:
        """Sync ``companion`` with the journal from now on: at every :meth:`sync` (the
        batches of :meth:`sync_if_due` and the run's end), so it is on disk as surely.  The
        caller closes it."""
        self.companions.append(companion)

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
        return [journal_result(line) for line in self.lines]

    def append(self, results: Iterable[JobResult]) -> None:
        """Write a batch with one write() call (not yet fsync'ed)."""
        text = "".join(format_line(r) + "\n" for r in results)
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
        dirty = self.dirty or any(c.dirty for c in self.companions)
        if dirty and now - self.last_sync >= self.sync_interval:
            self.sync()
            self.last_sync = now

    def sync(self) -> None:
        """fsync what was written (a run's end is recorded only after its results), and
        the attached companions."""
        for companion in self.companions:
            companion.sync()
        if self.dirty and self.fd >= 0:
            os.fsync(self.fd)
            self.dirty = False

    def close(self) -> None:
        if self.fd >= 0:
            if self.dirty:
                os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
