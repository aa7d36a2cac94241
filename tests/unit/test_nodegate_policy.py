"""The node gate's decisions: which paths a node reads and writes, which commands pass, the
rsync command line it runs, and the authorized_keys line bootstrap_node.py --restrict
writes."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from cluster import nodekeys
from cluster.master.gate import gate
from cluster.master.gate.gatepolicy import NodeArea
from cluster.node.sshtransport import WALK_SCRIPT
from cluster.runtime import mirror

RUN = "20260101000000"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    for folder in (f"runs/{RUN}/logs", "tests/sub", "ssh", "users/ann/gs"):
        (home / folder).mkdir(parents=True)
    (home / "cluster.secret").write_text("x")
    nodekeys.ensure_node_key(home, "node1")
    nodekeys.ensure_node_key(home, "node2")
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data", home / "corpus")  # the admin's link: trusted
    (tmp_path / "keys").mkdir()
    os.symlink(tmp_path / "keys", home / "ssh2")
    return home


def real(path: Path) -> str:
    return os.path.realpath(path)


def test_reads(home: Path, tmp_path: Path) -> None:
    area = NodeArea(home, "node1")
    for ok in ("job.start", "tests/sub", "users/ann/gs", f"runs/{RUN}/logs",
               "node-keys/node1.key", "corpus/x.pdf"):
        assert area.read_verdict(real(home / ok)) is None, ok
    for secret in ("cluster.secret", "node-keys/node2.key", "node-keys", "ssh/client_key",
                   "ssh"):
        assert area.read_verdict(real(home / secret)) == \
            f"{secret} is one of the master's secrets", secret
    assert area.read_verdict("/etc/passwd") == "it is outside the master home"
    assert area.read_verdict(str(tmp_path)) == "it is outside the master home"
    # A link that is not at the home's top level is not trusted: what counts is its target.
    os.symlink("/etc", home / "tests" / "etc")
    assert area.read_verdict(real(home / "tests" / "etc" / "passwd")) is not None
    os.symlink("../../cluster.secret", home / "tests" / "sub" / "leak")
    assert area.read_verdict(real(home / "tests" / "sub" / "leak")) is not None


def test_an_admin_link_to_the_keys_is_as_secret_as_the_folder(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    (tmp_path / "secure").mkdir()
    os.symlink(tmp_path / "secure", home / "node-keys")
    (tmp_path / "secure" / "node2.key").write_text("k")
    area = NodeArea(home, "node1")
    assert area.read_verdict(real(tmp_path / "secure" / "node2.key")) is not None
    assert area.read_verdict(real(tmp_path / "secure" / "node1.key")) is None


def test_trees(home: Path, tmp_path: Path) -> None:
    area = NodeArea(home, "node1")
    assert area.tree_verdict(real(home / "tests")) is None
    assert area.tree_verdict(real(home / "corpus")) is None
    assert area.tree_verdict(real(home)) == "it holds the master home (fetch a folder " \
                                            "inside the home)"
    assert area.tree_verdict(real(tmp_path)) == "it is outside the master home"
    assert area.tree_verdict(real(home / "node-keys")) is not None
    assert area.tree_verdict(real(home / "ssh")) is not None


def test_uploads(home: Path) -> None:
    area = NodeArea(home, "node1")
    logs = real(home / "runs" / RUN / "logs")
    bmp = os.path.join(real(home / "runs" / RUN), "bmpcmp")
    for name in ("node1.log", "node1.build.log", ".node1.log.123.abcdefgh.tmp"):
        assert area.upload_verdict(logs, name) is None, name
    for name in ("node2.log", ".node2.log.123.abcdefgh.tmp", "results", "..", "a/b", ""):
        assert area.upload_verdict(logs, name) is not None, name
    for name in ("0001.png", "0001.meta", "dropped.node1", ".0001.png.9.abcdefgh.tmp"):
        assert area.upload_verdict(bmp, name) is None, name
    assert area.upload_verdict(bmp, ".hidden") is not None
    for folder in (real(home), real(home / "tests"), real(home / "runs" / RUN),
                   real(home / "runs"), "/tmp"):
        assert area.upload_verdict(folder, "node1.log") == \
            "it is outside the node's upload area", folder
    assert area.mkdir_verdict(real(home / "runs" / RUN), "bmpcmp") is None
    assert area.mkdir_verdict(real(home / "runs" / RUN), "logs") is None
    assert area.mkdir_verdict(real(home / "runs"), "new") is not None
    assert area.mkdir_verdict(real(home / "runs" / RUN), "other") is not None
    assert area.mkdir_verdict(real(home), "runs") is not None


def test_a_node_uploads_only_its_own_sweep_result_bundles(home: Path) -> None:
    area = NodeArea(home, "node1")
    run = real(home / "runs" / RUN)
    incoming = os.path.join(run, "results", "incoming")
    mine = "node1.0123456789abcdef.7.tar"
    for name in (mine, f".{mine}.123.abcdefgh.tmp"):
        assert area.upload_verdict(incoming, name) is None, name
    for name in ("node2.0123456789abcdef.7.tar", "node1.0123456789abcdef.7.tar.gz",
                 "node1.x.7.tar", "node1.log", "tasks.json", ".hidden",
                 ".node2.0123456789abcdef.7.tar.123.abcdefgh.tmp"):
        assert area.upload_verdict(incoming, name) == (
            "only this node's result bundles (node1.<instance>.<n>.tar) are written there"
        ), name
    # Nowhere else in results/: not the results the master keeps, not a task's folder.
    for folder in (os.path.join(run, "results"), os.path.join(run, "results", "t1"),
                   os.path.join(incoming, "sub"), os.path.join(run, "incoming")):
        assert area.upload_verdict(folder, mine) == \
            "it is outside the node's upload area", folder
    # The two folders, in an existing run's folder, and nothing else new.
    assert area.mkdir_verdict(run, "results") is None
    assert area.mkdir_verdict(os.path.join(run, "results"), "incoming") is None
    assert area.mkdir_verdict(os.path.join(run, "results"), "t1") is not None
    assert area.mkdir_verdict(os.path.join(run, "logs"), "incoming") is not None
    assert area.mkdir_verdict(incoming, "x") is not None
    assert area.mkdir_verdict(real(home / "runs"), "results") is not None
    assert "runs/<id>/results/incoming/node1.<instance>.<n>.tar" in area.what_is_allowed()


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.err: list[str] = []

    def execv(self, path: str, argv: list[str]) -> None:
        self.calls.append((path, argv))


def _gate(home: Path, node: str = "node1") -> tuple[gate.Gate, Recorder]:
    rec = Recorder()
    return gate.Gate(home, node, execv=rec.execv, err=rec.err.append), rec


def test_commands_other_than_a_nodes_are_refused(home: Path) -> None:
    g, rec = _gate(home)
    for command in ("", "cat cluster.secret", "sh -c true", "rsync --server . x/",
                    "rsync --server --sender -e.LsfxCIvu . x/", "python3 -c 'print(1)' a b",
                    "bash", "scp -f cluster.secret", "'unclosed"):
        assert g.run(command) == gate.EXIT_REFUSED, command
        assert len(rec.err) == 1 and rec.err[0].startswith("nodegate: "), command
        assert "refused for node node1" in rec.err[0]
        assert "rsync --server --sender" in rec.err[0]  # what is allowed
        rec.err.clear()
    assert rec.calls == []
    logged = (home / "log" / gate.LOG_NAME)
    assert not logged.exists()  # no log folder in this home: refusals still said


def test_listing_passes_only_the_nodes_script_on_a_tree(home: Path) -> None:
    (home / "log").mkdir()
    g, rec = _gate(home)
    tests = str(home / "tests")
    ok = shlex.join(["python3", "-c", WALK_SCRIPT, tests, mirror.TEMP_PREFIX])
    assert g.run(ok) == 0
    assert rec.calls and rec.calls[0][1][1:] == ["-c", WALK_SCRIPT, tests, mirror.TEMP_PREFIX]
    rec.calls.clear()
    for bad in (shlex.join(["python3", "-c", WALK_SCRIPT + "\n", tests, mirror.TEMP_PREFIX]),
                shlex.join(["python3", "-c", WALK_SCRIPT, str(home), mirror.TEMP_PREFIX]),
                shlex.join(["python3", "-c", WALK_SCRIPT, str(home / "node-keys"),
                            mirror.TEMP_PREFIX]),
                shlex.join(["python3", "-c", WALK_SCRIPT, tests, "x"])):
        assert g.run(bad) == gate.EXIT_REFUSED
    assert rec.calls == []
    assert (home / "log" / gate.LOG_NAME).read_text().count("refused") == 4


def test_rsync_sender_is_checked_and_links_out_excluded(home: Path, tmp_path: Path) -> None:
    tests = home / "tests"
    (tests / "a.pdf").write_text("a")
    os.symlink("a.pdf", tests / "in.pdf")
    os.symlink("../../cluster.secret", tests / "sub" / "leak")
    os.symlink("sub", tests / "dirlink")
    os.symlink("/nowhere", tests / "*dangling")
    g, rec = _gate(home)
    assert g.run(f"rsync --server --sender -lLtpre.iLsfxCIvu --timeout=60 . {tests}/") == 0
    path, argv = rec.calls[0]
    assert os.path.basename(path) == "rsync"
    assert argv[:5] == ["rsync", "--server", "--sender", "-lLtpre.iLsfxCIvu", "--timeout=60"]
    assert sorted(argv[5:-2]) == ["--exclude=/\\*dangling", "--exclude=/dirlink",
                                  "--exclude=/sub/leak"]
    assert argv[-2:] == [".", f"{tests}/"]
    rec.calls.clear()
    # Without -L links are sent as links (no content): nothing to exclude.
    assert g.run(f"rsync --server --sender -logDtpre.iLsfxCIvu . {tests}/") == 0
    assert rec.calls[0][1][-3:] == ["-logDtpre.iLsfxCIvu", ".", f"{tests}/"]
    rec.calls.clear()
    for bad in (f"rsync --server --sender -lkre.iLsfxCIvu . {tests}/",
                f"rsync --server --sender -lre.iLsfxCIvu --remove-source-files . {tests}/",
                f"rsync --server --sender -lre.iLsfxCIvu . {tests}/ {home}/",
                f"rsync --server --sender -lre.iLsfxCIvu . {tests}",
                f"rsync --server --sender -lre.iLsfxCIvu . {home}/",
                f"rsync --server --sender -lre.iLsfxCIvu . {home}/ssh/",
                f"rsync --server --sender -lre.iLsfxCIvu . {tmp_path}/",
                f"rsync --server -lre.iLsfxCIvu . {tests}/",
                f"rsync --server --sender -sre.iLsfxCIvu . {tests}/"):
        assert g.run(bad) == gate.EXIT_REFUSED, bad
    assert rec.calls == []


def test_authorized_keys_line_and_its_idempotent_write(tmp_path: Path) -> None:
    command = gate.gate_command("/srv/a home", "node1", python="/usr/bin/python3",
                                repo=Path("/opt/cluster"))
    assert command == ("/usr/bin/python3 /opt/cluster/nodegate.py --home '/srv/a home' "
                       "--node node1")
    public = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA node1@host"
    line = gate.authorized_line('say "hi"', public)
    assert line == 'restrict,command="say \\"hi\\"" ' + public
    line = gate.authorized_line(command, public)
    keys = tmp_path / "ssh" / "authorized_keys"
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB admin@host"
    keys.parent.mkdir()
    keys.write_text(f"{other}\n{public}\n")  # the node's key, unrestricted: replaced
    assert gate.authorize(keys, line) == "replaced"
    assert keys.read_text() == f"{other}\n{line}\n"
    assert oct(keys.stat().st_mode & 0o777) == "0o600"
    assert gate.authorize(keys, line) == "unchanged"
    assert gate.authorize(tmp_path / "new" / "authorized_keys", line) == "added"
    with pytest.raises(ValueError):
        gate.authorized_line(command, "not a key")


def test_the_sftp_subsystem_by_any_of_sshds_names(home: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd passes its Subsystem command: internal-sftp, or Debian's sftp-server by path
    (with its options); each is served by the gate's own SFTP, never run."""
    served: list[str] = []

    def sftp(self: gate.Gate) -> int:
        served.append("sftp")
        return 0
    monkeypatch.setattr(gate.Gate, "sftp", sftp)
    g, rec = _gate(home)
    for command in ("internal-sftp", "/usr/lib/openssh/sftp-server",
                    "/usr/lib/openssh/sftp-server -f AUTHPRIV -l INFO"):
        assert g.run(command) == 0
    assert served == ["sftp"] * 3 and rec.calls == [] and rec.err == []


def test_bootstrap_restrict_needs_the_home_here_and_the_nodes_public_key(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused as bad usage (exit 2) before anything is written or any host is reached."""
    from cluster.cli import bootstrap_node

    keys = tmp_path / "authorized_keys"
    base = ["node.invalid", "--name", "n1", "--restrict", "--authorized-keys", str(keys)]
    assert bootstrap_node.main([*base, "--master-home", str(home)]) == 2
    assert "the node's public key" in capsys.readouterr().err
    pub = tmp_path / "n1.pub"
    pub.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA n1\n")
    assert bootstrap_node.main([*base, "--master-home", str(tmp_path / "elsewhere"),
                                "--node-public-key", str(pub)]) == 2
    assert "a master home on this machine" in capsys.readouterr().err
    pub.write_text("not a key\n")
    assert bootstrap_node.main([*base, "--master-home", str(home),
                                "--node-public-key", str(pub)]) == 2
    assert "is not a public key line" in capsys.readouterr().err
    assert not keys.exists()
