"""A port already taken is reported at once, and localcluster stops with that message.

Real sockets and the real scripts: a port held by a listening socket of this test, the real
``localcluster.py``, the real monitor and supervisor started by LocalCluster.  The bounds on
the time are generous (other tests share the machine); the point is "seconds, not the whole
--timeout" (an hour by default).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.errors import LocalClusterError
from cluster.home import Home
from cluster.localcluster import LocalCluster
from cluster.master.daemon import monitor
from tests.helpers import REPO, free_port

#: What "at once" means here, generously [seconds]; the scripts' own timeouts are 600 s.
PROMPT = 60.0
#: The --timeout given to localcluster.py: far longer than PROMPT, so only a prompt stop
#: can pass the tests.
LONG = 600


@pytest.fixture
def taken() -> Iterator[tuple[socket.socket, int]]:
    """A listening socket on a free loopback port, and that port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    yield sock, sock.getsockname()[1]
    sock.close()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A corpus of one small PostScript file (the tests here never run it)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "one.ps").write_text("%!PS\nshowpage\n")
    return folder


def run_localcluster(home: Path, corpus: Path, *settings: str) -> tuple[subprocess.
                                                                       CompletedProcess[str],
                                                                       float]:
    argv = [sys.executable, str(REPO / "localcluster.py"), "--home", str(home), "--corpus",
            str(corpus), "--nodes", "1", "--timeout", str(LONG),
            "--set", f"status_port={free_port()}"]  # a later --set may name another
    for setting in settings:
        argv += ["--set", setting]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=LONG, check=False)
    return done, time.monotonic() - start


def test_localcluster_py_stops_at_once_when_the_monitor_port_is_taken(
        tmp_path: Path, corpus: Path, taken: tuple[socket.socket, int]) -> None:
    _, port = taken
    home = tmp_path / "home"
    done, elapsed = run_localcluster(home, corpus, f"monitor_port={port}",
                                     f"base_port={free_port(5)}")
    assert done.returncode == 1, done.stderr
    assert elapsed < PROMPT, f"took {elapsed:.1f} s to notice port {port} was taken"
    assert f"port {port} on 127.0.0.1 (monitor: monitor_port) cannot be bound" in done.stderr
    assert f"held by pid {os.getpid()}" in done.stderr  # psutil names this test's process
    assert done.stdout == ""
    assert not (home / "log" / "monitor_port.out").exists()  # nothing was started


def test_localcluster_py_names_a_taken_master_port(
        tmp_path: Path, corpus: Path, taken: tuple[socket.socket, int]) -> None:
    _, port = taken
    done, elapsed = run_localcluster(tmp_path / "home", corpus, f"base_port={port - 1}",
                                     f"monitor_port={free_port()}")
    assert done.returncode == 1, done.stderr
    assert elapsed < PROMPT
    assert f"port {port} on 127.0.0.1 (clustermaster of priority 1: base_port + 1)" \
        in done.stderr


def test_start_spawns_nothing_when_a_port_is_taken(
        tmp_path: Path, corpus: Path, taken: tuple[socket.socket, int]) -> None:
    _, port = taken
    cluster = LocalCluster(tmp_path / "home", 1, corpus,
                           {"base_port": str(free_port(5)), "monitor_port": str(port),
                            "status_port": str(free_port())})
    cluster.prepare()
    with pytest.raises(LocalClusterError, match=f"port {port} "):
        cluster.start()
    assert cluster.procs == [] and cluster.daemons == {}


def _started(tmp_path: Path, corpus: Path, monitor_port: int) -> LocalCluster:
    cluster = LocalCluster(tmp_path / "home", 1, corpus,
                           {"base_port": str(free_port(5)),
                            "monitor_port": str(monitor_port),
                            "status_port": str(free_port())})
    cluster.prepare()
    return cluster


def test_a_monitor_that_exits_ends_the_wait_with_its_last_lines(
        tmp_path: Path, corpus: Path) -> None:
    """Another monitor holds the home: ours exits ("already running"); the wait stops."""
    cluster = _started(tmp_path, corpus, free_port())
    try:
        with monitor.acquire_lock(Home(cluster.home_dir), "another monitor"):
            cluster.start()
            start = time.monotonic()
            with pytest.raises(LocalClusterError) as err:
                cluster.wait_for_nodes(timeout=LONG)
            assert time.monotonic() - start < PROMPT
    finally:
        cluster.stop(grace=10)
    text = str(err.value)
    assert text.startswith("monitor_port.py exited (exit status 0)")
    assert "already running" in text and "monitor_port.out" in text


def test_a_port_taken_after_the_check_ends_the_wait_naming_the_port(
        tmp_path: Path, corpus: Path, taken: tuple[socket.socket, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the check cannot close: taken between the check and the monitor's bind."""
    _, port = taken
    cluster = _started(tmp_path, corpus, port)
    monkeypatch.setattr(cluster, "check_ports", lambda cfg=None: None)  # the port was free
    try:
        cluster.start()
        start = time.monotonic()
        with pytest.raises(LocalClusterError) as err:
            cluster.wait_for_nodes(timeout=LONG)
        assert time.monotonic() - start < PROMPT
    finally:
        cluster.stop(grace=10)
    assert str(err.value).startswith("monitor_port.py exited (exit status")
    assert str(port) in str(err.value)
