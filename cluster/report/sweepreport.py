"""The report of a sweep run (docs/sweeps.md): what its tasks gave, read from its archive.

A sweep run's report is not a test report: its tasks are parameter sets, its results files.
:func:`render` makes the text from the archive's files (all streamed) and a few facts the
master passes in (:class:`SweepFacts`), in this order::

    <run header>

    Sweep sweep.toml: 64 tasks: 60 ok, 2 invalid, 1 failed, 1 timed out.
    Resumed run <id>: the results of 40 tasks were taken from it.
    Ran for 12 seconds on 2 nodes.
    Each task's row is in <archive>/results.tsv, its files in <archive>/results/<task id>/.

    Failed parameter sets (4):                      every task not ok, in task order
      #3 alpha=0.1 n=10: invalid: check.sh exited with status 1
      ... and 2 more (see results.tsv)

    Tasks per node:                                 every try of this run, per node
      node1: 33 tries, 20.5 seconds, 1 not ok

    Collected files (in collected/):
      all.txt: 1234 bytes
      collect "by/{v}.txt" from out: not made: ...

    Changed since the previous run of this sweep (3):   the md5 of each result changed
      #4 alpha=0.2 n=10: ok

* **Counts** come from ``results.tsv``: ``ok``, ``invalid: ...``, ``failed: ...`` (a task
  never run, ``failed: not run``, counted among them and also on its own) and ``timeout``.
* **Failed parameter sets**: the first :data:`MAX_LISTED` not ok, each with its ``Seq``,
  its parameters (a value cut at :data:`VALUE_CHARS` characters) and its status; then
  ``... and N more``.
* **Per node** (seed 002's "which slave did what"): from ``sweep-attempts.tsv``, every try
  of this run (a resumed run's tasks are not counted again): tries, seconds of runtime, and
  tries that were not ``ok``.
* **Collected files**: the files under ``collected/`` with their sizes (the first
  :data:`MAX_LISTED`), and each ``[collect]`` rule the collection refused, with why.
* **Changed tasks**: the task ids whose md5 changed against the user's previous run's table
  (the master's comparison with ``tables/user-<name>.tab``, :func:`cluster.report.compare.analyse`:
  a task's md5 is that of its result files, so any changed file changes it), shown with
  their ``Seq`` and parameters.  A task of another sweep has another id and is never
  compared; None (no previous run) says so.

Memory: ``results.tsv`` and the tries are streamed; what is held is bounded by the
listings' limits and the number of nodes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.errors import ClusterError
from cluster.sweep.attempts import read_attempts
from cluster.sweep.expand import task_id
from cluster.sweep.joblog import JoblogRow, read_joblog

logger = logging.getLogger("cluster.sweepreport")

#: Parameter sets, changed tasks and collected files listed; the rest are counted.
MAX_LISTED = 200
#: A parameter value is shown cut to this many characters.
VALUE_CHARS = 60
#: The status of a task nobody ran (:data:`cluster.sweep.outcomes.NOT_RUN`).
NOT_RUN = "failed: not run"


@dataclass(frozen=True)
class SweepFacts:
    """What the master knows of a sweep run besides its archive's files.

    ``sweep_file``: its name; ``seconds``/``nodes``/``lost_nodes``: as for any run;
    ``resumed``/``taken``: the run a ``resume`` run took the rows of ``taken`` tasks from
    ('' for none); ``collect``: each ``[collect]`` rule's outcome as the end step kept it
    (``target``, ``source``, ``files``, ``error``); ``error``: why ``results.tsv`` was not
    made ('' when it was); ``changed``: the task ids whose results changed since the
    previous run, None when there is no previous run to compare with; ``script``: what
    became of the collection script (``script``, ``files``, ``left_out``, ``error``), None
    without one.
    """

    sweep_file: str
    seconds: float = 0.0
    nodes: int = 0
    lost_nodes: tuple[str, ...] = ()
    resumed: str = ""
    taken: int = 0
    collect: Sequence[Mapping[str, object]] = ()
    error: str = ""
    changed: Collection[str] | None = None
    script: Mapping[str, object] | None = None


@dataclass
class Tally:
    """The tasks of ``results.tsv`` by status; ``failed_rows`` the first not ok ones."""

    tasks: int = 0
    ok: int = 0
    invalid: int = 0
    failed: int = 0
    timeout: int = 0
    not_run: int = 0
    failed_rows: list[JoblogRow] = field(default_factory=list)

    @property
    def not_ok(self) -> int:
        return self.tasks - self.ok


@dataclass
class NodeStats:
    """One node's tries in the run: how many, their runtime in seconds, how many not ok."""

    tries: int = 0
    seconds: float = 0.0
    not_ok: int = 0


def tally(results_tsv: Path, limit: int | None = None) -> Tally:
    """Count ``results.tsv``'s tasks by status and keep the first ``limit`` not ok
    (default :data:`MAX_LISTED`)."""
    limit = MAX_LISTED if limit is None else limit
    counted = Tally()
    for row in read_joblog(results_tsv):
        counted.tasks += 1
        if row.ok:
            counted.ok += 1
            continue
        if row.status == "timeout":
            counted.timeout += 1
        elif row.status.startswith("invalid: "):
            counted.invalid += 1
        else:
            counted.failed += 1
            counted.not_run += row.status == NOT_RUN
        if len(counted.failed_rows) < limit:
            counted.failed_rows.append(row)
    return counted


def node_stats(attempts: Path) -> dict[str, NodeStats]:
    """Every try of ``attempts`` (``sweep-attempts.tsv``) counted per node; empty when
    there is no file."""
    stats: dict[str, NodeStats] = {}
    try:
        for attempt in read_attempts(attempts):
            node = stats.setdefault(attempt.node, NodeStats())
            node.tries += 1
            node.seconds += attempt.runtime
            node.not_ok += attempt.status != "ok"
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        # A report is made once and must be made: the tries read so far are counted.
        logger.error("%s: the tries after a bad line are not counted: %s", attempts, exc)
    return dict(sorted(stats.items()))


def collected_files(folder: Path, limit: int | None = None
                    ) -> tuple[list[tuple[str, int]], int]:
    """(the first ``limit`` files under ``folder`` as (relative path, size), in name order
    folder by folder; how many there are in all).  Staging folders (dot names) are left
    out."""
    limit = MAX_LISTED if limit is None else limit
    listed: list[tuple[str, int]] = []
    total = 0
    for path, size in _walk(folder, ""):
        total += 1
        if len(listed) < limit:
            listed.append((path, size))
    return listed, total


def _walk(folder: Path, prefix: str) -> Iterator[tuple[str, int]]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:  # bounded: collect makes at most 10,000 files a target
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), f"{prefix}{entry.name}/")
        elif entry.is_file(follow_symlinks=False):
            yield f"{prefix}{entry.name}", entry.stat(follow_symlinks=False).st_size


def changed_rows(results_tsv: Path, changed: Collection[str],
                 limit: int | None = None) -> list[JoblogRow]:
    """The rows of ``results.tsv`` whose task id is in ``changed`` (the first ``limit``, in
    task order); a row's id is computed from its command and parameters."""
    limit = MAX_LISTED if limit is None else limit
    found: list[JoblogRow] = []
    if not changed:
        return found
    wanted = set(changed)
    try:
        for row in read_joblog(results_tsv):
            if _row_id(row) in wanted:
                found.append(row)
                if len(found) >= limit:
                    break
    except (ClusterError, OSError) as exc:  # no results.tsv: the ids are only counted
        logger.error("%s: the changed tasks are not listed: %s", results_tsv, exc)
    return found


def _row_id(row: JoblogRow) -> str:
    try:
        return task_id(row.command, [n for n, _ in row.params], [v for _, v in row.params])
    except ValueError:
        return ""


def parameters(row: JoblogRow) -> str:
    """``#<Seq> name=value ...`` with each value cut at :data:`VALUE_CHARS` characters and
    quoted (``repr``) when it is empty or holds a space or a character not printable."""
    shown = []
    for name, value in row.params:
        cut = value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS] + "..."
        if not cut or not cut.isprintable() or " " in cut:
            cut = repr(cut)
        shown.append(f"{name}={cut}")
    return " ".join([f"#{row.seq}", *shown])


def render(header: str, facts: SweepFacts, results_tsv: Path, attempts: Path,
           collected: Path) -> tuple[str, Tally]:
    """The report's text (it ends with a newline) and the tally it states (the module
    docstring gives the sections)."""
    lines = [header.rstrip("\n"), ""]
    if facts.error:
        lines += [f"Sweep {facts.sweep_file}: results.tsv and the collected files could "
                  f"not be made: {facts.error}", ""]
        counted = Tally()
    else:
        try:
            counted = tally(results_tsv)
            lines.append(summary_line(facts.sweep_file, counted))
        except (ClusterError, OSError) as exc:
            counted = Tally()
            lines += [f"Sweep {facts.sweep_file}: results.tsv is unreadable: {exc}", ""]
    if facts.resumed:
        lines.append(f"Resumed run {facts.resumed}: the results of {facts.taken} "
                     f"task{_s(facts.taken)} were taken from it.")
    seconds = round(facts.seconds)
    lines.append(f"Ran for {seconds} second{_s(seconds)} on {facts.nodes} "
                 f"node{_s(facts.nodes)}.")
    archive = results_tsv.parent
    lines.append(f"Each task's row is in {archive}/results.tsv, its files in "
                 f"{archive}/results/<task id>/.")
    if facts.lost_nodes:
        lines.append("Nodes lost: " + ", ".join(facts.lost_nodes))
    lines.append("")
    if counted.not_ok:
        lines.append(f"Failed parameter sets ({counted.not_ok}):")
        lines += [f"  {parameters(row)}: {row.status}" for row in counted.failed_rows]
        if counted.not_ok > len(counted.failed_rows):
            lines.append(f"  ... and {counted.not_ok - len(counted.failed_rows)} more "
                         "(see results.tsv)")
        lines.append("")
    lines += node_lines(node_stats(attempts))
    lines += collected_lines(collected, facts.collect)
    lines += script_lines(facts.script)
    lines += changed_lines(results_tsv, facts.changed)
    return "\n".join(lines) + "\n", counted


def summary_line(sweep_file: str, counted: Tally) -> str:
    """``Sweep <file>: <n> tasks: <ok> ok, <i> invalid, <f> failed, <t> timed out.``"""
    line = (f"Sweep {sweep_file}: {counted.tasks} task{_s(counted.tasks)}: {counted.ok} ok, "
            f"{counted.invalid} invalid, {counted.failed} failed, {counted.timeout} "
            "timed out")
    if counted.not_run:
        line += f" ({counted.not_run} of the failed not run)"
    return line + "."


def node_lines(stats: Mapping[str, NodeStats]) -> list[str]:
    if not stats:
        return ["No task was tried in this run.", ""]
    lines = ["Tasks per node:"]
    for node, s in stats.items():
        lines.append(f"  {node or '-'}: {s.tries} tr{'y' if s.tries == 1 else 'ies'}, "
                     f"{s.seconds:.1f} seconds, {s.not_ok} not ok")
    return [*lines, ""]


def collected_lines(folder: Path, rules: Sequence[Mapping[str, object]]) -> list[str]:
    files, total = collected_files(folder)
    refused = [r for r in rules if r.get("error")]
    if not rules:
        return []
    lines = [f"Collected files ({total}, in collected/):"]
    lines += [f"  {path}: {size} byte{_s(size)}" for path, size in files]
    if total > len(files):
        lines.append(f"  ... and {total - len(files)} more")
    for rule in refused:
        lines.append(f"  collect {rule.get('target')!r} from {rule.get('source')}: not "
                     f"made: {rule.get('error')}")
    return [*lines, ""]


def script_lines(script: Mapping[str, object] | None) -> list[str]:
    """What the collection script did: its files, or why it failed."""
    if not script:
        return []
    name = script.get("script")
    if script.get("error"):
        return [f"Collection script {name} failed: {script.get('error')} (its output is in "
                "collect-script.log, its files in collect-script.failed/).", ""]
    files = [str(f) for f in _seq(script.get("files"))]
    line = (f"Collection script {name}: {script.get('tasks')} task(s) given, made "
            + (", ".join(files[:MAX_LISTED]) if files else "no file") + " in collected/.")
    if len(files) > MAX_LISTED:
        line += f" ... and {len(files) - MAX_LISTED} more."
    left_out = [str(f) for f in _seq(script.get("left_out"))]
    lines = [line]
    if left_out:
        lines.append("  left out, made by a [collect] rule: " + ", ".join(left_out))
    return [*lines, ""]


def _seq(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def changed_lines(results_tsv: Path, changed: Collection[str] | None) -> list[str]:
    if changed is None:
        return ["No previous run of this sweep to compare with.", ""]
    if not changed:
        return ["No task's results changed since the previous run of this sweep.", ""]
    rows = changed_rows(results_tsv, changed)
    lines = [f"Changed since the previous run of this sweep ({len(changed)}):"]
    lines += [f"  {parameters(row)}: {row.status}" for row in rows]
    if len(changed) > len(rows):
        lines.append(f"  ... and {len(changed) - len(rows)} more")
    return [*lines, ""]


def _s(count: int) -> str:
    return "" if count == 1 else "s"
