"""Queue files of the master: the locked file of each priority's queued runs.

A master home holds one queue per priority (``queue.lst``, ``queue.1.lst``, ``queue.2.lst``,
seed 000's names; see :class:`cluster.home.Home`).  Each line is one run waiting to be done,
and the first line is the current or next run (ARTIFEX.md §2.1/§2.2); priority 0, which
several lanes serve at once (:mod:`cluster.lanes`), has a running run per busy lane at its
front, each named by its lane's job.start.  A line's grammar is
:class:`cluster.runspec.RunSpec`'s.  Blank lines and lines starting with ``#`` are ignored.

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
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from cluster.errors import ClusterError, QueueLineError
from cluster.home import Home, legacy_queue_name
from cluster.queuebadlines import EXCERPT_BYTES, BadLine, BadLineLog, cut
from cluster.runspec import MAX_LINE, RunSpec
from cluster.runtime import fsutil, linescan, pathlock

logger = logging.getLogger("cluster.queue")

#: A line longer than this many bytes cannot be a run (MAX_LINE characters of at most four
#: UTF-8 bytes, and a CR): it is never held in memory, only hashed, shown in part, and
#: copied through from the old file on a rewrite.
MAX_LINE_BYTES = 4 * MAX_LINE + 1
#: Suffix of the side file of the queued runs' enqueue times (``queue.lst.times``; the
#: ``queue_timeout`` of docs/runoptions.md, section 3): ``<sha256 of the run's line>
#: <epoch seconds>`` lines.
TIMES_SUFFIX = ".times"
_CHUNK = linescan.CHUNK


def _scan(fh: BinaryIO) -> Iterator[linescan.Line]:
    """Every line of ``fh`` from its current position; one longer than MAX_LINE_BYTES is
    held only as its digest, length, offset and first bytes."""
    return linescan.scan(fh, keep=MAX_LINE_BYTES, excerpt_bytes=EXCERPT_BYTES)


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

#: The running run(s) a transaction must not touch: one run, several (priority 0 has a
#: running run per busy lane: cluster.lanes), or None.
Running = RunSpec | Sequence[RunSpec] | None


class QueueFile:
    """A queue file and its lock.

    Callers use :meth:`read`, :meth:`head`, :meth:`append`, :meth:`submit` and
    :meth:`remove`; each is one locked transaction (:func:`cluster.runtime.pathlock.locked`
    on ``lock_path``: the lock file and its directory, so deleting the lock file while it
    is held lets nobody in).  Never call one from inside another lock of the same
    directory.

    Lines that are not valid runs are skipped by :meth:`read` and kept byte for byte when
    the file is rewritten, so nothing an operator or another tool wrote is ever lost.  Each
    distinct bad line is logged once, ever (:class:`cluster.queuebadlines.BadLineLog`,
    which keeps ``<queue>.reported`` beside the queue).  A line of any size costs at most
    :data:`MAX_LINE_BYTES` of memory.

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
        self._bad_lines = BadLineLog(self.path, logger)
        self.reported_path = self._bad_lines.path

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
               running: Running = None, head_running: bool = False) -> Submitted:
        """Queue ``spec``, replacing in place the first waiting run ``same`` matches.

        A run is waiting unless it is running: ``running`` is the running run or a sequence
        of them (priority 0 runs one per busy lane), each the first line equal to it that
        no other one took; ``head_running`` says a run is running whose line is not known
        (an unreadable job.start): the first run none of ``running`` took is taken to be
        it.  So a request that matches a waiting run takes its place in the queue (with the
        new line if it differs), and one that matches only a running run is queued after
        it, even as an identical second line (:meth:`remove` removes one copy only).  See
        :class:`Submitted` for the result.
        """
        with self._transaction(exclusive=True) as entries:
            runs = [(i, e.spec) for i, e in enumerate(entries) if e.spec is not None]
            busy = running_indices(runs, running, head_running)
            for position, (i, waiting) in enumerate(runs, start=1):
                if i in busy or not same(waiting):
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

    def withdraw(self, match: Callable[[RunSpec], bool], *, running: Running = None,
                 head_running: bool = False) -> list[RunSpec]:
        """Remove every waiting run ``match`` accepts, in one transaction; return them.

        The running runs (as for :meth:`submit`: the first line equal to each of
        ``running``, and the first other run when ``head_running``) stay, while a second
        copy of a running line queued behind it goes (what ``clusterpush abort`` needs:
        :meth:`remove` would take the running copy, the first).
        """
        with self._transaction(exclusive=True) as entries:
            runs = [(i, e.spec) for i, e in enumerate(entries) if e.spec is not None]
            busy = running_indices(runs, running, head_running)
            gone = [(i, spec) for i, spec in runs if i not in busy and match(spec)]
            if not gone:
                return []
            for i, _spec in reversed(gone):
                del entries[i]
            self._rewrite(entries)
        for _i, spec in gone:
            logger.info("%s: withdrew %s", self.path, spec)
        return [spec for _i, spec in gone]

    def replace(self, old: RunSpec, new: RunSpec, *, running: Running = None) -> bool:
        """Rewrite the first waiting line equal to ``old`` as ``new``, in its place, in one
        transaction (``clusteradmin order``); the running runs (as for :meth:`submit`) are
        never touched.  False when no waiting run is ``old`` (it started or left)."""
        with self._transaction(exclusive=True) as entries:
            runs = [(i, e.spec) for i, e in enumerate(entries) if e.spec is not None]
            busy = running_indices(runs, running, False)
            found = next((i for i, spec in runs if i not in busy and spec == old), None)
            if found is None:
                return False
            entries[found] = _Entry.of(new)
            self._rewrite(entries, carry=(old.line(), new.line()))
        logger.info("%s: %s rewritten as %s", self.path, old, new)
        return True

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

    def promote(self, spec: RunSpec, *, behind: Sequence[RunSpec] = ()) -> bool:
        """Move the first line equal to ``spec`` before every other run, so it is the queue's
        head (a run whose dependencies are met passing runs that wait, cluster.deps); the
        other lines keep their order.  ``behind``: the runs other lanes of the queue serve
        (cluster.master.run.nextrun): one copy of each stays before ``spec``, so the running
        runs are the queue's first lines.  False when ``spec`` is not queued."""
        with self._transaction(exclusive=True) as entries:
            runs = [i for i, e in enumerate(entries) if e.spec is not None]
            ahead = running_indices([(i, e.spec) for i, e in enumerate(entries)
                                     if e.spec is not None], behind, False)
            found = next((i for i in runs if entries[i].spec == spec and i not in ahead),
                         None)
            if found is None:
                return False
            # Where it goes: before the first run that is neither running nor it.
            place = next((i for i in runs if i not in ahead), found)
            if found == place:
                return True
            entries.insert(place, entries.pop(found))
            self._rewrite(entries)
        logger.info("%s: %s moved to the front (the runs before it wait)", self.path, spec)
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
                self._bad_lines.report([])
                yield []
                return
            with fh:
                entries, bad = self._load(fh)
                self._bad_lines.report(bad)
                yield entries

    def _load(self, fh: BinaryIO) -> tuple[list[_Entry], list[BadLine]]:
        """Every physical line of ``fh``, parsed where it is a run, and the bad ones."""
        entries: list[_Entry] = []
        bad: list[BadLine] = []
        for lineno, line in enumerate(_scan(fh), start=1):
            span = (line.offset, line.length)
            if line.data is None:
                entries.append(_Entry(None, None, fh, span))
                if not line.excerpt.lstrip(b" \t").startswith(b"#"):  # a long comment is fine
                    bad.append(BadLine(lineno, line.digest(), line.length, line.excerpt,
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
                    bad.append(BadLine(lineno, line.digest(), line.length, line.excerpt,
                                    cut(exc.problem)))
            entries.append(_Entry(line.data, spec))
        return entries, bad

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

    def _rewrite(self, entries: list[_Entry], carry: tuple[str, str] | None = None) -> None:
        """Atomically replace the queue file with ``entries``.  Caller holds the lock.
        ``carry`` (old line, new line): the new line keeps the old one's enqueue time."""

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
        self._note_times(entries, carry)

    def _note_times(self, entries: list[_Entry],
                    carry: tuple[str, str] | None = None) -> dict[str, float]:
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
        if carry is not None:  # a rewritten line waits since its old line was queued
            old, new = (hashlib.sha256(x.encode("utf-8")).hexdigest() for x in carry)
            if old in known:
                known = {**known, new: known.get(new, known[old])}
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


def running_indices(runs: list[tuple[int, RunSpec]], running: Running,
                     head_running: bool) -> set[int]:
    """The entry indexes of the running runs among ``runs`` (entry index, run): for each of
    ``running`` in turn, the first run equal to it not already taken (two lanes running
    the same line hold its first two copies); then, when ``head_running``, the first run
    not taken (a running run whose line is unknown: running runs are at the queue's
    front)."""
    wanted: Sequence[RunSpec] = () if running is None else \
        (running,) if isinstance(running, RunSpec) else running
    busy: set[int] = set()
    for want in wanted:
        found = next((i for i, spec in runs if i not in busy and spec == want), None)
        if found is not None:
            busy.add(found)
    if head_running:
        first = next((i for i, _spec in runs if i not in busy), None)
        if first is not None:
            busy.add(first)
    return busy


#: Legacy queue paths that are not regular files, already reported by this process.
_ODD_LEGACY: set[Path] = set()
