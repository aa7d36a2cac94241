"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.localcluster import LocalCluster
from tests.helpers import CORPUS, FAST, free_port

MakeCluster = Callable[..., LocalCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """``make_cluster(nodes=2, corpus=CORPUS, **settings)``: a prepared (not started) local
    cluster with the FAST settings on free ports; every one made is stopped afterwards."""
    clusters: list[LocalCluster] = []

    def make(nodes: int = 2, corpus: Path = CORPUS, **settings: str) -> LocalCluster:
        base = free_port(5)
        overrides = {**FAST, "base_port": str(base), "monitor_port": str(free_port()),
                     "status_port": str(free_port()),
                     **settings}
        cluster = LocalCluster(tmp_path / f"home{len(clusters)}", nodes, corpus, overrides)
        cluster.prepare()
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop(grace=10)
