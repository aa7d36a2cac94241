"""The collection script of a sweep: ``collect_script`` in the sweep file, seed 002's
"a custom implementation can be provided by the user" for collecting.

A program of the sweep folder run once on the master at the end of a sweep run, after
``results.tsv`` and the ``[collect]`` files are made (:mod:`cluster.master.end.sweepend`),
and given every valid task, in task order:

* **the tasks**: :class:`TaskLines` writes one JSON object a line per valid task,
  ``{"task": <Seq>, "id": "<task id>", "params": {"<column>": "<value>", ...},
  "results": "<absolute path of the task's result folder>"}`` (the columns in the
  table's order), into ``collect-tasks.jsonl`` in the run's archive.  The script reads
  that file on its standard input, and gets its absolute path as its only argument (the
  check script's convention: one path).  A file rather than a pipe: it is written while
  the table is streamed, a script that never reads it cannot stall the master, and it
  stays for running the script again by hand.
* **its folder**: it runs in a fresh, empty folder ``.collect-script/`` of the archive,
  with the environment variables ``CLUSTER_SWEEP_DIR`` (the run's snapshot of the sweep
  folder), ``CLUSTER_RESULTS_TSV`` (the archive's ``results.tsv``, complete) and
  ``CLUSTER_TASKS`` (the tasks file).  What it leaves in its folder are collected files.
* **its bounds**: the sweep's ``timeout`` for the whole script (its process group is
  killed when it is up: :func:`cluster.sweep.checks.run_check`); the first
  :data:`LOG_BYTES` of its standard output and error, merged, go to ``collect-script.log``
  in the archive.

When it exits 0 in time, each entry it left in its folder is renamed into ``collected/``
(one of the same name that an earlier try of the end step left there is replaced) -- except
an entry named like one a ``[collect]`` rule made, which is left out and named in the
outcome.  Otherwise its folder is kept as ``collect-script.failed/`` for reading, nothing
moves into ``collected/``, and the outcome says why (exit status and first line of output,
time out, missing or not executable).  Either way the run ends and nothing of the results is
touched: the script only reads them.

**Again after a kill.**  The folder is made afresh, the tasks file replaced atomically and
the moves replace what they find, so a master that redoes the end step gets the same
``collected/``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from cluster.runtime import fsutil, proc
from cluster.sweep.checks import run_check

#: The archive's names.
TASKS_FILE = "collect-tasks.jsonl"
LOG_FILE = "collect-script.log"
WORK_DIR = ".collect-script"
FAILED_DIR = "collect-script.failed"
#: How much of the script's output is kept in :data:`LOG_FILE` [bytes]; the rest is read
#: and dropped.
LOG_BYTES = 1 << 20
#: How long an outcome quotes the script's output [characters].
REASON_CHARS = 200


@dataclass(frozen=True)
class ScriptOutcome:
    """What became of the collection script (``sweep.json``'s ``script``).

    ``files``: the entries it made, moved into ``collected/``; ``left_out``: those left
    out because a ``[collect]`` rule made the same name; ``error``: why it failed ('' when
    it exited 0 in time); ``tasks``: how many tasks it was given.
    """

    script: str
    tasks: int = 0
    files: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    error: str = ""
    seconds: float = 0.0


class TaskLines:
    """Writes the tasks file, one line per valid task (the module docstring)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.count = 0

    def add(self, number: int, task_id: str, params: Mapping[str, object],
            results: Path) -> None:
        self.stream.write(json.dumps({"task": number, "id": task_id, "params": dict(params),
                                      "results": str(results.absolute())},
                                     ensure_ascii=False) + "\n")
        self.count += 1


def run_collect_script(archive: Path, script: str, sweep_dir: Path, timeout: float,
                       made: Collection[str], tasks: int) -> ScriptOutcome:
    """Run ``script`` (a path relative to ``sweep_dir``) over the tasks file of
    ``archive``, which lists ``tasks`` tasks; ``made`` holds the top-level names the
    ``[collect]`` rules made in ``collected/``.  See the module docstring."""
    work = archive / WORK_DIR
    failed = archive / FAILED_DIR
    for old in (work, failed):
        shutil.rmtree(old, ignore_errors=True)
    work.mkdir()
    path = sweep_dir / script
    if not path.is_file():
        return _failed(work, failed, script, tasks, "not found in the sweep folder")
    if not os.access(path, os.X_OK):
        return _failed(work, failed, script, tasks, "is not executable")
    tasks_file = (archive / TASKS_FILE).absolute()
    env = {**os.environ, "CLUSTER_SWEEP_DIR": str(sweep_dir.absolute()),
           "CLUSTER_RESULTS_TSV": str((archive / "results.tsv").absolute()),
           "CLUSTER_TASKS": str(tasks_file)}
    try:
        with tasks_file.open("rb") as stdin:
            ran = run_check([str(path.resolve()), str(tasks_file)], cwd=work,
                            timeout=timeout, keep=LOG_BYTES, env=env, stdin=stdin)
    except (proc.ProcessError, OSError) as exc:
        return _failed(work, failed, script, tasks, f"could not start: {exc}")
    fsutil.atomic_write(archive / LOG_FILE, ran.output)
    output = ran.output.decode("utf-8", "replace")
    if ran.timed_out:
        return _failed(work, failed, script, tasks, f"timed out after {timeout:g} s",
                       ran.elapsed)
    if ran.returncode != 0:
        how = (f"exited {ran.returncode}" if ran.returncode > 0
               else proc.describe_status(ran.returncode))
        said = next((line.strip() for line in output.splitlines() if line.strip()), "")
        if len(said) > REASON_CHARS:
            said = said[:REASON_CHARS] + "..."
        return _failed(work, failed, script, tasks, how + (f": {said}" if said else ""),
                       ran.elapsed)
    moved, left_out = _move_into(work, archive / "collected", made)
    return ScriptOutcome(script, tasks, moved, left_out, "", round(ran.elapsed, 3))


def _failed(work: Path, failed: Path, script: str, tasks: int, why: str,
            seconds: float = 0.0) -> ScriptOutcome:
    """Keep what the script left for reading; the outcome names ``why``."""
    work.rename(failed)
    return ScriptOutcome(script, tasks, error=f"{script} {why}", seconds=round(seconds, 3))


def _move_into(work: Path, collected: Path, made: Collection[str]) -> tuple[
        tuple[str, ...], tuple[str, ...]]:
    """Rename each entry of ``work`` into ``collected`` (replacing one there); an entry
    named in ``made`` is left out (removed with ``work``)."""
    collected.mkdir(parents=True, exist_ok=True)
    moved: list[str] = []
    left_out: list[str] = []
    for entry in sorted(os.scandir(work), key=lambda e: e.name):  # bounded by the folder
        if entry.name in made:
            left_out.append(entry.name)
            continue
        dest = collected / entry.name
        real_dir = dest.is_dir() and not dest.is_symlink()
        if real_dir and entry.is_dir(follow_symlinks=False):
            fsutil.swap_dir(entry.path, dest)
        else:
            if real_dir:
                shutil.rmtree(dest)
            elif os.path.lexists(dest):
                dest.unlink()
            os.replace(entry.path, dest)
        moved.append(entry.name)
    shutil.rmtree(work, ignore_errors=True)
    return tuple(moved), tuple(left_out)
