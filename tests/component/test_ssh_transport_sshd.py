"""PrivateSshd: a real OpenSSH sshd on loopback or in a network namespace, with its keys,
config, log and known_hosts inside its root; only its user may log in; stop ends it and
its connections."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.errors import SshError
from cluster.runtime import ssh
from cluster.runtime.sshd import PrivateSshd, SshdError


def _target(server: PrivateSshd, user: str | None = None) -> ssh.SshTarget:
    return ssh.SshTarget(server.address, server.port, user or server.user,
                         str(server.client_key), server.known_hosts)


def _sshd_processes(config: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if str(config) in " ".join(cmdline):
            found.append(p)
    return found


def test_start_serves_and_stop_ends_everything(tmp_path: Path) -> None:
    """start returns once it listens; the root holds keys, config, log and a known_hosts
    line; a command and SFTP work; stop ends the server and the live connection's
    processes, and the port is free again."""
    root = tmp_path / "sshd"
    server = PrivateSshd(root)
    with server:
        assert server.running() and server.port > 0
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
        for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "client_key",
                     "client_key.pub", "authorized_keys", "sshd_config", "known_hosts",
                     "sshd.log"):
            assert (root / name).is_file(), name
        public = (root / "ssh_host_ed25519_key.pub").read_text().split()
        assert (root / "known_hosts").read_text() == \
            f"[127.0.0.1]:{server.port} {public[0]} {public[1]}\n"
        assert server.host_fingerprint.startswith("SHA256:")
        config = (root / "sshd_config").read_text()
        for line in ("PasswordAuthentication no", "StrictModes no", "AllowUsers root",
                     "PermitRootLogin prohibit-password", f"AuthorizedKeysFile {root}/"):
            assert line in config
        client = ssh.connect(_target(server))
        assert ssh.run_command(client, "echo $USER", 30) == (0, "root\n", "")
        assert client.open_sftp().stat(str(root)).st_mode is not None
        assert server.pid is not None
        serving = psutil.Process(server.pid).children(recursive=True)
        assert serving, "no sshd process serves our connection"
        assert "Accepted publickey for root" in (root / "sshd.log").read_text()
    assert not server.running()
    assert _sshd_processes(root / "sshd_config") == []
    _gone, alive = psutil.wait_procs(serving, timeout=10)
    assert alive == []
    with pytest.raises(SshError) as lost:  # its connection went with it
        ssh.run_command(client, "true", 10)
    assert lost.value.kind == "unreachable"
    with socket.socket() as s:
        # Free again (REUSEADDR as servers bind: the closed connections sit in TIME_WAIT).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))
        s.listen()
    client.close()


def test_restart_keeps_the_host_key(tmp_path: Path) -> None:
    """A second server on the same root reuses the host key (known_hosts stays valid)."""
    with PrivateSshd(tmp_path / "s") as first:
        fp, port = first.host_fingerprint, first.port
    with PrivateSshd(tmp_path / "s", port=port) as second:
        assert second.host_fingerprint == fp and second.port == port
        ssh.connect(_target(second)).close()


def test_only_the_given_user_may_log_in(tmp_path: Path) -> None:
    """With user=nobody, root (with the very same authorised key) is refused."""
    with PrivateSshd(tmp_path / "s", user="nobody") as server:
        assert "PermitRootLogin no" in server.config.read_text()
        with pytest.raises(SshError) as info:
            ssh.connect(_target(server, user="root"))
        assert info.value.kind == "auth"
        assert "User root from 127.0.0.1 not allowed because not listed in AllowUsers" in \
            server.log_path.read_text()


def test_a_port_in_use_is_an_error_with_the_log(tmp_path: Path) -> None:
    """An explicit port someone holds: SshdError quoting sshd's log; nothing left running."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = PrivateSshd(tmp_path / "s", port=port)
        with pytest.raises(SshdError, match=r"(?s)exited .*Address already in use"):
            server.start(timeout=30)
        assert not server.running()
        assert _sshd_processes(server.config) == []


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"t11-sshd-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True, timeout=30)


def test_in_a_network_namespace(tmp_path: Path, netns: str) -> None:
    """netns: the server listens inside the namespace (port 0 picked there), is reachable
    from inside with the OpenSSH client, not from the host's loopback; stop ends it."""
    with PrivateSshd(tmp_path / "s", netns=netns) as server:
        argv = ["ip", "netns", "exec", netns, *ssh.ssh_command(_target(server)),
                "root@127.0.0.1", "echo inside"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, "inside\n"), done.stderr
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        pid = server.pid
        assert pid is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert _sshd_processes(server.config) == []


def test_authorize_adds_a_key(tmp_path: Path) -> None:
    """authorize lets another key in, at once, without a restart; a key line once."""
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True, timeout=60)
    with PrivateSshd(tmp_path / "s") as server:
        target = ssh.SshTarget("127.0.0.1", server.port, "root", str(other),
                               server.known_hosts)
        with pytest.raises(SshError):
            ssh.connect(target)
        server.authorize(Path(f"{other}.pub"))
        server.authorize(Path(f"{other}.pub"))
        ssh.connect(target).close()
        assert len(server.authorized_keys.read_text().splitlines()) == 2
    with pytest.raises(SshdError):
        server.authorize("not a key\nline")
    assert os.path.exists(server.client_key)
