"""The heartbeat listener: port of monitorPort.pl (seed 000).

Seed 000: monitorPort "does the usual 'if I am not the only one, then exit' dance", then
listens; for each connection it receives the machine name, a file suffix and some file
contents, and answers whether a job waits.  "The remote nodes use this to send a heartbeat
(and status) to the server, and to be informed when they have a new job to begin."

Ours speaks the header format of seed 001 (one connection per heartbeat)::

    node <name>                  required, cluster.protocol.valid_node_name
    status <free text>           optional  -> home/nodes/<name>.status
    caps <caps line>             optional  -> home/nodes/<name>.caps  (cluster.caps)
    OK

and answers one line per run waiting in the home, then ``END``::

    job <priority> <jobid>       one per job[.p].start, p = 0, 1, 2 (its ``id`` line)
    END

or ``ERROR <what was wrong>`` for a malformed request.  Unknown headers are ignored (seed 001:
the format is meant to grow).  Each heartbeat touches ``home/nodes/<name>.up``, whose mtime
is the node's lease (ARTIFEX.md §2.3).  ``.status`` and ``.caps`` are rewritten atomically.

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
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.errors import AlreadyRunning, ProtocolError
from cluster.home import PRIORITIES, Home
from cluster.runtime.singleton import SingleInstance
from cluster.wire.protocol import JOB_ID, RequestFramer, decode_lines, valid_node_name

log = logging.getLogger("cluster.monitor")

#: Longest request line accepted, in bytes.
MAX_LINE = 4096
#: Most header lines in one heartbeat (the OK line not counted).
MAX_LINES = 16
#: A client must deliver its whole request within this many seconds.
DEADLINE = 5.0
#: Connections handled at once; more are answered ERROR at once (a flood of silent clients
#: must not grow threads without bound).
MAX_CONNECTIONS = 64
#: Longest reply the client accepts, in bytes (three job lines and END need far less).
MAX_REPLY = 65536

#: After an ERROR reply, input still discarded (bytes, seconds) so the reply is not lost to
#: a TCP reset.
DRAIN_BYTES = 65536
DRAIN_SECONDS = 0.5

LOCK_NAME = "monitor_port.lock"
END = "END"
ERROR = "ERROR"


# ----------------------------------------------------------------------------------------------
# Wire format (pure)

@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat request.  ``None`` means the header was not sent."""

    node: str
    status: str | None = None
    caps: str | None = None


def format_heartbeat(hb: Heartbeat) -> bytes:
    """The wire form of ``hb``; newlines inside status/caps are folded to spaces."""
    out = [f"node {hb.node}"]
    if hb.status is not None:
        out.append(f"status {_one_line(hb.status)}".rstrip())
    if hb.caps is not None:
        out.append(f"caps {_one_line(hb.caps)}".rstrip())
    out.append("OK")
    return ("\n".join(out) + "\n").encode("utf-8")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_heartbeat(data: bytes, max_line: int = MAX_LINE, max_lines: int = MAX_LINES) -> Heartbeat:
    """Parse a complete request (up to and including ``OK``); ProtocolError names the fault."""
    lines = decode_lines(data)
    if not lines or lines[-1].rstrip("\r") != "OK":
        raise ProtocolError("request does not end with a line OK")
    if len(lines) - 1 > max_lines:
        raise ProtocolError(f"request has {len(lines) - 1} lines, more than {max_lines}")
    node: str | None = None
    values: dict[str, str] = {}
    for lineno, raw in enumerate(lines[:-1], 1):
        if len(raw.encode("utf-8")) > max_line:
            raise ProtocolError(f"line longer than {max_line} bytes", raw, lineno)
        line = raw.rstrip("\r")
        if not line:
            continue
        if any(ord(c) < 32 and c != "\t" for c in line):
            raise ProtocolError("control character in line", line, lineno)
        var, _, value = line.partition(" ")
        if var == "node":
            if not valid_node_name(value):
                raise ProtocolError("node name must be 1-64 of [A-Za-z0-9._-]", line, lineno)
            if node is not None and node != value:
                raise ProtocolError("two different node names", line, lineno)
            node = value
        elif var in ("status", "caps"):
            values[var] = value
        # Other headers are ignored: the format is meant to grow (seed 001).
    if node is None:
        raise ProtocolError("request has no 'node <name>' header")
    return Heartbeat(node, values.get("status"), values.get("caps"))


def format_reply(jobs: Sequence[tuple[int, str]]) -> bytes:
    """``job <priority> <id>`` lines and ``END``."""
    return "".join(f"job {p} {job_id}\n" for p, job_id in jobs).encode() + b"END\n"


def format_error(what: str) -> bytes:
    return f"{ERROR} {_one_line(what)}\n".encode()


def parse_reply(data: bytes) -> list[tuple[int, str]]:
    """The waiting jobs of a monitor reply.

    ProtocolError for an ``ERROR`` reply (its text is the problem), a missing ``END`` (the
    reply was cut short), or a line that is not ``job <priority> <id>``.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("reply is not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if lines and lines[0].startswith(ERROR):
        raise ProtocolError("monitor refused the heartbeat: " + lines[0][len(ERROR):].strip())
    if not lines or lines[-1] != END:
        raise ProtocolError("reply does not end with END (cut short?)")
    jobs: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines[:-1], 1):
        words = line.split(" ")
        if (len(words) != 3 or words[0] != "job" or not words[1].isdigit()
                or int(words[1]) not in PRIORITIES or not JOB_ID.fullmatch(words[2])):
            raise ProtocolError("expected 'job <priority 0-2> <id>'", line, lineno)
        jobs.append((int(words[1]), words[2]))
    return jobs


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


def _write_atomic(path: Path, text: str) -> None:
    # Temp file in the same directory + os.replace: readers (dashboards, the master) never
    # see a torn file, and two heartbeats of one node racing each other cannot interleave.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_heartbeat(home: Home, hb: Heartbeat) -> None:
    """Touch ``nodes/<node>.up`` (its mtime is the lease) and store status/caps if sent."""
    home.nodes.mkdir(parents=True, exist_ok=True)
    if hb.status is not None:
        _write_atomic(home.nodes / f"{hb.node}.status", hb.status + "\n")
    if hb.caps is not None:
        _write_atomic(home.nodes / f"{hb.node}.caps", hb.caps + "\n")
    # Touch last, so a node that is "up" already has its status and caps on disk.
    (home.nodes / f"{hb.node}.up").touch()


def nodes_seen(home: Home, now: float | None = None) -> dict[str, tuple[float, str]]:
    """``{name: (seconds since its last heartbeat, status text)}`` for every node with a
    ``.up`` file.  ``now`` is wall-clock time (mtimes are); default ``time.time()``."""
    now = time.time() if now is None else now
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
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.home = home
        self.deadline = deadline
        self.max_line = max_line
        self.max_lines = max_lines
        self.clock = clock
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
        framer = RequestFramer(self.max_line, self.max_lines)
        end = self.clock() + self.deadline
        while True:
            left = end - self.clock()
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
            request = framer.feed(chunk)
            if request is not None:
                return request

    def _send(self, sock: socket.socket, data: bytes, peer: str) -> None:
        try:
            sock.settimeout(self.deadline)
            sock.sendall(data)
        except OSError as exc:
            log.warning("peer %s: cannot send reply: %s", peer, exc)


    @staticmethod
    def _drain(sock: socket.socket) -> None:
        # Closing a socket with unread input makes the kernel send RST, which can destroy
        # the ERROR line before the client reads it.  Half-close, then discard what the
        # client still sends -- bounded in bytes and time, so this cannot be abused.
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(DRAIN_SECONDS)
            end = time.monotonic() + DRAIN_SECONDS
            left = DRAIN_BYTES
            while left > 0 and time.monotonic() < end:
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
        poll: float = 0.5, sleep: Callable[[float], None] = time.sleep,
        on_ready: Callable[[MonitorServer], None] | None = None) -> int:
    """Be the one monitor of ``home``: lock, listen on ``address``, serve until
    ``should_stop()`` is true (checked every ``poll`` seconds).  Returns the exit code:
    0 after a stop or when another instance holds the lock, 2 if the port cannot be bound.
    ``on_ready`` is called once the server listens (tests use it to learn the port).
    """
    home.create()
    try:
        lock = acquire_lock(home)
    except AlreadyRunning as exc:
        # Seed 000: "if I am not the only one, then exit" -- quietly, cron will try again.
        log.info("%s; exiting", exc)
        return 0
    with lock:
        try:
            server = MonitorServer(home, address)
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
                sleep(poll)
        finally:
            # shutdown() must come from a thread other than the serving one (stdlib warning).
            server.shutdown()
            server.server_close()
            thread.join()
            log.info("stopped")
    return 0
