"""What a run's archive keeps so that one of its jobs can be run again
(``clusteradmin repro``; docs/operating.md, "Reproducing one job: `clusteradmin repro`").

Two things, each written once at the run's end, nothing per job:

* ``archive/<id>/jobs.gz``: the run's jobs file as build.py made it (one
  ``<test> <logfile> true ; <command>`` a line, its placeholders unfilled), gzip-compressed
  (about a twentieth of its size: a million gs jobs, some 300 MB of lines, keep as about
  15 MB).  Written by the end's report step (:func:`keep_jobs`) from the jobs file the
  run was served from, before the end removes it.  A job's own timeout is in its line
  (``timeout=<s>`` in place of ``true``: the ordering child writes it into the jobs file),
  so a repro run that runs the line as it is (:mod:`cluster.master.run.runsetup`) runs
  it under the same limit.
* ``archive/<id>/source/<tree>``: a user run's snapshot of the pushed tree (hard links to
  the user's tree, taken when the run started), moved there by a rename instead of being
  removed with the run's folder (:func:`keep_source`).  A commit run's exported tree is not
  kept (it becomes the master's clean tree, and the commit can be exported again); an auto
  run builds the master's clean tree as it stands.

:func:`job_line` reads a test's line back, streaming (the file is not held whole).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from pathlib import Path

from cluster.runtime import fsutil

#: The compressed jobs file in a run's archive.
JOBS_NAME = "jobs.gz"
#: The folder of a user run's source snapshot in a run's archive.
SOURCE_DIR = "source"
#: gzip's level: fast (the end of a run waits for it), still about 20:1 on job lines.
GZIP_LEVEL = 6


def keep_jobs(jobs: Path, archive: Path) -> bool:
    """Write ``archive/jobs.gz`` from the run's jobs file ``jobs`` (atomically); False when
    there is no jobs file (the run made none)."""
    try:
        source = open(jobs, "rb")
    except FileNotFoundError:
        return False
    with source, fsutil.atomic_bytes_writer(archive / JOBS_NAME, fsync=False) as out:
        with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
            shutil.copyfileobj(source, gz, 1 << 20)
    return True


def keep_source(run_source: Path, archive: Path) -> Path | None:
    """Move a user run's source snapshot ``run_source`` (``runs/<id>/source/<tree>``) to
    ``archive/source/<tree>``; its new path, or None when there is none to move (already
    moved by an end step that was cut short, or the run never made one)."""
    if not run_source.is_dir() or run_source.is_symlink():
        return None
    dest = archive / SOURCE_DIR / run_source.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest, ignore_errors=True)  # a half move of an earlier, cut end
    os.replace(run_source, dest)
    return dest


def kept_source(archive: Path, tree: str) -> Path | None:
    """The source snapshot kept in ``archive`` for ``tree``, or None."""
    path = archive / SOURCE_DIR / tree
    return path if path.is_dir() and not path.is_symlink() else None


def job_line(archive: Path, test: str) -> str | None:
    """The line of test id ``test`` in ``archive``'s ``jobs.gz`` (without its newline), or
    None when the test has none.  FileNotFoundError when the archive kept no jobs file (a
    run archived before it kept one, or one that made no job list)."""
    prefix = (test + " ").encode("utf-8")
    with gzip.open(archive / JOBS_NAME, "rb") as fh:
        for raw in fh:
            if raw.startswith(prefix):
                with contextlib.suppress(UnicodeDecodeError):
                    return raw.decode("utf-8").rstrip("\n")
    return None
