"""The demo product trees a local cluster builds (localcluster.py's default source).

:func:`write_demo_tree` makes a tree whose ``make`` writes ``bin/gs`` (or ``bin/mutool``),
a wrapper around the installed program that adds the options listed in ``./options``; a
shell run's tree only has a Makefile that does nothing (it runs the corpus's commands).
"""

from __future__ import annotations

from pathlib import Path

MAKEFILE = """\
# Demo product tree made by localcluster.py: `make` writes bin/<program>, a wrapper around
# the installed program that adds the options listed in ./options.
all:
\tsh ./make_wrapper.sh
"""


WRAPPER_SCRIPT = {
    "gs": """\
set -e
real=$(command -v gs)
mkdir -p bin
opts=$(cat options 2>/dev/null | tr '\\n' ' ')
printf '#!/bin/sh\\nexec %s %s "$@"\\n' "$real" "$opts" > bin/gs
chmod +x bin/gs
""",
    "mutool": """\
set -e
real=$(command -v mutool)
mkdir -p bin
opts=$(cat options 2>/dev/null | tr '\\n' ' ')
printf '#!/bin/sh\\nsub=$1; shift\\nexec %s "$sub" %s "$@"\\n' "$real" "$opts" > bin/mutool
chmod +x bin/mutool
""",
}


def write_demo_tree(dest: Path, product: str, options: list[str]) -> Path:
    """Write the demo product tree for ``product`` into ``dest`` and return it.

    Product shell runs the corpus's own commands: its tree only has a Makefile that does
    nothing.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if product == "shell":
        (dest / "Makefile").write_text("all:\n\t@true\n", encoding="utf-8")
        return dest
    program = "mutool" if product == "mupdf" else "gs"
    (dest / "Makefile").write_text(MAKEFILE, encoding="utf-8")
    (dest / "make_wrapper.sh").write_text(WRAPPER_SCRIPT[program], encoding="utf-8")
    (dest / "options").write_text("".join(o + "\n" for o in options), encoding="utf-8")
    return dest
