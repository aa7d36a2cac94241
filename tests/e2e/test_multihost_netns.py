"""The namespace harness itself (tests/netns.py): links, cuts, isolation, clean-up.

These tests prove what the multi-machine tests rely on: a host reaches the master's
service address only over its own link, cutting that link cuts only that host, nothing
leaks into the machine's own network namespace, everything is removed afterwards (stale
namespaces of dead test processes too), and a node process started with ``hide`` cannot
read the master home while its own work directory works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

PORT = 9555
#: A one-connection-at-a-time echo server on the service address (bounded: 120 s).
SERVER = f"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(({netns.SERVICE_ADDRESS!r}, {PORT})); s.listen(8); s.settimeout(120)
print("listening", flush=True)
while True:
    c, a = s.accept()
    c.sendall(("hello " + a[0] + "\\n").encode()); c.close()
"""
CLIENT = f"""
import socket, sys
try:
    with socket.create_connection(({netns.SERVICE_ADDRESS!r}, {PORT}), timeout=2) as c:
        print(c.recv(100).decode().strip())
except OSError as e:
    print("error", e); sys.exit(1)
"""


def _hello(topo: netns.Topology, role: str) -> str:
    done = topo.hosts[role].run([sys.executable, "-c", CLIENT], timeout=30)
    return done.stdout.decode().strip()


@pytest.fixture
def topo() -> Iterator[netns.Topology]:
    why = netns.check_can_run()
    assert why is None, why  # under CI a missing capability is a failure, not a skip
    with netns.Topology(["node1", "node2"]) as made:
        yield made


def test_each_host_reaches_the_master_over_its_own_link_and_a_cut_cuts_only_it(
        topo: netns.Topology, tmp_path: Path) -> None:
    server = topo.master.spawn([sys.executable, "-c", SERVER], tmp_path / "server.log")
    try:
        wait_for(lambda: "listening" in (tmp_path / "server.log").read_text(), 30,
                 "the echo server")
        assert _hello(topo, "node1") == "hello 10.231.1.2"
        assert _hello(topo, "node2") == "hello 10.231.2.2"
        topo.cut("node1")
        assert _hello(topo, "node1").startswith("error")
        assert _hello(topo, "node2") == "hello 10.231.2.2"
        topo.restore("node1")
        wait_for(lambda: _hello(topo, "node1") == "hello 10.231.1.2", 30,
                 "node1 back after its link came up")
    finally:
        server.kill()
        server.wait(timeout=10)


def test_hosts_see_only_their_own_link_and_the_machine_sees_none_of_it(
        topo: netns.Topology) -> None:
    links = topo.hosts["node1"].run(["ip", "-o", "link"], timeout=30).stdout.decode()
    names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
    assert names == ["eth0", "lo"]
    own = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=30)
    assert "10.231." not in own.stdout and "to-node" not in own.stdout
    # No route out: the machine's network is not reachable from a host.
    routes = topo.hosts["node1"].run(["ip", "route"], timeout=30).stdout.decode()
    assert "default" not in routes


def test_destroy_removes_everything_and_stale_namespaces_of_dead_pids_go(
        tmp_path: Path) -> None:
    # A namespace as a test process that died would have left it.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.PREFIX}{dead.pid}-1-master"
    netns.ip("netns", "add", stale)
    sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "300"])
    try:
        with netns.Topology(["a1"]) as made:
            names = [h.netns for h in made.all]
            assert set(names) <= set(netns.namespaces())
            assert stale not in netns.namespaces()
            assert sleeper.wait(timeout=30) != 0  # killed with its namespace
            held = made.hosts["a1"].spawn(["sleep", "300"], tmp_path / "sleep.log")
        assert held.wait(timeout=30) != 0  # destroy killed what still ran inside
        assert not set(names) & set(netns.namespaces())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        netns.ip("netns", "delete", stale, check=False)


def test_a_failure_inside_the_with_still_removes_the_namespaces() -> None:
    made = netns.Topology(["b1"])
    with pytest.raises(RuntimeError, match="boom"), made:
        raise RuntimeError("boom")
    assert not {h.netns for h in made.all} & set(netns.namespaces())


def test_a_hidden_master_home_is_empty_inside_while_the_work_dir_works(
        topo: netns.Topology, tmp_path: Path) -> None:
    master = tmp_path / "master"
    home = master / "home"
    home.mkdir(parents=True)
    (home / "job.start").write_text("id secret-run\n")
    work = tmp_path / "node1-work"
    work.mkdir()
    script = (f"import os, pathlib\n"
              f"print(sorted(os.listdir({str(master)!r})))\n"
              f"print(os.path.exists({str(home / 'job.start')!r}))\n"
              f"p = pathlib.Path({str(work)!r}) / 'made-inside'\n"
              f"p.write_text('ok'); print(p.read_text())\n")
    done = topo.hosts["node1"].run([sys.executable, "-c", script], timeout=60, hide=[master])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.decode().split() == ["[]", "False", "ok"]
    # The work dir is the real one; the master home is untouched outside.
    assert (work / "made-inside").read_text() == "ok"
    assert (home / "job.start").read_text() == "id secret-run\n"
    # The hiding is a property of that process's mount namespace only.
    assert os.listdir(master) == ["home"]
    ls = topo.hosts["node1"].run(["cat", str(home / "job.start")], timeout=30, hide=[master])
    assert ls.returncode != 0 and b"No such file" in ls.stderr
