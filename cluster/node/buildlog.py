"""What a failed build's log says: the compiler's error lines, and whose fault the failure is.

Pure logic over the text of a build log (the build command's stdout and stderr, as the node
writes them into ``<node>.build.log``).  :func:`diagnose` finds the lines that say why a
build failed, in the log's order:

* a compiler's diagnostic on a file (gcc, clang): ``file.c:12:5: error: ...``,
  ``file.c:25:10: fatal error: jpegxr.h: No such file or directory``;
* the linker's: ``x.c:(.text+0x5): undefined reference to `foo'``, ``/usr/bin/ld: cannot
  find -lfoo: ...`` and any ``ld:`` line saying error; a tool's own error line
  (``collect2: error: ld returned 1 exit status``, ``gcc: error: ...``);
* make's: ``make[2]: *** [Makefile:123: obj/x.o] Error 1``, ``make: gcc: No such file or
  directory``; the shell's ``sh: 1: make: not found``; ``configure: error: ...``.

Each line is also sorted by whose fault it shows (:class:`Fault`).  The rule that decides
a failed build's failure code (nodebuild.build_failure) is :attr:`Diagnosis.local`:

* **the node's own** (``Fault.NODE``): a program looked up in ``PATH`` that could not be
  started (``sh: 1: gcc: not found``, ``make: gcc: No such file or directory``),
  ``configure: error: ...`` (configure only checks
  the machine it runs on), a system library the linker cannot find (``cannot find -lz``)
  and a missing header that the source includes as a system one (``#include <zlib.h>``,
  which gcc quotes under its ``fatal error`` line);
* **the tree's** (``Fault.SOURCE``): every other compiler diagnostic on a file (a syntax
  error, a header of the tree's own, ``#include "jpegxr.h"``, that is missing), an
  undefined reference, and a program named with a path (``make: ./obj/genarch: No such
  file or directory``: a tool of the tree's own that was not built);
* neither (``Fault.NONE``): make's ``***`` lines (``Error 127`` included: the line before
  it says which program could not be started) and the tools' own ``error:`` lines, which
  only follow one of the others.

The build is the node's fault only when at least one line is the node's and **none** is the
tree's: a compile error in the tree fails alike on every node, so it must end the run.  A
log with no recognised line is not the node's fault (the build command failed; nothing
shows the node is to blame).

Bounds: at most :data:`ERROR_LIMIT` error lines are quoted (the count of all is kept), each
cut to :data:`LINE_WIDTH` characters; with none recognised the quote is the log's last
:data:`TAIL_LINES` lines.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

#: Error lines quoted at most (the first ones: in a parallel build the first error is the
#: cause, later ones are often its consequences).
ERROR_LIMIT = 20
#: Characters of one quoted line at most (a gcc line may carry a whole macro expansion).
LINE_WIDTH = 240
#: Lines of the log's end quoted when no error line is recognised.
TAIL_LINES = 20
#: What ends a line cut to LINE_WIDTH.
CUT_MARK = " [...]"


class Fault(enum.Enum):
    """Whose fault an error line shows (see the module's docstring)."""

    SOURCE = "source"
    NODE = "node"
    NONE = "none"


# gcc/clang: "path:line: error: msg" or "path:line:col: fatal error: msg" (no space in path).
_COMPILER = re.compile(r"^(?P<file>[^\s:][^\s:]*):\d+:(?:\d+:)? (?:fatal )?error: (?P<msg>.*)$")
_MISSING_FILE = re.compile(r"^(?P<name>\S+): No such file or directory$")
_UNDEFINED = re.compile(r"undefined reference to ")
_LD = re.compile(r"^(?:\S*/)?(?:ld|ld\.\w+|collect2)(?:\.exe)?: ")
_LD_NO_LIBRARY = re.compile(r"^(?:\S*/)?ld(?:\.\w+)?: cannot find -l\S+")
_TOOL_ERROR = re.compile(r"^(?:\S*/)?[\w.+-]+: (?:fatal )?error: ")
_CONFIGURE = re.compile(r"^(?:\S*/)?configure: error: ")
_MAKE_STARS = re.compile(r"^(?:\S*/)?g?make(?:\[\d+\])?: \*\*\* (?P<rest>.*)$")
_MAKE_EXEC = re.compile(r"^(?:\S*/)?g?make(?:\[\d+\])?: (?P<prog>[^\s:]+): "
                        r"(?:No such file or directory|Command not found|Permission denied)$")
_SH_NOT_FOUND = re.compile(r"^(?:\S*/)?(?:ba|da)?sh: (?:(?:line )?\d+: )?(?P<prog>[^\s:]+): "
                           r"(?:command )?not found$")


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found in a build log.

    ``errors``: the first ERROR_LIMIT error lines, each cut to LINE_WIDTH; ``total``: how
    many error lines the log has; ``local``: the failure is the node's own (the rule in the
    module's docstring); ``tail``: the log's last TAIL_LINES lines (cut alike), quoted
    instead when ``errors`` is empty.
    """

    errors: tuple[str, ...]
    total: int
    local: bool
    tail: tuple[str, ...]
    #: The first line that decided ``local`` or the tree's fault ('' if none did).
    deciding: str = ""

    def summary(self) -> str:
        """One line for a failure reason: the deciding line, else the first error line,
        else the log's last non-empty line ('' for an empty log)."""
        if self.deciding:
            return self.deciding
        if self.errors:
            return self.errors[0]
        return next((line for line in reversed(self.tail) if line.strip()), "")

    def quote(self) -> list[str]:
        """The lines a report quotes: a title line, then the error lines or the tail."""
        if self.errors:
            shown = len(self.errors)
            more = f" (the first {shown} of {self.total})" if self.total > shown else ""
            return [f"error lines{more}:", *self.errors]
        return [f"no error line recognised; the last {len(self.tail)} lines:", *self.tail]


def cut(line: str, width: int = LINE_WIDTH) -> str:
    """``line`` without its line end, cut to ``width`` characters (CUT_MARK included)."""
    line = line.rstrip("\r\n")
    if len(line) <= width:
        return line
    return line[:max(width - len(CUT_MARK), 0)] + CUT_MARK


def classify(lines: list[str], index: int) -> Fault | None:
    """Whose fault line ``index`` of ``lines`` shows, or None when it is no error line.

    The lines after it are read only for a missing header: gcc quotes the ``#include``
    line under its ``fatal error``, and ``<name>`` there makes it a system header.
    """
    line = lines[index].rstrip("\r\n")
    compiler = _COMPILER.match(line)
    if compiler:
        missing = _MISSING_FILE.match(compiler.group("msg"))
        if missing and _includes_as_system(lines[index + 1:index + 3], missing.group("name")):
            return Fault.NODE
        return Fault.SOURCE
    if _UNDEFINED.search(line):
        return Fault.SOURCE
    if _LD_NO_LIBRARY.match(line) or _CONFIGURE.match(line):
        return Fault.NODE
    for pattern in (_SH_NOT_FOUND, _MAKE_EXEC):
        found = pattern.match(line)
        if found:
            # A program named with a path is the tree's (its own tool, not built); a bare
            # name is looked up in PATH: the machine lacks it.
            return Fault.SOURCE if "/" in found.group("prog") else Fault.NODE
    if _MAKE_STARS.match(line):
        # "Error 127" too: the shell's or make's line before it said which program.
        return Fault.NONE
    if _LD.match(line) and ("error" in line or "cannot" in line):
        return Fault.NONE
    if _TOOL_ERROR.match(line):
        return Fault.NONE
    return None


def _includes_as_system(following: list[str], header: str) -> bool:
    pattern = re.compile(r"#\s*include\s*<" + re.escape(header) + ">")
    return any(pattern.search(line) for line in following)


def diagnose(text: str) -> Diagnosis:
    """The error lines of build log ``text`` and whose fault they show (module docstring).

    Reads every line once; keeps at most ERROR_LIMIT + TAIL_LINES of them.
    """
    lines = text.splitlines()
    errors: list[str] = []
    total = 0
    first_source = first_node = ""
    for index in range(len(lines)):
        fault = classify(lines, index)
        if fault is None:
            continue
        total += 1
        line = cut(lines[index])
        if len(errors) < ERROR_LIMIT:
            errors.append(line)
        if fault is Fault.SOURCE and not first_source:
            first_source = line
        elif fault is Fault.NODE and not first_node:
            first_node = line
    local = bool(first_node) and not first_source
    tail = tuple(cut(line) for line in lines[-TAIL_LINES:])
    return Diagnosis(tuple(errors), total, local, tail,
                     deciding=first_node if local else first_source)
