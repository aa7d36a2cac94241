"""The node side of a heartbeat: port of heartbeat.pl (seed 000).

One call, one TCP connection to the master's monitor (the format is cluster.wire.heartbeat):
send the node name and optionally a status and a caps line, get back the runs waiting to be
joined.

Usage::

    jobs = send_heartbeat("master.example", 9010, "node7", status="idle")
    # -> [(0, "20190408115600")]  (priority, job id); [] when nothing waits
"""

from __future__ import annotations

import socket

from cluster.errors import ClusterError, ProtocolError
from cluster.wire.heartbeat import MAX_REPLY, Heartbeat, format_heartbeat, parse_reply
from cluster.wire.protocol import valid_node_name


class HeartbeatError(ClusterError):
    """A heartbeat could not be delivered or its answer was not understood."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(host, port, reason)
        self.host = host
        self.port = port
        self.reason = reason

    def __str__(self) -> str:
        return f"heartbeat to monitor {self.host}:{self.port}: {self.reason}"


def send_heartbeat(host: str, port: int, node: str, status: str = "", caps: str = "",
                   timeout: float = 10.0) -> list[tuple[int, str]]:
    """Send one heartbeat; return the waiting runs as ``(priority, job id)``, by priority.

    Empty ``status``/``caps`` are not sent (the master keeps what it had).  ``timeout``
    bounds the connect and the whole exchange.  Raises HeartbeatError naming the monitor
    for a bad node name, a connection failure, a timeout, an ``ERROR`` answer or a reply
    that is not ``job``/``END`` lines.
    """
    if not valid_node_name(node):
        raise HeartbeatError(host, port, f"node name {node!r} is not 1-64 of [A-Za-z0-9._-] "
                                         "(set node_name)")
    request = format_heartbeat(Heartbeat(node, status or None, caps or None))
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            data = _read_all(sock)
    except TimeoutError:
        raise HeartbeatError(host, port, f"no answer within {timeout:g} s") from None
    except ConnectionRefusedError:
        raise HeartbeatError(host, port, "connection refused (is monitor_port.py running "
                                         "on the master, and is monitor_port right?)") from None
    except OSError as exc:
        raise HeartbeatError(host, port, f"connection failed: {exc}") from None
    try:
        return parse_reply(data)
    except ProtocolError as exc:
        raise HeartbeatError(host, port, str(exc)) from None


def _read_all(sock: socket.socket) -> bytes:
    # The monitor closes the connection after its reply; read to EOF, but never more than
    # MAX_REPLY bytes from whatever is listening on that port.
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REPLY:
            raise OSError(f"reply longer than {MAX_REPLY} bytes: not a monitor?")
