"""The test corpus as build.py sees it: test files, their ids, and the list files that steer it.

A test file is known by its *file id*, its path relative to the corpus root with ``/``
written as ``__`` (``ghostpdl-examples/golfer.eps`` -> ``ghostpdl-examples__golfer.eps``);
a test id is ``<file id>.<config>``.  :func:`find_test_files` walks the corpus (build.pl ran
``svn list``); :func:`read_list` reads the ``nightly_only.lst``, ``slowfiles.lst`` and
``quickfiles.lst`` files; :func:`id_problem` says why a test id cannot be used.

Deliberate difference from build.pl: only files with one of the product's configured
extensions are tests (build.pl took every file of a gs directory), and names that would not
make a valid :data:`cluster.records.TEST_ID` (spaces, quotes, shell metacharacters, control
characters, a placeholder word) are skipped with a warning (build.pl pasted names into the
shell unquoted).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from cluster.records import PLACEHOLDERS, TEST_ID

logger = logging.getLogger("cluster.build")

#: Per directory: files tested only by nightly runs (the ``nightly`` word includes them).
NIGHTLY_ONLY = "nightly_only.lst"
#: At the corpus root: tests whose jobs go first (the slowest), and last (the quickest).
SLOW_FILES = "slowfiles.lst"
QUICK_FILES = "quickfiles.lst"
#: The longest test id :data:`cluster.records.TEST_ID` accepts.
MAX_TEST_ID = 401
_ALLOWED = "letters, digits and _ . + , @ % = - (first character a letter or digit)"


def file_id(relpath: str) -> str:
    """The test id stem of a test file: its relative path with ``/`` written as ``__``."""
    return relpath.replace("/", "__")


def id_problem(test_id: str) -> str | None:
    """Why ``test_id`` (or a file id) cannot be used, or None when it can."""
    if not TEST_ID.fullmatch(test_id):
        return f"its test id may only contain {_ALLOWED}, at most {MAX_TEST_ID} characters"
    for word in PLACEHOLDERS:
        if word in test_id:
            # The node replaces placeholders everywhere in the command, file names included.
            return f"its test id contains the placeholder {word}"
    return None


def read_list(path: Path) -> set[str]:
    """Non-blank, non-comment lines of an optional list file (missing file: empty set).

    An unreadable file is logged and treated as empty: a list only steers the order or the
    selection of tests, so it must not stop a run.
    """
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return set()
    except OSError as exc:
        logger.warning("build: cannot read %s (%s); ignoring it", path, exc.strerror)
        return set()
    out = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line)
    return out


def find_test_files(tests_root: Path, extensions: Sequence[str], nightly: bool = False
                    ) -> list[str]:
    """Every test file under ``tests_root`` with one of ``extensions``, sorted.

    Returns relative POSIX paths.  Matching of extensions ignores case (build.pl's mupdf list
    took ``.pdf`` and ``.PDF``).  Skipped, as build.pl skipped them: dot files (and dot
    directories), ``*.disabled``, anything that is not a file, and the names listed in the
    ``nightly_only.lst`` of their directory unless ``nightly``.  Also skipped, with a warning
    on the ``cluster.build`` logger: paths whose test id would be invalid (see
    :data:`cluster.records.TEST_ID`) and paths whose id repeats an earlier one (``a/b__c`` and
    ``a__b/c``).  Never raises for odd names; raises FileNotFoundError when ``tests_root``
    is not a directory.
    """
    root = Path(tests_root)
    if not root.is_dir():
        raise FileNotFoundError(2, "tests root is not a directory", str(root))
    wanted = {e.lower().lstrip(".") for e in extensions}
    found: dict[str, str] = {}  # test id stem -> relative path

    def onerror(exc: OSError) -> None:
        logger.warning("build: cannot list %s (%s); its tests are left out",
                       exc.filename, exc.strerror)

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        reldir = os.path.relpath(dirpath, root)
        reldir = "" if reldir == "." else reldir.replace(os.sep, "/") + "/"
        nightly_only = set() if nightly else read_list(Path(dirpath) / NIGHTLY_ONLY)
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".disabled") or name == NIGHTLY_ONLY:
                continue
            if not reldir and name in (SLOW_FILES, QUICK_FILES):
                continue
            if name in nightly_only:
                continue
            ext = name.rpartition(".")[2].lower() if "." in name else ""
            if ext not in wanted:
                continue
            if not os.path.isfile(os.path.join(dirpath, name)):
                continue  # broken symlink, fifo, socket...
            rel = reldir + name
            stem = file_id(rel)
            problem = id_problem(stem)
            if problem is not None:
                logger.warning("build: skipping test file %r: %s", rel, problem)
                continue
            if stem in found:
                logger.warning("build: skipping test file %r: its test id %s is already used "
                               "by %r", rel, stem, found[stem])
                continue
            found[stem] = rel
    return sorted(found.values())
