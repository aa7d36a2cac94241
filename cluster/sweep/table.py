"""A sweep's rows: a parameter table file, or the cross product of ``[axes]``.

Both sources give the same thing: a ``header`` (the column names, read before any row, so
every pattern can be checked against it first) and, each time they are iterated, a fresh
stream of :class:`Row` -- never a list, so a table of ten million rows costs the memory of
one line.

**The table file** (seed 002's "parameter file"):

* The first line is the header: the column names.  The separator is found there: the one
  of ``,`` (comma), TAB or ``|`` that it holds.  A header holding none of them is a table
  of one column (each line is one value, whole); a header holding two kinds is an error.
* A name is letters, digits and ``_``, not starting with a digit, at most
  :data:`MAX_NAME_CHARS` characters, so that ``{name}`` is a placeholder in the command
  (:mod:`.expand`); names are case-sensitive, and none may be empty or repeat.
* Every other line is one row, with exactly as many cells as the header (seed 002: "All
  lines have to have the same amount of cells like the headline!"); a ragged line is an
  error naming the file and the line number.  Blank lines are skipped (they are no
  parameter set; a file's trailing blank line is common), but they count for line numbers.
* Values are kept exactly as written: no spaces are stripped, nothing is unescaped except
  CSV quotes (below).  A value may not hold NUL (no program argument can), nor a carriage
  return or line feed (a task is one line of the table, and one line of ``results.tsv``).
* UTF-8 text; a byte-order mark before the header is dropped (spreadsheets write one).
  A line longer than :data:`MAX_LINE_BYTES`, or more than :data:`MAX_ROWS` rows, is an
  error: the reader's memory and a sweep's size stay bounded.

**Quoting.**  With ``,`` the lines are CSV (RFC 4180, Python's :mod:`csv` in strict mode):
a cell in double quotes may hold commas, and ``""`` inside it is one quote.  That is what
every spreadsheet writes for a comma-separated file, and a value with a comma (``1,2``, a
list of sizes) is common.  A quote inside an unquoted cell is an ordinary character.  A
quoted cell must end on its line (values cannot span lines, see above).  With TAB and
``|`` nothing is quoted: a quote is an ordinary character, as in seed 002's format and in
GNU parallel's ``--colsep``; those separators rarely occur in values, which is why one
picks them.

**Axes** (``[axes]`` in the sweep file: ``name = [values]``): the header is the axes'
names in the file's order, and the rows are every combination, the first axis varying
slowest (``alpha = [1, 2]``, ``n = [10, 100]`` gives ``1 10``, ``1 100``, ``2 10``,
``2 100``: the order of :func:`itertools.product` and of GNU parallel's ``::: 1 2 ::: 10
100``).  Values are TOML strings, integers, floats or booleans, written as text: an integer
in decimal, a float in Python's shortest round-trip form (``1e3`` becomes ``1000.0``;
write ``"1e3"`` to keep the text), a boolean as ``true``/``false``.  An axis must have at
least one value and no value twice (two equal rows would be the same task).
"""

from __future__ import annotations

import csv
import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cluster.errors import SweepError
from cluster.sweep.names import kind, toml_key

#: What a column name may be: usable as ``{name}`` in a pattern.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The longest column name.
MAX_NAME_CHARS = 64
#: The most columns (or axes) a sweep may have.
MAX_COLUMNS = 256
#: The longest line of a table file, in bytes (its line ending included).  Larger than
#: Linux's longest single argument (128 KiB), so any row a command could take fits.
MAX_LINE_BYTES = 1 << 20
#: The most rows (tasks) one sweep may have, from a table or from axes.
MAX_ROWS = 10_000_000
#: The separators a header may use, and how each is shown in messages.
SEPARATORS = {",": "','", "\t": "TAB", "|": "'|'"}

_BOM = "\ufeff"
_FORBIDDEN_IN_VALUES = {"\0": "NUL", "\r": "a carriage return", "\n": "a line feed"}


@dataclass(frozen=True)
class Row:
    """One parameter set: ``number`` is the task number (1-based, in the source's order;
    ``{#}``), ``values`` the cells in header order, ``origin`` where it came from for
    messages (``params.csv:17``, or the sweep file's ``[axes]``)."""

    number: int
    values: tuple[str, ...]
    origin: str


class RowSource(Protocol):
    """What a sweep takes its rows from: a header, and a fresh stream of rows per iteration."""

    @property
    def header(self) -> tuple[str, ...]: ...

    @property
    def where(self) -> str: ...

    def __iter__(self) -> Iterator[Row]: ...


def check_name(name: str, where: str, what: str, key: str = "") -> None:
    """Raise :class:`SweepError` unless ``name`` can be a column's name (see the module's
    docstring); ``what`` says which name it is in the message (``column 3``)."""
    if name == "":
        raise SweepError(where, f"{what} has an empty name: every column needs a name", key)
    if not NAME.fullmatch(name) or len(name) > MAX_NAME_CHARS:
        raise SweepError(where, f"{what} name {name!r} is not usable as a {{name}} "
                         f"placeholder: expected letters, digits and '_', not starting "
                         f"with a digit, at most {MAX_NAME_CHARS} characters", key)


def check_value(value: str, where: str, what: str, key: str = "") -> None:
    """Raise :class:`SweepError` when ``value`` holds a character no value may hold."""
    for char, shown in _FORBIDDEN_IN_VALUES.items():
        if char in value:
            raise SweepError(where, f"{what} {value!r} holds {shown}: a value is one line "
                             "of text without NUL", key)


def _check_header(names: Sequence[str], where: str) -> tuple[str, ...]:
    if len(names) > MAX_COLUMNS:
        raise SweepError(where, f"the header has {len(names)} columns: at most "
                         f"{MAX_COLUMNS} are allowed")
    seen: dict[str, int] = {}
    for index, name in enumerate(names, start=1):
        check_name(name, where, f"column {index}")
        if name in seen:
            raise SweepError(where, f"column {index} name {name!r} repeats column "
                             f"{seen[name]}: every column name must be different")
        seen[name] = index
    return tuple(names)


class TableFile:
    """A parameter table file (the module's docstring has the format).

    Constructing it reads only the header line (an error in it raises
    :class:`SweepError` at once); each iteration opens the file anew and streams its rows,
    raising :class:`SweepError` at the first bad line, naming ``where`` and its number.
    """

    def __init__(self, path: Path, where: str | None = None) -> None:
        self.path = path
        self.where = where if where is not None else str(path)
        try:
            with path.open("rb") as stream:
                first = stream.readline(MAX_LINE_BYTES + 1)
        except OSError as exc:
            raise SweepError(self.where, f"cannot read the table: {exc.strerror or exc}") \
                from exc
        if not first:
            raise SweepError(self.where, "the table is empty: expected a header line "
                             "naming the columns")
        line = self._text(first, 1)
        if line.startswith(_BOM):
            line = line[len(_BOM):]
        if line == "":
            raise SweepError(f"{self.where}:1", "the header line is empty: expected the "
                             "column names")
        kinds = [sep for sep in SEPARATORS if sep in line]
        if len(kinds) > 1:
            shown = " and ".join(SEPARATORS[sep] for sep in kinds)
            raise SweepError(f"{self.where}:1", f"the header mixes the separators {shown}: "
                             "expected exactly one of ',', TAB or '|' between the names")
        self.separator: str | None = kinds[0] if kinds else None
        self._header = _check_header(self._cells(line, 1), f"{self.where}:1")

    @property
    def header(self) -> tuple[str, ...]:
        """The column names, in file order."""
        return self._header

    def __iter__(self) -> Iterator[Row]:
        width = len(self._header)
        number = 0
        try:
            stream = self.path.open("rb")
        except OSError as exc:
            raise SweepError(self.where, f"cannot read the table: {exc.strerror or exc}") \
                from exc
        with stream:
            stream.readline(MAX_LINE_BYTES + 1)  # the header, checked by the constructor
            # Bounded: each turn reads a line; the file and MAX_ROWS end it.
            for lineno in itertools.count(2):
                raw = stream.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                line = self._text(raw, lineno)
                if line == "":
                    continue
                where = f"{self.where}:{lineno}"
                cells = self._cells(line, lineno)
                if len(cells) != width:
                    raise SweepError(where, f"the line has {len(cells)} cells, the header "
                                     f"has {width} ({self._separator_said()}): every line "
                                     "must have as many cells as the header")
                if "\0" in line or "\r" in line:  # rare: find the cell only then
                    for name, value in zip(self._header, cells, strict=True):
                        check_value(value, where, f"the value of {name!r}")
                number += 1
                if number > MAX_ROWS:
                    raise SweepError(where, f"the table has more than {MAX_ROWS} rows: at "
                                     f"most {MAX_ROWS} tasks are allowed in one sweep")
                yield Row(number, tuple(cells), where)

    def _separator_said(self) -> str:
        if self.separator is None:
            return "no separator: one column"
        return f"separator {SEPARATORS[self.separator]}"

    def _text(self, raw: bytes, lineno: int) -> str:
        """One line as text, without its line ending (``\\n`` or ``\\r\\n``)."""
        where = f"{self.where}:{lineno}"
        if len(raw) > MAX_LINE_BYTES:
            raise SweepError(where, f"the line is longer than {MAX_LINE_BYTES} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SweepError(where, f"the line is not UTF-8 text (byte {exc.start + 1}): "
                             "expected a UTF-8 table") from exc
        if text.endswith("\n"):
            text = text[:-1]
            if text.endswith("\r"):
                text = text[:-1]
        return text

    def _cells(self, line: str, lineno: int) -> list[str]:
        if self.separator is None:
            return [line]
        if self.separator != "," or '"' not in line:
            return line.split(self.separator)
        try:
            return next(csv.reader([line], strict=True))
        except csv.Error as exc:
            raise SweepError(f"{self.where}:{lineno}", f"bad CSV quoting ({exc}): a quoted "
                             "cell is \"...\" with \"\" for a quote inside, and ends on its "
                             "line") from exc


class Axes:
    """The cross product of named value lists (the module's docstring has the rules)."""

    def __init__(self, axes: Sequence[tuple[str, Sequence[str]]], where: str) -> None:
        self.where = where
        if not axes:
            raise SweepError(where, "[axes] has no axis: expected name = [values]", "axes")
        if len(axes) > MAX_COLUMNS:
            raise SweepError(where, f"[axes] has {len(axes)} axes: at most {MAX_COLUMNS} "
                             "are allowed", "axes")
        count = 1
        for name, values in axes:
            key = toml_key("axes", name)
            check_name(name, where, "the axis", key)
            if not values:
                raise SweepError(where, "the axis has no value: expected a list of at least "
                                 "one value", key)
            seen: set[str] = set()
            for value in values:
                check_value(value, where, "the value", key)
                if value in seen:
                    raise SweepError(where, f"the value {value!r} is there twice: two equal "
                                     "rows would be the same task", key)
                seen.add(value)
            count *= len(values)
        if count > MAX_ROWS:
            raise SweepError(where, f"the axes make {count} combinations: at most {MAX_ROWS}"
                             " tasks are allowed in one sweep", "axes")
        self._axes = tuple((name, tuple(values)) for name, values in axes)
        self._header = tuple(name for name, _ in self._axes)
        self.count = count

    @classmethod
    def from_toml(cls, table: Mapping[str, object], where: str) -> Axes:
        """The ``[axes]`` table as tomllib read it: each value must be a list of strings,
        integers, floats or booleans (converted to text as the module's docstring says)."""
        axes: list[tuple[str, list[str]]] = []
        for name, values in table.items():
            key = toml_key("axes", name)
            if not isinstance(values, list):
                raise SweepError(where, f"got {kind(values)}, expected a list of values "
                                 "(strings, integers, floats or booleans)", key)
            axes.append((name, [_value_text(value, where, key) for value in values]))
        return cls(axes, where)

    @property
    def header(self) -> tuple[str, ...]:
        """The axes' names, in the sweep file's order."""
        return self._header

    def __iter__(self) -> Iterator[Row]:
        combinations = itertools.product(*(values for _, values in self._axes))
        for number, values in enumerate(combinations, start=1):
            yield Row(number, values, f"{self.where} [axes]")


def _value_text(value: object, where: str, key: str) -> str:
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    raise SweepError(where, f"the value {value!r} is {kind(value)}: expected a string, "
                     "an integer, a float or a boolean", key)

