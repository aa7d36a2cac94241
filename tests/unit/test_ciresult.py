"""The CI files of a run (cluster.report.ciresult): JUnit XML and JSON from plain facts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from cluster.report import ciresult
from cluster.report.indeterminate import Kind, Verdict
from cluster.report.slowdowns import Slowdown
from cluster.report.tab import TabRow


def row(name: str, md5: str, machine: str = "node1", error: int = 0) -> TabRow:
    return TabRow(name, error, 1.5, 0.1, 0.2, md5, "r1", "gs", machine)


ROWS = [row("a__x.pdf.ppmraw.72.0", "aaa"), row("b.ps.ppmraw.72.0", "bbb"),
        row("c.ps.ppmraw.72.0", "0", error=1), row("d.ps.ppmraw.72.0", "ddd"),
        row("e.ps.ppmraw.72.0", "eee")]
PREVIOUS = {"b.ps.ppmraw.72.0": row("b.ps.ppmraw.72.0", "old-b", "node2"),
            "c.ps.ppmraw.72.0": row("c.ps.ppmraw.72.0", "old-c", "node2")}
VERDICTS = [Verdict("b.ps.ppmraw.72.0", Kind.CONFIRMED, ("old-b", "bbb", "bbb"),
                    ("node1", "node2")),
            Verdict("d.ps.ppmraw.72.0", Kind.INDETERMINATE, ("old-d", "ddd", "dd2"),
                    ("node1", "node2"))]
SLOWER = [Slowdown("e.ps.ppmraw.72.0", 9.0, 3.0, 5)]


def result() -> ciresult.CiResult:
    return ciresult.ci_result("run1", 12.5, PREVIOUS, ["b.ps.ppmraw.72.0"],
                              ["c.ps.ppmraw.72.0"], VERDICTS, SLOWER)


def junit(res: ciresult.CiResult, rows: list[TabRow] = ROWS) -> ET.Element:
    return ET.fromstring("".join(ciresult.junit_chunks(res, iter(rows), len(rows))))


def test_the_junit_xml_has_a_testcase_per_row_and_counts_that_match() -> None:
    root = junit(result())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests")) == len(ROWS)
    failures = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert int(suite.get("failures")) == len(failures) == 2
    assert int(suite.get("skipped")) == len(skipped) == 1
    assert suite.get("errors") == "0" and float(suite.get("time")) == 12.5
    assert {c.get("name") for c in cases} >= {"a/x.pdf.ppmraw.72.0"}  # shown names
    assert all(c.get("classname") == "gs" and float(c.get("time")) == 1.5 for c in cases)


def test_every_failure_names_the_old_and_new_md5_and_the_node() -> None:
    cases = {c.get("name"): c for c in junit(result()).iter("testcase")}
    diff = cases["b.ps.ppmraw.72.0"].find("failure")
    assert diff is not None
    assert "old-b" in diff.get("message") and "bbb" in diff.get("message")
    assert "node1" in diff.get("message") and diff.get("type") == "difference"
    new_error = cases["c.ps.ppmraw.72.0"].find("failure")
    assert new_error is not None and new_error.get("type") == "new error"
    assert "old-c" in new_error.get("message") and "error 1" in new_error.get("message")
    skip = cases["d.ps.ppmraw.72.0"].find("skipped")
    assert skip is not None and "old-d" in skip.get("message") and "dd2" in skip.get("message")


def test_slower_tests_are_properties_of_the_suite() -> None:
    props = junit(result()).findall("testsuite/properties/property")
    assert [p.get("name") for p in props] == ["slower: e.ps.ppmraw.72.0"]
    assert "9.00 s" in props[0].get("value") and "median 3.00 s" in props[0].get("value")


def test_a_run_compared_with_nothing_passes_every_test() -> None:
    res = ciresult.ci_result("run1", 1.0, {}, (), (), [])
    suite = junit(res).find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and res.changed == 0
    assert all(len(c) == 0 for c in suite.iter("testcase"))


def test_an_incomplete_run_is_one_error() -> None:
    res = ciresult.incomplete_result("run1", 3.0, "failed: node node1 failed <build>")
    suite = junit(res).find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("tests") == "1"
    error = suite.find("testcase/error")
    assert error is not None and "failed: node node1 failed <build>" in error.get("message")
    doc = json.loads("".join(ciresult.json_chunks(res, iter(ROWS), len(ROWS))))
    assert doc["complete"] is False and doc["results"] == [] and "failed" in doc["ending"]


def test_the_json_holds_the_same_facts() -> None:
    doc = json.loads("".join(ciresult.json_chunks(result(), iter(ROWS), len(ROWS))))
    assert (doc["run"], doc["tests"], doc["changed"], doc["failures"], doc["skipped"]) == (
        "run1", 5, 2, 2, 1)
    by_name = {r["name"]: r for r in doc["results"]}
    assert by_name["b.ps.ppmraw.72.0"]["status"] == "failed"
    assert (by_name["b.ps.ppmraw.72.0"]["old_md5"], by_name["b.ps.ppmraw.72.0"]["md5"],
            by_name["b.ps.ppmraw.72.0"]["old_node"]) == ("old-b", "bbb", "node2")
    assert by_name["d.ps.ppmraw.72.0"]["status"] == "skipped"
    assert by_name["d.ps.ppmraw.72.0"]["digests"] == ["old-d", "ddd", "dd2"]
    assert by_name["a/x.pdf.ppmraw.72.0"]["status"] == "passed"
    assert doc["slower"] == [{"name": "e.ps.ppmraw.72.0", "seconds": 9.0, "median": 3.0,
                              "runs": 5}]


def test_names_with_markup_characters_are_escaped() -> None:
    odd = [row('x<&>"y.ps.ppmraw.72.0', "1")]
    res = ciresult.ci_result("run1", 1.0, {}, [odd[0].name], (), [])
    case = junit(res, odd).find("testsuite/testcase")
    assert case is not None and case.get("name") == 'x<&>"y.ps.ppmraw.72.0'
    assert case.find("failure") is not None
