"""A finished run's CI files, kept as facts and rendered when asked (docs/operating.md,
"Waiting for a run from CI: `clusterpush --wait --junit`").

The master's end step writes only :data:`FACTS_NAME` into ``archive/<run id>/``: what
:class:`~cluster.report.ciresult.CiResult` says of the run (how it ended, the tests that
failed with their previous rows, the skipped ones, the slower ones), a few hundred bytes
per changed test and nothing per unchanged one.  The JUnit XML and the JSON document,
which hold a line per test of the run, are rendered from those facts and the archived
``<run id>.tab`` by whoever wants them (:func:`render`): ``clusterpush --wait --junit``,
``--fetch`` and the status page's ``junit.xml`` and ``result.json`` links.  So a run of a
million tests costs the master's end step nothing for CI, and a run nobody asks about
is never rendered.

Contract: :func:`save` then :func:`load` gives back an equal ``CiResult``; :func:`render`
of the same archive folder gives the same bytes every time.  A run archived before the
facts file existed, with ``junit.xml`` and ``result.json`` written whole, is rendered by
reading those files (:func:`render` falls back to them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from cluster.report import ciresult
from cluster.report.ciresult import CiResult, Failure
from cluster.report.indeterminate import Kind, Verdict
from cluster.report.slowdowns import Slowdown
from cluster.report.tab import TabRow
from cluster.runtime import fsutil

#: The facts file in ``archive/<run id>/``.
FACTS_NAME = "ci.json"
#: The kinds :func:`render` renders, and the file name each is served and fetched as.
KINDS = {"junit": ciresult.JUNIT_NAME, "json": ciresult.JSON_NAME}
#: How much of a file is read at a time when a whole one is passed on [bytes].
_CHUNK = 1 << 16


class NoCiFacts(LookupError):
    """The archive folder holds no CI facts (a sweep or bmpcmp run, an unfinished one)."""


def to_document(result: CiResult) -> dict[str, object]:
    """``result`` as a JSON-able document (the facts file's content).  Pure."""
    return {
        "run": result.run_id, "seconds": result.seconds, "complete": result.complete,
        "ending": result.ending,
        "failures": {name: {"why": f.why, "old": f.old.line() if f.old is not None else None}
                     for name, f in result.failures.items()},
        "skipped": {name: {"kind": v.kind.value, "digests": list(v.digests),
                           "nodes": list(v.nodes), "why": v.why}
                    for name, v in result.skipped.items()},
        "slower": [{"name": s.name, "seconds": s.seconds, "median": s.median, "runs": s.runs}
                   for s in result.slower],
    }


def from_document(doc: dict[str, object]) -> CiResult:
    """The ``CiResult`` a facts document holds; ValueError naming what is malformed."""
    try:
        failures_doc = doc["failures"]
        skipped_doc = doc["skipped"]
        slower_doc = doc["slower"]
        if not (isinstance(failures_doc, dict) and isinstance(skipped_doc, dict)
                and isinstance(slower_doc, list)):
            raise TypeError("failures and skipped must be objects, slower a list")
        failures = {str(name): Failure(str(f["why"]), TabRow.parse(f["old"])
                                       if f["old"] is not None else None)
                    for name, f in failures_doc.items()}
        skipped = {str(name): Verdict(str(name), Kind(v["kind"]), tuple(v["digests"]),
                                      tuple(v["nodes"]), str(v.get("why", "")))
                   for name, v in skipped_doc.items()}
        slower = [Slowdown(str(s["name"]), float(s["seconds"]), float(s["median"]),
                           int(s["runs"])) for s in slower_doc]
        return CiResult(str(doc["run"]), float(doc["seconds"]),  # type: ignore[arg-type]
                        complete=bool(doc["complete"]), ending=str(doc["ending"]),
                        failures=failures, skipped=skipped, slower=slower)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"CI facts: expected the document {FACTS_NAME} holds "
                         f"(run, seconds, complete, ending, failures, skipped, slower): "
                         f"{type(exc).__name__} {exc}") from None


def save(archive: Path, result: CiResult) -> None:
    """Write ``result``'s facts into the archive folder ``archive`` (atomically)."""
    fsutil.atomic_write(archive / FACTS_NAME, json.dumps(to_document(result)) + "\n")


def load(archive: Path) -> CiResult:
    """The CI facts of the archived run in ``archive``; NoCiFacts when it has none,
    ValueError when the file is malformed."""
    try:
        text = (archive / FACTS_NAME).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NoCiFacts(f"{archive / FACTS_NAME}: no CI facts (a sweep or bmpcmp run, or "
                        "one archived before they were kept)") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{archive / FACTS_NAME}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{archive / FACTS_NAME}: expected a JSON object")
    return from_document(doc)


def has_ci(archive: Path) -> bool:
    """Whether the archived run in ``archive`` has CI files to render."""
    return (archive / FACTS_NAME).is_file() or (archive / ciresult.JUNIT_NAME).is_file()


def changed(archive: Path) -> int | None:
    """How many tests of the archived run changed (differences and new errors); None
    when it has no CI facts."""
    try:
        return load(archive).changed
    except NoCiFacts:
        pass
    whole = archive / ciresult.JSON_NAME  # archived whole, before the facts were kept
    try:
        return int(json.loads(whole.read_text(encoding="utf-8"))["changed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _rows(table: Path) -> Iterator[TabRow]:
    """The rows of ``table`` a line at a time; a line that does not parse is left out."""
    if not table.exists():
        return
    with open(table, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                yield TabRow.parse(line)
            except ValueError:
                continue


def render(archive: Path, kind: str) -> Iterator[str]:
    """The ``kind`` (``junit`` or ``json``, :data:`KINDS`) CI file of the archived run in
    ``archive``, as text chunks: from its facts and its ``.tab`` (read twice, as the count
    comes first), or the whole file archived by an older master.  NoCiFacts when it has
    neither; ValueError for an unknown kind or malformed facts."""
    if kind not in KINDS:
        raise ValueError(f"CI file kind {kind!r}: expected one of {', '.join(KINDS)}")
    try:
        result = load(archive)
    except NoCiFacts:
        whole = archive / KINDS[kind]
        if not whole.is_file():
            raise
        return _whole(whole)
    table = archive / f"{result.run_id}.tab"
    count = sum(1 for _ in _rows(table)) if result.complete else 0
    chunks = ciresult.junit_chunks if kind == "junit" else ciresult.json_chunks
    return chunks(result, _rows(table) if result.complete else iter(()), count)


def _whole(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk


def write(archive: Path, kind: str, dest: Path) -> None:
    """Render the ``kind`` CI file of ``archive`` into ``dest`` (atomically)."""
    fsutil.atomic_write(dest, render(archive, kind))
