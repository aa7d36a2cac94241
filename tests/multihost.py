"""A cluster spread over network namespaces: the master on one "machine", each node on its own.

:class:`MultiHost` puts, in the master namespace of a :class:`tests.netns.Topology`, a real
OpenSSH server (:class:`cluster.runtime.sshd.PrivateSshd`, port 22 on
:data:`tests.netns.SERVICE_ADDRESS`), the monitor and the supervisor (a
:class:`cluster.localcluster.LocalCluster` whose processes are wrapped into the namespace,
listening on the service address).  Each node is a ``clusterpull.py`` in its own host
namespace, configured as a node on another machine is: its own ``node.conf`` with
``transport = ssh``, the master home's absolute path on the master, its own copy of the
client key and a known_hosts file holding the master's host key.  Nodes run in a mount
namespace where the master's directory (``root/master``: the home and the sshd's files) is
an empty tmpfs, so everything they get from the master came over the network.

Layout under ``root``::

    master/home/        the master home (hidden from nodes)
    master/ssh/         the sshd's keys, config and log (hidden from nodes)
    <node>/node.conf    a node's configuration
    <node>/id_ed25519   its copy of the client key (0600)
    <node>/known_hosts  the master's host key as [10.231.0.1]:22 ... (port 22: plain address)
    <node>/work/        its work directory
    <node>/clusterpull.out   what its clusterpull printed
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.config import Config
from cluster.demotree import write_demo_tree
from cluster.home import Home
from cluster.localcluster import LocalCluster
from cluster.runtime import proc
from cluster.runtime.sshd import PrivateSshd
from tests import netns
from tests.helpers import CORPUS, FAST, REPO

#: The node settings of a remote node beyond FAST: a cut link must be noticed in seconds.
NODE_FAST = {"io_timeout": "5", "connect_retry_delay": "1", "connect_retries": "10"}
#: A run over the corpus on two 1-slot nodes sharing two cores with other tests [s].
RUN_TIMEOUT = 600
#: How long a stopped clusterpull has before its namespace's processes are killed [s].
STOP_GRACE = 15.0


class NetnsCluster(LocalCluster):
    """A LocalCluster whose monitor and supervisor run in the master namespace."""

    def check_ports(self, cfg: Config | None = None) -> None:
        """Nothing to check: the master namespace is new, nothing in it listens yet (and
        the service address does not exist out here, where this runs)."""


@dataclass
class RemoteNode:
    name: str
    host: netns.Host
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def work(self) -> Path:
        return self.dir / "work"

    @property
    def conf(self) -> Path:
        return self.dir / "node.conf"

    @property
    def out(self) -> Path:
        return self.dir / "clusterpull.out"

    def run_log(self) -> str:
        """What its run.py processes logged (work/log/run.log), '' if nothing yet."""
        try:
            return (self.work / "log" / "run.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class MultiHost:
    """A master namespace with sshd, monitor and supervisor, and remote nodes (see module)."""

    root: Path
    topo: netns.Topology
    settings: dict[str, str] = field(default_factory=dict)
    corpus: Path = CORPUS
    #: The checkout the supervisor (and so the clustermasters, and the node code it
    #: publishes) runs from; None = this repository.
    master_repo: Path | None = None
    nodes: dict[str, RemoteNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.master_root = self.root / "master"
        self.home_dir = self.master_root / "home"
        master = self.topo.master
        self.overrides = {**FAST, **NODE_FAST, **self.settings,
                          "listen_address": netns.SERVICE_ADDRESS}
        self.cluster = NetnsCluster(self.home_dir, 0, self.corpus, self.overrides,
                                    wrap=self._wrap)
        self.cluster.prepare()
        self.sshd = PrivateSshd(self.master_root / "ssh", address=netns.SERVICE_ADDRESS,
                                port=22, netns=master.netns)

    # ------------------------------------------------------------------ master
    def _wrap(self, role: str, argv: list[str]) -> list[str]:
        """The master's processes run in the master namespace; the supervisor from
        ``master_repo`` if one is given."""
        if role == "supervisor" and self.master_repo is not None:
            argv = [argv[0], str(self.master_repo / Path(argv[1]).name), *argv[2:]]
        return self.topo.master.argv(argv)

    def start_master(self) -> None:
        """Start the sshd, then the monitor and the supervisor, in the master namespace."""
        self.sshd.start(timeout=30)
        self.cluster.sshd = self.sshd  # stopped with the cluster
        self.cluster.start()

    # ------------------------------------------------------------------ nodes
    def node_settings(self) -> dict[str, str]:
        """The --set settings every node gets: the cluster's timings and ports (the node
        keys among them matter), never the master's own paths."""
        return {k: v for k, v in self.overrides.items() if k != "listen_address"}

    def make_node(self, name: str, *, key: Path | None = None,
                  known_hosts: Path | None = None, extra: str = "") -> RemoteNode:
        """Write node ``name``'s directory: node.conf, its key and known_hosts (copies of the
        sshd's unless given); the node must be a role of the topology."""
        node = RemoteNode(name, self.topo.hosts[name], self.root / name)
        # Its own key in the master home, as bootstrap_node.py makes it on the master.
        nodekeys.ensure_node_key(self.home_dir, name)
        node.dir.mkdir(parents=True, exist_ok=True)
        node.work.mkdir(exist_ok=True)
        node_key = node.dir / "id_ed25519"
        shutil.copyfile(key or self.sshd.client_key, node_key)
        os.chmod(node_key, 0o600)
        shutil.copyfile(known_hosts or self.sshd.known_hosts, node.dir / "known_hosts")
        node.conf.write_text(
            "# A node on another machine: it reaches the master only over ssh and TCP.\n"
            "[node]\n"
            f"node_name = {name}\n"
            f"master_host = {netns.SERVICE_ADDRESS}\n"
            f"master_home = {self.home_dir}\n"
            "transport = ssh\n"
            f"ssh_port = {self.sshd.port}\n"
            f"ssh_user = {self.sshd.user}\n"
            f"ssh_key = {node_key}\n"
            f"ssh_known_hosts = {node.dir / 'known_hosts'}\n"
            f"work_dir = {node.work}\n"
            "slots = 1\n" + extra, encoding="utf-8")
        self.nodes[name] = node
        return node

    def node_argv(self, node: RemoteNode, script: str = "clusterpull.py",
                  *args: str) -> list[str]:
        argv = [sys.executable, str(REPO / script), "--config", str(node.conf)]
        for key, value in self.node_settings().items():
            argv += ["--set", f"{key}={value}"]
        return [*argv, *args]

    def start_node(self, name: str) -> RemoteNode:
        """Start ``name``'s clusterpull in its namespace, the master's directory hidden."""
        node = self.nodes.get(name) or self.make_node(name)
        node.proc = node.host.spawn(self.node_argv(node), node.out, hide=[self.master_root],
                                    cwd=node.dir)
        return node

    def run_on(self, name: str, argv: list[str], timeout: float,
               env: dict[str, str] | None = None) -> proc.Result:
        """Run ``argv`` on host ``name`` as its processes run (the master hidden)."""
        return self.topo.hosts[name].run(argv, timeout=timeout, hide=[self.master_root],
                                         env=env, cwd=self.root / name
                                         if (self.root / name).is_dir() else None)

    def stop_node(self, name: str, grace: float = STOP_GRACE) -> None:
        node = self.nodes[name]
        if node.proc is None:
            return
        proc.kill_tree(node.proc.pid, signal.SIGTERM)
        try:
            node.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill_tree(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)
        node.proc = None

    # ------------------------------------------------------------------ the end
    def stop(self) -> None:
        """Stop the nodes, then the master side; the topology's teardown kills the rest."""
        for name in list(self.nodes):
            try:
                self.stop_node(name)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.cluster.stop(grace=10)


# ---------------------------------------------------------------------------------------------
# What the multi-machine tests share

def run_once(cluster: LocalCluster, options: tuple[str, ...] = (),
             timeout: float = RUN_TIMEOUT) -> Path:
    """Push the demo gs tree (with ``options``) and wait for the run's archive."""
    tree = write_demo_tree(cluster.home_dir / "demo" / "gs", "gs", list(options))
    before = cluster.archives()
    spec = cluster.push(tree, "tester", ["gs"], [])
    return cluster.wait_for_run(spec, before, timeout)


def tab_names(archive: Path) -> list[str]:
    text = (archive / f"{archive.name}.tab").read_text()
    return [line.split("\t", 1)[0] for line in text.splitlines()]


def journal_machines(home: Home) -> Counter[str]:
    try:
        lines = home.results(0).read_text().splitlines()[1:]
    except FileNotFoundError:
        return Counter()
    return Counter(line.split(" ", 1)[0] for line in lines)


def start_all(mh: MultiHost, *names: str) -> None:
    mh.start_master()
    for name in names or tuple(mh.topo.hosts):
        mh.start_node(name)


MakeMultiHost = Callable[..., MultiHost]


@pytest.fixture(name="make_multihost")
def multihost_fixture(tmp_path: Path) -> Iterator[MakeMultiHost]:
    """The fixture ``make_multihost`` (a test module imports this function to have it):
    ``make_multihost(roles=("node1", "node2"), master_repo=None, **settings)`` makes a
    topology with those host namespaces and a MultiHost on it (master prepared, nothing
    started); everything is stopped and the namespaces removed afterwards, whatever
    happened."""
    why = netns.check_can_run()
    assert why is None, why  # under CI a missing capability is a failure, not a skip
    made: list[tuple[netns.Topology, MultiHost | None]] = []

    def make(roles: tuple[str, ...] = ("node1", "node2"), master_repo: Path | None = None,
             **settings: str) -> MultiHost:
        topo = netns.Topology(list(roles)).create()
        made.append((topo, None))
        multihost = MultiHost(tmp_path / f"mh{len(made)}", topo, settings,
                              master_repo=master_repo)
        made[-1] = (topo, multihost)
        return multihost

    try:
        yield make
    finally:
        for topo, multihost in made:
            try:
                if multihost is not None:
                    multihost.stop()
            finally:
                topo.destroy()
