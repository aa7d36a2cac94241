"""A TCP proxy on loopback in front of an sshd that cuts chosen ssh connections at a chosen
moment: the blinks of a real link (a session lost during its login, or in the middle of a
command's output or a transfer), made reproducible for a test.

The proxy reads the client's cleartext start (its version line and the packets up to its
SSH_MSG_NEWKEYS, which RFC 4253 sends unencrypted) to know which client it serves
(``paramiko`` or ``OpenSSH``, from ``SSH-2.0-<client>``) and when the login begins: the
client's first byte after its NEWKEYS is its encrypted ``ssh-userauth`` service request.
A cut closes both sockets at once, as a killed sshd session or a dropped link does.

:meth:`CuttingProxy.blink` makes a bad spell of the link instead: for some seconds every
session it carries is cut every few tenths of a second, whatever it is doing, and what the
server sends is slowed, so that no call lives from one cut to the next.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

#: SSH_MSG_NEWKEYS (RFC 4253 section 7.3).
NEWKEYS = 21
#: Longest cleartext start we parse [bytes]; a real kex is a few KB.
MAX_KEX = 256 * 1024


@dataclass(frozen=True)
class Cut:
    """Cut the ``nth`` connection (1 = the first) whose client version starts with
    ``client``: during its login (``after`` and ``up_after`` None), once the server has sent
    it ``after`` bytes, or once it has sent the server ``up_after`` bytes."""

    client: str
    nth: int
    after: int | None = None
    up_after: int | None = None

    @property
    def at_login(self) -> bool:
        return self.after is None and self.up_after is None


@dataclass(frozen=True)
class Blink:
    """A bad spell of the link (:meth:`CuttingProxy.blink`): for ``duration`` seconds from
    its start, every ``every`` seconds every connection the proxy carries is cut, and the
    server's bytes are forwarded at most ``rate`` a second."""

    duration: float
    every: float = 0.3
    rate: int = 100_000
    start: float = 0.0  # time.monotonic() when it began

    def on(self) -> bool:
        return time.monotonic() < self.start + self.duration


@dataclass
class Seen:
    """One connection the proxy served: its client, how it ended (``cut``: "" not cut,
    "login", "data" or "blink") and the bytes it carried each way."""

    client: str = ""
    cut: str = ""
    up: int = 0
    down: int = 0


@dataclass
class _Conn:
    seen: Seen
    rule: Cut | None = None
    start: bytearray = field(default_factory=bytearray)  # the client's cleartext so far
    parsed: int = 0  # how far ``start`` has been parsed into packets
    keyed: bool = False  # the client's NEWKEYS has passed


class CuttingProxy:
    """Listens on ``127.0.0.1:<port>`` and forwards each connection to ``upstream_port``,
    cutting those that ``cuts`` name.  ``connections`` lists what it served, in order."""

    def __init__(self, upstream_port: int, cuts: list[Cut]) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.cuts = list(cuts)
        self.connections: list[Seen] = []
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        #: The connections open now, each with its two sockets (what a blink cuts).
        self._live: dict[int, tuple[Seen, socket.socket, socket.socket]] = {}
        self._blink: Blink | None = None

    def blink(self, duration: float, every: float = 0.3, rate: int = 100_000) -> Blink:
        """Begin a bad spell of the link now (:class:`Blink`): for ``duration`` seconds, cut
        every open connection every ``every`` seconds and slow the server's bytes to
        ``rate`` a second.  The connections cut are marked "blink"."""
        spell = Blink(duration, every, rate, time.monotonic())
        self._blink = spell
        thread = threading.Thread(target=self._blinking, args=(spell,), name="blink",
                                  daemon=True)
        thread.start()
        self._threads.append(thread)
        return spell

    def _blinking(self, spell: Blink) -> None:
        # Bounded: ends with the spell (or stop()).
        while spell.on() and not self._stop.wait(spell.every):
            if not spell.on():
                return
            with self._lock:
                live = list(self._live.values())
            for seen, down, up in live:
                seen.cut = seen.cut or "blink"
                for sock in (down, up):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # closed meanwhile

    def blinked(self) -> list[Seen]:
        """The connections a blink cut."""
        return self.cut("blink")

    def start(self) -> CuttingProxy:
        thread = threading.Thread(target=self._accept, name="cutting-proxy", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(10)
        self._listener.close()

    def __enter__(self) -> CuttingProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def cut(self, what: str) -> list[Seen]:
        """The connections cut at ``what`` ("login", "data" or "blink")."""
        return [c for c in self.connections if c.cut == what]

    def known_hosts(self, sshd_known_hosts: Path, dest: Path) -> Path:
        """A known_hosts file at ``dest`` with the sshd's host key under the proxy's port
        (a client checks the key under the port it connects to)."""
        name, *key = sshd_known_hosts.read_text().split()
        host = name.rpartition(":")[0]
        dest.write_text(f"{host}:{self.port} {' '.join(key)}\n")
        return dest

    # -- the proxy -------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():  # bounded by stop()
            try:
                down, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            seen = Seen()
            with self._lock:
                self.connections.append(seen)
            thread = threading.Thread(target=self._serve, args=(down, seen), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, down: socket.socket, seen: Seen) -> None:
        conn = _Conn(seen)
        try:
            up = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            down.close()
            return
        with self._lock:
            self._live[id(seen)] = (seen, down, up)
        try:
            while not self._stop.is_set():  # bounded by the sockets closing and stop()
                ready, _, _ = select.select([down, up], [], [], 0.1)
                if down in ready:
                    data = down.recv(65536)
                    if not data:
                        return
                    send, cut = self._from_client(conn, data)
                    rule = conn.rule
                    if rule is not None and rule.up_after is not None and conn.keyed \
                            and seen.up + len(send) >= rule.up_after:
                        seen.cut = "data"
                        return
                    if send:
                        up.sendall(send)
                        seen.up += len(send)
                    if cut:
                        seen.cut = "login"
                        return
                if up in ready:
                    spell = self._blink
                    slow = spell is not None and spell.on()
                    data = up.recv(4096 if slow else 65536)
                    if not data:
                        return
                    rule = conn.rule
                    if rule is not None and rule.after is not None \
                            and seen.down + len(data) >= rule.after:
                        seen.cut = "data"
                        return
                    down.sendall(data)
                    seen.down += len(data)
                    if slow and spell is not None:
                        time.sleep(len(data) / spell.rate)
        except OSError:
            return
        finally:
            with self._lock:
                self._live.pop(id(seen), None)
            for sock in (down, up):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _from_client(self, conn: _Conn, data: bytes) -> tuple[bytes, bool]:
        """What of the client's ``data`` to forward, and whether to cut now."""
        if conn.keyed:
            login_cut = conn.rule is not None and conn.rule.at_login
            return (b"", True) if login_cut else (data, False)
        conn.start += data
        if not conn.seen.client:
            line_end = conn.start.find(b"\n")
            if line_end < 0:
                return data, False
            version = bytes(conn.start[:line_end]).decode("ascii", "replace")
            conn.seen.client = version.removeprefix("SSH-2.0-").strip()
            conn.parsed = line_end + 1
            self._choose(conn)
        # Packets before NEWKEYS: uint32 length, byte padding length, payload (type first).
        while len(conn.start) - conn.parsed >= 6 and len(conn.start) < MAX_KEX:
            length = int.from_bytes(conn.start[conn.parsed:conn.parsed + 4], "big")
            end = conn.parsed + 4 + length
            if len(conn.start) < end:
                break
            kind = conn.start[conn.parsed + 5]
            conn.parsed = end
            if kind == NEWKEYS:
                conn.keyed = True
                extra = len(conn.start) - end  # already the encrypted login
                keep = data[:len(data) - extra] if extra else data
                if extra and conn.rule is not None and conn.rule.at_login:
                    return keep, True
                return data, False
        return data, False

    def _choose(self, conn: _Conn) -> None:
        with self._lock:
            kind = next((c.client for c in self.cuts if conn.seen.client.startswith(c.client)),
                        conn.seen.client)
            self._counts[kind] = self._counts.get(kind, 0) + 1
            nth = self._counts[kind]
        conn.rule = next((c for c in self.cuts
                          if conn.seen.client.startswith(c.client) and c.nth == nth), None)
