"""The monitor under hostile clients: silent sockets cost only a socket (about 64
once made the thread-capped monitor refuse 29 of 32 honest heartbeats), unfinished requests
are bounded in total, and a port already taken is reported at once.  Real sockets, a real
monitor_port.py process.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.defaults import EXIT_PORT_TAKEN
from cluster.home import Home
from cluster.master.daemon import monitor
from cluster.master.daemon.monitor import MonitorServer
from cluster.node import heartbeat as node_heartbeat
from tests.helpers import REPO, give_key, wait_for

RUN = "20190408115600"
#: The master home of the test under way (the ``home`` fixture sets it): the nodes that
#: heartbeat are given their own keys there.
KEYS_HOME: Path | None = None


def send_heartbeat(*args: Any, **kwargs: Any) -> list[tuple[int, str]]:
    """The heartbeat of node ``args[2]``, signed with its own key (given it in
    :data:`KEYS_HOME` if it has none)."""
    assert KEYS_HOME is not None, "the home fixture gives the nodes their keys"
    return node_heartbeat.send_heartbeat(*args, secret=give_key(KEYS_HOME, args[2]), **kwargs)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    h.job_start(0).write_text(f"id {RUN}\nproduct gs\n")
    monkeypatch.setattr(sys.modules[__name__], "KEYS_HOME", h.root)
    return h


@contextlib.contextmanager
def _serve(server: MonitorServer) -> Iterator[MonitorServer]:
    """``server`` answering from a background thread until the block ends."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_silent_sockets_do_not_crowd_out_honest_heartbeats(home: Home) -> None:
    """With 200 silent sockets open, 32 honest heartbeats sent at once all get the right
    answer."""
    with _serve(MonitorServer(home, ("127.0.0.1", 0), deadline=60)) as srv:
        port = srv.server_address[1]
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10)
                  for _ in range(200)]
        try:
            wait_for(lambda: len(srv.conns) >= 200, 20, "200 silent connections")
            results: list[object] = [None] * 32

            def beat(i: int) -> None:
                try:
                    results[i] = send_heartbeat("127.0.0.1", port, f"honest{i}", timeout=20)
                except Exception as exc:  # recorded for the assertion
                    results[i] = exc

            threads = [threading.Thread(target=beat, args=(i,)) for i in range(32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert results == [[(0, RUN)]] * 32
            assert len(srv.conns) == 200  # the silent ones are still there, harmless
        finally:
            for sock in silent:
                sock.close()
        wait_for(lambda: not srv.conns, 20, "the monitor to drop the closed sockets")
    assert len(list(home.nodes.glob("honest*.up"))) == 32


def test_unfinished_requests_are_bounded_in_total(
        home: Home, caplog: pytest.LogCaptureFixture) -> None:
    """Partial requests each within the line limits but together over max_buffered: the
    one that would pass it gets ERROR (one log line); honest heartbeats are still served."""
    caplog.set_level(logging.WARNING, logger="cluster.monitor")
    line = b"status " + b"z" * 3000 + b"\n"
    with _serve(MonitorServer(home, ("127.0.0.1", 0), deadline=60,
                                    max_buffered=10_000)) as srv:
        port = srv.server_address[1]
        held = []
        try:
            for _ in range(2):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(b"node slow\n" + line)
                held.append(sock)
            wait_for(lambda: srv.buffered >= 6000, 10, "two partial requests to be held")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
                third.sendall(b"node slow\n" + line + line)
                reply = third.recv(4096)
            assert reply == b"ERROR monitor busy: open connections would hold more than " \
                            b"10000 bytes\n"
            assert send_heartbeat("127.0.0.1", port, "honest") == [(0, RUN)]
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda: srv.buffered == 0, 10, "the buffers to be freed")
    refused = [r.getMessage() for r in caplog.records if "monitor busy" in r.getMessage()]
    assert len(refused) == 1 and "peer 127.0.0.1:" in refused[0]


def _taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_run_reports_a_taken_port_at_once(home: Home,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """monitor.run returns EXIT_PORT_TAKEN at once, naming address and port."""
    caplog.set_level(logging.ERROR, logger="cluster.monitor")
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        start = time.monotonic()
        code = monitor.run(home, ("127.0.0.1", port), should_stop=lambda: False)
    assert code == EXIT_PORT_TAKEN != 0
    assert time.monotonic() - start < 10
    assert any(f"127.0.0.1:{port}: the port is taken" in r.getMessage()
               for r in caplog.records)


def test_monitor_port_script_exits_at_once_when_the_port_is_taken(home: Home) -> None:
    """The real monitor_port.py against a port another program listens on: a prompt exit
    with EXIT_PORT_TAKEN and a message naming the address and port, even with --quiet."""
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        start = time.monotonic()
        done = subprocess.run([sys.executable, str(REPO / "monitor_port.py"),
                               "--set", f"home={home.root}", "--set", f"monitor_port={port}",
                               "--set", "listen_address=127.0.0.1", "--quiet"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - start
    assert done.returncode == EXIT_PORT_TAKEN, done.stderr
    assert f"cannot listen for heartbeats on 127.0.0.1:{port}: the port is taken" \
        in done.stderr
    assert elapsed < 30
    log = (home.log_dir / "monitor_port.log").read_text()
    assert f"127.0.0.1:{port}: the port is taken" in log
