"""The end step of a sweep run: its results, ``results.tsv`` and collected files archived.

:func:`end_sweep` is the end step ``sweep`` (:mod:`cluster.master.files.ending`), done before the
report, for a run of product ``sweep`` that started (every outcome but ``unstartable``).
Into ``archive/<run>/`` it puts:

* ``results/<task id>/<result name>``: the task folders the master's intake left in
  ``runs/<run>/results/`` are moved there (a rename on one file system), so they travel
  with the run when its run folder is removed.  Only folders named like a task id move;
  the intake's ``incoming/`` and staging folders go with the run folder.
* ``sweep-attempts.tsv``: every try of the run, copied as it is (the report's per-node
  statistics read it).
* ``results.tsv``: one row per task of the sweep, in task order
  (:func:`cluster.sweep.outcomes.outcomes`, :mod:`cluster.sweep.joblog`'s format).
* For a ``resume=<run id>`` run, a task this run did not try takes its row from that
  run's ``results.tsv`` and its folder from that run's ``results/`` (hard links, a copy
  across file systems), so the run's results cover every task.
* ``collected/``: the ``[collect]`` files made from the valid tasks in task order
  (:func:`cluster.sweep.collect.collect`), each valid task's folder as it is now in
  ``results/``.
* the collection script's files, when the sweep file names one (``collect_script``):
  run over ``collect-tasks.jsonl`` (each valid task's parameters and folder, written in
  the same pass as ``results.tsv``), its files moved into ``collected/``, its output in
  ``collect-script.log`` (:mod:`cluster.sweep.collectscript`).
* ``sweep.json``: what the report needs that the files above do not say: the sweep file,
  the resumed run, how many rows were taken from it, what became of each collect rule and
  of the collection script, and the error that stopped the step, if one did.

The sweep file is read from the run's snapshot of the pushed folder
(``runs/<run>/source/sweep/<sweep file>``), which is still there: the run folder is
removed only after the last end step.

**Once, and after a kill.**  Each part can be done again: a task folder already moved is
not there to move; ``results.tsv`` and ``sweep.json`` are replaced atomically; a resumed
folder is linked under a temporary name and renamed, so one that exists is whole; the
collection replaces the files it makes; the collection script runs again in a fresh
folder and its files replace those it made before.  So the master that finds the end
record redoes the step from the start and gets the same archive.

**Memory.**  The table is streamed once; the tries of the run are held as
:class:`cluster.sweep.outcomes.FinalAttempts` (about 180 bytes a task tried); the
resumed run's rows are streamed beside the tasks.

A sweep file that cannot be read any more (the snapshot gone) does not stop the run's
end: the folders and the tries are still archived, the error is logged and kept in
``sweep.json``, and the report says that ``results.tsv`` could not be made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runspec import RunSpec
from cluster.runtime import fsutil
from cluster.sweep import collect, collectscript, outcomes, spec
from cluster.sweep.collectscript import TaskLines
from cluster.sweep.expand import ID_HEX_DIGITS, tasks
from cluster.sweep.joblog import JoblogError, JoblogRow, JoblogWriter, read_joblog
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.master")

#: The run's tries, in runs/<run>/ while it runs and in archive/<run>/ after.
ATTEMPTS_FILE = "sweep-attempts.tsv"
#: The archive's names.
RESULTS_TSV = "results.tsv"
RESULTS_DIR = "results"
COLLECTED_DIR = "collected"
SUMMARY_FILE = "sweep.json"
#: A task folder's name: a task id.
_TASK_FOLDER = re.compile(f"[0-9a-f]{{{ID_HEX_DIGITS}}}")
#: Names a resumed folder is linked under before it is renamed into place.
_LINKING = ".linking."


@dataclass(frozen=True)
class SweepEnd:
    """What the step did (``sweep.json``): ``resumed`` is the run a ``resume`` run takes
    rows from ('' for none) and ``taken`` how many rows it took; ``collect`` one entry per
    ``[collect]`` rule (:class:`cluster.sweep.collect.Collected` as a dict); ``error`` why
    ``results.tsv`` and ``collected/`` were not made ('' when they were); ``script`` what
    became of the collection script
    (:class:`cluster.sweep.collectscript.ScriptOutcome` as a dict; None without one)."""

    sweep_file: str
    tasks: int = 0
    resumed: str = ""
    taken: int = 0
    collect: tuple[dict[str, object], ...] = ()
    error: str = ""
    script: dict[str, object] | None = None


def end_sweep(home: Home, start: JobStart, run: RunSpec) -> SweepEnd | None:
    """Archive a sweep run's results (the module docstring); None for any other run.
    The sweep file is the one in the run's snapshot; a ``resume=<run id>`` option names
    the run whose rows and folders fill in the tasks this run did not try."""
    sweep_file = run.sweep_file
    if sweep_file is None:
        return None
    return archive_sweep(home, start.id, home.root / start.source / sweep_file,
                         run.option("resume") or "")


def archive_sweep(home: Home, run_id: str, sweep_path: Path, resumed: str = "") -> SweepEnd:
    """:func:`end_sweep` with its facts spelt out: the run, its sweep file, and the run it
    resumes ('' for none)."""
    archive = home.archive / run_id
    results = archive / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    run_dir = home.run_dir(run_id)
    move_task_folders(run_dir / RESULTS_DIR, results)
    attempts = run_dir / ATTEMPTS_FILE
    if attempts.is_file():
        fsutil.atomic_copy(attempts, archive / ATTEMPTS_FILE)
    try:
        made = _results(home, archive, sweep_path, resumed)
    except (ClusterError, OSError, ValueError) as exc:
        log.error("run %s: results.tsv and collected/ not made: %s", run_id, exc)
        made = SweepEnd(sweep_path.name, resumed=resumed, error=str(exc))
    fsutil.atomic_write(archive / SUMMARY_FILE, json.dumps(asdict(made), indent=1) + "\n")
    return made


def read_summary(archive: Path) -> SweepEnd | None:
    """``sweep.json`` of an archived run, or None when it has none (not a sweep run)."""
    try:
        data = json.loads((archive / SUMMARY_FILE).read_text(encoding="utf-8"))
        return SweepEnd(**{**data, "collect": tuple(data.get("collect", ()))})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        return SweepEnd("", error=f"{archive / SUMMARY_FILE} is unreadable: {exc}")


def move_task_folders(source: Path, dest: Path) -> int:
    """Move each task folder of ``source`` into ``dest`` (a stale one there replaced);
    return how many moved.  Nothing to do when ``source`` is gone."""
    moved = 0
    try:
        entries = list(os.scandir(source))
    except FileNotFoundError:
        return 0
    for entry in entries:  # bounded by the folder
        if not (_TASK_FOLDER.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
            continue
        target = dest / entry.name
        if target.exists():
            shutil.rmtree(target)  # a folder left by an earlier try of this step
        shutil.move(entry.path, target)
        moved += 1
    return moved


def _results(home: Home, archive: Path, sweep_path: Path, resumed: str) -> SweepEnd:
    """results.tsv and collected/ (see the module docstring)."""
    sweep = spec.load(sweep_path)
    source = sweep.rows()
    header = source.header
    finals = outcomes.FinalAttempts.read(archive / ATTEMPTS_FILE)
    previous_archive = home.archive / resumed if resumed else None
    previous: Iterator[JoblogRow] = iter(())
    if previous_archive is not None:
        if (previous_archive / RESULTS_TSV).is_file():
            previous = read_joblog(previous_archive / RESULTS_TSV)
        else:
            log.warning("resumed run %s has no %s: the tasks not run here are reported "
                        "not run", resumed, RESULTS_TSV)
    results = archive / RESULTS_DIR
    _remove_linking_leftovers(results)
    counts = {"tasks": 0, "taken": 0}

    def rows_then_valid(writer: JoblogWriter) -> Iterator[collect.Task]:
        # Writes each task's row and yields the valid ones to the collection: one pass over
        # the table does both.
        for outcome in outcomes.outcomes(tasks(sweep), header, finals, previous):
            writer.write(outcome.row)
            counts["tasks"] += 1
            folder = results / outcome.task.task_id
            if outcome.source == outcomes.RESUMED and previous_archive is not None:
                counts["taken"] += 1
                _link_folder(previous_archive / RESULTS_DIR / outcome.task.task_id, folder)
            if outcome.row.ok:
                yield outcome.task.number, dict(outcome.row.params), folder

    def listed(valid: Iterator[collect.Task], lines: TaskLines) -> Iterator[collect.Task]:
        # The collection script's tasks file, written in the same pass.
        for number, params, folder in valid:
            lines.add(number, folder.name, params, folder)
            yield number, params, folder

    try:
        with contextlib.ExitStack() as stack:
            writer = JoblogWriter(stack.enter_context(
                fsutil.atomic_writer(archive / RESULTS_TSV)), header)
            valid = rows_then_valid(writer)
            lines: TaskLines | None = None
            if sweep.collect_script:
                lines = TaskLines(stack.enter_context(
                    fsutil.atomic_writer(archive / collectscript.TASKS_FILE)))
                valid = listed(valid, lines)
            made = collect.collect(valid, sweep.collect, archive / COLLECTED_DIR)
    except JoblogError as exc:
        raise ClusterError(f"the resumed run {resumed}'s {RESULTS_TSV}: {exc}") from None
    script = None
    if lines is not None:
        names = {path.split("/")[0] for rule in made for path in rule.files}
        outcome = collectscript.run_collect_script(
            archive, sweep.collect_script, sweep.folder, sweep.timeout, names, lines.count)
        if outcome.error:
            log.warning("run %s: collection script: %s", archive.name, outcome.error)
        script = asdict(outcome)
    return SweepEnd(sweep_path.name, counts["tasks"], resumed, counts["taken"],
                    tuple(asdict(c) for c in made), script=script)


def _link_folder(source: Path, dest: Path) -> None:
    """``dest`` becomes a copy of the folder ``source`` made of hard links (copies across
    file systems), whole or not at all; nothing when ``dest`` exists or ``source`` does
    not."""
    if dest.exists() or not source.is_dir():
        return
    temp = dest.with_name(f"{_LINKING}{os.getpid()}.{dest.name}")
    shutil.rmtree(temp, ignore_errors=True)
    shutil.copytree(source, temp, symlinks=True, copy_function=_link_or_copy)
    fsutil.swap_dir(temp, dest)


def _link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _remove_linking_leftovers(results: Path) -> None:
    """Remove the half-linked folders of a step that was killed (any process's)."""
    for entry in os.scandir(results):
        if entry.name.startswith(_LINKING):
            shutil.rmtree(entry.path, ignore_errors=True)
