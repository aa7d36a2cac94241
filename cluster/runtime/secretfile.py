"""Reading a secret file: one check for every key the cluster keeps in a file.

A secret file (each node's key, ``node-keys/<name>.key`` in the master home) is used only
when it is a regular file of its own, not a symbolic link, and readable by its owner alone
(no group or other permission bits: mode 0600 or 0400).  A secret at 0644 is readable by
every account on the machine, and a link can point the reader at a file someone else
chose; both are refused with a :class:`SecretFileError` that names the file, what it is
(its mode, or that it is a link) and what is expected, never used "without a word".

:func:`read_secret_file` opens with ``O_NOFOLLOW`` and checks the mode on the open file
(``fstat``), so a link swapped in between a check and the open is refused too, and reads
at most :data:`MAX_SECRET_BYTES`.  :func:`check_secret_mode` is the same check on a mode
read some other way (an SFTP ``lstat`` of a file on the master).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cluster.errors import ClusterError

#: The mode :func:`read_secret_file` asks for when it refuses a file.
SECRET_MODE = 0o600
#: Permission bits a secret file must not have: any group or other bit.
FORBIDDEN_BITS = 0o077
#: A secret is a line of hex digits; a bigger file is not one [bytes].
MAX_SECRET_BYTES = 4096


class SecretFileError(ClusterError):
    """A secret file is a link, not a regular file, open to others, or not text."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def __str__(self) -> str:
        return f"secret file {self.path}: {self.problem}"


def check_secret_mode(path: str, st_mode: int) -> None:
    """SecretFileError naming ``path`` unless ``st_mode`` (an lstat's or fstat's) is a
    regular file with no group or other permission bits."""
    if stat.S_ISLNK(st_mode):
        raise SecretFileError(path, "is a symbolic link; expected the secret file itself, "
                                    f"a regular file of mode {SECRET_MODE:04o} (not a link)")
    if not stat.S_ISREG(st_mode):
        raise SecretFileError(path, f"is not a regular file (mode {st_mode:06o}); expected a "
                                    f"regular file of mode {SECRET_MODE:04o}")
    bits = stat.S_IMODE(st_mode)
    if bits & FORBIDDEN_BITS:
        raise SecretFileError(path, f"has mode {bits:04o}, which lets group or others read "
                                    f"or change it; expected {SECRET_MODE:04o} (owner only: "
                                    f"chmod {SECRET_MODE:o} {path})")


def read_secret_file(path: Path | str) -> str:
    """The ASCII text of the secret file ``path``, after :func:`check_secret_mode`.

    FileNotFoundError if it does not exist (callers decide what a missing secret means);
    SecretFileError naming the file for a link (``O_NOFOLLOW``), a wrong mode, a file
    bigger than :data:`MAX_SECRET_BYTES` or one that is not ASCII; another OSError if it
    cannot be opened or read.  The text is returned as read: parsing it is the caller's.
    """
    where = str(path)
    # O_NONBLOCK: a FIFO planted under the name must not hang the reader (it is refused
    # as not a regular file right after the open).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_secret_mode(where, os.lstat(path).st_mode)  # raises: names the link
        raise
    try:
        check_secret_mode(where, os.fstat(fd).st_mode)
        data = b""
        for _ in range(MAX_SECRET_BYTES + 1):  # bounded: each read returns a byte or more
            block = os.read(fd, MAX_SECRET_BYTES + 1 - len(data))
            data += block
            if not block or len(data) > MAX_SECRET_BYTES:
                break
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileError(where, f"is larger than {MAX_SECRET_BYTES} bytes; expected one "
                                     "line of hex digits")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise SecretFileError(where, f"is not ASCII text (byte {exc.start}); expected one line "
                                     "of hex digits") from None
