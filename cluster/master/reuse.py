"""One run's use of the result cache (issue 26): results reused when nothing that matters
changed.

* **When a node has built** (its request says ``built`` with its ``digests``: the sha256 of
  each program its build made, :mod:`cluster.node.builddigest`), :meth:`RunReuse.resolve`
  makes ONE pass over the run's jobs that have no result yet, computes each one's key for
  that build (:func:`cluster.master.resultcache.key_of`) and returns those whose key an
  earlier complete run stored, with the stored result.  :class:`~cluster.master.runstate.
  RunState` marks them done (journaled like any result, so a master that takes over keeps
  them) under the machine ``cache:<node>``: the node whose build matched, which the report
  counts as reused and the ``.tab`` row shows.  Each distinct build is resolved once per
  master; a build that no stored run holds costs a read of the store's headers only.
* **The nodes' builds** are kept in ``runs/<id>/builds`` (``<node> <prog>=<sha256>,...``,
  a line appended when a node's build is first learnt or changes), so the run's end -- by
  this master or a successor -- knows each result's key.  A node listed with two builds
  (rebuilt after a restart) has no digests: its results are not stored (their key is
  unknown), never stored under the wrong one.
* **At a complete run's end** :func:`store_run` writes every result whose key is known
  into the store (the reused ones too, so they stay while the runs go on reusing them).

The bypass: a job whose name is in :attr:`RunReuse.bypass` is never taken from the cache
(a test known to be indeterminate: :func:`for_run` puts them all there; issue 26 item 3's
confirmation runs must run: add the test's name before the job is put back; a lookup
happens only when a node's build is first learnt, so a job put back later is served from
the cache only by a node with a new build, and never when bypassed).  A run
with master.conf's ``result_cache = no`` has no RunReuse at all (``RunState.reuse`` is
None); one with ``reuse=no`` has one that looks nothing up (``lookups`` False) but learns
its nodes' builds, so its results are stored with their keys.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Iterator
from pathlib import Path

from cluster.config import Config
from cluster.home import Home
from cluster.master.joblist import JobList
from cluster.master.journal import split_line
from cluster.master.resultcache import CACHED_ERRORS, FileDigests, ResultCache, key_of
from cluster.master.results import Results
from cluster.queue import RunSpec
from cluster.report import indeterminate
from cluster.runoptions import RunOptions
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import parse_digests

log = logging.getLogger("cluster.reuse")

#: The machine column's prefix of a reused result (no node name has a ``:``).
CACHE_PREFIX = "cache:"
#: The file of a run's nodes' builds, in ``runs/<id>/``.
BUILDS_FILE = "builds"
#: Jobs looked at per read of the job list in a pass.
_CHUNK = 4096

Digests = tuple[tuple[str, str], ...]


def load_builds(path: Path) -> dict[str, Digests]:
    """node -> its program digests, from a run's builds file ({} when there is none).  A
    node listed twice with different digests (its build changed within the run) gets none;
    a line that does not parse (a torn last line) is logged and skipped: its node's results
    are then not stored, never stored under a wrong key."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s: unreadable (%s); its nodes' results are not cached", path, exc)
        return {}
    builds: dict[str, Digests] = {}
    for n, line in enumerate(text.splitlines(), 1):
        node, _, value = line.partition(" ")
        try:
            digests = parse_digests(value)
        except ValueError as exc:
            log.warning("%s:%d: %s; node %s's results are not cached", path, n, exc, node)
            builds[node] = ()
            continue
        known = builds.get(node)
        builds[node] = digests if known is None or known == digests else ()
    return builds


class RunReuse:
    """The result cache as one run sees it: what its nodes built, and the lookups."""

    def __init__(self, cache: ResultCache, tests: FileDigests, jobs: JobList,
                 builds_path: Path) -> None:
        self.cache = cache
        self.tests = tests
        self.jobs = jobs
        self.builds_path = builds_path
        self.builds = load_builds(builds_path)
        self.resolved: set[Digests] = set()
        #: Test names never taken from the cache (confirmation runs: see the module doc).
        self.bypass: set[str] = set()
        #: False for a ``reuse=no`` run: builds are learnt, nothing is looked up.
        self.lookups = True

    def learn(self, node: str, digests: Digests) -> None:
        """Node ``node`` built the run as ``digests``: remembered (on disk when new)."""
        known = self.builds.get(node)
        if known == digests:
            return
        # A node whose build changed within the run: none of its results can be keyed.
        self.builds[node] = digests if known is None else ()
        # One appended line per node (not the whole file rewritten): a thousand nodes
        # joining cost a thousand small writes.  No fsync: a line lost in a crash only
        # keeps that node's results out of the cache.
        with open(self.builds_path, "a", encoding="utf-8") as fh:
            fh.write(f"{node} {','.join(f'{p}={d}' for p, d in digests)}\n")

    def resolve(self, node: str, digests: Digests, offsets: array[int],
                not_run: bytearray | array[int]) -> tuple[list[int], list[str]]:
        """(job indexes, canonical result texts) of the jobs without a result (``offsets``
        -1) and not marked not run whose key for ``digests`` the store holds; one pass over
        the job list, once per distinct build."""
        self.learn(node, digests)
        digests = self.builds.get(node, ())
        if not self.lookups or not digests or digests in self.resolved:
            return [], []
        self.resolved.add(digests)
        table = self.cache.table(digests)
        if not table:
            return [], []
        builds = dict(digests)
        found: list[int] = []
        texts: list[str] = []
        total = len(self.jobs)
        for low in range(0, total, _CHUNK):
            todo = [i for i in range(low, min(total, low + _CHUNK))
                    if offsets[i] < 0 and not not_run[i]]
            if not todo:
                continue
            for i, line in zip(todo, self.jobs.lines(todo), strict=True):
                key = key_of(line, self.tests, builds)
                if key is None:
                    continue
                text = table.get(key)
                name = self.jobs.names[i]
                if (text is not None and text.partition(" ")[0] == name
                        and name not in self.bypass):
                    found.append(i)
                    texts.append(text)
        return found, texts


def run_entries(jobs: JobList, results: Results, builds: dict[str, Digests],
                tests: FileDigests) -> Iterator[tuple[str, str]]:
    """(key, canonical result text) of each result of a run whose key is known: its
    machine's build was learnt (a reused result's machine is ``cache:<node>``), its error
    code is one the cache keeps (:data:`~cluster.master.resultcache.CACHED_ERRORS`)."""
    total = len(jobs)
    keyed = {node: dict(d) for node, d in builds.items() if d}
    for low in range(0, total, _CHUNK):
        todo = [i for i in range(low, min(total, low + _CHUNK)) if results.has(i)]
        for i, line in zip(todo, jobs.lines(todo), strict=True):
            machine, text = split_line(results.line(i))
            if text.split(" ", 2)[1] not in CACHED_ERRORS:
                continue
            build = keyed.get(machine.removeprefix(CACHE_PREFIX))
            if build is None:
                continue
            key = key_of(line, tests, build)
            if key is not None:
                yield key, text


def store_run(cache: ResultCache, run_id: str, jobs: JobList, results: Results,
              run_dir: Path, tests: FileDigests) -> int:
    """Store a complete run's keyed results (:func:`run_entries`) in ``cache``; the count."""
    builds = load_builds(run_dir / BUILDS_FILE)
    pairs = {pair for digests in builds.values() for pair in digests}
    if not pairs:
        return 0
    return cache.save_run(run_id, pairs, run_entries(jobs, results, builds, tests))


def for_run(cfg: Config, home: Home, spec: RunSpec, start: JobStart, options: RunOptions,
            jobs: JobList) -> RunReuse | None:
    """The result cache as run ``start`` uses it, or None when the run has nothing to do
    with it: master.conf's ``result_cache`` is off, it is an every_node run, or its results
    are not stored (:func:`stores`).  A run that says ``reuse=no`` looks nothing up
    (``lookups`` False) but learns its nodes' builds."""
    if not cfg.result_cache or options.every_node or not stores(cfg, spec, start):
        return None
    found = RunReuse(ResultCache(home.result_cache, cfg.result_cache_runs),
                     FileDigests(home.root / start.tests), jobs,
                     home.run_dir(start.id) / BUILDS_FILE)
    # reuse=no: nothing is looked up, but the nodes' builds are learnt, so that the run's
    # results are stored with their keys, and compared with the stored ones of the same
    # key at its end (issue 26 item 4, cluster.master.samebuild).
    found.lookups = options.reuse
    # A test known to change by itself (tables/indeterminate.tsv) always runs: a result
    # served from the cache would hide it.  Its results are still stored, so that the
    # run's end can compare them with the next one of the same key (samebuild).
    found.bypass.update(indeterminate.known(home.tables))
    return found


def stores(cfg: Config, spec: RunSpec, start: JobStart) -> bool:
    """Whether run ``start``'s results go into the result cache at its end (when it is
    complete): unless ``result_cache`` is off, it is a sweep or bmpcmp run, or its jobs
    call no program (job.start's ``programs`` is empty: shell runs; no job has a key).
    A run with ``reuse=no`` still stores its results (they were all run)."""
    return (cfg.result_cache and spec.sweep_file is None and not start.baseline
            and bool(start.programs))
