"""Indeterminate tests found across runs (docs/results.md, "Differences confirmed,
indeterminate tests named"): the same job, another output.

A job's result-cache key (:func:`cluster.master.cache.resultcache.key_of`) is the digest of what
its output may depend on: the node's build of the programs it calls, its test file's
content and its command line.  When a run's result for a job differs from the result an
earlier complete run stored under the same key, nothing the job depends on changed, yet
its output did: the test is indeterminate, whether or not this run's confirm phase saw it.

:func:`changed_under_same_key` looks only at the tests the report lists as changed (at most
:data:`MAX_LOOKED`), and only at results a node of this run made (a result taken from the
cache is the stored one).  It reads the store before this run's results are stored in it
(the report step runs before the store, :mod:`cluster.master.end.endrun`).  With the result
cache on, such a job is usually reused rather than run; a run with ``reuse=no`` (a nightly
audit, say) runs it and finds out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cluster.master.cache import reuse
from cluster.master.cache.resultcache import FileDigests, ResultCache, key_of, split_cached
from cluster.master.files.journal import split_line
from cluster.master.state.runstate import RunState
from cluster.report.indeterminate import digest
from cluster.wire.protocol import parse_result

#: Changed tests looked up at most, per run.
MAX_LOOKED = 1000


def changed_under_same_key(state: RunState, run_dir: Path, store: Path, tests_root: Path,
                           changed: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """(test, node, stored digest, this run's digest) of each test of ``changed`` whose
    result in ``state`` differs from the one the result cache ``store`` holds under the same
    key (the builds of the run's nodes are in ``run_dir``'s builds file; the corpus is
    ``tests_root``)."""
    builds = reuse.load_builds(run_dir / reuse.BUILDS_FILE)
    keyed = {node: dict(d) for node, d in builds.items() if d}
    pairs = {pair for digests in builds.values() for pair in digests}
    if not keyed:
        return []
    table = ResultCache(store, 1).table(pairs)  # reads only; pruning is the store step's
    if not table:
        return []
    files = FileDigests(tests_root)
    index = state.jobs.index
    found: list[tuple[str, str, str, str]] = []
    for name in changed[:MAX_LOOKED]:
        i = index.get(name)
        if i is None or not state.results.has(i):
            continue
        machine, text = split_line(state.results.line(i))
        build = keyed.get(machine)  # a reused result (cache:<node>@<run>) is not looked at
        key = key_of(state.jobs.line(i), files, build) if build is not None else None
        stored = table.get(key) if key is not None else None
        if stored is None:
            continue
        now, before = parse_result(text, machine), parse_result(split_cached(stored)[1], "")
        if before.name != name:
            continue
        old, new = digest(before.error, before.md5), digest(now.error, now.md5)
        if old != new:
            found.append((name, machine, old, new))
    return found
