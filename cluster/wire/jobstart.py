"""job.start: what a running run is, written by the master and read by every node (seed 001).

One ``key value`` per line; the first line is ``id <jobid>``.  The file stays on the master for
the whole run (nodes do not delete it) and is removed when the run is over.

Keys: ``id``, ``priority``, ``queue`` (the queue line being run), ``kind``, ``ref``,
``products`` (comma list), ``tree`` (ghostpdl or mupdf), ``source`` (the tree to build,
relative to the master home), ``build`` (the build command of a tree of no known kind),
the optional ``build_ghostpdl`` and ``build_mupdf`` (the build commands of a ghostpdl and
of a MuPDF tree, with ``__targets__`` already replaced by the make targets of the run's
products; absent: ``build`` builds every tree; the node picks by what the tree holds:
:mod:`cluster.node.buildcmd`), ``tests`` (the corpus,
relative to the master home), ``options`` (space list, may be empty), and the optional
``baseline``: the master's clean tree (relative to the master home, e.g. ``ghostpdl``) that
a bmpcmp run renders as its reference.  Nodes fetch and build it besides ``source``, cache
the build between runs, and substitute ``__baseline__`` with its ``bin``.  Empty or absent:
no baseline, and the line is not written, so job.start files of other runs are unchanged.

``secret`` (docs/protocol.md, "Signed messages"): 64 hex digits, fresh for each run, the key
of the run's signed node messages (:mod:`cluster.wire.signing`).  Only job.start itself
carries it (written mode 0600, ``format(with_secret=True)``); every other copy of the run's
description (the end record, ``run.info`` in the archive) is written by
:meth:`JobStart.format` without it.  Optional when parsing, so a job.start of an older master
still parses; a node refuses to join a run without one.

``programs``: the programs the run's jobs call as ``__bin__/<name>``, comma
list (:data:`PROGRAM`), e.g. ``gpcl6,gs``.  A node checks them right after its build and
tells the master which its build did not make (the ``unbuilt`` request header of
:mod:`cluster.wire.protocol`).  Optional: empty or absent, the line is not written and
nothing is checked after the build (job.start files of other runs are unchanged).

``max_result_bytes`` (docs/sweeps.md; sweep runs only; absent or 0 in other runs, and then not
written): the bytes of result files one sweep task may send (master.conf's
``max_result_bytes``: the node fails a task over it, :mod:`cluster.node.sweepresults`).
``job_timeout`` (absent or 0: not written): the seconds a node lets one job of this run
run before it kills it, instead of its own ``job_timeout``: the run's ``task_timeout``
(docs/runoptions.md, section 3; any run), else, in a sweep run, the sweep's ``timeout`` plus
GNU timeout's grace and a margin (:func:`cluster.jobs.sweepjobs.node_job_timeout`), so a
node never cuts a task before the sweep's own timeout does.

``sweep_results`` (docs/sweeps.md; sweep runs only): the sweep's ``[results]``, which the node
takes from each task's folder when its job has ended (:mod:`cluster.node.sweepresults`):
space-separated ``<result name>=<source>`` words in the sweep file's order, the source
``stdout``, ``stderr`` or a relative path in the task's folder, percent-encoded
(``urllib.parse.quote``, ``/`` kept).  Absent or empty: the task's results are none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

KEYS = ("id", "priority", "queue", "kind", "ref", "products", "tree", "source", "build",
        "build_ghostpdl", "build_mupdf", "tests", "options", "baseline", "programs",
        "max_result_bytes", "job_timeout", "sweep_results", "lane", "secret")
#: Keys a job.start may lack.
OPTIONAL = ("options", "build_ghostpdl", "build_mupdf", "baseline", "programs",
            "max_result_bytes", "job_timeout", "sweep_results", "lane", "secret")
#: Optional keys whose line is left out when empty (job.start files without them unchanged).
_OMITTED_WHEN_EMPTY = ("build_ghostpdl", "build_mupdf", "baseline", "programs",
                       "max_result_bytes", "job_timeout", "sweep_results", "lane", "secret")
#: A sweep result's name (the sweep file's rule, cluster.sweep.spec.RESULT_NAME, spelled
#: out here so the node's code set does not carry the sweep file's reader; a unit test
#: keeps the two one).
RESULT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
#: The sources of a sweep result that are the command's streams, not files.
STREAM_SOURCES = ("stdout", "stderr")
#: The most results a sweep run may name.
MAX_SWEEP_RESULTS = 256
#: The largest ``job_timeout`` a job.start may give: a sweep's timeout is at most 7 days, a
#: run's ``task_timeout`` (docs/runoptions.md, section 3) at most 30.
MAX_JOB_TIMEOUT = 31 * 24 * 3600.0
#: A program a job calls as ``__bin__/<name>`` (what cluster.node.nodejobs finds in a job).
PROGRAM = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
#: The most programs a run may name (a run of every product names four).
MAX_PROGRAMS = 32
#: The highest lane number a job.start may name (cluster.lanes.ALL_LANES; spelled out
#: here so the wire format stays a leaf, a unit test keeps the two one).
MAX_LANE = 9


@dataclass(frozen=True)
class JobStart:
    id: str
    priority: int
    queue: str
    kind: str
    ref: str
    products: tuple[str, ...]
    tree: str
    source: str
    build: str
    tests: str
    options: tuple[str, ...] = ()
    baseline: str = ""
    secret: str = ""
    build_ghostpdl: str = ""
    build_mupdf: str = ""
    programs: tuple[str, ...] = ()
    #: A sweep run's bytes of result files per task; 0: not a sweep run.
    max_result_bytes: int = 0
    #: Seconds a node lets one job of this run run; 0: the node's own job_timeout.
    job_timeout: float = 0.0
    #: A sweep run's ``[results]``: (result name, source) pairs; empty in other runs.
    sweep_results: tuple[tuple[str, str], ...] = ()
    #: The lane whose master serves the run (cluster.lanes); -1: the lane of its priority
    #: (the line is written only for a user lane beyond the seed's three).
    lane_number: int = -1

    @property
    def lane(self) -> int:
        """The lane serving this run: ``lane_number``, or the run's priority."""
        return self.priority if self.lane_number < 0 else self.lane_number

    def format(self, *, with_secret: bool = False) -> str:
        """The file's text; the ``secret`` line only ``with_secret`` (job.start itself)."""
        values = {
            "id": self.id, "priority": str(self.priority), "queue": self.queue,
            "kind": self.kind, "ref": self.ref, "products": ",".join(self.products),
            "tree": self.tree, "source": self.source, "build": self.build,
            "build_ghostpdl": self.build_ghostpdl, "build_mupdf": self.build_mupdf,
            "tests": self.tests, "options": " ".join(self.options),
            "baseline": self.baseline, "programs": ",".join(self.programs),
            "max_result_bytes": str(self.max_result_bytes) if self.max_result_bytes else "",
            "job_timeout": repr(float(self.job_timeout)) if self.job_timeout else "",
            "sweep_results": " ".join(f"{name}={quote(source, safe='/')}"
                                      for name, source in self.sweep_results),
            "lane": str(self.lane) if self.lane != self.priority else "",
            "secret": self.secret if with_secret else "",
        }
        return "".join(f"{k} {values[k]}".rstrip() + "\n" for k in KEYS
                       if k not in _OMITTED_WHEN_EMPTY or values[k])

    @classmethod
    def parse(cls, text: str) -> JobStart:
        """Parse job.start text; ValueError names a missing or bad key."""
        values: dict[str, str] = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key in KEYS:
                values[key] = value
        missing = [k for k in KEYS if k not in values and k not in OPTIONAL]
        if missing:
            raise ValueError("job.start lacks " + ", ".join(missing))
        try:
            priority = int(values["priority"])
        except ValueError:
            raise ValueError(f"job.start priority {values['priority']!r} is not an integer"
                             ) from None
        try:
            programs = parse_programs(values.get("programs", ""))
        except ValueError as exc:
            raise ValueError(f"job.start programs: {exc} (expected a comma list of program "
                             "names)") from None
        max_result_bytes = _number(values, "max_result_bytes", int, 1 << 62)
        job_timeout = _number(values, "job_timeout", float, MAX_JOB_TIMEOUT)
        sweep_results = parse_sweep_results(values.get("sweep_results", ""))
        lane = int(_number(values, "lane", int, MAX_LANE)) if values.get("lane", "").strip() \
            else -1
        return cls(id=values["id"], priority=priority, queue=values["queue"],
                   kind=values["kind"], ref=values["ref"],
                   products=tuple(p for p in values["products"].split(",") if p),
                   tree=values["tree"], source=values["source"], build=values["build"],
                   tests=values["tests"], options=tuple(values.get("options", "").split()),
                   baseline=values.get("baseline", "").strip(),
                   secret=values.get("secret", "").strip(),
                   build_ghostpdl=values.get("build_ghostpdl", "").strip(),
                   build_mupdf=values.get("build_mupdf", "").strip(),
                   programs=programs, max_result_bytes=int(max_result_bytes),
                   job_timeout=float(job_timeout), sweep_results=sweep_results,
                   lane_number=lane)


def _number(values: dict[str, str], key: str, kind: type[int] | type[float],
            high: float) -> int | float:
    """The optional number ``key`` of job.start (0 when absent); ValueError naming it
    unless it is a finite number from 0 to ``high``."""
    text = values.get(key, "").strip()
    if not text:
        return 0
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not 0 <= value <= high:  # also false for nan
        raise ValueError(f"job.start {key} {text[:40]!r} is not a number from 0 to {high:g}")
    return value


def parse_sweep_results(text: str) -> tuple[tuple[str, str], ...]:
    """The (result name, source) pairs of a ``sweep_results`` line; ValueError naming the
    word and what was expected.  A source is ``stdout``, ``stderr`` or a relative path
    that stays in the task's folder: no empty, ``.`` or ``..`` component, no NUL, not
    absolute."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    words = text.split()
    if len(words) > MAX_SWEEP_RESULTS:
        raise ValueError(f"job.start sweep_results names {len(words)} results, more than "
                         f"{MAX_SWEEP_RESULTS}")
    for word in words:
        name, eq, encoded = word.partition("=")
        try:
            source = unquote(encoded, errors="strict") if eq else ""
        except UnicodeDecodeError:
            source = ""  # not UTF-8 once decoded: refused below
        parts = source.split("/")
        if (not RESULT_NAME.fullmatch(name) or name in seen or not source or "\0" in source
                or any(part in ("", ".", "..") for part in parts)):
            raise ValueError(f"job.start sweep_results word {word[:80]!r}: expected "
                             "<result name>=<stdout, stderr or a relative path in the "
                             "task's folder>, each name once")
        seen.add(name)
        pairs.append((name, source))
    return tuple(pairs)


def parse_programs(text: str) -> tuple[str, ...]:
    """The comma list of programs of a ``programs`` line (or an ``unbuilt`` header): each
    of :data:`PROGRAM`, at most :data:`MAX_PROGRAMS`, no repeats; ValueError says what is
    wrong."""
    names = tuple(p for p in text.strip().split(",") if p) if text.strip() else ()
    if len(names) > MAX_PROGRAMS:
        raise ValueError(f"names {len(names)} programs, more than {MAX_PROGRAMS}")
    for name in names:
        if not PROGRAM.fullmatch(name):
            raise ValueError(f"program {name[:80]!r} is not 1-64 of [A-Za-z0-9_.+-]")
    if len(set(names)) != len(names):
        raise ValueError("names a program twice")
    return names
