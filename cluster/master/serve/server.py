"""The master's TCP listener: one thread, non-blocking sockets, one request per connection.

Why not ``socketserver``: the Perl served one connection at a time, so a node that connects
and says nothing stalled everybody for up to its 60 s alarm.  Here every connection is
non-blocking and has a deadline, so a slow or silent client costs the others nothing, and
there are no threads or locks around the run state.

A connection's life: accepted -> bytes collected by a
:class:`~cluster.wire.protocol.RequestFramer` (limits enforced as bytes arrive) ->
``handler(request, peer)`` returns the reply bytes -> reply written -> closed.  A framing
error or an expired deadline is logged with the peer and answered with ``ABORT <what was
wrong>`` where the socket still allows it.  The server does not sign: the handler verifies
each request and signs its reply (:mod:`cluster.wire.signing`); the ABORTs the server
itself sends are unsigned, which a node treats as a failed call and retries.  Every such
refusal is also handed to ``on_refusal(peer, reason)`` (the run's audit trail).

Memory is bounded twice, as bytes arrive (one 480 MB request once took the master
from 27 MB to 1.86 GB): one request may hold at most ``max_request`` bytes, and all open
connections together at most ``max_buffered``.  Data that would pass either bound is
refused: the buffer is dropped at once, the peer gets ``ABORT <reason>`` (one non-blocking
try; a peer still sending may see a reset instead) and one log line names the peer and the
bound; nothing more is read from that connection.  The number of open connections is
bounded too (:func:`~cluster.runtime.peers.connection_limit`): beyond it a new connection is
answered ``ABORT`` and closed at once, so a flood of silent sockets cannot use up the file
descriptors; and one host may hold at most ``max_per_peer`` of them (a quarter, see
:func:`~cluster.runtime.peers.per_peer_limit`), so one host's flood cannot take the others'
place.

Refusals are logged through a :class:`~cluster.runtime.peers.RefusalLog`: a few per host in
full, the rest as one summary line per burst, at most a few lines a second in all; the
audit trail (``on_refusal``) gets the same lines, so a stranger looping connections at the
port fills neither (one line per slow socket).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
from collections.abc import Callable

from cluster.config import DEFAULTS
from cluster.runtime.clock import Clock
from cluster.runtime.listener import FramedConnection, FramedListener
from cluster.runtime.peers import connection_limit
from cluster.wire import protocol

log = logging.getLogger("cluster.server")

Handler = Callable[[bytes, str], bytes]
#: Told of every request the server itself refuses: ``(peer, reason)`` (the audit trail).
RefusalHook = Callable[[str, str], None]
_READ_SIZE = 262144
#: Connections accepted (and, when their request is there, served) per listener event.
_ACCEPT_BATCH = 256
_BUSY = protocol.format_reply(protocol.Reply(protocol.ABORT, reason=protocol.ABORT_BUSY))


class _Conn(FramedConnection):
    __slots__ = ()

    def __init__(self, server: NodeServer, sock: socket.socket, peer: str, host: str,
                 now: float) -> None:
        # The skeleton's fields set here, not by Connection.__init__: one call less for
        # each of the master's many short connections.
        self.sock = sock
        self.peer = peer
        self.host = host  # the peer's address without the port: its PeerSlots key
        self.deadline = now + server.deadline  # never moves (deadlines_in_order)
        self.events = 0
        # None once the request is done.
        self.framer: protocol.RequestFramer | None = protocol.RequestFramer(
            server.max_line, server.max_lines)
        self.held = 0  # request bytes this connection holds (counted in NodeServer.buffered)
        self.out = b""
        self.sent = 0


class _Wake:
    """A file descriptor the server watches beside its connections (a sweep's check pool
    says a verdict is ready): ``callback`` runs in the serving thread when it is
    readable."""

    __slots__ = ("fd", "callback")

    def __init__(self, fd: int, callback: Callable[[], object]) -> None:
        self.fd = fd
        self.callback = callback


class NodeServer(FramedListener[_Conn]):
    """Listens on ``address`` and answers node requests through ``handler``.

    Callers use :meth:`serve_once` in their own loop (the master interleaves it with its
    health checks), :attr:`server_address` and :meth:`close`.

    Bounds: ``max_line`` bytes a line and ``max_lines`` lines a request (the framer's),
    ``max_request`` bytes a request, ``max_buffered`` bytes of unfinished requests over all
    connections together, ``max_connections`` open connections (default: the file limit
    allows, at most :data:`~cluster.runtime.peers.MAX_CONNECTIONS`), ``max_per_peer`` of them
    from one host (default: :func:`~cluster.runtime.peers.per_peer_limit`), ``deadline``
    seconds for a connection to deliver its request and read its reply.  :attr:`buffered` is
    the bytes held right now.  Accepting, the caps, the deadlines, closing and reading
    within those bounds are :class:`~cluster.runtime.listener.FramedListener`'s.
    """

    name = "master"
    accept_batch = _ACCEPT_BATCH
    read_size = _READ_SIZE
    # One deadline per connection, set at accept: the connections are in deadline order.
    deadlines_in_order = True
    connection = _Conn
    request_bound = "request larger than {limit} bytes (max_request_bytes)"
    buffered_bound = "open connections would hold more than {limit} bytes (max_buffered_bytes)"

    def __init__(self, address: tuple[str, int], handler: Handler, *,
                 max_line: int = protocol.DEFAULT_MAX_LINE,
                 max_lines: int = protocol.DEFAULT_MAX_LINES,
                 max_request: int = DEFAULTS.max_request_bytes,
                 max_buffered: int = DEFAULTS.max_buffered_bytes,
                 max_connections: int | None = None, max_per_peer: int | None = None,
                 deadline: float = DEFAULTS.connection_deadline,
                 clock: Clock | None = None, on_refusal: RefusalHook | None = None) -> None:
        for name, value in (("max_request", max_request), ("max_buffered", max_buffered)):
            if value < 1:
                raise ValueError(f"NodeServer {name}={value!r}: expected bytes >= 1")
        self.handler = handler
        self.on_refusal = on_refusal
        self.max_line = max_line
        self.max_lines = max_lines
        self.deadline = deadline
        self.served = 0
        super().__init__(address, log, max_buffered=max_buffered, max_request=max_request,
                         backlog=1024,
                         max_connections=(connection_limit() if max_connections is None
                                          else max_connections),
                         max_per_peer=max_per_peer, busy_reply=_BUSY, clock=clock,
                         nodelay=True)

    def serve_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for activity and deal with all of it."""
        for key, events in self.selector.select(timeout):
            data = key.data
            if data is None:
                self._accept()
            elif data.__class__ is _Wake:
                self._woken(data)
            else:
                conn: _Conn = data
                if events & selectors.EVENT_READ and not conn.out:
                    self._read(conn)
                elif events & selectors.EVENT_WRITE:
                    self._write(conn)
        now = self.clock.monotonic()
        self._expire(now)
        self.refusals.tick(now)

    def close(self) -> None:
        """:meth:`server_close`, by the name the master calls."""
        self.server_close()

    def watch_fd(self, fd: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` (in :meth:`serve_once`) whenever ``fd`` is readable, until
        :meth:`unwatch_fd`; the callback reads what made it readable."""
        self.selector.register(fd, selectors.EVENT_READ, _Wake(fd, callback))

    def unwatch_fd(self, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(fd)

    def _woken(self, wake: _Wake) -> None:
        try:
            wake.callback()
        except Exception:  # its bug must not take the master down
            log.exception("the callback of fd %d failed", wake.fd)

    # ------------------------------------------------------------------ internals
    def _ended_early(self, conn: _Conn) -> None:
        if self.refusals.note(conn.host, "peer %s: closed the connection before OK or "
                              "ABORT", conn.peer):
            self._tell(conn.peer, "closed the connection before OK or ABORT")
        self.rejected += 1
        self._close(conn)

    def _request(self, conn: _Conn, request: bytes) -> None:
        try:
            reply = self.handler(request, conn.peer)
        except Exception:  # the handler's bug must not take the master down
            log.exception("peer %s: handler failed", conn.peer)
            reply = protocol.format_reply(
                protocol.Reply(protocol.ABORT, reason=protocol.ABORT_MASTER_ERROR))
        self.served += 1
        self._start_reply(conn, reply)

    def _over_bound(self, conn: _Conn, bound: str) -> None:
        """Over a memory bound: drop the buffer now, log once, answer ABORT and close.

        Nothing more is read from the connection (a reply in progress is never read from),
        so its remaining data costs no memory and no further log lines."""
        size = conn.held
        self._release(conn)
        if self.refusals.note(conn.host, "peer %s: refused after %d bytes: %s", conn.peer,
                              size, bound):
            self._tell(conn.peer, f"after {size} bytes: {bound}")
        self.rejected += 1
        self._start_reply(conn, protocol.format_reply(
            protocol.Reply(protocol.ABORT, reason=f"{protocol.ABORT_REFUSED}: {bound}")))

    def _bad_request(self, conn: _Conn, problem: str) -> None:
        self._release(conn)
        if self.refusals.note(conn.host, "peer %s: bad request: %s", conn.peer, problem):
            self._tell(conn.peer, f"bad request: {problem}")
        self.rejected += 1
        self._start_reply(conn, protocol.format_reply(
            protocol.Reply(protocol.ABORT, reason=f"{protocol.ABORT_BAD_REQUEST}: {problem}")))

    def _tell(self, peer: str, reason: str) -> None:
        if self.on_refusal is not None:
            try:
                self.on_refusal(peer, reason)
            except Exception:  # the hook's bug must not take the master down
                log.exception("peer %s: refusal hook failed", peer)

    def _start_reply(self, conn: _Conn, reply: bytes) -> None:
        conn.out = reply
        conn.sent = 0
        self._write(conn)
        if conn.sock.fileno() >= 0 and conn.sent < len(conn.out):
            self._watch(conn, selectors.EVENT_WRITE)

    def _write(self, conn: _Conn) -> None:
        if self._send(conn):
            self._close(conn)

    def _expired(self, conn: _Conn) -> None:
        if conn.out:
            self.refusals.note(conn.host, "peer %s: did not read its reply within %.0f s",
                               conn.peer, self.deadline)
            self._close(conn)
        else:
            self._bad_request(conn, f"no complete request within {self.deadline:.0f} s")
            if conn.sock.fileno() >= 0:
                self._close(conn)
