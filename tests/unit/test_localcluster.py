"""LocalCluster: extra environment variables for one node's processes; the port rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cluster.config import Config
from cluster.localcluster import LocalCluster, LocalClusterError, cluster_ports, free_port
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


def _cluster(home: Path, nodes: int) -> LocalCluster:
    """A LocalCluster on free ports with a minimal cluster.conf (start() checks the ports)."""
    cluster = LocalCluster(home, nodes=nodes, overrides={"base_port": str(free_port(3)),
                                                         "monitor_port": str(free_port())})
    cluster.home.create()
    cluster.conf_path.write_text("[master]\nhome = .\n", encoding="utf-8")
    return cluster


def test_node_env_reaches_only_that_node(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    FakePopen.calls = []
    monkeypatch.setattr(runtime_proc.subprocess, "Popen", FakePopen)
    cluster = _cluster(tmp_path / "home", 2)
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
    cluster = _cluster(tmp_path / "home", 0)
    proc = cluster.start_node("node9", env={"CLUSTER_SLOWDOWN": "3"})
    assert cluster.node_procs["node9"] is proc
    assert spawned("clusterpull.py", "node9")["env"]["CLUSTER_SLOWDOWN"] == "3"
    cluster.start_node("node10")
    assert spawned("clusterpull.py", "node10")["env"] is None


def test_cluster_ports_names_each_role() -> None:
    ports = cluster_ports(Config(base_port=9100, monitor_port=9110))
    assert sorted(ports) == [9100, 9101, 9102, 9110]
    assert "priority 2" in ports[9102] and "monitor" in ports[9110]


def test_a_port_shared_by_two_roles_is_refused() -> None:
    with pytest.raises(LocalClusterError, match=r"port 9101 is both the clustermaster of "
                                                r"priority 1.*and the monitor"):
        cluster_ports(Config(base_port=9100, monitor_port=9101))
