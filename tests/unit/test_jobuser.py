"""The job account's pure parts (cluster.node.jobuser): which account, or none; the
folders it can enter; the commands that make it and deny it cron and at; its at jobs in
root's atq listing; the job_user setting's grammar; and the node reading a job's files
never through a link (cluster.node.jobfiles)."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from cluster import config, configfile
from cluster.cli import clusterpull
from cluster.errors import ConfigError
from cluster.node import jobfiles, jobuser
from cluster.node.jobuser import JobAccount, JobUserError
from tests.jobaccount import searchable

#: An account that owns nothing here: only the "others" bits let it in.
STRANGER = JobAccount("stranger", 64999, 64999)


def test_no_account_unless_the_node_is_root_and_job_user_is_set() -> None:
    assert jobuser.job_account("nobody", euid=1000) is None
    assert jobuser.job_account("", euid=0) is None
    account = jobuser.job_account("nobody", euid=0)
    entry = pwd.getpwnam("nobody")
    assert account == JobAccount("nobody", entry.pw_uid, entry.pw_gid)


def test_a_missing_account_is_named_with_how_to_make_it() -> None:
    with pytest.raises(JobUserError) as caught:
        jobuser.job_account("no-such-account-x", euid=0)
    text = str(caught.value)
    assert "'no-such-account-x'" in text and "bootstrap_node.py" in text
    assert ("useradd --system --no-create-home --shell /usr/sbin/nologin no-such-account-x"
            in text)


def test_root_is_no_job_account() -> None:
    with pytest.raises(JobUserError, match="uid 0"):
        jobuser.job_account("root", euid=0)


def test_popen_args_drop_every_group_and_set_the_umask() -> None:
    assert STRANGER.popen_args() == {"user": 64999, "group": 64999, "extra_groups": [],
                                     "umask": 0o077}


def test_the_account_is_made_only_when_missing() -> None:
    assert jobuser.ensure_command("cluster-job") == (
        "id -u cluster-job >/dev/null 2>&1 || "
        "useradd --system --no-create-home --shell /usr/sbin/nologin cluster-job")


def test_blocked_folder_is_the_first_one_closed_to_the_account(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b" / "c"
    inner.mkdir(parents=True)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", inner):
        folder.chmod(0o711)
    with searchable(tmp_path):
        assert jobuser.blocked_folder(inner, STRANGER) is None
        (tmp_path / "a" / "b").chmod(0o700)
        assert jobuser.blocked_folder(inner, STRANGER) == tmp_path / "a" / "b"
        (tmp_path / "a").chmod(0o750)
        assert jobuser.blocked_folder(inner, STRANGER) == tmp_path / "a"


def test_can_enter_by_owner_group_or_others(tmp_path: Path) -> None:
    info = os.stat(tmp_path)
    owner = JobAccount("o", info.st_uid, 64998)
    group = JobAccount("g", 64997, info.st_gid)
    for mode, expected in ((0o700, (True, False, False)), (0o710, (True, True, False)),
                           (0o601, (False, False, True)), (0o001, (False, False, True))):
        tmp_path.chmod(mode)
        info = os.stat(tmp_path)
        seen = (jobuser.can_enter(info, owner), jobuser.can_enter(info, group),
                jobuser.can_enter(info, STRANGER))
        assert seen == expected, oct(mode)
    tmp_path.chmod(0o700)


@pytest.mark.parametrize("name", ["Root", "1job", "job user", "a/b", "x" * 33, "-x"])
def test_job_user_must_be_an_account_name(tmp_path: Path, name: str) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text(f"[node]\njob_user = {name}\n")
    with pytest.raises(ConfigError, match="job_user"):
        configfile.load(conf)


def test_job_user_defaults_to_none_and_takes_a_name(tmp_path: Path) -> None:
    assert config.DEFAULTS.job_user == ""
    conf = tmp_path / "node.conf"
    conf.write_text("[node]\njob_user = cluster-job\n")
    assert configfile.load(conf).job_user == "cluster-job"


def test_a_jobs_link_is_never_read_through(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the node's key\n")
    link = tmp_path / "job.log"
    link.symlink_to(secret)
    assert jobfiles.read_and_remove(str(link)) == ""
    assert not link.is_symlink() and secret.read_text() == "the node's key\n"
    link.symlink_to(secret)
    assert jobfiles.md5_and_remove(str(link), 1 << 20) == (None, 0)
    assert not link.is_symlink()
    fifo = tmp_path / "job.out"
    os.mkfifo(fifo)
    assert jobfiles.md5_and_remove(str(fifo), 1 << 20) == (None, 0)  # not a regular file
    plain = tmp_path / "plain.log"
    plain.write_text("ok\n")
    assert jobfiles.read_and_remove(str(plain)) == "ok\n" and not plain.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root node looks its job_user up")
def test_a_root_clusterpull_with_a_missing_job_user_says_so_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text(f"[node]\njob_user = no-such-account-x\nwork_dir = {tmp_path / 'w'}\n")
    assert clusterpull.main(["--config", str(conf), "--once"]) == 2
    err = capsys.readouterr().err
    assert "job_user 'no-such-account-x' (node.conf) is not an account" in err
    assert "useradd --system" in err
    assert not (tmp_path / "w").exists(), "nothing started"


def test_the_accounts_at_jobs_are_found_in_roots_atq_listing() -> None:
    listing = ("3\tThu Nov 28 10:00:00 2026 a cluster-job\n"
               "4\tThu Nov 28 11:00:00 2026 a root\n"
               "12\tFri Nov 29 09:30:00 2026 = cluster-job\n"
               "garbage line\n"
               "5\tFri Nov 29 09:30:00 2026 b cluster-jobs\n")
    assert jobuser.at_jobs_of(listing, "cluster-job") == ["3", "12"]
    assert jobuser.at_jobs_of("", "cluster-job") == []


def test_the_deny_command_adds_the_account_once_to_each_file(tmp_path: Path) -> None:
    cron_deny, at_deny = tmp_path / "cron.deny", tmp_path / "at.deny"
    at_deny.write_text("daemon")  # a last line without its newline
    command = jobuser.deny_command("cluster-job", str(cron_deny), str(at_deny))

    def run() -> str:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == f"added {cron_deny}\nadded {at_deny}\n"
    assert cron_deny.read_text() == "cluster-job\n"
    assert cron_deny.stat().st_mode & 0o777 == 0o644  # crontab reads it as its user
    assert at_deny.read_text() == "daemon\ncluster-job\n"
    assert run() == f"listed {cron_deny}\nlisted {at_deny}\n"
    assert cron_deny.read_text() == "cluster-job\n"
