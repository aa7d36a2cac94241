"""Slot shells run as a job account (cluster.node.slots with cluster.node.jobuser): the
account's uid with no other group, umask 077, HOME and TMPDIR in the slot's own folder
(made for the shell, removed with it), SIGPIPE still ignored and SIGXFSZ at its default as
for the node's own shells, and a timed-out job's whole tree killed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cluster.node import jobuser
from cluster.node.jobuser import JobAccount
from cluster.node.slots import Finished, SlotPool
from cluster.records import Job
from tests.jobaccount import made_account, searchable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root changes the uid")


@pytest.fixture(scope="module")
def account() -> Iterator[JobAccount]:
    with made_account() as made:
        yield made


@pytest.fixture
def space(tmp_path: Path, account: JobAccount) -> Iterator[tuple[Path, Path]]:
    """(the slots' homes folder, a folder the jobs may write in)."""
    homes = tmp_path / "homes"
    homes.mkdir()
    homes.chmod(0o755)
    out = tmp_path / "out"
    jobuser.give_folder(out, account)
    with searchable(tmp_path):
        yield homes, out


def run(pool: SlotPool, name: str, command: str, limit: float = 10) -> Finished:
    pool.start(Job(name, f"__temp__/{name}.log", "true"), command, time.monotonic())
    end = time.monotonic() + limit
    while time.monotonic() < end:
        pool.check_timeouts(time.monotonic())
        for done in pool.wait(0.05):
            return done
    raise AssertionError(f"{name} did not finish")


def own_ignored(out: Path) -> str:
    """The SigIgn line of a job run by a slot shell of the node's own account."""
    pool = SlotPool(1, os.environ, timeout=30, kill_grace=0.3)
    try:
        report = out / "own"
        assert run(pool, "own", f"grep '^SigIgn' /proc/self/status > {report}"
                   ).exit_status == 0
        return report.read_text().strip()
    finally:
        pool.close()


def test_a_job_runs_as_the_account_in_its_slots_own_folder(
        account: JobAccount, space: tuple[Path, Path]) -> None:
    homes, out = space
    pool = SlotPool(1, os.environ, timeout=30, kill_grace=0.3, account=account, homes=homes)
    try:
        report = out / "report"
        done = run(pool, "who", f"{{ id -u; id -G; umask; echo $HOME; echo $TMPDIR; pwd; "
                                f"grep -E '^Sig(Ign|Blk)' /proc/self/status; "
                                f"echo $CLUSTER_SLOT; }} > {report}")
        assert done.exit_status == 0
        uid, groups, umask, home, tmp, cwd, _blocked, ignored, slot = \
            report.read_text().splitlines()
        assert (uid, groups, umask) == (str(account.uid), str(account.gid), "0077")
        slot_home = homes / "slot1"
        assert home == tmp == cwd == str(slot_home) and slot == "1"
        info = slot_home.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (account.uid, 0o700)
        mask = int(ignored.split()[1], 16)
        assert mask & (1 << 12) and not mask & (1 << 24)  # SIGPIPE (13) yes, SIGXFSZ (25) no
        # Of the standard signals (1-31: 32 and 33 are the C library's own), a job
        # ignores those a job of the node's own account ignores.
        own = int(own_ignored(out).split()[1], 16)
        assert mask & 0x7FFFFFFF == own & 0x7FFFFFFF, (hex(mask), hex(own))
        assert oct(report.stat().st_mode & 0o777) == oct(0o600)
    finally:
        pool.close()
    assert not (homes / "slot1").exists(), "the slot's folder goes with its shell"


def test_a_timed_out_jobs_tree_is_killed_and_its_slot_gets_a_fresh_folder(
        account: JobAccount, space: tuple[Path, Path]) -> None:
    homes, out = space
    pool = SlotPool(1, os.environ, timeout=0.5, kill_grace=0.3, account=account, homes=homes)
    try:
        pids = out / "pids"
        command = (f"touch $HOME/left; (trap '' HUP; sleep 60) & echo $! > {pids}; "
                   "sleep 60")
        done = run(pool, "slow", command)
        assert done.killed
        child = int(pids.read_text())
        deadline = time.monotonic() + 5
        while psutil.pid_exists(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(child) or \
            psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        # The next job's shell is fresh, and so is its folder.
        assert run(pool, "after", "test ! -e $HOME/left").exit_status == 0
    finally:
        pool.close()
