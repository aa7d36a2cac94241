"""Unit tests of cluster.runtime.ssh's pure parts and of the ssh transport's tree plan
(the listing script runs for real, locally; no server needed)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

import cluster.runtime.mirror as mirror_mod
from cluster.errors import SshError
from cluster.node.sshtransport import WALK_SCRIPT, _plan
from cluster.runtime import fsutil, ssh
from cluster.runtime.sshd import fingerprint, known_hosts_name


def test_target_names() -> None:
    """destination, where, the known_hosts name and the remote spec of a target."""
    t = ssh.SshTarget("master.example", 2222, "cluster", "/k", Path("/kh"))
    assert t.destination() == "cluster@master.example"
    assert t.where() == "cluster@master.example:2222"
    assert t.host_key_name() == "[master.example]:2222"
    assert ssh.remote_spec(t, "home/tests/") == "cluster@master.example:home/tests/"
    plain = ssh.SshTarget("m")
    assert plain.destination() == "m" and plain.where() == "m:22"
    assert plain.host_key_name() == "m" == known_hosts_name("m", 22)
    assert known_hosts_name("127.0.0.1", 2222) == "[127.0.0.1]:2222"
    v6 = ssh.SshTarget("fd00::1", 22, "u")
    assert ssh.remote_spec(v6, "x") == "u@[fd00::1]:x"
    assert v6.where() == "u@[fd00::1]:22"


def test_known_hosts_default_is_the_users_file(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """No known_hosts given: ~/.ssh/known_hosts of the user running this, ~ expanded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ssh.SshTarget("m").known_hosts_file() == tmp_path / ".ssh" / "known_hosts"
    given = ssh.SshTarget("m", known_hosts=Path("~/kh"))
    assert given.known_hosts_file() == tmp_path / "kh"


def test_ssh_command_checks_host_keys_strictly() -> None:
    """The OpenSSH argv: our port, key only, the given known_hosts only, no prompts."""
    t = ssh.SshTarget("m", 2200, "u", "/keys/id", Path("/etc/kh"))
    argv = ssh.ssh_command(t)
    assert argv[:5] == ["ssh", "-F", "none", "-p", "2200"]
    text = " ".join(argv)
    for option in ("-i /keys/id", "IdentitiesOnly=yes", "BatchMode=yes",
                   "StrictHostKeyChecking=yes", "UserKnownHostsFile=/etc/kh",
                   "GlobalKnownHostsFile=/dev/null", "UpdateHostKeys=no"):
        assert option in text
    assert "m" not in argv and "u@m" not in argv  # the destination is the caller's
    assert "-i" not in ssh.ssh_command(ssh.SshTarget("m"))


def test_ssh_command_quotes_odd_paths() -> None:
    """ssh expands % in these options and splits them on blanks: both are escaped."""
    t = ssh.SshTarget("m", key="/a b/100%key", known_hosts=Path("/k h/%d"))
    argv = ssh.ssh_command(t)
    assert argv[argv.index("-i") + 1] == '"/a b/100%%key"'
    assert 'UserKnownHostsFile="/k h/%%d"' in argv


def test_rsync_argv() -> None:
    """rsync -a -s [--delete] -e '<ssh argv>' extra... src dest; -e splits back."""
    t = ssh.SshTarget("m", 2200, "u", "/k", Path("/kh"))
    argv = ssh.rsync_argv(t, "u@m:src/", "/dest/", extra=["--stats"])
    assert argv[:4] == ["rsync", "-a", "-s", "--delete"]
    assert shlex.split(argv[argv.index("-e") + 1]) == ssh.ssh_command(t)
    assert argv[-3:] == ["--stats", "u@m:src/", "/dest/"]
    assert "--delete" not in ssh.rsync_argv(t, "a", "b", delete=False)


RSYNC_STATS = """
Number of files: 1,203 (reg: 1,200, dir: 3)
Number of created files: 0
Number of deleted files: 0
Number of regular files transferred: 1
Total file size: 24,000,000 bytes
Total transferred file size: 20,000 bytes
Literal data: 1,410 bytes
Matched data: 18,590 bytes
File list size: 0
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 1,234
Total bytes received: 35,123

sent 1,234 bytes  received 35,123 bytes  72,714.00 bytes/sec
total size is 24,000,000  speedup is 660.07
"""


def test_parse_rsync_stats() -> None:
    """Every figure of --stats, digit grouping dropped; missing ones 0."""
    stats = ssh.parse_rsync_stats(RSYNC_STATS)
    assert stats == ssh.RsyncStats(files=1203, files_transferred=1, total_size=24_000_000,
                                   transferred_size=20_000, literal=1410, matched=18_590,
                                   sent=1234, received=35_123)
    assert stats.moved == 36_357
    assert ssh.parse_rsync_stats("Total bytes sent: 1.234.567\n").sent == 1_234_567
    assert ssh.parse_rsync_stats("nothing here") == ssh.RsyncStats()


def test_parse_real_rsync_stats(tmp_path: Path) -> None:
    """The parser reads what the installed rsync prints."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x" * 5000)
    done = subprocess.run(["rsync", "-a", "--stats", f"{tmp_path}/src/", f"{tmp_path}/dst/"],
                          capture_output=True, text=True, timeout=60, check=True)
    stats = ssh.parse_rsync_stats(done.stdout)
    assert stats.files_transferred == 1 and stats.total_size == 5000
    assert stats.received > 0 and stats.sent >= 5000


def test_temp_name_is_fsutils_form() -> None:
    """An upload's temp file sits beside the target, named as fsutil.temp_file names its
    files (so remove_dead_temps recognises it), unique per call."""
    names = {ssh.temp_name("runs/r/node7.log.gz") for _ in range(20)}
    assert len(names) == 20
    for name in names:
        path = Path(name)
        assert path.parent == Path("runs/r")
        match = fsutil.TEMP_NAME.fullmatch(path.name)
        assert match is not None
        assert match["target"] == "node7.log.gz" and match["pid"] == str(os.getpid())


def test_ssh_error() -> None:
    """SshError carries its kind and names the server; an unknown kind is a bug."""
    exc = SshError("auth", "u@m:22", "login refused")
    assert (exc.kind, exc.where, str(exc)) == ("auth", "u@m:22", "ssh u@m:22: login refused")
    with pytest.raises(ValueError, match="expected one of"):
        SshError("weird", "m", "x")


def test_classify() -> None:
    """Socket failures and a dropped greeting are "unreachable"; other ssh failures
    "protocol"."""
    assert ssh.classify(ConnectionRefusedError(111, "refused")) == "unreachable"
    assert ssh.classify(TimeoutError("timed out")) == "unreachable"
    assert ssh.classify(EOFError()) == "unreachable"
    assert ssh.classify(paramiko.SSHException("Error reading SSH protocol banner")) == \
        "unreachable"
    assert ssh.classify(paramiko.SSHException("Incompatible version (1.5 instead of 2.0)")) \
        == "protocol"


class _Link:
    """A transport's state as login_failure_kind reads it."""

    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


def test_login_failure_kind() -> None:
    """Only the server's refusal is "auth": its answer "failed" on an open connection,
    BadAuthenticationType, or a DISCONNECT of its own; a connection that closed during
    the login, or no answer in time, is "unreachable"."""
    kind = ssh.login_failure_kind
    shut = paramiko.AuthenticationException(
        "Authentication failed: transport shut down or saw EOF")
    failed = paramiko.AuthenticationException("Authentication failed.")
    assert kind(failed, _Link(True)) == "auth"  # type: ignore[arg-type]
    assert kind(paramiko.BadAuthenticationType("Bad authentication type", ["password"]),
                _Link(False)) == "auth"  # type: ignore[arg-type]
    assert kind(paramiko.AuthenticationException("Authentication timeout."),
                _Link(True)) == "unreachable"  # type: ignore[arg-type]
    assert kind(shut, _Link(False)) == "unreachable"  # type: ignore[arg-type]
    assert kind(shut, None) == "unreachable"
    a, b = socket.socketpair()
    try:
        told = ssh._Transport(a)
        assert not told.is_active()
        assert kind(shut, told) == "unreachable"
        told.disconnect = "Too many authentication failures (code 2)"
        assert kind(shut, told) == "auth"
    finally:
        a.close()
        b.close()


def test_fingerprints_agree_with_ssh_keygen(tmp_path: Path) -> None:
    """Our SHA256 fingerprints are ssh-keygen -l's, from a line and from a paramiko key."""
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True, timeout=60)
    listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True,
                            text=True, check=True, timeout=60).stdout.split()[1]
    line = key.with_suffix(".pub").read_text()
    assert fingerprint(line) == listed
    pkey = paramiko.Ed25519Key.from_private_key_file(str(key))
    assert ssh.key_fingerprint(pkey) == f"ssh-ed25519 {listed}"


# ----------------------------------------------------------------------------------------------
# The tree plan: the master-side listing + the node-side decisions = runtime.mirror's


def _listing(root: Path) -> bytes:
    done = subprocess.run([sys.executable, "-c", WALK_SCRIPT, str(root),
                           mirror_mod.TEMP_PREFIX], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _hard_tree(root: Path, outside: Path) -> None:
    for rel, text in {"a": "a", "sub/big": "123456", "skip/x": "x", "sub/keep": "k",
                      "x.o": "o", "src/bin/t": "t", f"{mirror_mod.TEMP_PREFIX}1": "tmp",
                      "name with\nnewline": "n", "sub/deep/er/f": "f"}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "sub/out").symlink_to(outside)
    (root / "in").symlink_to("a")
    (root / "in-big").symlink_to("sub/big")
    (root / "dir-link").symlink_to("sub")
    (root / "dangling").symlink_to("nowhere")
    (root / "loop").symlink_to("loop")
    (root / os.fsdecode(b"bad-\xff")).write_text("b")
    os.mkfifo(root / "fifo")


@pytest.mark.parametrize("exclude,max_size", [
    (None, None), (lambda p: p == "skip/", 5),
    (lambda p: p.endswith(".o") or p.endswith("bin/"), None), (None, 0)])
def test_plan_decides_as_the_mirror(tmp_path: Path, exclude: mirror_mod.Exclude | None,
                                    max_size: int | None) -> None:
    """The plan from the listing leaves out, excludes and asks the predicate about exactly
    what runtime.mirror does for the same local tree."""
    outside = tmp_path / "secret"
    outside.write_text("s")
    root = tmp_path / "tree"
    _hard_tree(root, outside)
    asked: dict[str, list[str]] = {"plan": [], "mirror": []}

    def spy(which: str) -> mirror_mod.Exclude | None:
        if exclude is None:
            return None

        def pred(path: str) -> bool:
            asked[which].append(path)
            return exclude(path)
        return pred
    plan = _plan(_listing(root), spy("plan"), max_size, "tree")
    skipped, excluded = mirror_mod._walk(root, spy("mirror"), max_size, "tree")
    assert sorted(plan.skipped) == sorted(skipped)
    assert sorted(plan.excluded) == sorted(excluded)
    assert sorted(asked["plan"]) == sorted(asked["mirror"])
    copied = tmp_path / "copy"
    n = mirror_mod.copy_tree(root, copied, exclude=exclude, max_size=max_size)
    assert plan.files == n


def test_walk_script_refuses_a_missing_root(tmp_path: Path) -> None:
    """Exit status 3 for a root that is not a directory (the transport's "no such
    directory")."""
    done = subprocess.run([sys.executable, "-c", WALK_SCRIPT, str(tmp_path / "none"),
                           mirror_mod.TEMP_PREFIX], capture_output=True, timeout=60)
    assert done.returncode == 3
