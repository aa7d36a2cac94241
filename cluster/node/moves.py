"""Where a preempted node goes next (docs/protocol.md, "Preemption at job boundaries";
docs/runoptions.md, "Fair share").

A node told ``ABORT preempted: for run <id> ...`` leaves its run at a job boundary and
run.py exits with NODE_EXIT_MOVED.  Which run it joins then is clusterpull's choice, and
among the runs of one priority it would take the first the monitor lists -- possibly the
run it just left, undoing a fair-share move.  So run.py notes the run it was sent to in
``work_dir/log/moved-to`` (:func:`note`) and clusterpull takes that note once
(:func:`take`): it joins that run first when the run still waits.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.runtime import fsutil
from cluster.wire.protocol import JOB_ID

log = logging.getLogger("cluster.node")

#: The note's place under the node's work folder.
MOVED_TO = Path("log") / "moved-to"


def note(work_dir: Path, run_id: str) -> None:
    """Note that this node was sent to run ``run_id``; a failure is logged, never raised
    (the node then joins the first run it is told of, as before)."""
    path = work_dir / MOVED_TO
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fsutil.atomic_write(path, run_id + "\n", fsync=False)
    except OSError as exc:
        log.warning("cannot note the run this node moves to in %s: %s", path, exc)


def take(work_dir: Path) -> str | None:
    """The run the last preempted run.py was sent to, once: the note is removed.  None
    when there is none or it does not hold a run id."""
    path = work_dir / MOVED_TO
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        path.unlink()
    except OSError:
        return None
    return text if JOB_ID.fullmatch(text) else None
