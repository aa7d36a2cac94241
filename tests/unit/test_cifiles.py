"""A run's CI files kept as facts and rendered when asked (cluster.report.cifiles)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cluster.console import archivefiles
from cluster.console.archivefiles import ArchiveRefused
from cluster.home import Home
from cluster.report import cifiles, ciresult
from tests.helpers import assert_valid_junit
from tests.unit.test_ciresult import ROWS, result

RUN = "20270101000000-p0-0001"


def archived(folder: Path, res: ciresult.CiResult | None = None) -> ciresult.CiResult:
    """An archive folder with the run's table and its CI facts."""
    res = res if res is not None else result()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{res.run_id}.tab").write_text("".join(r.line() + "\n" for r in ROWS)
                                              + "a malformed line\n")
    cifiles.save(folder, res)
    return res


def test_the_facts_load_back_equal(tmp_path: Path) -> None:
    res = archived(tmp_path)
    assert cifiles.load(tmp_path) == res
    assert cifiles.changed(tmp_path) == res.changed == 2


def test_render_gives_what_the_whole_files_would_hold(tmp_path: Path) -> None:
    res = archived(tmp_path)
    for kind, chunks in (("junit", ciresult.junit_chunks), ("json", ciresult.json_chunks)):
        expected = "".join(chunks(res, iter(ROWS), len(ROWS)))  # the malformed line left out
        assert "".join(cifiles.render(tmp_path, kind)) == expected
    suite = ET.fromstring("".join(cifiles.render(tmp_path, "junit"))).find("testsuite")
    assert suite is not None and suite.get("tests") == "5" and suite.get("failures") == "2"


def test_an_incomplete_run_renders_its_ending(tmp_path: Path) -> None:
    archived(tmp_path, ciresult.incomplete_result("run1", 3.0, "failed: no nodes"))
    doc = json.loads("".join(cifiles.render(tmp_path, "json")))
    assert doc["complete"] is False and doc["tests"] == 0 and doc["ending"] == "failed: no nodes"


def test_a_run_archived_with_whole_files_is_served_from_them(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text("<testsuites/>\n")
    (tmp_path / "result.json").write_text('{"changed": 3}\n')
    assert "".join(cifiles.render(tmp_path, "junit")) == "<testsuites/>\n"
    assert cifiles.changed(tmp_path) == 3 and cifiles.has_ci(tmp_path)


def test_no_facts_and_bad_facts_say_what_is_wrong(tmp_path: Path) -> None:
    assert cifiles.changed(tmp_path) is None and not cifiles.has_ci(tmp_path)
    with pytest.raises(cifiles.NoCiFacts, match="no CI facts"):
        cifiles.render(tmp_path, "junit")
    (tmp_path / cifiles.FACTS_NAME).write_text('{"run": "r"}')
    with pytest.raises(ValueError, match="expected the document ci.json holds"):
        cifiles.load(tmp_path)
    with pytest.raises(ValueError, match="kind 'html'"):
        cifiles.render(tmp_path, "html")


def test_write_renders_into_a_file_that_validates_as_jenkins_junit(tmp_path: Path) -> None:
    archived(tmp_path / "a")
    cifiles.write(tmp_path / "a", "junit", tmp_path / "out.xml")
    assert (tmp_path / "out.xml").read_text() == "".join(cifiles.render(tmp_path / "a", "junit"))
    assert_valid_junit(tmp_path / "out.xml")
    archived(tmp_path / "b", ciresult.incomplete_result("run1", 3.0, "failed: <no nodes>"))
    cifiles.write(tmp_path / "b", "junit", tmp_path / "failed.xml")
    assert_valid_junit(tmp_path / "failed.xml")
    # The check can fail: a count that is not a number is refused.
    (tmp_path / "bad.xml").write_text((tmp_path / "out.xml").read_text().replace(
        'tests="5"', 'tests="five"'))
    with pytest.raises(AssertionError, match="not valid JUnit XML"):
        assert_valid_junit(tmp_path / "bad.xml")


def test_the_status_page_renders_a_runs_ci_file_from_its_facts(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.create()
    res = archived(home.archive / RUN, ciresult.ci_result(RUN, 1.0, {}, (), (), []))
    got = archivefiles.ci_file(home, f"{RUN}/junit.xml")
    assert got is not None
    fh, size, name = got
    with fh:
        body = fh.read()
    assert name == "junit.xml" and len(body) == size
    assert body.decode() == "".join(cifiles.render(home.archive / RUN, "junit"))
    assert res.run_id in body.decode()
    assert archivefiles.ci_file(home, f"{RUN}/report.txt") is None  # not a CI file
    with pytest.raises(ArchiveRefused) as refused:
        archivefiles.ci_file(home, "20990101000000-p0-none/junit.xml")
    assert refused.value.status == 404
    with pytest.raises(ArchiveRefused) as refused:
        archivefiles.ci_file(home, "../junit.xml")
    assert refused.value.status == 400
