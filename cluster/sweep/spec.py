"""The sweep file: a TOML file (read with :mod:`tomllib`) in the sweep folder, which also
holds the program, its data and the parameter table.  docs/sweeps.md documents every key
with an example; this module is its grammar.

:func:`load` reads and checks the whole file before anything else happens and returns a
:class:`SweepSpec`, or raises :class:`~cluster.errors.SweepError` naming the key and what
was expected.  An unknown key is an error (a misspelt ``retires`` must not silently mean
no retries).  The checks here are the ones that need no table: the placeholders of
``command``, ``[inputs]`` and ``[collect]`` are checked against the table's header by
:class:`cluster.sweep.expand.Expander`, before any row is read.

Every name that becomes a file -- an input, a result's file, a collect target, the table,
the check script, the collection script -- must be a relative path inside its folder
(:mod:`.names`); the table and the scripts must exist in the sweep folder, symbolic links resolved.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.errors import SweepError
from cluster.sweep.names import (
    check_inside,
    check_literal,
    check_relative_path,
    kind,
    toml_key,
)
from cluster.sweep.rules import CollectRule, ValidateRules
from cluster.sweep.runtable import run_words
from cluster.sweep.table import Axes, RowSource, TableFile

#: The largest sweep file read, in bytes.
MAX_FILE_BYTES = 1 << 20
#: The longest ``command`` pattern, in characters (an expanded command is bounded again,
#: by what Linux takes as one argument: :data:`cluster.sweep.expand.MAX_COMMAND_BYTES`).
MAX_COMMAND_CHARS = 64 * 1024
#: The longest ``[inputs]`` text pattern, in characters.
MAX_INPUT_CHARS = 1 << 20
#: The longest ``match`` regular expression, in characters.
MAX_PATTERN_CHARS = 4096
#: ``timeout`` when the file has none, and its largest value (seconds per task).
DEFAULT_TIMEOUT = 3600.0
MAX_TIMEOUT = 7 * 24 * 3600.0
#: ``retries`` when the file has none, and its largest value.
DEFAULT_RETRIES = 0
MAX_RETRIES = 10

#: The two result sources that are not files.
STDOUT = "stdout"
STDERR = "stderr"
#: A result's name: it is a file name under ``results/<task id>/`` and a word in
#: ``[validate]`` and ``[collect]``.
RESULT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")

#: The keys of the file, of ``[validate]`` and of a ``[collect]`` entry.
TOP_KEYS = ("command", "table", "axes", "timeout", "retries", "inputs", "results",
            "validate", "collect", "collect_script", "run")
VALIDATE_KEYS = ("exit_status", "nonempty", "match", "script")
COLLECT_KEYS = ("from",)


@dataclass(frozen=True)
class Input:
    """A file written into the task's folder before the command runs: ``name`` is its
    relative path there, ``text`` the pattern of its content (values inserted verbatim)."""

    name: str
    text: str


@dataclass(frozen=True)
class Result:
    """A result brought home: ``name`` (``results/<task id>/<name>`` on the master) taken
    from ``source``: :data:`STDOUT`, :data:`STDERR` or a relative path in the task's
    folder that the command leaves there."""

    name: str
    source: str

    @property
    def is_stream(self) -> bool:
        """Whether the result is the command's stdout or stderr, not a file."""
        return self.source in (STDOUT, STDERR)


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file.  ``folder`` is the sweep folder (the file's own); ``table``
    is the table's path relative to it ('' when the rows come from ``axes``);
    ``run`` holds the ``[run]`` table's per-run options as queue-line words, checked and
    sorted (:mod:`.runtable`; docs/runoptions.md); ``collect_script`` is the collection
    script's path relative to the folder ('' for none; :mod:`.collectscript`)."""

    path: Path
    folder: Path
    command: str
    table: str
    axes: Axes | None
    timeout: float
    retries: int
    inputs: tuple[Input, ...]
    results: tuple[Result, ...]
    validate: ValidateRules
    collect: tuple[CollectRule, ...]
    run: tuple[str, ...]
    collect_script: str = ""

    def rows(self) -> RowSource:
        """The sweep's rows: the table file (its header read now) or the axes."""
        if self.axes is not None:
            return self.axes
        return TableFile(self.folder / self.table, self.table)

    def result(self, name: str) -> Result:
        """The result called ``name`` (KeyError when there is none)."""
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)


def load(path: Path) -> SweepSpec:
    """Read and check the sweep file ``path`` (the module's docstring)."""
    where = path.name
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SweepError(str(path), f"cannot read the sweep file: {exc.strerror or exc}") \
            from exc
    if len(raw) > MAX_FILE_BYTES:
        raise SweepError(where, f"the sweep file is larger than {MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SweepError(where, f"not UTF-8 text (byte {exc.start + 1}): expected a TOML "
                         "file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SweepError(where, f"not valid TOML: {exc}") from exc
    return parse(data, path.resolve().parent, where, path)


def parse(data: Mapping[str, Any], folder: Path, where: str,
          path: Path | None = None) -> SweepSpec:
    """Check the sweep file's table ``data`` (as :mod:`tomllib` read it) for the sweep
    folder ``folder``; ``where`` names the file in messages."""
    _no_unknown_keys(data, TOP_KEYS, where, ())
    command = _command(data, where)
    table, axes = _rows(data, folder, where)
    results = _results(data, where)
    return SweepSpec(
        path=path if path is not None else folder / where,
        folder=folder,
        command=command,
        table=table,
        axes=axes,
        timeout=_timeout(data, where),
        retries=_retries(data, where),
        inputs=_inputs(data, where),
        results=results,
        validate=_validate(data, folder, where, results),
        collect=_collect(data, where, results),
        run=_run(data, where),
        collect_script=_collect_script(data, folder, where),
    )


def _no_unknown_keys(table: Mapping[str, Any], known: tuple[str, ...], where: str,
                     parent: tuple[str, ...]) -> None:
    for key in table:
        if key not in known:
            raise SweepError(where, f"unknown key: expected one of {', '.join(known)}",
                             toml_key(*parent, key))


def _subtable(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """The table ``key`` ({} when absent)."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise SweepError(where, f"got {kind(value)}, expected a table ([{key}])", key)
    return value


def _command(data: Mapping[str, Any], where: str) -> str:
    if "command" not in data:
        raise SweepError(where, "missing: expected the command pattern, e.g. "
                         "command = \"python3 model.py --alpha {alpha}\"", "command")
    command = data["command"]
    if not isinstance(command, str):
        raise SweepError(where, f"got {kind(command)}, expected a string", "command")
    if command.strip() == "":
        raise SweepError(where, "empty: expected a command pattern", "command")
    if "\0" in command:
        raise SweepError(where, "holds a NUL: no command can", "command")
    if len(command) > MAX_COMMAND_CHARS:
        raise SweepError(where, f"longer than {MAX_COMMAND_CHARS} characters", "command")
    return command


def _rows(data: Mapping[str, Any], folder: Path, where: str) -> tuple[str, Axes | None]:
    if ("table" in data) == ("axes" in data):
        raise SweepError(where, "expected exactly one of 'table' (a parameter table file) "
                         "and [axes] (name = [values], the cross product), got "
                         + ("both" if "table" in data else "neither"), "table")
    if "axes" in data:
        return "", Axes.from_toml(_subtable(data, "axes", where), where)
    table = data["table"]
    if not isinstance(table, str):
        raise SweepError(where, f"got {kind(table)}, expected the table file's path in "
                         "the sweep folder", "table")
    check_inside(folder, table, where, "table", "the table")
    return table, None


def _number(data: Mapping[str, Any], key: str, where: str) -> float | int | None:
    value = data.get(key)
    if value is None:
        return None
    # A bool is an int to Python, but `timeout = true` is a mistake, not 1 second.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SweepError(where, f"got {kind(value)}, expected a number", key)
    return value


def _timeout(data: Mapping[str, Any], where: str) -> float:
    value = _number(data, "timeout", where)
    if value is None:
        return DEFAULT_TIMEOUT
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
        raise SweepError(where, f"got {value!r}, expected seconds per task, more than 0 "
                         f"and at most {MAX_TIMEOUT:.0f} (7 days)", "timeout")
    return float(value)


def _retries(data: Mapping[str, Any], where: str) -> int:
    value = _number(data, "retries", where)
    if value is None:
        return DEFAULT_RETRIES
    if not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        raise SweepError(where, f"got {value!r}, expected a whole number from 0 to "
                         f"{MAX_RETRIES}", "retries")
    return value


def _inputs(data: Mapping[str, Any], where: str) -> tuple[Input, ...]:
    inputs: list[Input] = []
    for name, text in _subtable(data, "inputs", where).items():
        key = toml_key("inputs", name)
        check_relative_path(name, where, key, "the input name")
        check_literal(name, where, key, "the input name")
        if not isinstance(text, str):
            raise SweepError(where, f"got {kind(text)}, expected the file's text (a "
                             "string)", key)
        if len(text) > MAX_INPUT_CHARS:
            raise SweepError(where, f"the text is longer than {MAX_INPUT_CHARS} "
                             "characters", key)
        inputs.append(Input(name, text))
    _no_file_below_a_file([i.name for i in inputs], where, "inputs", "input")
    return tuple(inputs)


def _no_file_below_a_file(names: list[str], where: str, table: str, what: str) -> None:
    """Refuse ``a`` beside ``a/b``: one name cannot be both a file and a folder."""
    files = set(names)
    for name in names:
        parts = name.split("/")
        for end in range(1, len(parts)):
            parent = "/".join(parts[:end])
            if parent in files:
                raise SweepError(where, f"the {what} {name!r} needs {parent!r} to be a "
                                 f"folder, but {parent!r} is an {what} file too",
                                 toml_key(table, name))


def _results(data: Mapping[str, Any], where: str) -> tuple[Result, ...]:
    results: list[Result] = []
    for name, source in _subtable(data, "results", where).items():
        key = toml_key("results", name)
        check_relative_path(name, where, key, "the result name")
        if not RESULT_NAME.fullmatch(name):
            raise SweepError(where, f"the result name {name!r} is refused: expected a file "
                             "name of letters, digits, '_', '-' and '.', not starting with "
                             "'.' or '-', without '/', at most 64 characters", key)
        if not isinstance(source, str):
            raise SweepError(where, f"got {kind(source)}, expected \"stdout\", \"stderr\" "
                             "or a file the command leaves in its folder", key)
        if source not in (STDOUT, STDERR):
            check_relative_path(source, where, key, "the result file")
            check_literal(source, where, key, "the result file")
        results.append(Result(name, source))
    return tuple(results)


def _result_name(value: object, where: str, key: str,
                 results: tuple[Result, ...]) -> str:
    names = [r.name for r in results]
    if not isinstance(value, str):
        raise SweepError(where, f"got {kind(value)}, expected a result name", key)
    if value not in names:
        known = ", ".join(names) if names else "none: [results] is empty"
        raise SweepError(where, f"{value!r} is not a result: expected one of [results] "
                         f"({known})", key)
    return value


def _validate(data: Mapping[str, Any], folder: Path, where: str,
              results: tuple[Result, ...]) -> ValidateRules:
    table = _subtable(data, "validate", where)
    _no_unknown_keys(table, VALIDATE_KEYS, where, ("validate",))
    rules = ValidateRules()
    exit_status = rules.exit_status
    if "exit_status" in table:
        exit_status = _exit_statuses(table["exit_status"], where)
    nonempty = table.get("nonempty", [])
    if not isinstance(nonempty, list):
        raise SweepError(where, f"got {kind(nonempty)}, expected a list of result names",
                         "validate.nonempty")
    names = tuple(_result_name(v, where, "validate.nonempty", results) for v in nonempty)
    match = table.get("match", {})
    if not isinstance(match, dict):
        raise SweepError(where, f"got {kind(match)}, expected a table of result name = "
                         "regular expression", "validate.match")
    pairs = tuple((_result_name(name, where, toml_key("validate", "match", name), results),
                   _regex(pattern, where, toml_key("validate", "match", name)))
                  for name, pattern in match.items())
    script = table.get("script", "")
    if not isinstance(script, str):
        raise SweepError(where, f"got {kind(script)}, expected the check script's path in "
                         "the sweep folder", "validate.script")
    if "script" in table:
        check_inside(folder, script, where, "validate.script", "the check script")
    return ValidateRules(exit_status=exit_status, nonempty=names, match=pairs,
                         script=script)


def _exit_statuses(value: object, where: str) -> tuple[int, ...]:
    expected = "expected a list of at least one exit status, each a whole number 0..255"
    if not isinstance(value, list) or not value:
        raise SweepError(where, f"got {value!r}, {expected}", "validate.exit_status")
    for status in value:
        if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 255:
            raise SweepError(where, f"got {status!r}, {expected}", "validate.exit_status")
    return tuple(value)


def _regex(pattern: object, where: str, key: str) -> str:
    if not isinstance(pattern, str):
        raise SweepError(where, f"got {kind(pattern)}, expected a regular expression (a "
                         "string)", key)
    if len(pattern) > MAX_PATTERN_CHARS:
        raise SweepError(where, f"the regular expression is longer than "
                         f"{MAX_PATTERN_CHARS} characters", key)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise SweepError(where, f"not a regular expression ({exc}): expected Python's "
                         "re syntax", key) from exc
    return pattern


def _collect(data: Mapping[str, Any], where: str,
             results: tuple[Result, ...]) -> tuple[CollectRule, ...]:
    rules: list[CollectRule] = []
    for target, entry in _subtable(data, "collect", where).items():
        key = toml_key("collect", target)
        check_relative_path(target, where, key, "the collect target")
        if not isinstance(entry, dict):
            raise SweepError(where, f"got {kind(entry)}, expected {{ from = \"<result "
                             "name>\" }", key)
        _no_unknown_keys(entry, COLLECT_KEYS, where, ("collect", target))
        if "from" not in entry:
            raise SweepError(where, "missing: expected the result to collect",
                             toml_key("collect", target, "from"))
        source = _result_name(entry["from"], where, toml_key("collect", target, "from"),
                              results)
        rules.append(CollectRule(target=target, source=source))
    return tuple(rules)


def _collect_script(data: Mapping[str, Any], folder: Path, where: str) -> str:
    if "collect_script" not in data:
        return ""
    script = data["collect_script"]
    if not isinstance(script, str):
        raise SweepError(where, f"got {kind(script)}, expected the collection script's "
                         "path in the sweep folder", "collect_script")
    check_inside(folder, script, where, "collect_script", "the collection script")
    return script


def _run(data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    return run_words(_subtable(data, "run", where), where)
