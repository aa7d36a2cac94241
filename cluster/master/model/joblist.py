"""A run's job list by index: the names in memory, the lines where they are cheapest.

The master hands out a million job lines per run, and keeps a million names to recognise
results by.  A :class:`cluster.records.Job` per job (three strings and an object, some 450
bytes for a gs job) would take half a gigabyte, so
:class:`~cluster.master.state.runstate.RunState` works on a :class:`JobList` instead: job *i*
has a name (``names[i]``, ``index[name] == i``) and a line, read in bulk by
:meth:`JobList.lines`.

* :class:`MemoryJobList` keeps the lines in memory (tests, small runs).
* :class:`JobFile` keeps only the byte range of each line of the jobs file and reads a batch
  of lines with one ``pread`` per run of consecutive lines: the master hands jobs out in
  file order, so a batch of 50 jobs is usually a single read.  About 150 bytes per job stay
  in memory (the name, its dict entry, two offsets) whatever the length of the commands.

A job line may carry the job's own timeout in place of ``true`` (``timeout=<seconds>``,
:func:`cluster.records.timed_line`; docs/results.md, "Timeouts that fit each test"): the
master writes it into the jobs file when it orders it (:mod:`cluster.master.model.joborder`),
so the lines go to the nodes as they are read.

The jobs file is what build.py printed: one ``<test> <logfile> true ; <command>`` per line.
Blank lines are skipped; a malformed line, or a second line with a test id already used, is
skipped and counted in :attr:`JobFile.skipped` (the first few are described in
:attr:`JobFile.problems`), as the master used to skip them one :meth:`Job.parse` at a time.
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

from cluster.records import Job

#: A job line as :meth:`cluster.records.Job.parse` accepts it (test id: records.TEST_ID).
_JOB_LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.+,@%=-]{0,400}) [^ ]* "
                       r"(?:true|timeout=[0-9][0-9.e+-]{0,20}) ; (.*)", re.S)
#: Bytes read from the jobs file at a time while indexing it.
_CHUNK = 1 << 22
#: Problems described one by one; beyond that they are only counted.
MAX_PROBLEMS = 20


def consecutive(indexes: Sequence[int]) -> bool:
    """Whether ``indexes`` are ``i, i+1, ..., i+n-1`` (n >= 1): a batch handed out from the
    list in order, or reported back in order.  Then the per-job arrays of the master (the
    jobs file's offsets, the results, the holders, the lessees) are read or set as one
    slice.  Checked in C: the ends first, then one list comparison."""
    n = len(indexes)
    if not n:
        return False
    first = indexes[0]
    return indexes[-1] - first == n - 1 and list(indexes) == list(range(first, first + n))


class JobList:
    """The jobs of a run, by index.  Subclasses provide :meth:`lines`."""

    names: list[str]
    index: dict[str, int]

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.index

    def line(self, i: int) -> str:
        return self.lines([i])[0]

    def lines(self, indexes: Sequence[int]) -> list[str]:
        """The job lines of ``indexes``, in that order (without newlines)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the list holds open (nothing, unless it reads a file)."""


class MemoryJobList(JobList):
    """Job lines kept in memory.  A repeated test id keeps its first job."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.names = []
        self.index = {}
        self._lines: list[str] = []
        for job in jobs:
            if job.name in self.index:
                continue
            self.index[job.name] = len(self.names)
            self.names.append(job.name)
            self._lines.append(job.line)

    def lines(self, indexes: Sequence[int]) -> list[str]:
        got = self._lines
        return [got[i] for i in indexes]


class JobFile(JobList):
    """The lines of a jobs file, read on demand; see the module docstring.

    Raises ValueError if the file is not UTF-8 text, OSError if it cannot be read.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names = []
        self.index = {}
        self.starts = array("q")
        self.ends = array("q")  # exclusive; the newline (if any) is at ends[i]
        self.skipped = 0
        self.problems: list[str] = []
        #: Whether each job's line directly follows the one before (no blank or skipped
        #: line between): then consecutive jobs are always one read.
        self.dense = True
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self._scan()
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise

    def _problem(self, lineno: int, what: str) -> None:
        self.skipped += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{self.path}:{lineno}: skipping bad job line: {what}")

    def _scan(self) -> None:
        names, index, starts, ends = self.names, self.index, self.starts, self.ends
        match = _JOB_LINE.fullmatch
        offset = 0        # file offset of ``rest``
        rest = b""        # an incomplete last line carried to the next chunk
        lineno = 0
        while True:
            chunk = os.read(self.fd, _CHUNK)
            data = rest + chunk if rest else chunk
            if not chunk:
                if not data:
                    break
                cut = len(data)  # a last line without a newline
            else:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    rest = data
                    continue
            block, rest = data[:cut], data[cut:]
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{self.path}: not UTF-8 text near byte "
                                 f"{offset + exc.start}") from None
            ascii_only = text.isascii()
            pos = offset
            for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
                lineno += 1
                size = len(line) if ascii_only else len(line.encode("utf-8"))
                start = pos
                pos += size + 1
                if not line.strip():
                    continue
                m = match(line)
                if m is None:
                    self._problem(lineno, "expected '<test> <logfile> true ; <command>' "
                                  "with a test id of [A-Za-z0-9_.+,@%=-]")
                    continue
                if not m.group(2).strip():
                    self._problem(lineno, "empty command")
                    continue
                name = m.group(1)
                if name in index:
                    self._problem(lineno, f"test id {name} is used by an earlier line")
                    continue
                if names and start != ends[-1] + 1:
                    self.dense = False
                index[name] = len(names)
                names.append(name)
                starts.append(start)
                ends.append(start + size)
            offset += cut
            if not chunk:
                break

    def lines(self, indexes: Sequence[int]) -> list[str]:
        starts, ends = self.starts, self.ends
        n = len(indexes)
        if self.dense and consecutive(indexes):
            # The usual batch: consecutive jobs of a file without gaps, one read and no
            # Python step per job.
            return self._read(starts[indexes[0]], ends[indexes[-1]]).split("\n")
        out: list[str] = []
        k = 0
        while k < n:
            first = indexes[k]
            last = first
            j = k + 1
            # Extend the run while the next job is the next line of the file.
            while j < n and indexes[j] == last + 1 and starts[last + 1] == ends[last] + 1:
                last += 1
                j += 1
            out.extend(self._read(starts[first], ends[last]).split("\n"))
            k = j
        return out

    def _read(self, begin: int, end: int) -> str:
        data = os.pread(self.fd, end - begin, begin)
        if len(data) != end - begin:
            raise OSError(f"{self.path}: short read (the file changed under the master)")
        return data.decode("utf-8")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def as_job_list(jobs: JobList | Iterable[Job]) -> JobList:
    return jobs if isinstance(jobs, JobList) else MemoryJobList(jobs)
