"""Which node process was handed which jobs: in memory, and kept for a master that takes
the run over.

A result is taken only from the node process a job was handed to
(:meth:`cluster.master.state.runstate.RunState.handle`): :class:`Leases` keeps, per job, the
numbers of the (node, session) pairs that were handed it.  A master that dies takes that
memory with it, and its successor would refuse every result the nodes still carry for
jobs handed out before the takeover (they would be run again: honest, but wasted).  So
each lease is also appended to a file (:class:`LeaseLog`, the ``log`` hook of
:class:`Leases`), one line per JOBS reply, before the reply goes out::

    <node> <session> <ranges>        ranges: job indexes as ``a-b`` or ``a``, comma-joined

(``-`` for a node that signs with no session).  The usual batch is one range, so a line is
a few dozen bytes: one ``write()`` per JOBS reply on an O_APPEND descriptor, never per
job, not fsync'ed (it must survive the master process, which the page cache does; a
machine crash loses at most leases, whose results are then run again).  A torn or
malformed line (a master killed mid-write, an edited file) is skipped on load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from cluster.master.model.joblist import consecutive

log = logging.getLogger("cluster.leases")

#: The leases file in ``runs/<id>/``.
LEASES_FILE = "leases"
#: A session as the file writes it (the nonce's session part, or ``-``).
_SESSION = re.compile(r"-|[0-9a-f]{1,64}")
_RANGE = re.compile(r"(\d{1,10})(?:-(\d{1,10}))?")


def format_ranges(indexes: Sequence[int]) -> str:
    """``indexes`` (ascending or not) as comma-joined ``a-b``/``a`` ranges, in their order."""
    if consecutive(indexes):
        first, last = indexes[0], indexes[-1]
        return f"{first}-{last}" if last > first else str(first)
    out: list[str] = []
    start = prev = indexes[0]
    for i in indexes[1:]:
        if i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = i
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def parse_ranges(text: str, total: int) -> list[int]:
    """The job indexes of ``text`` (:func:`format_ranges`); ValueError when a word is not a
    range or names an index outside ``0..total-1``."""
    out: list[int] = []
    for word in text.split(","):
        match = _RANGE.fullmatch(word)
        if match is None:
            raise ValueError(f"expected a job index or a range a-b, got {word[:40]!r}")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if not first <= last < total:
            raise ValueError(f"range {word!r} is outside the run's {total} jobs")
        out.extend(range(first, last + 1))
    return out


def read_leases(path: Path, total: int) -> Iterator[tuple[str, str, list[int]]]:
    """(node, session, job indexes) of each whole, well-formed line of ``path`` (nothing
    when there is no file); a bad line is logged once with the count of them."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    bad = 0
    lines = data.split(b"\n")
    for raw in lines[:-1]:  # the last piece has no newline: torn, or empty
        try:
            node, session, ranges = raw.decode("utf-8").split(" ")
            if not node or not _SESSION.fullmatch(session):
                raise ValueError("bad node or session")
            indexes = parse_ranges(ranges, total)
        except ValueError:
            bad += 1
            continue
        yield node, "" if session == "-" else session, indexes
    if bad:
        log.warning("%s: %d malformed line(s) skipped (expected '<node> <session> "
                    "<ranges>'); their jobs' results are refused and run again", path, bad)


class LeaseLog:
    """The append side: :meth:`append` is a :class:`Leases`' ``log`` hook."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def append(self, node: str, session: str, indexes: Sequence[int]) -> None:
        os.write(self._fd, f"{node} {session or '-'} {format_ranges(indexes)}\n".encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


#: What is told each lease as it is made (node, session, job indexes).
LeaseHook = Callable[[str, str, Sequence[int]], None]


class Leases:
    """Who was handed each of a run's ``total`` jobs, ever: ``lessee[i]`` is the number of
    the first node process (a (name, session) pair) given job i, -1 for none yet, and
    ``more[i]`` the others for the few jobs handed out again.  4 bytes a job, not a set per
    node: sized for a million jobs.  A number is never -1, so "no lessee" never matches "a
    process handed nothing" (:meth:`holds`); a restarted node under the same name is
    another process and holds none of its predecessor's leases."""

    def __init__(self, total: int) -> None:
        self.numbers: dict[tuple[str, str], int] = {}
        #: The (name, session) of each number, in number order (:meth:`lessees`).
        self.processes: list[tuple[str, str]] = []
        self.lessee = array("i", [-1]) * total
        self.more: dict[int, set[int]] = {}
        #: Told every lease :meth:`grant` makes (a :class:`LeaseLog`'s ``append``; None:
        #: not kept).
        self.log: LeaseHook | None = None

    def grant(self, name: str, session: str, indexes: list[int]) -> None:
        """Node ``name``'s process ``session`` was handed the jobs ``indexes``."""
        if self.log is not None:
            self.log(name, session, indexes)
        self._mark(self._number(name, session), indexes)

    def _number(self, name: str, session: str) -> int:
        """The number of node ``name``'s process ``session`` (a new one when it has none)."""
        number = self.numbers.get((name, session))
        if number is None:
            number = self.numbers[(name, session)] = len(self.processes)
            self.processes.append((name, session))
        return number

    def load(self, leases: Iterable[tuple[str, str, list[int]]]) -> int:
        """The leases an earlier master of the run made (:func:`read_leases`), not logged
        again; how many jobs they name."""
        count = 0
        for name, session, indexes in leases:
            if indexes:
                self._mark(self._number(name, session), indexes)
                count += len(indexes)
        return count

    def holds(self, i: int, name: str, session: str) -> bool:
        """Whether job ``i`` was handed to node ``name``'s process ``session`` (and not
        released since)."""
        number = self.numbers.get((name, session), -1)
        return number >= 0 and (self.lessee[i] == number or number in self.more.get(i, ()))

    def lessees(self, i: int) -> list[tuple[str, str]]:
        """The (name, session) of every node process that holds a lease of job ``i``: the
        first, then those it was handed to again (a tail copy: two)."""
        first = self.lessee[i]
        if first < 0:
            return []
        processes = self.processes
        return [processes[first], *(processes[n] for n in sorted(self.more.get(i, ())))]

    def release(self, i: int, name: str, session: str) -> None:
        """Node ``name``'s process ``session`` no longer holds a lease of job ``i`` (its
        try was put back)."""
        number = self.numbers.get((name, session), -1)
        if number < 0:
            return
        if self.lessee[i] == number:
            others = self.more.pop(i, set())
            self.lessee[i] = others.pop() if others else -1
            if others:
                self.more[i] = others
        else:
            self.more.get(i, set()).discard(number)

    def _mark(self, number: int, indexes: list[int]) -> None:
        lessee, more = self.lessee, self.more
        first, n = indexes[0], len(indexes)
        if consecutive(indexes) and lessee[first:first + n].count(-1) == n:
            # Jobs never handed out before, in order (the usual batch): one slice.
            lessee[first:first + n] = array("i", [number]) * n
            return
        for i in indexes:
            first = lessee[i]
            if first < 0:
                lessee[i] = number
            elif first != number:
                more.setdefault(i, set()).add(number)
