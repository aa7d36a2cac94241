"""The names in a sweep file, checked before anything is written: relative paths that must
stay inside their folder, and how keys and values are named in messages.

Every file name a sweep gives -- an input written into a task's folder, a result file the
command leaves there, a collected file under ``collected/``, the table and the check script
in the sweep folder -- is a *relative path*: components separated by ``/``, none of them
empty, ``.`` or ``..``, no leading ``/``, no NUL, backslash or other control character, at
most :data:`MAX_COMPONENT_CHARS` characters a component and :data:`MAX_PATH_CHARS` in
all.  Such a path, joined to any folder, names something inside that folder (symbolic
links aside: :func:`check_inside` resolves them for the files that already exist).
A backslash is refused although POSIX allows it: on a node's or a reader's Windows share
it is a separator, and no sweep needs one.
"""

from __future__ import annotations

import re
from pathlib import Path

from cluster.errors import SweepError

#: The longest component of a relative path (a file name).
MAX_COMPONENT_CHARS = 255
#: The longest relative path.
MAX_PATH_CHARS = 1024

#: A placeholder in a pattern: a name, ``#`` or ``%`` in braces, not after ``$`` (so the
#: shell's ``${HOME}`` and ``${#}`` stay shell code); :mod:`.expand` says what each means.
PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*|#|%)\}")

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def toml_key(*parts: str) -> str:
    """A key as TOML writes it, dotted, a part quoted when it is not a bare key:
    ``toml_key("results", "../x")`` is ``results."../x"``."""
    return ".".join(part if _BARE_KEY.fullmatch(part) else _quoted(part) for part in parts)


def _quoted(part: str) -> str:
    escaped = part.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


def kind(value: object) -> str:
    """How a TOML value's type is named in messages (``a string``, ``a table``)."""
    kinds = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
             list: "a list", dict: "a table"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def path_problem(path: str) -> str:
    """What is wrong with ``path`` as a relative path (the module's docstring), or ''."""
    if path == "":
        return "it is empty"
    if "\0" in path:
        return "it holds a NUL"
    if "\\" in path:
        return "it holds a backslash"
    if _CONTROL.search(path):
        return "it holds a control character"
    if path.startswith("/"):
        return "it is an absolute path"
    if len(path) > MAX_PATH_CHARS:
        return f"it is longer than {MAX_PATH_CHARS} characters"
    for component in path.split("/"):
        if component == "":
            return "it has an empty component ('//' or a '/' at its end)"
        if component in (".", ".."):
            return f"it has a {component!r} component"
        if len(component) > MAX_COMPONENT_CHARS:
            return f"a component is longer than {MAX_COMPONENT_CHARS} characters"
    return ""


def check_relative_path(path: str, where: str, key: str, what: str) -> None:
    """Raise :class:`SweepError` naming ``what`` (``the input name``) and ``path`` unless
    it is a relative path that stays inside its folder."""
    problem = path_problem(path)
    if problem:
        raise SweepError(where, f"{what} {path!r} is refused: {problem}; expected a relative "
                         "path of '/'-separated names inside the folder (no '..', no "
                         "absolute path, no NUL, backslash or empty component)", key)


def check_literal(name: str, where: str, key: str, what: str) -> None:
    """Raise :class:`SweepError` when ``name`` (an input's or a result file's name) holds a
    placeholder: those names are literal, since every task has a folder of its own."""
    found = PLACEHOLDER.search(name)
    if found:
        raise SweepError(where, f"{what} {name!r} holds the placeholder {found.group(0)}: "
                         "expected a literal name (each task has a folder of its own, so "
                         "names need not differ between tasks)", key)


def check_inside(folder: Path, path: str, where: str, key: str, what: str) -> Path:
    """``folder/path`` for an existing regular file that is inside ``folder`` once symbolic
    links are resolved; otherwise :class:`SweepError` naming ``what`` and ``path``."""
    check_relative_path(path, where, key, what)
    target = folder / path
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise SweepError(where, f"{what} {path!r} is not there: expected a file in the "
                         f"sweep folder {str(folder)!r}", key) from exc
    if not real.is_relative_to(folder.resolve()):
        raise SweepError(where, f"{what} {path!r} leads outside the sweep folder (to "
                         f"{str(real)!r}): expected a file inside it", key)
    if not real.is_file():
        raise SweepError(where, f"{what} {path!r} is not a regular file: expected a file "
                         "in the sweep folder", key)
    return target
