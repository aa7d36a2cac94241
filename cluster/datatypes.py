"""The grammars of the values the cluster passes around: names, products, schedules, repositories.

A leaf module: it imports only :mod:`cluster.errors`, the standard library and (for unusual
cron schedules, on demand) python-crontab, so the configuration (which checks its values with
these at load), the queue grammar, the wire protocol and the commit triggers can all share
one definition of each.

Contracts:

* a ``valid_*`` / ``is_*`` function answers yes or no and never raises;
* a ``check_*`` / ``parse_*`` function returns the value (normalised where it says so) or
  raises :class:`ConfigError` naming the configuration key, the bad value and the
  expected form.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cluster.errors import ConfigError

# ----------------------------------------------------------------------------------------------
# Products and trees

#: Every product a run may test, in canonical order (what build.py generates jobs for,
#: cluster.jobs.generate).  pcl (gpcl6), xps (gxps) and xpswrite (gs writes XPS, gxps
#: rasterises it) are built from the same ghostpdl tree as gs.
#: ``sweep`` runs a user's program over a parameter table (docs/sweeps.md): its
#: "tree" is the sweep folder.
PRODUCTS = ("gs", "pdfwrite", "ps2write", "xpswrite", "pcl", "xps", "mupdf", "shell",
            "sweep")
#: Products that may only be queued on their own (RunningClusterJobs: "pushed alone").
ALONE = ("mupdf", "shell", "sweep")
#: Products a ``path_products`` entry may name; the alone ones follow from the tree's name.
MAP_PRODUCTS = tuple(p for p in PRODUCTS if p not in ALONE)
#: A source tree names a directory (``users/<user>/<tree>``, ``<home>/<tree>``): a plain
#: name, never a path.
TREE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Names of files and directories of the master home (cluster.home).  The master makes the
#: last commit run's tree its clean tree ``<home>/<tree>``, so a tree may not be called so.
RESERVED_TREES = ("archive", "auto", "lanes", "log", "nodes", "repos", "runs", "tables",
                  "tests", "users")
RESERVED_STEMS = ("queue", "job", "jobs", "results", "clustermaster", "status", "emails",
                  "md5sum", "run_clustermaster", "monitor_port")


def _is_reserved(tree: str) -> bool:
    return tree in RESERVED_TREES or any(tree == s or tree.startswith(s + ".")
                                         for s in RESERVED_STEMS)


def check_tree(tree: str) -> str:
    """``tree`` if it is a plain name a commit run may use; ConfigError otherwise."""
    if not TREE.fullmatch(tree) or _is_reserved(tree):
        raise ConfigError("tree", tree, "a plain name (letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit) that is not a file of the "
                          "master home (" + ", ".join(RESERVED_TREES + RESERVED_STEMS) + ")")
    return tree


# ----------------------------------------------------------------------------------------------
# Nodes

#: A node's name: letters, digits, '.', '_', '-', at most 64 characters.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_node_name(name: str) -> bool:
    """Whether ``name`` may name a node (in the protocol, the monitor and the config)."""
    return NODE_NAME.fullmatch(name) is not None


# ----------------------------------------------------------------------------------------------
# Cron schedules

#: The numeric range of each of the five cron fields (minute, hour, day, month, weekday).
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
#: One item of a numeric cron field: ``*``, ``N`` or ``N-M``, with an optional ``/step``.
_CRON_ITEM = re.compile(r"(\*|([0-9]{1,2})(?:-([0-9]{1,2}))?)(?:/([0-9]{1,2}))?")


def _plain_schedule(fields: list[str]) -> bool:
    """Whether five fields are a schedule in the plain numeric form (``*/10 * * * *``,
    ``0 1 * * 1-5``): every item ``*``, ``N`` or ``N-M`` (N <= M) in the field's range, with
    an optional step from 1 to the field's maximum.

    A strict subset of what python-crontab accepts, checked without importing it:
    python-crontab imports asyncio, which costs every process that loads the configuration
    (clustermaster, build.py, run.py) tens of milliseconds at start."""
    if len(fields) != 5:
        return False
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        for item in field.split(","):
            match = _CRON_ITEM.fullmatch(item)
            if match is None:
                return False
            _, first, last, step = match.groups()
            if step is not None and not 1 <= int(step) <= high:
                return False
            if first is None:
                continue
            start = int(first)
            end = start if last is None else int(last)
            if not low <= start <= end <= high:
                return False
    return True


def is_schedule(text: str) -> bool:
    """Whether ``text`` (whitespace normalised) is five cron fields or an @special.

    The plain numeric form is checked here; anything else (names such as ``MON``, an
    @special) by python-crontab's parser, imported only then."""
    normal = " ".join(text.split())
    if not normal:
        return False
    if _plain_schedule(normal.split(" ")):
        return True
    from crontab import CronSlices  # noqa: PLC0415 - see _plain_schedule: costly import

    return bool(CronSlices.is_valid(normal))


def check_schedule(key: str, value: str) -> str:
    """``value`` with its whitespace normalised; ConfigError naming ``key`` if not cron syntax."""
    if not is_schedule(value):
        raise ConfigError(key, value, "a cron schedule of five fields such as '0 1 * * *' "
                                      "or an @special such as '@daily'")
    return " ".join(value.split())


# ----------------------------------------------------------------------------------------------
# Commit runs: repositories, branch, path -> products map

#: A branch name git would take as a plain name, not an option, range or expression.
BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")

_REPOSITORIES_FORM = ("'<tree>=<url>' with tree a plain name (letters, digits, '.', '_' or "
                      "'-') and url anything git clones (a local path must be absolute)")
_PATH_PRODUCTS_FORM = ("'[<tree>:]<path prefix>=<products>' with products a comma list of "
                       f"{', '.join(MAP_PRODUCTS)} or empty (the path needs no test)")


@dataclass(frozen=True)
class PathRule:
    """One ``path_products`` entry: paths starting with ``prefix`` need ``products``.

    ``tree`` None means every tree.
    """

    tree: str | None
    prefix: str
    products: tuple[str, ...]


def _has_control(text: str) -> bool:
    return any(ord(ch) < 32 or ord(ch) == 127 for ch in text)


def _is_local_path(url: str) -> bool:
    """Whether git reads ``url`` as a local path (not ``scheme://`` nor scp-like ``host:path``)."""
    if "://" in url:
        return False
    colon, slash = url.find(":"), url.find("/")
    return colon < 0 or 0 <= slash < colon


def parse_repositories(entries: Iterable[str]) -> dict[str, str]:
    """``repositories`` as ``{tree: url}`` in configuration order.

    Raises ConfigError naming the entry and the expected form for a malformed entry, a
    reserved tree name, a relative local path or a tree given twice.
    """
    out: dict[str, str] = {}
    for entry in entries:
        tree, eq, url = entry.partition("=")
        if not eq or not url or not TREE.fullmatch(tree) or _has_control(url):
            raise ConfigError("repositories", entry, _REPOSITORIES_FORM)
        if _is_reserved(tree):
            raise ConfigError("repositories", entry, f"a tree name other than {tree!r}, which "
                              "is a file or directory of the master home")
        if url.startswith("-"):
            raise ConfigError("repositories", entry, "a url not starting with '-' (git would "
                              "read it as an option)")
        if _is_local_path(url) and not os.path.isabs(url):
            raise ConfigError("repositories", entry, "an absolute local path or a url "
                              "(the master runs from any directory)")
        if tree in out:
            raise ConfigError("repositories", entry, f"each tree once; {tree!r} is also "
                              f"{tree}={out[tree]}")
        out[tree] = url
    return out


def check_branch(name: str) -> str:
    """``name`` if it is a plain branch name; ConfigError naming ``git_branch`` otherwise."""
    if (not BRANCH.fullmatch(name) or ".." in name or "//" in name or "/." in name
            or name.endswith(("/", ".", ".lock"))):
        raise ConfigError("git_branch", name, "a branch name such as master (letters, "
                          "digits, '.', '_', '-' and '/', no '..')")
    return name


def parse_path_products(entries: Iterable[str]) -> tuple[PathRule, ...]:
    """``path_products`` as rules; ConfigError naming the entry and the expected form.

    An entry is ``[<tree>:]<prefix>=<products>``.  The text before the first ``=`` is split
    at its first ``:``; a leading ``:`` (empty tree) means every tree, which is how an
    unqualified prefix containing ``:`` is written.  Products may not be mupdf or shell:
    those are tested alone, and a tree named so tests only that product.
    """
    rules: list[PathRule] = []
    keys: set[tuple[str | None, str]] = set()
    for entry in entries:
        where, eq, products = entry.partition("=")
        if not eq:
            raise ConfigError("path_products", entry, _PATH_PRODUCTS_FORM)
        tree: str | None = None
        qualifier, colon, prefix = where.partition(":")
        if colon:
            if qualifier and not TREE.fullmatch(qualifier):
                raise ConfigError("path_products", entry, "a tree qualifier that is a plain "
                                  "name; " + _PATH_PRODUCTS_FORM)
            tree = qualifier or None
        else:
            prefix = where
        if prefix.startswith("/") or _has_control(prefix):
            raise ConfigError("path_products", entry, "a prefix relative to the top of the "
                              "repository (no leading '/'); " + _PATH_PRODUCTS_FORM)
        names = products.split(",") if products else []
        for name in names:
            if name not in MAP_PRODUCTS:
                why = (f"{name!r} follows from the tree's name and is tested alone"
                       if name in ALONE else f"unknown product {name!r}")
                raise ConfigError("path_products", entry, f"{_PATH_PRODUCTS_FORM} ({why})")
        if len(set(names)) != len(names):
            raise ConfigError("path_products", entry, "each product once; "
                              + _PATH_PRODUCTS_FORM)
        if (tree, prefix) in keys:
            raise ConfigError("path_products", entry, "each [tree:]prefix once")
        keys.add((tree, prefix))
        rules.append(PathRule(tree, prefix, tuple(p for p in PRODUCTS if p in names)))
    return tuple(rules)


#: A ``user_shares`` entry: ``<user>=<weight>``.
_USER_SHARE = re.compile(r"([A-Za-z0-9_][A-Za-z0-9._-]{0,63})=([0-9]{1,3})")
#: The largest weight a ``user_shares`` entry may give (cluster.runoptions.MAX_SHARE).
MAX_USER_SHARE = 100


def parse_user_shares(text: str) -> dict[str, int]:
    """master.conf's ``user_shares`` (``alice=2 bob=1``, space or comma separated) as
    user -> weight; ConfigError naming the entry unless each is ``<user>=<1..100>``, each
    user once."""
    shares: dict[str, int] = {}
    for entry in text.replace(",", " ").split():
        match = _USER_SHARE.fullmatch(entry)
        weight = int(match.group(2)) if match else 0
        if match is None or not 1 <= weight <= MAX_USER_SHARE or match.group(1) in shares:
            raise ConfigError("user_shares", entry, "space-separated <user>=<weight> entries, "
                              f"each weight from 1 to {MAX_USER_SHARE}, each user once")
        shares[match.group(1)] = weight
    return shares
