"""The node side of a heartbeat: port of heartbeat.pl (seed 000).

One call, one TCP connection to the master's monitor (the format is cluster.wire.heartbeat):
send the node name and optionally a status and a caps line, get back the runs waiting to be
joined.

With ``wait`` the monitor may hold the answer (long-poll): it answers as soon as a run waits
whose id is not in ``skip``, or when the wait ends.  A monitor that predates the long-poll
ignores the header and answers at once, so callers must not assume the call took ``wait``.

Usage::

    jobs = send_heartbeat("master.example", 9010, "node7", status="idle")
    # -> [(0, "20190408115600")]  (priority, job id); [] when nothing waits
    jobs = send_heartbeat(host, port, "node7", wait=10, skip={"20190408115600"},
                          stop=flag.is_set)   # held up to 10 s, a stop ends it early
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable

from cluster.errors import ClusterError, ProtocolError
from cluster.wire.heartbeat import MAX_REPLY, Heartbeat, format_heartbeat, parse_reply
from cluster.wire.protocol import valid_node_name

#: Longest slice a held heartbeat waits on its socket before looking at ``stop`` [seconds].
STOP_POLL = 0.2


class HeartbeatError(ClusterError):
    """A heartbeat could not be delivered or its answer was not understood."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(host, port, reason)
        self.host = host
        self.port = port
        self.reason = reason

    def __str__(self) -> str:
        return f"heartbeat to monitor {self.host}:{self.port}: {self.reason}"


class HeartbeatStopped(HeartbeatError):
    """``stop()`` turned true while the heartbeat waited for its answer (not a failure)."""


def send_heartbeat(host: str, port: int, node: str, status: str = "", caps: str = "",
                   timeout: float = 10.0, *, wait: float = 0.0, skip: Iterable[str] = (),
                   stop: Callable[[], bool] | None = None) -> list[tuple[int, str]]:
    """Send one heartbeat; return the waiting runs as ``(priority, job id)``, by priority.

    Empty ``status``/``caps`` are not sent (the master keeps what it had).  ``wait`` > 0
    asks the monitor to hold the answer up to that many seconds unless a run not in
    ``skip`` waits; ``timeout`` bounds the connect, and the exchange beyond ``wait``.
    ``stop`` is looked at every :data:`STOP_POLL` seconds while the answer is awaited: once
    it returns true the connection is closed and HeartbeatStopped raised.

    Raises HeartbeatError naming the monitor for a bad node name or skip id, a connection
    failure, a timeout, an ``ERROR`` answer or a reply that is not ``job``/``END`` lines.
    """
    if not valid_node_name(node):
        raise HeartbeatError(host, port, f"node name {node!r} is not 1-64 of [A-Za-z0-9._-] "
                                         "(set node_name)")
    try:
        request = format_heartbeat(Heartbeat(node, status or None, caps or None,
                                             wait if wait > 0 else None, frozenset(skip)))
    except ValueError as exc:
        raise HeartbeatError(host, port, str(exc)) from None
    # Real time, not a Clock: the socket's own timeouts are real time.
    limit = timeout + max(wait, 0.0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            data = _read_all(sock, time.monotonic() + limit, stop)
    except TimeoutError:
        raise HeartbeatError(host, port, f"no answer within {limit:g} s") from None
    except ConnectionRefusedError:
        raise HeartbeatError(host, port, "connection refused (is monitor_port.py running "
                                         "on the master, and is monitor_port right?)") from None
    except OSError as exc:
        raise HeartbeatError(host, port, f"connection failed: {exc}") from None
    if data is None:
        raise HeartbeatStopped(host, port, "stopped while waiting for the answer")
    try:
        return parse_reply(data)
    except ProtocolError as exc:
        raise HeartbeatError(host, port, str(exc)) from None


def _read_all(sock: socket.socket, deadline: float, stop: Callable[[], bool] | None
              ) -> bytes | None:
    """The reply, read to EOF (the monitor closes after it) before ``deadline``
    (monotonic); None if ``stop()`` turned true first.  Never more than MAX_REPLY bytes
    from whatever is listening on that port."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if stop is not None and stop():
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(min(left, STOP_POLL) if stop is not None else left)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            if stop is None or time.monotonic() >= deadline:
                raise
            continue  # a slice ended: look at stop, then wait again
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY:
            raise OSError(f"reply longer than {MAX_REPLY} bytes: not a monitor?")
