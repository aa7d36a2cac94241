"""What the per-run view shows of a sweep run: its tasks by status and its failed
parameter sets (docs/sweeps.md), as JSON for :func:`cluster.console.status.run_detail`.

* **An archived sweep run**: from ``archive/<run>/results.tsv``
  (:func:`cluster.report.sweepreport.tally`, streamed): the counts and the first
  :data:`FAILED_LISTED` rows that are not ``ok``, each with its ``Seq``, parameters, status
  and node.
* **A running (or ending) sweep run**: from ``runs/<run>/sweep-attempts.tsv``, each task's
  standing try (the rule of :mod:`cluster.sweep.outcomes`), but only while the file is at
  most :data:`LIVE_READ_BYTES`: it is read whole at each request, and a bigger one would
  make the page slow; then only ``"note"`` says why nothing is listed.  Only tasks whose
  standing try is ``final`` count (a task with tries left is not failed yet), listed in the
  order they were first tried.  The tries name no parameters: a running task is listed by
  its task id.

Schema::

    {"source": "results.tsv" | "sweep-attempts.tsv",
     "tasks": <n or None>, "ok": <n>, "invalid": <n>, "failed": <n>, "timeout": <n>,
     "not_ok": <n>, "failed_sets": [{"seq", "task", "params": {name: value}, "status",
     "host"}], "note": "<why nothing is listed>" or ""}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster.report import sweepreport
from cluster.sweep.attempts import read_attempts

#: Failed parameter sets listed; the rest are counted (``not_ok``).
FAILED_LISTED = 200
#: The largest tries file read for a running sweep's view [bytes] (about 40,000 tries).
LIVE_READ_BYTES = 4 << 20
#: The names the master gives them (cluster.master.end.sweepend).
RESULTS_TSV = "results.tsv"
ATTEMPTS_FILE = "sweep-attempts.tsv"

JSON = dict[str, Any]


def archived(folder: Path) -> JSON | None:
    """The sweep facts of an archived run, None when it has no ``results.tsv``."""
    path = folder / RESULTS_TSV
    if not path.is_file():
        return None
    try:
        counted = sweepreport.tally(path, FAILED_LISTED)
    except (OSError, ValueError) as exc:
        return _empty(RESULTS_TSV, f"{RESULTS_TSV} is unreadable: {exc}")
    return {"source": RESULTS_TSV, "tasks": counted.tasks, "ok": counted.ok,
            "invalid": counted.invalid, "failed": counted.failed, "timeout": counted.timeout,
            "not_ok": counted.not_ok, "note": "",
            "failed_sets": [{"seq": row.seq, "task": "", "params": dict(row.params),
                             "status": row.status, "host": row.host}
                            for row in counted.failed_rows]}


def running(run_dir: Path) -> JSON:
    """The sweep facts of a run being served or ended, from its tries so far."""
    path = run_dir / ATTEMPTS_FILE
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return _empty(ATTEMPTS_FILE, "")
    if size > LIVE_READ_BYTES:
        return _empty(ATTEMPTS_FILE, f"{size} bytes of tries: the failed parameter sets are "
                      "listed when the run has ended")
    standing: dict[str, tuple[str, str, bool]] = {}  # task -> status, node, final
    try:
        for attempt in read_attempts(path):
            held = standing.get(attempt.task)
            if held is not None and held[2] and (held[0] == "ok" or not attempt.final):
                continue  # a final ok stays; a final outranks a later retry
            standing[attempt.task] = (attempt.status, attempt.node, attempt.final)
    except (OSError, ValueError) as exc:
        return _empty(ATTEMPTS_FILE, f"{ATTEMPTS_FILE} is unreadable: {exc}")
    done = {task: held for task, held in standing.items() if held[2]}
    facts = _empty(ATTEMPTS_FILE, "")
    facts["ok"] = sum(1 for status, _, _ in done.values() if status == "ok")
    for task, (status, node, _) in done.items():
        if status == "ok":
            continue
        facts["not_ok"] += 1
        key = ("timeout" if status == "timeout" else
               "invalid" if status.startswith("invalid: ") else "failed")
        facts[key] += 1
        if len(facts["failed_sets"]) < FAILED_LISTED:
            facts["failed_sets"].append({"seq": None, "task": task, "params": {},
                                         "status": status, "host": node})
    return facts


def _empty(source: str, note: str) -> JSON:
    return {"source": source, "tasks": None, "ok": 0, "invalid": 0, "failed": 0,
            "timeout": 0, "not_ok": 0, "failed_sets": [], "note": note}
