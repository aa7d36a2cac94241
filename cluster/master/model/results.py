"""A run's results, sized for a million jobs: each first result kept as its journal line.

:class:`Results` keeps the first result of each job as its journal line (the format is
:mod:`cluster.master.files.journal`'s) in one bytearray, indexed by job, about 100 bytes a result
instead of a JobResult object.  :class:`ResultTable` shows them as the run's ``.tab`` table
without making a million TabRow objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from itertools import accumulate

from cluster.master.files.journal import journal_result, split_line
from cluster.master.model.joblist import JobList, consecutive
from cluster.records import JobResult
from cluster.report.tab import TabRow


def _tab_fields(line: str) -> tuple[str, list[str]]:
    """(machine, [name, error, t1, t2, t3, md5, product]) of a journal line."""
    machine, text = split_line(line)
    return machine, text.split(" ", 6)


class Results(Mapping[str, JobResult]):
    """The first result of each job, as journal lines in one bytearray, by job index.

    A read-only mapping test name -> JobResult for callers that want objects (built on
    demand); the master uses the index methods and :meth:`tab_line`.
    """

    def __init__(self, jobs: JobList) -> None:
        self.jobs = jobs
        self._index_get = jobs.index.get
        self.offsets = array("q", [-1]) * len(jobs)  # into text; -1: no result yet
        self.text = bytearray()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __contains__(self, name: object) -> bool:
        i = self._index_get(name) if isinstance(name, str) else None
        return i is not None and self.offsets[i] >= 0

    def __getitem__(self, name: str) -> JobResult:
        i = self.jobs.index.get(name)
        if i is None or self.offsets[i] < 0:
            raise KeyError(name)
        return journal_result(self.line(i))

    def __iter__(self) -> Iterator[str]:
        names, offsets = self.jobs.names, self.offsets
        return (names[i] for i in range(len(names)) if offsets[i] >= 0)

    def has(self, i: int) -> bool:
        """Whether job ``i`` has a result."""
        return self.offsets[i] >= 0

    def line(self, i: int) -> str:
        """The journal line (no newline) of job ``i``'s result; it must have one."""
        start = self.offsets[i]
        return self.text[start:self.text.index(b"\n", start)].decode("utf-8")

    def add(self, indexes: list[int], lines: list[str], prefix: str = "") -> bytes:
        """Record the journal lines ``prefix + line`` of jobs ``indexes`` (which have no
        result yet).  ``prefix`` is a journal line's machine part
        (:func:`cluster.master.files.journal.line_prefix`), the same for all of them.

        Returns the lines as the bytes to journal.
        """
        if not indexes:
            return b""
        joined = prefix + f"\n{prefix}".join(lines) + "\n"
        data = joined.encode("utf-8")
        text, offsets = self.text, self.offsets
        pos = len(text)
        if joined.isascii():  # chars are bytes: each line's size is its length, in C
            sizes = map((len(prefix) + 1).__add__, map(len, lines))
            if consecutive(indexes):
                # A batch reported in order: one slice assignment.
                starts = array("q", accumulate(sizes, initial=pos))
                starts.pop()
                offsets[indexes[0]:indexes[0] + len(indexes)] = starts
            else:
                for i, size in zip(indexes, sizes, strict=True):
                    offsets[i] = pos
                    pos += size
        else:
            for i, line in zip(indexes, lines, strict=True):
                offsets[i] = pos
                pos += len((prefix + line).encode("utf-8")) + 1
        text += data
        self.count += len(indexes)
        return data

    def tab_line(self, i: int, rev: str) -> str:
        """Job ``i``'s result as a ``.tab`` line (the line TabRow.from_result would write)."""
        machine, (name, err, t1, t2, t3, md5, product) = _tab_fields(self.line(i))
        return "\t".join((name, err, t1, t2, t3, "0", md5 if err == "0" else "0", rev,
                          product, "" if machine == "-" else machine))

    def tab_row(self, i: int, rev: str) -> TabRow:
        """Job ``i``'s result as a TabRow at revision ``rev``."""
        machine, (name, err, t1, t2, t3, md5, product) = _tab_fields(self.line(i))
        return TabRow(name, int(err), float(t1), float(t2), float(t3),
                      md5 if err == "0" else "0", rev, product,
                      "" if machine == "-" else machine)

    def table(self, rev: str) -> ResultTable:
        """The results as a ``.tab`` table at revision ``rev`` (rows made on demand)."""
        return ResultTable(self, rev)


class ResultTable(Mapping[str, TabRow]):
    """A run's results as a read-only table name -> TabRow, sorted by name.

    It stands in for :func:`cluster.report.tab.collate`'s dict, whose million TabRow objects
    would not fit the master's memory budget: rows are made when asked for, and
    :meth:`lines` gives the ``.tab`` lines for :func:`cluster.report.tab.write_tab_lines`.
    """

    def __init__(self, results: Results, rev: str) -> None:
        self.results = results
        self.rev = rev
        names, offsets = results.jobs.names, results.offsets
        self.names = sorted([names[i] for i in range(len(names)) if offsets[i] >= 0])

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.results

    def __getitem__(self, name: str) -> TabRow:
        i = self.results.jobs.index.get(name)
        if i is None or not self.results.has(i):
            raise KeyError(name)
        return self.results.tab_row(i, self.rev)

    def brief(self, name: str) -> tuple[int, str, str]:
        """(error, md5 or "0" on error, product) of ``name``: what report.analyse needs of
        every row, without making the row."""
        i = self.results.jobs.index[name]
        _, (_, err, _, _, _, md5, product) = _tab_fields(self.results.line(i))
        return int(err), md5 if err == "0" else "0", product

    def line(self, name: str) -> str:
        """The ``.tab`` line of ``name`` (which must have a result)."""
        return self.results.tab_line(self.results.jobs.index[name], self.rev)

    def lines(self) -> Iterator[str]:
        """Every ``.tab`` line, sorted by name."""
        index, tab_line, rev = self.results.jobs.index, self.results.tab_line, self.rev
        return (tab_line(index[name], rev) for name in self.names)
