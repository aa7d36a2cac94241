"""The node side of a heartbeat: port of heartbeat.pl (seed 000).

One call, one TCP connection to the master's monitor (the format is cluster.wire.heartbeat):
send the node name and optionally a status and a caps line, get back the runs waiting to be
joined.

With ``wait`` the monitor may hold the answer (long-poll): it answers as soon as a run waits
whose id is not in ``skip``, or when the wait ends.  A monitor that predates the long-poll
ignores the header and answers at once, so callers must not assume the call took ``wait``.

Every heartbeat is signed with the node's heartbeat key, derived from its own key
(``node-keys/<name>.key`` in the master home, read through the node's transport:
:func:`node_secret`; :func:`~cluster.wire.signing.heartbeat_key`), so that no node can
heartbeat in another's name, and the answer is used only if its signature verifies
(:mod:`cluster.wire.signing`); otherwise :class:`HeartbeatUnverified` is raised, and the
caller may read the key again (the node may have been set up anew).

Usage::

    jobs = send_heartbeat("master.example", 9010, "node7", status="idle", secret=text)
    # -> [(0, "20190408115600")]  (priority, job id); [] when nothing waits
    jobs = send_heartbeat(host, port, "node7", wait=10, skip={"20190408115600"},
                          stop=flag.is_set, secret=text)  # held up to 10 s
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from cluster.errors import ClusterError, ProtocolError
from cluster.node.transport import read_node_key
from cluster.node.transports import make_transport
from cluster.runtime import service
from cluster.wire import signing
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


class HeartbeatUnverified(HeartbeatError):
    """The answer's signature did not verify (or it had none): nothing of it was used.
    Either the node's copy of its key is stale, or the answer did not come from the
    monitor."""


if TYPE_CHECKING:
    from cluster.config import Config

#: The nonces of this process's heartbeats (one session per process).
_NONCES = signing.NonceSource()
#: The node keys this process read, by where and for whom (see node_secret).
_SECRETS: dict[tuple[str, str, str, str], str] = {}
_SECRETS_LOCK = threading.Lock()


def node_secret(cfg: Config) -> str:
    """The text of this node's own key (``node-keys/<name>.key``), read through the node's
    transport (``make_transport``, :func:`~cluster.node.transport.read_node_key`) on first
    use and kept; read again after a heartbeat whose answer did not verify
    (:class:`HeartbeatUnverified` drops the kept copies).

    HeartbeatError naming the monitor if the key is absent or cannot be read, or is a
    symbolic link or not mode 0600 (:mod:`cluster.runtime.secretfile`).
    """
    name = cfg.effective_node_name()
    where = (cfg.transport, cfg.master_host, str(cfg.master_home), name)
    with _SECRETS_LOCK:
        text = _SECRETS.get(where)
    if text is not None:
        return text
    try:
        text = read_node_key(make_transport(cfg), name)
    except ClusterError as exc:
        raise HeartbeatError(cfg.master_host, cfg.monitor_port,
                             f"cannot read this node's key: {exc}") from None
    with _SECRETS_LOCK:
        _SECRETS[where] = text
    return text


def forget_node_secrets() -> None:
    """Drop the keys :func:`node_secret` kept (the next call reads them again)."""
    with _SECRETS_LOCK:
        _SECRETS.clear()


def send_heartbeat(host: str, port: int, node: str, status: str = "", caps: str = "",
                   timeout: float = 10.0, *, wait: float = 0.0, skip: Iterable[str] = (),
                   stop: Callable[[], bool] | None = None, wakeup_fd: int | None = None,
                   secret: str, bye: bool = False) -> list[tuple[int, str]]:
    """Send one heartbeat; return the waiting runs as ``(lane, job id)`` (cluster.lanes: a
    priority's own lane is its number), most urgent first, in the monitor's order.

    Empty ``status``/``caps`` are not sent (the master keeps what it had).  ``wait`` > 0
    asks the monitor to hold the answer up to that many seconds unless a run not in
    ``skip`` waits; ``timeout`` bounds the connect, and the exchange beyond ``wait``.
    ``stop`` is looked at every :data:`STOP_POLL` seconds while the answer is awaited, and
    at once when ``wakeup_fd`` (a stop flag's, :mod:`cluster.runtime.service`) turns
    readable: once it returns true the connection is closed and HeartbeatStopped raised.
    ``bye``: the node's goodbye (it leaves for good; the monitor removes its files).
    ``secret`` is the text of the node's own key (64 hex digits, :func:`node_secret`): the
    request is signed with the heartbeat key derived from it and the answer must verify
    under that key, else HeartbeatUnverified.

    Raises HeartbeatError naming the monitor for a bad node name or skip id, a connection
    failure, a timeout, an ``ERROR`` answer or a reply that is not ``job``/``END`` lines.
    """
    if not valid_node_name(node):
        raise HeartbeatError(host, port, f"node name {node!r} is not 1-64 of [A-Za-z0-9._-] "
                                         "(set node_name)")
    try:
        key = signing.heartbeat_key(signing.parse_secret(secret))
    except ValueError as exc:
        raise HeartbeatError(host, port, f"the node's key is unusable: {exc}") from None
    nonce = _NONCES.next()
    try:
        request = signing.sign_request(
            format_heartbeat(Heartbeat(node, status or None, caps or None,
                                       wait if wait > 0 else None, frozenset(skip), bye,
                                       lanes=True)),
            key, nonce)
    except ValueError as exc:
        raise HeartbeatError(host, port, str(exc)) from None
    # Real time, not a Clock: the socket's own timeouts are real time.
    limit = timeout + max(wait, 0.0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request)
            data = _read_all(sock, time.monotonic() + limit, stop, wakeup_fd)
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
        body = signing.verify_reply(data, key, nonce)
    except signing.SignatureError as exc:
        forget_node_secrets()  # perhaps a stale copy: read it again next time
        said = data.split(b"\n", 1)[0][:200].decode("utf-8", "replace")
        raise HeartbeatUnverified(host, port, f"answer refused, nothing of it used: {exc} "
                                              f"(its first line, unverified: {said!r})"
                                  ) from None
    try:
        return parse_reply(body)
    except ProtocolError as exc:
        raise HeartbeatError(host, port, str(exc)) from None


def _read_all(sock: socket.socket, deadline: float, stop: Callable[[], bool] | None,
              wakeup_fd: int | None = None) -> bytes | None:
    """The reply, read to EOF (the monitor closes after it) before ``deadline``
    (monotonic); None if ``stop()`` turned true first (looked at every STOP_POLL, and when
    ``wakeup_fd`` turns readable).  Never more than MAX_REPLY bytes from whatever is
    listening on that port."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if stop is not None and stop():
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if stop is not None and wakeup_fd is not None:
            readable, _, _ = select.select([sock.fileno(), wakeup_fd], [], [],
                                           min(left, STOP_POLL))
            if wakeup_fd in readable:
                service.drain(wakeup_fd)
                continue  # a signal: look at stop
            if not readable:
                continue  # a slice ended: look at stop, then wait again
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
