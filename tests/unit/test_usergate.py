"""The user gate's reading of a request: what it lets through for whom, what it refuses, and
that every refusal is one line, logged and audited (cluster/cli/usergate.py)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from cluster.cli.usergate import AUDIT_NAME, LOG_NAME, UserGate
from cluster.home import Home

RUN = "20261128120000-p0-ab12"
TOKEN = "0123456789abcdef"


def make_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    run = home / "archive" / RUN
    (run / "results").mkdir(parents=True)
    (run / "run.info").write_text("queue user alice gs\noutcome done\n")
    (run / "report.txt").write_text("the report\n")
    (run / f"{RUN}.tab").write_text("a\tb\n")
    (run / "audit.log").write_text("secret-ish\n")
    (run / "results" / "t1.txt").write_text("result\n")
    (run / "results" / ".hidden").write_text("no\n")
    os.symlink("/etc/passwd", run / "results" / "link")
    return home


def gate(home: Path, user: str, *, admin: bool = False,
         stdin: bytes | None = None) -> tuple[UserGate, list[str]]:
    said: list[str] = []
    fd = 0
    if stdin is not None:
        r, w = os.pipe()
        os.write(w, stdin)
        os.close(w)
        fd = r
    return UserGate(home, user, admin=admin, stdin_fd=fd, err=said.append), said


RECEIVE = f"clusterpush-gate receive --line='user bob gs' --token={TOKEN}"


@pytest.mark.parametrize(("command", "why"), [
    ("", "no shell is given"),
    ("ls -la /", "not a request of the user gate"),
    ("clusteradmin stat", "for an administrator's key"),
    (f"clusterpush-gate fetch --run={RUN}", "not a run of user bob"),
    (f"clusterpush-gate stop --run={RUN}", "not a run of user bob"),
    (f"clusterpush-gate report --run={RUN}", "not a run of user bob"),
    (f"clusterpush-gate rerun --run={RUN}", "not a run of user bob"),
    (f"clusterpush-gate report --run={RUN} --user=alice", "--user alice"),
    ("clusterpush-gate abort --user=alice", "--user alice"),
    (f"clusterpush-gate commit --line='user alice gs' --token={TOKEN}",
     "queues only 'user bob ...' runs"),
    ("clusterpush-gate wait --line='auto nightly gs' --after=0 --timeout=1",
     "queues only 'user bob ...' runs"),
    ("clusterpush-gate wait --home=/elsewhere --line='user bob gs' --after=0 --timeout=1",
     "the gate's home holds"),
    (f"{RECEIVE} --rsync=/bin/sh -- --server -ltpre.iLsfxCIvu . .", "--rsync"),
    (f"{RECEIVE} --modes=/etc/passwd -- --server -ltpre.iLsfxCIvu . .", "--modes"),
    (f"{RECEIVE} -- --server -ltpre.iLsfxCIvu --temp-dir=/root . .", "rsync option"),
    (f"{RECEIVE} -- --server -ltpkre.iLsfxCIvu . .", "rsync flags"),
    (f"{RECEIVE} -- --server --sender -ltpre.iLsfxCIvu . .", "receiving server only"),
    (f"{RECEIVE} -- --server -ltpre.iLsfxCIvu . /root/.ssh", "receive into '.'"),
    ("clusterpush-gate modes --token=../../x", "expected modes --token"),
    ("clusterpush-gate receive --line='user bob gs' --token=/../../../../victim -- --server "
     "-ltpre.iLsfxCIvu . .", "expected 16 lowercase hex digits"),
    ("clusterpush-gate commit --line='user bob gs' --token=x", "16 lowercase hex digits"),
    ("clusterpush-gate wait --ho=/elsewhere --line='user bob gs' --after=0 --timeout=1",
     "the gate's home holds"),
    (f"{RECEIVE} --rs=/bin/sh -- --server -ltpre.iLsfxCIvu . .", "--rsync"),
    (f"clusterpush-gate commit --line='user bob sweep sweep=s.toml' --token={TOKEN}",
     "may not queue sweeps"),
    ("clusterpush-gate frobnicate", "not a step of clusterpush --master"),
    ("clusterpush-gate 'unbalanced", "cannot be split"),
])
def test_a_refusal_is_one_line_logged_and_audited(tmp_path: Path, command: str,
                                                   why: str) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "bob")
    assert g.run(command) == 1
    assert len(said) == 1 and "\n" not in said[0]
    assert said[0].startswith("usergate: ") and "refused for user bob" in said[0]
    assert why in said[0]
    log = (home / "log" / LOG_NAME).read_text().splitlines()
    assert len(log) == 1 and "user bob:" in log[0] and why in log[0]
    audit = (home / "log" / AUDIT_NAME).read_text().splitlines()
    assert len(audit) == 1 and audit[0].split("\t")[1:3] == ["bob", "refused"]


def test_rsync_arguments_sent_on_stdin_are_checked_too(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "bob", stdin=b"rsync\0--timeout=5\0--backup-dir=/root\0.\0.\0\0")
    assert g.run(f"{RECEIVE} -- --server -sltpre.iLsfxCIvu") == 1
    assert "'--backup-dir=/root'" in said[0]


@pytest.mark.parametrize("words", ["--home /elsewhere stat", "stat --hom=/elsewhere",
                                   "--conf /tmp/x stat", "stat --se home=/x"])
def test_clusteradmin_of_an_admin_keeps_the_gates_home(tmp_path: Path, words: str) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "root-ish", admin=True)
    assert g.run(f"clusteradmin {words}") == 1
    assert "the gate's home and configuration hold" in said[0]


def test_a_token_is_checked_before_any_file_is_named_by_it(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (home / "users" / "bob" / ".modes.").mkdir(parents=True)
    g, said = gate(home, "bob")
    token = "/" + "../" * 6 + str(victim).lstrip("/")
    assert g.run(f"clusterpush-gate receive --line='user bob gs' --token={token} -- "
                 "--server -ltpre.iLsfxCIvu . .") == 1
    assert victim.read_text() == "keep me"


def test_hello_names_the_user_and_the_protocol(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "alice")
    assert g.run("clusterpush-gate hello") == 0
    line = capsys.readouterr().out.strip()
    assert json.loads(line.split(": ", 1)[1]) == {"gate": 1, "user": "alice", "admin": False}
    assert said == []
    assert (home / "log" / AUDIT_NAME).read_text().split("\t")[1:4] == \
        ["alice", "allowed", "hello"]


def test_the_owner_gets_the_report_and_fetches_only_what_the_status_page_serves(
        tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "alice")
    assert g.run(f"clusterpush-gate report --run={RUN}") == 0
    assert capsysbinary.readouterr().out == b"the report\n"
    assert g.run(f"clusterpush-gate fetch --run={RUN}") == 0
    with tarfile.open(fileobj=io.BytesIO(capsysbinary.readouterr().out)) as tar:
        names = sorted(m.name for m in tar.getmembers())
    assert names == [f"{RUN}/{RUN}.tab", f"{RUN}/report.txt", f"{RUN}/results/t1.txt"]
    assert said == []


def test_an_admin_may_fetch_any_run(tmp_path: Path,
                                    capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "carol", admin=True)
    assert g.run(f"clusterpush-gate report --run={RUN}") == 0
    assert capsysbinary.readouterr().out == b"the report\n"


def test_the_modes_list_is_kept_in_the_users_folder_only(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    g, said = gate(home, "bob", stdin=b"0644 a\0")
    assert g.run(f"clusterpush-gate modes --token {TOKEN}") == 0
    assert (Home(home).users / "bob" / f".modes.{TOKEN}").read_bytes() == b"0644 a\0"
    g, said = gate(home, "bob", stdin=b"again")
    assert g.run(f"clusterpush-gate modes --token {TOKEN}") == 1  # one list per push
    assert "has a modes list already" in said[0]
    os.rename(home / "users" / "bob", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", home / "users" / "bob")
    g, said = gate(home, "bob", stdin=b"x")
    assert g.run(f"clusterpush-gate modes --token {TOKEN[::-1]}") == 1
    assert "is not a directory" in said[0]
    assert not (tmp_path / "elsewhere" / f".modes.{TOKEN[::-1]}").exists()
