"""End to end: ``clusterpush --wait --junit --json`` against a real local cluster
(docs/operating.md, "Waiting for a run from CI: `clusterpush --wait --junit`")."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cluster.cli import clusterpush
from cluster.demotree import write_demo_tree
from cluster.report import cifiles
from tests.helpers import assert_valid_junit

pytestmark = pytest.mark.e2e

SMALL_GS = "ppmraw.72.0 pbmraw.72.0 pgmraw.300.1 pkmraw.72.0"


def test_push_wait_exits_0_when_unchanged_and_1_with_failures_when_an_option_changes(
        make_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = make_cluster(gs_configs=SMALL_GS)
    cluster.start()
    plain = write_demo_tree(tmp_path / "plain", "gs", [])
    changed = write_demo_tree(tmp_path / "changed", "gs", ["-dTextAlphaBits=4",
                                                            "-dGraphicsAlphaBits=4"])

    def push(tree: Path, name: str) -> tuple[int, ET.Element, dict[str, object]]:
        junit, result = tmp_path / f"{name}.xml", tmp_path / f"{name}.json"
        rc = clusterpush.main([*cluster.config_args(), "--user", "tester", "--copy",
                               "--tree", str(tree), "--wait", "--wait-timeout", "300",
                               "--junit", str(junit), "--json", str(result)])
        assert_valid_junit(junit)  # what Jenkins' JUnit reader takes
        return rc, ET.parse(junit).getroot(), json.loads(result.read_text())

    first, _, _ = push(plain, "first")
    assert first == 0  # compared with nothing: nothing changed
    rc, xml, doc = push(plain, "second")
    out = capsys.readouterr().out
    assert rc == 0, out
    suite = xml.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("60", "0", "0")
    assert len(suite.findall("testcase")) == 60 and doc["changed"] == 0
    assert "No differences in 60 non-pdfwrite/ps2write tests" in out

    rc, xml, doc = push(changed, "third")
    out = capsys.readouterr().out
    assert rc == 1, out
    suite = xml.find("testsuite")
    assert suite is not None
    failures = [c for c in suite.findall("testcase") if c.find("failure") is not None]
    assert failures and int(suite.get("failures") or 0) == len(failures) == doc["changed"]
    assert len(failures) < 60  # some outputs change, not all
    for case in failures:
        message = case.find("failure").get("message")  # type: ignore[union-attr]
        assert "md5" in message and "->" in message and " on node" in message
        assert case.get("name") in out  # the report names it too
    archive = Path(out.strip().splitlines()[-1])
    # The archive keeps the facts; the files are rendered from them, the same every time.
    assert (archive / "ci.json").is_file() and not (archive / "junit.xml").exists()
    assert "".join(cifiles.render(archive, "junit")).encode() == (
        tmp_path / "third.xml").read_bytes()
