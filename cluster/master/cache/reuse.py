"""One run's use of the result cache: results reused when nothing that matters
changed, and checked (docs/results.md, "Results reused").

* **When a node has built** (its request says ``built`` with its ``digests``: the sha256 of
  each program its build made, :mod:`cluster.node.builddigest`), :meth:`RunReuse.resolve`
  makes ONE pass over the run's jobs that have no result yet, computes each one's key for
  that build (:func:`cluster.master.cache.resultcache.key_of`) and returns those whose key an
  earlier complete run stored, with the stored result and its maker (``<node>@<run>``).  A
  build of a program whose cached results were withdrawn (a check found one wrong,
  :meth:`~cluster.master.cache.resultcache.ResultCache.withdrawn`) gives no key: its jobs run.
  :class:`~cluster.master.state.runstate.RunState` hands the hits to the run's checks
  (:mod:`cluster.master.cache.reuseverify`): a sample of them runs again, and the others are
  recorded only once their group's sample agreed, as the machine ``cache:<node>@<run>``
  (:data:`CACHE_PREFIX`): the node and run that made the result, which the report counts
  as reused and the ``.tab`` row shows.  Each distinct build is resolved once per master;
  a build that no stored run holds costs a read of the store's headers only.
* **The nodes' builds** are kept in ``runs/<id>/builds`` (``<node> <prog>=<sha256>,...``,
  a line appended when a node's build is first learnt or changes), so the run's end -- by
  this master or a successor -- knows each result's key.  A node listed with two builds
  (rebuilt after a restart) has no digests: its results are not stored (their key is
  unknown), never stored under the wrong one; nor are those of a node that sent none.
  What each node said moved in a program's key (its ``keychanges``) is kept beside it in
  ``runs/<id>/keychanges`` (``<node> <keychanges header value>``), for the report.
* **At a complete run's end** :func:`store_run` writes every result whose key is known
  into the store (the reused ones too, with their maker, so they stay while the runs go
  on reusing them); none made with a withdrawn build.

The bypass: a job whose name is in :attr:`RunReuse.bypass` is never taken from the cache
(a test known to be indeterminate: :func:`for_run` puts them all there; the confirm
phase's runs must run: add the test's name before the job is put back; a lookup
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
from cluster.master.cache.resultcache import (
    CACHED_ERRORS,
    FileDigests,
    ResultCache,
    job_inputs,
    key_of,
    split_cached,
)
from cluster.master.files.journal import split_line
from cluster.master.model.joblist import JobList
from cluster.master.model.results import Results
from cluster.report import indeterminate
from cluster.runoptions import RunOptions
from cluster.runspec import RunSpec
from cluster.wire.jobstart import JobStart
from cluster.wire.protocol import KeyChanges, format_keychanges, parse_digests, parse_keychanges

log = logging.getLogger("cluster.reuse")

#: The machine column's prefix of a reused result (no node name has a ``:``).
CACHE_PREFIX = "cache:"
#: The file of a run's nodes' builds, in ``runs/<id>/``.
BUILDS_FILE = "builds"
#: The file of what the run's nodes said moved in their programs' keys, in ``runs/<id>/``.
KEYCHANGES_FILE = "keychanges"
#: Jobs looked at per read of the job list in a pass.
_CHUNK = 4096

Digests = tuple[tuple[str, str], ...]


def maker_of(machine: str, run_id: str) -> str:
    """The maker (``<node>@<run>``) of a result of run ``run_id`` whose journal machine is
    ``machine``: a reused result's is in its machine (``cache:<node>@<run>``)."""
    if machine.startswith(CACHE_PREFIX):
        return machine[len(CACHE_PREFIX):]
    return f"{machine}@{run_id}"


def load_keychanges(path: Path) -> list[tuple[str, KeyChanges]]:
    """(node, what moved in its programs' keys) of each line of a run's keychanges file,
    in order; a line that does not parse is logged and skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s: unreadable (%s); the report names no key changes", path, exc)
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        node, _, value = line.partition(" ")
        try:
            out.append((node, parse_keychanges(value)))
        except ValueError as exc:
            log.warning("%s:%d: %s; skipped", path, n, exc)
    return out


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
                 builds_path: Path, verify: float = 0.0) -> None:
        """``verify``: the share of each group of hits run again as a check
        (:mod:`cluster.master.cache.reuseverify`; :func:`for_run` gives master.conf's
        ``reuse_verify``); 0: none, every hit is recorded at once."""
        self.cache = cache
        self.tests = tests
        self.jobs = jobs
        self.builds_path = builds_path
        self.builds = load_builds(builds_path)
        self.verify = verify
        self.resolved: set[Digests] = set()
        #: The withdrawn (program, digest) pairs, read when a build is first resolved and
        #: added to by this run's own checks.
        self.withdrawn: set[tuple[str, str]] = set()
        self._withdrawn_read = False
        #: Node -> what moved in its programs' keys (its ``keychanges``), once per node.
        self.keychanges: dict[str, KeyChanges] = {}
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

    def note_keychanges(self, node: str, changes: KeyChanges) -> None:
        """Node ``node`` said what moved in its programs' keys: kept on disk (one line per
        node and change, so a successor's end has it) for the report."""
        if not changes or self.keychanges.get(node) == changes:
            return
        self.keychanges[node] = changes
        path = self.builds_path.with_name(KEYCHANGES_FILE)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{node} {format_keychanges(changes)}\n")

    def known_withdrawn(self) -> set[tuple[str, str]]:
        """The withdrawn pairs (the store's, read once, and this run's own)."""
        if not self._withdrawn_read:
            self.withdrawn |= self.cache.withdrawn()
            self._withdrawn_read = True
        return self.withdrawn

    def resolve(self, node: str, digests: Digests, offsets: array[int],
                not_run: bytearray | array[int]) -> tuple[list[int], list[str]]:
        """(job indexes, ``<maker> <canonical result text>`` values) of the jobs without
        a result (``offsets`` -1) and not marked not run whose key for ``digests`` the
        store holds, made with no withdrawn build; one pass over the job list, once per
        distinct build."""
        self.learn(node, digests)
        digests = self.builds.get(node, ())
        if not self.lookups or not digests or digests in self.resolved:
            return [], []
        self.resolved.add(digests)
        withdrawn = self.known_withdrawn()
        usable = tuple(pair for pair in digests if pair not in withdrawn)
        table = self.cache.table(usable) if usable else {}
        if not table:
            return [], []
        builds = dict(usable)  # a job calling a withdrawn build gets no key: it runs
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
                value = table.get(key)
                name = self.jobs.names[i]
                if (value is not None and split_cached(value)[1].partition(" ")[0] == name
                        and name not in self.bypass):
                    found.append(i)
                    texts.append(value)
        return found, texts


def run_entries(jobs: JobList, results: Results, builds: dict[str, Digests],
                tests: FileDigests, run_id: str,
                withdrawn: frozenset[tuple[str, str]] = frozenset(),
                stored: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """(key, ``<maker> <canonical result text>``) of each result of run ``run_id`` whose
    key is known and whose error code the cache keeps
    (:data:`~cluster.master.cache.resultcache.CACHED_ERRORS`), none made with a ``withdrawn``
    build.

    A node's result is keyed with its build (a node that sent no digests, or two builds,
    has none: not stored); its maker is ``<node>@<run_id>``.  A reused result
    (``cache:<node>@<run>``) keeps its maker, and its key is the one a build of this run
    gives it: when the run's builds give the job more than one key, the one ``stored``
    (the store's table before this run is added, read by the caller only then) holds with
    the same maker and text; none found: not stored again."""
    total = len(jobs)
    keyed = {node: dict(d) for node, d in builds.items() if d}
    distinct = list({tuple(sorted(d.items())): None for d in keyed.values()})
    for low in range(0, total, _CHUNK):
        todo = [i for i in range(low, min(total, low + _CHUNK)) if results.has(i)]
        for i, line in zip(todo, jobs.lines(todo), strict=True):
            machine, text = split_line(results.line(i))
            if text.split(" ", 2)[1] not in CACHED_ERRORS:
                continue
            inputs = job_inputs(line)
            if inputs is None:
                continue
            maker = maker_of(machine, run_id)
            if machine.startswith(CACHE_PREFIX):
                key = _reused_key(line, inputs[0], tests, distinct, withdrawn, stored,
                                  f"{maker} {text}")
            else:
                build = keyed.get(machine)
                if build is None or any((p, build.get(p)) in withdrawn for p in inputs[0]):
                    continue
                key = key_of(line, tests, build)
            if key is not None:
                yield key, f"{maker} {text}"


def _reused_key(line: str, programs: tuple[str, ...], tests: FileDigests,
                builds: list[Digests], withdrawn: frozenset[tuple[str, str]],
                stored: dict[str, str] | None, value: str) -> str | None:
    """The key a reused result was found under: the one key the run's builds give job
    ``line``, or, when they give several, the one ``stored`` holds as ``value``."""
    keys = set()
    for digests in builds:
        build = dict(digests)
        if any((p, build.get(p)) in withdrawn for p in programs):
            continue
        key = key_of(line, tests, build)
        if key is not None:
            keys.add(key)
    if len(keys) == 1:
        return keys.pop()
    if stored is None:
        return None
    return next((key for key in sorted(keys) if stored.get(key) == value), None)


def store_run(cache: ResultCache, run_id: str, jobs: JobList, results: Results,
              run_dir: Path, tests: FileDigests) -> int:
    """Store a complete run's keyed results (:func:`run_entries`) in ``cache``; the count."""
    builds = load_builds(run_dir / BUILDS_FILE)
    pairs = {pair for digests in builds.values() for pair in digests}
    if not pairs:
        return 0
    withdrawn = cache.withdrawn()
    # Several builds of a program in one run: a reused result's key is looked up in the
    # store as it stands (read only then: most runs have one build per program).
    programs = [p for p, _ in pairs]
    stored = cache.table(pairs - withdrawn) if len(programs) != len(set(programs)) else None
    return cache.save_run(run_id, pairs, run_entries(jobs, results, builds, tests, run_id,
                                                     withdrawn, stored))


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
                     home.run_dir(start.id) / BUILDS_FILE, verify=cfg.reuse_verify)
    # reuse=no: nothing is looked up, but the nodes' builds are learnt, so that the run's
    # results are stored with their keys, and compared with the stored ones of the same
    # key at its end (docs/results.md, "Differences confirmed, indeterminate tests named";
    # cluster.master.end.samebuild).
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
