"""A run's progress as one terminal line, rewritten in place (localcluster's wait).

:func:`progress_line` says where one run (named by its queue line) stands in a status
snapshot (cluster.console.status): waiting in its queue, starting, or ``120 of 225 jobs
done, 8 running, 2 nodes, 3.4/s, ends ~16:45:12 (in 31 s)`` (under 80 columns).
:class:`ProgressLine` writes it to a stream with ``\\r`` at most once per ``interval``
seconds, padding over what the last line left, and does nothing at all when the stream is
not a terminal (a log file, a pipe, a test's capture): nothing of it ends up in captured
output.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any, TextIO

from cluster.config import Config
from cluster.home import Home

#: How often the line is rewritten at most [seconds].
INTERVAL = 1.0


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def progress_line(snap: dict[str, Any], queue_line: str) -> str:
    """Where the run queued as ``queue_line`` stands in ``snap`` (one line, no newline)."""
    now = float(snap.get("now") or time.time())
    for run in snap.get("running") or []:
        if run.get("queue") != queue_line:
            continue
        if run.get("state") == "starting":
            return f"run {run.get('run')}: building the job list"
        jobs = run.get("jobs") or {}
        nodes = run.get("nodes") or {}
        # No run id: the line is about the one run the caller waits for, and must fit 80
        # columns with its estimated end.
        text = (f"{jobs.get('done', 0)} of {jobs.get('total', 0)} jobs "
                f"done, {jobs.get('running', 0)} running, {len(nodes)} node"
                f"{'' if len(nodes) == 1 else 's'}, {float(run.get('rate') or 0.0):.1f}/s")
        eta = run.get("eta")
        if isinstance(eta, int | float):
            end = time.strftime("%H:%M:%S", time.localtime(eta))
            text += f", ends ~{end} (in {_duration(eta - now)})"
        else:
            text += ", end not known yet"
        if run.get("stopping"):
            text += f"; stopping: {run['stopping']}"
        return text
    for queue in snap.get("queues") or []:
        lines = [r.get("line") for r in queue.get("runs") or []]
        if queue_line in lines:
            ahead = lines.index(queue_line)
            return (f"queued at priority {queue.get('priority')}"
                    + (f", {ahead} run(s) ahead" if ahead else ", waiting for a master"))
    return "waiting for the run to be queued"


class TerminalLine:
    """One terminal line rewritten in place with :meth:`show` (nothing when the stream is
    not a terminal), blanked with :meth:`clear`."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._shown = 0  # characters of the line now on the terminal
        try:
            self.enabled = stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            self.enabled = False

    def show(self, text: str) -> None:
        """Put ``text`` (cut to the terminal's width) in place of the line."""
        if not self.enabled:
            return
        width = max(20, shutil.get_terminal_size().columns - 1)
        text = text[:width]
        self.stream.write("\r" + text.ljust(self._shown))
        self.stream.flush()
        self._shown = len(text)

    def clear(self) -> None:
        """Blank the line (before other output), if anything was written."""
        if self.enabled and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0


class ProgressLine(TerminalLine):
    """Rewrites one terminal line with :func:`progress_line` of a run (see the module).

    ``snapshot`` defaults to cluster.console.status.snapshot, imported at the first line
    written (0.04 s of imports that localcluster.py, whose start every run waits for, need
    not pay when its output is no terminal); ``width`` to the terminal's.
    """

    def __init__(self, stream: TextIO, home: Home, cfg: Config, queue_line: str, *,
                 interval: float = INTERVAL,
                 snapshot: Callable[[Home, Config], dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream)
        self.home = home
        self.cfg = cfg
        self.queue_line = queue_line
        self.interval = interval
        self._snapshot = snapshot
        self._clock = clock
        self._last = -interval

    def update(self) -> None:
        """Rewrite the line if ``interval`` has passed since the last time (else nothing)."""
        if not self.enabled or self._clock() - self._last < self.interval:
            return
        self._last = self._clock()
        if self._snapshot is None:
            from cluster.console import status  # here, not at the top: see the class
            self._snapshot = status.snapshot
        try:
            text = progress_line(self._snapshot(self.home, self.cfg), self.queue_line)
        except Exception as exc:  # noqa: BLE001 -- a progress line must never end a run
            text = f"(no progress: {type(exc).__name__}: {exc})"
        self.show(text)
