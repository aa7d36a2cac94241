"""What the records of one run say, for the status model: an archive folder and a results
journal.

* :func:`archive_entry` -- the recent-runs entry of an archive folder: run.info's lines
  (its summary lines as integers, :data:`SUMMARY_KEYS`; the ``.tab`` is never read for
  it) and the links to its report, table and bmpcmp page;
* :func:`finished` -- :func:`cluster.console.status.run_detail` of an archived run: which
  node ran which tests and which failed (from its ``.tab``), the head of its report, a
  sweep's tasks, the verdicts of the tests it ran twice;
* :func:`read_journal` -- a running run's results journal read on from where the last
  read stopped (a :class:`Journal`, kept by the caller).

Nothing here writes to the home or caches: :class:`cluster.console.status.StatusReader`
keeps what was read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.console import sweepdetail
from cluster.console.runinfo import (
    float_or_none,
    int_or_none,
    parse_info,
    read_text,
    run_started,
    with_run_options,
)
from cluster.defaults import BMPCMP_DIR
from cluster.master.files import journal
from cluster.report import cifiles, ciresult, indeterminate

log = logging.getLogger("cluster.console")

JSON = dict[str, Any]


#: run.info's summary lines (written by the master at the end of a run), as integers.
SUMMARY_KEYS = ("nodes", "differences", "errors", "indeterminate")


#: Where a bmpcmp run's page is, inside its archive folder (cluster.master.end.finish).
BMPCMP_PAGE = f"{BMPCMP_DIR}/index.html"


#: Lines of report.txt that run_detail shows of a finished run.
REPORT_HEAD = 40


@dataclass
class Journal:
    """What was read so far of one results journal (read on from ``offset``)."""

    identity: tuple[int, int]
    run_id: str | None = None
    offset: int = 0
    by_node: dict[str, list[str]] = field(default_factory=dict)
    failed: list[JSON] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)


def read_journal(path: Path, state: Journal) -> None:
    """Read the lines appended to ``path`` since ``state.offset`` (whole lines only)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(state.offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1  # a line being written is read next time
    for raw in data[:end].splitlines():
        line = raw.decode("utf-8", errors="replace")
        if state.run_id is None:
            word, _, rest = line.partition(" ")
            state.run_id = rest.strip() if word == "run" else ""
            continue
        try:
            result = journal.journal_result(line)
        except ValueError:
            continue
        if result.name in state.seen:
            continue  # a late copy: the first result counts, as in the run's table
        state.seen.add(result.name)
        machine = result.machine or "-"
        state.by_node.setdefault(machine, []).append(result.name)
        if result.error:
            state.failed.append({"test": result.name, "error": result.error,
                                 "machine": machine})
    state.offset += end


def archive_entry(folder: Path, run_id: str) -> JSON | None:
    """The recent-runs entry of one archive folder, or None while it has no run.info."""
    info_path = folder / "run.info"
    try:
        st = info_path.stat()
        text = info_path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        log.warning("cannot read %s: %s", info_path, exc)
        return None
    info = parse_info(text)
    base = f"/archive/{run_id}"
    has_ci = cifiles.has_ci(folder)  # rendered when asked (cluster.report.cifiles)
    entry: JSON = {
        "run": run_id, "kind": info.get("kind", ""), "what": info.get("queue", ""),
        "who": info.get("ref", ""), "priority": int_or_none(info.get("priority")),
        "started": run_started(run_id), "ended": st.st_mtime,
        "elapsed": float_or_none(info.get("elapsed")), "outcome": info.get("outcome", ""),
        "links": {"report": f"{base}/report.txt",
                  "tab": f"{base}/{run_id}.tab" if (folder / f"{run_id}.tab").is_file()
                  else None,
                  "bmpcmp": f"{base}/{BMPCMP_PAGE}" if (folder / BMPCMP_PAGE).is_file()
                  else None,
                  "junit": f"{base}/{ciresult.JUNIT_NAME}" if has_ci else None,
                  "json": f"{base}/{ciresult.JSON_NAME}" if has_ci else None},
    }
    for key in SUMMARY_KEYS:
        entry[key] = int_or_none(info.get(key))
    return entry


def finished(folder: Path, run_id: str) -> JSON:
    """run_detail of an archived run: run.info, and per node and failed from its .tab."""
    info: dict[str, Any] = with_run_options(parse_info(read_text(folder / "run.info")
                                                       or ""))
    by_node: dict[str, list[str]] = {}
    failed: list[JSON] = []
    table = folder / f"{run_id}.tab"
    tests = 0
    for name, error, machine in tab_rows(table):
        tests += 1
        machine = machine or "-"
        by_node.setdefault(machine, []).append(name)
        if error:
            failed.append({"test": name, "error": error, "machine": machine})
    report = read_text(folder / "report.txt") or ""
    entry = archive_entry(folder, run_id) or {}
    counts: JSON = {"tests": tests, "failed": len(failed), "nodes": len(by_node)}
    for key in SUMMARY_KEYS:
        counts[f"summary_{key}"] = int_or_none(info.get(key))
    detail: JSON = {"run": run_id, "state": "finished", "info": info,
                    "by_node": dict(sorted(by_node.items())), "failed": failed,
                    "counts": counts, "links": entry.get("links", {}),
                    "report_head": report.splitlines()[:REPORT_HEAD]}
    sweep = sweepdetail.archived(folder)
    if sweep is not None:
        detail["sweep"] = sweep
    confirmed = verdicts(folder)
    if confirmed:
        detail["confirm"] = confirmed
    return detail


def verdicts(folder: Path) -> list[JSON]:
    """The verdicts of the tests an archived run ran twice (docs/results.md, "Differences
    confirmed, indeterminate tests named"; ``confirm.tsv``, at most ``confirm_max`` lines):
    test, kind (confirmed, indeterminate, unconfirmed), nodes, digests and why."""
    found: list[JSON] = []
    for line in (read_text(folder / indeterminate.VERDICTS_NAME) or "").splitlines():
        try:
            v = indeterminate.Verdict.parse(line)
        except ValueError:
            continue
        found.append({"test": v.test, "kind": v.kind.value, "nodes": list(v.nodes),
                      "digests": list(v.digests), "why": v.why})
    return found


def tab_rows(path: Path) -> Iterator[tuple[str, int, str]]:
    """(name, error, machine) of each row of a .tab (bad lines skipped)."""
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) < 9:
                continue
            try:
                error = int(fields[1])
            except ValueError:
                continue
            yield fields[0], error, fields[9] if len(fields) > 9 else ""
