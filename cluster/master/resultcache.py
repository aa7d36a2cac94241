"""The result cache (issue 26, Bazel's action cache): the results of the last complete runs,
by the key of what each job depended on.

**A job's key** (:func:`job_key`) is the sha256 of

* its job line as the job list has it (test id, log file and command, placeholders and
  all: a changed option is a changed line);
* the content of each test file the line names (``__tests__/<path>``), hashed from the
  master home's corpus (:class:`FileDigests`: once per file per run, kept by the file's
  size, mtime, ctime and inode);
* the build digest of each program the line calls (``__bin__/<prog>``), as the node that
  built it reported it (``digests`` header; :mod:`cluster.node.builddigest`).

A job whose line uses ``__baseline__`` or ``__tree__``, calls no ``__bin__`` program, or
names a test file that cannot be read has no key (:func:`job_inputs`): it is always run.

**The store** is a folder of the master home, ``result-cache/``, one file per complete run
(:meth:`ResultCache.save_run`), written atomically (temp file, fsync, rename)::

    result-cache 1 <run id>
    build <prog> <sha256>          one per (program, digest) of the run's nodes
    <key> <test> <error> <t1> <t2> <t3> <md5> <product>     one per cached result
    end <number of results>

named ``<seq>-<run id>.results`` with ``seq`` one more than the newest file's, so the
files sort oldest first; only the newest ``result_cache_runs`` are kept.  A file that does
not read back whole (no header, a bad line, no ``end`` or a wrong count: torn, truncated or
edited) is ignored with a log line naming it, never trusted.  The ``build`` lines let a
lookup skip every file that holds no result of the node's build (:meth:`ResultCache.table`)
without reading its results.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.records import BASELINE, BIN, TESTS, TREE_DIR
from cluster.runtime import fsutil

log = logging.getLogger("cluster.resultcache")

#: The store's folder in the master home.
CACHE_DIR = "result-cache"
#: The first word and version of a run file's header.
MAGIC = "result-cache 1"
SUFFIX = ".results"
KEY = re.compile(r"[0-9a-f]{64}")
_FILE_NAME = re.compile(r"(\d{8})-(.+)" + re.escape(SUFFIX))
_BIN_PROGRAM = re.compile(re.escape(BIN) + r"/([A-Za-z0-9_.+-]{1,64})")
#: ``__tests__/`` and what follows it: a path of the characters shlex.quote leaves
#: unquoted (group 1), then the next character (group 2: a quote there means a path that
#: needed quoting, or one glued to other text; such a job gets no key).
_TEST_PATH = re.compile(re.escape(TESTS) + r"/([\w@%+=:,./-]*)(.?)")
#: What may follow a test path in a job line: the end of its shell word.
_WORD_END = frozenset(" \t\n;|&<>()'")
#: The error codes whose results are kept: a node's verdict on the test's output.  Not
#: timeouts (3, 4: the node's load decides them), internal errors (10) nor lost jobs (-1).
CACHED_ERRORS = frozenset({"0", "1", "2", "5", "6", "7", "8", "9"})


def job_inputs(line: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(programs, test paths) a job line depends on: the ``__bin__/<prog>`` it calls
    (sorted) and the corpus paths of its ``__tests__/`` words (in order, each once).  None
    when the job cannot have a key: it uses ``__baseline__`` or ``__tree__``, calls no
    program, or names a test path that shlex.quote had to quote (the key would be unsure
    of the path: the job is run)."""
    if BASELINE in line or TREE_DIR in line:
        return None
    programs = tuple(sorted(set(_BIN_PROGRAM.findall(line))))
    if not programs:
        return None
    paths: list[str] = []
    for path, after in _TEST_PATH.findall(line):
        # A closing quote may end the path: the job line echoes its command, quoted.
        if not path or (after and after not in _WORD_END) or path.endswith("/"):
            return None
        if path not in paths:
            paths.append(path)
    return programs, tuple(paths)


def job_key(line: str, tests: Sequence[tuple[str, str]],
            programs: Sequence[tuple[str, str]]) -> str:
    """The key of job ``line`` whose test files are ``tests`` ((path, sha256) each) and
    whose programs were built as ``programs`` ((program, digest) each)."""
    h = hashlib.sha256(b"job 1\n")
    h.update(line.encode("utf-8", "surrogateescape"))
    for path, digest in tests:
        h.update(f"\ntest {path} {digest}".encode("utf-8", "surrogateescape"))
    for program, digest in programs:
        h.update(f"\nprogram {program} {digest}".encode())
    return h.hexdigest()


class FileDigests:
    """The sha256 of the corpus's test files (under ``root``), each hashed once while its
    size, mtime, ctime and inode stay the same (a write changes the ctime, even one that
    keeps the size and sets the mtime back)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._known: dict[str, tuple[tuple[int, int, int, int], str | None]] = {}

    def digest(self, path: str) -> str | None:
        """The sha256 of test file ``path`` (relative to the corpus), or None when it is
        not a regular file inside the corpus or cannot be read."""
        if path.startswith("/") or ".." in path.split("/"):
            return None
        full = self.root / path
        try:
            st = os.stat(full)
        except OSError:
            return None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        known = self._known.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        value: str | None = None
        if os.path.isfile(full):
            h = hashlib.sha256()
            try:
                with open(full, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        h.update(chunk)
                value = h.hexdigest()
            except OSError:
                value = None
        self._known[path] = (stamp, value)
        return value


def key_of(line: str, tests: FileDigests, builds: dict[str, str]) -> str | None:
    """The key of job ``line`` on a node whose program digests are ``builds``; None when
    the job has no key (:func:`job_inputs`), a program of it is not in ``builds`` or a test
    file cannot be read."""
    inputs = job_inputs(line)
    if inputs is None:
        return None
    programs, paths = inputs
    progs: list[tuple[str, str]] = []
    for program in programs:
        digest = builds.get(program)
        if digest is None:
            return None
        progs.append((program, digest))
    files: list[tuple[str, str]] = []
    for path in paths:
        digest = tests.digest(path)
        if digest is None:
            return None
        files.append((path, digest))
    return job_key(line, files, progs)


@dataclass(frozen=True)
class RunFile:
    """One run's file in the store: its sequence number, run id, path and build lines."""

    seq: int
    run_id: str
    path: Path
    builds: frozenset[tuple[str, str]]


class CorruptCacheFile(ValueError):
    """A run file of the store that does not read back whole."""


class ResultCache:
    """The store in ``root`` (``<home>/result-cache``), keeping ``keep_runs`` runs."""

    def __init__(self, root: Path, keep_runs: int) -> None:
        self.root = root
        self.keep_runs = max(1, keep_runs)

    def _names(self) -> list[tuple[int, str, Path]]:
        """(seq, run id, path) of the run files, oldest first."""
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        out = []
        for name in entries:
            m = _FILE_NAME.fullmatch(name)
            if m:
                out.append((int(m.group(1)), m.group(2), self.root / name))
        return sorted(out)

    def runs(self) -> list[RunFile]:
        """The kept runs whose header reads, oldest first (a bad header is logged)."""
        out = []
        for seq, run_id, path in self._names():
            try:
                builds = _read_header(path, run_id)
            except (OSError, UnicodeDecodeError, CorruptCacheFile) as exc:
                log.warning("result cache: ignoring %s: %s", path, exc)
                continue
            out.append(RunFile(seq, run_id, path, builds))
        return out

    def table(self, builds: Iterable[tuple[str, str]]) -> dict[str, str]:
        """key -> canonical result text of every cached result of the runs that hold one
        of ``builds`` ((program, digest) pairs); the newest run wins a key.  Runs holding
        none are not read past their header; a run file that is not whole is ignored (one
        log line)."""
        wanted = frozenset(builds)
        table: dict[str, str] = {}
        for run in self.runs():
            if not run.builds & wanted:
                continue
            try:
                table.update(_read_results(run.path))
            except (OSError, UnicodeDecodeError, CorruptCacheFile) as exc:
                log.warning("result cache: ignoring %s: %s", run.path, exc)
        return table

    def save_run(self, run_id: str, builds: Iterable[tuple[str, str]],
                 entries: Iterable[tuple[str, str]]) -> int:
        """Store run ``run_id``'s results ``entries`` ((key, canonical result text) each)
        whose nodes' builds were ``builds``, replacing an earlier file of that run (an end
        step done again), then remove the oldest runs beyond ``keep_runs``.  Returns the
        number of results stored."""
        self.root.mkdir(parents=True, exist_ok=True)
        names = self._names()
        seq = names[-1][0] + 1 if names else 1
        path = self.root / f"{seq:08d}-{run_id}{SUFFIX}"
        count = 0
        with fsutil.atomic_writer(path) as fh:
            fh.write(f"{MAGIC} {run_id}\n")
            for program, digest in sorted(set(builds)):
                fh.write(f"build {program} {digest}\n")
            for key, text in entries:
                fh.write(f"{key} {text}\n")
                count += 1
            fh.write(f"end {count}\n")
        for _, other, old in names:
            if other == run_id:
                old.unlink(missing_ok=True)
        self.prune()
        return count

    def prune(self) -> list[str]:
        """Remove the run files beyond the newest ``keep_runs``; their run ids."""
        names = self._names()
        gone = []
        for _, run_id, path in names[:max(0, len(names) - self.keep_runs)]:
            path.unlink(missing_ok=True)
            gone.append(run_id)
        return gone


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            if not raw.endswith("\n"):
                raise CorruptCacheFile("its last line is torn (no newline)")
            yield raw[:-1]


def _read_header(path: Path, run_id: str) -> frozenset[tuple[str, str]]:
    builds: set[tuple[str, str]] = set()
    lines = _lines(path)
    first = next(lines, None)
    if first != f"{MAGIC} {run_id}":
        raise CorruptCacheFile(f"expected a first line {MAGIC + ' ' + run_id!r}, got "
                               f"{(first or '')[:80]!r}")
    for line in lines:
        word, _, rest = line.partition(" ")
        if word != "build":
            break
        program, _, digest = rest.partition(" ")
        if not program or not KEY.fullmatch(digest):
            raise CorruptCacheFile(f"bad build line {line[:120]!r}")
        builds.add((program, digest))
    return frozenset(builds)


def _read_results(path: Path) -> dict[str, str]:
    """The results of a run file, checked whole: every line's form and the end count."""
    out: dict[str, str] = {}
    count = 0
    ended = False
    for n, line in enumerate(_lines(path)):
        if n == 0 or line.startswith("build "):
            continue
        if ended:
            raise CorruptCacheFile("lines after its end line")
        if line.startswith("end "):
            if line != f"end {count}":
                raise CorruptCacheFile(f"its end line says {line[4:]!r}, but it holds "
                                       f"{count} results")
            ended = True
            continue
        key, _, text = line.partition(" ")
        words = text.split(" ")
        if not KEY.fullmatch(key) or len(words) != 7 or words[1] not in CACHED_ERRORS:
            raise CorruptCacheFile(f"line {n + 1} is not '<key> <result>': {line[:120]!r}")
        out[key] = text
        count += 1
    if not ended:
        raise CorruptCacheFile("it has no end line (truncated)")
    return out

