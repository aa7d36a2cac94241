"""Node groups (docs/runoptions.md, section 4; prun's groups, Slurm's partitions):
``groups/<name>`` in the master home lists node names, one a line.  A node may be in several
groups; a run that names ``groups=a,b`` is served only by nodes of those groups
(:mod:`cluster.master.model.placement`).

The file format: one node name a line; blank lines and lines starting with ``#`` are
ignored, and so is a line that is no node name (it is logged).  Every change is an atomic
rewrite (:func:`cluster.runtime.fsutil.atomic_write`) under ``groups/.lock``, so a reader
(the master, the monitor) never sees a torn file and two admins never lose each other's
change.  Group names are :data:`cluster.runoptions.NAME` (never a ``/``: a name is a file
in ``groups/``).  Every error is a ClusterError naming the group, the node or the name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from cluster.datatypes import valid_node_name
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.runoptions import NAME
from cluster.runtime import fsutil

log = logging.getLogger("cluster.master")

#: The lock file of every change to ``groups/`` (a dot-name: never a group).
LOCK = ".lock"
#: The most groups read from ``groups/`` (a bound on the folder's walk).
MAX_GROUPS = 10_000
#: The most node names read from one group file.
MAX_MEMBERS = 100_000


def check_name(name: str) -> None:
    """ClusterError unless ``name`` may name a group."""
    if "/" in name:
        raise ClusterError(f"group name {name!r} contains a '/'; expected a name of letters, "
                           "digits, '.', '_' or '-' (a group is a file in groups/)")
    if not NAME.fullmatch(name):
        raise ClusterError(f"group name {name!r} is not valid; expected 1 to 64 letters, "
                           "digits, '.', '_' or '-', starting with a letter or digit")


def _check_node(name: str) -> None:
    if not valid_node_name(name):
        raise ClusterError(f"{name!r} is not a node name (letters, digits, '.', '_', '-', at "
                           "most 64)")


def parse(text: str, where: str = "") -> tuple[str, ...]:
    """The node names of a group file's ``text``, in file order, each once."""
    seen: dict[str, None] = {}
    for number, line in enumerate(text.splitlines()[:MAX_MEMBERS], start=1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if not valid_node_name(name):
            log.warning("%s line %d: %r is not a node name; ignored", where or "group",
                        number, name)
            continue
        seen[name] = None
    return tuple(seen)


def members(home: Home, name: str) -> tuple[str, ...]:
    """The nodes of group ``name``; ClusterError if there is no such group."""
    check_name(name)
    path = home.group(name)
    try:
        return parse(path.read_text(encoding="utf-8", errors="replace"), str(path))
    except FileNotFoundError:
        raise ClusterError(f"there is no group {name!r} (no file {path}; see clusteradmin "
                           "group ls)") from None


def all_groups(home: Home) -> dict[str, tuple[str, ...]]:
    """Every group and its nodes, by name (empty when ``groups/`` does not exist)."""
    found: dict[str, tuple[str, ...]] = {}
    try:
        with os.scandir(home.groups) as entries:
            names = sorted(e.name for e in entries
                           if not e.name.startswith(".") and NAME.fullmatch(e.name)
                           and e.is_file())
    except FileNotFoundError:
        return found
    for name in names[:MAX_GROUPS]:
        try:
            found[name] = members(home, name)
        except ClusterError:
            continue  # removed meanwhile
    return found


def groups_of(groups: dict[str, tuple[str, ...]], node: str) -> tuple[str, ...]:
    """The groups of ``groups`` that ``node`` is in."""
    return tuple(g for g, nodes in groups.items() if node in nodes)


def _write(home: Home, name: str, nodes: Iterable[str]) -> None:
    fsutil.atomic_write(home.group(name), "".join(f"{n}\n" for n in nodes))


def create(home: Home, name: str) -> str:
    """Make the empty group ``name``; ClusterError if it exists."""
    check_name(name)
    home.groups.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(home.groups / LOCK):
        if home.group(name).exists():
            raise ClusterError(f"group {name!r} exists already ({home.group(name)})")
        _write(home, name, ())
    return f"group {name} created (empty)"


def delete(home: Home, name: str) -> str:
    """Remove group ``name``; ClusterError if there is none."""
    check_name(name)
    home.groups.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(home.groups / LOCK):
        try:
            home.group(name).unlink()
        except FileNotFoundError:
            raise ClusterError(f"there is no group {name!r} to delete (see clusteradmin "
                               "group ls)") from None
    return f"group {name} deleted"


def add(home: Home, name: str, nodes: Iterable[str]) -> str:
    """Add ``nodes`` to group ``name`` (those in it already stay once); ClusterError for an
    unknown group or a bad node name (nothing is changed then)."""
    wanted = list(dict.fromkeys(nodes))
    for node in wanted:
        _check_node(node)
    home.groups.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(home.groups / LOCK):
        current = members(home, name)
        new = [n for n in wanted if n not in current]
        _write(home, name, (*current, *new))
    return (f"group {name}: added {', '.join(new) or 'nothing'}"
            + (f" ({', '.join(n for n in wanted if n not in new)} already in it)"
               if len(new) < len(wanted) else ""))


def remove(home: Home, name: str, nodes: Iterable[str]) -> str:
    """Take ``nodes`` out of group ``name``; ClusterError for an unknown group or a node
    not in it (nothing is changed then)."""
    wanted = list(dict.fromkeys(nodes))
    home.groups.mkdir(parents=True, exist_ok=True)
    with fsutil.flocked(home.groups / LOCK):
        current = members(home, name)
        missing = [n for n in wanted if n not in current]
        if missing:
            raise ClusterError(f"node{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                               f"not in group {name} (its nodes: "
                               f"{', '.join(current) or 'none'})")
        _write(home, name, [n for n in current if n not in wanted])
    return f"group {name}: removed {', '.join(wanted)}"
