"""A sweep's check scripts, run off the master's request path (docs/sweeps.md section 9,
"The check pool").

A check script is a process of its own, bounded only by the sweep's ``timeout``: run in the
request path, one slow check would stall every node.  :class:`CheckPool` runs them on at
most ``workers`` threads (master.conf ``sweep_check_workers``), each waiting on its
script's process, so the master's one serving thread never waits for a script.

The serving thread :meth:`~CheckPool.submit`\\ s a check (a key and the result folder the
script is given) and, when told through :attr:`~CheckPool.wake_fd` (readable once a verdict
is ready: the server watches it), :meth:`~CheckPool.drain`\\ s the verdicts, in the order
they came.  Everything about a try but its script -- holding its files, its result, the
journal -- stays with the serving thread (:mod:`cluster.master.serve.sweepintake`), so no
lock guards the run's state.

:meth:`~CheckPool.close` ends the scripts still running (as their timeout would) and drops
the checks not begun: a master leaving the run leaves them to its successor, which judges
them again.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from cluster.sweep.checks import Verdict

log = logging.getLogger("cluster.master")

#: What a worker runs: ``judge(result folder, stop)`` -> the verdict; ``stop()`` true once
#: the pool closes (the script is then ended and its verdict dropped).
Judge = Callable[[Path, Callable[[], bool]], Verdict]


class CheckPool:
    """At most ``workers`` checks at a time, judged by ``judge``, their threads started on
    the first :meth:`submit`."""

    def __init__(self, workers: int, judge: Judge) -> None:
        if workers < 1:
            raise ValueError(f"CheckPool workers={workers!r}: expected at least 1")
        self.workers = workers
        self.judge = judge
        self._todo: queue.SimpleQueue[tuple[str, Path] | None] = queue.SimpleQueue()
        self._done: collections.deque[tuple[str, Verdict]] = collections.deque()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        #: Checks submitted and not yet drained (running, waiting, or judged).
        self.pending = 0

    @property
    def wake_fd(self) -> int:
        """Readable once a verdict waits for :meth:`drain`."""
        return self._wake_r

    def submit(self, key: str, folder: Path) -> None:
        """Judge the result folder ``folder`` (``key`` names the check in :meth:`drain`)."""
        if self._stop.is_set():
            raise RuntimeError("CheckPool.submit after close()")
        if len(self._threads) < self.workers:
            thread = threading.Thread(target=self._work, name=f"check-{len(self._threads)}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        self.pending += 1
        self._todo.put((key, folder))

    def drain(self) -> list[tuple[str, Verdict]]:
        """The verdicts ready now, oldest first (the wake-up bytes read)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        out = []
        while self._done:
            out.append(self._done.popleft())
        self.pending -= len(out)
        return out

    def close(self) -> None:
        """End the running scripts, drop the checks not begun, stop the threads."""
        self._stop.set()
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # ------------------------------------------------------------------ the workers
    def _work(self) -> None:
        stop = self._stop.is_set
        while True:  # bounded by close(): one None per thread
            item = self._todo.get()
            if item is None or stop():
                return
            key, folder = item
            try:
                verdict = self.judge(folder, stop)
            except Exception as exc:  # a bug must not lose the try: it is judged invalid
                log.exception("check of %s failed", key)
                verdict = Verdict(False, f"the check could not run: {exc}")
            if stop():
                return  # ended by close(): the successor judges it again
            self._done.append((key, verdict))
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b".")
