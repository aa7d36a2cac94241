"""Reading what a job wrote: never through a link, regular files only, then removed.

The node may be root, and a job's link could point at its secrets (node.conf, the node's
keys): a job's file is opened with ``O_NOFOLLOW`` and read only when it is a regular file;
a link or anything else is removed unread.  A job's raw output (product shell) is hashed
only within ``max_output_bytes``: a larger one (a 10 GB sparse file) is not read at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from typing import IO


def open_job_file(path: str) -> IO[bytes] | None:
    """A file a job wrote, opened for reading; None when there is none, or when it is a
    link or not a regular file (then it is removed: the node, maybe root, never reads
    through a job's link, which could point at its secrets)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # ELOOP: a link
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return os.fdopen(fd, "rb")


def read_and_remove(path: str) -> str:
    """The text of a job's file, which is then removed ("" if there is none, or it is not
    a regular file: :func:`open_job_file`)."""
    fh = open_job_file(path)
    if fh is None:
        return ""
    with fh:
        data = fh.read()
    os.unlink(path)
    return data.decode("utf-8", errors="replace")


def md5_and_remove(path: str, limit: int) -> tuple[str | None, int]:
    """The md5 of a job's raw output file and its size; the file is then removed.  (None,
    0) if there is none, or it is not a regular file (:func:`open_job_file`); (None, its
    size) when it is larger than ``limit`` bytes: such a file (a 10 GB sparse one) is not
    read at all."""
    digest = hashlib.md5(usedforsecurity=False)
    fh = open_job_file(path)
    if fh is None:
        return None, 0
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= limit:
            # Read at most one byte more than the limit: a writer left running may still
            # be appending.
            size = 0
            while chunk := fh.read(min(1 << 20, limit + 1 - size)):
                digest.update(chunk)
                size += len(chunk)
                if size > limit:
                    break
    os.unlink(path)
    return (digest.hexdigest() if size <= limit else None), size
