"""LocalCluster: extra environment variables for one node's processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cluster.localcluster import LocalCluster
from cluster.runtime import proc as runtime_proc


class FakePopen:
    """Records how LocalCluster would start a process, starts nothing."""

    calls: list[tuple[list[str], dict[str, Any]]] = []

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        FakePopen.calls.append((argv, kwargs))
        self.pid = 4242


def spawned(script: str, name: str = "") -> dict[str, Any]:
    for argv, kwargs in FakePopen.calls:
        if argv[1].endswith(script) and (not name or f"node_name={name}" in argv):
            return kwargs
    raise AssertionError(f"{script} {name} was not started")


def test_node_env_reaches_only_that_node(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    cluster = LocalCluster(tmp_path / "home", nodes=2)
    cluster.home.create()
    cluster.start({"node2": {"CLUSTER_SLOWDOWN": "5"}})
    assert len(FakePopen.calls) == 4  # monitor, supervisor, node1, node2
    env = spawned("clusterpull.py", "node2")["env"]
    assert env["CLUSTER_SLOWDOWN"] == "5" and env["PATH"] == os.environ["PATH"]
    # Everything else inherits the environment unchanged, as before.
    assert spawned("clusterpull.py", "node1")["env"] is None
    assert spawned("monitor_port.py")["env"] is None
    assert spawned("run_clustermaster.py")["env"] is None


def test_start_node_takes_env_and_overrides(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    monkeypatch.setenv("CLUSTER_SLOWDOWN", "1")
    cluster = LocalCluster(tmp_path / "home", nodes=0)
    cluster.home.create()
    proc = cluster.start_node("node9", env={"CLUSTER_SLOWDOWN": "3"})
    assert cluster.node_procs["node9"] is proc
    assert spawned("clusterpull.py", "node9")["env"]["CLUSTER_SLOWDOWN"] == "3"
    cluster.start_node("node10")
    assert spawned("clusterpull.py", "node10")["env"] is None
