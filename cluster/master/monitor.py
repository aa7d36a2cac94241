"""The heartbeat listener: port of monitorPort.pl (seed 000).

Seed 000: monitorPort "does the usual 'if I am not the only one, then exit' dance", then
listens; for each connection it receives the machine name, a file suffix and some file
contents, and answers whether a job waits.  "The remote nodes use this to send a heartbeat
(and status) to the server, and to be informed when they have a new job to begin."

The wire format is :mod:`cluster.wire.heartbeat` (one connection per heartbeat: ``node``,
``status``, ``caps`` headers and ``OK``; the answer lists the waiting runs, then ``END``).
This module is the master's side: the server, and the heartbeat records in the home.  Each
heartbeat touches ``home/nodes/<name>.up``, whose mtime is the node's lease (ARTIFEX.md
§2.3).  ``.status`` and ``.caps`` are rewritten atomically.

Deviations from the seed, and why:

* port ``monitor_port`` (default 9010), not 9001, which is priority 1's clustermaster port;
* the "file suffix + contents" pair of the Perl became the named ``status``/``caps`` headers,
  the only two files the seed says a node sends this way;
* the answer lists the waiting runs instead of a bare 1/0, so a node knows which priority to
  join; ``heartbeat.py`` still turns it into the seed's exit code (non-zero = a job waits).

The single-instance "dance" is an ``fcntl.flock`` on ``home/monitor_port.lock``
(:func:`acquire_lock`); :func:`run` is the whole daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.defaults import PRIORITIES
from cluster.errors import AlreadyRunning, ProtocolError
from cluster.home import Home
from cluster.runtime import fsutil
from cluster.runtime.clock import Clock, SystemClock
from cluster.runtime.singleton import SingleInstance
from cluster.wire.heartbeat import (
    MAX_LINE,
    MAX_LINES,
    Heartbeat,
    format_error,
    format_reply,
    framer,
    parse_heartbeat,
)
from cluster.wire.protocol import JOB_ID

log = logging.getLogger("cluster.monitor")

#: A client must deliver its whole request within this many seconds.
DEADLINE = 5.0
#: Connections handled at once; more are answered ERROR at once (a flood of silent clients
#: must not grow threads without bound).
MAX_CONNECTIONS = 64

#: After an ERROR reply, input still discarded (bytes, seconds) so the reply is not lost to
#: a TCP reset.
DRAIN_BYTES = 65536
DRAIN_SECONDS = 0.5

LOCK_NAME = "monitor_port.lock"


# ----------------------------------------------------------------------------------------------
# The master home side

def read_job_id(path: Path) -> str | None:
    """The ``id`` of a job.start file (``key value`` lines), or None if absent or without a
    valid id."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "id":
            value = value.strip()
            if JOB_ID.fullmatch(value):
                return value
            log.warning("%s: id %r is not a valid job id", path, value)
            return None
    log.warning("%s has no 'id' line", path)
    return None


def waiting_jobs(home: Home) -> list[tuple[int, str]]:
    """``(priority, id)`` of every run whose job[.p].start exists, by priority."""
    jobs = []
    for p in PRIORITIES:
        job_id = read_job_id(home.job_start(p))
        if job_id is not None:
            jobs.append((p, job_id))
    return jobs


def record_heartbeat(home: Home, hb: Heartbeat) -> None:
    """Touch ``nodes/<node>.up`` (its mtime is the lease) and store status/caps if sent."""
    home.nodes.mkdir(parents=True, exist_ok=True)
    # Atomic, so dashboards and the master never read a torn file; no fsync: rewritten at
    # every heartbeat, and harmless to lose.
    if hb.status is not None:
        fsutil.atomic_write(home.nodes / f"{hb.node}.status", hb.status + "\n", fsync=False)
    if hb.caps is not None:
        fsutil.atomic_write(home.nodes / f"{hb.node}.caps", hb.caps + "\n", fsync=False)
    # Touch last, so a node that is "up" already has its status and caps on disk.
    (home.nodes / f"{hb.node}.up").touch()


def nodes_seen(home: Home, now: float | None = None) -> dict[str, tuple[float, str]]:
    """``{name: (seconds since its last heartbeat, status text)}`` for every node with a
    ``.up`` file.  ``now`` is wall-clock time (mtimes are); default: the system clock's."""
    now = SystemClock().time() if now is None else now
    seen: dict[str, tuple[float, str]] = {}
    try:
        entries = list(os.scandir(home.nodes))
    except FileNotFoundError:
        return seen
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".up"):
            continue
        name = entry.name[:-3]
        try:
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        try:
            status = (home.nodes / f"{name}.status").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            status = ""
        seen[name] = (max(0.0, now - mtime), status)
    return seen


# ----------------------------------------------------------------------------------------------
# Single instance

def acquire_lock(home: Home, program: str = "monitor_port") -> SingleInstance:
    """Take ``home/monitor_port.lock`` without waiting; AlreadyRunning if another holds it."""
    lock = SingleInstance(home.root / LOCK_NAME, program)
    lock.acquire()
    return lock


# ----------------------------------------------------------------------------------------------
# The server

class _Handler(socketserver.BaseRequestHandler):
    server: MonitorServer

    def handle(self) -> None:
        self.server.handle_connection(self.request, self.client_address)


class MonitorServer(socketserver.ThreadingTCPServer):
    """The heartbeat listener.  Callers use ``serve_forever()`` (in a thread), ``shutdown()``
    (from another thread), ``server_close()`` and ``server_address``.

    One thread per connection, each with its own :data:`DEADLINE`, so a silent or slow
    client delays nobody else; at most ``max_connections`` at once.
    """

    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False

    def __init__(self, home: Home, address: tuple[str, int] = ("127.0.0.1", 0), *,
                 deadline: float = DEADLINE, max_line: int = MAX_LINE,
                 max_lines: int = MAX_LINES, max_connections: int = MAX_CONNECTIONS,
                 clock: Clock | None = None) -> None:
        self.home = home
        self.deadline = deadline
        self.max_line = max_line
        self.max_lines = max_lines
        self.clock = clock or SystemClock()
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    # -- connection admission ------------------------------------------------------------------
    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("peer %s: refused, %s connections already open",
                        _peer(client_address), self.max_connections)
            with contextlib.suppress(OSError):
                request.sendall(format_error("monitor busy, try again"))
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints to stderr; we want the peer in the log, and to keep serving.
        log.exception("peer %s: error while handling a heartbeat", _peer(client_address))

    # -- one connection ------------------------------------------------------------------------
    def handle_connection(self, sock: socket.socket, client_address: Any) -> None:
        """Read one request within the deadline, act on it, reply, and return."""
        peer = _peer(client_address)
        try:
            data = self._read_request(sock)
            hb = parse_heartbeat(data, self.max_line, self.max_lines)
        except ProtocolError as exc:
            log.warning("peer %s: bad heartbeat: %s", peer, exc)
            self._send(sock, format_error(str(exc)), peer)
            self._drain(sock)
            return
        try:
            record_heartbeat(self.home, hb)
            jobs = waiting_jobs(self.home)
        except OSError as exc:
            log.error("node %s (peer %s): cannot record heartbeat in %s: %s",
                      hb.node, peer, self.home.nodes, exc)
            self._send(sock, format_error(f"master cannot record the heartbeat: {exc}"), peer)
            return
        log.debug("node %s (peer %s): heartbeat, %d job(s) waiting", hb.node, peer, len(jobs))
        self._send(sock, format_reply(jobs), peer)

    def _read_request(self, sock: socket.socket) -> bytes:
        reader = framer(self.max_line, self.max_lines)
        end = self.clock.monotonic() + self.deadline
        while True:
            left = end - self.clock.monotonic()
            if left <= 0:
                raise ProtocolError(f"no complete request within {self.deadline:g} s")
            sock.settimeout(left)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                raise ProtocolError(f"no complete request within {self.deadline:g} s") from None
            except OSError as exc:
                raise ProtocolError(f"connection failed: {exc}") from None
            if not chunk:
                raise ProtocolError("connection closed before the OK line")
            request = reader.feed(chunk)
            if request is not None:
                return request

    def _send(self, sock: socket.socket, data: bytes, peer: str) -> None:
        try:
            sock.settimeout(self.deadline)
            sock.sendall(data)
        except OSError as exc:
            log.warning("peer %s: cannot send reply: %s", peer, exc)

    def _drain(self, sock: socket.socket) -> None:
        # Closing a socket with unread input makes the kernel send RST, which can destroy
        # the ERROR line before the client reads it.  Half-close, then discard what the
        # client still sends -- bounded in bytes and time, so this cannot be abused.
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(DRAIN_SECONDS)
            end = self.clock.monotonic() + DRAIN_SECONDS
            left = DRAIN_BYTES
            while left > 0 and self.clock.monotonic() < end:
                chunk = sock.recv(min(left, 4096))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass  # the client went away: nothing left to protect


def _peer(client_address: Any) -> str:
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return str(client_address)


# ----------------------------------------------------------------------------------------------
# The daemon

def run(home: Home, address: tuple[str, int], should_stop: Callable[[], bool],
        poll: float = 0.5, clock: Clock | None = None,
        on_ready: Callable[[MonitorServer], None] | None = None) -> int:
    """Be the one monitor of ``home``: lock, listen on ``address``, serve until
    ``should_stop()`` is true (checked every ``poll`` seconds of ``clock``; pass a
    ``StopFlag``'s ``is_set``).  Returns the exit code: 0 after a stop or when another
    instance holds the lock, 2 if the port cannot be bound.  ``on_ready`` is called once the
    server listens (tests use it to learn the port).
    """
    clock = clock or SystemClock()
    home.create()
    try:
        lock = acquire_lock(home)
    except AlreadyRunning as exc:
        # Seed 000: "if I am not the only one, then exit" -- quietly, cron will try again.
        log.info("%s; exiting", exc)
        return 0
    with lock:
        try:
            server = MonitorServer(home, address, clock=clock)
        except OSError as exc:
            log.error("cannot listen on %s port %s: %s (is the port taken? see monitor_port)",
                      address[0], address[1], exc)
            return 2
        host, port = server.server_address[:2]
        log.info("listening on %s:%s for heartbeats, home %s", host, port, home.root)
        thread = threading.Thread(target=server.serve_forever, name="monitor-serve",
                                  daemon=True)
        thread.start()
        try:
            if on_ready is not None:
                on_ready(server)
            while not should_stop():
                clock.sleep(poll)
        finally:
            # shutdown() must come from a thread other than the serving one (stdlib warning).
            server.shutdown()
            server.server_close()
            thread.join()
            log.info("stopped")
    return 0
