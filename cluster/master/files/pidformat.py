"""The content of a clustermaster's PID file (ARTIFEX.md §2.6): what it says, not who may
write it (that is :mod:`cluster.master.run.pidfile`).

``clustermaster[.p].pid`` holds the PID of the clustermaster doing a run.  Other tools read
its *first line* (the bare PID, or ``0``, the stop marker), so that line is ported as
written.  A second line, written by this port, says when the owner last showed it is
alive::

    4242
    refreshed 81234.517 0e7c8a4c-3f1d-4c2b-9b7e-5d1f3a0c2e11

The number is the owner's ``CLOCK_MONOTONIC`` (system-wide on Linux, so another process can
compare it with its own) and the word after it the kernel's boot id (:func:`read_boot_id`).
A file without that line (an old-format or hand-written one) has no :class:`Stamp`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: Permission bits of the PID file: other users' tools read it.
FILE_MODE = 0o644
#: The content that tells the running master to stop (ARTIFEX.md §2.6).
STOP_MARKER = "0"
#: Where the kernel says which boot this is (a new random UUID at every boot).
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
# The second line: "refreshed <CLOCK_MONOTONIC seconds> <boot id>".
_STAMP = re.compile(r"refreshed (-?\d+(?:\.\d+)?) ([A-Za-z0-9-]{1,64})")


@dataclass(frozen=True)
class Stamp:
    """The second line of the file: when (``monotonic``) its owner last refreshed it, and on
    which boot (``boot_id``)."""

    monotonic: float
    boot_id: str


def read_boot_id() -> str:
    """This boot's id (Linux), or "" when the kernel does not say (then no stamp is written
    and staleness falls back to the file's mtime)."""
    try:
        text = BOOT_ID_PATH.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if _STAMP.fullmatch(f"refreshed 0 {text}") else ""


def parse(content: str) -> tuple[str, Stamp | None]:
    """The first line (the PID word, stripped) and the stamp of a PID file's ``content``.

    The stamp is None when there is no second line or it is not a stamp: such a file is
    judged by its mtime, as the Perl did.
    """
    lines = content.splitlines()
    first = lines[0].strip() if lines else ""
    stamp = None
    if len(lines) > 1:
        match = _STAMP.fullmatch(lines[1].strip())
        if match:
            stamp = Stamp(float(match.group(1)), match.group(2))
    return first, stamp


def render(pid: int, monotonic: float, boot_id: str) -> str:
    """The content of a PID file held by ``pid``: its PID, and its stamp (``monotonic``,
    on boot ``boot_id``) when this boot has an id ("" writes no stamp)."""
    if not boot_id:
        return f"{pid}\n"
    return f"{pid}\nrefreshed {monotonic:.3f} {boot_id}\n"
