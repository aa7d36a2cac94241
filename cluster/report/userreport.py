"""The report of a user run (clusterpush): ARTIFEX.md §2.9 "Email for a user run".

:func:`user_report` puts together, in clustermaster.pl's order::

    User regression: user alice products gs options - run 2024...   (the run header)

    [compare of this run with the baseline, tables/current.tab; skip_missing]

    Differences from previous clusterpush:

    [compare of this run with the user's previous push; no segfault block, no "ran" line]

    Source differences from trunk (first 2500 lines):

    [unified diff of the master's clean tree against the pushed tree, cut at 2500 lines]

:func:`source_diff` makes the last part in Python (difflib), not with ``diff``: it needs no
particular diffutils, never opens anything but regular files (a FIFO in a pushed tree would
hang ``diff -r``), and never follows a symbolic link: a link is compared as the text it
points to, so a link in a pushed tree cannot make the master read files outside the trees.

Departures from the Perl, which ran ``diff -w -c -r`` ignoring ``$Id:`` lines: the diff is
unified and whitespace counts (``patch -p1`` in the clean tree applies it), and build
outputs, VCS folders and the clusterpush dropping are left out (:data:`EXCLUDED_DIRS`,
:data:`EXCLUDED_FILES`), as clusterpush leaves them out of what it sends.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import logging
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from cluster.report.compare import Comparison, RunFacts, analyse, render
from cluster.report.md5cache import SeenCache
from cluster.report.tab import Previous, TabRow

logger = logging.getLogger("cluster.userreport")

#: How many lines of the source diff the report shows (clustermaster.pl's ``head -2500``).
DIFF_LIMIT = 2500

#: Directory names never compared, at any depth: build outputs (clusterpush.pl's rsync
#: excludes) and version-control folders.
EXCLUDED_DIRS = frozenset({"bin", "obj", "debugobj", "pgobj", "sobin", "soobj", ".deps",
                           ".libs", ".git", ".svn", ".hg", "CVS"})

#: File name patterns never compared: object files, and the clusterpush dropping with its
#: temporary and ``.rejected`` forms.
EXCLUDED_FILES = ("*.o", "cluster_command.run*", ".cluster_command.run*", "gs.run*",
                  "ghostscript.run*")

#: A file larger than this [bytes] is reported as differing, not diffed line by line:
#: difflib on a generated multi-megabyte file would hold up the master's report.
MAX_DIFF_BYTES = 4 * 1024 * 1024

#: How much of a file is searched for a NUL byte to call it binary (what GNU diff reads
#: first) [bytes].
BINARY_SNIFF = 8192

#: The clean side's prefix and the pushed side's in diff headers (``patch -p1`` strips them).
CLEAN_PREFIX = "a/"
PUSHED_PREFIX = "b/"

NO_BASELINE = ("No baseline (current.tab) to compare with yet: no commit or nightly run has "
               "finished, so this run's results are compared with nothing.")
NO_PREVIOUS_PUSH = "No previous clusterpush to compare with: this is the user's first push."
NO_CLEAN_TREE = "There is no clean tree on the master to compare with."
NO_SOURCE_DIFFERENCES = "No source differences."

_FILE, _LINK, _SPECIAL = "file", "link", "special"


def user_report(current: Mapping[str, TabRow], baseline: Previous | None,
                previous_push: Previous | None, facts: RunFacts,
                clean: Path | None, pushed: Path, seen: SeenCache | None = None) -> str:
    """The whole text of a user run's report (it ends with a newline).

    *current* is this run's table; *baseline* the baseline (``tables/current.tab``) or None
    if there is none yet; *previous_push* the table of the user's previous push or None
    (each a table in memory or a :class:`~cluster.report.tab.TabFile`).  *seen* is the md5 cache,
    used by both comparisons as compare.pl did.  The rest as for :func:`render_user_report`.
    """
    vs_baseline, vs_push = comparisons(current, baseline, previous_push, seen)
    return render_user_report(current, vs_baseline, vs_push, facts, clean, pushed)


def comparisons(current: Mapping[str, TabRow], baseline: Previous | None,
                previous_push: Previous | None,
                seen: SeenCache | None = None) -> tuple[Comparison, Comparison | None]:
    """A user run's two comparisons: with the baseline (a baseline comparison when there
    is none) and with the previous push (None when there is none), both with the md5
    cache *seen*."""
    vs_push = analyse(current, previous_push, seen=seen) if previous_push is not None else None
    return analyse(current, baseline, seen=seen), vs_push


def render_user_report(current: Mapping[str, TabRow], vs_baseline: Comparison,
                       vs_push: Comparison | None, facts: RunFacts, clean: Path | None,
                       pushed: Path) -> str:
    """The text of a user run's report from its two comparisons (:func:`report.analyse`).

    *vs_baseline* compares *current* with the baseline (a baseline comparison when there is
    none), *vs_push* with the user's previous push (None: the first push).
    ``facts.header`` (the run header, :func:`cluster.master.end.endrun.run_header`) comes
    first, once; lost nodes and late duplicates are reported once, in the first comparison.
    *clean* is the master's clean tree of the pushed product (None: there is none), *pushed*
    the tree the user pushed.
    """
    out: list[str] = []
    if facts.header:
        out.append(facts.header.rstrip("\n") + "\n\n")
    body = dataclasses.replace(facts, header="")
    out.append(render(vs_baseline, current, body, skip_missing=True, baseline_note=NO_BASELINE))

    out.append("\nDifferences from previous clusterpush:\n\n")
    if vs_push is None:
        out.append(NO_PREVIOUS_PUSH + "\n\n")
    else:
        # clustermaster.pl ran this compare with elapsed time 1, which drops the "ran"
        # line, and a previous table under users/, which drops the segfault block.
        again = dataclasses.replace(body, lost_nodes=(), duplicates=0)
        out.append(render(vs_push, current, again, skip_missing=True,
                          previous_label="previous clusterpush", segfault_block=False,
                          ran_line=False))

    out.append(f"\nSource differences from trunk (first {DIFF_LIMIT} lines):\n\n")
    out.append(source_diff(clean, pushed, DIFF_LIMIT))
    return "".join(out)


def source_diff(clean: Path | None, pushed: Path, limit: int = DIFF_LIMIT) -> str:
    """A recursive unified diff of the tree *clean* against the tree *pushed*, as text.

    Paths are relative to the trees, ``a/<path>`` on the clean side and ``b/<path>`` on the
    pushed one; a file on one side only is diffed against ``/dev/null``.  Binary files (a
    NUL byte in the first 8 KiB) get ``Binary files a/p and b/p differ``; symbolic links
    are compared by target and never followed; other special files are never opened.  Any
    other difference (a link on one side only, a file that became a link, an empty file
    added or removed) is one line saying so.  Excluded names (:data:`EXCLUDED_DIRS`,
    :data:`EXCLUDED_FILES`) are skipped on both sides.  At most *limit* lines are returned,
    then one line saying how many were left out.  Without a clean tree (None, or not a
    directory) the text is one line saying so.  The text ends with a newline.
    """
    if limit < 0:
        raise ValueError(f"limit must not be negative, got {limit}")
    if clean is None or not clean.is_dir():
        return NO_CLEAN_TREE + "\n"
    if not pushed.is_dir():
        return f"The pushed tree {pushed.name} is missing: there is nothing to compare.\n"
    shown: list[str] = []
    total = 0
    for line in _diff_lines(clean, pushed):
        total += 1
        if total <= limit:
            shown.append(line)
    if total == 0:
        return NO_SOURCE_DIFFERENCES + "\n"
    if total > limit:
        shown.append(f"[diff cut at {limit} lines: {total - limit} more line(s) left out]")
    return "\n".join(shown) + "\n"


def _excluded_file(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in EXCLUDED_FILES)


def _entries(root: Path) -> dict[str, tuple[str, str]]:
    """Every non-directory entry under *root*: relative POSIX path -> (kind, link target).

    Directories are walked without following symbolic links (a link to a directory is an
    entry of kind link).  An unreadable directory is logged and skipped.
    """
    found: dict[str, tuple[str, str]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            with os.scandir(root / rel if rel else root) as it:
                items = list(it)
        except OSError as exc:
            logger.warning("source diff: cannot read %s: %s", root / rel, exc)
            continue
        for entry in items:
            path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                logger.warning("source diff: cannot stat %s: %s", entry.path, exc)
                continue
            if stat.S_ISDIR(mode):
                if entry.name not in EXCLUDED_DIRS:
                    stack.append(path)
            elif _excluded_file(entry.name):
                continue
            elif stat.S_ISLNK(mode):
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    target = "?"
                found[path] = (_LINK, target)
            elif stat.S_ISREG(mode):
                found[path] = (_FILE, "")
            else:
                found[path] = (_SPECIAL, "")
    return found


def _printable(text: str) -> str:
    # Lines were decoded with surrogateescape so that two files differing only in invalid
    # UTF-8 still differ; the report itself must be valid UTF-8.
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _same_content(a: Path, b: Path) -> bool:
    # filecmp.cmp would do, but it caches every pair it compares in a module dict, which
    # grows for as long as the master process lives.
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            chunk = fa.read(1 << 16)
            if chunk != fb.read(1 << 16):
                return False
            if not chunk:
                return True


def _read(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _text_lines(data: bytes) -> list[str]:
    # Split on "\n" only: str.splitlines would also split on form feeds and the like, which
    # C sources contain and diff does not treat as line ends.
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    last = lines.pop()
    out = [line + "\n" for line in lines]
    if last:
        out.append(last)  # no newline at the end of the file
    return out


def _describe(kind: str, target: str) -> str:
    if kind == _LINK:
        return f"a symbolic link to {target}"
    if kind == _FILE:
        return "a regular file"
    return "a special file"


def _diff_lines(clean: Path, pushed: Path) -> Iterator[str]:
    """The lines of the diff, without newlines, in ``diff -r`` order (folder by folder)."""
    old, new = _entries(clean), _entries(pushed)
    for rel in sorted(old.keys() | new.keys(), key=lambda p: p.split("/")):
        a, b = old.get(rel), new.get(rel)
        a_name, b_name = CLEAN_PREFIX + rel, PUSHED_PREFIX + rel
        a_kind = a[0] if a else None
        b_kind = b[0] if b else None
        if a_kind in (_FILE, None) and b_kind in (_FILE, None):
            yield from _file_diff(clean / rel if a else None, pushed / rel if b else None,
                                  a_name if a else "/dev/null", b_name if b else "/dev/null")
        elif a is not None and b is not None and a == b:
            continue  # the same link target, or two special files
        elif a_kind == _LINK and b_kind == _LINK:
            assert a is not None and b is not None
            yield _printable(f"Symbolic links {a_name} -> {a[1]} and {b_name} -> {b[1]} differ")
        elif a is None:
            assert b is not None
            yield _printable(f"Only in the pushed tree: {b_name} ({_describe(*b)})")
        elif b is None:
            yield _printable(f"Only in the clean tree: {a_name} ({_describe(*a)})")
        else:
            yield _printable(f"File {a_name} is {_describe(*a)} while file {b_name} is "
                             f"{_describe(*b)}")


def _file_diff(a: Path | None, b: Path | None, a_name: str, b_name: str) -> Iterator[str]:
    """The diff of two regular files, either of which may be absent (None: empty)."""
    try:
        if a is not None and b is not None:
            if _same_content(a, b):
                return
        sizes = [p.stat().st_size for p in (a, b) if p is not None]
        if max(sizes) > MAX_DIFF_BYTES:
            yield _printable(f"Files {a_name} and {b_name} differ (larger than "
                             f"{MAX_DIFF_BYTES} bytes, not shown)")
            return
        a_data = _read(a) if a is not None else b""
        b_data = _read(b) if b is not None else b""
    except OSError as exc:
        yield _printable(f"Files {a_name} and {b_name} could not be compared: "
                         f"{exc.strerror or exc}")
        return
    if not a_data and not b_data:
        # One side is missing and the other is empty: a diff against /dev/null would show
        # nothing, and the file's coming or going would be lost.
        yield _printable(f"Only in the clean tree: {a_name} (an empty file)" if b is None
                         else f"Only in the pushed tree: {b_name} (an empty file)")
        return
    if b"\0" in a_data[:BINARY_SNIFF] or b"\0" in b_data[:BINARY_SNIFF]:
        yield _printable(f"Binary files {a_name} and {b_name} differ")
        return
    for line in difflib.unified_diff(_text_lines(a_data), _text_lines(b_data),
                                     fromfile=a_name, tofile=b_name):
        if line.endswith("\n"):
            yield _printable(line[:-1])
        else:
            yield _printable(line)
            yield "\\ No newline at end of file"
