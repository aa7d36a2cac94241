"""A node's BUILD or UPLOAD, run in a thread while the node's loop goes on calling the master
(every call says ``busy build`` or ``busy upload`` meanwhile).

At most one runs at a time (:class:`BackgroundWork`).  Its end is heard at once: the loop
waits on its :attr:`Background.ended` event when no job runs.  However the node leaves a
run (ABORT, a signal, a failure), one still running is stopped (through the node's stop
flag, which kills its process tree) and waited for first (:meth:`BackgroundWork.end`), so
a build log ends with how its build ended and no build command outlives run.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster.errors import ClusterError
from cluster.runtime.clock import Clock
from cluster.runtime.service import StopFlag

log = logging.getLogger("cluster.node")

#: How long, beyond kill_grace, a node leaving its run waits for a stopped BUILD or
#: UPLOAD thread to end [s] (:meth:`BackgroundWork.end`).
BACKGROUND_END_WAIT = 5.0


@dataclass
class Background:
    """A BUILD or UPLOAD running in a thread; ``error`` (and ``exception``) set if it failed."""

    what: str
    thread: threading.Thread
    error: str = ""
    exception: Exception | None = None
    done: bool = False
    #: Set with ``done``: the node's loop waits on it, so it hears of the end at once.
    ended: threading.Event = field(default_factory=threading.Event)


class BackgroundWork:
    """The node's one BUILD or UPLOAD (:attr:`current`), from its start until the node has
    taken its outcome (:meth:`take_finished`)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.current: Background | None = None

    def start(self, what: str, target: Callable[[], None]) -> None:
        """Run ``target`` in a thread as the node's ``what`` ("build" or "upload")."""
        bg = Background(what, threading.Thread(target=self._main, args=(target,),
                                               daemon=True))
        self.current = bg
        bg.thread.start()

    def _main(self, target: Callable[[], None]) -> None:
        bg = self.current
        assert bg is not None
        try:
            target()
        except Exception as exc:  # reported to the master as a failure
            if isinstance(exc, ClusterError):  # expected: the message says it all
                log.error("node %s: %s failed: %s", self.node, bg.what, exc)
            else:
                log.exception("node %s: %s failed", self.node, bg.what)
            bg.error = str(exc) or type(exc).__name__
            bg.exception = exc
        bg.done = True
        bg.ended.set()

    def busy(self) -> str:
        """What runs ("build", "upload"), or "" when nothing does (a finished one whose
        outcome was not taken yet runs no more)."""
        bg = self.current
        return bg.what if bg is not None and not bg.done else ""

    def take_finished(self) -> Background | None:
        """The one that ended, now forgotten; None when none is there or it still runs."""
        bg = self.current
        if bg is None or not bg.done:
            return None
        self.current = None
        return bg

    def idle_wait(self, clock: Clock, timeout: float) -> None:
        """Sleep ``timeout`` on ``clock`` (no job runs), or less when the BUILD or UPLOAD
        ends first: the node goes on at that moment, not at the next poll slice (two of
        them were a tenth of a second before a node's first JOBS)."""
        if self.current is not None:
            clock.wait(self.current.ended, timeout)
        else:
            clock.sleep(timeout)

    def end(self, stop_flag: StopFlag, kill_grace: float) -> None:
        """Leaving the run (told ABORT, stopped, failed): one still running is stopped (its
        process tree killed, through ``stop_flag``) and its thread waited for, at most
        :data:`BACKGROUND_END_WAIT` s after the kill's grace: the build log then ends with
        how its build ended, and no build outlives the node process."""
        bg = self.current
        if bg is None or bg.done:
            return
        stop_flag.set()
        bg.thread.join(kill_grace + BACKGROUND_END_WAIT)
        if bg.thread.is_alive():
            log.warning("node %s: the %s did not stop within %.0f s of being told to",
                        self.node, bg.what, kill_grace + BACKGROUND_END_WAIT)
