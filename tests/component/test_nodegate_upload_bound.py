"""The node gate bounds what a run's uploads hold (docs/security.md, "The node gate's
bound"): through a real OpenSSH sshd whose forced command is the gate, reading
``max_upload_bytes`` from the master's configuration file (``--config``):

* a node's uploads go through while the run's upload area stays within the bound; the one
  that would pass it is refused with an SFTP error naming the file, the bound and the run,
  no temporary file is left, and nothing uploaded before is lost or changed; replacing a
  file counts what the area holds, so a smaller log still replaces a bigger one;
* a client that writes straight to a name (no temporary file, no clean-up of its own) past
  the bound: the gate removes the partial file itself and ends the handle, so nothing more
  is written through it.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.defaults import REPO_ROOT
from cluster.errors import TransportError
from cluster.master.gate import gate
from cluster.node.sshtransport import SshTransport
from cluster.runtime import ssh
from cluster.runtime.sshd import PrivateSshd

RUN = "20260101000000"
#: The bound the test's master configuration gives [bytes].
BOUND = 300_000


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def setup(sshd: PrivateSshd, tmp_path: Path) -> Iterator[tuple[Path, ssh.SshTarget]]:
    """A master home with run RUN, its configuration (max_upload_bytes = BOUND) and node1's
    key restricted to the gate with that configuration."""
    home = tmp_path / "home"
    (home / "runs" / RUN).mkdir(parents=True)
    (home / "log").mkdir()
    nodekeys.ensure_node_key(home, "node1")
    conf = tmp_path / "master.conf"
    conf.write_text(f"[master]\nhome = {home}\nmax_upload_bytes = {BOUND}\n")
    key = tmp_path / "node1_ssh_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True, timeout=60)
    line = gate.authorized_line(gate.gate_command(home, "node1", repo=REPO_ROOT, config=conf),
                                key.with_suffix(".pub").read_text())
    gate.authorize(sshd.authorized_keys, line)
    yield home, ssh.SshTarget(sshd.address, sshd.port, sshd.user, str(key), sshd.known_hosts)
    kept = [x for x in sshd.authorized_keys.read_text().splitlines() if x != line]
    sshd.authorized_keys.write_text("".join(x + "\n" for x in kept))


def _file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def _held(home: Path) -> dict[str, str]:
    """Every file of the run's upload area by its path in the run's folder and sha256 (the
    gates' count beside it, runs/<id>/.gate-upload-bytes, is not an upload)."""
    run = home / "runs" / RUN
    return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in ("logs", "bmpcmp") for p in sorted((run / folder).rglob("*"))
            if p.is_file()}


def test_an_upload_past_the_runs_bound_is_refused_and_nothing_else_changes(
        setup: tuple[Path, ssh.SshTarget], tmp_path: Path) -> None:
    home, target = setup
    t = SshTransport(target, str(home), connect_retries=1, io_timeout=20)
    try:
        t.upload(_file(tmp_path / "node1.log", 100_000), f"runs/{RUN}/logs/node1.log")
        t.upload(_file(tmp_path / "0001.png", 150_000), f"runs/{RUN}/bmpcmp/0001.png")
        before = _held(home)
        with pytest.raises(TransportError) as refused:
            t.upload(_file(tmp_path / "0002.png", 100_000), f"runs/{RUN}/bmpcmp/0002.png")
        text = str(refused.value)
        assert text.startswith(f"upload runs/{RUN}/bmpcmp/0002.png: nodegate: writing "
                               f"{home}/runs/{RUN}/bmpcmp/.0002.png."), text
        # What the area held with the partial temporary file, and the write that would
        # have passed the bound.
        held = re.search(rf"refused: run {RUN}'s uploads may hold at most {BOUND} bytes "
                         r"\(max_upload_bytes\); they hold (\d+), and this write would add "
                         r"(\d+);", text)
        assert held is not None, text
        assert int(held[1]) <= BOUND < int(held[1]) + int(held[2]), text
        assert "the partial file was removed" in text, text
        # Nothing of the refused upload is left, not even its temporary file; what was
        # uploaded before is there, byte for byte.
        assert _held(home) == before
        assert sorted(p.name for p in (home / "runs" / RUN / "bmpcmp").iterdir()) == \
            ["0001.png"]
        # A smaller log replaces the bigger one (its temporary file fits beside it), and the
        # room it frees takes an upload that did not fit before.
        small = _file(tmp_path / "node1.log", 10_000)
        t.upload(small, f"runs/{RUN}/logs/node1.log")
        assert (home / "runs" / RUN / "logs" / "node1.log").read_bytes() == small.read_bytes()
        t.upload(_file(tmp_path / "0002.png", 100_000), f"runs/{RUN}/bmpcmp/0002.png")
        assert sum((home / "runs" / RUN / rel).stat().st_size for rel in _held(home)) == \
            260_000
    finally:
        t.close()
    assert "may hold at most" in (home / "log" / gate.LOG_NAME).read_text()


def test_a_client_writing_past_the_bound_loses_its_file_and_its_handle(
        setup: tuple[Path, ssh.SshTarget]) -> None:
    home, target = setup
    bmpcmp = home / "runs" / RUN / "bmpcmp"
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        sftp.mkdir(str(bmpcmp))
        with sftp.open(str(bmpcmp / "kept.png"), "wb") as fh:
            fh.write(b"k" * 1000)
        fh = sftp.open(str(bmpcmp / "big.png"), "wb")
        fh.write(b"x" * (BOUND - 1000))  # exactly up to the bound: allowed
        assert (bmpcmp / "big.png").stat().st_size == BOUND - 1000
        with pytest.raises(PermissionError) as refused:
            fh.write(b"y")
        assert f"writing {bmpcmp}/big.png refused: run {RUN}'s uploads may hold at most " \
               f"{BOUND} bytes" in str(refused.value)
        assert not (bmpcmp / "big.png").exists()  # removed by the gate, not the client
        with pytest.raises(OSError, match="no such handle"):
            fh.write(b"z")  # the handle is gone
        fh.close()
    finally:
        client.close()
    assert sorted(p.name for p in bmpcmp.iterdir()) == ["kept.png"]
    assert (bmpcmp / "kept.png").read_bytes() == b"k" * 1000
