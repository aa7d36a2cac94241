"""The node gate as the forced command of a node's key on a real OpenSSH sshd (PrivateSshd on
127.0.0.1): the node's own SshTransport reads job.start and its own key, uploads its logs
and fetches a tree by rsync through it, and is refused, each time with the gate's words,
cluster.secret, another node's key, any write outside its upload area and any other
command; a hand-made rsync with -L cannot follow a link out of the tree."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from cluster import nodekeys
from cluster.defaults import REPO_ROOT
from cluster.errors import TransportError
from cluster.master.gate import gate
from cluster.node.sshtransport import SshTransport
from cluster.runtime import secretfile, ssh
from cluster.runtime.sshd import PrivateSshd

RUN = "20260101000000"
SECRET = "ab" * 32 + "\n"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def _home(root: Path) -> Path:
    home = root / "home"
    (home / "runs" / RUN / "logs").mkdir(parents=True)
    (home / "log").mkdir()
    (home / "job.start").write_text(f"id {RUN}\n")
    secret = home / "cluster.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    for name in ("node1", "node2"):
        nodekeys.ensure_node_key(home, name)
    (home / "ssh").mkdir()
    (home / "ssh" / "client_key").write_text("PRIVATE\n")
    tests = home / "tests"
    (tests / "sub").mkdir(parents=True)
    (tests / "a.pdf").write_text("%PDF a\n")
    (tests / "sub" / "b.ps").write_text("%!PS b\n")
    os.symlink("a.pdf", tests / "alias.pdf")  # inside the tree: sent as the file
    os.symlink("../../cluster.secret", tests / "sub" / "leak")  # out of the tree
    os.symlink("/etc", tests / "etc")
    (root / "outside.txt").write_text("outside\n")
    # A link below the home's top level (one placed at the top is the admin's, trusted).
    os.symlink(root / "outside.txt", home / "runs" / RUN / "escape.txt")
    return home


def _node_key(root: Path, name: str) -> Path:
    key = root / f"{name}_ssh_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    return key


@pytest.fixture
def setup(sshd: PrivateSshd, tmp_path: Path) -> Iterator[tuple[Path, ssh.SshTarget]]:
    home = _home(tmp_path)
    key = _node_key(tmp_path, "node1")
    line = gate.authorized_line(gate.gate_command(home, "node1", repo=REPO_ROOT),
                                key.with_suffix(".pub").read_text())
    assert gate.authorize(sshd.authorized_keys, line) == "added"
    assert gate.authorize(sshd.authorized_keys, line) == "unchanged"
    target = ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(key), sshd.known_hosts)
    yield home, target
    kept = [x for x in sshd.authorized_keys.read_text().splitlines() if x != line]
    sshd.authorized_keys.write_text("".join(x + "\n" for x in kept))


def _transport(target: ssh.SshTarget, home: Path) -> SshTransport:
    return SshTransport(target, str(home), connect_retries=1, connect_retry_delay=0.1,
                        io_timeout=20)


def test_a_restricted_node_reads_uploads_and_fetches(setup: tuple[Path, ssh.SshTarget],
                                                      tmp_path: Path) -> None:
    home, target = setup
    t = _transport(target, home)
    try:
        assert t.read_text("job.start") == f"id {RUN}\n"
        own = nodekeys.key_path(home, "node1").read_text()
        assert t.read_secret("node-keys/node1.key") == own
        assert t.read_text("no-such-file") is None
        log_file = tmp_path / "node1.log"
        log_file.write_text("the node's log\n")
        t.upload(log_file, f"runs/{RUN}/logs/node1.log")
        assert (home / "runs" / RUN / "logs" / "node1.log").read_text() == "the node's log\n"
        picture = tmp_path / "0001.png"
        picture.write_bytes(b"\x89PNG")
        t.upload(picture, f"runs/{RUN}/bmpcmp/0001.png")  # makes runs/<id>/bmpcmp
        assert (home / "runs" / RUN / "bmpcmp" / "0001.png").read_bytes() == b"\x89PNG"
        # A sweep result bundle: makes runs/<id>/results/incoming, renamed into place whole.
        bundle = tmp_path / "node1.0123456789abcdef.1.tar"
        bundle.write_bytes(b"tar" * 1000)
        t.upload(bundle, f"runs/{RUN}/results/incoming/{bundle.name}")
        incoming = home / "runs" / RUN / "results" / "incoming"
        assert [p.name for p in incoming.iterdir()] == [bundle.name]
        assert (incoming / bundle.name).read_bytes() == b"tar" * 1000
        dest = tmp_path / "fetched"
        t.fetch_tree("tests", dest)
        got = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
        assert got == ["a.pdf", "alias.pdf", "sub", "sub/b.ps"]
        assert (dest / "alias.pdf").read_text() == "%PDF a\n"
    finally:
        t.close()


def _refused(excinfo: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    text = str(excinfo.value)
    assert "nodegate" in text, text
    for word in words:
        assert word in text, text


def test_a_restricted_node_cannot_read_secrets_or_write_elsewhere(
        setup: tuple[Path, ssh.SshTarget], tmp_path: Path) -> None:
    home, target = setup
    t = _transport(target, home)
    try:
        with pytest.raises((TransportError, secretfile.SecretFileError)) as secret:
            t.read_secret("cluster.secret")
        _refused(secret, "cluster.secret is one of the master's secrets")
        with pytest.raises((TransportError, secretfile.SecretFileError)) as other:
            t.read_secret("node-keys/node2.key")
        _refused(other, "node-keys/node2.key is one of the master's secrets")
        with pytest.raises(TransportError) as sshkey:
            t.read_text("ssh/client_key")
        _refused(sshkey, "ssh/client_key is one of the master's secrets")
        with pytest.raises(TransportError) as escape:
            t.read_text(f"runs/{RUN}/escape.txt")
        _refused(escape, "outside the master home")
        local = tmp_path / "payload"
        local.write_text("overwritten\n")
        for rel in ("job.start", "tests/new.pdf", f"runs/{RUN}/logs/node2.log",
                    "node-keys/node1.key", f"runs/{RUN}/results",
                    f"runs/{RUN}/results/incoming/node2.0123456789abcdef.1.tar"):
            with pytest.raises(TransportError) as write:
                t.upload(local, rel)
            _refused(write, "refused", "write only runs/<id>/logs/node1.log")
        # A folder of results/ other than incoming/ is never made, so nothing lands there.
        with pytest.raises(TransportError):
            t.upload(local, f"runs/{RUN}/results/t1/out")
        assert not (home / "runs" / RUN / "results" / "t1").exists()
        assert (home / "job.start").read_text() == f"id {RUN}\n"
        assert not (home / "tests" / "new.pdf").exists()
        assert not (home / "runs" / RUN / "logs" / "node2.log").exists()
        leftovers = [p.name for p in (home / "runs" / RUN / "logs").iterdir()]
        assert leftovers == [], leftovers
    finally:
        t.close()
    above = _transport(target, home.parent)  # the home as a tree of its parent
    try:
        with pytest.raises(TransportError) as whole:
            above.fetch_tree(home.name, tmp_path / "all")
        assert "refused" in str(whole.value) and "holds the master home" in str(whole.value)
    finally:
        above.close()
    # Straight SFTP, past the transport's own checks.
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        with pytest.raises(PermissionError) as passwd:
            sftp.open("/etc/passwd")
        assert "outside the master home" in str(passwd.value)
        with pytest.raises(PermissionError) as rename:
            sftp.posix_rename(str(home / "job.start"), str(home / f"runs/{RUN}/logs/node1.log"))
        assert "upload area" in str(rename.value)
        with pytest.raises(PermissionError):
            sftp.remove(str(home / "job.start"))
        with pytest.raises(PermissionError):
            sftp.mkdir(str(home / "newdir"))
        with pytest.raises(PermissionError):
            sftp.chmod(str(home / "job.start"), 0o777)
        with pytest.raises(OSError) as listing:
            sftp.listdir(str(home))
        assert "not served" in str(listing.value)
        with pytest.raises(OSError):
            sftp.symlink(str(home / "cluster.secret"), str(home / f"runs/{RUN}/logs/node1.log"))
        # A command that is not a node's: refused with one line naming it.
        status, _out, err = ssh.run_command(client, "cat cluster.secret", 30)
        assert status == 1
        assert "nodegate: 'cat cluster.secret' refused for node node1" in err
        assert "rsync --server --sender" in err
        status, _out, err = ssh.run_command(
            client, shlex.join(["python3", "-c", "print(open('cluster.secret').read())",
                                str(home), ".transport-tmp-"]), 30)
        assert status == 1 and "not the node's listing script" in err
    finally:
        client.close()
    assert (home / "job.start").exists() and (home / "cluster.secret").read_text() == SECRET
    assert "refused" in (home / "log" / gate.LOG_NAME).read_text()


def test_rsync_through_the_gate_is_read_only_and_stays_in_the_tree(
        setup: tuple[Path, ssh.SshTarget], tmp_path: Path) -> None:
    """A node's own rsync with -L and no excludes: the link out of the tree is not sent
    (the gate's server-side excludes); an upload by rsync, and a fetch of the home, are
    refused."""
    home, target = setup
    dest = tmp_path / "raw"
    done = subprocess.run(ssh.rsync_argv(target, ssh.remote_spec(target, f"{home}/tests/"),
                                         f"{dest}/", extra=["--copy-links"]),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    assert got == ["a.pdf", "alias.pdf", "sub", "sub/b.ps"], got
    up = subprocess.run(ssh.rsync_argv(target, f"{dest}/", ssh.remote_spec(
        target, f"{home}/tests/")), capture_output=True, text=True, timeout=60)
    assert up.returncode != 0
    assert "rsync only as the sender" in up.stderr
    whole = subprocess.run(ssh.rsync_argv(target, ssh.remote_spec(target, f"{home}/"),
                                          f"{tmp_path / 'all'}/"),
                           capture_output=True, text=True, timeout=60)
    assert whole.returncode != 0 and "holds the master home" in whole.stderr
    assert not (tmp_path / "all" / "cluster.secret").exists()


def test_the_unrestricted_key_reads_everything(sshd: PrivateSshd, tmp_path: Path) -> None:
    """The control: the same home through sshd's own, unrestricted client key gives
    cluster.secret away (what the gate is for)."""
    home = _home(tmp_path)
    target = ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(sshd.client_key),
                           sshd.known_hosts)
    t = _transport(target, home)
    try:
        assert t.read_secret("cluster.secret") == SECRET
    finally:
        t.close()


def test_sftp_subsystem_command_is_what_the_gate_sees(sshd: PrivateSshd, tmp_path: Path,
                                                      ) -> None:
    """With a forced command, sshd passes the SFTP subsystem as SSH_ORIGINAL_COMMAND =
    its Subsystem command (PrivateSshd: internal-sftp): recorded by a logging command."""
    record = tmp_path / "seen"
    key = _node_key(tmp_path, "probe")
    command = f"printf '%s' \"$SSH_ORIGINAL_COMMAND\" > {shlex.quote(str(record))}"
    line = gate.authorized_line(command, key.with_suffix(".pub").read_text())
    gate.authorize(sshd.authorized_keys, line)
    try:
        target = ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(key), sshd.known_hosts)
        client = ssh.connect(target)
        try:
            with pytest.raises((paramiko.SSHException, EOFError, OSError)):
                client.open_sftp().stat(".")
        finally:
            client.close()
        assert record.read_text() == "internal-sftp"
    finally:
        kept = [x for x in sshd.authorized_keys.read_text().splitlines() if x != line]
        sshd.authorized_keys.write_text("".join(x + "\n" for x in kept))
