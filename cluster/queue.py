"""Queue files of the master: the grammar of a queued run and the locked queue file.

A master home holds one queue per priority (``queue.lst``, ``queue.1.lst``, ``queue.2.lst``,
seed 000's names; see :class:`cluster.home.Home`).  Each line is one run waiting to be done,
and the first line is the current or next run (ARTIFEX.md §2.1/§2.2)::

    <kind> <ref> <products> [option ...]

``kind``
    ``user`` (``ref`` = a user name, a clusterpush run, usually priority 0), ``git`` (``ref``
    = a commit sha of 7 to 40 hex digits, priority 1) or ``auto`` (``ref`` = an auto job name,
    priority 2).  The master does not care which kind sits in which queue.
``ref``
    ``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``; a git sha is lower-cased.
``products``
    comma-separated, each of ``gs``, ``pdfwrite``, ``ps2write``, ``xpswrite``, ``pcl``,
    ``xps``, ``mupdf``, ``shell``, ``sweep``, no duplicates; ``mupdf`` must be alone
    (Artifex rule: mupdf is pushed alone), and so must ``shell`` (a list of shell commands,
    see cluster.jobs.commands) and ``sweep`` (a program over a parameter table,
    docs/sweeps.md).  Canonical order is the order of :data:`PRODUCTS`.
``option``
    a flag (``lowres``, ``highres``, ``relaxtimeout``, ``bmpcmp``; ``lowres`` and ``highres``
    exclude each other) or ``key=value`` with key ``filter``, ``ifilter``, ``extras``, ``rev``,
    ``tree``, ``sweep`` or ``resume``; or a per-run option (docs/runoptions.md; the flags
    ``exclusive``, ``no_reschedule``, ``every_node`` and the keys ``job_timeout``,
    ``queue_timeout``, ``task_timeout``, ``max_failed_nodes``, ``max_worker_instances``,
    ``max_cluster_instances``, ``groups``, ``exclude``, ``name``, ``after``: their grammar
    is :mod:`cluster.runoptions`', and any run, a sweep too, may have them).
    ``sweep=<file>`` names a sweep run's sweep file in the top of its folder
    (:data:`SWEEP_FILE`; default :data:`DEFAULT_SWEEP_FILE`);
    ``resume=<run id>`` (:data:`RESUME_RUN`, the name of a folder of ``archive/``) makes a
    sweep run run only the tasks without a valid result in that earlier run
    (docs/sweeps.md, section 8).  Both go with product ``sweep`` only; a sweep run takes no
    other option but ``relaxtimeout``.  Each flag or key at most once; canonical order is
    sorted.

Fields are separated by spaces or tabs; a line holds at most :data:`MAX_LINE` characters and
no control characters.  Blank lines and lines starting with ``#`` are ignored.

Locking follows the Perl (STYLE guideline 12): every read holds ``flock`` on the separate
lock file (``queue.lck``), shared for a read and exclusive for a read-modify-write; every
rewrite goes through a temporary file in the same directory, ``fsync`` and ``os.replace``, so
a reader never sees a torn file.  The lock file itself is never written or replaced, and the
queue's directory is locked with it (:mod:`cluster.runtime.pathlock`), so deleting the lock
file while it is held does not let a second writer in.

The enqueue time of each queued run with a ``queue_timeout`` (docs/runoptions.md, section 3)
is kept beside the queue in ``<queue>.times`` (:data:`TIMES_SUFFIX`), keyed by the digest of
the run's line and updated by every rewrite under the same lock
(:meth:`QueueFile.waiting_since`): the queue line itself is unchanged, so the same line
queued twice is still one run.

A bad line (not a run) is skipped, kept byte for byte, and logged once across processes
(see :class:`QueueFile`); a line of any length costs a bounded amount of memory.  The queue
files of an earlier release (``queue``, ``queue.1``, ``queue.2``) are moved to the new names
by the first transaction that finds them.

Usage::

    q = QueueFile.for_priority(Home(root), 1)
    q.append(RunSpec.parse("git 0123abc gs,pdfwrite"))   # False if already queued
    spec = q.head()                                       # the run to do next, or None
    q.remove(spec)                                        # once that run is finished
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import stat
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from cluster import runoptions
from cluster.datatypes import ALONE, PRODUCTS, TREE
from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home, legacy_queue_name
from cluster.runoptions import RunOptionError, check_word, check_words
from cluster.runtime import fsutil, pathlock

logger = logging.getLogger("cluster.queue")

KINDS = ("user", "git", "auto")
# PRODUCTS, ALONE and TREE (the grammar of ``tree=``) are cluster.datatypes': the commit
# triggers' path -> products map and the configuration check the same names.
FLAGS = ("lowres", "highres", "relaxtimeout", "bmpcmp") + runoptions.FLAGS
OPTION_KEYS = ("filter", "ifilter", "extras", "rev", "tree", "sweep", "resume") + \
    runoptions.VALUE_KEYS
EXCLUSIVE_FLAGS = (("lowres", "highres"),)
MAX_LINE = 4096

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHA = re.compile(r"[0-9A-Fa-f]{7,40}")
#: ``rev=`` goes to git: it may not start with ``-`` (it would read as an option).
REV = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/~^@{}-]{0,127}")
_SEPARATORS = re.compile(r"[ \t]+")
#: ``sweep=``: the sweep file's name in the top of the sweep folder (a file name, no path).
SWEEP_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The sweep file of a sweep run without ``sweep=``.
DEFAULT_SWEEP_FILE = "sweep.toml"
#: The product whose runs are sweeps.
SWEEP = "sweep"
#: ``resume=``: the id of the earlier run a sweep run resumes, the name of its folder in
#: ``archive/`` (a run id of the master: ``20260101020304-p0-1a2b``; no ``/``, never ``.``
#: or ``..``).
RESUME_RUN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The options a sweep run may have (the corpus's selection words and bmpcmp mean nothing
#: to a sweep).
SWEEP_OPTIONS = ("sweep", "resume", "relaxtimeout") + runoptions.KEYS
#: The options that go with product ``sweep`` only.
SWEEP_ONLY_OPTIONS = ("sweep", "resume")


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
            if key in FLAGS:
                raise _Problem(f"option {key} is a flag; expected {key} without '='")
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
            if key in SWEEP_ONLY_OPTIONS and prods != (SWEEP,):
                raise _Problem(f"option {key}= goes with product {SWEEP} only; got "
                               f"{','.join(prods)}")
            if key == "resume" and not RESUME_RUN.fullmatch(value):
                raise _Problem(f"bad resume run {value!r}; expected the id of an archived "
                               "run (letters, digits, '.', '_' or '-', starting with a "
                               "letter or digit, at most 64)")
            if key == "sweep":
                if not SWEEP_FILE.fullmatch(value):
                    raise _Problem(f"bad sweep file {value!r}; expected a file name in the "
                                   "top of the sweep folder (letters, digits, '.', '_' or "
                                   "'-', starting with a letter or digit)")
        elif key not in FLAGS:
            raise _Problem(f"unknown option {key!r}; expected a flag ({', '.join(FLAGS)}) or "
                           f"key=value with key one of {', '.join(OPTION_KEYS)}")
        try:
            check_word(key, value if eq else None)
        except RunOptionError as exc:
            raise _Problem(str(exc)) from None
        if key in names:
            raise _Problem(f"option {key!r} given twice; expected it at most once")
        names.add(key)
        opts.append(opt)
    try:
        check_words(opts)  # together: after= may not name the run's own name=
    except RunOptionError as exc:
        raise _Problem(str(exc)) from None
    if prods == (SWEEP,):
        other = sorted(names - set(SWEEP_OPTIONS))
        if other:
            raise _Problem(f"option {other[0]!r} does not go with product {SWEEP}; expected "
                           f"only {' or '.join(SWEEP_OPTIONS)}")
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
        """The source tree the run builds: option ``tree=``, else mupdf, shell, sweep (the
        sweep folder) or ghostpdl."""
        explicit = self.option("tree")
        if explicit is not None:
            return explicit
        if self.products in (("mupdf",), ("shell",), (SWEEP,)):
            return self.products[0]
        return "ghostpdl"

    @property
    def resume(self) -> str | None:
        """The run a sweep run resumes (option ``resume=``), or None."""
        return self.option("resume")

    @property
    def sweep_file(self) -> str | None:
        """A sweep run's sweep file in its folder (``sweep=``, else
        :data:`DEFAULT_SWEEP_FILE`); None for any other run."""
        if self.products != (SWEEP,):
            return None
        return self.option("sweep") or DEFAULT_SWEEP_FILE

    def __str__(self) -> str:
        return self.line()


# ----------------------------------------------------------------------------------------------
# The queue file

#: A line longer than this many bytes cannot be a run (MAX_LINE characters of at most four
#: UTF-8 bytes, and a CR): it is never held in memory, only hashed, shown in part, and
#: copied through from the old file on a rewrite.
MAX_LINE_BYTES = 4 * MAX_LINE + 1
#: How much of a bad line a log message shows [characters]; its length is given besides.
EXCERPT_CHARS = 200
#: At most this many distinct new bad lines are logged one by one in a pass; the others
#: are counted in one more line (a binary file appended to a queue must not flood the log).
MAX_REPORTED = 20
#: Suffix of the side file that remembers which bad lines were logged (``queue.lst.reported``).
REPORTED_SUFFIX = ".reported"
#: Suffix of the side file of the queued runs' enqueue times (``queue.lst.times``; issue
#: 25's ``queue_timeout``): ``<sha256 of the run's line> <epoch seconds>`` lines.
TIMES_SUFFIX = ".times"
_EXCERPT_BYTES = 4 * EXCERPT_CHARS
_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Line:
    """One physical line of a file as :func:`_scan` finds it (without its newline)."""

    offset: int           # of its first byte
    length: int           # in bytes
    data: bytes | None    # its bytes, or None when longer than MAX_LINE_BYTES
    excerpt: bytes        # its first bytes (for messages)
    long_digest: str      # sha256 of a long line ("" for a short one: hash it on demand)

    def digest(self) -> str:
        """The sha256 (hex) of the line's bytes."""
        if self.data is None:
            return self.long_digest
        return hashlib.sha256(self.data).hexdigest()


def _scan(fh: BinaryIO) -> Iterator[_Line]:
    """Every line of ``fh`` from its current position, read in chunks of _CHUNK bytes.

    A line of any length costs at most MAX_LINE_BYTES of memory: past that only its sha256,
    its length and its first bytes are kept.  A last line without a newline is a line; an
    empty file has none.
    """
    offset = 0          # of the current line
    short = bytearray()  # the current line while it is short
    hasher: Any = None  # the current line's sha256 once it is long
    length = 0          # of the current line once it is long
    excerpt = b""

    def line() -> _Line:
        if hasher is None:
            return _Line(offset, len(short), bytes(short), bytes(short[:_EXCERPT_BYTES]), "")
        return _Line(offset, length, None, excerpt, hasher.hexdigest())

    while chunk := fh.read(_CHUNK):  # bounded by the file's size
        view = memoryview(chunk)
        start = 0
        while start < len(chunk):  # each pass consumes one line's piece of the chunk
            nl = chunk.find(b"\n", start)
            end = len(chunk) if nl < 0 else nl
            piece = view[start:end]
            if hasher is None and len(short) + len(piece) <= MAX_LINE_BYTES:
                short += piece
            else:
                if hasher is None:  # the line just became long
                    hasher = hashlib.sha256(short)
                    excerpt = bytes(short[:_EXCERPT_BYTES])
                    length = len(short)
                    if len(excerpt) < _EXCERPT_BYTES:
                        excerpt += bytes(piece[:_EXCERPT_BYTES - len(excerpt)])
                    short = bytearray()
                hasher.update(piece)
                length += len(piece)
            if nl < 0:
                break
            found = line()
            yield found
            offset += found.length + 1
            short, hasher, length, excerpt = bytearray(), None, 0, b""
            start = nl + 1
    if short or hasher is not None:
        yield line()


def _excerpt(data: bytes) -> str:
    """The start of a bad line as a log shows it: at most EXCERPT_CHARS characters."""
    text = data.decode("utf-8", errors="replace")
    return repr(text[:EXCERPT_CHARS]) + ("..." if len(text) > EXCERPT_CHARS else "")


@dataclass
class _Entry:
    """One physical line of a queue file, kept verbatim, with its parse if it is a run.

    ``data`` holds the line's bytes; a line too long to hold (never a run) has ``data``
    None and is copied on a rewrite from ``source`` (the old file, open for the whole
    transaction) at ``span`` (offset, length).
    """

    data: bytes | None
    spec: RunSpec | None
    source: BinaryIO | None = None
    span: tuple[int, int] = (0, 0)

    @classmethod
    def of(cls, spec: RunSpec) -> _Entry:
        return cls(spec.line().encode("utf-8"), spec)


@dataclass(frozen=True)
class _Bad:
    """A line that is not a run, as it is reported."""

    lineno: int
    digest: str
    length: int
    excerpt: bytes
    problem: str


@dataclass(frozen=True)
class Submitted:
    """What :meth:`QueueFile.submit` did with a run.

    ``outcome`` is :data:`QUEUED` (appended), :data:`REPLACED` (a waiting run that
    ``same`` matched now holds the new line, in its place) or :data:`UNCHANGED` (that
    waiting run was already this very run).  ``previous`` is the waiting run found (None
    when queued), ``position`` the run's 1-based place among the queued runs.
    """

    outcome: str
    previous: RunSpec | None
    position: int


QUEUED, REPLACED, UNCHANGED = "queued", "replaced", "unchanged"


class QueueFile:
    """A queue file and its lock.

    Callers use :meth:`read`, :meth:`head`, :meth:`append`, :meth:`submit` and
    :meth:`remove`; each is one locked transaction (:func:`cluster.runtime.pathlock.locked`
    on ``lock_path``: the lock file and its directory, so deleting the lock file while it
    is held lets nobody in).  Never call one from inside another lock of the same
    directory.

    Lines that are not valid runs are skipped by :meth:`read` and kept byte for byte when
    the file is rewritten, so nothing an operator or another tool wrote is ever lost.  Each
    distinct bad line is logged once, ever: with file and line number, its length and at
    most :data:`EXCERPT_CHARS` characters of it; the sha256 of the lines already logged is
    kept in ``<queue>.reported`` beside the queue, pruned to the bad lines still there.  A
    line of any size costs at most :data:`MAX_LINE_BYTES` of memory.

    ``legacy_path`` is the queue's name in an earlier release (``queue`` for ``queue.lst``;
    by default derived with :func:`cluster.home.legacy_queue_name`).  Whenever a
    transaction finds that file it moves it to ``path`` first, under the lock: renamed
    when ``path`` does not exist, else its lines that ``path`` lacks are appended to it;
    then it is removed.  Never a line lost, never ``path`` overwritten; logged once.
    """

    def __init__(self, path: Path, lock_path: Path, legacy_path: Path | None = None) -> None:
        if Path(path) == Path(lock_path):
            # The rewrite replaces the queue's inode; a lock on it would protect nothing.
            raise ValueError(f"queue {path} and its lock file must differ")
        self.path = Path(path)
        self.lock_path = Path(lock_path)
        if legacy_path is None:
            legacy_name = legacy_queue_name(self.path.name)
            legacy_path = None if legacy_name is None else self.path.with_name(legacy_name)
        self.legacy_path = legacy_path
        self.reported_path = self.path.with_name(self.path.name + REPORTED_SUFFIX)
        # The digests of the bad lines this object has reported: it never logs one twice,
        # even if the side file is lost or cannot be written.
        self._warned: set[str] = set()

    @classmethod
    def for_priority(cls, home: Home, priority: int) -> QueueFile:
        """The queue of ``priority`` in master home ``home``."""
        return cls(home.queue(priority), home.queue_lock(priority),
                   home.legacy_queue(priority))

    def __repr__(self) -> str:
        return f"QueueFile({str(self.path)!r})"

    # --- transactions ---------------------------------------------------------------------
    def read(self) -> list[RunSpec]:
        """The queued runs in file order (empty if the file does not exist)."""
        if self.legacy_path is not None and os.path.lexists(self.legacy_path):
            with self._transaction(exclusive=True):
                pass  # the move to the new name needs the exclusive lock
        with self._transaction(exclusive=False) as entries:
            return [e.spec for e in entries if e.spec is not None]

    def head(self) -> RunSpec | None:
        """The first queued run (the current or next one), or None."""
        runs = self.read()
        return runs[0] if runs else None

    def append(self, spec: RunSpec, *, duplicate: bool = False) -> bool:
        """Queue ``spec`` at the end unless an equal run is already queued.

        Returns True if it was added.  Like the Perl, which greps before appending.
        ``duplicate=True`` appends even then (a run queued again behind itself).
        """
        with self._transaction(exclusive=True) as entries:
            if not duplicate and any(e.spec == spec for e in entries):
                logger.debug("%s: %s already queued", self.path, spec)
                return False
            entries.append(_Entry.of(spec))
            self._rewrite(entries)
        logger.info("%s: queued %s", self.path, spec)
        return True

    def submit(self, spec: RunSpec, *, same: Callable[[RunSpec], bool],
               running: RunSpec | None = None, head_running: bool = False) -> Submitted:
        """Queue ``spec``, replacing in place the first waiting run ``same`` matches.

        A run is waiting unless it is the one running: the first run equal to ``running``,
        or the first run of all when ``head_running`` (the running run is known to exist
        but not which it is).  So a request that matches a waiting run takes its place in
        the queue (with the new line if it differs), and one that matches only the running
        run is queued after it, even as an identical second line (:meth:`remove` removes
        one copy only).  See :class:`Submitted` for the result.
        """
        with self._transaction(exclusive=True) as entries:
            runs = [(i, e.spec) for i, e in enumerate(entries) if e.spec is not None]
            busy = _running_index(runs, running, head_running)
            for position, (i, waiting) in enumerate(runs, start=1):
                if i == busy or not same(waiting):
                    continue
                if waiting == spec:
                    logger.debug("%s: %s already waits at position %d", self.path, spec,
                                 position)
                    return Submitted(UNCHANGED, waiting, position)
                entries[i] = _Entry.of(spec)
                self._rewrite(entries)
                logger.info("%s: %s replaces the waiting %s at position %d", self.path, spec,
                            waiting, position)
                return Submitted(REPLACED, waiting, position)
            entries.append(_Entry.of(spec))
            self._rewrite(entries)
        logger.info("%s: queued %s", self.path, spec)
        return Submitted(QUEUED, None, len(runs) + 1)

    def withdraw(self, match: Callable[[RunSpec], bool], *, running: RunSpec | None = None,
                 head_running: bool = False) -> list[RunSpec]:
        """Remove every waiting run ``match`` accepts, in one transaction; return them.

        The running run (as for :meth:`submit`: the first run equal to ``running``, or the
        first run when ``head_running``) stays, while a second copy of its line queued
        behind it goes (what ``clusterpush abort`` needs: :meth:`remove` would take the
        running copy, the first).
        """
        with self._transaction(exclusive=True) as entries:
            runs = [(i, e.spec) for i, e in enumerate(entries) if e.spec is not None]
            busy = _running_index(runs, running, head_running)
            gone = [(i, spec) for i, spec in runs if i != busy and match(spec)]
            if not gone:
                return []
            for i, _spec in reversed(gone):
                del entries[i]
            self._rewrite(entries)
        for _i, spec in gone:
            logger.info("%s: withdrew %s", self.path, spec)
        return [spec for _i, spec in gone]

    def waiting_since(self) -> dict[str, float]:
        """Each queued run that has a ``queue_timeout``: its line -> when it was first
        queued (epoch seconds), in one exclusive transaction.

        The time is taken by the transaction that first wrote the line (:meth:`append`,
        :meth:`submit`), or, for a line written by hand, by the first call that finds it;
        it is kept in the side file ``<queue>.times`` keyed by the line's digest, so it
        survives master restarts.  Two equal lines are one run and share the first one's
        time; a line's time leaves with its last copy."""
        with self._transaction(exclusive=True) as entries:
            return self._note_times(entries)

    def remove(self, spec: RunSpec) -> bool:
        """Remove the first line equal to ``spec`` (not blindly the first line).

        Returns True if a line was removed.  Every other line, corrupt ones and a second
        copy of ``spec`` included, is kept.
        """
        with self._transaction(exclusive=True) as entries:
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

    def promote(self, spec: RunSpec) -> bool:
        """Move the first line equal to ``spec`` before every other run, so it is the queue's
        head (a run whose dependencies are met passing runs that wait, cluster.deps); the
        other lines keep their order.  False when ``spec`` is not queued."""
        with self._transaction(exclusive=True) as entries:
            runs = [i for i, e in enumerate(entries) if e.spec is not None]
            found = next((i for i in runs if entries[i].spec == spec), None)
            if found is None:
                return False
            if found == runs[0]:
                return True
            entries.insert(runs[0], entries.pop(found))
            self._rewrite(entries)
        logger.info("%s: %s moved to the head (the runs before it wait)", self.path, spec)
        return True

    @contextlib.contextmanager
    def holding(self, *, locked: bool = False) -> Iterator[Held]:
        """Hold the queue's exclusive lock for a block: ``held.runs`` are its queued runs,
        ``held.add(spec)`` queues one more at the end.  The added runs are written when the
        block ends, and only if it ends without an exception.  ``locked``: the caller holds
        the lock already (:func:`holding_all`)."""
        with self._transaction(exclusive=True, lock=not locked) as entries:
            held = Held([e.spec for e in entries if e.spec is not None])
            yield held
            if held.added:
                entries.extend(_Entry.of(s) for s in held.added)
                self._rewrite(entries)
        for spec in held.added:
            logger.info("%s: queued %s", self.path, spec)

    # --- internals ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self, *, exclusive: bool, lock: bool = True) -> Iterator[list[_Entry]]:
        """Hold the lock (unless ``lock`` is False: the caller holds it) and yield the
        file's entries; the file stays open for the block (a rewrite copies long lines
        from it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with pathlock.locked(self.lock_path, shared=not exclusive) if lock else \
                contextlib.nullcontext():
            if exclusive:
                self._migrate()
            try:
                fh = open(self.path, "rb")  # noqa: SIM115 -- closed by the with below
            except FileNotFoundError:
                self._report([])
                yield []
                return
            with fh:
                entries, bad = self._load(fh)
                self._report(bad)
                yield entries

    def _load(self, fh: BinaryIO) -> tuple[list[_Entry], list[_Bad]]:
        """Every physical line of ``fh``, parsed where it is a run, and the bad ones."""
        entries: list[_Entry] = []
        bad: list[_Bad] = []
        for lineno, line in enumerate(_scan(fh), start=1):
            span = (line.offset, line.length)
            if line.data is None:
                entries.append(_Entry(None, None, fh, span))
                if not line.excerpt.lstrip(b" \t").startswith(b"#"):  # a long comment is fine
                    bad.append(_Bad(lineno, line.digest(), line.length, line.excerpt,
                                    f"line is {line.length} bytes; expected at most "
                                    f"{MAX_LINE} characters"))
                continue
            # surrogateescape: undecodable bytes are refused by the parser, and the entry
            # keeps the bytes themselves for a rewrite.
            raw = line.data.decode("utf-8", errors="surrogateescape")
            stripped = raw.strip(" \t\r")
            spec: RunSpec | None = None
            if stripped and not stripped.startswith("#"):
                try:
                    spec = RunSpec.parse(raw, str(self.path), lineno)
                except QueueLineError as exc:
                    bad.append(_Bad(lineno, line.digest(), line.length, line.excerpt,
                                    _cut(exc.problem)))
            entries.append(_Entry(line.data, spec))
        return entries, bad

    def _report(self, bad: list[_Bad]) -> None:
        """Log the bad lines not logged before (in any process), and remember them.

        The side file holds the digests of the bad lines present at the last look; it is
        read and rewritten under its own flock, so two readers holding the queue's shared
        lock do not both log a line.  It is a memory of what was said, not data: if it is
        lost, a bad line is logged once more; if it cannot be written (a reader without
        write access to the home), this object's own memory is used.
        """
        side = self.reported_path
        if not bad:
            self._warned = set()
            if os.path.lexists(side):
                with contextlib.suppress(OSError):
                    os.unlink(side)
            return
        present: dict[str, _Bad] = {}
        for b in bad:
            present.setdefault(b.digest, b)
        try:
            fd = os.open(side, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o664)
        except OSError as exc:
            logger.debug("%s: cannot keep the reported bad lines (%s)", side, exc)
            self._log_bad(present, set())
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            known = set(_read_all(fd).decode("ascii", errors="replace").split())
            self._log_bad(present, known)
            if set(present) != known:
                data = "".join(d + "\n" for d in sorted(present)).encode("ascii")
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
        except OSError as exc:
            logger.debug("%s: cannot keep the reported bad lines (%s)", side, exc)
        finally:
            os.close(fd)

    def _log_bad(self, present: dict[str, _Bad], known: set[str]) -> None:
        """Log the bad lines of ``present`` (digest -> line) that neither ``known`` nor
        this object has reported."""
        new = [b for d, b in present.items() if d not in known and d not in self._warned]
        for b in new[:MAX_REPORTED]:
            logger.warning("%s:%d: skipping a bad queue line of %d bytes (kept in the file, "
                           "logged once): %s; it starts %s", self.path, b.lineno, b.length,
                           b.problem, _excerpt(b.excerpt))
        if len(new) > MAX_REPORTED:
            logger.warning("%s: %d more bad queue lines skipped (kept in the file, not "
                           "logged one by one)", self.path, len(new) - MAX_REPORTED)
        # Pruned like the side file: a line that leaves the file and comes back is new.
        self._warned = set(present)

    def _migrate(self) -> None:
        """Move the queue of an earlier release's name to ``path``.  Caller holds the
        exclusive lock."""
        legacy = self.legacy_path
        if legacy is None:
            return
        try:
            st = os.lstat(legacy)
        except FileNotFoundError:
            return
        if not stat.S_ISREG(st.st_mode):
            if legacy not in _ODD_LEGACY:
                _ODD_LEGACY.add(legacy)
                logger.error("%s is not a regular file; left alone (expected the queue of an "
                             "earlier release, to be moved to %s)", legacy, self.path)
            return
        try:
            # link, not rename: it fails if the new name exists, so it can never be lost.
            os.link(legacy, self.path, follow_symlinks=False)
        except FileExistsError:
            moved, kept = self._merge(legacy)
            how = (f"appended its {moved} line(s) that {self.path.name} lacked "
                   f"({kept} were there already)")
        except OSError:  # no hard links on this file system: the merge does it
            moved, kept = self._merge(legacy)
            how = f"copied its {moved} line(s) into {self.path.name}"
        else:
            how = f"renamed it {self.path.name}"
        fsutil.fsync_dir(self.path.parent)
        os.unlink(legacy)
        fsutil.fsync_dir(self.path.parent)
        logger.warning("%s: the queue's name in an earlier release; %s and removed it "
                       "(seed 000 names the queues queue.lst, queue.1.lst, queue.2.lst)",
                       legacy, how)

    def _merge(self, legacy: Path) -> tuple[int, int]:
        """Append to ``path`` the lines of ``legacy`` it lacks; (appended, already there)."""
        with open(legacy, "rb") as old, contextlib.ExitStack() as stack:
            try:
                cur: BinaryIO | None = stack.enter_context(open(self.path, "rb"))
            except FileNotFoundError:
                cur = None
            entries: list[_Entry] = []
            have: set[str] = set()
            if cur is not None:
                for line in _scan(cur):
                    entries.append(_Entry(line.data, None, cur, (line.offset, line.length)))
                    have.add(line.digest())
            moved = kept = 0
            for line in _scan(old):
                if line.data is not None and not line.data.strip(b" \t\r"):
                    continue  # blank lines carry nothing
                digest = line.digest()
                if digest in have:
                    kept += 1
                    continue
                have.add(digest)
                entries.append(_Entry(line.data, None, old, (line.offset, line.length)))
                moved += 1
            self._rewrite(entries)
        return moved, kept

    def _rewrite(self, entries: list[_Entry]) -> None:
        """Atomically replace the queue file with ``entries``.  Caller holds the lock."""

        def pieces() -> Iterator[str]:
            # latin-1 maps each byte to one character and back: the bytes go through the
            # text writer of fsutil.atomic_write unchanged.
            for e in entries:
                if e.data is not None:
                    yield (e.data + b"\n").decode("latin-1")
                    continue
                assert e.source is not None  # a long line is always copied from its file
                offset, left = e.span
                while left > 0:  # each pass copies at most _CHUNK bytes of the line
                    chunk = os.pread(e.source.fileno(), min(left, _CHUNK), offset)
                    if not chunk:
                        raise ClusterError(f"{self.path} shrank while locked; expected "
                                           "every writer to hold its lock")
                    yield chunk.decode("latin-1")
                    offset += len(chunk)
                    left -= len(chunk)
                yield "\n"

        fsutil.atomic_write(self.path, pieces(), encoding="latin-1")
        fsutil.fsync_dir(self.path.parent)
        self._note_times(entries)

    def _note_times(self, entries: list[_Entry]) -> dict[str, float]:
        """Bring the side file of enqueue times in line with ``entries`` (a run without a
        time gets now; a time without its run goes) and return line -> time.  Caller holds
        the exclusive lock.  An unreadable entry of the file is dropped (its run's time
        starts again now: a bounded loss, logged)."""
        path = self.path.with_name(self.path.name + TIMES_SUFFIX)
        known: dict[str, float] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text(encoding="ascii", errors="replace").splitlines():
                digest, _, stamp = line.partition(" ")
                try:
                    known[digest] = float(stamp)
                except ValueError:
                    logger.warning("%s: bad line %.80r ignored; expected '<digest> <time>'",
                                   path, line)
        now = time.time()
        # Only the runs that have a queue_timeout need their time (no side file otherwise).
        lines = {e.spec.line() for e in entries
                 if e.spec is not None and e.spec.option("queue_timeout") is not None}
        digests = {line: hashlib.sha256(line.encode("utf-8")).hexdigest() for line in lines}
        kept = {d: known.get(d, now) for d in digests.values()}
        if kept != known:
            if kept:
                fsutil.atomic_write(path, "".join(f"{d} {t:.3f}\n"
                                                  for d, t in sorted(kept.items())))
            else:
                path.unlink(missing_ok=True)
        return {line: kept[d] for line, d in digests.items()}


@dataclass
class Held:
    """A queue held by :meth:`QueueFile.holding`: its runs, and the runs to add."""

    runs: list[RunSpec]
    added: list[RunSpec] = field(default_factory=list)

    def add(self, spec: RunSpec) -> None:
        self.added.append(spec)


@contextlib.contextmanager
def holding_all(queues: list[QueueFile]) -> Iterator[list[Held]]:
    """Hold several queues of one home at once (their locks share the home's directory
    lock: nesting :meth:`QueueFile.holding` would deadlock): one :class:`Held` per queue,
    in the order given.  Their added runs are written when the block ends without an
    exception, and none of them otherwise (a graph of runs queued all or none)."""
    if not queues:
        yield []
        return
    queues[0].path.parent.mkdir(parents=True, exist_ok=True)
    with pathlock.locked_together([q.lock_path for q in queues]), \
            contextlib.ExitStack() as stack:
        yield [stack.enter_context(q.holding(locked=True)) for q in queues]


def _running_index(runs: list[tuple[int, RunSpec]], running: RunSpec | None,
                   head_running: bool) -> int | None:
    """The entry index of the running run among ``runs`` (entry index, run), or None: the
    first run equal to ``running``, or the first run of all when ``head_running``."""
    if head_running:
        return runs[0][0] if runs else None
    if running is None:
        return None
    return next((i for i, spec in runs if spec == running), None)


#: Legacy queue paths that are not regular files, already reported by this process.
_ODD_LEGACY: set[Path] = set()


def _cut(text: str, limit: int = 2 * EXCERPT_CHARS) -> str:
    """``text`` cut to ``limit`` characters (a problem may quote a long word of the line)."""
    return text if len(text) <= limit else text[:limit] + "..."


def _read_all(fd: int, limit: int = 64 << 20) -> bytes:
    """The content of the small file open at ``fd`` (at most ``limit`` bytes)."""
    parts: list[bytes] = []
    offset = 0
    while offset < limit:  # bounded by limit
        chunk = os.pread(fd, min(_CHUNK, limit - offset), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)
