"""What the console says of the provisioner: its status file as the snapshot's
``provision`` entry, and the lines the text views print.

The provisioner (``clusterscale.py``) rewrites ``<home>/provision.json`` at each look
(:mod:`cluster.wire.provision`).  When the file exists, the status page, ``clusteradmin
stat`` and ``clustermonitor`` show, from the one entry :func:`entry` makes::

    from Slurm: wanted 3, pending 1, running 2
      slurm-41 (Slurm job 41) running
      slurm-42 (Slurm job 42) pending: PartitionDown
      trouble: sbatch: exit status 1: sbatch: error: Batch job submission failed: ...
      the provisioner is not running: provision.json was written 45 s ago (more than 3 x 10 s)

(the last line only when the file is stale; a file that cannot be read or is malformed is
one line saying so).  No file, no entry: most clusters have no provisioner.  Every text
comes from a file anyone may have written to, or from the batch system: the texts made
here are one line each with control characters replaced (a terminal is not driven by
them), and the page puts them in as text, never as HTML.

Schema of the entry (keys may be added)::

    {"file": "<path>", "error": "" | "<why the file was not read>",
     "engine": "Slurm", "written": <epoch>, "age": <seconds>, "stale": bool,
     "interval": <seconds>, "pid": <int>, "wanted": <int>,
     "pending": <int> | None, "running": <int> | None,    # None: not listed
     "jobs": [{"job_id", "name", "node", "state", "reason", "text"}],
     "action": "<the look's log line>", "trouble": "<message>" | "",
     "summary": "from Slurm: wanted ...", "stale_note": "" | "the provisioner is not ...",
     "failing": <int>, "failure": "<the last failed pilot>", "next_submit": <seconds>,
     "excluded": [<host>], "pilot_notes": [<the lines saying them>],
     "lines": [<the text views' lines, the jobs cut at JOBS_SHOWN>]}

A node of the snapshot whose name is a job's ``node`` gets ``batch_job``:
``{"engine": "Slurm", "id": "42"}`` (:func:`mark_nodes`).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.wire.provision import ProvisionFileError, ProvisionStatus, read_status
from cluster.wire.resources import STALE_INTERVALS

JSON = dict[str, Any]
#: Jobs the text views list (``clusteradmin stat``, ``clustermonitor``); the rest counted.
JOBS_SHOWN = 20
#: The longest text shown of one value from the file (a Slurm message is a few lines).
TEXT_LIMIT = 500


def clean(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` as one printable line: its lines joined by `` / ``, other control
    characters as ``?``, at most ``limit`` characters (``...`` marks a cut)."""
    joined = " / ".join(part.strip() for part in text.splitlines() if part.strip())
    printable = "".join("?" if unicodedata.category(c) in ("Cc", "Cf") else c
                        for c in joined)
    return printable if len(printable) <= limit else printable[:limit - 3] + "..."


@dataclass(frozen=True)
class Loaded:
    """A status file read and checked, with what does not depend on the time: its jobs as
    the entry lists them (with their texts) and the summary line.  Made once per change of
    the file (the status reader caches it), however many jobs it lists."""

    status: ProvisionStatus
    jobs: tuple[JSON, ...]
    summary: str


def load(path: Path) -> Loaded | str:
    """The status file at ``path`` read and checked (its staleness is judged by
    :func:`entry`), or the message saying why it is not a status file.
    FileNotFoundError when there is none."""
    try:
        s = read_status(path, now=0.0)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"{path}: cannot be read: {exc.strerror or exc}"
    except ProvisionFileError as exc:
        return str(exc)
    counts = (f"pending {s.pending}, running {s.running}" if s.pending is not None
              else "pending ?, running ? (its jobs could not be listed)")
    jobs = tuple({"job_id": j.job_id, "name": j.name, "node": j.node, "state": j.state,
                  "reason": j.reason,
                  "text": job_text(s.engine, j.job_id, j.node, j.state, j.reason)}
                 for j in s.jobs)
    return Loaded(s, jobs, f"from {clean(s.engine, 40)}: wanted {s.wanted}, {counts}")


def job_text(engine: str, job_id: str, node: str, state: str, reason: str) -> str:
    """``slurm-42 (Slurm job 42) running``; a pending job with its reason:
    ``slurm-43 (Slurm job 43) pending: PartitionDown``."""
    text = f"{clean(node, 100)} ({clean(engine, 40)} job {clean(job_id, 40)}) {clean(state, 20)}"
    return text + (f": {clean(reason, 200)}" if reason else "")


def entry(path: Path, loaded: Loaded | str, now: float) -> JSON:
    """The snapshot's ``provision`` entry for the file at ``path`` as :func:`load` gave
    it, judged at ``now`` (epoch seconds).  Its ``jobs`` are shared with ``loaded``:
    callers never change them."""
    if isinstance(loaded, str):
        message = clean(loaded)
        return {"file": str(path), "error": message,
                "lines": [f"provisioner status file unusable: {message}"]}
    s = loaded.status
    age = s.age(now)
    stale = age > STALE_INTERVALS * s.interval
    stale_note = (f"the provisioner is not running: {path.name} was written {age:.0f} s ago "
                  f"(more than {STALE_INTERVALS} x {s.interval:g} s)" if stale else "")
    trouble = clean(s.trouble)
    notes = pilot_notes(s)
    lines = [loaded.summary]
    lines += [f"  {stale_note}"] if stale_note else []
    lines += [f"  trouble: {trouble}"] if trouble else []
    lines += [f"  {note}" for note in notes]
    lines += [f"  {job['text']}" for job in loaded.jobs[:JOBS_SHOWN]]
    if len(loaded.jobs) > JOBS_SHOWN:
        lines.append(f"  ... and {len(loaded.jobs) - JOBS_SHOWN} more jobs")
    return {"file": str(path), "error": "", "engine": s.engine, "written": s.written,
            "age": age, "stale": stale, "interval": s.interval, "pid": s.pid,
            "wanted": s.wanted, "pending": s.pending, "running": s.running,
            "jobs": loaded.jobs, "action": s.action, "trouble": trouble,
            "summary": loaded.summary, "stale_note": stale_note, "failing": s.failing,
            "failure": clean(s.failure, 2 * TEXT_LIMIT), "next_submit": s.next_submit,
            "excluded": list(s.excluded), "pilot_notes": notes, "lines": lines}


def pilot_notes(s: ProvisionStatus) -> list[str]:
    """``pilots failing: 3 in a row (the next submit in 80 s); the last: job 7 ...`` and
    ``hosts excluded: vm (...)``: what the back-off and the exclusions say, [] when all is
    well (docs/provisioning.md, "Pilots that cannot start")."""
    notes = []
    if s.failing:
        wait = f"the next submit in {s.next_submit:.0f} s" if s.next_submit > 0 else \
            "one submit at a time"
        notes.append(f"pilots failing: {s.failing} in a row ({wait}); the last: "
                     f"{clean(s.failure, 2 * TEXT_LIMIT)}")
    if s.excluded:
        notes.append(f"hosts excluded from the submissions: "
                     f"{clean(', '.join(s.excluded))} (clusterscale.py --clear-host HOST "
                     "clears one)")
    return notes


def mark_nodes(nodes: list[JSON], provision: JSON | None) -> list[JSON]:
    """``nodes`` with ``batch_job`` (``{"engine", "id"}``) on each node that a job of
    ``provision`` runs (its name is the job's ``node``).  The entries marked are copies
    (the nodes are shared with the status reader's cache); the others, and ``nodes``
    itself when no node is marked, are the same objects."""
    by_node = {job["node"]: job["job_id"] for job in (provision or {}).get("jobs", ())}
    if not by_node or not any(node.get("name") in by_node for node in nodes):
        return nodes
    engine = provision["engine"] if provision else ""
    return [{**node, "batch_job": {"engine": engine, "id": by_node[node["name"]]}}
            if node.get("name") in by_node else node for node in nodes]


def lines(provision: JSON | None) -> list[str]:
    """The text views' lines of a snapshot's ``provision`` entry ([] without one)."""
    return list(provision.get("lines", ())) if provision else []


def node_note(node: JSON) -> str:
    """``(Slurm job 42)`` for a node a batch job runs, else ""."""
    job = node.get("batch_job")
    if not isinstance(job, dict):
        return ""
    return f"({clean(str(job.get('engine', '')), 40)} job {clean(str(job.get('id', '')), 40)})"
