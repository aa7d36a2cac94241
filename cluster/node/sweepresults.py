"""A node's part in a sweep run's tasks: their folders made, their results taken, bounded,
kept until sent, and bundled.

A sweep task's job line (:mod:`cluster.jobs.sweepjobs`) only writes the task's inputs and
runs its command; the node does the rest in its own process, where a step costs a system
call instead of a program started (bench/sweep.py: 5,000 tiny tasks):

* before the job is sent to a slot, :func:`prepare_task` makes the task's folder
  ``<temp>/<task id>/`` afresh (what an earlier try on this node left is removed first)
  holding each top-level entry of the sweep folder (dot files included; :func:`entries`):
  a regular file as a hard link (a directory entry, no new inode: a tenth of the cost of
  a symbolic link on the file systems measured), anything else, or a file on another
  file system, as a symbolic link.  So ``python3 model.py`` works there as in the sweep
  folder;
* when the job has ended the node hands the task to its :class:`Outbox`
  (:meth:`Outbox.take`), which moves each ``[results]`` entry (job.start's
  ``sweep_results``) into the outbox (``<run dir>/sweep-results/<n>.<result name>``):
  ``stdout`` is ``<temp>/<task id>.out``, ``stderr`` is ``<temp>/<task id>.err`` (the job
  line writes those two only when they are results, :mod:`cluster.jobs.sweepjobs`), a
  file is the task folder's file only when every folder on its way is a folder and it is
  a regular file with no other link to it (a symbolic link could point anywhere, a hard
  link could be another file of the machine's, or the sweep folder's own); a result that
  is not there is missing.  Then what is left of the task's folder is removed;
* it reads each result: its size and md5.  The results together over
  ``max_result_bytes``, or a command stopped by the file-size limit (exit status
  :data:`XFSZ_STATUS`, 128 + SIGXFSZ), fail the task with the reason
  ``results over max_result_bytes (<max_result_bytes> bytes)`` and its files are removed:
  nothing of it is kept;
* it keeps what the master needs of the task (:class:`TaskResults`): its start (epoch
  seconds, when the node's slot started the job), runtime, exit status, files ``{name:
  [size, md5]}`` and failure reason.

The task's result line carries :attr:`TaskResults.md5`: the md5 of the lines
``<result name> <md5 of the file>\\n`` in name order (:func:`result_md5`), so a change of
any result file changes it; ``0`` when the task failed.

Before a call that carries sweep results the node packs the unsent tasks of that call
into one *bundle* (:meth:`Outbox.pack`): a tar file (PAX format, uncompressed) whose first
member is :data:`TASKS_JSON`::

    {"node": <name>, "tasks": [{"task": <id>, "start": <epoch s>, "runtime": <s>,
      "exit": <exit status, null when the slot's shell died>,
      "files": {<result name>: [<size>, <md5>]}, "failed": <"" or the reason>}]}

followed by one member ``<task id>/<result name>`` per file.  Its name is
``<node>.<instance>.<n>.tar`` (:data:`cluster.wire.protocol.BUNDLE_NAME`), ``n`` counting
this node's bundles in the run (kept in the outbox, so a restarted node process never
reuses a name).  After the master's reply :meth:`Outbox.sent` removes the bundle and its
tasks' folders; after a failed call :meth:`Outbox.discard` removes only the bundle (the
tasks go again in the next one).  One call carries each task at most once and, after the
first task, no more than :data:`BUNDLE_BYTES` of files (:meth:`Outbox.batch`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.runtime import fsutil
from cluster.wire.jobstart import STREAM_SOURCES

#: The exit status of a command stopped by the file-size limit: 128 + SIGXFSZ (25).
XFSZ_STATUS = 153
#: The bundle's first member.
TASKS_JSON = "tasks.json"
#: The outbox's folder in the node's run folder.
OUTBOX_DIR = "sweep-results"
#: The file in the outbox holding the number of the next bundle.
NEXT_BUNDLE = "next-bundle"
#: Bytes of result files one bundle holds at most beyond its first task.
BUNDLE_BYTES = 256 << 20
#: What a task's job writes beside its folder: the command's stdout and stderr.
OUT_SUFFIX, ERR_SUFFIX = ".out", ".err"
#: How much of a file is read at a time.
_CHUNK = 1 << 20


def over_limit_reason(max_result_bytes: int) -> str:
    """The reason of a task whose results pass ``max_result_bytes``."""
    return f"results over max_result_bytes ({max_result_bytes} bytes)"


def result_md5(files: Mapping[str, tuple[int, str]]) -> str:
    """The md5 of a task's results: of the lines ``<name> <md5>\\n`` in name order."""
    lines = "".join(f"{name} {files[name][1]}\n" for name in sorted(files))
    return hashlib.md5(lines.encode("utf-8"), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class TaskResults:
    """One task's results as the node keeps them until they are sent: ``folder`` holds
    them, one file per result name (None when the task failed, or left none)."""

    task: str
    start: float
    runtime: float
    exit: int | None
    files: Mapping[str, tuple[int, str]]
    failed: str
    folder: Path | None

    @property
    def paths(self) -> dict[str, Path]:
        """Each kept file by result name."""
        folder = self.folder
        return {} if folder is None else {name: folder / name for name in self.files}

    @property
    def md5(self) -> str:
        """The md5 of the task's result line: :func:`result_md5`, ``0`` when failed."""
        return "0" if self.failed else result_md5(self.files)

    @property
    def size(self) -> int:
        """Bytes of its files together."""
        return sum(size for size, _ in self.files.values())

    def record(self) -> dict[str, object]:
        """The task's entry of :data:`TASKS_JSON`."""
        return {"task": self.task, "start": round(self.start, 3),
                "runtime": round(self.runtime, 3), "exit": self.exit,
                "files": {name: [size, md5] for name, (size, md5) in
                          sorted(self.files.items())},
                "failed": self.failed}


@dataclass(frozen=True)
class Bundle:
    """A packed bundle: its ``path`` (named ``name``) and the tasks it holds; a tar file,
    or with ``folder`` a folder (:meth:`Outbox.pack_folder`)."""

    path: Path
    name: str
    tasks: tuple[TaskResults, ...]
    folder: bool = False


def remove(path: Path) -> None:
    """Remove the file, link or folder ``path`` (nothing when it is not there)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def entries(tree: Path) -> list[tuple[Path, bool]]:
    """The sweep folder ``tree``'s top-level entries (dot files included), each with
    whether it is a regular file (linked hard into a task's folder) or not (linked
    symbolically)."""
    found: list[tuple[Path, bool]] = []
    with os.scandir(tree) as listing:
        for entry in listing:
            found.append((Path(entry.path), entry.is_file(follow_symlinks=False)))
    return sorted(found)


def make_read_only(tree: Path) -> None:
    """Clear the write bits of every regular file under the sweep folder ``tree``: the
    tasks get its files as hard links, which share a file's mode, so a command run as any
    user but root cannot change the sweep folder for the tasks after it (root is bound by
    no mode bits: a node with ``job_user`` runs jobs as an unprivileged user).  The node's
    next update of its build folder replaces files by renaming, which the folders' own modes
    allow."""
    for dirpath, _dirs, files in os.walk(tree):  # bounded by the tree
        for name in files:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_mode & 0o222:
                os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o222)


def prepare_task(folder: Path, sweep_entries: Sequence[tuple[Path, bool]]) -> None:
    """Make the task folder ``folder`` afresh, holding each of the sweep folder's
    ``sweep_entries`` (:func:`entries`) by its name: a regular file hard-linked, anything
    else -- and a file a hard link cannot reach, on another file system -- as a
    symbolic link.  What an earlier try left there, and beside it in ``.out`` and
    ``.err``, is removed first."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        clear_task(folder)
        os.mkdir(folder)
    else:
        for suffix in (OUT_SUFFIX, ERR_SUFFIX):
            _unlink(Path(f"{folder}{suffix}"))
    for entry, is_file in sweep_entries:
        target = folder / entry.name
        if is_file:
            try:
                os.link(entry, target, follow_symlinks=False)
                continue
            except OSError:
                pass  # another file system, or links refused: a symbolic link instead
        os.symlink(entry, target)


def clear_task(folder: Path) -> None:
    """Remove the task folder ``folder`` (its entries one by one: most are links) and its
    ``.out`` and ``.err``."""
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    _unlink(Path(entry.path))
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError:
        remove(folder)  # a folder the command made unreadable, or another oddity
    for suffix in (OUT_SUFFIX, ERR_SUFFIX):
        _unlink(Path(f"{folder}{suffix}"))


#: The prefix of a result's name while the task's folder is turned into its result folder.
_HIDDEN = ".result."


def _clear_but(folder: Path, keep: set[str]) -> None:
    """Remove everything in ``folder`` but the entries named in ``keep``."""
    with os.scandir(folder) as listing:
        for entry in listing:
            if entry.name in keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)


def _unlink(path: Path) -> None:
    """Remove the file or link ``path`` (nothing when it is not there)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def stage(folder: Path, results: Sequence[tuple[str, str]]) -> list[tuple[str, Path]]:
    """The (result name, file) of each of ``results`` that the task in ``folder`` left (the
    module docstring says which files count).  Every file is looked at before any is
    linked, so two results of one file are both found (the first link would otherwise
    look like another file's)."""
    found: list[tuple[str, Path]] = []
    for name, source in results:
        if source in STREAM_SOURCES:
            path = Path(f"{folder}{OUT_SUFFIX if source == STREAM_SOURCES[0] else ERR_SUFFIX}")
        else:
            path = folder / source
            if not _plain_folders(folder, source):
                continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            found.append((name, path))
    return found


def _plain_folders(folder: Path, source: str) -> bool:
    """Whether every folder on ``source``'s way in ``folder`` is a folder, no link."""
    path = folder
    for part in source.split("/")[:-1]:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def _read_file(folder: Path, name: str, budget: int) -> tuple[int, str] | None:
    """(size, md5) of the regular file ``name`` in ``folder``, read through a descriptor
    opened without following a link; None when it is no regular file.  Stops reading once
    more than ``budget`` bytes were read (the size returned then passes the budget)."""
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError:
        return None  # a link (ELOOP), gone, or unreadable
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as stream:
        digest = hashlib.md5(usedforsecurity=False)
        size = 0
        while size <= budget and (chunk := stream.read(_CHUNK)):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def read_files(paths: Mapping[str, Path], max_result_bytes: int
               ) -> tuple[dict[str, tuple[int, str]], int]:
    """``({name: (size, md5)}, bytes together)`` of the result files ``paths``, in name
    order; a file that is no longer a regular file is left out.  Reading stops once the
    files pass ``max_result_bytes`` together (the bytes returned then pass it too)."""
    files: dict[str, tuple[int, str]] = {}
    total = 0
    for name in sorted(paths):
        if total > max_result_bytes:
            break  # the task fails: the rest need not be read
        found = _read_file(paths[name].parent, paths[name].name, max_result_bytes - total)
        if found is not None:
            files[name] = found
            total += found[0]
    return files, total


class Outbox:
    """The unsent results of a sweep run's tasks on this node (see the module), kept in
    ``root``; bundles named after ``node`` and ``instance``; each task bounded by
    ``max_result_bytes``.  A new outbox removes what a former node process left in
    ``root`` (those results were never acknowledged as this process's: the master hands
    their tasks out again), but keeps counting its bundles."""

    def __init__(self, root: Path, node: str, instance: str, max_result_bytes: int) -> None:
        self.root = root
        self.node = node
        self.instance = instance
        self.max_result_bytes = max_result_bytes
        root.mkdir(parents=True, exist_ok=True)
        try:
            self.next_bundle = int((root / NEXT_BUNDLE).read_text(encoding="ascii"))
        except (FileNotFoundError, ValueError):
            self.next_bundle = 1
        for entry in root.iterdir():
            if entry.name != NEXT_BUNDLE:
                remove(entry)
        self.pending: list[TaskResults] = []
        self.taken = 0  # folders moved in so far: their names' counter

    def take(self, task: str, folder: Path, results: Sequence[tuple[str, str]],
             exit_status: int | None, start: float, runtime: float) -> TaskResults:
        """Take the results of ``task``, whose job ran in ``folder`` (module docstring):
        ``results`` are job.start's (result name, source) pairs; keep them as unsent and
        return them.

        The task's folder becomes the result folder in place: each result is renamed to
        a hidden name in it, everything else in it is removed, the results get their
        names, and the folder moves into the outbox -- renames and removals only, no file
        or folder made (making one costs as much as the rest together on the file systems
        measured)."""
        self.taken += 1
        kept = self.root / f"{self.taken}.{task}"
        names: list[str] = []
        try:
            moved: dict[Path, Path] = {}
            for name, path in stage(folder, results):
                hidden = folder / f"{_HIDDEN}{name}"
                first = moved.get(path)
                if first is None:
                    os.rename(path, hidden)
                    moved[path] = hidden
                else:
                    # Two results of one file: a copy, so each result is a file of its own
                    # (a folder bundle's files must have no other link: the master checks).
                    shutil.copyfile(first, hidden, follow_symlinks=False)
                names.append(name)
            _clear_but(folder, {f"{_HIDDEN}{name}" for name in names})
            for name in names:
                os.rename(folder / f"{_HIDDEN}{name}", folder / name)
            os.rename(folder, kept)
        except OSError:
            clear_task(folder)  # a command that fought back (a folder made unwritable)
            names = []
        for suffix in (OUT_SUFFIX, ERR_SUFFIX):
            _unlink(Path(f"{folder}{suffix}"))
        paths = {name: kept / name for name in names}
        files, total = read_files(paths, self.max_result_bytes)
        failed = ""
        if total > self.max_result_bytes or exit_status == XFSZ_STATUS:
            failed = over_limit_reason(self.max_result_bytes)
            files = {}
        for name in [n for n in paths if n not in files]:
            _unlink(paths[name])
        if not files:
            remove(kept)
        result = TaskResults(task=task, start=start, runtime=runtime, exit=exit_status,
                             files=files, failed=failed, folder=kept if files else None)
        self.pending.append(result)
        return result

    def discard_task(self, result: TaskResults) -> None:
        """Drop ``result`` unsent (its node may not report it) and remove its files."""
        self.pending.remove(result)
        if result.folder is not None:
            remove(result.folder)

    def batch(self, names: Sequence[str]) -> int:
        """How many of the unsent results ``names`` (the node's, oldest first) one call
        carries: up to the first name seen twice (a bundle holds a task once), and, after
        the first, while the bundle stays within :data:`BUNDLE_BYTES`."""
        seen: set[str] = set()
        total = 0
        sizes = {r.task: r.size for r in reversed(self.pending)}  # the oldest of each
        for count, name in enumerate(names):
            total += sizes.get(name, 0)
            if name in seen or (count and total > BUNDLE_BYTES):
                return count
            seen.add(name)
        return len(names)

    def pack(self, names: Sequence[str]) -> Bundle:
        """Pack the oldest unsent results of ``names`` (each once: :meth:`batch`) into a
        bundle file in the outbox.  OSError when it cannot be written (nothing is left)."""
        tasks = self._oldest(names)
        name = f"{self.node}.{self.instance}.{self._next_number()}.tar"
        path = self.root / name
        try:
            write_bundle(path, self.node, tasks)
        except BaseException:
            remove(path)
            raise
        return Bundle(path, name, tuple(tasks))

    def _oldest(self, names: Sequence[str]) -> tuple[TaskResults, ...]:
        """The oldest unsent results of ``names``, each once, in their order."""
        first: dict[str, TaskResults] = {}
        for result in self.pending:
            first.setdefault(result.task, result)
        return tuple(first[name] for name in dict.fromkeys(names) if name in first)

    def _next_number(self) -> int:
        """The next bundle's number, counted in the outbox (a restarted node process
        never reuses one)."""
        number = self.next_bundle
        self.next_bundle += 1
        fsutil.atomic_write(self.root / NEXT_BUNDLE, f"{self.next_bundle}\n", fsync=False)
        return number

    def pack_folder(self, names: Sequence[str]) -> Bundle:
        """Like :meth:`pack`, a folder instead of a tar file, for a transport that can
        move a folder into the master home (a shared file system): ``<bundle>.d/`` holds
        :data:`TASKS_JSON` and each task's result folder, moved in, as ``<task id>/``.
        :meth:`unpack_folder` moves them back when the folder cannot go."""
        tasks = self._oldest(names)
        number = self._next_number()
        name = f"{self.node}.{self.instance}.{number}.d"
        path = self.root / name
        os.mkdir(path)
        try:
            listing = json.dumps({"node": self.node, "tasks": [t.record() for t in tasks]},
                                 indent=1).encode("utf-8") + b"\n"
            fd = os.open(path / TASKS_JSON, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(listing)
            for task in tasks:
                if task.folder is not None:
                    os.rename(task.folder, path / task.task)
        except BaseException:
            self.unpack_folder(Bundle(path, name, tasks, folder=True))
            raise
        return Bundle(path, name, tasks, folder=True)

    def unpack_folder(self, bundle: Bundle) -> None:
        """Move the task folders of the folder ``bundle`` back to where the tasks keep
        them, and remove the bundle folder."""
        for task in bundle.tasks:
            if task.folder is not None:
                try:
                    os.rename(bundle.path / task.task, task.folder)
                except FileNotFoundError:
                    pass
        remove(bundle.path)

    def sent(self, bundle: Bundle) -> None:
        """The master has read the call carrying ``bundle``: its tasks and file go."""
        for result in bundle.tasks:
            self.discard_task(result)
        remove(bundle.path)

    def discard(self, bundle: Bundle) -> None:
        """The call carrying ``bundle`` failed: the file goes, its tasks stay unsent."""
        remove(bundle.path)


def write_bundle(path: Path, node: str, tasks: Sequence[TaskResults]) -> None:
    """Write the bundle of ``tasks`` to ``path`` (the module's docstring gives the
    format).  Each file is added with the size read when its task was taken: a file that
    has since grown is cut there, one that shrank is an OSError."""
    listing = json.dumps({"node": node, "tasks": [t.record() for t in tasks]},
                         indent=1).encode("utf-8") + b"\n"
    now = int(time.time())
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member(TASKS_JSON, len(listing), now), io.BytesIO(listing))
        for task in tasks:
            for name, (size, _md5) in sorted(task.files.items()):
                fd = os.open(task.paths[name], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as stream:
                    tar.addfile(_member(f"{task.task}/{name}", size, now), stream)


def _member(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    """A regular file's member: owned by nobody in particular, mode 0644."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = mtime
    info.mode = 0o644
    info.type = tarfile.REGTYPE
    return info
