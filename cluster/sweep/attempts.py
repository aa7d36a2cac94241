"""The tries of a sweep run's tasks: ``runs/<id>/sweep-attempts.tsv`` (docs/sweeps.md section 9).

A minimal version with the interface the master's intake writes (the end of a run reads
it): one TAB-separated line per try -- task id, node, start (epoch s), runtime (s), exit
status, bytes received, status, try number, ``final`` or ``retry`` -- each field escaped as
in :mod:`cluster.sweep.joblog`.  An unfinished last line (a writer killed mid-line) is
skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.sweep.joblog import escape, unescape

FINAL = "final"
RETRY = "retry"
_FIELDS = 9


@dataclass(frozen=True)
class Attempt:
    """One try of a task; ``final`` is True when it is the try the task's result is."""

    task: str
    node: str
    start: float
    runtime: float
    exit_status: int
    receive: int
    status: str
    attempt: int
    final: bool


def format_attempt(attempt: Attempt) -> str:
    """``attempt`` as one line, with its newline."""
    fields = (escape(attempt.task), escape(attempt.node), f"{attempt.start:.3f}",
              f"{attempt.runtime:.3f}", str(attempt.exit_status), str(attempt.receive),
              escape(attempt.status), str(attempt.attempt),
              FINAL if attempt.final else RETRY)
    return "\t".join(fields) + "\n"


def read_attempts(path: Path) -> Iterator[Attempt]:
    """The tries in ``path``, in file order, streamed; ValueError naming the file and line
    for a malformed complete line."""
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):  # bounded by the file
            if not line.endswith("\n"):
                return
            fields = [unescape(f) for f in line[:-1].split("\t")]
            try:
                if len(fields) != _FIELDS or fields[8] not in (FINAL, RETRY):
                    raise ValueError(f"expected {_FIELDS} fields ending in {FINAL} or "
                                     f"{RETRY}, got {fields}")
                yield Attempt(fields[0], fields[1], float(fields[2]), float(fields[3]),
                              int(fields[4]), int(fields[5]), fields[6], int(fields[7]),
                              fields[8] == FINAL)
            except ValueError as exc:
                raise ValueError(f"{path}: line {lineno}: {exc}") from None
