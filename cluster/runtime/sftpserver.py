"""A small SFTP (version 3) server over a pair of file descriptors, with a pluggable file system.

OpenSSH's ``sftp-server`` cannot limit which paths a client reaches; a program run as an
ssh forced command (the node gate, :mod:`cluster.master.gate.gate`) serves SFTP itself with this
module instead, deciding every path through a :class:`FileSystem` of its own.

Only the requests a client needs to read small files and upload files atomically are
served (what paramiko's client sends for ``stat``, ``lstat``, ``open``/``read``/``write``/
``close``, ``fstat``, ``chmod``/``utime``, ``mkdir``, ``remove``, ``rename``, ``normalize``,
``posix_rename`` and OpenSSH's ``fsync``): INIT, OPEN, CLOSE, READ, WRITE, LSTAT, FSTAT,
SETSTAT, FSETSTAT, REMOVE, MKDIR, REALPATH, STAT, RENAME and EXTENDED
``posix-rename@openssh.com`` / ``fsync@openssh.com``.  Anything else (directory listings,
links, rmdir, other extensions) is answered ``SSH_FX_OP_UNSUPPORTED`` naming the request.

The wire format is draft-ietf-secsh-filexfer-02 (version 3), as OpenSSH speaks it: every
packet is a uint32 length, a type byte, a uint32 request id, then the request's fields.
Bounds: a packet of at most :data:`MAX_PACKET` bytes (a longer one ends the session: the
stream cannot be trusted after it), a READ of at most :data:`MAX_READ` bytes, at most
:data:`MAX_HANDLES` open handles.

A :class:`Refused` raised by the file system is answered ``SSH_FX_PERMISSION_DENIED`` with
its message (paramiko raises ``PermissionError`` carrying it); an ``OSError`` is answered
with the status its errno maps to and its strerror.  A WRITE goes through the file system
too (:meth:`FileSystem.write`), so that it may bound what uploads hold; a WRITE it refuses
ends its handle (closed: nothing more is written through it).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# Request and reply types (filexfer-02 section 3).
FXP_INIT, FXP_VERSION, FXP_OPEN, FXP_CLOSE, FXP_READ, FXP_WRITE = 1, 2, 3, 4, 5, 6
FXP_LSTAT, FXP_FSTAT, FXP_SETSTAT, FXP_FSETSTAT, FXP_OPENDIR, FXP_READDIR = 7, 8, 9, 10, 11, 12
FXP_REMOVE, FXP_MKDIR, FXP_RMDIR, FXP_REALPATH, FXP_STAT, FXP_RENAME = 13, 14, 15, 16, 17, 18
FXP_READLINK, FXP_SYMLINK = 19, 20
FXP_STATUS, FXP_HANDLE, FXP_DATA, FXP_NAME, FXP_ATTRS = 101, 102, 103, 104, 105
FXP_EXTENDED, FXP_EXTENDED_REPLY = 200, 201
# Status codes.
FX_OK, FX_EOF, FX_NO_SUCH_FILE, FX_PERMISSION_DENIED, FX_FAILURE = 0, 1, 2, 3, 4
FX_BAD_MESSAGE, FX_OP_UNSUPPORTED = 5, 8
# OPEN's pflags.
FXF_READ, FXF_WRITE, FXF_APPEND, FXF_CREAT, FXF_TRUNC, FXF_EXCL = 1, 2, 4, 8, 0x10, 0x20
# Attribute flags.
ATTR_SIZE, ATTR_UIDGID, ATTR_PERMISSIONS, ATTR_ACMODTIME, ATTR_EXTENDED = 1, 2, 4, 8, 0x80000000

#: The version we speak.
VERSION = 3
#: Longest packet accepted [bytes]: a WRITE of paramiko's 32 KiB requests and more.
MAX_PACKET = 1024 * 1024
#: Longest READ answered [bytes] (a client asking for more gets this much: a short read).
MAX_READ = 256 * 1024
#: Most handles open at once.
MAX_HANDLES = 64
#: The extensions announced in VERSION.
EXTENSIONS = (("posix-rename@openssh.com", "1"), ("fsync@openssh.com", "1"))

_NAMES = {FXP_OPENDIR: "OPENDIR", FXP_READDIR: "READDIR", FXP_RMDIR: "RMDIR",
          FXP_READLINK: "READLINK", FXP_SYMLINK: "SYMLINK"}
_ERRNO_STATUS = {errno.ENOENT: FX_NO_SUCH_FILE, errno.ENOTDIR: FX_NO_SUCH_FILE,
                 errno.EACCES: FX_PERMISSION_DENIED, errno.EPERM: FX_PERMISSION_DENIED,
                 errno.EROFS: FX_PERMISSION_DENIED}


class Refused(Exception):
    """The file system's policy refuses a request; the message says what and why."""


class Unsupported(Exception):
    """A request this server does not serve; the message names it."""


@dataclass(frozen=True)
class SetAttrs:
    """What a SETSTAT asks to change: permission bits and/or (atime, mtime)."""

    mode: int | None = None
    times: tuple[int, int] | None = None
    owner: tuple[int, int] | None = None
    size: int | None = None


class FileSystem(Protocol):
    """The paths a client reaches and what it may do there.  ``path`` is the client's path
    as sent (bytes; a relative one is relative to the server's working directory).  Each
    method raises :class:`Refused` for what the policy forbids, OSError for what the file
    system refuses."""

    def open(self, path: bytes, pflags: int, mode: int | None) -> int:
        """An open file descriptor for ``path`` (``pflags``: the FXF_* bits)."""
        ...

    def stat(self, path: bytes, follow: bool) -> os.stat_result:
        ...

    def write(self, fd: int, offset: int, data: bytes) -> None:
        """Write all of ``data`` at ``offset`` of ``fd``, a file :meth:`open` opened for
        writing (:func:`write_all` does it); :class:`Refused` when the policy will not
        have it (the server then closes the handle)."""
        ...

    def setstat(self, path: bytes, attrs: SetAttrs) -> None:
        ...

    def fsetstat(self, fd: int, writable: bool, attrs: SetAttrs) -> None:
        ...

    def mkdir(self, path: bytes, mode: int | None) -> None:
        ...

    def remove(self, path: bytes) -> None:
        ...

    def rename(self, old: bytes, new: bytes, replace: bool) -> None:
        ...

    def realpath(self, path: bytes) -> bytes:
        ...


def write_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` of ``fd``."""
    view = memoryview(data)
    while view:  # bounded: each pass writes at least one byte (or raises)
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


class ProtocolError(Exception):
    """The client broke the protocol (a bad packet); the session ends."""


class _Reader:
    """The fields of one packet, read in order; ProtocolError past its end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtocolError("a packet ends before its fields do")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u32())

    def attrs(self) -> SetAttrs:
        flags = self.u32()
        size = self.u64() if flags & ATTR_SIZE else None
        owner = (self.u32(), self.u32()) if flags & ATTR_UIDGID else None
        mode = self.u32() if flags & ATTR_PERMISSIONS else None
        times = (self.u32(), self.u32()) if flags & ATTR_ACMODTIME else None
        if flags & ATTR_EXTENDED:
            for _ in range(self.u32()):  # bounded by the packet: each pair takes bytes
                self.string()
                self.string()
        return SetAttrs(mode=mode, times=times, owner=owner, size=size)


def _string(value: bytes | str) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    return struct.pack(">I", len(data)) + data


def encode_attrs(st: os.stat_result) -> bytes:
    """An ATTRS structure: size, owner, permissions (with the file type) and times."""
    flags = ATTR_SIZE | ATTR_UIDGID | ATTR_PERMISSIONS | ATTR_ACMODTIME
    return struct.pack(">IQIIIII", flags, st.st_size, st.st_uid, st.st_gid, st.st_mode,
                       int(st.st_atime) & 0xFFFFFFFF, int(st.st_mtime) & 0xFFFFFFFF)


@dataclass
class _Handle:
    fd: int
    writable: bool


class SftpServer:
    """Serves one SFTP session on ``rfd``/``wfd`` through ``fs`` until the client closes
    the stream (:meth:`serve`).  ``log`` receives one line per refusal."""

    def __init__(self, fs: FileSystem, rfd: int = 0, wfd: int = 1,
                 log: Callable[[str], None] | None = None) -> None:
        self.fs = fs
        self.rfd = rfd
        self.wfd = wfd
        self.log = log or (lambda line: None)
        self.handles: dict[bytes, _Handle] = {}
        self._next = 0

    # -- the stream ----------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes | None:
        """``n`` bytes, or None at a clean end of the stream before the first byte."""
        parts: list[bytes] = []
        got = 0
        while got < n:  # bounded: each pass reads at least one byte or returns
            chunk = os.read(self.rfd, n - got)
            if not chunk:
                if got == 0:
                    return None
                raise ProtocolError("the stream ended inside a packet")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _send(self, kind: int, payload: bytes) -> None:
        data = struct.pack(">IB", len(payload) + 1, kind) + payload
        view = memoryview(data)
        while view:  # bounded: each pass writes at least one byte (or raises)
            view = view[os.write(self.wfd, view):]

    def _status(self, rid: int, code: int, message: str) -> None:
        self._send(FXP_STATUS, struct.pack(">II", rid, code) + _string(message) + _string(""))

    def serve(self) -> None:
        """Answer requests until the client closes the stream; every handle is closed at
        the end.  ProtocolError for a broken stream."""
        try:
            while True:  # one packet per pass; ends with the stream
                head = self._read_exact(4)
                if head is None:
                    return
                (length,) = struct.unpack(">I", head)
                if not 1 <= length <= MAX_PACKET:
                    raise ProtocolError(f"a packet of {length} bytes (at most {MAX_PACKET})")
                body = self._read_exact(length)
                if body is None:
                    raise ProtocolError("the stream ended inside a packet")
                self._dispatch(body[0], _Reader(body[1:]))
        finally:
            for handle in self.handles.values():
                os.close(handle.fd)
            self.handles.clear()

    # -- requests ------------------------------------------------------------------------
    def _dispatch(self, kind: int, r: _Reader) -> None:
        if kind == FXP_INIT:
            r.u32()  # the client's version: we answer with ours, 3, as OpenSSH does
            self._send(FXP_VERSION, struct.pack(">I", VERSION) + b"".join(
                _string(name) + _string(data) for name, data in EXTENSIONS))
            return
        rid = r.u32()
        try:
            self._request(kind, rid, r)
        except Refused as exc:
            self.log(str(exc))
            self._status(rid, FX_PERMISSION_DENIED, str(exc))
        except Unsupported as exc:
            self.log(str(exc))
            self._status(rid, FX_OP_UNSUPPORTED, str(exc))
        except ProtocolError as exc:
            self._status(rid, FX_BAD_MESSAGE, str(exc))
        except OSError as exc:
            self._status(rid, _ERRNO_STATUS.get(exc.errno or 0, FX_FAILURE),
                         exc.strerror or str(exc))

    def _handle(self, r: _Reader) -> _Handle:
        return self._named(r)[1]

    def _named(self, r: _Reader) -> tuple[bytes, _Handle]:
        name = r.string()
        handle = self.handles.get(name)
        if handle is None:
            raise OSError(errno.EBADF, "no such handle")
        return name, handle

    def _request(self, kind: int, rid: int, r: _Reader) -> None:
        fs = self.fs
        if kind == FXP_OPEN:
            path, pflags, attrs = r.string(), r.u32(), r.attrs()
            if len(self.handles) >= MAX_HANDLES:
                raise OSError(errno.EMFILE, f"at most {MAX_HANDLES} open handles")
            fd = fs.open(path, pflags, attrs.mode)
            self._next += 1
            name = str(self._next).encode()
            self.handles[name] = _Handle(fd, bool(pflags & (FXF_WRITE | FXF_APPEND)))
            self._send(FXP_HANDLE, struct.pack(">I", rid) + _string(name))
        elif kind == FXP_CLOSE:
            name = r.string()
            handle = self.handles.pop(name, None)
            if handle is None:
                raise OSError(errno.EBADF, "no such handle")
            os.close(handle.fd)
            self._status(rid, FX_OK, "")
        elif kind == FXP_READ:
            handle = self._handle(r)
            offset, size = r.u64(), r.u32()
            data = os.pread(handle.fd, min(size, MAX_READ), offset)
            if not data:
                self._status(rid, FX_EOF, "end of file")
            else:
                self._send(FXP_DATA, struct.pack(">I", rid) + _string(data))
        elif kind == FXP_WRITE:
            name, handle = self._named(r)
            offset, data = r.u64(), r.string()
            if not handle.writable:
                raise OSError(errno.EBADF, "the handle was not opened for writing")
            try:
                fs.write(handle.fd, offset, data)
            except Refused:
                # The policy refused (a bound on what uploads hold): the handle ends, so a
                # client that goes on writing gets "no such handle", never a byte more.
                del self.handles[name]
                os.close(handle.fd)
                raise
            self._status(rid, FX_OK, "")
        elif kind in (FXP_STAT, FXP_LSTAT):
            st = fs.stat(r.string(), follow=kind == FXP_STAT)
            self._send(FXP_ATTRS, struct.pack(">I", rid) + encode_attrs(st))
        elif kind == FXP_FSTAT:
            st = os.fstat(self._handle(r).fd)
            self._send(FXP_ATTRS, struct.pack(">I", rid) + encode_attrs(st))
        elif kind == FXP_SETSTAT:
            fs.setstat(r.string(), r.attrs())
            self._status(rid, FX_OK, "")
        elif kind == FXP_FSETSTAT:
            handle = self._handle(r)
            fs.fsetstat(handle.fd, handle.writable, r.attrs())
            self._status(rid, FX_OK, "")
        elif kind == FXP_REMOVE:
            fs.remove(r.string())
            self._status(rid, FX_OK, "")
        elif kind == FXP_MKDIR:
            path, attrs = r.string(), r.attrs()
            fs.mkdir(path, attrs.mode)
            self._status(rid, FX_OK, "")
        elif kind == FXP_RENAME:
            fs.rename(r.string(), r.string(), replace=False)
            self._status(rid, FX_OK, "")
        elif kind == FXP_REALPATH:
            path = fs.realpath(r.string())
            # One name: the path, a long name (the same), and no attributes.
            self._send(FXP_NAME, struct.pack(">II", rid, 1) + _string(path) + _string(path)
                       + struct.pack(">I", 0))
        elif kind == FXP_EXTENDED:
            self._extended(rid, r.string().decode("utf-8", "replace"), r)
        else:
            raise Unsupported(f"SFTP request {_NAMES.get(kind, kind)} is not served here "
                              "(only reading files, and uploads where allowed)")

    def _extended(self, rid: int, name: str, r: _Reader) -> None:
        if name == "posix-rename@openssh.com":
            self.fs.rename(r.string(), r.string(), replace=True)
        elif name == "fsync@openssh.com":
            handle = self._handle(r)
            if not handle.writable:
                raise OSError(errno.EBADF, "the handle was not opened for writing")
            os.fsync(handle.fd)
        else:
            raise Unsupported(f"SFTP extension {name!r} is not served here (only "
                              "posix-rename@openssh.com and fsync@openssh.com)")
        self._status(rid, FX_OK, "")

