"""Slowest tests first (docs/results.md, "Slowest tests first, and slowdowns named"): a
run's jobs file put in the order the nodes get them.

The master hands jobs out from the head of its job list (:mod:`cluster.master.state.runstate`),
so the order of the jobs file is the order of the run.  A slow test handed out last binds
the run's end: every other node is idle while it runs.  So once, when the run's jobs file
is made, :func:`order_jobs_file` rewrites it with the longest tests first, by each test's
time in the baseline table (``tables/current.tab``: the latest time of each test in the
stream, ARTIFEX.md §2.8), and tests with no known time (new tests, a first run) ahead of
them all, since they may be slow.  Tests of equal time keep build.py's order.

Why the file and not the list in memory: the master reads a batch of jobs with one
``pread`` when they are consecutive lines of the file
(:class:`~cluster.master.model.joblist.JobFile`), so the per-request cost stays what it
was; and a successor master that takes the run over reuses the file, so it hands the jobs
out in the same order.

A test's time is ``time1 + time2 + time3`` of its ``.tab`` row: the user CPU seconds of
its stages (a ``shell`` job's wall seconds, :func:`cluster.node.readlog.with_wall_time`).

The same rewrite writes each job's own timeout into its line (``timeout=<seconds>`` in place
of ``true``; docs/results.md, "Timeouts that fit each test";
:mod:`cluster.master.model.jobtimeouts`) when the run fits timeouts (:class:`TimeoutFit`):
done once, in the child, so the master hands the lines out as it reads them (nothing per
job while it serves) and a successor master reads them from the file.

Cost, for a million jobs: one 8-byte time per job (an ``array``), filled while the
baseline is read a line at a time (never a table of rows, nor a second dict of names),
the permutation (a list of ints), and the lines copied as bytes from a map of the old file
into the new one, a chunk at a time (its pages dropped after each); seconds, once per run
(docs/performance.md, "Slowest first").
"""

from __future__ import annotations

import logging
import mmap
import sys
import tempfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.master.model import jobtimeouts
from cluster.master.model.joblist import JobFile, JobList
from cluster.master.model.jobtimeouts import TimeoutFit
from cluster.records import JOB_TIMEOUT_WORD
from cluster.runtime import forkrun, fsutil

log = logging.getLogger("cluster.master")

#: The time of a test the baseline does not know: it sorts before every known time.
UNKNOWN = float("inf")
#: The longest the ordering may take [s]: some seconds for a million jobs.
ORDER_TIMEOUT = 600.0
#: Job lines written to the ordered file at a time.
_WRITE_CHUNK = 8192


@dataclass(frozen=True)
class Ordering:
    """What :func:`order_jobs_file` did: jobs, how many had a known time, whether the
    file was rewritten (not when it was already in that order and no job got its own
    timeout), and how many jobs got their own timeout."""

    jobs: int
    known: int
    rewritten: bool
    timed: int = 0


def slowest_first(times: Sequence[float]) -> list[int]:
    """The job indexes in hand-out order: unknown times (:data:`UNKNOWN`) first, then the
    longest first; equal times keep their order (a stable sort).  Pure."""
    negated = array("d", (-t for t in times))
    return sorted(range(len(negated)), key=negated.__getitem__)


def known_times(jobs: JobList, baseline: Path) -> tuple[array[float], int]:
    """Each job's time in ``baseline`` (:data:`UNKNOWN` when it has no row), and how many
    were known.  The baseline is read a line at a time and only its names and three times
    are looked at; a missing file knows no time, a malformed line is passed over (the
    comparison at the end of the run reports it)."""
    times = array("d", [UNKNOWN]) * len(jobs)
    known = 0
    index = jobs.index
    try:
        fh = open(baseline, "rb")
    except FileNotFoundError:
        return times, known
    with fh:
        for line in fh:
            name, _, rest = line.partition(b"\t")
            i = index.get(name.decode("utf-8", errors="replace"))
            if i is None:
                continue
            fields = rest.split(b"\t", 4)
            try:
                seconds = float(fields[1]) + float(fields[2]) + float(fields[3])
            except (ValueError, IndexError):
                continue
            if times[i] == UNKNOWN:
                known += 1
            times[i] = seconds
    return times, known


def order_jobs_file(path: Path, baseline: Path, fit: TimeoutFit | None = None) -> Ordering:
    """Rewrite the jobs file ``path`` slowest first by ``baseline``'s times (atomically:
    a reader sees the old order or the new one), each job with its own timeout when ``fit``
    says how (by the stream's tables beside ``baseline``, :data:`jobtimeouts.TABLES`).
    Bad lines build.py wrote are dropped from the rewritten file (:class:`JobFile` skips
    them anyway)."""
    jobs = JobFile(path)
    try:
        times, known = known_times(jobs, baseline)
        order = slowest_first(times)
        timeouts = None if fit is None else jobtimeouts.job_timeouts(
            jobs, [baseline.with_name(name) for name in jobtimeouts.TABLES], fit.multiple,
            fit.floor, fit.limit)
        timed = sum(1 for t in timeouts if t) if timeouts is not None else 0
        if timeouts is None and (not known or all(i == k for i, k in enumerate(order))):
            return Ordering(len(jobs), known, rewritten=False)
        starts, ends = jobs.starts, jobs.ends
        words: dict[float, bytes] = {}  # a few distinct timeouts: each word made once

        def line(i: int) -> bytes:
            text_i = text[starts[i]:ends[i]]
            seconds = timeouts[i] if timeouts is not None else 0.0
            if not seconds:
                return text_i
            word = words.get(seconds)
            if word is None:
                word = words[seconds] = f" {JOB_TIMEOUT_WORD}{seconds:.6g} ; ".encode()
            # The first " true ; " ends the third word: test ids and log names hold no space.
            return text_i.replace(b" true ; ", word, 1)

        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as text, \
                fsutil.atomic_writer(path, encoding="utf-8") as out:
            raw = out.buffer  # the lines are copied as bytes, never decoded
            for first in range(0, len(order), _WRITE_CHUNK):
                chunk = order[first:first + _WRITE_CHUNK]
                raw.write(b"\n".join([line(i) for i in chunk]))
                raw.write(b"\n")
                # The chunk's lines are all over the file: let its pages go from the
                # master's memory (they stay in the page cache), or a million-job file
                # would add its whole size to the master's peak.
                text.madvise(mmap.MADV_DONTNEED)
        return Ordering(len(jobs), known, rewritten=True, timed=timed)
    finally:
        jobs.close()


def baseline_of(tables: Path) -> Path:
    """The table whose times order a run: the stream's baseline, ``tables/current.tab``."""
    return tables / "current.tab"


def order_run_jobs(path: Path, tables: Path, fit: TimeoutFit | None = None,
                   timeout: float = ORDER_TIMEOUT) -> None:
    """The master's one call, when it has made a run's jobs file: order it by the
    baseline in ``tables``, each job with its own timeout by ``fit`` (None: none;
    :func:`order_jobs_file`) in a forked child
    (:mod:`cluster.runtime.forkrun`), and log what was done.  Without a baseline (a
    first run) there is nothing to order by, and nothing is started.

    A child, because the ordering's million names and ints would leave the master's
    allocator holding a few hundred MB that its own job list then cannot reuse (measured:
    a peak of 469 MB against 350 MB at 1M jobs); a child's memory goes back whole when it
    exits.  A fork rather than a new interpreter: 0.1-0.2 s less before the run starts.
    If the child fails or runs out of ``timeout``, the file keeps build.py's order (the
    rewrite is atomic; a killed child's temporary file is removed at the next run's start)
    and the run goes on.
    """
    baseline = baseline_of(tables)
    if not baseline.is_file():
        log.info("%s: no baseline (%s) yet; left in build.py's order", path, baseline)
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8") as said:
        try:
            done = forkrun.run(main, [str(path), str(baseline),
                                      *(fit.argv() if fit is not None else [])], said, timeout)
        except OSError as exc:  # no fork (no memory, no process slot)
            log.warning("%s: not ordered slowest first: %s", path, exc)
            return
        said.seek(0)
        text = said.read().strip()
    if not done.ok:
        log.warning("%s: not ordered slowest first: the ordering %s: %s", path,
                    done.describe(timeout), done.stderr.strip()[-500:])
        return
    log.info("%s: %s", path, text)


def main(argv: list[str]) -> int:
    """The child's entry: ``<jobs file> <baseline table> [MULTIPLE FLOOR LIMIT]`` (the
    last three: a :class:`TimeoutFit`); prints what was done."""
    if len(argv) not in (2, 5):
        print("usage: joborder JOBS_FILE BASELINE_TAB [MULTIPLE FLOOR LIMIT]", file=sys.stderr)
        return 2
    fit = TimeoutFit(*map(float, argv[2:])) if len(argv) == 5 else None
    done = order_jobs_file(Path(argv[0]), Path(argv[1]), fit)
    print(f"{done.jobs} jobs, {done.known} with a known time; "
          + ("ordered slowest first" if done.rewritten else "left in build.py's order")
          + (f"; {done.timed} with their own timeout ({fit.multiple:g} x their median "
             f"recorded time, at least {fit.floor:g} s, below {fit.limit:g} s)"
             if fit is not None else ""))
    return 0
