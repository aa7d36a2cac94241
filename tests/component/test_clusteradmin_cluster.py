"""clusteradmin against a whole local cluster running real gs: node disable keeps a node
from getting jobs in the next run, and history finds exactly the runs in which a test
changed over a sequence of real runs (one test file changed, then changed back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.helpers import CORPUS, FAST, REPO, free_port

pytestmark = pytest.mark.e2e

#: Drawn over golfer.eps after its art, before its showpage: its output changes.
STROKE = "0 setgray 20 setlinewidth 7 31 moveto 577 726 lineto stroke\n"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    overrides = {**FAST, "base_port": str(free_port(5)), "monitor_port": str(free_port()),
                 "status_port": "0", "gs_configs": "ppmraw.72.0"}
    local = LocalCluster(tmp_path / "home", 2, CORPUS, overrides)
    local.prepare()
    try:
        yield local
    finally:
        local.stop(grace=10)


def admin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "clusteradmin.py"),
                           *cluster.config_args(), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "USER": "tester"})


def admin_json(cluster: LocalCluster, *args: str) -> Any:
    done = admin(cluster, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def machines(archive: Path) -> set[str]:
    return {row.machine for row in read_tab(archive / f"{archive.name}.tab").values()}


def test_disable_keeps_a_node_out_of_the_next_run_and_history_finds_the_changes(
        cluster: LocalCluster) -> None:
    cluster.start()
    cluster.wait_for_nodes()
    tree = write_demo_tree(cluster.home_dir / "alice" / "ghostpdl", "gs", [])
    golfer = cluster.home_dir / "tests" / CORPUS.name / "golfer.eps"
    original = golfer.read_text(encoding="latin-1")

    def run() -> Path:
        before = cluster.archives()
        spec = cluster.push(tree, "alice", ["gs"], [])
        return cluster.wait_for_run(spec, before, 300)

    nodes = {n["name"]: n for n in admin_json(cluster, "ls")["nodes"]}
    assert set(nodes) == {"node1", "node2"} and nodes["node2"]["state"] == "up"
    unknown = admin(cluster, "node", "disable", "node9")
    assert unknown.returncode == 1 and "node node9 is unknown" in unknown.stderr

    first = run()

    done = admin(cluster, "node", "disable", "node2", "--reason", "new disk")
    assert done.returncode == 0 and "node node2 disabled" in done.stdout, done.stderr
    assert (cluster.home.nodes / "node2.down").read_text().startswith("disabled by tester@")
    again = admin(cluster, "node", "disable", "node2")
    assert again.returncode == 0 and "already disabled" in again.stdout
    listed = {n["name"]: n for n in admin_json(cluster, "ls")["nodes"]}
    assert listed["node2"]["state"] == "disabled"
    assert listed["node2"]["disabled_reason"] == "new disk"
    text = admin(cluster, "ls").stdout
    assert "node2: disabled by tester@" in text and "(new disk)" in text

    golfer.write_text(original.replace("showpage\n%%EOF", STROKE + "showpage\n%%EOF"),
                      encoding="latin-1")
    assert golfer.read_text(encoding="latin-1") != original
    second = run()  # node2 is disabled: node1 runs every job
    assert machines(second) == {"node1"}
    assert list(admin_json(cluster, "info", second.name)["by_node"]) == ["node1"]

    done = admin(cluster, "node", "enable", "node2")
    assert done.returncode == 0 and "node node2 enabled" in done.stdout
    assert admin(cluster, "node", "enable", "node2").stdout.strip() == \
        "node node2 is not disabled"
    third = run()  # nothing changed

    golfer.write_text(original, encoding="latin-1")
    fourth = run()  # golfer.eps as it was

    tables = [read_tab(a / f"{a.name}.tab") for a in (first, second, third, fourth)]
    names = sorted(tables[0])
    assert len(names) == 15 and all(sorted(t) == names for t in tables)
    changed = [n for n in names if tables[1][n].md5 != tables[0][n].md5]
    assert changed == [n for n in names if "golfer" in n]  # only the test whose file changed
    for name in names:
        expected = [first.name] + [a.name for i, a in enumerate((second, third, fourth),
                                                                start=1)
                                   if tables[i][name].md5 != tables[i - 1][name].md5]
        got = admin_json(cluster, "history", name)["changes"]
        assert [c["run"] for c in got] == expected[::-1], name
    [golfer_test] = changed
    got = admin_json(cluster, "history", golfer_test.replace("__", "/"))["changes"]
    assert [(c["run"], c["change"]) for c in got] == [
        (fourth.name, "md5"), (second.name, "md5"), (first.name, "new")]
    assert got[0]["against"] == third.name and got[1]["against"] == first.name
    assert all(c["who"] == "alice" and c["kind"] == "user" for c in got)
    text = admin(cluster, "history", golfer_test).stdout
    assert f"{fourth.name}  user alice  md5:" in text
    missing = admin(cluster, "history", "ex__no-such-test.ps")
    assert missing.returncode == 1 and "ex__no-such-test.ps" in missing.stderr
