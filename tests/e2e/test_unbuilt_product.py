"""End to end: a product whose program no node's build made is reported as not
tested, once, while the run's other products are tested as usual and no node is lost.
(One node lacking a program another node's build made is that node's fault:
tests/e2e/test_node_faults.py.)"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.localrunend import run_end
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS

pytestmark = pytest.mark.e2e

#: A PCL file (reset, text, form feed, reset): its jobs call gpcl6 and are never run here.
PCL_FILE = b"\x1bEHello from PCL\r\n\x0c\x1bE"


def test_a_product_the_build_did_not_make_is_reported_once_and_the_rest_runs(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus" / "mixed"
    corpus.mkdir(parents=True)
    shutil.copy(CORPUS / "tiger.eps", corpus / "tiger.eps")
    (corpus / "hello.pcl").write_bytes(PCL_FILE)
    # Strict limits, so that losing nodes (what this replaces) would end the run at once.
    cluster = make_cluster(corpus=corpus, gs_configs="ppmraw.72.0 pbmraw.72.0",
                           pcl_configs="pbmraw.75.0 pdf.ppmraw.75.0",
                           max_failed_nodes="1", max_tries="1")
    cluster.start()
    # The demo tree's make writes bin/gs only: no bin/gpcl6.
    tree = write_demo_tree(cluster.home_dir / "demo" / "gs", "gs", [])
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs", "pcl"], [])
    archive = cluster.wait_for_run(spec, before, timeout=240)

    end = run_end(archive)
    assert end.complete, end.describe()
    table = read_tab(archive / f"{archive.name}.tab")
    assert sorted(table) == ["mixed__tiger.eps.pbmraw.72.0", "mixed__tiger.eps.ppmraw.72.0"]
    assert all(r.error == 0 and r.product == "gs" for r in table.values())
    text = (archive / "report.txt").read_text()
    # Both builds, or the first alone when the other had not joined by the verdict.
    line = re.compile(r"product pcl not tested: no node's build made gpcl6 \(built on "
                      r"(node1, node2|node1|node2); 2 tests not run\)")
    assert line.search(text), text
    assert text.count("not tested") == 1, text
    assert "ran 2 tests in" in text
    assert "Nodes lost" not in text and "removed" not in text, text
    info = (archive / "run.info").read_text()
    assert "programs gpcl6,gs" in info
    # No node failed or was dropped: the master's and the nodes' logs.
    logs = "".join(p.read_text(errors="replace") for p in cluster.home.log_dir.iterdir()
                   if p.suffix in (".log", ".out"))
    assert "build made no gpcl6" in logs
    for words in ("dropped", "failure 1", "cannot run jobs", "rejoined"):
        assert words not in logs, words
