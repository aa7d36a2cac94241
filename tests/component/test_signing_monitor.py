"""Signed heartbeats against a real monitor on loopback (issue 11): an unsigned, wrongly
signed or replayed heartbeat is refused with one log line and not recorded; the answer is
signed, and a node believes no answer it cannot verify."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.home import Home
from cluster.master.monitor import MonitorServer, ensure_cluster_secret
from cluster.node import heartbeat as node_heartbeat
from cluster.wire import signing
from cluster.wire.heartbeat import Heartbeat, format_heartbeat
from tests.helpers import REPO

RUN = "20261123000000-p0-cafe"


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    h.job_start(0).write_text(f"id {RUN}\n")
    return h


@pytest.fixture
def server(home: Home) -> Iterator[MonitorServer]:
    srv = MonitorServer(home, ("127.0.0.1", 0))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_monitor_makes_the_cluster_secret_once(home: Home) -> None:
    key = ensure_cluster_secret(home)
    path = home.cluster_secret
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert signing.parse_secret(text) == key
    assert ensure_cluster_secret(home) == key and path.read_text() == text  # never rewritten
    path.write_text("not a secret\n")
    with pytest.raises(Exception, match="not a usable cluster secret"):
        MonitorServer(home, ("127.0.0.1", 0))


def test_unsigned_and_forged_heartbeats_are_refused_and_not_recorded(
        server: MonitorServer, home: Home, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="cluster.monitor")
    port = server.server_address[1]
    plain = format_heartbeat(Heartbeat("intruder", status="pwned"))
    unsigned = _raw(port, plain)
    other_key = signing.parse_secret(signing.new_secret())
    forged = _raw(port, signing.sign_request(plain, other_key, signing.NonceSource().next()))
    assert unsigned.startswith(b"ERROR unsigned request") and b"\nsig " not in unsigned
    assert forged.startswith(b"ERROR bad signature") and b"\nsig " not in forged
    assert not (home.nodes / "intruder.up").exists()
    assert not (home.nodes / "intruder.status").exists()
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2
    assert all("peer 127.0.0.1:" in ln and "(claims node intruder)" in ln for ln in lines)


def test_a_signed_heartbeat_is_recorded_and_its_replay_refused(
        server: MonitorServer, home: Home) -> None:
    port = server.server_address[1]
    key = signing.parse_secret(home.cluster_secret.read_text())
    nonce = signing.NonceSource().next()
    data = signing.sign_request(format_heartbeat(Heartbeat("n1", status="idle")), key, nonce)
    reply = _raw(port, data)
    assert signing.verify_reply(reply, key, nonce) == f"job 0 {RUN}\nEND\n".encode()
    up = home.nodes / "n1.up"
    assert up.exists()
    up.unlink()
    again = _raw(port, data)
    assert again.startswith(b"ERROR replayed nonce") and not up.exists()
    # The client does all this itself.
    assert node_heartbeat.send_heartbeat("127.0.0.1", port, "n1",
                                         secret=home.cluster_secret.read_text()) == [(0, RUN)]
    assert up.exists()


def test_the_node_believes_no_answer_it_cannot_verify(tmp_path: Path) -> None:
    """A stand-in monitor answers a job, unsigned: the node refuses it (and would read its
    secret again at the next heartbeat)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while not data.endswith(b"OK\n"):
                data += conn.recv(4096)
            conn.sendall(f"job 0 {RUN}\nEND\n".encode())

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(node_heartbeat.HeartbeatUnverified, match="nothing of it used"):
            node_heartbeat.send_heartbeat("127.0.0.1", port, "n1",
                                          secret=signing.new_secret())
    finally:
        thread.join(5)
        listener.close()


def test_heartbeat_script_with_a_wrong_secret_fails(server: MonitorServer, home: Home,
                                                    tmp_path: Path) -> None:
    """heartbeat.py reads the secret through its transport; a node's stale copy (here, a
    master home whose secret is not the monitor's) gets exit 2 and records nothing."""
    other = Home(tmp_path / "stale")
    other.create()
    ensure_cluster_secret(other)
    argv = [sys.executable, str(REPO / "heartbeat.py"),
            "--set", f"monitor_port={server.server_address[1]}",
            "--set", "master_host=127.0.0.1", "--set", "node_name=stale-node"]
    done = subprocess.run([*argv, "--set", f"master_home={other.root}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "bad signature" in done.stderr, done.stderr
    assert not (home.nodes / "stale-node.up").exists()
    done = subprocess.run([*argv, "--set", f"master_home={home.root}"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == f"0 {RUN}\n", done.stderr
    assert (home.nodes / "stale-node.up").exists()
