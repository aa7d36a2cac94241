"""The ssh transport rides out blinks of the link, against a real sshd on
loopback behind a proxy that cuts chosen connections (tests/sshcut.py):

* a connection cut during the login is "unreachable" and retried, never a refused key; a
  real refusal stays "auth" and is not retried;
* a listing whose session is cut after the login (paramiko's channel closes without an
  exit status) is made again on a new connection; an rsync whose ssh is cut at its login
  or mid-transfer is run again; the tree fetched is exact: nothing lost or doubled; an
  upload cut mid-transfer lands once, whole, with no temporary file left;
* a whole NodeRun whose sessions are cut at the login and during BUILD's fetches takes
  part in the run; one whose master stays unreachable exits 3, not 1.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster.config import Config
from cluster.defaults import NODE_EXIT_DONE, NODE_EXIT_UNREACHABLE
from cluster.errors import SshError
from cluster.node.noderun import NodeRun
from cluster.node.sshtransport import SshTransport
from cluster.runtime import ssh
from cluster.runtime.sshd import PrivateSshd
from tests.component.test_node_run import ScriptedMaster, script_once, write_start
from tests.sshcut import Cut, CuttingProxy

#: Where a listing is cut [bytes from the server]: past the key exchange, the login, the
#: SFTP start and job.start (a few KB), well inside a listing of :func:`_corpus`.
LISTING_CUT = 32 * 1024
#: Where an rsync is cut [bytes from the server]: inside the big file's data.
RSYNC_CUT = 1024 * 1024


def _target(server: PrivateSshd, proxy: CuttingProxy, tmp_path: Path,
            key: Path | None = None) -> ssh.SshTarget:
    known = proxy.known_hosts(server.known_hosts, tmp_path / "proxy_known_hosts")
    return ssh.SshTarget("127.0.0.1", proxy.port, server.user,
                         str(key or server.client_key), known)


def _corpus(root: Path) -> dict[str, str]:
    """A tree whose listing is over 100 KB (1,200 files with long names) and one 4 MB file
    of random bytes (so an rsync is still sending when it is cut); returns each file's
    sha256 by relative path."""
    digests = {}
    for d in range(4):
        folder = root / f"dir{d}"
        folder.mkdir(parents=True)
        for i in range(300):
            name = f"file-{i:04d}-{'x' * 80}.ps"
            data = f"{d} {i}\n".encode()
            (folder / name).write_bytes(data)
            digests[f"dir{d}/{name}"] = hashlib.sha256(data).hexdigest()
    big = os.urandom(4 * 1024 * 1024)
    (root / "big.pdf").write_bytes(big)
    digests["big.pdf"] = hashlib.sha256(big).hexdigest()
    return digests


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (files by sha256; anything else is reported as such)."""
    found = {}
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        if path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif not path.is_dir():
            found[rel] = "not a file"
    return found


def test_a_login_cut_is_unreachable_and_tried_again(tmp_path: Path) -> None:
    """paramiko's "transport shut down or saw EOF" during the login is a lost connection:
    kind "unreachable", and connect's retries get through on a later connection."""
    cuts = [Cut("paramiko", 1), Cut("paramiko", 2)]
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, cuts) as proxy:
        target = _target(server, proxy, tmp_path)
        with pytest.raises(SshError) as cut:
            ssh.connect(target, retries=1)
        assert cut.value.kind == "unreachable", cut.value
        assert "lost during the login" in str(cut.value)
        client = ssh.connect(target, retries=3, delay=0.05)
        try:
            assert ssh.run_command(client, "echo ok", 30) == (0, "ok\n", "")
        finally:
            client.close()
        assert [c.cut for c in proxy.connections] == ["login", "login", ""]
        assert all(c.client.startswith("paramiko") for c in proxy.connections)


def test_a_refused_key_is_auth_and_not_tried_again(tmp_path: Path) -> None:
    """The server's answer "failed" to our only key is a refused login: kind "auth", one
    connection only, whatever connect_retries says."""
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, []) as proxy:
        stranger = tmp_path / "stranger_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
                       check=True, timeout=60)
        with pytest.raises(SshError) as refused:
            ssh.connect(_target(server, proxy, tmp_path, stranger), retries=3, delay=0.05)
        assert refused.value.kind == "auth", refused.value
        assert "refused" in str(refused.value)
        assert len(proxy.connections) == 1


def test_a_listing_cut_after_the_login_is_made_again(tmp_path: Path) -> None:
    """The session carrying the listing is cut mid-output (today: "failed (status -1)"):
    the listing is made again on a new connection and the plan is the whole tree."""
    home = tmp_path / "home"
    digests = _corpus(home / "tests")
    with PrivateSshd(tmp_path / "sshd") as server, \
            CuttingProxy(server.port, [Cut("paramiko", 1, after=LISTING_CUT)]) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=3, connect_retry_delay=0.05, io_timeout=20)
        try:
            plan = transport.plan("tests")
        finally:
            transport.close()
        assert plan.files == len(digests) and plan.skipped == [] and plan.excluded == []
        assert transport.connects == 2
        assert [c.cut for c in proxy.connections] == ["data", ""]


def test_a_fetch_whose_sessions_are_cut_is_exact(tmp_path: Path) -> None:
    """fetch_tree with its listing cut mid-output, its rsync's ssh cut at the login and
    again mid-transfer: tried again each time; the copy is exact (no file lost, none twice,
    no temporary left) and a second fetch changes nothing."""
    home = tmp_path / "home"
    digests = _corpus(home / "tests")
    cuts = [Cut("paramiko", 1, after=LISTING_CUT), Cut("OpenSSH", 1),
            Cut("OpenSSH", 2, after=RSYNC_CUT)]
    dest = tmp_path / "copy"
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, cuts) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=4, connect_retry_delay=0.05, io_timeout=20)
        try:
            transport.fetch_tree("tests", dest)
            assert _tree(dest) == digests
            cut = [(c.client.split("_")[0], c.cut) for c in proxy.connections]
            assert cut == [("paramiko", "data"), ("paramiko", ""), ("OpenSSH", "login"),
                           ("OpenSSH", "data"), ("OpenSSH", "")], cut
            transport.fetch_tree("tests", dest)  # uncut now: nothing left to mend
            assert transport.last_fetch_stats is not None
            assert transport.last_fetch_stats.files_transferred == 0
        finally:
            transport.close()
    assert _tree(dest) == digests


def test_an_upload_cut_mid_transfer_lands_once_and_whole(tmp_path: Path) -> None:
    """An SFTP upload whose connection is cut after 512 KB of its 2 MB: sent again on a new
    connection; the master has the whole file once, and no temporary file of either try."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    src = tmp_path / "n1.log"
    data = os.urandom(2 * 1024 * 1024)
    src.write_bytes(data)
    cuts = [Cut("paramiko", 1, up_after=512 * 1024)]
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, cuts) as proxy:
        transport = SshTransport(_target(server, proxy, tmp_path), str(home),
                                 connect_retries=3, connect_retry_delay=0.05, io_timeout=20)
        try:
            transport.upload(src, "logs/n1.log")
        finally:
            transport.close()
        assert [c.cut for c in proxy.connections] == ["data", ""]
    assert sorted(p.name for p in (home / "logs").iterdir()) == ["n1.log"]
    assert (home / "logs" / "n1.log").read_bytes() == data


def _node_run(tmp_path: Path, port: int, target: ssh.SshTarget, home: Path,
              retries: int) -> tuple[NodeRun, SshTransport]:
    cfg = Config(base_port=port, node_name="n1", work_dir=tmp_path / "work", slots=2,
                 poll_interval=0.2, report_interval=0.05, connect_retry_delay=0.05,
                 connect_retries=retries, io_timeout=20)
    transport = SshTransport(target, str(home), connect_retries=retries,
                             connect_retry_delay=0.05, io_timeout=20)
    return NodeRun(cfg, transport, 0, "tools=md5sum"), transport


def _node_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    digests = _corpus(home / "tests")
    (home / "src").mkdir()
    (home / "src" / "Makefile").write_text("all:\n\tmkdir -p bin\n")
    write_start(home)
    return home, digests


def test_a_node_run_rides_out_cuts_at_login_and_during_build(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    """run.py's engine whose first ssh login is cut, whose listing of the corpus is cut
    mid-output, and whose rsync is cut at its login and mid-transfer: it builds, runs its
    jobs (each result sent once, none failed), and its corpus is exact."""
    home, digests = _node_home(tmp_path)
    master = ScriptedMaster(script_once("echo one", "echo two"))
    port = serve(master)
    cuts = [Cut("paramiko", 1), Cut("paramiko", 2, after=LISTING_CUT), Cut("OpenSSH", 1),
            Cut("OpenSSH", 2, after=RSYNC_CUT)]
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, cuts) as proxy:
        run, transport = _node_run(tmp_path, port, _target(server, proxy, tmp_path), home,
                                   retries=4)
        try:
            assert run.run() == NODE_EXIT_DONE
        finally:
            transport.close()
        cut = sorted((c.client.split("_")[0], c.cut) for c in proxy.connections if c.cut)
        assert cut == [("OpenSSH", "data"), ("OpenSSH", "login"), ("paramiko", "data"),
                       ("paramiko", "login")], cut
    assert all(r.failure == 0 for r in master.seen), [r.failure_reason for r in master.seen]
    names = [res.name for r in master.seen for res in r.results]
    assert sorted(names) == ["t0.ps.ppmraw.72.0", "t1.ps.ppmraw.72.0"]
    assert _tree(tmp_path / "work" / "tests") == digests


def test_a_master_that_stays_cut_at_login_is_exit_3(
        tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    """Every login cut, connect_retries used up: run.py's engine exits 3 (unreachable), not
    1 (a refused key); it never reached the master's port."""
    home = tmp_path / "home"
    home.mkdir()
    write_start(home)
    master = ScriptedMaster(script_once("true"))
    port = serve(master)
    cuts = [Cut("paramiko", n) for n in (1, 2, 3)]
    with PrivateSshd(tmp_path / "sshd") as server, CuttingProxy(server.port, cuts) as proxy:
        run, transport = _node_run(tmp_path, port, _target(server, proxy, tmp_path), home,
                                   retries=3)
        try:
            assert run.run() == NODE_EXIT_UNREACHABLE
        finally:
            transport.close()
        assert [c.cut for c in proxy.connections] == ["login"] * 3
    assert master.seen == []
