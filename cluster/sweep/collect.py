"""The collected files of a sweep: the ``[collect]`` rules applied to the valid results.

:func:`collect` takes the valid tasks in task order, as ``(task number, row, result
folder)`` (the row maps the table's column names to the task's values; the folder holds one
file per result name), and the :class:`~cluster.sweep.rules.CollectRule` list, and makes
each rule's files under ``collected_dir`` (``archive/<run>/collected/``):

* **plain**: a target without ``{column}`` placeholders is one file, the concatenation of
  the ``source`` result of every task, in task order.  It is made even when no task is
  valid (then empty): a report can tell "nothing valid" from "not collected".
* **blockwise**: a target naming columns (``by-alpha/{alpha}.txt``, ``{n}/{alpha}.dat``) is
  one file per distinct value (combination) of those columns, each the concatenation of
  its tasks' results in task order.  Only the row's column names are replaced; any other
  ``{...}`` stays as written (the sweep file's parser refuses unknown names at submission).

Streaming: results are copied a megabyte at a time (never read whole), each task appended
to its file as it comes, so memory does not grow with the results' size; the tasks are read
once, so they may come from a generator.

Hostile values: a value is put into a path with ``%`` written ``%25``, ``/`` written
``%2F`` and NUL written ``%00`` (so distinct values name distinct files and a value never
adds a folder level); a path component that is then empty, ``.`` or ``..`` (a value ``..``
filling a whole component) or longer than :data:`MAX_NAME_BYTES` is refused.  A refused
target is not made at all (none of its files appear) and its :class:`Collected` says why;
the other targets are still made.

Bound: one target makes at most :data:`MAX_FILES_PER_TARGET` files; the value that would
make one more refuses the target ("more than 10000 files ...: collect by a column with fewer
values").  This bounds the open bookkeeping (one entry per file) and the folder's size
whatever the table holds (a column of a million distinct seeds).

Atomic: every file is built in a staging folder inside ``collected_dir``
(``.collecting.<pid>.<random>``) and renamed into place only when all tasks are read, so a
reader never sees a part of a collected file, and a collection that fails (an exception, a
task out of order) leaves no collected file and no staging folder.  A collection killed
outright leaves its staging folder; the next collection into the same folder removes those
whose process is gone.  Files are not fsync'ed: they can be made again from ``results/``.
``collected_dir`` is meant to be fresh (a run's own): files of an earlier collection there
are replaced when a target makes them again and otherwise left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.runtime.fsutil import NEW_FILE_MODE, writer_alive
from cluster.sweep.names import PLACEHOLDER
from cluster.sweep.rules import CollectRule

#: At most this many files per blockwise target (see the module docstring).
MAX_FILES_PER_TARGET = 10_000
#: The longest path component a collected file may have [bytes of UTF-8]: Linux's NAME_MAX.
MAX_NAME_BYTES = 255
#: The staging folders' names: ``.collecting.<pid>.<random>``.
STAGING_PREFIX = ".collecting."
_STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + r"(?P<pid>[1-9][0-9]{0,9})\..+")
_COPY_CHUNK = 1 << 20

#: One valid task: its number (1-based), its row (column name -> value), its result folder.
Task = tuple[int, Mapping[str, object], Path]


@dataclass(frozen=True)
class Collected:
    """What became of one collect rule.

    ``files``: the paths made, relative to ``collected_dir``, in the order their first task
    came (empty when refused); ``tasks``: how many valid tasks contributed; ``missing``: how
    many valid tasks had no ``source`` result (they contribute nothing); ``error``: why the
    target was refused, '' when it was made.
    """

    target: str
    source: str
    files: tuple[str, ...] = ()
    tasks: int = 0
    missing: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass
class _Target:
    """One rule's progress: final path -> staged file, counts, and the refusal if any."""

    rule: CollectRule
    columns: tuple[str, ...]
    staged: dict[str, Path] = field(default_factory=dict)
    tasks: int = 0
    missing: int = 0
    error: str = ""


def encode_value(value: object) -> str:
    """A column value as it goes into a collected file's path: ``%`` -> ``%25``, ``/`` ->
    ``%2F``, NUL -> ``%00``; everything else as it is (``str(value)``)."""
    return (str(value).replace("%", "%25").replace("/", "%2F").replace("\0", "%00"))


def target_columns(target: str) -> tuple[str, ...]:
    """The names in ``{...}`` in ``target``, in order of first appearance.  Which of them
    are columns is known only from the rows: :func:`collect` replaces those the row has."""
    names: list[str] = []
    for name in PLACEHOLDER.findall(target):
        if name not in names:
            names.append(name)
    return tuple(names)


def check_target(target: str) -> None:
    """Raise ValueError unless ``target`` is a relative path without empty, ``.`` or ``..``
    components or NUL (a caller's bug: the sweep file's parser refuses these)."""
    parts = target.split("/")
    if (not target or target.startswith("/") or "\0" in target
            or any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"[collect] target {target!r}: expected a relative path of plain "
                         "names (no leading '/', no empty, '.' or '..' component, no NUL)")


def substitute(target: str, row: Mapping[str, object]) -> str:
    """``target`` with each ``{column}`` the row has replaced by its :func:`encode_value`."""
    return PLACEHOLDER.sub(
        lambda m: encode_value(row[m.group(1)]) if m.group(1) in row else m.group(0), target)


def refusal(path: str, target: str, task: int, row: Mapping[str, object]) -> str:
    """Why the substituted ``path`` may not be made ('' when it may): a component that is
    empty, ``.``, ``..`` or longer than :data:`MAX_NAME_BYTES`, named with the values that
    made it."""
    for part in path.split("/"):
        if part in ("", ".", ".."):
            problem = f"a path component {part!r} (it could leave collected/)"
        elif len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            problem = f"a path component longer than {MAX_NAME_BYTES} bytes"
        else:
            continue
        values = ", ".join(f"{c}={row[c]!r}" for c in target_columns(target) if c in row)
        return f"task {task} ({values}) would make {path!r}, with {problem}"
    return ""


def collect(tasks: Iterable[Task], rules: Sequence[CollectRule],
            collected_dir: Path) -> list[Collected]:
    """Make every rule's collected files under ``collected_dir``; see the module docstring.

    ``tasks`` must come in increasing task number (ValueError otherwise, nothing made).
    Returns one :class:`Collected` per rule, in the rules' order.  Raises ValueError for a
    target or source name that is not a plain relative path (a caller's bug) before reading
    any task.
    """
    for rule in rules:
        check_target(rule.target)
        if not rule.source or "/" in rule.source or rule.source in (".", ".."):
            raise ValueError(f"[collect] {rule.target!r}: source {rule.source!r} is not a "
                             "result name")
    collected_dir.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(collected_dir)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}.",
                                    dir=collected_dir))
    try:
        targets = [_Target(rule, target_columns(rule.target)) for rule in rules]
        for target in targets:
            if not target.columns:  # plain: exists even when no task is valid
                target.staged[target.rule.target] = _new_staged(staging)
        last = 0
        for number, row, folder in tasks:
            if number <= last:
                raise ValueError(f"collect: task {number} came after task {last}; expected "
                                 "the valid tasks in increasing task number")
            last = number
            for target in targets:
                if not target.error:
                    _add(target, number, row, folder, staging)
        _refuse_clashes(targets)
        return [_publish(target, collected_dir) for target in targets]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _new_staged(staging: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=staging)
    os.close(fd)
    return Path(name)


def _add(target: _Target, number: int, row: Mapping[str, object], folder: Path,
         staging: Path) -> None:
    """Append task ``number``'s source result to its file of ``target``."""
    rule = target.rule
    path = substitute(rule.target, row) if target.columns else rule.target
    staged = target.staged.get(path)
    if staged is None:
        why = refusal(path, rule.target, number, row)
        if not why and len(target.staged) >= MAX_FILES_PER_TARGET:
            why = (f"more than {MAX_FILES_PER_TARGET} files (one per value of "
                   f"{', '.join(target.columns)}; task {number} would make another): "
                   "collect by a column with fewer values")
        if why:
            target.error = why
            return
        staged = target.staged[path] = _new_staged(staging)
    source = folder / rule.source
    try:
        src = source.open("rb")
    except FileNotFoundError:
        target.missing += 1
        return
    with src, staged.open("ab") as dst:
        shutil.copyfileobj(src, dst, _COPY_CHUNK)
    target.tasks += 1


def _refuse_clashes(targets: list[_Target]) -> None:
    """Refuse a target that makes a path another target also makes, or a file where another
    needs a folder (``a.txt`` and ``a.txt/b``): the later rule gives way.  Sharing a folder
    (``by-alpha/{alpha}.txt`` and ``by-alpha/all.txt``) is fine."""
    files: dict[str, int] = {}
    folders: dict[str, int] = {}
    for index, target in enumerate(targets):
        if target.error:
            continue
        for path in target.staged:
            if path in files:
                other: int | None = files[path]
            elif path in folders:
                other = folders[path]
            else:
                other = next((files[f] for f in _folders(path) if f in files), None)
            if other is not None:
                target.error = (f"it would make {path}, which clashes with what "
                                f"{targets[other].rule.target} makes")
                break
        if target.error:
            continue
        for path in target.staged:
            files[path] = index
            for folder in _folders(path):
                folders.setdefault(folder, index)


def _folders(path: str) -> list[str]:
    """The folders ``path`` lies in, outermost first: ``a/b/c`` -> ``a``, ``a/b``."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _publish(target: _Target, collected_dir: Path) -> Collected:
    rule = target.rule
    if target.error:
        return Collected(rule.target, rule.source, (), target.tasks, target.missing,
                         target.error)
    made: list[str] = []
    for path, staged in target.staged.items():
        final = collected_dir / path
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(staged, NEW_FILE_MODE)  # mkstemp made it 0600; others read reports
            os.replace(staged, final)
        except OSError as exc:
            # Something already in collected_dir is in the way (a folder where a file goes):
            # the files already moved stay, and are listed with the error.
            return Collected(rule.target, rule.source, tuple(made), target.tasks,
                             target.missing, f"cannot make {path}: {exc.strerror or exc}")
        made.append(path)
    return Collected(rule.target, rule.source, tuple(made), target.tasks, target.missing)


def _remove_dead_staging(collected_dir: Path) -> None:
    """Remove the staging folders of collections whose process is gone (killed outright)."""
    with contextlib.suppress(OSError), os.scandir(collected_dir) as entries:
        for entry in entries:
            match = _STAGING_NAME.fullmatch(entry.name)
            if (match and entry.is_dir(follow_symlinks=False)
                    and not writer_alive(int(match["pid"]))):
                shutil.rmtree(entry.path, ignore_errors=True)
