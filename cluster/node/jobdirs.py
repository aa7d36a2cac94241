"""Each job's own folder: the ``__temp__`` of its command line (not in a sweep run).

Before, every job of a run on a node wrote in the run's one ``temp`` folder, so a job could
overwrite what another wrote there (a scratch file of the same name, or another job's
output) before the node had read it.  Now each job the node starts gets a folder of its
own, ``temp/jobs/<n>/``, which ``__temp__`` names in its command; the node reads the job's
``<id>.log``, ``<id>.md5`` and ``<id>.out`` from there when it ends, and then clears the
folder (:meth:`JobDirs.release`): whatever else the job left in it is removed, so the next
job to get the folder finds it empty.

Why folders are kept and handed on rather than made and removed per job: making and
removing a folder cost 0.2-0.3 ms on the node file systems measured (ext4 on a VM disk),
as much as the two or three files a small job writes, while listing an empty folder costs
a hundredth of a millisecond.  So a folder is made only when no cleared one is free: a
node with S slots makes about 3 S of them in a run (a slot holds a running job and the
next one, and a job's folder is cleared only after its results were read), each once.

Folders of the job account (:mod:`cluster.node.jobuser`: the node runs as root): each job
folder is the account's, mode 0700; ``temp/jobs`` is root's, mode 0711, so a job cannot
make anything beside its folder nor list the other jobs' folders.  The node reads a
folder through a descriptor opened with ``O_NOFOLLOW`` and removes entries relative to it,
so a link a job left is removed, never followed.

A folder the node cannot clear (an entry it cannot remove: a non-root node whose job made
a folder without write permission) is not handed on: it is left and removed, as far as
that goes, with the rest by :meth:`JobDirs.close` at the run's end.

A sweep run does not use this: its tasks already each have a folder of their own
(:mod:`cluster.node.sweepresults`), and ``__temp__`` stays the run's temp folder there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from cluster.node import jobuser
from cluster.node.jobuser import JobAccount
from cluster.records import Job

#: The folder of the job folders in the run's temp folder.
JOBS_DIR = "jobs"


class JobDirs:
    """The job folders of one run under ``root`` (``temp/jobs``), made afresh: what an
    earlier node process of the run left there (it rejoins) is removed.  With ``account``
    the folders are that account's (see the module docstring)."""

    def __init__(self, root: Path, account: JobAccount | None = None) -> None:
        self.root = root
        self.account = account
        jobuser.remove_folder(root)
        root.mkdir(mode=0o711)
        os.chmod(root, 0o711)  # whatever the umask: the account passes, never lists
        #: Cleared folders ready for a job, and how many were made.
        self.free: list[str] = []
        self.made = 0
        #: The folder of each job holding one, by the job object's identity (two jobs of
        #: one name could both be held: each has its own folder all the same).
        self.held: dict[int, tuple[Job, str]] = {}

    def take(self, job: Job) -> str:
        """A cleared folder for ``job`` (made when none is free); its path.  OSError when
        one cannot be made."""
        folder = self.free.pop() if self.free else self._make()
        self.held[id(job)] = (job, folder)
        return folder

    def folder(self, job: Job) -> str:
        """The folder ``job`` holds (:meth:`take`); KeyError when it holds none."""
        return self.held[id(job)][1]

    def release(self, job: Job) -> None:
        """``job`` is done with its folder (the node has read what it wanted of it): what
        is left in it is removed and the folder is handed to a later job; left alone when
        it cannot be cleared.  Nothing when ``job`` holds no folder."""
        entry = self.held.pop(id(job), None)
        if entry is None:
            return
        folder = entry[1]
        if clear_folder(folder):
            self.free.append(folder)

    def release_all(self) -> None:
        """Every held folder released (the jobs were killed)."""
        for job, _ in list(self.held.values()):
            self.release(job)

    def close(self) -> None:
        """Remove every job folder (the run is over for this node)."""
        self.free.clear()
        self.held.clear()
        jobuser.remove_folder(self.root)

    def _make(self) -> str:
        self.made += 1
        path = self.root / str(self.made)
        os.mkdir(path, 0o700)
        if self.account is not None:
            os.chown(path, self.account.uid, self.account.gid, follow_symlinks=False)
        return str(path)


def clear_folder(folder: str) -> bool:
    """Remove every entry of ``folder``, its links never followed; whether it is now empty
    (False also when ``folder`` is not a folder, or a link)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        names = os.listdir(fd)
        for name in names:
            info = os.lstat(name, dir_fd=fd)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def move_files(folder: str, dest: Path, wanted: Callable[[str], bool]) -> list[str]:
    """Move the regular files directly in ``folder`` (a real folder, not a link) whose
    names are ``wanted`` into ``dest`` (made if missing), by rename, over a file of the
    same name there.  Links and anything else stay (the folder's clearing removes them).
    The names moved, in name order; none when ``folder`` is not a folder."""
    moved: list[str] = []
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return moved
    try:
        dest.mkdir(exist_ok=True)
        for name in sorted(os.listdir(fd)):
            if not wanted(name):
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(name, dir_fd=fd).st_mode):
                    os.rename(name, dest / name, src_dir_fd=fd)
                    moved.append(name)
    finally:
        os.close(fd)
    return moved
