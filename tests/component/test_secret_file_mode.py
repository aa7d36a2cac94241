"""A secret file open to others or behind a symbolic link is refused, with a message naming
the file, its mode (or that it is a link) and what is expected: by the helper every reader
uses (cluster/runtime/secretfile.py), by the monitor reading the master home's
``cluster.secret``, and by a node reading it through LocalTransport and through
SshTransport (SFTP lstat/stat on a real sshd).  Real files, real modes, a real sshd."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import DEFAULTS
from cluster.errors import ClusterError
from cluster.home import Home
from cluster.master.monitor import MonitorServer, ensure_cluster_secret
from cluster.node import heartbeat
from cluster.node.sshtransport import SshTransport
from cluster.node.transport import LocalTransport
from cluster.runtime import ssh
from cluster.runtime.secretfile import SecretFileError, read_secret_file
from cluster.runtime.sshd import PrivateSshd
from cluster.wire import signing

SECRET = "ab" * 32


def _secret(path: Path, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SECRET + "\n")
    os.chmod(path, mode)
    return path


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

@pytest.mark.parametrize("how", ["0644", "symlink"])
def test_the_monitor_refuses_a_bad_cluster_secret(tmp_path: Path, how: str) -> None:
    home = Home(tmp_path / "home")
    home.root.mkdir()
    if how == "0644":
        _secret(home.cluster_secret, 0o644)
    else:
        _link(home.cluster_secret, tmp_path / "other")
    for attempt in (lambda: ensure_cluster_secret(home),
                    lambda: MonitorServer(home, ("127.0.0.1", 0))):
        with pytest.raises(SecretFileError) as exc:
            attempt()
        assert str(home.cluster_secret) in str(exc.value)
        assert ("has mode 0644" if how == "0644" else "symbolic link") in str(exc.value)
    if how == "0644":  # the file is left alone: a person decides
        assert home.cluster_secret.read_text() == SECRET + "\n"
        os.chmod(home.cluster_secret, 0o600)
        assert ensure_cluster_secret(home) == signing.parse_secret(SECRET)


# --- a node, through its transports ---------------------------------------------------------

@pytest.mark.parametrize("how", ["0644", "symlink"])
def test_a_local_node_refuses_a_bad_cluster_secret(tmp_path: Path, how: str) -> None:
    home = tmp_path / "home"
    path = home / Home.CLUSTER_SECRET
    if how == "0644":
        _secret(path, 0o644)
    else:
        _link(path, tmp_path / "other")
    with pytest.raises(SecretFileError) as exc:
        LocalTransport(home).read_secret(Home.CLUSTER_SECRET)
    assert str(path) in str(exc.value)
    # What the node's heartbeat does with it: an error naming the monitor and the file.
    cfg = DEFAULTS.with_changes(master_home=home, transport="local")
    heartbeat.forget_cluster_secrets()
    with pytest.raises(heartbeat.HeartbeatError) as err:
        heartbeat.cluster_secret(cfg)
    assert "cannot read the cluster secret" in str(err.value) and str(path) in str(err.value)
    os.unlink(path)
    _secret(path)
    assert heartbeat.cluster_secret(cfg) == SECRET + "\n"
    heartbeat.forget_cluster_secrets()
    assert LocalTransport(home).read_secret("no.secret") is None


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.mark.parametrize("how", ["0600", "0644", "symlink"])
def test_an_ssh_node_refuses_a_bad_cluster_secret(sshd: PrivateSshd, tmp_path: Path,
                                                  how: str) -> None:
    home = tmp_path / "home"
    path = home / Home.CLUSTER_SECRET
    if how == "symlink":
        _link(path, tmp_path / "other")
    else:
        _secret(path, int(how, 8))
    target = ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(sshd.client_key),
                           sshd.known_hosts)
    tr = SshTransport(target, str(home), connect_retries=2, connect_retry_delay=0.2,
                      io_timeout=30)
    try:
        if how == "0600":
            assert tr.read_secret(Home.CLUSTER_SECRET) == SECRET + "\n"
            assert tr.read_secret("no.secret") is None
            return
        with pytest.raises(ClusterError) as exc:
            tr.read_secret(Home.CLUSTER_SECRET)
        text = str(exc.value)
        assert str(path) in text and sshd.address in text
        assert ("has mode 0644" if how == "0644" else "symbolic link") in text
    finally:
        tr.close()
