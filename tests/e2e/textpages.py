"""Pages of text on a local cluster running real gs: what the e2e tests of changed outputs
share (a change of ``-dTextAlphaBits=4`` in a push's build changes every page's pixels)."""

from __future__ import annotations

from pathlib import Path

from cluster.demotree import write_demo_tree
from cluster.localcluster import LocalCluster
from tests.e2e.conftest import MakeCluster


def text_cluster(tmp_path: Path, make_cluster: MakeCluster, page: str,
                 pages: int = 2, **settings: str) -> LocalCluster:
    """A started local cluster of real gs at ppmraw 72 dpi over ``pages`` PostScript files
    ``text<n>.ps`` made from ``page`` (a template with ``{n}``), its nodes up; ``settings``
    more master.conf settings."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(1, pages + 1):
        (corpus / f"text{n}.ps").write_text(page.format(n=n), encoding="ascii")
    cluster = make_cluster(corpus=corpus, **{"gs_configs": "ppmraw.72.0", "status_port": "0",
                                             **settings})
    cluster.start()
    cluster.wait_for_nodes()
    return cluster


def push_gs(cluster: LocalCluster, options: list[str], user: str = "alice",
            timeout: float = 90) -> Path:
    """``user``'s push of a gs tree built with ``options``; its archive once it ended."""
    tree = write_demo_tree(cluster.home_dir / user / "ghostpdl", "gs", options)
    before = cluster.archives()
    spec = cluster.push(tree, user, ["gs"], [])
    return cluster.wait_for_run(spec, before, timeout)
