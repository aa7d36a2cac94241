"""Self-update over the ssh transport: a real OpenSSH server (PrivateSshd on 127.0.0.1)
in front of the master home, the node's SshTransport reading the MANIFEST over SFTP and
fetching node-code/ with rsync over ssh.  A new version moves only the changed files (rsync's
own statistics); a corrupt published file is refused."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from cluster.home import Home
from cluster.node import code, selfupdate
from cluster.node.selfupdate import CodeChoice, SelfUpdate
from cluster.node.sshtransport import SshTransport
from cluster.runtime.ssh import SshTarget
from cluster.runtime.sshd import PrivateSshd
from tests.helpers import REPO

INSTALLED = CodeChoice(Path("/installed/copy"))


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path / "sshd") as server:
        yield server


def test_fetch_over_ssh_moves_only_the_change(sshd: PrivateSshd, tmp_path: Path) -> None:
    repo = tmp_path / "master-repo"
    shutil.copytree(REPO / "cluster", repo / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, repo / script.name)
    home = Home(tmp_path / "home")
    home.create()
    code.publish(repo, home.node_code)
    target = SshTarget("127.0.0.1", sshd.port, key=str(sshd.client_key),
                       known_hosts=sshd.known_hosts)
    transport = SshTransport(target, PurePosixPath(str(home.root)), connect_retries=2,
                             connect_retry_delay=0.5, io_timeout=60)
    work = tmp_path / "work"
    updater = SelfUpdate(lambda: transport, work, INSTALLED)
    try:
        first = updater.choose()
        assert first.version == code.manifest_version(
            (home.node_code / code.MANIFEST).read_text())
        selfupdate.check_copy(first.root, (home.node_code / code.MANIFEST).read_text())
        stats = transport.last_fetch_stats
        published = code.published_files(code.node_files(repo))
        assert stats is not None and stats.files_transferred == len(published) + 1

        # Same manifest: one SFTP read, no fetch.
        transport.last_fetch_stats = None
        assert updater.choose() == first
        assert transport.last_fetch_stats is None

        # One module changed: rsync moves it, its bytecode and the manifest, nothing else.
        caps = repo / "cluster/node/caps.py"
        caps.write_text(caps.read_text() + "# changed on the master\n")
        code.publish(repo, home.node_code)
        second = updater.choose()
        assert second.version not in (None, first.version)
        stats = transport.last_fetch_stats
        assert stats is not None and stats.files_transferred == 3, stats

        # A damaged published file: refused, the last good version stays in use.
        caps.write_text(caps.read_text() + "# again\n")
        code.publish(repo, home.node_code)
        (home.node_code / "cluster/node/caps.py").write_text("import os\n")
        assert updater.choose() == second
        assert transport.connects == 4, "one connection per cycle, closed after it"
        assert transport._client is None
    finally:
        transport.close()
