"""A secret file open to others or behind a symbolic link is refused, with a message naming
the file, its mode (or that it is a link) and what is expected: by the helper every reader
uses (cluster/runtime/secretfile.py), by the monitor reading a node's own key
``node-keys/<name>.key`` in the master home, and by a node reading its key through
LocalTransport and through SshTransport (SFTP lstat/stat on a real sshd).  Real files, real
modes, a real monitor on loopback, a real sshd."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.config import DEFAULTS
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.daemon.monitor import MonitorServer
from cluster.master.files.keycache import NodeKeyCache
from cluster.node import heartbeat
from cluster.node.sshtransport import SshTransport
from cluster.node.transport import LocalTransport, read_node_key
from cluster.runtime import ssh
from cluster.runtime.secretfile import SecretFileError, read_secret_file
from cluster.runtime.sshd import PrivateSshd
from cluster.wire import signing
from cluster.wire.heartbeat import Heartbeat, format_heartbeat

SECRET = "ab" * 32


def _secret(path: Path, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SECRET + "\n")
    os.chmod(path, mode)
    return path


def _node_key(home: Path, name: str, how: str, elsewhere: Path) -> Path:
    """Node ``name``'s key file in the master home ``home`` (in its 0700 node-keys/): of
    mode ``how`` ("0600", "0644"), or (``how`` "symlink") a link to a good file in
    ``elsewhere``."""
    path = nodekeys.key_path(home, name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if how == "symlink":
        return _link(path, elsewhere)
    return _secret(path, int(how, 8))


def _link(path: Path, elsewhere: Path) -> Path:
    """``path`` made a symbolic link to a well-formed 0600 secret in ``elsewhere``."""
    target = _secret(elsewhere / "planted.secret")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


# --- the helper -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_an_owner_only_secret_is_read(tmp_path: Path, mode: int) -> None:
    assert read_secret_file(_secret(tmp_path / "s", mode)) == SECRET + "\n"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_secret_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = _secret(tmp_path / "s", mode)
    with pytest.raises(SecretFileError) as exc:
        read_secret_file(path)
    text = str(exc.value)
    assert str(path) in text and f"has mode {mode:04o}" in text and "expected 0600" in text


def test_a_symlinked_secret_is_refused_even_to_a_good_file(tmp_path: Path) -> None:
    path = _link(tmp_path / "s", tmp_path / "other")
    with pytest.raises(SecretFileError) as exc:
        read_secret_file(path)
    assert str(path) in str(exc.value) and "symbolic link" in str(exc.value)
    assert "0600" in str(exc.value)


def test_a_fifo_or_directory_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    folder = tmp_path / "dir"
    folder.mkdir(mode=0o700)
    for path in (fifo, folder):
        with pytest.raises(SecretFileError, match="not a regular file"):
            read_secret_file(path)


def test_a_missing_secret_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_secret_file(tmp_path / "none")


# --- the monitor (the master's reader) ------------------------------------------------------

def _heartbeat_of(port: int, node: str) -> bytes:
    """Node ``node``'s heartbeat signed with the key of :data:`SECRET`, and the whole answer
    (the monitor closes after it)."""
    key = signing.heartbeat_key(signing.parse_secret(SECRET))
    data = signing.sign_request(format_heartbeat(Heartbeat(node, status="idle")), key,
                                signing.NonceSource().next())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("how", ["0644", "symlink"])
def test_the_monitor_refuses_a_bad_node_key(tmp_path: Path, how: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A heartbeat of a node whose key file is open to others or a link is refused, the log
    naming the file and what is wrong (the answer only that the key file is unusable: the
    home's paths are not told to whoever connects); nothing is recorded and the file is
    left alone."""
    caplog.set_level("WARNING", logger="cluster.monitor")
    home = Home(tmp_path / "home")
    home.create()
    path = _node_key(home.root, "n1", how, tmp_path / "other")
    server = MonitorServer(home, ("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        reply = _heartbeat_of(port, "n1").decode()
        assert reply.startswith("ERROR node key refused: ") and "\nsig " not in reply
        problem = "has mode 0644" if how == "0644" else "symbolic link"
        assert str(path) not in reply and "its log says why" in reply
        logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(logged) == 1
        assert "(claims node n1)" in logged[0] and str(path) in logged[0]
        assert problem in logged[0]
        assert not list(home.nodes.glob("n1.*"))
        if how == "0644":  # the file is left alone: a person decides
            assert path.read_text() == SECRET + "\n"
            assert path.stat().st_mode & 0o777 == 0o644
            os.chmod(path, 0o600)
            time.sleep(NodeKeyCache.RETRY)  # a refused key is read again after RETRY
            assert heartbeat.send_heartbeat("127.0.0.1", port, "n1", secret=SECRET) == []
            assert (home.nodes / "n1.up").exists()
        else:
            assert path.is_symlink()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- a node, through its transports ---------------------------------------------------------

@pytest.mark.parametrize("how", ["0644", "symlink"])
def test_a_local_node_refuses_a_bad_node_key(tmp_path: Path, how: str) -> None:
    home = tmp_path / "home"
    path = _node_key(home, "n1", how, tmp_path / "other")
    with pytest.raises(SecretFileError) as exc:
        LocalTransport(home).read_secret(nodekeys.key_rel("n1"))
    assert str(path) in str(exc.value)
    # A bad key is refused, never replaced by a new one (a local node makes a missing key).
    with pytest.raises(SecretFileError) as exc:
        read_node_key(LocalTransport(home), "n1")
    assert str(path) in str(exc.value)
    if how == "symlink":
        assert path.is_symlink()
    else:
        assert path.stat().st_mode & 0o777 == 0o644
    # What the node's heartbeat does with it: an error naming the monitor and the file.
    cfg = DEFAULTS.with_changes(master_home=home, transport="local", node_name="n1")
    heartbeat.forget_node_secrets()
    with pytest.raises(heartbeat.HeartbeatError) as err:
        heartbeat.node_secret(cfg)
    assert "cannot read this node's key" in str(err.value) and str(path) in str(err.value)
    os.unlink(path)
    _secret(path)
    assert heartbeat.node_secret(cfg) == SECRET + "\n"
    heartbeat.forget_node_secrets()
    assert LocalTransport(home).read_secret("no.secret") is None


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.mark.parametrize("how", ["0600", "0644", "symlink"])
def test_an_ssh_node_refuses_a_bad_node_key(sshd: PrivateSshd, tmp_path: Path,
                                            how: str) -> None:
    home = tmp_path / "home"
    path = _node_key(home, "n1", how, tmp_path / "other")
    target = ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(sshd.client_key),
                           sshd.known_hosts)
    tr = SshTransport(target, str(home), connect_retries=2, connect_retry_delay=0.2,
                      io_timeout=30)
    try:
        if how == "0600":
            assert read_node_key(tr, "n1") == SECRET + "\n"
            assert tr.read_secret("no.secret") is None
            # Only a node on the master's own file system makes a missing key.
            with pytest.raises(ClusterError, match="holds no key for node n2"):
                read_node_key(tr, "n2")
            assert not nodekeys.key_path(home, "n2").exists()
            return
        with pytest.raises(ClusterError) as exc:
            read_node_key(tr, "n1")
        text = str(exc.value)
        assert str(path) in text and sshd.address in text
        assert ("has mode 0644" if how == "0644" else "symbolic link") in text
    finally:
        tr.close()
