"""The ssh transport against a real OpenSSH sshd (PrivateSshd on 127.0.0.1), real paramiko
and real rsync: the same results as LocalTransport, atomic uploads, host keys refused,
bounded retries, lost connections mended."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cluster.runtime.mirror as mirror_mod
from cluster.config import Config
from cluster.errors import SshError, TransportError
from cluster.node.sshtransport import SshTransport
from cluster.node.transport import LocalTransport, Transport
from cluster.node.transports import make_transport
from cluster.runtime import fsutil, ssh
from cluster.runtime.sshd import PrivateSshd, fingerprint


def _tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: its bytes and permission bits (directories listed with
    an empty marker, so empty ones count too)."""
    out: dict[str, tuple[bytes, int]] = {}
    for dirpath, dirs, names in os.walk(root):
        for name in dirs:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix() + "/"] = (b"", 0)
        for name in names:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = (path.read_bytes(),
                                                      path.stat().st_mode & 0o777)
    return out


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    root.mkdir()
    return root


def _target(sshd: PrivateSshd, **changes: object) -> ssh.SshTarget:
    fields: dict[str, object] = {"host": sshd.address, "port": sshd.port, "user": sshd.user,
                                 "key": str(sshd.client_key),
                                 "known_hosts": sshd.known_hosts}
    fields.update(changes)
    return ssh.SshTarget(**fields)  # type: ignore[arg-type]


@pytest.fixture
def t(sshd: PrivateSshd, home: Path) -> Iterator[SshTransport]:
    tr = SshTransport(_target(sshd), str(home), connect_retries=2, connect_retry_delay=0.2,
                      io_timeout=30)
    yield tr
    tr.close()


def test_ssh_transport_satisfies_the_protocol(t: SshTransport) -> None:
    """SshTransport is usable where a Transport is expected."""
    as_protocol: Transport = t
    assert as_protocol is t


def test_read_text_like_local(home: Path, t: SshTransport) -> None:
    """read_text: the text, None for a missing file (or directory path), an error for a
    directory or bytes that are not UTF-8; one connection for all the calls."""
    local = LocalTransport(home)
    _tree(home, {"job.start": "id 20190408115600\nproduct gs\n", "bin": b"\xff\xfe"})
    (home / "dir").mkdir()
    for rel in ("job.start", "job.1.start", "no/such/dir/file"):
        assert t.read_text(rel) == local.read_text(rel)
    assert t.read_text("job.start") == "id 20190408115600\nproduct gs\n"
    assert t.read_text("job.1.start") is None
    with pytest.raises(TransportError, match="directory"):
        t.read_text("dir")
    with pytest.raises(TransportError, match="bin: not UTF-8"):
        t.read_text("bin")
    assert t.connects == 1


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/../../b", "a/..", "..", "x\0y", "",
                                 ".", "./"])
def test_hostile_paths_are_refused_before_connecting(t: SshTransport, tmp_path: Path,
                                                     rel: str) -> None:
    """Absolute paths, '..' components, NUL bytes and the home itself are refused, as by
    LocalTransport, and nothing is sent to the master."""
    src = tmp_path / "src.txt"
    src.write_text("x")
    with pytest.raises(TransportError):
        t.read_text(rel)
    with pytest.raises(TransportError):
        t.fetch_tree(rel, tmp_path / "dest")
    with pytest.raises(TransportError):
        t.upload(src, rel)
    with pytest.raises(TransportError):
        t.left_out(rel)
    assert t.connects == 0
    assert not (tmp_path / "x").exists()


def _hard_tree(home: Path, outside: Path) -> None:
    """A tree with every kind of entry the mirror decides about."""
    _tree(home, {"tree/a.ps": "A", "tree/sub/b.pdf": "B", "tree/sub/deeper/c.xps": "C",
                 "tree/x.o": "object", "tree/bin/gs": "gs", "tree/src/bin/tool": "t",
                 "tree/src/a.c": "a", "tree/doc/bin": "file", "tree/sub/big": "123456789",
                 "tree/exact": "12345678", "tree/name with blanks & $(x)": "shell",
                 "tree/-rf": "dash", f"tree/{mirror_mod.TEMP_PREFIX}1": "tmp",
                 "tree/[x]*?": "glob", "tree/#comment": "hash", "tree/- minus": "minus",
                 "other/ignored": "no"})
    (home / "tree/empty").mkdir()
    os.chmod(home / "tree/a.ps", 0o600)
    os.chmod(home / "tree/sub/b.pdf", 0o755)
    (home / "tree/in-link").symlink_to("a.ps")
    (home / "tree/out-link").symlink_to(outside)
    (home / "tree/dir-link").symlink_to("sub")
    (home / "tree/dangling").symlink_to("nowhere")
    (home / "tree" / os.fsdecode(b"latin1-\xe9")).write_text("bytes")
    os.mkfifo(home / "tree/fifo")


def _exclude(path: str) -> bool:
    return path.endswith(".o") or path == "bin/" or path.endswith("/bin/")


@pytest.mark.parametrize("case", ["plain", "exclude", "max_size", "both"])
def test_fetch_tree_equals_local(home: Path, t: SshTransport, tmp_path: Path,
                                 case: str) -> None:
    """fetch_tree over rsync+ssh gives the tree LocalTransport gives (files, bytes, modes,
    empty directories, links followed or not, what is left out and deleted), calls the
    predicate on the same paths, and left_out agrees."""
    outside = tmp_path / "secret"
    outside.write_text("secret")
    _hard_tree(home, outside)
    local = LocalTransport(home)
    exclude = _exclude if case in ("exclude", "both") else None
    max_size = 8 if case in ("max_size", "both") else None
    results = []
    seen: dict[str, list[str]] = {}
    for name, tr in (("local", local), ("ssh", t)):
        calls: list[str] = []

        def spy(path: str, calls: list[str] = calls) -> bool:
            calls.append(path)
            return exclude(path) if exclude is not None else False
        dest = tmp_path / name
        # Stale entries a mirror must delete, excluded ones included (--delete-excluded).
        _tree(dest, {"stale": "old", "bin/old": "stale", "y.o": "stale", "sub/big": "old"})
        tr.fetch_tree("tree", dest, exclude=spy if exclude else None, max_size=max_size)
        results.append(_snapshot(dest))
        seen[name] = sorted(calls)
        assert tr.left_out("tree", exclude=exclude, max_size=max_size) == \
            local.left_out("tree", exclude=exclude, max_size=max_size)
    assert results[0] == results[1]
    assert seen["local"] == seen["ssh"]
    assert "out-link" not in results[1] and "in-link" in results[1]
    assert "secret" not in str(results[1])
    assert not (tmp_path / "ssh" / "in-link").is_symlink()
    if max_size:
        assert "sub/big" not in results[1] and "exact" in results[1]


def test_fetch_tree_follows_changes_and_deletes(home: Path, t: SshTransport,
                                                tmp_path: Path) -> None:
    """A second fetch deletes what went, replaces a file turned directory, keeps mtimes."""
    _tree(home, {"tests/keep": "1", "tests/gone": "2", "tests/dir/x": "3", "tests/flip": "4"})
    dest = tmp_path / "dest"
    t.fetch_tree("tests", dest)
    (home / "tests/gone").unlink()
    (home / "tests/dir/x").unlink()
    (home / "tests/dir").rmdir()
    (home / "tests/flip").unlink()
    _tree(home, {"tests/flip/inside": "5", "tests/new": "6"})
    _tree(dest, {"local-extra": "junk", "extra-dir/f": "junk"})
    t.fetch_tree("tests", dest)
    assert _snapshot(dest) == _snapshot(home / "tests")
    assert (dest / "keep").stat().st_mtime_ns // 10**9 == \
        (home / "tests/keep").stat().st_mtime_ns // 10**9


def test_fetch_tree_moves_only_the_change(home: Path, t: SshTransport,
                                          tmp_path: Path) -> None:
    """After one small change in a 4 MB tree, the next fetch moves far under 1% of the
    tree's bytes (rsync's own statistics), and transfers one file."""
    rng = __import__("random").Random(11)
    files = {f"tests/d{i % 8}/f{i:03d}.ps": rng.randbytes(20_000) for i in range(200)}
    _tree(home, files)  # type: ignore[arg-type]
    dest = tmp_path / "dest"
    t.fetch_tree("tests", dest)
    first = t.last_fetch_stats
    assert first is not None and first.files_transferred == 200
    assert first.total_size == 200 * 20_000 and first.received >= first.total_size
    target = home / "tests/d3/f003.ps"
    data = bytearray(target.read_bytes())
    data[10_000:10_010] = b"0123456789"
    target.write_bytes(bytes(data))
    # An edit comes later than the copy.  Here both may fall in the same second, which is
    # as fine as rsync's quick check (size and mtime) looks: the same size in the same
    # second looks unchanged.  Date the edit 2 s on, as the next second would.
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    t.fetch_tree("tests", dest)
    second = t.last_fetch_stats
    assert second is not None
    assert second.files_transferred == 1
    assert second.moved < 0.01 * second.total_size, second
    assert (dest / "d3/f003.ps").read_bytes() == bytes(data)
    t.fetch_tree("tests", dest)
    assert t.last_fetch_stats is not None and t.last_fetch_stats.files_transferred == 0


def test_fetch_tree_missing_source(t: SshTransport, tmp_path: Path) -> None:
    """Fetching a directory the master lacks names it and the master."""
    with pytest.raises(TransportError, match=r"fetch tests: no such directory .* on the "
                                             r"master root@127\.0\.0\.1:"):
        t.fetch_tree("tests", tmp_path / "dest")


def test_upload_like_local(home: Path, t: SshTransport, tmp_path: Path) -> None:
    """upload creates parents, replaces a file whole, keeps mode and mtime, leaves no temp
    file, and refuses a directory target or a missing local file."""
    src = tmp_path / "node7.log"
    src.write_text("log 1")
    os.chmod(src, 0o640)
    t.upload(src, "runs/20190408/node7.log")
    target = home / "runs/20190408/node7.log"
    assert target.read_text() == "log 1"
    assert target.stat().st_mode & 0o777 == 0o640
    assert int(target.stat().st_mtime) == int(src.stat().st_mtime)
    src.write_text("log 2, longer")
    t.upload(src, "runs/20190408/node7.log")
    assert target.read_text() == "log 2, longer"
    assert os.listdir(target.parent) == ["node7.log"]
    with pytest.raises(TransportError, match="does not exist"):
        t.upload(tmp_path / "missing", "runs/x")
    with pytest.raises(TransportError, match="upload runs: is a directory on the master"):
        t.upload(src, "runs")
    with pytest.raises(TransportError, match="not a directory"):
        t.upload(src, "runs/20190408/node7.log/inside")
    assert t.connects == 1


def test_upload_is_atomic(home: Path, t: SshTransport, tmp_path: Path) -> None:
    """While a 48 MB upload replaces a file, a reader on the master sees the old file or the
    whole new one under the final name, never a part; the data goes through a temp file
    named as fsutil names them (so the master's clean-up knows it), which is renamed."""
    old = b"old" * 1000
    _tree(home, {"runs/r/big.log": old})
    new = os.urandom(48 * 1024 * 1024)
    src = tmp_path / "big.log"
    src.write_bytes(new)
    target = home / "runs/r/big.log"
    sizes: set[int] = set()
    temps: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for name in os.listdir(target.parent):
                if name != "big.log":
                    temps.add(name)
            with open(target, "rb") as fh:
                sizes.add(len(fh.read()))
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        t.upload(src, "runs/r/big.log")
    finally:
        done.set()
        watcher.join(60)
    assert target.read_bytes() == new
    assert sizes <= {len(old), len(new)}
    assert temps, "the watcher never saw the temporary file"
    assert all(fsutil.TEMP_NAME.fullmatch(name) for name in temps), temps
    assert all(f".{os.getpid()}." in name for name in temps)
    assert os.listdir(target.parent) == ["big.log"]


def test_unknown_host_key_is_refused_with_its_fingerprint(sshd: PrivateSshd, home: Path,
                                                          tmp_path: Path) -> None:
    """An empty (or missing) known_hosts: refused, naming host:port and the fingerprint;
    the file is not written to."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    tr = SshTransport(_target(sshd, known_hosts=known), str(home), connect_retries=3,
                      connect_retry_delay=0.1)
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        tr.read_text("job.start")
    text = str(info.value)
    assert f"host key of [127.0.0.1]:{sshd.port} (ssh-ed25519 {sshd.host_fingerprint}) " \
           f"is not in {known}: refused" in text
    assert text.startswith("read job.start: master root@127.0.0.1:")
    assert time.monotonic() - started < 10  # not retried: a key does not change by waiting
    assert known.read_text() == ""
    with pytest.raises(SshError) as direct:
        ssh.connect(_target(sshd, known_hosts=tmp_path / "absent"))
    assert direct.value.kind == "hostkey-unknown"
    assert "does not exist" in str(direct.value)
    assert not (tmp_path / "absent").exists()


def test_changed_host_key_is_refused(sshd: PrivateSshd, home: Path, tmp_path: Path) -> None:
    """A known_hosts that records another key for the server: refused as a possible
    man-in-the-middle, both fingerprints named; rsync (OpenSSH) refuses too."""
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True, timeout=60)
    public = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {public}\n")
    tr = SshTransport(_target(sshd, known_hosts=known), str(home), connect_retries=3,
                      connect_retry_delay=0.1)
    with pytest.raises(TransportError) as info:
        tr.read_text("job.start")
    text = str(info.value)
    assert f"(ssh-ed25519 {sshd.host_fingerprint}) does not match the key recorded in " \
           f"{known} (ssh-ed25519 {fingerprint(public)}): refused (possible " \
           "man-in-the-middle" in text
    with pytest.raises(SshError) as direct:
        ssh.connect(_target(sshd, known_hosts=known))
    assert direct.value.kind == "hostkey-changed"
    # The OpenSSH side (rsync's transport) checks the same file the same way.
    (home / "tree").mkdir()
    argv = ssh.rsync_argv(_target(sshd, known_hosts=known),
                          ssh.remote_spec(_target(sshd), f"{home}/tree/"), f"{tmp_path}/d/")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Host key verification failed" in done.stderr
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {public}\n"


def test_refused_login_is_an_auth_error(sshd: PrivateSshd, tmp_path: Path) -> None:
    """A key the server does not know: kind "auth", naming the user and the key."""
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True, timeout=60)
    with pytest.raises(SshError) as info:
        ssh.connect(_target(sshd, key=str(other)))
    assert info.value.kind == "auth"
    assert f"login as root with key {other} refused" in str(info.value)
    with pytest.raises(SshError, match="does not exist or cannot be read") as missing:
        ssh.connect(_target(sshd, key=str(tmp_path / "nokey")))
    assert missing.value.kind == "auth"


def test_unreachable_master_is_a_transport_error_after_bounded_retries(
        sshd: PrivateSshd, home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
        ) -> None:
    """Nobody listening: connect_retries tries with a doubling pause, then TransportError
    naming the master and the cause (nodebuild.build_failure turns it into failure 1)."""
    from cluster.defaults import FAILURE_NETWORK
    from cluster.node.nodebuild import build_failure

    port = sshd.port + 1 if sshd.port < 65535 else sshd.port - 1
    tr = SshTransport(_target(sshd, port=port), str(home), connect_retries=4,
                      connect_retry_delay=0.2)
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    with pytest.raises(TransportError) as info:
        tr.fetch_tree("tests", tmp_path / "dest")
    elapsed = time.monotonic() - started
    assert 0.2 + 0.4 + 0.8 <= elapsed < 20
    text = str(info.value)
    assert text.startswith(f"fetch tests: master root@127.0.0.1:{port}: cannot reach")
    assert "(gave up after 4 tries)" in text
    assert caplog.text.count("again in") == 3
    assert build_failure(info.value)[0] == FAILURE_NETWORK
    with pytest.raises(TransportError, match="cannot reach"):
        tr.upload(Path(__file__), "runs/x")
    with pytest.raises(SshError) as direct:
        ssh.connect(_target(sshd, port=port))
    assert direct.value.kind == "unreachable"


def test_lost_connection_is_mended(sshd: PrivateSshd, home: Path, tmp_path: Path) -> None:
    """The server restarts under a live transport: the next calls reconnect (with the same
    host key) and succeed; while it is down they retry with backoff."""
    with PrivateSshd(tmp_path / "own-sshd") as own:
        tr = SshTransport(_target(own), str(home), connect_retries=30,
                          connect_retry_delay=0.1)
        _tree(home, {"job.start": "one", "tests/a": "a"})
        assert tr.read_text("job.start") == "one"
        assert tr.connects == 1
        own.stop()
        restarted = PrivateSshd(tmp_path / "own-sshd", port=own.port)
        timer = threading.Timer(1.0, restarted.start)
        timer.start()
        try:
            (home / "job.start").write_text("two")
            assert tr.read_text("job.start") == "two"  # waits out the restart
            assert tr.connects == 2
            tr.fetch_tree("tests", tmp_path / "dest")
            src = tmp_path / "up"
            src.write_text("up")
            tr.upload(src, "runs/up")
            assert (home / "runs/up").read_text() == "up"
            # The connection dies under us (the server side of it is killed).
            assert tr._client is not None
            tr._client.get_transport().close()  # type: ignore[union-attr]
            assert tr.read_text("job.start") == "two"
            assert tr.connects == 3
        finally:
            timer.join(30)
            restarted.stop()
            tr.close()


def test_make_transport_ssh(sshd: PrivateSshd, home: Path) -> None:
    """transport = ssh in the config gives an SshTransport that works, connecting only on
    first use."""
    cfg = Config(transport="ssh", master_host="127.0.0.1", ssh_port=sshd.port,
                 ssh_user="root", ssh_key=str(sshd.client_key),
                 ssh_known_hosts=sshd.known_hosts, master_home=home, connect_retries=2,
                 connect_retry_delay=0.1)
    tr = make_transport(cfg)
    assert isinstance(tr, SshTransport) and tr.connects == 0
    _tree(home, {"job.start": "id 1\n"})
    assert tr.read_text("job.start") == "id 1\n"
    tr.close()


def test_relative_master_home_is_in_the_login_home(sshd: PrivateSshd) -> None:
    """A relative master_home (or one with ~/) is the ssh user's home on the master."""
    login_home = Path(os.path.expanduser(f"~{sshd.user}"))
    name = f".cluster-ssh-test-{os.getpid()}"
    (login_home / name).mkdir()
    try:
        (login_home / name / "job.start").write_text("rel")
        for home in (name, f"~/{name}"):
            tr = SshTransport(_target(sshd), home, connect_retries=1)
            assert tr.read_text("job.start") == "rel"
            tr.close()
    finally:
        for path in (login_home / name).iterdir():
            path.unlink()
        (login_home / name).rmdir()


def test_rsync_retries_a_failed_connection_but_not_a_refused_key(
        sshd: PrivateSshd, home: Path, tmp_path: Path) -> None:
    """rsync's own ssh connection: retried with backoff when nobody answers, given up at
    once when the host key is refused (waiting does not change a key)."""
    port = sshd.port + 1 if sshd.port < 65535 else sshd.port - 1
    (home / "tree").mkdir()
    down = SshTransport(_target(sshd, port=port), str(home), connect_retries=3,
                        connect_retry_delay=0.2)
    argv = ssh.rsync_argv(down.target, ssh.remote_spec(down.target, f"{home}/tree/"),
                          f"{tmp_path}/d/")
    started = time.monotonic()
    with pytest.raises(TransportError, match=r"(?s)fetch tree: rsync from the master "
                                             r"root@127\.0\.0\.1:\d+ failed after 3 tries.*"
                                             r"Connection refused"):
        down._rsync(argv, b"", "tree")
    assert time.monotonic() - started >= 0.2 + 0.4
    known = tmp_path / "known_hosts"
    known.write_text("")
    refused = SshTransport(_target(sshd, known_hosts=known), str(home), connect_retries=5,
                           connect_retry_delay=5)
    argv = ssh.rsync_argv(refused.target, ssh.remote_spec(refused.target, f"{home}/tree/"),
                          f"{tmp_path}/d/")
    started = time.monotonic()
    with pytest.raises(TransportError, match="Host key verification failed") as info:
        refused._rsync(argv, b"", "tree")
    assert "tries" not in str(info.value)
    assert time.monotonic() - started < 5
