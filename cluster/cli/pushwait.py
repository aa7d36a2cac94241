"""Following a pushed run to its end (``clusterpush --wait``; docs/operating.md, "Waiting
for a run from CI: `clusterpush --wait --junit`").

:func:`wait_for_archive` polls the master home's ``archive/`` for the folder of the run
queued as a given queue line that was not there before the push: the run has ended once
its folder holds ``report.txt`` and a ``run.info`` naming that queue line (the end step
writes run.info last, after the CI facts).  :func:`verdict` turns the archived run into
clusterpush's exit status.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cluster.console.runinfo import run_started
from cluster.defaults import EXIT_FAILED, EXIT_OK, EXIT_RUN_FAILED
from cluster.home import Home
from cluster.localrunend import run_end, sweep_not_ok
from cluster.report import cifiles

#: How often the archive is looked at [seconds].
POLL = 1.0


def archived(home: Home) -> set[str]:
    """The names of the run folders in the home's archive now."""
    if not home.archive.is_dir():
        return set()
    return {p.name for p in home.archive.iterdir()}


def wait_for_archive(home: Home, queue_line: str, before: set[str], timeout: float, *,
                     on_poll: Callable[[], None] | None = None,
                     since: float | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Path | None:
    """The archive folder of the run queued as ``queue_line`` not in ``before``, once it
    is complete; None when ``timeout`` seconds passed first.  ``on_poll`` is called at every
    look (it must be quick).  ``since`` (epoch seconds): only runs whose id says they
    started then or later (a remote wait knows the commit's time, not the archive before)."""
    wanted = f"queue {queue_line}\n"
    end = clock() + timeout
    while True:
        if on_poll is not None:
            on_poll()
        for name in sorted(archived(home) - before):
            if since is not None and (run_started(name) or 0.0) < since:
                continue
            folder = home.archive / name
            info = folder / "run.info"
            try:
                if (folder / "report.txt").exists() and wanted in info.read_text(
                        encoding="utf-8", errors="replace"):
                    return folder
            except FileNotFoundError:
                continue
        if clock() >= end:
            return None
        sleep(POLL)


def changed_tests(archive: Path) -> int:
    """How many tests of the archived run changed: its CI facts' ``changed`` (confirmed
    differences and new errors; :func:`cluster.report.cifiles.changed`), else run.info's
    ``differences`` (a run without CI facts, a sweep's); 0 when neither says."""
    changed = cifiles.changed(archive)
    if changed is not None:
        return changed
    for line in (archive / "run.info").read_text(encoding="utf-8",
                                                 errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "differences" and value.strip().isdigit():
            return int(value)
    return 0


def verdict(archive: Path) -> int:
    """The exit status of ``clusterpush --wait`` for the archived run: 3 it did not
    complete, 1 tests changed or (a sweep) tasks did not end ok, 0 nothing changed."""
    if not run_end(archive).complete:
        return EXIT_RUN_FAILED
    return EXIT_FAILED if changed_tests(archive) or sweep_not_ok(archive) else EXIT_OK
