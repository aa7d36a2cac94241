"""Signed heartbeats against a real monitor on loopback (docs/protocol.md,
"Signed messages"): each node signs
with the heartbeat key of its own key (``node-keys/<name>.key``); an unsigned, wrongly
signed or replayed heartbeat, one signed with another node's key, or one from a name the
master holds no key for is refused with one log line and not recorded; the replay guard
outlives the monitor; the answer is signed, and a node believes no answer it cannot
verify."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.config import DEFAULTS
from cluster.home import Home
from cluster.master.daemon.monitor import GUARD_FILE, MonitorServer
from cluster.master.files.keycache import NodeKeyCache
from cluster.node import heartbeat as node_heartbeat
from cluster.wire import signing
from cluster.wire.heartbeat import Heartbeat, format_heartbeat
from tests.helpers import REPO, give_key

RUN = "20261123000000-p0-cafe"
#: The monitor's answer while run RUN waits.
ANSWER = f"job 0 {RUN}\nEND\n".encode()


@pytest.fixture
def home(tmp_path: Path) -> Home:
    h = Home(tmp_path / "home")
    h.create()
    h.job_start(0).write_text(f"id {RUN}\n")
    return h


@contextlib.contextmanager
def _serve(home: Home) -> Iterator[MonitorServer]:
    """A monitor of ``home`` answering from a background thread until the block ends (then
    stopped and closed, as monitor_port.py stops it)."""
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


@pytest.fixture
def server(home: Home) -> Iterator[MonitorServer]:
    with _serve(home) as srv:
        yield srv


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def _key(home: Home, node: str) -> bytes:
    """The heartbeat key of node ``node``, from its own key in ``home`` (given it if it has
    none)."""
    return signing.heartbeat_key(signing.parse_secret(give_key(home.root, node)))


def _signed(node: str, key: bytes, nonce: str) -> bytes:
    """Node ``node``'s heartbeat (status idle), signed with ``key`` for ``nonce``."""
    return signing.sign_request(format_heartbeat(Heartbeat(node, status="idle")), key, nonce)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]


def test_a_local_node_makes_its_own_key_once(server: MonitorServer, home: Home) -> None:
    """A node on the master's file system (transport local) makes its key when it is
    missing (0600 in a 0700 node-keys/), never rewrites it, and is heard with it."""
    cfg = DEFAULTS.with_changes(master_home=home.root, transport="local", node_name="n1")
    path = nodekeys.key_path(home.root, "n1")
    assert not path.exists()
    node_heartbeat.forget_node_secrets()
    try:
        text = node_heartbeat.node_secret(cfg)
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.stat().st_mode & 0o777 == 0o700
        assert path.read_text() == text and signing.parse_secret(text)
        node_heartbeat.forget_node_secrets()
        assert node_heartbeat.node_secret(cfg) == text and path.read_text() == text
        assert node_heartbeat.send_heartbeat("127.0.0.1", server.server_address[1], "n1",
                                             secret=text) == [(0, RUN)]
    finally:
        node_heartbeat.forget_node_secrets()
    assert (home.nodes / "n1.up").exists()


def test_a_key_file_that_is_no_key_is_refused_naming_it(
        server: MonitorServer, home: Home, caplog: pytest.LogCaptureFixture) -> None:
    """A node's key file that is not 64 hex digits: its heartbeats are refused, the file
    named in the log (not to the peer), nothing is recorded, and the monitor keeps serving
    the others."""
    caplog.set_level("WARNING", logger="cluster.monitor")
    port = server.server_address[1]
    give_key(home.root, "n2", "not a secret")
    reply = _raw(port, _signed("n2", _key(home, "n1"), signing.NonceSource().next()))
    assert reply.startswith(b"ERROR node key refused: ") and b"\nsig " not in reply
    path = str(nodekeys.key_path(home.root, "n2"))
    assert path.encode() not in reply  # the home's paths are not told to whoever connects
    assert not list(home.nodes.glob("n2.*"))
    lines = _refusals(caplog)
    assert len(lines) == 1 and "(claims node n2)" in lines[0] and "node key refused" in lines[0]
    assert path in lines[0]
    assert node_heartbeat.send_heartbeat("127.0.0.1", port, "n1",
                                         secret=give_key(home.root, "n1")) == [(0, RUN)]


def test_unsigned_and_forged_heartbeats_are_refused_and_not_recorded(
        server: MonitorServer, home: Home, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="cluster.monitor")
    port = server.server_address[1]
    give_key(home.root, "intruder")  # a name the master knows: what is refused is the sig
    plain = format_heartbeat(Heartbeat("intruder", status="pwned"))
    unsigned = _raw(port, plain)
    other_key = signing.parse_secret(signing.new_secret())
    forged = _raw(port, signing.sign_request(plain, other_key, signing.NonceSource().next()))
    assert unsigned.startswith(b"ERROR unsigned request") and b"\nsig " not in unsigned
    assert forged.startswith(b"ERROR bad signature") and b"\nsig " not in forged
    assert not (home.nodes / "intruder.up").exists()
    assert not (home.nodes / "intruder.status").exists()
    lines = _refusals(caplog)
    assert len(lines) == 2
    assert all("peer 127.0.0.1:" in ln and "(claims node intruder)" in ln for ln in lines)


def test_a_node_cannot_heartbeat_in_another_nodes_name(
        server: MonitorServer, home: Home, caplog: pytest.LogCaptureFixture) -> None:
    """Node A's key (a key the master holds) does not sign a heartbeat claiming node B:
    refused as a bad signature, nothing of B recorded; each is heard under its own key."""
    caplog.set_level("WARNING", logger="cluster.monitor")
    port = server.server_address[1]
    a_key = _key(home, "node-a")
    b_text = give_key(home.root, "node-b", signing.new_secret())  # each node its own key
    nonces = signing.NonceSource()
    forged = _raw(port, _signed("node-b", a_key, nonces.next()))
    assert forged.startswith(b"ERROR bad signature") and b"\nsig " not in forged
    assert not list(home.nodes.glob("node-b.*"))
    lines = _refusals(caplog)
    assert len(lines) == 1
    assert "(claims node node-b)" in lines[0] and "bad signature" in lines[0]
    nonce = nonces.next()
    assert signing.verify_reply(_raw(port, _signed("node-a", a_key, nonce)), a_key,
                                nonce) == ANSWER
    assert not list(home.nodes.glob("node-b.*"))
    assert node_heartbeat.send_heartbeat("127.0.0.1", port, "node-b",
                                         secret=b_text) == [(0, RUN)]
    assert (home.nodes / "node-b.up").exists()


def test_a_heartbeat_from_a_name_without_a_key_is_refused_as_unknown(
        server: MonitorServer, home: Home, caplog: pytest.LogCaptureFixture) -> None:
    """No node-keys/<name>.key: the heartbeat is refused as from an unknown node, nothing
    is recorded and no key is made for it; once the node is set up it is heard (the key is
    looked for again after NodeKeyCache.RETRY)."""
    caplog.set_level("WARNING", logger="cluster.monitor")
    port = server.server_address[1]
    secret = signing.new_secret()
    with pytest.raises(node_heartbeat.HeartbeatError, match="unknown node"):
        node_heartbeat.send_heartbeat("127.0.0.1", port, "stranger", status="hi",
                                      secret=secret)
    assert not list(home.nodes.glob("stranger.*"))
    assert not nodekeys.key_path(home.root, "stranger").exists()  # the monitor makes none
    lines = _refusals(caplog)
    assert len(lines) == 1 and "(claims node stranger)" in lines[0]
    assert "unknown node" in lines[0]
    give_key(home.root, "stranger", secret)  # set up now (as bootstrap_node.py does)
    time.sleep(NodeKeyCache.RETRY)
    assert node_heartbeat.send_heartbeat("127.0.0.1", port, "stranger", secret=secret
                                         ) == [(0, RUN)]


def test_a_signed_heartbeat_is_recorded_and_its_replay_refused(
        server: MonitorServer, home: Home) -> None:
    port = server.server_address[1]
    key = _key(home, "n1")
    nonce = signing.NonceSource().next()
    data = _signed("n1", key, nonce)
    reply = _raw(port, data)
    assert signing.verify_reply(reply, key, nonce) == ANSWER
    up = home.nodes / "n1.up"
    assert up.exists()
    up.unlink()
    again = _raw(port, data)
    assert again.startswith(b"ERROR replayed nonce") and not up.exists()
    # The client does all this itself.
    assert node_heartbeat.send_heartbeat("127.0.0.1", port, "n1",
                                         secret=give_key(home.root, "n1")) == [(0, RUN)]
    assert up.exists()


def test_a_replay_is_refused_by_the_next_monitor_too(home: Home) -> None:
    """A heartbeat recorded while one monitor ran, replayed to a new monitor on the same
    home after the first closed (saving its replay guard in heartbeat.nonces): refused,
    while the same node's next heartbeat is answered."""
    key = _key(home, "n1")
    nonces = signing.NonceSource()
    nonce = nonces.next()
    recorded = _signed("n1", key, nonce)
    with _serve(home) as first:
        assert signing.verify_reply(_raw(first.server_address[1], recorded), key,
                                    nonce) == ANSWER
    assert (home.root / GUARD_FILE).exists()
    up = home.nodes / "n1.up"
    up.unlink()
    with _serve(home) as second:
        port = second.server_address[1]
        again = _raw(port, recorded)
        assert again.startswith(b"ERROR replayed nonce") and b"\nsig " not in again
        assert not up.exists()
        fresh = nonces.next()
        assert signing.verify_reply(_raw(port, _signed("n1", key, fresh)), key,
                                    fresh) == ANSWER
        assert up.exists()


def test_the_node_believes_no_answer_it_cannot_verify(tmp_path: Path) -> None:
    """A stand-in monitor answers a job, unsigned: the node refuses it (and would read its
    key again at the next heartbeat)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while not data.endswith(b"OK\n"):
                data += conn.recv(4096)
            conn.sendall(ANSWER)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(node_heartbeat.HeartbeatUnverified, match="nothing of it used"):
            node_heartbeat.send_heartbeat("127.0.0.1", port, "n1",
                                          secret=signing.new_secret())
    finally:
        thread.join(5)
        listener.close()


def test_heartbeat_script_with_a_wrong_key_fails(server: MonitorServer, home: Home,
                                                 tmp_path: Path) -> None:
    """heartbeat.py reads the node's key through its transport; a node's stale copy (here,
    a master home whose key of the node is not the monitor's) gets exit 2 and records
    nothing."""
    give_key(home.root, "stale-node")
    other = Home(tmp_path / "stale")
    other.create()
    give_key(other.root, "stale-node", signing.new_secret())
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
