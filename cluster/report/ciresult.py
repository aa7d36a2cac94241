"""A finished run's result for CI: JUnit XML and one JSON document (docs/operating.md,
"Waiting for a run from CI: `clusterpush --wait --junit`").

Pure functions from plain facts: the run's ``.tab`` rows, the previous rows of the tests
that changed, which tests changed (confirmed or unconfirmed differences, new errors),
the confirm phase's verdicts and the slower tests.  The master's end step writes both
files beside ``report.txt`` (:data:`JUNIT_NAME`, :data:`JSON_NAME`); ``clusterpush
--wait`` copies them where CI wants them and takes its exit status from
:attr:`CiResult.changed`.

Per test of the ``.tab`` one ``<testcase classname=<product> name=<test> time=...>``: a
difference (its md5 changed) or a new error is a ``<failure>`` naming the old and new md5
and the node; an indeterminate test (its second run gave another digest) is
``<skipped>`` with its digests; every other test passes.  Slower tests are
``<property>`` elements of the suite.  A run that did not complete is one ``<testcase>``
with an ``<error>`` saying how it ended.  Both are written as a stream of text chunks:
a table of a million rows is never held as objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

from cluster.report.compare import display_name
from cluster.report.indeterminate import Kind, Verdict
from cluster.report.slowdowns import Slowdown
from cluster.report.tab import TabRow

#: The files in ``archive/<run id>/``.
JUNIT_NAME = "junit.xml"
JSON_NAME = "result.json"


@dataclass(frozen=True)
class Failure:
    """A test that changed: ``why`` is ``difference`` or ``new error``; ``old`` the
    previous row (None: the test is new)."""

    why: str
    old: TabRow | None


@dataclass(frozen=True)
class CiResult:
    """What the CI files say of one run (everything but the passing rows themselves)."""

    run_id: str
    seconds: float
    complete: bool = True
    ending: str = ""  # how a run that did not complete ended ("failed: ...")
    failures: Mapping[str, Failure] = field(default_factory=dict)
    skipped: Mapping[str, Verdict] = field(default_factory=dict)
    slower: Sequence[Slowdown] = ()

    @property
    def changed(self) -> int:
        """Tests whose result changed (differences and new errors)."""
        return len(self.failures)


def ci_result(run_id: str, seconds: float, previous: Mapping[str, TabRow],
              differences: Iterable[str], new_errors: Iterable[str],
              verdicts: Iterable[Verdict], slower: Sequence[Slowdown] = ()) -> CiResult:
    """The facts of a complete run: ``differences`` (tests whose md5 changed, the
    indeterminate ones already left out) and ``new_errors`` (tests that started erroring)
    fail; ``previous`` holds their rows of the table compared with (a test not in it is
    new); the indeterminate tests of ``verdicts`` are skipped."""
    failures: dict[str, Failure] = {}
    for name in new_errors:
        failures[name] = Failure("new error", previous.get(name))
    for name in differences:
        failures.setdefault(name, Failure("difference", previous.get(name)))
    skipped = {v.test: v for v in verdicts if v.kind is Kind.INDETERMINATE
               and v.test not in failures}
    return CiResult(run_id, seconds, failures=failures, skipped=skipped, slower=slower)


def incomplete_result(run_id: str, seconds: float, ending: str) -> CiResult:
    """A run that did not complete (``ending``: how it ended and why)."""
    return CiResult(run_id, seconds, complete=False, ending=ending)


def _digest(row: TabRow | None) -> str:
    if row is None:
        return "none (new test)"
    return row.md5 if row.error == 0 else f"error {row.error}"


def failure_message(name: str, failure: Failure, row: TabRow) -> str:
    """One line: ``difference: md5 <old> -> <new> on node1 (was on node2)``."""
    text = (f"{failure.why}: {display_name(name)} md5 {_digest(failure.old)} -> "
            f"{_digest(row)} on {row.machine}")
    if failure.old is not None and failure.old.machine:
        text += f" (was {failure.old.machine})"
    return text


def skipped_message(verdict: Verdict) -> str:
    """Why an indeterminate test is skipped, with its digests and nodes."""
    return (f"indeterminate: md5s {' -> '.join(verdict.digests)} on "
            f"{', '.join(verdict.nodes)}: its second run gave another digest")


def _suite_name(run_id: str) -> str:
    return f"cluster run {run_id}"


def junit_chunks(result: CiResult, rows: Iterable[TabRow], tests: int) -> Iterator[str]:
    """The JUnit XML of ``result`` whose ``.tab`` has ``tests`` rows, ``rows``."""
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    name = quoteattr(_suite_name(result.run_id))
    seconds = f"{result.seconds:.3f}"
    if not result.complete:
        yield (f"<testsuites name={name} tests=\"1\" failures=\"0\" errors=\"1\" "
               f"time=\"{seconds}\">\n")
        yield (f"  <testsuite name={name} tests=\"1\" failures=\"0\" errors=\"1\" "
               f"skipped=\"0\" time=\"{seconds}\">\n")
        yield (f"    <testcase classname=\"cluster\" name={quoteattr(result.run_id)} "
               f"time=\"{seconds}\">\n")
        yield (f"      <error message={quoteattr('the run did not complete: ' + result.ending)}"
               "/>\n    </testcase>\n  </testsuite>\n</testsuites>\n")
        return
    fails, skips = len(result.failures), len(result.skipped)
    yield (f"<testsuites name={name} tests=\"{tests}\" failures=\"{fails}\" errors=\"0\" "
           f"time=\"{seconds}\">\n")
    yield (f"  <testsuite name={name} tests=\"{tests}\" failures=\"{fails}\" errors=\"0\" "
           f"skipped=\"{skips}\" time=\"{seconds}\">\n")
    if result.slower:
        yield "    <properties>\n"
        for slow in result.slower:
            value = (f"{slow.seconds:.2f} s, median {slow.median:.2f} s of {slow.runs} "
                     f"run(s), x{slow.ratio:.1f}")
            yield (f"      <property name={quoteattr('slower: ' + display_name(slow.name))} "
                   f"value={quoteattr(value)}/>\n")
        yield "    </properties>\n"
    for row in rows:
        head = (f"    <testcase classname={quoteattr(row.product)} "
                f"name={quoteattr(display_name(row.name))} time=\"{row.time1:.2f}\"")
        failure = result.failures.get(row.name)
        verdict = result.skipped.get(row.name)
        if failure is not None:
            message = failure_message(row.name, failure, row)
            yield (f"{head}>\n      <failure message={quoteattr(message)} "
                   f"type={quoteattr(failure.why)}/>\n    </testcase>\n")
        elif verdict is not None:
            yield (f"{head}>\n      <skipped message={quoteattr(skipped_message(verdict))}/>"
                   "\n    </testcase>\n")
        else:
            yield f"{head}/>\n"
    yield "  </testsuite>\n</testsuites>\n"


def json_chunks(result: CiResult, rows: Iterable[TabRow], tests: int) -> Iterator[str]:
    """The same facts as :func:`junit_chunks`, as one JSON object: ``run``, ``complete``,
    ``ending``, ``seconds``, ``tests``, ``changed``, ``failures``, ``skipped`` (counts),
    ``slower`` (a list) and ``results``: per test ``name``, ``product``, ``node``,
    ``seconds``, ``md5``, ``error``, ``status`` (passed, failed, skipped), and for a
    failed test ``why``, ``old_md5``, ``old_error``, ``old_node``, ``message``; for a
    skipped one ``digests``, ``nodes``, ``message``."""
    head = {"run": result.run_id, "complete": result.complete, "ending": result.ending,
            "seconds": round(result.seconds, 3), "tests": tests if result.complete else 0,
            "changed": result.changed, "failures": len(result.failures),
            "skipped": len(result.skipped),
            "slower": [{"name": display_name(s.name), "seconds": s.seconds,
                        "median": s.median, "runs": s.runs} for s in result.slower]}
    yield json.dumps(head)[:-1] + ', "results": ['
    if result.complete:
        first = True
        for row in rows:
            yield ("\n" if first else ",\n") + json.dumps(_json_row(result, row))
            first = False
    yield "\n]}\n"


def _json_row(result: CiResult, row: TabRow) -> dict[str, object]:
    out: dict[str, object] = {
        "name": display_name(row.name), "product": row.product, "node": row.machine,
        "seconds": row.time1, "md5": row.md5, "error": row.error, "status": "passed"}
    failure = result.failures.get(row.name)
    verdict = result.skipped.get(row.name)
    if failure is not None:
        old = failure.old
        out.update(status="failed", why=failure.why,
                   old_md5=old.md5 if old is not None else None,
                   old_error=old.error if old is not None else None,
                   old_node=old.machine if old is not None else None,
                   message=failure_message(row.name, failure, row))
    elif verdict is not None:
        out.update(status="skipped", digests=list(verdict.digests),
                   nodes=list(verdict.nodes), message=skipped_message(verdict))
    return out
