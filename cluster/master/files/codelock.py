"""The node code's publish lock: a run started at a tick waits for the node code that tick
publishes, not for the publish to end before the tick's clustermasters start.

The supervisor publishes the node side of the package into ``node-code/`` at every tick
(:class:`cluster.master.daemon.supervisor.NodeCodePublisher`), and a run's nodes fetch what is
published when the run is announced (``job.start``).  So a run must not be announced
before its tick's publish ended: in a new home the nodes would find nothing and run their
installed copies.  The supervisor used to publish first and start the clustermasters
after, which put the publish (0.06-0.15 s into a new home) on the path from a push to its
first job.  Now it holds :func:`publishing` from before it starts the tick's
clustermasters until the publish returned, and a clustermaster calls
:func:`wait_for_publish` after it has composed the run's job.start, before it sets up the run's
source and writes ``job.start``: the publish runs while the clustermaster starts Python and
queues the run, and a run is still announced only after it.  (Not later: a user run's
job.start is written under the pushed tree's lock, which the user's next push waits for.)

The lock is a plain ``flock`` on ``<home>/node-code.lock`` (:attr:`cluster.home.Home.
node_code_lock`), exclusive for the publisher, shared for a look.  Not a
:func:`cluster.runtime.pathlock.locked` lock: that one also locks the home's folder, which
the queue's lock shares.  A waiter gives up after :data:`WAIT_LIMIT` (a publisher that
hangs must not hold every run back; the run then goes with what is published).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from cluster.runtime import fsutil

#: How long a clustermaster waits for a publish before it announces its run anyway [s].
WAIT_LIMIT = 60.0
#: How often a waiting clustermaster looks whether the publish ended [s].
LOOK_EVERY = 0.01


@contextlib.contextmanager
def publishing(path: Path) -> Iterator[None]:
    """Hold the publish lock ``path`` (exclusively, created if missing) for the block."""
    with fsutil.flocked(path):
        yield


def wait_for_publish(path: Path, timeout: float = WAIT_LIMIT) -> bool:
    """Wait until nobody holds the publish lock ``path``: True at once when it is free or
    there is no such file (no supervisor ever published here), False when it was still
    held after ``timeout`` seconds."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True  # released with the descriptor below
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(LOOK_EVERY)
    finally:
        os.close(fd)
