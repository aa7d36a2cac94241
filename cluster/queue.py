"""Queue files of the master: the grammar of a queued run and the locked queue file.

A master home holds one queue per priority (``queue``, ``queue.1``, ``queue.2``; see
:class:`cluster.home.Home`).  Each line is one run waiting to be done, and the first line is
the current or next run (ARTIFEX.md §2.1/§2.2)::

    <kind> <ref> <products> [option ...]

``kind``
    ``user`` (``ref`` = a user name, a clusterpush run, usually priority 0), ``git`` (``ref``
    = a commit sha of 7 to 40 hex digits, priority 1) or ``auto`` (``ref`` = an auto job name,
    priority 2).  The master does not care which kind sits in which queue.
``ref``
    ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``; a git sha is lower-cased.
``products``
    comma-separated, each of ``gs``, ``pdfwrite``, ``ps2write``, ``mupdf``, ``shell``, no
    duplicates; ``mupdf`` must be alone (Artifex rule: mupdf is pushed alone), and so must
    ``shell`` (a list of shell commands, see cluster.jobs.commands).  Canonical order is the
    order of :data:`PRODUCTS`.
``option``
    a flag (``lowres``, ``highres``, ``relaxtimeout``, ``bmpcmp``; ``lowres`` and ``highres``
    exclude each other) or ``key=value`` with key ``filter``, ``ifilter``, ``extras``, ``rev``
    or ``tree``.  Each flag or key at most once; canonical order is sorted.

Fields are separated by spaces or tabs; a line holds at most :data:`MAX_LINE` characters and
no control characters.  Blank lines and lines starting with ``#`` are ignored.

Locking follows the Perl (STYLE guideline 12): every read holds ``flock`` on the separate
lock file (``queue.lck``), shared for a read and exclusive for a read-modify-write; every
rewrite goes through a temporary file in the same directory, ``fsync`` and ``os.replace``, so
a reader never sees a torn file.  The lock file itself is never written or replaced: the lock
belongs to its inode.

Usage::

    q = QueueFile.for_priority(Home(root), 1)
    q.append(RunSpec.parse("git 0123abc gs,pdfwrite"))   # False if already queued
    spec = q.head()                                       # the run to do next, or None
    q.remove(spec)                                        # once that run is finished
"""

from __future__ import annotations

import logging
import os
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cluster.datatypes import ALONE, PRODUCTS, TREE
from cluster.errors import QueueLineError
from cluster.home import Home
from cluster.runtime import fsutil

logger = logging.getLogger("cluster.queue")

KINDS = ("user", "git", "auto")
# PRODUCTS, ALONE and TREE (the grammar of ``tree=``) are cluster.datatypes': the commit
# triggers' path -> products map and the configuration check the same names.
FLAGS = ("lowres", "highres", "relaxtimeout", "bmpcmp")
OPTION_KEYS = ("filter", "ifilter", "extras", "rev", "tree")
EXCLUSIVE_FLAGS = (("lowres", "highres"),)
MAX_LINE = 4096

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA = re.compile(r"[0-9A-Fa-f]{7,40}")
#: ``rev=`` goes to git: it may not start with ``-`` (it would read as an option).
REV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/~^@{}-]{0,127}")
_SEPARATORS = re.compile(r"[ \t]+")


class _Problem(Exception):
    """What is wrong with a run description; turned into QueueLineError by the caller."""


def _check_text(text: str) -> None:
    """Refuse control, undecodable and exotic whitespace characters (tab is a separator)."""
    for ch in text:
        if ch in " \t":
            continue
        if ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs"):
            raise _Problem(f"control or undecodable character {ch!r}; expected printable "
                           "words separated by spaces or tabs")


def _normalize(kind: str, ref: str, products: Iterable[str],
               options: Iterable[str]) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """Validate the fields of a run; return them in canonical form or raise _Problem."""
    if kind not in KINDS:
        raise _Problem(f"unknown run kind {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "git":
        if not SHA.fullmatch(ref):
            raise _Problem(f"bad commit {ref!r}; expected a sha of 7 to 40 hex digits")
        ref = ref.lower()
    elif not REF.fullmatch(ref):
        what = "user name" if kind == "user" else "auto job name"
        raise _Problem(f"bad {what} {ref!r}; expected letters, digits, '.', '_' or '-' "
                       "(starting with a letter or digit, at most 64)")

    prods = tuple(products)
    if not prods:
        raise _Problem(f"no products; expected a comma-separated list of {', '.join(PRODUCTS)}")
    seen: set[str] = set()
    for p in prods:
        if p not in PRODUCTS:
            raise _Problem(f"unknown product {p!r}; expected one of {', '.join(PRODUCTS)}")
        if p in seen:
            raise _Problem(f"product {p!r} listed twice; expected each product at most once")
        seen.add(p)
    for p in ALONE:
        if p in seen and len(prods) > 1:
            raise _Problem(f"product {p!r} must be queued alone; got {','.join(prods)}")
    prods = tuple(p for p in PRODUCTS if p in seen)

    opts: list[str] = []
    names: set[str] = set()
    for opt in options:
        _check_text(opt)
        if not opt or " " in opt or "\t" in opt:
            raise _Problem(f"bad option {opt!r}; expected one word")
        key, eq, value = opt.partition("=")
        if eq:
            if key not in OPTION_KEYS:
                raise _Problem(f"unknown option {key!r}; expected a flag "
                               f"({', '.join(FLAGS)}) or key=value with key one of "
                               f"{', '.join(OPTION_KEYS)}")
            if not value:
                raise _Problem(f"option {key}= has no value; expected {key}=<value>")
            if key == "tree" and not TREE.fullmatch(value):
                raise _Problem(f"bad tree {value!r}; expected a directory name (letters, "
                               "digits, '.', '_' or '-')")
            if key == "rev" and not REV.fullmatch(value):
                raise _Problem(f"bad rev {value!r}; expected a git revision not starting "
                               "with '-'")
        elif key not in FLAGS:
            raise _Problem(f"unknown option {key!r}; expected a flag ({', '.join(FLAGS)}) or "
                           f"key=value with key one of {', '.join(OPTION_KEYS)}")
        if key in names:
            raise _Problem(f"option {key!r} given twice; expected it at most once")
        names.add(key)
        opts.append(opt)
    for group in EXCLUSIVE_FLAGS:
        both = [f for f in group if f in names]
        if len(both) > 1:
            raise _Problem(f"options {' and '.join(both)} exclude each other; expected one")
    return kind, ref, prods, tuple(sorted(opts, key=lambda o: o.partition("=")[0]))


@dataclass(frozen=True)
class RunSpec:
    """One queued run.  Always valid and canonical: the constructor validates and normalizes.

    ``RunSpec.parse(spec.line()) == spec`` for every spec, and two specs are equal exactly
    when their canonical lines are.
    """

    kind: str
    ref: str
    products: tuple[str, ...]
    options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            _check_text(self.kind + self.ref + "".join(self.products))
            kind, ref, products, options = _normalize(self.kind, self.ref, self.products,
                                                      self.options)
        except _Problem as exc:
            shown = " ".join([str(self.kind), str(self.ref), ",".join(map(str, self.products)),
                              *map(str, self.options)])
            raise QueueLineError(shown, str(exc)) from None
        # Frozen dataclass: normalization has to go through object.__setattr__.
        object.__setattr__(self, "ref", ref)
        object.__setattr__(self, "products", products)
        object.__setattr__(self, "options", options)
        text = self.line()
        if len(text) > MAX_LINE:
            raise QueueLineError(text[:100], f"run description is {len(text)} characters; "
                                 f"expected at most {MAX_LINE}")

    @classmethod
    def parse(cls, line: str, source: str = "", lineno: int | None = None) -> RunSpec:
        """Parse one queue line (a trailing newline or CR is ignored).

        Raises QueueLineError naming ``source`` and ``lineno``, the problem and the expected
        form.
        """
        text = line.rstrip("\r\n")
        try:
            if len(text) > MAX_LINE:
                raise _Problem(f"line is {len(text)} characters; expected at most {MAX_LINE}")
            _check_text(text)
            words = [w for w in _SEPARATORS.split(text) if w]
            if len(words) < 3:
                raise _Problem("too few fields; expected '<kind> <ref> <products> [option ...]'")
            kind, ref, products, *options = words
            prods = products.split(",")
            if "" in prods:
                raise _Problem(f"empty product in {products!r}; expected a comma-separated "
                               f"list of {', '.join(PRODUCTS)}")
            kind, ref, prods_t, opts = _normalize(kind, ref, prods, options)
        except _Problem as exc:
            raise QueueLineError(text, str(exc), source, lineno) from None
        return cls(kind, ref, prods_t, opts)

    def line(self) -> str:
        """The canonical queue line (no newline)."""
        return " ".join([self.kind, self.ref, ",".join(self.products), *self.options])

    def option(self, key: str) -> str | None:
        """The value of option ``key=value``, or None when not given."""
        for opt in self.options:
            k, eq, value = opt.partition("=")
            if eq and k == key:
                return value
        return None

    def has_flag(self, flag: str) -> bool:
        """Whether the flag option ``flag`` is given."""
        return flag in self.options

    @property
    def tree(self) -> str:
        """The source tree the run builds: option ``tree=``, else mupdf, shell or ghostpdl."""
        explicit = self.option("tree")
        if explicit is not None:
            return explicit
        if self.products in (("mupdf",), ("shell",)):
            return self.products[0]
        return "ghostpdl"

    def __str__(self) -> str:
        return self.line()


# ----------------------------------------------------------------------------------------------
# The queue file

@dataclass
class _Entry:
    """One physical line of a queue file: kept verbatim, with its parse if it is a run."""

    raw: str
    spec: RunSpec | None


class QueueFile:
    """A queue file and its lock file.

    Callers use :meth:`read`, :meth:`head`, :meth:`append` and :meth:`remove`; each is one
    locked transaction.  Lines that are not valid runs are logged (with file and line
    number) and skipped by :meth:`read`, but kept verbatim when the file is rewritten, so
    nothing an operator or another tool wrote is ever lost.
    """

    def __init__(self, path: Path, lock_path: Path) -> None:
        if Path(path) == Path(lock_path):
            # The rewrite replaces the queue's inode; a lock on it would protect nothing.
            raise ValueError(f"queue {path} and its lock file must differ")
        self.path = Path(path)
        self.lock_path = Path(lock_path)
        # Corrupt lines already warned about, so a master polling every few seconds
        # logs each one once at WARNING and later only at DEBUG (STYLE guideline 7).
        self._warned: set[tuple[int, str]] = set()

    @classmethod
    def for_priority(cls, home: Home, priority: int) -> QueueFile:
        """The queue of ``priority`` in master home ``home``."""
        return cls(home.queue(priority), home.queue_lock(priority))

    def __repr__(self) -> str:
        return f"QueueFile({str(self.path)!r})"

    # --- transactions ---------------------------------------------------------------------
    def read(self) -> list[RunSpec]:
        """The queued runs in file order (empty if the file does not exist)."""
        with fsutil.flocked(self.lock_path, shared=True):
            entries = self._load()
        return [e.spec for e in entries if e.spec is not None]

    def head(self) -> RunSpec | None:
        """The first queued run (the current or next one), or None."""
        runs = self.read()
        return runs[0] if runs else None

    def append(self, spec: RunSpec) -> bool:
        """Queue ``spec`` at the end unless an equal run is already queued.

        Returns True if it was added.  Like the Perl, which greps before appending.
        """
        with fsutil.flocked(self.lock_path):
            entries = self._load()
            if any(e.spec == spec for e in entries):
                logger.debug("%s: %s already queued", self.path, spec)
                return False
            entries.append(_Entry(spec.line(), spec))
            self._rewrite(entries)
        logger.info("%s: queued %s", self.path, spec)
        return True

    def remove(self, spec: RunSpec) -> bool:
        """Remove the first line equal to ``spec`` (not blindly the first line).

        Returns True if a line was removed.  Every other line, corrupt ones included, is kept.
        """
        with fsutil.flocked(self.lock_path):
            entries = self._load()
            for i, entry in enumerate(entries):
                if entry.spec == spec:
                    del entries[i]
                    break
            else:
                logger.debug("%s: %s not queued, nothing removed", self.path, spec)
                return False
            self._rewrite(entries)
        logger.info("%s: removed %s", self.path, spec)
        return True

    # --- internals ------------------------------------------------------------------------
    def _load(self) -> list[_Entry]:
        """Every physical line of the file, parsed where it is a run.  Caller holds the lock."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        # surrogateescape: undecodable bytes survive a rewrite byte for byte.
        text = data.decode("utf-8", errors="surrogateescape")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        entries = []
        for lineno, raw in enumerate(lines, start=1):
            stripped = raw.strip(" \t\r")
            spec: RunSpec | None = None
            if stripped and not stripped.startswith("#"):
                try:
                    spec = RunSpec.parse(raw, str(self.path), lineno)
                except QueueLineError as exc:
                    self._warn_corrupt(lineno, raw, exc)
            entries.append(_Entry(raw, spec))
        return entries

    def _warn_corrupt(self, lineno: int, raw: str, exc: QueueLineError) -> None:
        key = (lineno, raw)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        logger.log(level, "skipping corrupt queue line %s", exc)

    def _rewrite(self, entries: list[_Entry]) -> None:
        """Atomically replace the queue file with ``entries``.  Caller holds the lock."""
        data = "".join(e.raw + "\n" for e in entries).encode("utf-8", errors="surrogateescape")
        fsutil.atomic_write(self.path, data)
        _fsync_dir(self.path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable; best effort (some file systems refuse to fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
