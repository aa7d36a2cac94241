"""``num_execution=N`` (docs/runoptions.md section 7; prun's ``num_execution``): each job
of a shell run made into N jobs, its ranks, as MPI ranks a program's copies.

Copy ``k`` (0-based) of the job ``<test>`` is the job ``<test>.rank<k>`` (:func:`rank_name`:
a test id of :data:`cluster.records.TEST_ID`, so its row of the ``.tab`` and its
result are its own), its files in ``__temp__`` renamed alike (the node reads
``<name>.log``/``.out``), and its command runs with ``CLUSTER_RANK=<k>`` and
``CLUSTER_COUNT=<N>`` exported (:data:`RANK_VARIABLE`, :data:`COUNT_VARIABLE`, named as the
node's ``CLUSTER_SLOT``).  The ``export`` is the first word of the job's command: a slot's
shell runs each job in a subshell (:mod:`cluster.node.slots`), so the variables never reach
the next job.

The copies of one job follow each other in the list (rank 0 first), so they are handed out
together and run side by side when the nodes have slots for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from cluster.jobs.corpus import MAX_TEST_ID
from cluster.records import TEMP, TEST_ID, Job

log = logging.getLogger("cluster.build")

#: The environment variables of a rank's command: its rank (0-based) and the count.
RANK_VARIABLE = "CLUSTER_RANK"
COUNT_VARIABLE = "CLUSTER_COUNT"
#: Between a test's id and its rank in a copy's name.
RANK_SUFFIX = ".rank"


def rank_name(test: str, rank: int) -> str:
    """The test id of copy ``rank`` of ``test``."""
    return f"{test}{RANK_SUFFIX}{rank}"


def rank_command(command: str, rank: int, count: int) -> str:
    """``command`` run with its rank and the count in its environment."""
    return f"export {RANK_VARIABLE}={rank} {COUNT_VARIABLE}={count} ; {command}"


def expand_ranks(lines: Iterable[str], count: int) -> Iterator[str]:
    """Each job line of ``lines`` (newline-ended, as build.py writes them) as ``count`` job
    lines, ranks 0 to ``count - 1`` (the module docstring).  A job whose copies' test ids
    would be too long is left out, logged (as build.py leaves out a test whose id is bad);
    a line that is no job line is passed on as it is."""
    if count < 1:
        raise ValueError(f"num_execution={count}: expected 1 or more copies")
    for line in lines:
        try:
            job = Job.parse(line)
        except ValueError:
            yield line
            continue
        last = rank_name(job.name, count - 1)
        if len(last) > MAX_TEST_ID or not TEST_ID.fullmatch(last):
            log.warning("build: skipping test %s: its copies' ids (%s) would be longer than "
                        "%d characters", job.name, last, MAX_TEST_ID)
            continue
        old = f"{TEMP}/{job.name}."
        for rank in range(count):
            name = rank_name(job.name, rank)
            new = f"{TEMP}/{name}."
            copy = Job(name, job.logfile.replace(old, new),
                       rank_command(job.command.replace(old, new), rank, count), job.timeout)
            yield copy.line + "\n"
