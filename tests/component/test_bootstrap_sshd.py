"""bootstrap_node.py against a real OpenSSH server (cluster/runtime/sshd.py's PrivateSshd on
127.0.0.1, logging in as the user running the tests, into a temporary REMOTE_DIR).

The first call sets the node up (code, node.conf, crontab entry, caps line); the second
changes nothing (every file's inode and mtime, and the crontab, stay as they were); a changed
module is the only file copied again and a stale one is removed; and an unreachable host, a
refused key, an unknown and a changed host key each give their own exit status and say so.

The crontab touched is the real one of the user running the tests (the node is this same
machine): the ``user_crontab`` fixture saves it and puts it back as it was, as
tests/e2e/test_cron.py does, and every entry is tagged with the temporary directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import configfile
from cluster.cron import TAG_PREFIX
from cluster.node import bootstrap, code, jobuser
from cluster.node.bootstrap import Bootstrap, NodeSettings
from cluster.runtime.ssh import SshTarget
from cluster.runtime.sshd import PrivateSshd
from tests.helpers import REPO, free_port
from tests.jobaccount import ACCOUNT, account_turn, kept_deny_files, searchable

#: One worker runs every test that writes a real crontab (xdist's loadgroup).
pytestmark = pytest.mark.xdist_group("crontab")

TIMEOUT = 300


def crontab_l() -> str:
    done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        assert "no crontab" in done.stderr, done.stderr
        return ""
    return done.stdout


@pytest.fixture
def user_crontab() -> Iterator[str]:
    """The real crontab, saved before and restored after (removed if there was none)."""
    if shutil.which("crontab") is None:
        pytest.fail("the crontab program is missing: apt-get install cron")
    done = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 and "no crontab" not in done.stderr:
        pytest.fail(f"crontab -l failed: {done.stderr}")
    saved = done.stdout if done.returncode == 0 else None
    try:
        yield saved or ""
    finally:
        if saved is None:
            subprocess.run(["crontab", "-r"], capture_output=True, timeout=30)
        else:
            subprocess.run(["crontab", "-"], input=saved, text=True, check=True, timeout=30)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    with PrivateSshd(tmp_path_factory.mktemp("sshd")) as server:
        if not server.running():
            server.start()
        yield server


def _argv(sshd: PrivateSshd, remote: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "bootstrap_node.py"), "127.0.0.1", "--name", "node7",
            "--port", str(sshd.port), "--key", str(sshd.client_key),
            "--known-hosts", str(sshd.known_hosts), "--dir", str(remote),
            "--python", sys.executable, "--master-host", "master.example",
            "--master-home", "/srv/cluster home", "--master-user", "regression",
            # This machine's root is the node's account: no job account unless a test
            # asks for one (test_a_root_node_gets_its_job_account...).
            "--job-user", "", *extra]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in root.rglob("*") if "__pycache__" not in p.parts}


def _ours(remote: Path) -> list[str]:
    tag = f"{TAG_PREFIX}clusterpull:{remote / bootstrap.WORK_DIR}"
    return [line for line in crontab_l().splitlines() if line.endswith("# " + tag)]


def test_bootstrap_sets_up_a_node_and_a_second_call_changes_nothing(
        sshd: PrivateSshd, tmp_path: Path, user_crontab: str) -> None:
    remote = tmp_path / "node dir"  # a blank: every remote command must quote it
    known = tmp_path / "master_known_hosts"
    known.write_text("[master.example]:22 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3tJ\n")
    argv = _argv(sshd, remote, "--send-master-known-hosts", str(known))
    first = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "ssh: connected, `true` ran" in out
    files = code.node_files(REPO)
    assert f"node code: {len(files)} of {len(files)} file(s) copied" in out
    assert "node.conf: written" in out and "known_hosts: written" in out
    assert "crontab: installed " in out
    caps = [line for line in out.splitlines() if line.startswith("capabilities: ")]
    assert len(caps) == 1 and caps[0].startswith("capabilities: os=Linux ")
    assert out.splitlines()[-1].startswith("changed: node code")

    # The copy is the node code, byte for byte; node.conf loads and says what was asked.
    assert code.manifest(remote, files) == code.manifest(REPO, files)
    cfg = configfile.load(remote / "node.conf")
    assert (cfg.node_name, cfg.transport, cfg.master_host, str(cfg.master_home),
            cfg.ssh_user, cfg.ssh_port) == ("node7", "ssh", "master.example",
                                            "/srv/cluster home", "regression", 22)
    assert cfg.ssh_known_hosts == remote / "known_hosts"
    assert (remote / "known_hosts").read_bytes() == known.read_bytes()
    assert cfg.work_dir == remote / bootstrap.WORK_DIR
    [entry] = _ours(remote)
    assert str(remote / "clusterpull.py") in entry and "--install-cron" not in entry
    crontab = crontab_l()

    # Second call: nothing to change, nothing written.
    before = _snapshot(remote)
    second = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "node code: unchanged" in second.stdout
    assert "node.conf: unchanged" in second.stdout and "crontab: unchanged" in second.stdout
    assert second.stdout.splitlines()[-1] == "nothing changed: the node was already set up"
    assert _snapshot(remote) == before
    assert crontab_l() == crontab

    # A different option rewrites node.conf only.
    third = subprocess.run([*argv, "--node-set", "slots=3"], capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert third.returncode == 0, third.stdout + third.stderr
    assert third.stdout.splitlines()[-1] == "changed: node.conf"
    assert configfile.load(remote / "node.conf").slots == 3
    assert crontab_l() == crontab


def test_only_changed_modules_travel_and_stale_ones_go(sshd: PrivateSshd, tmp_path: Path,
                                                       user_crontab: str) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "cluster", repo / "cluster",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for script in REPO.glob("*.py"):
        shutil.copy2(script, repo / script.name)
    remote = tmp_path / "node"
    target = SshTarget("127.0.0.1", sshd.port, key=str(sshd.client_key),
                       known_hosts=sshd.known_hosts)
    settings = NodeSettings("node8", "127.0.0.1", "/srv/home")
    lines: list[str] = []

    def once() -> bootstrap.Outcome:
        lines.clear()
        return Bootstrap(target, settings, remote_dir=str(remote), repo_root=repo,
                         python=sys.executable, out=lines.append, job_user="").run()

    assert once().exit_code == 0, lines
    (repo / "cluster/node/caps.py").write_text((repo / "cluster/node/caps.py").read_text()
                                               + "# changed\n")
    (remote / "cluster/node/old_module.py").write_text("# left from an older version\n")
    outcome = once()
    assert outcome.exit_code == 0, lines
    assert outcome.copied == ["cluster/node/caps.py"]
    assert outcome.removed == ["cluster/node/old_module.py"]
    assert not (remote / "cluster/node/old_module.py").exists()
    assert (remote / "cluster/node/caps.py").read_text().endswith("# changed\n")
    assert outcome.changed == ["node code (1 file(s) copied, 1 removed)"]


def _fail(target: SshTarget, tmp_path: Path) -> tuple[int, str]:
    lines: list[str] = []
    outcome = Bootstrap(target, NodeSettings("n", "m", "/h"), remote_dir=str(tmp_path / "x"),
                        python=sys.executable, timeout=10, out=lines.append).run()
    assert not (tmp_path / "x").exists(), "nothing may be written after a failed connect"
    return outcome.exit_code, "\n".join(lines)


def test_each_ssh_failure_says_which_it_is(sshd: PrivateSshd, tmp_path: Path) -> None:
    key, known = str(sshd.client_key), sshd.known_hosts

    code_, text = _fail(SshTarget("127.0.0.1", free_port(), key=key, known_hosts=known),
                        tmp_path)
    assert code_ == bootstrap.EXIT_UNREACHABLE and "the host is unreachable" in text, text

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True, timeout=60)
    code_, text = _fail(SshTarget("127.0.0.1", sshd.port, key=str(other), known_hosts=known),
                        tmp_path)
    assert code_ == bootstrap.EXIT_AUTH and "the host refused our key" in text, text

    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    code_, text = _fail(SshTarget("127.0.0.1", sshd.port, key=key, known_hosts=empty),
                        tmp_path)
    assert code_ == bootstrap.EXIT_HOSTKEY_UNKNOWN and "key is unknown" in text, text
    assert sshd.host_fingerprint in text

    wrong = tmp_path / "wrong_known_hosts"
    other_pub = (tmp_path / "other_key.pub").read_text().split()
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {other_pub[0]} {other_pub[1]}\n")
    code_, text = _fail(SshTarget("127.0.0.1", sshd.port, key=key, known_hosts=wrong),
                        tmp_path)
    assert code_ == bootstrap.EXIT_HOSTKEY_CHANGED and "CHANGED" in text, text
    assert sshd.host_fingerprint in text


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    for extra in (["--master-home", "relative/home"], ["--node-set", "no_such_key=1"],
                  ["--job-user", "Not An Account", "--master-home", "/h"],
                  ["--name", "bad name!", "--master-home", "/h"]):
        argv = [sys.executable, str(REPO / "bootstrap_node.py"), "127.0.0.1", "--name", "n1",
                *extra]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(tmp_path)})
        assert done.returncode == 2, (extra, done.stdout, done.stderr)


def test_a_root_node_gets_its_job_account_made_once_and_named_in_node_conf(
        sshd: PrivateSshd, tmp_path: Path, user_crontab: str) -> None:
    """As root on the node, bootstrap_node.py makes --job-user a system account with no
    login unless it exists, denies it cron (/etc/cron.deny: a real crontab run as it is
    then refused), names it in node.conf (mode 0600), changes nothing the second time, and
    refuses a REMOTE_DIR the account cannot enter; --allow-job-cron writes no deny file."""
    # No other test makes, uses or deletes the account meanwhile; the deny files are put
    # back for the next test's jobs.
    with account_turn(), kept_deny_files():
        try:
            pwd.getpwnam(ACCOUNT)
            existed = True
        except KeyError:
            existed = False
        try:
            with searchable(tmp_path):
                remote = tmp_path / "node"
                argv = _argv(sshd, remote, "--job-user", ACCOUNT)
                first = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
                assert first.returncode == 0, first.stdout + first.stderr
                made = f"job account: {ACCOUNT} " + ("exists" if existed else
                                                     "made (system account, no login)")
                assert made in first.stdout
                assert (f"job account: {ACCOUNT} denied cron (added to "
                        f"{jobuser.CRON_DENY}): its jobs cannot schedule anything to run "
                        "later") in first.stdout, first.stdout
                assert ACCOUNT in Path(jobuser.CRON_DENY).read_text().split()
                refused = subprocess.run(
                    ["runuser", "-u", ACCOUNT, "--", "crontab", "-"], input="1 1 1 1 1 true\n",
                    capture_output=True, text=True, timeout=60)
                assert refused.returncode != 0 and "not allowed" in refused.stderr, refused
                entry = pwd.getpwnam(ACCOUNT)
                assert entry.pw_shell == jobuser.NOLOGIN and 0 < entry.pw_uid < 1000
                assert configfile.load(remote / "node.conf").job_user == ACCOUNT
                assert (remote / "node.conf").stat().st_mode & 0o777 == bootstrap.CONF_MODE
                second = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
                assert second.returncode == 0, second.stdout + second.stderr
                assert f"job account: {ACCOUNT} exists" in second.stdout
                assert (f"job account: {ACCOUNT} already denied cron ({jobuser.CRON_DENY})"
                        in second.stdout), second.stdout
                assert second.stdout.splitlines()[-1] == ("nothing changed: the node was "
                                                          "already set up")
                closed = tmp_path / "closed"
                closed.mkdir(mode=0o700)
                third = subprocess.run(_argv(sshd, closed / "node", "--job-user", ACCOUNT),
                                       capture_output=True, text=True, timeout=TIMEOUT)
                assert third.returncode == 1, third.stdout + third.stderr
                assert f"job account {ACCOUNT} cannot enter {closed / 'node'}" in third.stdout
                assert not (closed / "node" / "node.conf").exists()
                Path(jobuser.CRON_DENY).unlink()
                allowed = subprocess.run([*argv, "--allow-job-cron"], capture_output=True,
                                         text=True, timeout=TIMEOUT)
                assert allowed.returncode == 0, allowed.stdout + allowed.stderr
                assert (f"job account: {ACCOUNT} may use cron and at (--allow-job-cron)"
                        in allowed.stdout), allowed.stdout
                assert not Path(jobuser.CRON_DENY).exists()
        finally:
            if not existed:
                subprocess.run(["userdel", ACCOUNT], capture_output=True, timeout=60)
