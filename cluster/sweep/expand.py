"""A row of the table to a task: the command, the input files and the collect targets with
the row's values in, and the task's id.

**Placeholders.**  In a pattern, a placeholder is a name, ``#`` or ``%`` in braces, not
right after ``$`` (:data:`cluster.sweep.names.PLACEHOLDER`):

* ``{name}``, ``name`` one of the table's columns: the row's value.  In ``command`` it is
  shell-quoted (:func:`shlex.quote`: ``a b;rm x`` becomes ``'a b;rm x'``, one argument,
  and an empty value ``''``), so do not quote placeholders yourself; in ``[inputs]`` texts
  it is inserted verbatim; in ``[collect]`` targets it is encoded as the collection names
  its files (:func:`cluster.sweep.collect.encode_value`: ``%`` ``/`` and NUL as ``%25``
  ``%2F`` ``%00``), so a value never adds a folder level and ``collect_targets`` are the
  files the collection makes.
* ``{#}``: the task number, 1-based, the row's place in the table (``command`` and
  ``[inputs]``).
* ``{%}``: the slot the task runs in on its node, 1-based (``command`` only).  It is known
  only on the node, when the task starts, so it becomes ``${CLUSTER_SLOT}``
  (:data:`SLOT_TEXT`), which the shell running the command expands from the variable the
  node sets (:data:`SLOT_VARIABLE`).  A variable, not text the node replaces, so that no
  value of the table can ever be taken for the slot.
* Any other ``{name}`` is an error before any row is read, naming it: a misspelt column
  must not reach a thousand tasks as literal text.  ``[collect]`` targets take column
  names only (one file per value of those columns, "blockwise").
* Everything else in braces stays as it is: ``${HOME}``, ``${#}``, awk's
  ``{print $1}``, ``{a,b}``, JSON.  There is no escape: to write a literal ``{alpha}``
  where ``alpha`` is a column, write ``{alpha""}`` in the command (the shell drops the
  quotes), or use another spelling.

**Task ids.**  ``task_id`` is the first :data:`ID_HEX_DIGITS` hex digits of the SHA-256 of
these bytes, all text UTF-8::

    b"cluster-sweep-task 1\\n" + command + b"\\0" + (name + b"=" + value + b"\\0") per column

where ``command`` is the expanded command (``{%}`` already ``${CLUSTER_SLOT}``) and the
columns come in header order.  Names hold no ``=`` or NUL and values no NUL, so the bytes
are unambiguous; they depend on nothing but the sweep file and the row, so the id is stable
across runs, machines and Python versions.  Two rows that are equal give one id (the same
command on the same values is the same task); the ``[inputs]`` texts are not hashed, so
changing only them keeps the ids.

**Limits.**  An expanded command is at most :data:`MAX_COMMAND_BYTES` (Linux takes no
longer single argument, and the command is ``sh -c``'s); a task's input files at most
:data:`MAX_INPUT_BYTES` together; an expanded collect target must still be a relative path
inside ``collected/`` (a value ``..`` or an empty one filling a whole component, or one with
a backslash or a control character, is refused, naming the row).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from cluster.errors import SweepError
from cluster.sweep.collect import encode_value
from cluster.sweep.names import PLACEHOLDER, path_problem, toml_key
from cluster.sweep.spec import SweepSpec
from cluster.sweep.table import Row

#: The environment variable holding a task's slot number on its node (``{%}``).
SLOT_VARIABLE = "CLUSTER_SLOT"
#: What ``{%}`` becomes in a command.
SLOT_TEXT = "${" + SLOT_VARIABLE + "}"
#: The longest expanded command, in bytes: Linux's MAX_ARG_STRLEN (128 KiB) less its NUL.
MAX_COMMAND_BYTES = 128 * 1024 - 1
#: The most bytes a task's input files may hold together.
MAX_INPUT_BYTES = 4 << 20
#: How many hex digits of the SHA-256 make a task id (96 bits: among ten million tasks
#: the chance of two equal ids is below 1 in 10^15).
ID_HEX_DIGITS = 24
#: What the hashed bytes begin with (the format's version).
ID_PREFIX = b"cluster-sweep-task 1\n"

# A template part: literal text, or a column's index, or one of these.
_NUMBER = -1
_SLOT = -2
Part = str | int


@dataclass(frozen=True)
class Task:
    """One task: ``number`` (1-based, ``{#}``), ``task_id``, the expanded ``command`` (a
    string for ``sh -c``), its ``inputs`` as (file name, text) pairs in the sweep file's
    order, the ``row`` it came from, and ``collect_targets``: the file each of the sweep's
    ``[collect]`` rules puts this task's result into, in the sweep file's order."""

    number: int
    task_id: str
    command: str
    inputs: tuple[tuple[str, str], ...]
    row: Row
    collect_targets: tuple[str, ...]


def task_id(command: str, header: Sequence[str], values: Sequence[str]) -> str:
    """The task id of ``command`` on a row (the module's docstring gives the bytes).
    ValueError when a NUL in the command or a value, or an ``=`` in a name, would make the
    bytes ambiguous (the sweep file and the table refuse those before)."""
    if "\0" in command or any("\0" in v for v in values) \
            or any("=" in n or "\0" in n for n in header):
        raise ValueError("a task id needs a command and values without NUL and names "
                         "without '=' or NUL")
    digest = hashlib.sha256(ID_PREFIX)
    digest.update(command.encode("utf-8") + b"\0")
    for name, value in zip(header, values, strict=True):
        digest.update(name.encode("utf-8") + b"=" + value.encode("utf-8") + b"\0")
    return digest.hexdigest()[:ID_HEX_DIGITS]


# What shlex.quote leaves unquoted (its own test, which is private to it).
_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)


def _quoted_chars(value: str) -> int:
    """``len(shlex.quote(value))`` without making the quoted text."""
    if value == "":
        return 2
    if not _UNSAFE.search(value):
        return len(value)
    # '...' around it, and each ' inside becomes '"'"' (4 characters more).
    return len(value) + 2 + 4 * value.count("'")


@dataclass(frozen=True)
class _Template:
    """A pattern split once into literal text and placeholders."""

    parts: tuple[Part, ...]

    def chars(self, values: Sequence[str], number: int, quoted: bool) -> int:
        """The expanded length in characters (values shell-quoted when ``quoted``),
        computed without expanding: a huge value used many times is never built."""
        total = 0
        for part in self.parts:
            if isinstance(part, str):
                total += len(part)
            elif part >= 0:
                total += _quoted_chars(values[part]) if quoted else len(values[part])
            elif part == _NUMBER:
                total += len(str(number))
            else:
                total += len(SLOT_TEXT)
        return total

    def render(self, values: Sequence[str], number: int,
               quote: Callable[[str], str] | None) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif part >= 0:
                out.append(quote(values[part]) if quote else values[part])
            elif part == _NUMBER:
                out.append(str(number))
            else:
                out.append(SLOT_TEXT)
        return "".join(out)


def _compile(pattern: str, columns: dict[str, int], where: str, key: str,
             allowed: str) -> _Template:
    """Split ``pattern``; ``allowed`` holds ``#`` and/or ``%`` when those may be used."""
    parts: list[Part] = []
    end = 0
    for found in PLACEHOLDER.finditer(pattern):
        name = found.group(1)
        if name in ("#", "%"):
            if name not in allowed:
                raise SweepError(where, _not_here(found.group(0), key), key)
            index = _NUMBER if name == "#" else _SLOT
        elif name in columns:
            index = columns[name]
        else:
            known = ", ".join(columns)
            extra = "".join(f", {{{c}}}" for c in allowed)
            raise SweepError(where, f"unknown placeholder {found.group(0)}: expected one of "
                             f"the table's columns ({known}){extra}; other text in braces "
                             "is left alone only when it is not a name, or after '$' as in "
                             "${HOME}", key)
        if found.start() > end:
            parts.append(pattern[end:found.start()])
        parts.append(index)
        end = found.end()
    if end < len(pattern):
        parts.append(pattern[end:])
    return _Template(tuple(parts))


def _not_here(placeholder: str, key: str) -> str:
    if key.startswith("collect"):
        return (f"{placeholder} is not allowed in a collect target: expected column names "
                "only (one file per value of those columns)")
    return (f"{placeholder} (the slot) is known only when the command runs on its node: "
            f"use it in command, or ${{{SLOT_VARIABLE}}} in the command's shell code")


class Expander:
    """Makes tasks from rows of one sweep.

    Constructing it checks every pattern of the sweep -- ``command``, each ``[inputs]``
    text, each ``[collect]`` target -- against the table's ``header``, before any row is
    read: an unknown placeholder raises :class:`SweepError` naming it and its key.
    :meth:`task` then raises :class:`SweepError` naming the row only for what depends on
    its values (a command or inputs over their limits, a collect target leaving its folder).
    """

    def __init__(self, spec: SweepSpec, header: Sequence[str]) -> None:
        self.header = tuple(header)
        self.where = spec.path.name
        columns = {name: index for index, name in enumerate(self.header)}
        self._command = _compile(spec.command, columns, self.where, "command", "#%")
        self._inputs = tuple(
            (item.name, _compile(item.text, columns, self.where,
                                 toml_key("inputs", item.name), "#"))
            for item in spec.inputs)
        self._targets = tuple(
            (rule.target, _compile(rule.target, columns, self.where,
                                   toml_key("collect", rule.target), ""))
            for rule in spec.collect)

    def task(self, row: Row) -> Task:
        """The task of ``row`` (the module's docstring says how each part is made)."""
        values = row.values
        if len(values) != len(self.header):
            raise ValueError(f"{row.origin}: {len(values)} values for {len(self.header)} "
                             "columns")
        command = self._expand_command(row)
        inputs = self._expand_inputs(row)
        targets = []
        for pattern, template in self._targets:
            target = template.render(values, row.number, encode_value)
            problem = path_problem(target)
            if problem:
                raise SweepError(row.origin, f"the collect target {pattern!r} becomes "
                                 f"{target!r} for this row, which is refused: {problem}; "
                                 "expected a relative path inside collected/",
                                 toml_key("collect", pattern))
            targets.append(target)
        return Task(number=row.number, task_id=task_id(command, self.header, values),
                    command=command, inputs=inputs, row=row,
                    collect_targets=tuple(targets))

    def tasks(self, rows: Iterator[Row] | Sequence[Row]) -> Iterator[Task]:
        """The task of each row, as a stream."""
        for row in rows:
            yield self.task(row)

    def _expand_command(self, row: Row) -> str:
        too_long = (f"the command for this row is longer than {MAX_COMMAND_BYTES} bytes: "
                    "Linux takes no longer argument for sh -c")
        if self._command.chars(row.values, row.number, True) > MAX_COMMAND_BYTES:
            raise SweepError(row.origin, too_long, "command")
        command = self._command.render(row.values, row.number, shlex.quote)
        if len(command.encode("utf-8")) > MAX_COMMAND_BYTES:
            raise SweepError(row.origin, too_long, "command")
        return command

    def _expand_inputs(self, row: Row) -> tuple[tuple[str, str], ...]:
        too_large = (f"the input files for this row hold more than {MAX_INPUT_BYTES} bytes "
                     "together")
        if sum(t.chars(row.values, row.number, False)
               for _, t in self._inputs) > MAX_INPUT_BYTES:
            raise SweepError(row.origin, too_large, "inputs")
        inputs = tuple((name, template.render(row.values, row.number, None))
                       for name, template in self._inputs)
        if sum(len(text.encode("utf-8")) for _, text in inputs) > MAX_INPUT_BYTES:
            raise SweepError(row.origin, too_large, "inputs")
        return inputs


def tasks(spec: SweepSpec) -> Iterator[Task]:
    """Every task of ``spec``, streamed: the rows' source opened and every pattern checked
    against its header first (:class:`Expander`), then one task per row."""
    rows = spec.rows()
    expander = Expander(spec, rows.header)
    return expander.tasks(iter(rows))
