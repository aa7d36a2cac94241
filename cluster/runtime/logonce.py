"""One log line per period across processes: a stamp file remembers the last one.

The supervisor starts each clustermaster every 10 s, and each is a new process; a condition
that lasts (another program holding the master's port) would otherwise be logged by every
one of them.  The memory of what was said last must therefore outlive the process, and be
kept where every invocation of one master home looks: a small stamp file in the home.  The
supervisor cannot do the limiting, because the line is written by the invocation, not by it.

:func:`due` decides: a line is due unless the stamp file holds the same ``key`` and was
written less than ``every`` seconds ago by the wall clock (its mtime).  A stamp from the
future (the clock stepped back) counts as old, so a step costs at most one extra line, never
a long silence.  When a line is due the stamp is rewritten (atomically, not fsync'ed: losing
it costs one line); if it cannot be written the line is due anyway: better one line too many
than a silent failure.
"""

from __future__ import annotations

import time
from pathlib import Path

from cluster.runtime import fsutil

#: The longest key kept in a stamp file [characters]; a longer one is cut (the comparison
#: uses the same cut).
MAX_KEY = 1000


def due(stamp: Path, key: str, every: float, now: float | None = None) -> bool:
    """Whether the line known by ``key`` should be logged now (see the module docstring);
    when it is, ``stamp`` records ``key`` and the time.  ``now`` defaults to the wall
    clock."""
    now = time.time() if now is None else now
    key = key.replace("\n", " ")[:MAX_KEY]
    try:
        age = now - stamp.stat().st_mtime
        if 0 <= age < every and stamp.read_text(encoding="utf-8").rstrip("\n") == key:
            return False
    except (OSError, UnicodeDecodeError):
        pass  # no stamp yet, or unreadable: the line is due
    try:
        fsutil.atomic_write(stamp, key + "\n", fsync=False)
    except OSError:
        pass  # a full disk, say: the line is logged all the same
    return True
