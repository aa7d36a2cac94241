"""What a daemon's listener keeps per peer: its open connections under a cap, and its
refusals, logged one line per burst.

Once, one unauthenticated process opening and closing connections to the monitor wrote
34,150 log lines (4.2 MB) in 25 s, one per refused connection, and about 11,000 of its
sockets took the monitor's whole connection budget, so honest heartbeats were answered
"busy".  Every listener of the cluster (the master's port, the monitor, the status page)
therefore does two things per peer *host* (the address without the port: one machine, all
its sockets):

* :class:`PeerSlots` -- at most ``per_peer`` connections of one host are open at once; a
  connection beyond that is refused at once, so one host never takes more than its share of
  the listener's budget (:func:`per_peer_limit`: a quarter of it, never fewer than
  :data:`MIN_PER_PEER`).
* :class:`RefusalLog` -- every refusal is counted per host, but only the first
  :data:`PEER_LINES` of a host in each :data:`WINDOW` are logged in full; the rest are
  summed up in one summary line when the window ends (``peer <host>: <n> more refusals in
  the last <t> s, not logged one by one; the last: <line>``).  All hosts together log at most
  :data:`LINES_PER_SECOND` lines a second (a burst of :data:`LINE_BURST`); a line over that
  is counted into its host's summary instead, so nothing is lost but the detail.  At most
  :data:`MAX_PEERS` hosts are tracked; refusals of more hosts are summed up under
  ``other peers``.

A flood from one host thus costs at most ``PEER_LINES + 1`` lines per ``WINDOW``; a flood
from many hosts at most ``LINES_PER_SECOND`` lines a second.
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Most connections a listener keeps open unless told otherwise (see connection_limit).
MAX_CONNECTIONS = 10000
#: File descriptors left for everything else in the process (journal, logs, children).
FD_MARGIN = 64
#: One host may hold at most 1/PEER_SHARE of a listener's connections ...
PEER_SHARE = 4
#: ... but never fewer than this many (a machine running several nodes, a reverse proxy).
MIN_PER_PEER = 64

#: Refusals of one host logged in full per window; the rest go into the window's summary.
PEER_LINES = 5
#: The window of a host's refusals [seconds]: its summary line is written when it ends.
WINDOW = 10.0
#: Lines a second all hosts together may log (after a burst of LINE_BURST).
LINES_PER_SECOND = 5.0
LINE_BURST = 20
#: Hosts whose refusals are counted one by one; more are summed up as OTHERS.
MAX_PEERS = 1024
OTHERS = "other peers"
#: How often summaries are looked for [seconds] (tick() is cheap between).
TICK = 1.0


def connection_limit(wanted: int = MAX_CONNECTIONS, margin: int = FD_MARGIN) -> int:
    """``wanted``, cut to the process's open-file limit minus ``margin`` (at least 1): the
    number of connections a server may hold open without running out of descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - margin))


def per_peer_limit(total: int) -> int:
    """The connections one host may hold of a listener's ``total``: a quarter of it, but at
    least :data:`MIN_PER_PEER` (and never more than ``total``)."""
    return min(total, max(MIN_PER_PEER, total // PEER_SHARE))


def send_and_close(sock: socket.socket, data: bytes, drain: int = 65536) -> None:
    """Refuse a connection at once: one non-blocking try to send ``data``, then close.

    What the client sent with the connection is read first (one recv of at most ``drain``
    bytes): closing with unread input makes the kernel send a reset, which can destroy the
    answer before the client reads it."""
    try:
        sock.recv(drain)
    except OSError:
        pass  # nothing there yet (or the peer left)
    try:
        sock.send(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # it cannot be sent cheaply: the close alone tells the client
    sock.close()


def host_of(address: object) -> str:
    """The host part of a socket's peer address (``("10.0.0.5", 4711)`` -> ``10.0.0.5``)."""
    if isinstance(address, tuple) and address:
        return str(address[0])
    return str(address)


class PeerSlots:
    """Open connections per host, at most ``per_peer`` each.  Thread-safe (the status
    page's workers close connections too)."""

    def __init__(self, per_peer: int) -> None:
        if per_peer < 1:
            raise ValueError(f"PeerSlots per_peer={per_peer!r}: expected connections >= 1")
        self.per_peer = per_peer
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, host: str) -> bool:
        """Count one more connection of ``host``; False (nothing counted) if it holds its
        ``per_peer`` already."""
        with self._lock:
            n = self._open.get(host, 0)
            if n >= self.per_peer:
                return False
            self._open[host] = n + 1
            return True

    def give(self, host: str) -> None:
        """One connection of ``host`` closed (one :meth:`take` that returned True)."""
        with self._lock:
            n = self._open.get(host, 0) - 1
            if n > 0:
                self._open[host] = n
            else:
                self._open.pop(host, None)

    def open(self, host: str) -> int:
        """How many connections ``host`` holds now."""
        with self._lock:
            return self._open.get(host, 0)


@dataclass
class _Burst:
    start: float      # when this window of the host's refusals began
    logged: int = 0   # lines of the window logged in full
    counted: int = 0  # refusals of the window not logged one by one
    last: str = ""    # the last of those, as it would have been logged


#: Told of each summary line: ``(host, text)`` (the master's audit trail).
SummaryHook = Callable[[str, str], None]


class RefusalLog:
    """Refusals per host: a few logged in full, the rest summed up once per window, with a
    bound on lines a second over all hosts (see the module's docstring).  Thread-safe.

    ``note`` is called for every refusal; ``tick`` from the listener's loop (it writes the
    summaries of windows that ended; it does nothing until :data:`TICK` passed since its
    last look, so calling it every loop pass is cheap).
    """

    def __init__(self, logger: logging.Logger, *, peer_lines: int = PEER_LINES,
                 window: float = WINDOW, rate: float = LINES_PER_SECOND,
                 burst: int = LINE_BURST, max_peers: int = MAX_PEERS,
                 clock: Callable[[], float] = time.monotonic,
                 on_summary: SummaryHook | None = None) -> None:
        self.log = logger
        self.peer_lines = peer_lines
        self.window = window
        self.rate = rate
        self.burst = burst
        self.max_peers = max_peers
        self.clock = clock
        self.on_summary = on_summary
        self.bursts: dict[str, _Burst] = {}
        self.total = 0  # refusals noted since the start
        self._tokens = float(burst)
        self._filled = clock()
        self._next_tick = 0.0
        self._lock = threading.Lock()

    def note(self, host: str, message: str, *args: object,
             level: int = logging.WARNING) -> bool:
        """Count a refusal of ``host``; log ``message % args`` at ``level`` if the host's
        window and the lines-a-second bound allow it.  True if it was logged (the caller may
        then report it elsewhere too, as the master does in its audit trail)."""
        with self._lock:
            now = self.clock()
            self.total += 1
            if host not in self.bursts and len(self.bursts) >= self.max_peers:
                host = OTHERS
            entry = self.bursts.get(host)
            if entry is None:
                entry = self.bursts[host] = _Burst(now)
            if entry.logged < self.peer_lines and self._take_token(now):
                entry.logged += 1
                logged = True
            else:
                entry.counted += 1
                entry.last = message % args if args else message
                logged = False
        if logged:
            self.log.log(level, message, *args)
        return logged

    def quiet(self, host: str, message: str, *args: object) -> None:
        """Count a refusal of ``host`` for its summary only (the caller logged one line for
        the whole burst already, as the listeners do for "too many connections")."""
        with self._lock:
            self.total += 1
            if host not in self.bursts and len(self.bursts) >= self.max_peers:
                host = OTHERS
            entry = self.bursts.setdefault(host, _Burst(self.clock()))
            entry.counted += 1
            entry.last = message % args if args else message

    def tick(self, now: float | None = None) -> None:
        """Write the summary of every host whose window ended (as far as the lines-a-second
        bound allows; the others wait for a later tick), and forget those hosts."""
        now = self.clock() if now is None else now
        if now < self._next_tick:
            return
        lines: list[tuple[str, str]] = []
        with self._lock:
            self._next_tick = now + TICK
            # Bounded: at most max_peers + 1 entries.
            for host, entry in list(self.bursts.items()):
                if now - entry.start < self.window:
                    continue
                if entry.counted:
                    if not self._take_token(now):
                        break  # later ticks write the rest
                    lines.append((host, _summary(host, entry, now)))
                del self.bursts[host]
        self._write(lines)

    def flush(self) -> None:
        """Write the summary of every host now, windows and the lines-a-second bound
        aside: the listener is closing, and a count must not be lost with it."""
        with self._lock:
            now = self.clock()
            lines = [(host, _summary(host, entry, now))
                     for host, entry in self.bursts.items() if entry.counted]
            self.bursts.clear()
        self._write(lines)

    def _write(self, lines: list[tuple[str, str]]) -> None:
        """Log each ``(host, summary)`` and hand it to the summary hook (outside the lock:
        the hook may write the audit trail)."""
        for host, text in lines:
            self.log.warning("%s", text)
            if self.on_summary is not None:
                try:
                    self.on_summary(host, text)
                except Exception:  # the hook's bug must not take the listener down
                    self.log.exception("peer %s: summary hook failed", host)

    def _take_token(self, now: float) -> bool:
        """One line of the lines-a-second budget (a token bucket), if there is one."""
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def _summary(host: str, entry: _Burst, now: float) -> str:
    """The summary line of ``host``'s burst ``entry`` at ``now``."""
    return (f"peer {host}: {entry.counted} more refusals in the last "
            f"{max(0.0, now - entry.start):.0f} s, not logged one by one; the last: "
            f"{entry.last}")
