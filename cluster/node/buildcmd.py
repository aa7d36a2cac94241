"""How a node builds a product tree: the tree's kind, its build command, where its binaries land.

A node looks at the top of the tree it fetched (:func:`tree_kind`):

* **ghostpdl** (``base/`` and ``psi/`` and ``configure.ac`` or ``autogen.sh``): job.start's
  ``build_ghostpdl`` (config ``build_ghostpdl``: configure when there is no Makefile yet,
  then ``make -j<slots>`` of the targets the run's products need); binaries in ``bin/``.
* **mupdf** (``source/fitz/`` and a ``Makefile``): job.start's ``build_mupdf`` (config
  ``build_mupdf``: ``make -j<slots> build=release tools``); binaries in ``build/release/``.
* **other** (the demo trees, anything else): job.start's ``build`` (config
  ``build_command``, unchanged); binaries in ``bin/``.

A job.start of an older master has no ``build_ghostpdl``/``build_mupdf`` line: every kind
then builds with ``build``.  The node replaces :data:`SLOTS` in the command with its slot
count; the master has already replaced :data:`TARGETS` (:func:`ghostpdl_targets`).

A tree overrides all of this with a file :data:`OVERRIDE_FILE` at its top: the node runs it
with ``sh`` in the tree (environment: ``CLUSTER_SLOTS``, ``CLUSTER_PRODUCTS`` as a comma
list), and takes the binaries from the folder a line ``# cluster-bin: <dir>`` names (relative
to the top), else from the kind's folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cluster.wire.jobstart import JobStart

GHOSTPDL, MUPDF, OTHER = "ghostpdl", "mupdf", "other"
#: Where each kind's build puts its binaries, relative to the tree's top.
BIN_DIRS = {GHOSTPDL: "bin", MUPDF: "build/release", OTHER: "bin"}
#: Placeholders of the configured build commands: the node's slot count (node side), the
#: make targets of the run's products (master side).
SLOTS, TARGETS = "__slots__", "__targets__"
#: The programs ghostpdl's Makefile has a target of the same name for.
GHOSTPDL_PROGRAMS = ("gs", "gpcl6", "gxps")
#: A tree's own build script, at its top.
OVERRIDE_FILE = "cluster-build"
#: Longest override script read (it is a shell script, not data).
OVERRIDE_LIMIT = 64 * 1024
_BIN_LINE = re.compile(r"^#\s*cluster-bin:\s*(\S+)\s*$", re.M)


@dataclass(frozen=True)
class BuildPlan:
    """What to run in a tree and where its binaries will be.

    ``command``: the shell command (run in the tree's top); ``bin_dir``: the binaries'
    folder relative to the top; ``origin``: where the command came from, for the build log
    (the job.start key or :data:`OVERRIDE_FILE`); ``env``: extra environment of the command.
    """

    kind: str
    command: str
    bin_dir: str
    origin: str
    env: tuple[tuple[str, str], ...] = ()


def tree_kind(tree: Path) -> str:
    """GHOSTPDL, MUPDF or OTHER, by the files at the top of ``tree`` (module docstring)."""
    if (tree / "base").is_dir() and (tree / "psi").is_dir() and (
            (tree / "configure.ac").is_file() or (tree / "autogen.sh").is_file()):
        return GHOSTPDL
    if (tree / "source" / "fitz").is_dir() and (tree / "Makefile").is_file():
        return MUPDF
    return OTHER


def ghostpdl_targets(programs: Iterable[str]) -> str:
    """The ghostpdl make targets (space separated, in GHOSTPDL_PROGRAMS order) among
    ``programs``, the programs a run's jobs call (``required_programs``)."""
    wanted = set(programs)
    return " ".join(p for p in GHOSTPDL_PROGRAMS if p in wanted)


def plan(tree: Path, start: JobStart, slots: int) -> BuildPlan:
    """The build of ``tree`` (fetched for the run ``start``) on a node of ``slots`` slots.

    ValueError naming the file when the tree's :data:`OVERRIDE_FILE` is unreadable, too
    long, or names a binaries folder that is absolute or leaves the tree.
    """
    kind = tree_kind(tree)
    override = tree / OVERRIDE_FILE
    if override.is_file():
        return _override_plan(override, kind, start, slots)
    key, command = {GHOSTPDL: ("build_ghostpdl", start.build_ghostpdl),
                    MUPDF: ("build_mupdf", start.build_mupdf)}.get(kind, ("build", ""))
    if not command:
        key, command = "build", start.build
    return BuildPlan(kind, command.replace(SLOTS, str(slots)), BIN_DIRS[kind],
                     f"job.start {key}")


def _override_plan(path: Path, kind: str, start: JobStart, slots: int) -> BuildPlan:
    try:
        size = path.stat().st_size
        if size > OVERRIDE_LIMIT:
            raise ValueError(f"{path} is {size} bytes; expected at most {OVERRIDE_LIMIT}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as UTF-8 text: {exc}") from None
    bin_dir = BIN_DIRS[kind]
    m = _BIN_LINE.search(text)
    if m:
        rel = PurePosixPath(m.group(1))
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"{path}: cluster-bin {m.group(1)!r} must be a folder inside "
                             "the tree, relative to its top")
        bin_dir = rel.as_posix()
    env = (("CLUSTER_SLOTS", str(slots)), ("CLUSTER_PRODUCTS", ",".join(start.products)))
    return BuildPlan(kind, f"sh ./{OVERRIDE_FILE}", bin_dir, OVERRIDE_FILE, env)
