"""End to end (docs/results.md, "Results reused"): one misbehaving node's wrong outputs are
never served to another user's run: the check of the reused results catches them.

Two nodes build the same tree (the same ``bin/gs`` and ``bin/gpcl6`` bytes, so the same
digests), but node2 misbehaves: its node process has ``MISBEHAVE`` set, and the tree's
``bin/gs`` wrapper then gives gs a fixed page size, so every gs output it makes differs,
while its build and its digests are node1's (the variable is no part of a key, as
``GS_OPTIONS`` is: bad RAM or a fault nothing on disk shows looks the same from the
master).  The tree's ``bin/gpcl6`` wrapper ignores it: its outputs are right on both
nodes.

1. bob's first run on both nodes: each job runs once, some on node2 (their gs outputs
   wrong), and every result is stored in the result cache;
2. carol's run of the same tree, on node1 alone (``exclude=node2``): its checks
   (``reuse_verify`` left at its default, 2%: deterministic all the same, since at least
   one sample is drawn per program build and maker node, so node2's gs results are
   always sampled, and every one of them is wrong) find node2's gs md5 wrong, withdraw
   that gs build, and run every gs job on node1.  No gs row is reused; every gs md5 is
   node1's; the report has the section "Reused results checked" naming the mismatch; the
   pcl rows that are reused name the node and run that made them
   (``cache:<node>@<bob's run>``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from cluster.report.tab import read_tab
from tests.e2e.conftest import MakeCluster
from tests.helpers import CORPUS

pytestmark = pytest.mark.e2e

FILES = {"alphabet.ps": "alphabet.ps", "colorcir.ps": "colorcir.ps",
         "golfer.eps": "golfer.ps", "snowflak.ps": "snowflak.ps",
         "grayalph.ps": "grayalph.pcl", "spots.ps": "spots.pcl", "doretree.ps": "doretree.pcl",
         "escher.ps": "escher.pcl"}
MAKEFILE = "all:\n\tsh ./make_wrappers.sh\n"
#: Each job waits a little, so both nodes take jobs in the first run.
WRAPPERS = """\
set -e
mkdir -p bin
gs=$(command -v gs)
bad='[ -z "$MISBEHAVE" ] || set -- $MISBEHAVE "$@"'
printf '#!/bin/sh\\nsleep 0.3\\n%s\\nexec %s "$@"\\n' "$bad" "$gs" > bin/gs
printf '#!/bin/sh\\nsleep 0.3\\nexec %s "$@"\\n' "$gs" > bin/gpcl6
chmod +x bin/gs bin/gpcl6
"""
#: What makes node2's gs outputs differ: another page size, whatever the job's -r.
MISBEHAVE = {"MISBEHAVE": "-dDEVICEWIDTHPOINTS=400 -dDEVICEHEIGHTPOINTS=400 -dFIXEDMEDIA"}


def push(cluster: LocalCluster, tree: Path, user: str, *options: str) -> Path:
    before = cluster.archives()
    spec = cluster.push(tree, user, ["gs", "pcl"], list(options))
    return cluster.wait_for_run(spec, before, 180)


def test_a_misbehaving_nodes_outputs_are_never_served(make_cluster: MakeCluster,
                                                      tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for source, name in FILES.items():
        shutil.copyfile(CORPUS / source, corpus / name)
    cluster = make_cluster(corpus=corpus, gs_configs="pbmraw.72.0 pgmraw.72.0",
                           pcl_configs="pbmraw.75.0 pgmraw.75.0", result_cache="yes",
                           confirm_differences="no")  # reuse_verify: its default, 2%
    tree = tmp_path / "ghostpdl"
    tree.mkdir()
    (tree / "Makefile").write_text(MAKEFILE, encoding="utf-8")
    (tree / "make_wrappers.sh").write_text(WRAPPERS, encoding="utf-8")
    cluster.start(node_env={"node2": MISBEHAVE})

    first = push(cluster, tree, "bob")
    rows1 = read_tab(first / f"{first.name}.tab")
    by_node2 = {n for n, r in rows1.items() if r.machine == "node2"}
    gs_tests = {n for n in rows1 if ".pcl." not in n}
    assert rows1 and all(r.error == 0 for r in rows1.values())
    assert by_node2 & gs_tests, "node2 ran no gs job: nothing to catch"
    assert {r.machine for r in rows1.values()} == {"node1", "node2"}

    second = push(cluster, tree, "carol", "exclude=node2")
    rows2 = read_tab(second / f"{second.name}.tab")
    assert set(rows2) == set(rows1)
    # node2's wrong gs md5s are never served: every gs job ran on node1, and its md5 is
    # node1's (for the jobs node1 ran in bob's run, the same as then; for node2's, not).
    for name in gs_tests:
        assert rows2[name].machine == "node1", (name, rows2[name].machine)
        if name in by_node2:
            assert rows2[name].md5 != rows1[name].md5, name
        else:
            assert rows2[name].md5 == rows1[name].md5, name
    # The pcl results (right on both nodes) are reused, named by maker node and run.
    reused = {n: r.machine for n, r in rows2.items() if r.machine.startswith("cache:")}
    assert reused and set(reused) <= set(rows1) - gs_tests
    for name, machine in reused.items():
        assert machine == f"cache:{rows1[name].machine}@{first.name}", (name, machine)
    report = (second / "report.txt").read_text(encoding="utf-8")
    assert "Reused results checked" in report, report
    assert "MISMATCH " in report and f"in run {first.name}), now" in report, report
    assert f"{len(reused)} of {len(rows2)} tests reused" in report, report
    withdrawn = cluster.home_dir / "result-cache" / "withdrawn"
    assert withdrawn.read_text(encoding="utf-8").startswith("gs "), withdrawn
