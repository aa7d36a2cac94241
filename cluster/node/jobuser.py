"""The account a node's jobs run as (docs/runoptions.md, section 6; prun's prexec): ``job_user``.

A node process that runs as root runs every job as the node setting ``job_user``, a
system account with no login (``bootstrap_node.py`` makes it: :func:`ensure_command`):

* the slot shells (:mod:`cluster.node.slots`) start as that account -- its uid, its
  primary group, no supplementary groups, umask 077 (:meth:`JobAccount.popen_args`:
  subprocess's ``user``/``group``/``extra_groups``/``umask``, no ``preexec_fn``) -- with
  ``HOME`` and ``TMPDIR`` in a folder of the slot's own, owned by the account and removed
  when the shell goes;
* the run's temp folder, where jobs write what the node collects (their logs, md5s,
  outputs, bmpcmp images, a sweep task's folder), belongs to it (:func:`give_folder`);
  everything else the node keeps is root's: what a job may read (the corpus mirror, the
  product's build) is readable by all, what it must not (node.conf, the master home's
  ``node-keys/`` and ``cluster.secret``, ``job.start``, root's ``~/.ssh``) is not;
* being another uid, a job can signal none of the node's processes;
* at the start and the end of every run, and before its UPLOAD, every process of the
  account left is killed (:func:`kill_leftovers`): a job's ``setsid sleep 300 &`` does
  not outlive the run.  So one ``job_user`` serves one node: two nodes on one machine,
  both root, need an account each;
* at the start and the end of every run, after those kills, what the account scheduled is
  removed (:func:`remove_schedules`): its crontab (``crontab -r -u <account>``) and its at
  jobs (``atrm`` of those ``atq`` lists as its own; nothing when at is not installed), so
  nothing a job scheduled runs after its run.  ``bootstrap_node.py`` also denies the
  account cron and at (:func:`deny_command`: ``/etc/cron.deny``, ``/etc/at.deny``), so a
  job cannot schedule anything in the first place.

``job_user = ''`` (the default), or a node that is not root, runs jobs as the node's own
account, as before: a job can then read whatever that account can (its node.conf, its ssh
key, the node key it reads from the master home).  A root node whose ``job_user`` does not
exist does not start: :func:`job_account` raises :class:`JobUserError` naming the account
and how to make it.  The product's BUILD still runs as the node's account
(docs/deviations.md).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cluster.errors import ClusterError
from cluster.runtime import proc

#: The umask of every job: what a job makes is its own alone.
JOB_UMASK = 0o077
#: The shell a job account gets (no login).
NOLOGIN = "/usr/sbin/nologin"
#: Passes of :func:`kill_leftovers` at most (a job forking as it dies is caught by the next).
KILL_ROUNDS = 10
#: Pause between those passes [seconds].
KILL_PAUSE = 0.05
#: Bound on each of the commands that read and remove the account's crontab and at jobs
#: [seconds] (they answer in milliseconds; a hung one must not hold the node).
SCHEDULE_TIMEOUT = 30.0
#: The files that deny an account cron and at (crontab(1), at(1)).
CRON_DENY = "/etc/cron.deny"
AT_DENY = "/etc/at.deny"


class JobUserError(ClusterError):
    """``job_user`` cannot be used (missing, or root itself)."""


@dataclass(frozen=True)
class JobAccount:
    """The account jobs run as: its name, uid and primary gid."""

    name: str
    uid: int
    gid: int

    def popen_args(self) -> dict[str, Any]:
        """subprocess.Popen's arguments that start a child as this account: setgroups([]),
        setgid, setuid and umask 077 in the child before it execs."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [],
                "umask": JOB_UMASK}


def useradd_argv(name: str) -> list[str]:
    """The command that makes ``name`` a system account with no home and no login."""
    return ["useradd", "--system", "--no-create-home", "--shell", NOLOGIN, name]


def ensure_command(name: str) -> str:
    """A shell line that makes ``name`` (:func:`useradd_argv`) unless it exists: run as
    root on the node machine, idempotent."""
    quoted = shlex.quote(name)
    return f"id -u {quoted} >/dev/null 2>&1 || {shlex.join(useradd_argv(name))}"


def job_account(job_user: str, euid: int | None = None) -> JobAccount | None:
    """The account jobs run as, or None when they run as the node's own account: the node
    is not root (``euid``, default ours), or ``job_user`` is ''.

    JobUserError, naming the account and how to make it, when it does not exist; also when
    it is root (uid 0): that would be no change of account at all.
    """
    if (os.geteuid() if euid is None else euid) != 0 or not job_user:
        return None
    try:
        entry = pwd.getpwnam(job_user)
    except KeyError:
        raise JobUserError(
            f"job_user {job_user!r} (node.conf) is not an account on this machine; the node "
            f"runs as root and runs its jobs as that account. Make it with bootstrap_node.py "
            f"(as root), or `{shlex.join(useradd_argv(job_user))}`, or set job_user = '' "
            "to run the jobs as root (they can then read node.conf and the node's keys)"
        ) from None
    if entry.pw_uid == 0:
        example = shlex.join(useradd_argv("cluster-job"))
        raise JobUserError(f"job_user {job_user!r} (node.conf) has uid 0: expected an "
                           f"unprivileged account, e.g. one made by `{example}`")
    return JobAccount(job_user, entry.pw_uid, entry.pw_gid)


def can_enter(info: os.stat_result, account: JobAccount) -> bool:
    """Whether ``account`` (its uid and primary group only) may search a folder of
    ``info`` by its mode bits (ACLs are not looked at)."""
    mode = info.st_mode
    if info.st_uid == account.uid:
        return bool(mode & stat.S_IXUSR)
    if info.st_gid == account.gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def blocked_folder(path: Path, account: JobAccount) -> Path | None:
    """The first of ``path`` (absolute) and the folders above it, from ``/`` down, that
    ``account`` may not enter; None when it reaches ``path``."""
    path = Path(os.path.abspath(path))
    for folder in [*reversed(path.parents), path]:
        if not can_enter(os.stat(folder), account):
            return folder
    return None


def give_folder(path: Path, account: JobAccount) -> None:
    """Make ``path`` (its parent exists) a folder of ``account``'s, mode 0700: a job may
    write in it, no one but root may look."""
    path.mkdir(mode=0o700, exist_ok=True)
    os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.chmod(path, 0o700, follow_symlinks=False)


def remove_folder(path: Path) -> None:
    """Remove a folder a job could write in, not following its links; gone already is
    fine."""
    shutil.rmtree(path, ignore_errors=True)


def processes_of(uid: int) -> list[psutil.Process]:
    """The live processes (not zombies) whose real, effective or saved uid is ``uid``."""
    found = []
    for process in psutil.process_iter(["uids", "status"]):
        uids = process.info.get("uids")
        if process.info.get("status") == psutil.STATUS_ZOMBIE:
            continue  # dead already: its parent reaps it
        if uids is not None and uid in (uids.real, uids.effective, uids.saved):
            found.append(process)
    return found


def kill_leftovers(account: JobAccount, rounds: int = KILL_ROUNDS,
                   pause: float = KILL_PAUSE) -> int:
    """SIGKILL every process of ``account`` (:func:`processes_of`) until none is left or
    ``rounds`` passes were made; the number of processes signalled."""
    killed = 0
    for _ in range(rounds):
        found = processes_of(account.uid)
        if not found:
            break
        for process in found:
            try:
                process.send_signal(signal.SIGKILL)
                killed += 1
            except psutil.Error:
                pass  # gone meanwhile
        time.sleep(pause)
    return killed


def at_jobs_of(atq_output: str, name: str) -> list[str]:
    """The numbers of the at jobs of account ``name`` in root's ``atq`` listing (one job
    a line: number, date and time, queue, owner last)."""
    found: list[str] = []
    for line in atq_output.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and fields[-1] == name:
            found.append(fields[0])
    return found


def remove_schedules(account: JobAccount) -> list[str]:
    """Remove what ``account`` scheduled to run later: its crontab and its at jobs (the
    caller is root).  What was removed, in words, for the logs ([] when nothing was).

    A program that is not installed has nothing to remove; a command that fails for
    another reason than "no crontab" is said in the list too, so the logs show it.
    """
    done: list[str] = []
    if shutil.which("crontab"):
        result = proc.run(["crontab", "-r", "-u", account.name], timeout=SCHEDULE_TIMEOUT)
        if result.ok:
            done.append(f"removed the crontab of {account.name}")
        elif "no crontab" not in result.text("stderr").lower():
            done.append(f"could not remove the crontab of {account.name}: `crontab -r -u "
                        f"{account.name}` {result.describe(SCHEDULE_TIMEOUT)}: "
                        f"{result.text('stderr').strip()[:200]}")
    if shutil.which("atq") and shutil.which("atrm"):
        listing = proc.run(["atq"], timeout=SCHEDULE_TIMEOUT)
        jobs = at_jobs_of(listing.text(), account.name) if listing.ok else []
        if jobs:
            result = proc.run(["atrm", *jobs], timeout=SCHEDULE_TIMEOUT)
            if result.ok:
                done.append(f"removed {len(jobs)} at job(s) of {account.name}")
            else:
                done.append(f"could not remove the at jobs {' '.join(jobs)} of "
                            f"{account.name}: {result.describe(SCHEDULE_TIMEOUT)}: "
                            f"{result.text('stderr').strip()[:200]}")
    return done


def deny_command(name: str, cron_deny: str = CRON_DENY, at_deny: str = AT_DENY) -> str:
    """A shell line, run as root on a node machine, that denies account ``name`` cron
    (``cron_deny``, ``/etc/cron.deny``) and at (``at_deny``, ``/etc/at.deny``: only where
    at is installed or the file is there, as Debian's at package ships it): the name
    appended to each file that does not list it yet (made mode 0644 when missing: crontab
    and at read it as their users).  Idempotent.  It prints ``added <file>`` or ``listed
    <file>`` for each file it looked at, and exits 1 when one cannot be written.

    Where ``/etc/cron.allow`` exists cron reads it instead, and an account not in it is
    denied already; the deny file is written all the same (it takes over if the allow
    file goes)."""
    quoted = shlex.quote(name)
    deny_at = shlex.quote(at_deny)
    return (
        f"for f in {shlex.quote(cron_deny)} {deny_at}; do "
        f'if [ "$f" = {deny_at} ] && [ ! -e "$f" ] && ! command -v at >/dev/null 2>&1; '
        "then continue; fi; "
        f'if [ -e "$f" ] && grep -qxF -- {quoted} "$f"; then echo "listed $f"; continue; fi; '
        '[ -e "$f" ] || { : > "$f" && chmod 644 "$f"; } || exit 1; '
        # A last line without its newline would swallow the name.
        '[ ! -s "$f" ] || [ -z "$(tail -c 1 "$f")" ] || echo >> "$f" || exit 1; '
        f'printf "%s\\n" {quoted} >> "$f" || exit 1; echo "added $f"; '
        "done"
    )
