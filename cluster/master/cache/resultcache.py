"""The result cache (docs/results.md, "Results reused"; Bazel's action cache): the results
of the last complete runs, by the key of what each job depended on.

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

    result-cache 2 <run id>
    build <prog> <sha256>          one per (program, digest) of the run's nodes
    <key> <maker> <test> <error> <t1> <t2> <t3> <md5> <product>     one per cached result
    end <number of results>

``<maker>`` is ``<node>@<run id>``: the node that ran the job and the run it ran in (a
result reused and stored again keeps its maker), which the reusing run's ``.tab`` names
and whose results the run's checks sample per maker (:mod:`cluster.master.cache.reuseverify`).
A file of format 1 (written before results kept their maker) is ignored with a log line:
its results cannot be checked per maker, and the next complete runs refill the store.

**Withdrawn builds**: ``result-cache/withdrawn`` lists the (program, digest) pairs whose
cached results a check found wrong (:meth:`ResultCache.withdraw`), one
``<prog> <sha256> <run id> <test>`` line each.  A lookup never uses a withdrawn pair
(:meth:`ResultCache.withdrawn`: the jobs calling that build of the program get no key and
run), and a run's results under one are not stored.  A pair is forgotten once no kept run
file holds it any more (:meth:`ResultCache.prune`): by then no result of it is left to serve.

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

from cluster.records import BASELINE, BIN, TESTS, TREE_DIR, untimed_line
from cluster.runtime import fsutil

log = logging.getLogger("cluster.resultcache")

#: The store's folder in the master home.
CACHE_DIR = "result-cache"
#: The first word and version of a run file's header.
MAGIC = "result-cache 2"
#: The header of the format before results kept their maker (ignored, one log line).
OLD_MAGIC = "result-cache 1"
#: The file of withdrawn (program, digest) pairs, in the store's folder.
WITHDRAWN = "withdrawn"
#: A result's maker: ``<node>@<run id>`` (no node name or run id has a space or an ``@``).
MAKER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}@[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
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
    # A job's own timeout is not what it computes: a key without it (docs/results.md,
    # "Timeouts that fit each test"), so a timeout fitted anew keeps the cached results.
    h.update(untimed_line(line).encode("utf-8", "surrogateescape"))
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
        """key -> ``<maker> <canonical result text>`` (:func:`split_cached`) of every
        cached result of the runs that hold one of ``builds`` ((program, digest) pairs);
        the newest run wins a key.  Runs holding none are not read past their header; a
        run file that is not whole is ignored (one log line)."""
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
        """Store run ``run_id``'s results ``entries`` ((key, ``<maker> <canonical result
        text>``) each)
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
        """Remove the run files beyond the newest ``keep_runs``; their run ids.  Withdrawn
        pairs no kept run file holds any more are forgotten (nothing of them is left)."""
        names = self._names()
        gone = []
        for _, run_id, path in names[:max(0, len(names) - self.keep_runs)]:
            path.unlink(missing_ok=True)
            gone.append(run_id)
        self._forget_withdrawn()
        return gone

    # ------------------------------------------------------------- withdrawn builds
    @property
    def withdrawn_path(self) -> Path:
        return self.root / WITHDRAWN

    def withdrawn(self) -> frozenset[tuple[str, str]]:
        """The (program, digest) pairs whose cached results were withdrawn (a bad line is
        logged and skipped; an unreadable file withdraws nothing more than it says, so it
        is logged loudly)."""
        try:
            text = self.withdrawn_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return frozenset()
        except (OSError, UnicodeDecodeError) as exc:
            log.error("result cache: %s is unreadable (%s); no build is taken as withdrawn",
                      self.withdrawn_path, exc)
            return frozenset()
        pairs = set()
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split(" ")
            if len(words) < 2 or not KEY.fullmatch(words[1]) or not words[0]:
                log.warning("result cache: %s:%d: not '<prog> <sha256> ...': %r",
                            self.withdrawn_path, n, line[:120])
                continue
            pairs.add((words[0], words[1]))
        return frozenset(pairs)

    def withdraw(self, pairs: Iterable[tuple[str, str]], run_id: str, test: str) -> None:
        """Withdraw every cached result made with the builds ``pairs`` ((program, digest)
        each): run ``run_id``'s check of test ``test`` found one wrong.  Written under the
        store's lock (another priority's master may withdraw too), atomically, fsync'ed:
        a withdrawal is never lost to a crash after the node heard back."""
        self.root.mkdir(parents=True, exist_ok=True)
        with fsutil.flocked(self.root / ".withdrawn.lock"):
            lines = self._withdrawn_lines()
            known = {tuple(line.split(" ")[:2]) for line in lines}
            lines += [f"{p} {d} {run_id} {test}" for p, d in sorted(set(pairs))
                      if (p, d) not in known]
            fsutil.atomic_write(self.withdrawn_path, "".join(x + "\n" for x in lines))

    def _withdrawn_lines(self) -> list[str]:
        try:
            return self.withdrawn_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []

    def _forget_withdrawn(self) -> None:
        if not self.withdrawn_path.exists():
            return
        held = {pair for run in self.runs() for pair in run.builds}
        with fsutil.flocked(self.root / ".withdrawn.lock"):
            try:
                lines = self._withdrawn_lines()
            except (OSError, UnicodeDecodeError):
                return
            kept = [line for line in lines if tuple(line.split(" ")[:2]) in held]
            if len(kept) != len(lines):
                fsutil.atomic_write(self.withdrawn_path, "".join(x + "\n" for x in kept))


def _lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            if not raw.endswith("\n"):
                raise CorruptCacheFile("its last line is torn (no newline)")
            yield raw[:-1]


def split_cached(value: str) -> tuple[str, str]:
    """(maker, canonical result text) of a value of :meth:`ResultCache.table`."""
    maker, _, text = value.partition(" ")
    return maker, text


def _read_header(path: Path, run_id: str) -> frozenset[tuple[str, str]]:
    builds: set[tuple[str, str]] = set()
    lines = _lines(path)
    first = next(lines, None)
    if first == f"{OLD_MAGIC} {run_id}":
        raise CorruptCacheFile("format 1, written before results kept their maker node "
                               "and run: not used (the next complete runs refill the store)")
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
        if (not KEY.fullmatch(key) or len(words) != 8 or words[2] not in CACHED_ERRORS
                or not MAKER.fullmatch(words[0])):
            raise CorruptCacheFile(f"line {n + 1} is not '<key> <maker> <result>': "
                                   f"{line[:120]!r}")
        out[key] = text
        count += 1
    if not ended:
        raise CorruptCacheFile("it has no end line (truncated)")
    return out

