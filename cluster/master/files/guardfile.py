"""The monitor's saved replay guard, ``heartbeat.nonces`` in the master home
(docs/protocol.md, "Signed messages"): what a monitor that starts after another needs so
that a heartbeat replayed across the restart is still refused.

One line per sender and session: ``<sender> <session> <newest counter> <seen bitmap, hex>``
(:meth:`cluster.wire.signing.ReplayGuard.entries`), written atomically, mode 0600.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.runtime import fsutil
from cluster.wire import signing

log = logging.getLogger("cluster.monitor")


def load(path: Path, guard: signing.ReplayGuard) -> None:
    """Restore ``guard`` from the file :func:`save` wrote (nothing if there is none;
    malformed lines are skipped)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return
    except OSError as exc:  # not readable, a folder: start with an empty guard, and say so
        log.warning("cannot read the saved replay guard %s (%s); starting with an empty one",
                    path, exc.strerror or exc)
        return
    entries = []
    for line in text.splitlines():
        words = line.split(" ")
        if len(words) == 4 and signing.NONCE.fullmatch(f"{words[1]}{0:016x}".encode()):
            try:
                entries.append((words[0], words[1], int(words[2]), int(words[3], 16)))
            except ValueError:
                continue
    guard.restore(entries)


def save(path: Path, guard: signing.ReplayGuard) -> None:
    """Write ``guard`` to ``path`` atomically (OSError when it cannot be written)."""
    lines = [f"{sender} {session} {newest} {seen:x}\n"
             for sender, session, newest, seen in guard.entries()]
    fsutil.atomic_write(path, "".join(lines), mode=0o600)
