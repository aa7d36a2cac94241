"""The skeleton of the cluster's three listeners: one thread, non-blocking sockets.

The master's node port (:class:`cluster.master.serve.server.NodeServer`), the monitor's heartbeat
port (:class:`cluster.master.daemon.monitor.MonitorServer`) and the status page
(:class:`cluster.console.httpd.StatusServer`) serve many short connections from one thread
over a selector, so that a slow or silent client costs a socket and a small record, never a
thread or another client's turn.  What they share is written here once,
in :class:`SelectorListener`; each server keeps only what is its own: how a request is
framed and answered, and what a connection's states are.

What :class:`SelectorListener` guarantees:

* **A bounded accept batch.**  Each listener event accepts at most :attr:`accept_batch`
  connections, so the loop gets back to its deadlines (and the master to its health checks)
  however fast clients connect.  A failing ``accept`` (EMFILE and friends) is logged and
  ends the batch; the server keeps serving the connections it has.
* **Caps.**  At most ``max_connections`` connections are open, at most ``max_per_peer`` of
  one host (:class:`~cluster.runtime.peers.PeerSlots`; default
  :func:`~cluster.runtime.peers.per_peer_limit`).  A connection beyond either is refused at
  once (:func:`~cluster.runtime.peers.send_and_close` with the server's refusal) and
  counted in :attr:`rejected`.  Refusals go through one
  :class:`~cluster.runtime.peers.RefusalLog`: the first "busy" of a burst is logged, the
  rest of the burst only counted into a summary; a per-host refusal is noted each time
  (the RefusalLog bounds the lines).
* **Deadlines.**  Every connection has one (:attr:`Connection.deadline`, on the clock's
  monotonic time); :meth:`_expire` hands each connection whose deadline passed, once, to
  the server's :meth:`_expired`.  Two bookkeepings, chosen by :attr:`deadlines_in_order`:
  a heap (a connection's deadline may move with its state: :meth:`_push_deadline` after
  each move; an entry whose deadline is no longer its connection's, or whose connection is
  closed, is skipped), or, when a deadline is set once at accept and never moves, the
  order of :attr:`conns` itself (acceptance order is deadline order: no heap entry per
  connection, which at tens of thousands of connections a second would keep every closed
  connection alive until its deadline).
* **One close.**  :meth:`_close` is idempotent: the server's :meth:`_release` (its own
  buffers and files), the host's slot given back, the socket unregistered and closed.
* **A thread-safe stop.**  :meth:`serve_forever` runs :meth:`serve_once` until
  :meth:`shutdown`, which may be called from any thread, waits until the loop has returned
  (at most one ``poll_interval``) and returns at once when it is not running.
  :meth:`server_close` closes every connection, writes the refusal counts still open, and
  closes the listener and the selector.

What a server provides: its :class:`Connection` subclass as :attr:`connection` (made as
``connection(server, sock, peer, host, now)``; its ``deadline`` and ``events`` set there),
:meth:`serve_once` (the selector's events dispatched by the connection's state, then
:meth:`_expire` and ``refusals.tick``), :meth:`_read` (called right after accept, since the
request usually arrives with the connection), :meth:`_expired`, the refusal it sends
(``busy_reply``, :meth:`_peer_reply`) and, where it holds more than a socket, :meth:`_release`.
:meth:`_tell` hears of the refusals logged in full and of the summaries (the master's audit
trail).  The accept path adds no call per connection to what a server did on its own: the
record's constructor and :meth:`_read` are called directly.

Reading is shared too.  :meth:`SelectorListener._recv` is the one non-blocking read: the
bytes, ``b""`` at the peer's end, or None when there is nothing yet (the connection is then
watched for reading) or the read failed (logged by :meth:`_read_failed`; closed).  The two
listeners of line protocols (master, monitor) read one request per connection through
:class:`FramedListener`, whose :meth:`FramedListener._read` is the whole read path:

* each chunk is checked against the bounds *before* it joins the buffer, so no bound is
  ever passed, even by one chunk: ``max_request`` bytes a request (when set) and
  ``max_buffered`` bytes of unfinished requests over all connections (:attr:`buffered`);
  over either, the buffer is dropped (:meth:`_release`) by the server's
  :meth:`~FramedListener._over_bound` and nothing more joins it;
* the bytes go to the connection's framer (its line bounds; a ``ProtocolError`` goes to
  :meth:`~FramedListener._bad_request`); an incomplete request is watched for more;
* the peer's end before the request is complete goes to
  :meth:`~FramedListener._ended_early`; input after it (the request complete, refused or
  answered) to :meth:`~FramedListener._read_after` (default: ignored);
* a complete request releases its buffer and goes to :meth:`~FramedListener._request`.

Each server keeps only what differs: its messages, its answers and what follows a request.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from cluster.errors import ProtocolError
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.peers import PeerSlots, RefusalLog, host_of, per_peer_limit, send_and_close


class Connection:
    """What the skeleton keeps of one connection; a server's record extends it.

    ``sock`` (non-blocking), ``peer`` (``address:port``), ``host`` (the address alone: its
    :class:`~cluster.runtime.peers.PeerSlots` key), ``deadline`` (when the current state
    must be done, on the server's monotonic clock) and ``events`` (what the selector
    watches for; 0: not registered).  A subclass's ``__init__`` may set these itself rather
    than call this one (the master's does: its records are made on the hot path).
    """

    __slots__ = ("sock", "peer", "host", "deadline", "events")

    def __init__(self, sock: socket.socket, peer: str, host: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.host = host
        self.deadline = deadline
        self.events = 0

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0


C = TypeVar("C", bound=Connection)


class SelectorListener(Generic[C]):
    """A listening socket, its selector and its connections: see the module's docstring.

    Binds and listens in the constructor (``OSError`` as the system says, e.g. EADDRINUSE;
    ``SO_REUSEADDR`` is set, so a restart does not wait out TIME_WAIT).  ``backlog`` is the
    listen queue; ``nodelay`` sets ``TCP_NODELAY`` on each accepted socket; ``busy_reply``
    is what a connection over ``max_connections`` is sent before it is closed (and, unless
    :meth:`_peer_reply` says otherwise, one over its host's share); ``clock`` defaults to
    the system's.  Counters: :attr:`rejected` (refused requests and connections).
    """

    #: What the logs call the server ("the monitor's limit") and the other end ("peer").
    name = "server"
    party = "peer"
    #: Connections accepted per listener event, at most.
    accept_batch = 256
    #: Bytes read at once; also what a refused connection's input is drained by.
    read_size = 65536
    #: True: a deadline is set at accept and never moves (see the module's docstring).
    deadlines_in_order = False
    #: The server's record of a connection: ``connection(server, sock, peer, host, now)``.
    connection: Callable[..., C]

    def __init__(self, address: tuple[str, int], logger: logging.Logger, *, backlog: int,
                 max_connections: int, max_per_peer: int | None, busy_reply: bytes,
                 clock: Clock | None = None, nodelay: bool = False) -> None:
        self.log = logger
        self.clock = clock or SystemClock()
        self.max_connections = max_connections
        self.peers = PeerSlots(per_peer_limit(max_connections) if max_per_peer is None
                               else max_per_peer)
        self.busy_reply = busy_reply
        self.nodelay = nodelay
        self.refusals = RefusalLog(logger, clock=self.clock.monotonic, on_summary=self._tell)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.listener = socket.create_server(address, family=family, backlog=backlog)
        self.listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        #: Open connections by file descriptor, in order of acceptance.
        self.conns: dict[int, C] = {}
        self.rejected = 0
        # (deadline, sequence, conn): the sequence keeps equal deadlines from comparing conns.
        self._deadlines: list[tuple[float, int, C]] = []
        self._seq = itertools.count()
        self._busy_logged = False  # one log line per burst of connections over the limit
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    @property
    def server_address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return host, port

    # -- what a server provides ----------------------------------------------------------------
    def serve_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for activity and deal with all of it, then with
        the deadlines that passed (:meth:`_expire`) and the refusal summaries due."""
        raise NotImplementedError

    def _read(self, conn: C) -> None:
        """Read what ``conn`` sent; when nothing is there yet, watch it for reading."""
        raise NotImplementedError

    def _expired(self, conn: C) -> None:
        """``conn``'s deadline passed: answer it or close it.  With
        :attr:`deadlines_in_order` it must be closed on return (it would come first again)."""
        raise NotImplementedError

    def _release(self, conn: C) -> None:
        """Give back what ``conn`` holds besides its slot and socket (a buffer, a file).
        Called by :meth:`_close`, maybe more than once: must be idempotent."""

    def _peer_reply(self, host: str) -> bytes:
        """What a connection over its host's share is sent (default: ``busy_reply``)."""
        return self.busy_reply

    def _tell(self, peer: str, reason: str) -> None:
        """Told of each refusal logged in full and of each summary (default: nothing)."""

    def _read_failed(self, conn: C, exc: OSError) -> None:
        """A read of ``conn`` failed (a reset): logged, a line per host at most as the
        RefusalLog allows; the connection is closed after this."""
        self.refusals.note(conn.host, "%s %s: read failed: %s", self.party, conn.peer, exc,
                           level=logging.INFO)

    # -- reading -------------------------------------------------------------------------------
    def _recv(self, conn: C) -> bytes | None:
        """One non-blocking read of at most :attr:`read_size` bytes of ``conn``: the bytes,
        ``b""`` when the peer has ended its side, or None when there is nothing to read yet
        (``conn`` is then watched for reading) or the read failed (:meth:`_read_failed`;
        ``conn`` is then closed)."""
        try:
            return conn.sock.recv(self.read_size)
        except (BlockingIOError, InterruptedError):
            self._watch(conn, selectors.EVENT_READ)
            return None
        except OSError as exc:
            self._read_failed(conn, exc)
            self._close(conn)
            return None

    # -- driving it ----------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """:meth:`serve_once` until :meth:`shutdown` (from another thread; a shutdown that
        came before this started makes it return at once)."""
        self._stopped.clear()
        try:
            while not self._stop.is_set():
                self.serve_once(poll_interval)
        finally:
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Make :meth:`serve_forever` return, and wait until it has (at most one
        ``poll_interval``).  Returns at once if it is not running."""
        self._stop.set()
        self._stopped.wait()

    def server_close(self) -> None:
        """Close every connection, the listener and the selector; log the refusal counts of
        the bursts still open."""
        for conn in list(self.conns.values()):
            self._close(conn)
        self.refusals.flush()
        self.selector.unregister(self.listener)
        self.listener.close()
        self.selector.close()

    # -- connections ---------------------------------------------------------------------------
    def _accept(self) -> None:
        """Accept at most :attr:`accept_batch` connections; refuse those over a cap; read
        the others at once."""
        now = self.clock.monotonic()
        for _ in range(self.accept_batch):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: log, keep serving the others
                self.log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            peer = f"{addr[0]}:{addr[1]}"
            host = host_of(addr)
            if len(self.conns) >= self.max_connections:
                self._refuse_busy(sock, peer, host)
                continue
            if not self.peers.take(host):
                self._refuse_peer(sock, peer, host)
                continue
            self._busy_logged = False
            if self.nodelay:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self.connection(self, sock, peer, host, now)
            self.conns[sock.fileno()] = conn
            if not self.deadlines_in_order:
                self._push_deadline(conn)
            self._read(conn)

    def _refuse_busy(self, sock: socket.socket, peer: str, host: str) -> None:
        """Over max_connections: the busy reply (one non-blocking try), then close.  The
        first of a burst is logged; the rest are counted into the host's summary."""
        if not self._busy_logged:
            if self.refusals.note(host, "%s %s: refused, %d connections already open (the "
                                  "%s's limit); further refusals in this burst are counted "
                                  "in a summary", self.party, peer, len(self.conns), self.name):
                self._tell(peer, f"{self.name} busy: too many open connections")
            self._busy_logged = True
        else:
            self.refusals.quiet(host, "%s %s: refused, too many connections open",
                                self.party, peer)
        self.rejected += 1
        send_and_close(sock, self.busy_reply, self.read_size)

    def _refuse_peer(self, sock: socket.socket, peer: str, host: str) -> None:
        """Its host holds max_per_peer connections already: refused as when busy."""
        if self.refusals.note(host, "%s %s: refused, its host holds %d connections already "
                              "(the per-peer limit)", self.party, peer, self.peers.per_peer):
            self._tell(peer, f"refused: its host holds {self.peers.per_peer} connections "
                             "already (the per-peer limit)")
        self.rejected += 1
        send_and_close(sock, self._peer_reply(host), self.read_size)

    def _watch(self, conn: C, events: int) -> None:
        """Have the selector watch ``conn`` for ``events`` (0: not at all)."""
        if conn.events == events:
            return
        if not events:
            self.selector.unregister(conn.sock)
        elif conn.events:
            self.selector.modify(conn.sock, events, conn)
        else:
            self.selector.register(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: C) -> None:
        """Release, give the host's slot back, unregister and close ``conn`` (once)."""
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self._release(conn)
        self.conns.pop(fd, None)
        self.peers.give(conn.host)
        if conn.events:
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.events = 0
        conn.sock.close()

    # -- deadlines -----------------------------------------------------------------------------
    def _push_deadline(self, conn: C) -> None:
        """``conn.deadline`` was set (at accept, or when its state moved on): keep it."""
        heapq.heappush(self._deadlines, (conn.deadline, next(self._seq), conn))

    def _expire(self, now: float) -> None:
        """Hand each open connection whose deadline passed by ``now`` to :meth:`_expired`."""
        if self.deadlines_in_order:
            # conns is in order of acceptance, so of deadline: the expired ones come first.
            expired = []
            for conn in self.conns.values():
                if conn.deadline >= now:
                    break
                expired.append(conn)
            for conn in expired:
                self._expired(conn)
            return
        heap = self._deadlines
        # Bounded: each connection has at most one entry per state it went through.
        while heap and heap[0][0] <= now:
            deadline, _, conn = heapq.heappop(heap)
            if deadline == conn.deadline and not conn.closed:
                self._expired(conn)


class Framer(Protocol):
    """What frames a request from a byte stream (:class:`cluster.wire.framing.LineFramer`):
    ``feed`` returns the whole request once it is complete, None before; ProtocolError when
    the bytes break the framing or its bounds."""

    def feed(self, chunk: bytes) -> bytes | None: ...


class FramedConnection(Connection):
    """A connection that sends one request, read through ``framer`` (None once the request
    is complete or refused, or the connection closed); ``held`` is the request bytes it
    holds, counted in its server's :attr:`FramedListener.buffered`; ``out`` is its answer
    and ``sent`` how many bytes of it went out (:meth:`FramedListener._send`).  A
    subclass's ``__init__`` may set the fields itself, as :class:`Connection`'s may."""

    __slots__ = ("framer", "held", "out", "sent")

    def __init__(self, sock: socket.socket, peer: str, host: str, deadline: float,
                 framer: Framer) -> None:
        super().__init__(sock, peer, host, deadline)
        self.framer: Framer | None = framer
        self.held = 0
        self.out = b""
        self.sent = 0


F = TypeVar("F", bound=FramedConnection)


class FramedListener(SelectorListener[F]):
    """A :class:`SelectorListener` whose connections each send one framed request, read
    with bounded memory: see "Reading is shared too" in the module's docstring.

    ``max_buffered`` bytes of unfinished requests over all connections together (>= 1),
    ``max_request`` bytes a request (None: no bound but the framer's lines); the other
    arguments are :class:`SelectorListener`'s.  :attr:`buffered` is the bytes held now.
    The bound passed is named to :meth:`_over_bound` as :attr:`request_bound` or
    :attr:`buffered_bound` with ``{limit}`` filled in.
    """

    #: What :meth:`_over_bound` is told of each bound ("{limit}": the bound's bytes).
    request_bound = "request larger than {limit} bytes"
    buffered_bound = "open connections would hold more than {limit} bytes"

    def __init__(self, address: tuple[str, int], logger: logging.Logger, *,
                 max_buffered: int, max_request: int | None = None, backlog: int,
                 max_connections: int, max_per_peer: int | None, busy_reply: bytes,
                 clock: Clock | None = None, nodelay: bool = False) -> None:
        self.max_buffered = max_buffered
        self.max_request = max_request
        self.buffered = 0
        super().__init__(address, logger, backlog=backlog, max_connections=max_connections,
                         max_per_peer=max_per_peer, busy_reply=busy_reply, clock=clock,
                         nodelay=nodelay)

    # -- what a server provides ----------------------------------------------------------------
    def _request(self, conn: F, request: bytes) -> None:
        """``request`` is complete (its buffer already released): answer it."""
        raise NotImplementedError

    def _ended_early(self, conn: F) -> None:
        """The peer ended its side before its request was complete: refuse or close."""
        raise NotImplementedError

    def _over_bound(self, conn: F, bound: str) -> None:
        """``conn``'s next bytes would pass ``bound`` (a phrase naming it): refuse.  Must
        :meth:`_release` the buffer (nothing more is framed after it)."""
        raise NotImplementedError

    def _bad_request(self, conn: F, problem: str) -> None:
        """The framer refused the bytes (``problem``, the ProtocolError's text): refuse.
        Must :meth:`_release` the buffer."""
        raise NotImplementedError

    def _read_after(self, conn: F, chunk: bytes) -> None:
        """Input after the request was done with (``b""``: the peer's end).  Default:
        ignored; the answer in progress decides the connection's end."""

    # -- reading -------------------------------------------------------------------------------
    def _send(self, conn: F) -> bool:
        """Send what is left of ``conn.out``: True once all of it went out; False when the
        socket would block (the caller watches it for writing) or the send failed, in
        which case ``conn`` is closed (a peer that hung up is not logged; another failure
        is, through :attr:`refusals`, at INFO)."""
        try:
            while conn.sent < len(conn.out):
                conn.sent += conn.sock.send(memoryview(conn.out)[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                self.refusals.note(conn.host, "peer %s: write failed: %s", conn.peer, exc,
                                   level=logging.INFO)
            self._close(conn)
            return False
        return True

    def _read(self, conn: F) -> None:
        """Read what ``conn`` sent and frame it; a complete request goes to :meth:`_request`."""
        chunk = self._recv(conn)
        if chunk is None:
            return
        framer = conn.framer
        if framer is None:  # the request is done with: what follows is the server's
            self._read_after(conn, chunk)
            return
        if not chunk:
            self._ended_early(conn)
            return
        size = len(chunk)
        # The bounds are checked before the chunk joins the buffer, so neither is ever
        # passed, even by one chunk.
        if self.max_request is not None and conn.held + size > self.max_request:
            self._over_bound(conn, self.request_bound.format(limit=self.max_request))
            return
        if self.buffered + size > self.max_buffered:
            self._over_bound(conn, self.buffered_bound.format(limit=self.max_buffered))
            return
        conn.held += size
        self.buffered += size
        try:
            request = framer.feed(chunk)
        except ProtocolError as exc:
            self._bad_request(conn, str(exc))
            return
        if request is None:
            self._watch(conn, selectors.EVENT_READ)
            return
        self._release(conn)
        self._request(conn, request)

    def _release(self, conn: F) -> None:
        """Forget the connection's request buffer (complete, refused or closed); a server
        that holds more calls this from its own."""
        self.buffered -= conn.held
        conn.held = 0
        conn.framer = None
