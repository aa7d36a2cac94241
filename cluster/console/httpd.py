"""The status page's HTTP server: clusterstatus.py's engine.

A small HTTP/1.0 server on ``status_address``:``status_port``: one thread reads requests and
writes answers over non-blocking sockets, a few worker threads make the answers (the
standard library's request handler, on a request already read); GET and HEAD only:

    /                      the status page (cluster.console.page): HTML with inline CSS and
                           JavaScript that polls /api/status; nothing comes from elsewhere
    /api/status            cluster.console.status.snapshot as JSON
    /api/nodes             {"version", "now", "nodes"}: the snapshot's nodes
    /api/runs/<id>         cluster.console.status.run_detail as JSON; 404 naming the run when
                           it is unknown, 400 when the id is not a run id
    /archive/<id>/<file>   a finished run's report.txt, <id>.tab, bmpcmp/ page and images,
                           a sweep's results/ and collected/
                           (cluster.console.archivefiles decides what is served, safely)

Every error is JSON, ``{"error": "<what was refused and what was expected>", "status": N}``;
another method is 405 (501 for one HTTP does not know).  The answers (the routes, the
cache, the request handler) are made in :mod:`cluster.console.answers`; this module reads
the requests and writes the answers.

Contract:

* **Cheap under many clients, quick under load.**  The snapshot (both ``/api/status`` and
  ``/api/nodes``) and each run's detail are made at most once per
  :data:`~cluster.console.answers.CACHE_SECONDS`
  (:class:`~cluster.console.answers.TtlCache`); errors are cached the same way.  The
  snapshot is refreshed in the background: a request gets the last one made at once (at
  most about CACHE_SECONDS old, its ``now`` says when) and never waits for a home read,
  except the very first.  A run's detail is made on demand; concurrent requests for it
  wait for the one making it.  The page itself is made once.  The JSON answers are also
  kept gzipped and sent so to clients that accept it (a thousand nodes make 300 KB of
  JSON, under 10 KB gzipped).
* **Bounded, also against slow clients** (a per-read timeout let 80 connections
  trickling a byte every 2 s make every honest request a 503 for 40 s).  A waiting client
  holds no thread, only a socket.  At most :data:`MAX_CLIENTS` connections are open, at most
  a quarter of them (:func:`~cluster.runtime.peers.per_peer_limit`) from one host (more get
  a 503 at once); the whole request head must arrive within :data:`REQUEST_DEADLINE` seconds
  of the connection (else 408), in at most :data:`MAX_HEAD` bytes (else 431; a request line
  longer than :data:`MAX_REQUEST_LINE` bytes gets a 414); at most :data:`MAX_PENDING`
  requests wait for the :data:`WORKERS` (else 503); the answer must be read within
  :data:`ANSWER_DEADLINE` seconds.  Request bodies are never read.  Refusals are logged a
  few per host, then as one summary line per burst (:class:`~cluster.runtime.peers.RefusalLog`).
* **Safe headers.**  API answers are ``Cache-Control: no-store``; every answer carries
  ``X-Content-Type-Options: nosniff`` and a Content-Security-Policy that allows nothing from
  another origin (the page's own inline script and style, and nothing else).

:func:`run` is the daemon: single instance per home (:data:`LOCK_NAME`), a taken port ends
it at once with :data:`cluster.defaults.EXIT_PORT_TAKEN` and a message naming
address:port.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import selectors
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from cluster.config import Config
from cluster.console import answers
from cluster.console.answers import MAX_REQUEST_LINE, StatusModel
from cluster.defaults import EXIT_OK
from cluster.errors import AlreadyRunning
from cluster.home import Home
from cluster.runtime import service
from cluster.runtime.clock import SystemClock
from cluster.runtime.listener import Connection, SelectorListener
from cluster.runtime.singleton import SingleInstance

log = logging.getLogger("cluster.console.httpd")

#: The single-instance lock of clusterstatus.py, in the master home.
LOCK_NAME = "clusterstatus.lock"
#: Connections open at once (reading a request, or its answer); more are answered 503 at
#: once.  A quarter of them may come from one host (per_peer_limit).
MAX_CLIENTS = 512
#: The longest request head (request line and headers) read [bytes].
MAX_HEAD = 65536
#: The whole request head must arrive within this long of the connection [seconds].
REQUEST_DEADLINE = 10.0
#: The whole answer must be read within this long of its making [seconds].
ANSWER_DEADLINE = 60.0
#: Threads making answers; requests waiting for them or at them, at most (more: 503).
WORKERS = 8
MAX_PENDING = 64
#: Bytes read from a client at once; connections accepted per listener event; bytes of an
#: archive file sent at once.
READ_SIZE = 65536
ACCEPT_BATCH = 64
SENDFILE_CHUNK = 1 << 20
#: The daemon's thread switch interval [seconds] (see :func:`run`).
SWITCH_INTERVAL = 0.001
#: The serving loop's longest wait for activity [seconds] (a stop wakes it at once).
POLL = 0.5
#: How often the daemon loop looks at its stop flag [seconds]: a SIGTERM ends the service
#: within this (``localcluster.py`` waits for it at every exit), at 20 looks a second.
STOP_SLICE = 0.05
#: What the status service does on its port, and what to do when the port is taken.
DOING = "serve the status page"
REMEDY = "set status_port to a free port (0: no status page)"


def port_taken_message(address: tuple[str, int]) -> str:
    """What :func:`run` logs when another program holds the port (localcluster quotes it)."""
    return service.port_taken_message(DOING, address, REMEDY)


# ----------------------------------------------------------------------------------------------
# The server: one thread reads requests and writes answers, a few workers make the answers

_READING = "reading"      # collecting the request head (whole-request deadline)
_ANSWERING = "answering"  # at a worker; the socket is not watched
_WRITING = "writing"      # the answer is being sent (answer deadline)


class _Conn(Connection):
    __slots__ = ("buf", "state", "out", "sent", "file", "offset", "left")

    def __init__(self, server: StatusServer, sock: socket.socket, peer: str, host: str,
                 now: float) -> None:
        super().__init__(sock, peer, host, now + server.request_deadline)
        self.buf = bytearray()
        self.state = _READING
        self.out = b""
        self.sent = 0
        self.file: BinaryIO | None = None
        self.offset = 0
        self.left = 0


class StatusServer(SelectorListener[_Conn]):
    """The status service on ``address``; ``model`` makes its answers.

    One thread (:meth:`serve_forever`) accepts, reads each request head over non-blocking
    sockets and writes each answer; :data:`WORKERS` threads make the answers (a home read,
    a run's detail), so no thread ever waits on a client.  A client costs a socket until
    its deadline, however slowly it sends (the threaded server's per-read timeout
    let 80 connections trickling a byte every 2 s make 37 of 37 honest requests a 503 for
    40 s).  Bounds, each answered at once with a JSON error and logged through a
    :class:`~cluster.runtime.peers.RefusalLog` (a few lines per client host, then a summary
    per burst):

    * ``max_connections`` open connections (503), ``max_per_peer`` of them from one host
      (503);
    * the whole request head within ``request_deadline`` seconds of the connection (408),
      at most :data:`MAX_HEAD` bytes (431; 414 for a request line without its end);
    * :data:`MAX_PENDING` requests at the workers or waiting for one (503);
    * the whole answer read within ``answer_deadline`` seconds (else the connection is
      closed).

    Binds and listens in the constructor (OSError as the system says, e.g. EADDRINUSE).
    Accepting, the caps, the deadlines, closing and stopping are
    :class:`~cluster.runtime.listener.SelectorListener`'s.
    """

    name = "status page"
    party = "client"
    accept_batch = ACCEPT_BATCH
    read_size = READ_SIZE
    connection = _Conn

    def __init__(self, address: tuple[str, int], model: StatusModel, *,
                 max_connections: int | None = None, max_per_peer: int | None = None,
                 request_deadline: float = REQUEST_DEADLINE,
                 answer_deadline: float = ANSWER_DEADLINE) -> None:
        self.model = model
        self.request_deadline = request_deadline
        self.answer_deadline = answer_deadline
        super().__init__(address, log, backlog=MAX_CLIENTS,
                         max_connections=MAX_CLIENTS if max_connections is None
                         else max_connections, max_per_peer=max_per_peer,
                         busy_reply=answers.plain_error(503, "too many clients at once; try again"))
        # Workers tell the loop an answer is ready through this pair (the selector's wake-up).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._done: queue.SimpleQueue[tuple[_Conn, bytes, tuple[BinaryIO, int] | None]] = \
            queue.SimpleQueue()
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="clusterstatus")
        self.pending = 0  # requests at the workers (the loop's thread only)
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self.server_address
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    # -- driving it ----------------------------------------------------------------------------
    def serve_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for activity and deal with all of it, then with
        the deadlines that passed."""
        now = self.clock.monotonic()
        if self._deadlines:
            timeout = min(timeout, self._deadlines[0][0] - now)
        for key, events in self.selector.select(max(0.0, timeout)):
            if key.data is None:
                self._accept()
            elif key.data is self._wake_r:
                self._answers_ready()
            else:
                conn: _Conn = key.data
                if conn.closed:
                    continue
                if conn.state == _READING and events & selectors.EVENT_READ:
                    self._read(conn)
                elif conn.state == _WRITING and events & selectors.EVENT_WRITE:
                    self._write(conn)
        now = self.clock.monotonic()
        self._expire(now)
        self.refusals.tick(now)

    def server_close(self) -> None:
        """Close every connection, the workers' pool and the listener."""
        self._closed = True
        self._workers.shutdown(wait=False, cancel_futures=True)
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    # -- connections ---------------------------------------------------------------------------
    def _peer_reply(self, host: str) -> bytes:
        return answers.plain_error(503, f"too many connections from {host} at once; try again")

    def _read_failed(self, conn: _Conn, exc: OSError) -> None:
        log.debug("client %s: read failed: %s", conn.peer, exc)

    def _read(self, conn: _Conn) -> None:
        chunk = self._recv(conn)
        if chunk is None:
            return
        if not chunk:
            if conn.buf:  # the client said all it will: answer what came
                self._dispatch(conn)
            else:
                self._close(conn)  # connected and left: nothing to answer, nothing to log
            return
        seen = len(conn.buf)
        conn.buf += chunk
        # Look for the blank line only in the new bytes (and the 3 before them).
        tail = bytes(conn.buf[max(0, seen - 3):])
        if b"\r\n\r\n" in tail or b"\n\n" in tail:
            self._dispatch(conn)
        elif len(conn.buf) > MAX_HEAD:
            if b"\n" not in conn.buf[:MAX_REQUEST_LINE + 2]:
                self._refuse(conn, 414, f"request line longer than {MAX_REQUEST_LINE} bytes")
            else:
                self._refuse(conn, 431, f"request head longer than {MAX_HEAD} bytes")
        else:
            self._watch(conn, selectors.EVENT_READ)

    def _dispatch(self, conn: _Conn) -> None:
        """The head is complete: a worker makes the answer (the socket is not watched)."""
        if self.pending >= MAX_PENDING:
            self._refuse(conn, 503, "too many requests at once; try again")
            return
        self._watch(conn, 0)
        conn.state = _ANSWERING
        head, conn.buf = bytes(conn.buf), bytearray()
        self.pending += 1
        self._workers.submit(self._make_answer, conn, head)

    def _make_answer(self, conn: _Conn, head: bytes) -> None:
        """In a worker: the handler's answer to ``head``, handed to the loop."""
        body: tuple[BinaryIO, int] | None = None
        try:
            handler = answers.RequestHandler(head, (conn.host, 0), self)  # type: ignore[arg-type]
            out, body = handler.out.getvalue(), handler.file_body
        except Exception as exc:  # noqa: BLE001 -- a bug: logged, answered 500
            log.exception("error answering %s", conn.peer)
            out = answers.plain_error(500, f"could not answer: {type(exc).__name__}: {exc}")
        self._done.put((conn, out, body))
        self._wake()

    def _wake(self) -> None:
        """Make the loop's select return now (from any thread)."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # full (the loop wakes anyway) or closed (the server is closing)

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait until it has returned: at once, not after
        the rest of its ``poll_interval`` (the select is woken)."""
        self._stop.set()
        self._wake()
        super().shutdown()

    def _answers_ready(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:  # bounded: at most MAX_PENDING answers are made at once
            try:
                conn, out, body = self._done.get_nowait()
            except queue.Empty:
                return
            self.pending -= 1
            if conn.closed:
                if body is not None:
                    body[0].close()
                continue
            conn.state = _WRITING
            conn.out, conn.sent = out, 0
            if body is not None:
                conn.file, conn.left = body
            conn.deadline = self.clock.monotonic() + self.answer_deadline
            self._push_deadline(conn)
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            while conn.sent < len(conn.out):
                conn.sent += conn.sock.send(memoryview(conn.out)[conn.sent:])
            while conn.file is not None and conn.left > 0:
                n = os.sendfile(conn.sock.fileno(), conn.file.fileno(), conn.offset,
                                min(conn.left, SENDFILE_CHUNK))
                if n == 0:  # the file shrank under us: the answer cannot be completed
                    break
                conn.offset += n
                conn.left -= n
        except (BlockingIOError, InterruptedError):
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("client %s: write failed: %s", conn.peer, exc)
            self._close(conn)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._close(conn)

    def _refuse(self, conn: _Conn, status_code: int, problem: str) -> None:
        """Answer ``status_code`` with ``problem`` at once (one try) and close; logged."""
        self.refusals.note(conn.host, "client %s: refused (%d): %s", conn.peer, status_code,
                           problem)
        data = answers.plain_error(status_code, problem)
        try:
            conn.sock.send(data)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # it cannot be sent cheaply: the close alone tells the client
        self._close(conn)

    def _expired(self, conn: _Conn) -> None:
        if conn.state == _READING:
            self._refuse(conn, 408, f"no complete request within "
                                    f"{self.request_deadline:g} s")
        elif conn.state == _WRITING:
            self.refusals.note(conn.host, "client %s: did not read its answer within %g s",
                               conn.peer, self.answer_deadline)
            self._close(conn)

    def _release(self, conn: _Conn) -> None:
        """The archive file being sent, closed."""
        if conn.file is not None:
            conn.file.close()
            conn.file = None


# ----------------------------------------------------------------------------------------------
# The daemon

def run(home: Home, cfg: Config, should_stop: Callable[[], bool], poll: float = POLL,
        on_ready: Callable[[StatusServer], None] | None = None,
        wakeup_fd: int | None = None) -> int:
    """Be the one status service of ``home``: lock, listen on ``status_address``:
    ``status_port``, serve until ``should_stop()`` is true (checked every ``poll`` seconds,
    at most :data:`STOP_SLICE`, and at once when ``wakeup_fd``, a stop flag's wakeup fd,
    turns readable; the serving loop then stops at once).  ``on_ready`` is called once it
    listens (tests learn the port from it).

    Returns at once, never retrying: 0 after a stop, when ``status_port`` is 0 (not served)
    or when another instance holds the lock; EXIT_PORT_TAKEN when another program holds
    the port (logged as :func:`port_taken_message`); 2 when the address cannot be used for
    another reason (logged with the system's error).
    """
    address = (cfg.status_address, cfg.status_port)
    if cfg.status_port == 0:
        log.info("status_port is 0: the status page is not served")
        return EXIT_OK
    home.create()
    try:
        lock = SingleInstance(home.root / LOCK_NAME, "clusterstatus")
        lock.acquire()
    except AlreadyRunning as exc:
        log.info("%s; exiting", exc)
        return EXIT_OK
    with lock:
        server = service.listen_or_exit(lambda: StatusServer(address, StatusModel(home, cfg)),
                                        address, DOING, REMEDY, log)
        if isinstance(server, int):
            return server
        # The background refresh of the snapshot is CPU-bound Python; a request thread
        # waiting for the GIL behind it should get it within a millisecond, not 5 (the
        # default switch interval), so an answer from the cache stays quick.
        sys.setswitchinterval(SWITCH_INTERVAL)
        log.info("status page on %s (home %s)", server.url, home.root)
        thread = threading.Thread(target=server.serve_forever, args=(poll,),
                                  name="clusterstatus", daemon=True)
        thread.start()
        try:
            if on_ready is not None:
                on_ready(server)
            clock = SystemClock()
            while not should_stop():
                if wakeup_fd is None:
                    clock.sleep(min(poll, STOP_SLICE))
                elif clock.wait_readable(wakeup_fd, poll):  # a signal ends this wait
                    service.drain(wakeup_fd)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            log.info("stopped")
    return EXIT_OK
