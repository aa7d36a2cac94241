"""A real job account for the tests of jobs run as ``job_user`` (cluster.node.jobuser).

:func:`made_account` makes :data:`ACCOUNT` with the command bootstrap_node.py uses when it
is missing, and removes it afterwards only if it made it; every process of it left is
killed first.  :func:`searchable` lets that account through a folder and those above it
(pytest's temporary folders are 0700) and puts their modes back afterwards.  Both need
root, as a node that drops to job_user does.  :func:`kept_deny_files` puts
``/etc/cron.deny`` and ``/etc/at.deny`` back as they were after a test that lets
bootstrap_node.py write them (the next test's jobs must be able to use crontab).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cluster.node import jobuser
from cluster.node.jobuser import JobAccount

#: The tests' job account: a name no real setup uses.
ACCOUNT = "rcjobtest"


@contextlib.contextmanager
def account_turn() -> Iterator[None]:
    """One test at a time uses :data:`ACCOUNT`, whichever worker runs it: an exclusive lock
    (flock on a file in the temporary folder, shared by every worker) held meanwhile.  A
    test's end kills every process of the account, and may delete it: beside another
    test's jobs it killed their slot shells (a job "ended" with no status before its
    timeout, once in CI under load)."""
    path = Path(tempfile.gettempdir()) / f"regression-cluster-tests-{os.getuid()}.jobaccount.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # bounded by the holder: one test or module
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def made_account() -> Iterator[JobAccount]:
    """:data:`ACCOUNT`, made if missing, for the block's duration (in its turn:
    :func:`account_turn`); its processes killed at the end, and the account removed if
    this made it."""
    with account_turn(), _made_account() as account:
        yield account


@contextlib.contextmanager
def _made_account() -> Iterator[JobAccount]:
    made = False
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        subprocess.run(jobuser.useradd_argv(ACCOUNT), check=True, capture_output=True,
                       timeout=60)
        made = True
    account = jobuser.job_account(ACCOUNT)
    assert account is not None, "the tests of the job account run as root"
    try:
        yield account
    finally:
        jobuser.kill_leftovers(account)
        if made:
            subprocess.run(["userdel", ACCOUNT], check=False, capture_output=True, timeout=60)


@contextlib.contextmanager
def searchable(folder: Path) -> Iterator[None]:
    """``folder`` and every folder above it searchable by others (o+x) meanwhile."""
    folder = Path(os.path.abspath(folder))
    changed: list[tuple[Path, int]] = []
    try:
        for path in [folder, *folder.parents]:
            mode = os.stat(path).st_mode & 0o7777
            if not mode & 0o001:
                os.chmod(path, mode | 0o001)
                changed.append((path, mode))
        yield
    finally:
        for path, mode in changed:
            with contextlib.suppress(OSError):
                os.chmod(path, mode)


@contextlib.contextmanager
def kept_deny_files() -> Iterator[None]:
    """``/etc/cron.deny`` and ``/etc/at.deny`` as they were before the block: their texts
    written back, or the files removed when there were none."""
    saved: dict[str, bytes | None] = {}
    for path in (jobuser.CRON_DENY, jobuser.AT_DENY):
        try:
            saved[path] = Path(path).read_bytes()
        except FileNotFoundError:
            saved[path] = None
    try:
        yield
    finally:
        for path, data in saved.items():
            if data is None:
                Path(path).unlink(missing_ok=True)
            else:
                Path(path).write_bytes(data)
