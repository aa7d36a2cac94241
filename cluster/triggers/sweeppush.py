"""Submitting a sweep (docs/sweeps.md): the checks ``clusterpush.py --sweep`` and
``localcluster.py --sweep`` make before a sweep folder is pushed and queued.

A sweep run is a user run of product ``sweep`` whose tree is the sweep folder (the folder
holding the sweep file): it is pushed like any tree (:mod:`cluster.triggers.push`) to
``users/<user>/sweep`` and queued at priority 0 as ``user <user> sweep sweep=<file>``; the
``sweep=`` option names the sweep file in the folder's top (:data:`cluster.runspec.SWEEP_FILE`).
build.py on the master later reads that file in the run's snapshot of the folder.

:func:`prepare_sweep` checks everything first, so that nothing is pushed or queued for a
sweep that cannot run: the sweep file (:func:`cluster.sweep.spec.load`), every row of the
table expanded into its task (streamed: a table of a million rows costs one row's
memory), and that the files the master needs -- the sweep file, the table, the check
script -- travel with the folder: a push leaves out build folders, images and files over
its size limit (:func:`cluster.triggers.push.is_excluded`, ``MAX_PUSH_BYTES``).  Problems
raise :class:`~cluster.errors.SweepError` naming the file and the key.

:func:`previous_sweep_run` finds the run a ``resume`` submission resumes: the user's
newest archived run of product ``sweep`` with the same sweep file name (the queue line's
``sweep=``) whose archive folder holds a ``results.tsv``.  Newest is by run id, which
starts with the run's UTC start time (:func:`cluster.master.run.runsetup.new_run_id`), as
the master's own search for a user's last run goes; who the run's user is and its sweep
file come from the run's ``run.info`` (its job.start, with the queue line).  A run that
ended before writing its ``results.tsv`` (stopped while serving, a build that failed) is
passed over: it holds no results to resume.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import ClusterError, QueueLineError, SweepError
from cluster.home import Home
from cluster.runspec import SWEEP, SWEEP_FILE, RunSpec
from cluster.sweep.expand import tasks
from cluster.sweep.resume import RESULTS_TSV
from cluster.sweep.spec import SweepSpec, load
from cluster.triggers.push import MAX_PUSH_BYTES, is_excluded
from cluster.wire.jobstart import JobStart

log = logging.getLogger("cluster.push")

#: The file of an archived run that says what the run was (its job.start and outcome).
RUN_INFO = "run.info"


@dataclass(frozen=True)
class SweepSubmission:
    """A checked sweep: its ``folder`` (the tree to push), the sweep file's name in it
    (``file``), the checked ``spec`` and the number of ``tasks``."""

    folder: Path
    file: str
    spec: SweepSpec
    tasks: int

    @property
    def words(self) -> list[str]:
        """The product and option words of its queue line: ``sweep sweep=<file>`` and the
        sweep file's ``[run]`` options (:mod:`cluster.sweep.runtable`)."""
        return [SWEEP, f"{SWEEP}={self.file}", *self.spec.run]

    def words_with(self, given: list[str]) -> list[str]:
        """:attr:`words` followed by the option words ``given`` on the command line or the
        jobdef line; a word of ``given`` replaces the ``[run]`` option of the same key (the
        submitter's word is the later, more specific one)."""
        keys = {word.partition("=")[0] for word in given}
        return [word for word in self.words if word.partition("=")[0] not in keys
                or word == SWEEP] + given


def prepare_sweep(path: Path) -> SweepSubmission:
    """Check the sweep file ``path`` and its sweep for submission (the module's
    docstring); SweepError naming the file and key when anything is wrong."""
    if not path.is_file():
        raise SweepError(str(path), "no such file: expected the sweep file (sweep.toml)")
    if not SWEEP_FILE.fullmatch(path.name):
        raise SweepError(str(path), f"the sweep file's name {path.name!r} cannot be queued: "
                         "expected letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit, at most 128 characters")
    spec = load(path)
    _travels(spec, path.name, "")
    if spec.table:
        _travels(spec, spec.table, "table")
    if spec.validate.script:
        _travels(spec, spec.validate.script, "validate.script")
    if spec.collect_script:
        _travels(spec, spec.collect_script, "collect_script")
    count = 0
    for _ in tasks(spec):
        count += 1
    return SweepSubmission(folder=spec.folder, file=path.name, spec=spec, tasks=count)


def _travels(spec: SweepSpec, relpath: str, key: str) -> None:
    """SweepError unless the file ``relpath`` of the sweep folder is pushed with it."""
    parts = relpath.split("/")
    for end in range(1, len(parts) + 1):
        entry = "/".join(parts[:end]) + ("/" if end < len(parts) else "")
        if is_excluded(entry):
            raise SweepError(spec.path.name, f"{relpath!r} would not travel with the sweep "
                             f"folder: a push leaves out {entry!r} (build folders, images, "
                             "version control: docs/sweeps.md); expected it under another "
                             "name", key)
    size = (spec.folder / relpath).stat().st_size
    if size > MAX_PUSH_BYTES:
        raise SweepError(spec.path.name, f"{relpath!r} has {size} bytes, more than a push "
                         f"sends ({MAX_PUSH_BYTES}); expected a smaller file", key)


def previous_sweep_run(home: Home, user: str, sweep_file: str) -> str:
    """The id of ``user``'s newest archived sweep run of the sweep file named
    ``sweep_file`` that has a ``results.tsv`` (the module's docstring); ClusterError naming
    the user, the sweep file and the archive when there is none."""
    folders = sorted(home.archive.iterdir(), key=lambda p: p.name, reverse=True) \
        if home.archive.is_dir() else []
    for folder in folders:  # bounded by the archive's folders
        if not (folder / RESULTS_TSV).is_file():
            continue  # a stat first: most archived runs are not this user's sweeps
        try:
            start = JobStart.parse((folder / RUN_INFO).read_text(encoding="utf-8"))
            queued = RunSpec.parse(start.queue, source=str(folder / RUN_INFO))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, QueueLineError) as exc:
            log.warning("%s: unreadable (%s); run not considered for resume",
                        folder / RUN_INFO, exc)
            continue
        if queued.kind == "user" and queued.ref == user and queued.sweep_file == sweep_file:
            return folder.name
    raise ClusterError(f"resume: user {user} has no earlier run of the sweep file "
                       f"{sweep_file} with a {RESULTS_TSV} in {home.archive}; expected one "
                       "to resume (submit without --resume to run every task)")
