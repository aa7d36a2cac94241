"""End to end: developers' keys restricted to the user gate (docs/operating.md, "The user
gate"): ``clusterpush --master ... --wait --junit`` against a real local cluster through a
private OpenSSH server, ``--fetch``, and another developer refused.

The keys are let in with the real ``clusteradmin adduser`` (a ``restrict,command=...
usergate.py --user NAME`` line); the real ``clusterpush.py`` runs with no view of the
master home but the ssh server, alice's as an account that is not root
(tests/jobaccount.py).  Through the gate nothing is shipped: the master's own code runs
every step.  A plain login (no forced command) still works, with the shipped code.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cluster.demotree import write_demo_tree
from cluster.runspec import RunSpec
from cluster.runtime.ssh import SshTarget, ssh_command
from cluster.runtime.sshd import PrivateSshd
from cluster.wire.jobstart import JobStart
from tests.e2e.conftest import MakeCluster
from tests.helpers import REPO, slow_demo_tree, wait_for
from tests.jobaccount import made_account, searchable

pytestmark = pytest.mark.e2e

SMALL_GS = "ppmraw.72.0 pbmraw.72.0 pgmraw.300.1 pkmraw.72.0"


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, capture_output=True, timeout=60)
    return path


def test_gated_push_waits_fetches_and_refuses_another_users_run(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(gs_configs=SMALL_GS)
    home = cluster.home_dir
    # Alice's side: her account's own folder, outside pytest's (whose parents other test
    # sessions on the machine may make searchable and back meanwhile).
    laptop = Path(tempfile.mkdtemp(prefix="usergate-laptop-"))
    with PrivateSshd(tmp_path / "sshd") as sshd, made_account() as account, \
            searchable(Path(sys.executable).parent), contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, laptop, ignore_errors=True)
        os.chmod(laptop, 0o755)
        keys = {"alice": keygen(laptop / "alice_key"), "bob": keygen(tmp_path / "bob_key")}
        shutil.copy(sshd.known_hosts, laptop / "known_hosts")
        for path in [laptop, *laptop.iterdir()]:
            os.chown(path, account.uid, account.gid)
        for name, key in keys.items():
            done = subprocess.run(
                [sys.executable, str(REPO / "clusteradmin.py"), "--home", str(home),
                 "adduser", name, str(key.with_suffix(".pub")), "--authorized-keys",
                 str(sshd.authorized_keys)], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert "the user gate" in done.stdout
        lines = sshd.authorized_keys.read_text().splitlines()
        assert any(line.startswith('restrict,command="') and "--user alice" in line
                   for line in lines)
        cluster.start()

        def clusterpush(user: str, *words: str, cwd: Path = laptop
                        ) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, str(REPO / "clusterpush.py"),
                    "--master", f"{sshd.user}@{sshd.address}:{home}",
                    "--ssh-port", str(sshd.port), "--ssh-key", str(keys[user]),
                    "--known-hosts", str(laptop / "known_hosts"),
                    "--master-cache", str(tmp_path / "no-cache"), "--user", user, *words]
            env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(laptop)}
            if user == "alice":  # as a developer's own account, not root
                return subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                                      timeout=400, env=env, user=account.uid,
                                      group=account.gid, extra_groups=[])
            return subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                                  timeout=400, env=env)

        def push(options: list[str], name: str) -> tuple[int, ET.Element, str]:
            tree = write_demo_tree(laptop / name / "ghostpdl", "gs", options)
            junit = laptop / f"{name}.xml"
            done = clusterpush("alice", "gs", "--wait", "--wait-timeout", "300",
                               "--junit", str(junit), cwd=tree)
            assert "Traceback" not in done.stderr, done.stderr
            return done.returncode, ET.parse(junit).getroot(), done.stdout

        rc, xml, out = push([], "plain")
        assert rc == 0, out
        suite = xml.find("testsuite")
        assert suite is not None and suite.get("failures") == "0"
        assert int(suite.get("tests") or 0) == len(suite.findall("testcase")) > 0
        # Nothing was shipped: the gate ran the master's own code.
        assert not (tmp_path / "no-cache").exists()
        assert os.stat(laptop / "plain.xml").st_uid == account.uid

        rc, xml, out = push(["-dTextAlphaBits=4", "-dGraphicsAlphaBits=4"], "changed")
        assert rc == 1, out
        suite = xml.find("testsuite")
        assert suite is not None
        failures = [c for c in suite.findall("testcase") if c.find("failure") is not None]
        assert failures and int(suite.get("failures") or 0) == len(failures)
        assert len(failures) < int(suite.get("tests") or 0)
        for case in failures:
            assert case.get("name") in out  # the report printed names it too
        run = out.strip().splitlines()[-1].rsplit("/", 1)[1]

        dest = laptop / "fetched"
        done = clusterpush("alice", "--fetch", run, "--dest", str(dest))
        assert done.returncode == 0, done.stderr
        got = {p.relative_to(dest / run).as_posix() for p in (dest / run).rglob("*")
               if p.is_file()}
        assert {"report.txt", f"{run}.tab", "junit.xml", "result.json"} <= got
        assert (dest / run / "junit.xml").read_bytes() == (laptop / "changed.xml").read_bytes()
        assert not any(name.endswith(".log") or name == "run.info" for name in got)
        assert (dest / run / "report.txt").read_bytes() == \
            (home / "archive" / run / "report.txt").read_bytes()

        # Bob's key cannot fetch or stop alice's run, nor push as alice.
        for words in (["--fetch", run, "--dest", str(tmp_path / "bob")], ["--stop", run]):
            done = clusterpush("bob", *words)
            assert done.returncode == 2, done.stdout
            assert "refused for user bob" in done.stderr
            assert "not a run of user bob" in done.stderr
        assert not (tmp_path / "bob" / run).exists()
        done = clusterpush("alice", "--fetch", run, "--user", "alice")  # own: fine
        assert done.returncode == 0, done.stderr
        tree = laptop / "plain" / "ghostpdl"
        done = subprocess.run(
            [sys.executable, str(REPO / "clusterpush.py"),
             "--master", f"{sshd.user}@{sshd.address}:{home}", "--ssh-port", str(sshd.port),
             "--ssh-key", str(keys["bob"]), "--known-hosts", str(sshd.known_hosts),
             "--user", "alice", "gs"], cwd=tree, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "refused for user bob" in done.stderr
        log = (home / "log" / "usergate.log").read_text()
        assert [line.split(" ", 4)[3] for line in log.splitlines()] == ["bob:"] * 3
        assert run in log
        audit = [line.split("\t") for line in
                 (home / "log" / "usergate-audit.tsv").read_text().splitlines()]
        refused = [row for row in audit if row[2] == "refused"]
        assert [row[1] for row in refused] == ["bob"] * 3
        assert any(row[1] == "alice" and row[3] == "commit" for row in audit)


def on_terminal(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run ``argv`` with its stdout a pseudo-terminal: (exit status, what it showed there,
    its stderr)."""
    master, slave = pty.openpty()
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(argv, cwd=cwd, stdout=slave, stderr=subprocess.PIPE, text=True,
                              timeout=400)
    finally:
        os.close(slave)
    reader.join(30)
    os.close(master)
    return done.returncode, shown.decode("utf-8", "replace").replace("\r\n", "\n"), done.stderr


def test_a_plain_login_waits_fetches_and_reruns_with_the_shipped_code(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0")
    home = cluster.home_dir
    with PrivateSshd(tmp_path / "sshd") as sshd:
        cluster.start()
        cache = tmp_path / "cache"

        def clusterpush(*words: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, str(REPO / "clusterpush.py"),
                 "--master", f"{sshd.user}@{sshd.address}:{home}",
                 "--ssh-port", str(sshd.port), "--ssh-key", str(sshd.client_key),
                 "--known-hosts", str(sshd.known_hosts), "--master-cache", str(cache),
                 "--user", "ann", *words], cwd=cwd, capture_output=True, text=True,
                timeout=400)

        # On a terminal, the wait shows the master's progress as one line rewritten in place.
        tree = slow_demo_tree(tmp_path / "ghostpdl", "gs", [])
        status, shown, err = on_terminal(
            [sys.executable, str(REPO / "clusterpush.py"),
             "--master", f"{sshd.user}@{sshd.address}:{home}",
             "--ssh-port", str(sshd.port), "--ssh-key", str(sshd.client_key),
             "--known-hosts", str(sshd.known_hosts), "--master-cache", str(cache),
             "--user", "ann", "gs", "--wait", "--json", str(tmp_path / "r.json")], tree)
        assert status == 0, err
        assert "\r" in shown and "jobs done" in shown, shown
        assert list(cache.glob("cluster-*.pyz"))  # the shipped code ran the steps
        run = shown.strip().splitlines()[-1].rsplit("/", 1)[1]
        assert f'"run": "{run}"' in (tmp_path / "r.json").read_text()
        done = clusterpush("--fetch", run, "--dest", str(tmp_path / "got"))
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "got" / run / f"{run}.tab").is_file()
        done = clusterpush("--rerun", run)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("queueing: user ann gs")
        before = {run}
        again = cluster.wait_for_run(RunSpec.parse("user ann gs"), before, 240)
        assert again.name != run
        assert "queue user ann gs\n" in (again / "run.info").read_text()


def test_through_the_gate_only_the_owner_stops_a_running_run_and_an_admin_sees_all(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    cluster = make_cluster(gs_configs="ppmraw.72.0 ppmraw.72.1 pkmraw.72.0 pgmraw.72.1")
    home = cluster.home_dir
    with PrivateSshd(tmp_path / "sshd") as sshd:
        keys = {name: keygen(tmp_path / f"{name}_key") for name in ("alice", "bob", "carol")}
        for name, key in keys.items():
            done = subprocess.run(
                [sys.executable, str(REPO / "clusteradmin.py"), "--home", str(home),
                 "adduser", name, str(key.with_suffix(".pub")), "--authorized-keys",
                 str(sshd.authorized_keys), *(["--admin"] if name == "carol" else [])],
                capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        cluster.start()

        def clusterpush(user: str, *words: str, cwd: Path = tmp_path
                        ) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, str(REPO / "clusterpush.py"),
                 "--master", f"{sshd.user}@{sshd.address}:{home}",
                 "--ssh-port", str(sshd.port), "--ssh-key", str(keys[user]),
                 "--known-hosts", str(sshd.known_hosts), "--user", user, *words],
                cwd=cwd, capture_output=True, text=True, timeout=300)

        tree = slow_demo_tree(tmp_path / "ghostpdl", "gs", [])
        before = cluster.archives()
        done = clusterpush("alice", "gs", cwd=tree)
        assert done.returncode == 0, done.stderr
        start_file = cluster.home.job_start(0)
        wait_for(lambda: start_file.exists(), 120, "alice's run started")
        run = JobStart.parse(start_file.read_text()).id

        done = clusterpush("bob", "--stop", run, "--reason", "mine now")
        assert done.returncode == 2
        assert "refused for user bob" in done.stderr and "not a run of user bob" in done.stderr
        assert not cluster.home.stop_request(run).exists()

        ssh = subprocess.run(
            [*ssh_command(SshTarget(sshd.address, sshd.port, sshd.user, str(keys["carol"]),
                                    sshd.known_hosts)),
             f"{sshd.user}@{sshd.address}", "clusteradmin stat"],
            capture_output=True, text=True, timeout=60)
        assert ssh.returncode == 0, ssh.stderr
        assert run in ssh.stdout
        ssh = subprocess.run(
            [*ssh_command(SshTarget(sshd.address, sshd.port, sshd.user, str(keys["bob"]),
                                    sshd.known_hosts)),
             f"{sshd.user}@{sshd.address}", "clusteradmin stat"],
            capture_output=True, text=True, timeout=60)
        assert ssh.returncode == 1 and "for an administrator's key" in ssh.stderr

        done = clusterpush("alice", "--stop", run, "--reason", "wrong tree")
        assert done.returncode == 0, done.stderr
        assert f"stop run {run}" in done.stdout
        archive = cluster.wait_for_run(RunSpec.parse("user alice gs"), before, 120)
        assert archive.name == run
        assert "stopped by alice (clusterpush through the user gate): wrong tree" in \
            (archive / "report.txt").read_text()
