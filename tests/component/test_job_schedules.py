"""What a job run as ``job_user`` schedules does not outlive its run.

A root node (the tests run as root) runs one real run as the tests' job account
(tests/jobaccount.py) against a scripted master (tests/component/test_node_run.py): its one
shell job installs a crontab entry with ``crontab -`` and prints ``crontab -l``.  The job
saw its entry installed; after the run the account has no crontab.  A crontab an earlier
run left (a node killed before its end) is removed when the next run starts.

The module writes a real crontab (the job account's): it is in the ``crontab`` xdist group
(tests/conftest.py ``crontab_turn``), and uses the account in its turn.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.defaults import NODE_EXIT_DONE
from cluster.node import jobuser
from cluster.node.jobuser import JobAccount
from cluster.records import ERROR_NONE
from tests.component.test_job_folders import script, shell_jobs
from tests.component.test_node_run import ScriptedMaster, make_node_home, node, write_start
from tests.jobaccount import ACCOUNT, made_account, searchable

pytestmark = [pytest.mark.xdist_group("crontab"),
              pytest.mark.skipif(os.geteuid() != 0, reason="a node drops to job_user only "
                                                           "when it runs as root")]

ENTRY = "17 3 * * * echo left-by-a-job\n"


@pytest.fixture
def account(tmp_path: Path) -> Iterator[JobAccount]:
    with made_account() as made, searchable(tmp_path):
        yield made
        subprocess.run(["crontab", "-r", "-u", made.name], capture_output=True, timeout=60)


def crontab_of(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["crontab", "-l", "-u", name], capture_output=True, text=True,
                          timeout=60)


def run_one_job(tmp_path: Path, serve: Callable[[ScriptedMaster], int], command: str
                ) -> ScriptedMaster:
    home = make_node_home(tmp_path)
    write_start(home)
    master = ScriptedMaster(script(shell_jobs({"t1": command})))
    port = serve(master)
    assert node(home, tmp_path, port, slots=1, job_user=ACCOUNT).run() == NODE_EXIT_DONE
    return master


def test_a_jobs_crontab_entry_is_gone_after_its_run(
        account: JobAccount, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    # printf writes the newline: a job line is one line.
    master = run_one_job(tmp_path, serve,
                         f"printf '{ENTRY.strip()}\\n' | crontab - && crontab -l")
    [result] = [r for req in master.seen for r in req.results]
    # The job ran as the account and its entry was installed then.
    assert (result.error, result.md5) == (ERROR_NONE, hashlib.md5(ENTRY.encode()).hexdigest())
    listed = crontab_of(ACCOUNT)
    assert listed.returncode != 0 and "no crontab" in listed.stderr, listed.stdout
    log = (tmp_path / "work" / "runs").glob("*/n1.log")
    assert f"removed the crontab of {ACCOUNT}" in next(log).read_text()


def test_a_crontab_an_earlier_run_left_is_removed_when_a_run_starts(
        account: JobAccount, tmp_path: Path, serve: Callable[[ScriptedMaster], int]) -> None:
    # As a node killed before its run's end leaves it.
    subprocess.run(["crontab", "-u", ACCOUNT, "-"], input=ENTRY, text=True, check=True,
                   timeout=60)
    master = run_one_job(tmp_path, serve, "crontab -l || echo none")
    [result] = [r for req in master.seen for r in req.results]
    assert result.md5 == hashlib.md5(b"none\n").hexdigest()
    assert "no crontab" in crontab_of(ACCOUNT).stderr


def test_remove_schedules_says_nothing_when_there_is_nothing(account: JobAccount) -> None:
    assert jobuser.remove_schedules(account) == []
