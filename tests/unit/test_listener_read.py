"""The read path shared by the master's port and the monitor (cluster.runtime.listener,
FramedListener): bounds checked before a chunk joins the buffer, the framer's refusals, the
peer's early end, and a complete request handed on with its buffer released."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from cluster.errors import ProtocolError
from cluster.runtime.listener import FramedConnection, FramedListener


class _LineFramer:
    """A request is one line; a line with "!" in it breaks the framing."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, chunk: bytes) -> bytes | None:
        self.buf += chunk
        if b"!" in self.buf:
            raise ProtocolError("no ! please")
        return self.buf if self.buf.endswith(b"\n") else None


class _Conn(FramedConnection):
    def __init__(self, server: _Server, sock: socket.socket, peer: str, host: str,
                 now: float) -> None:
        super().__init__(sock, peer, host, now + 5.0, _LineFramer())


class _Server(FramedListener[_Conn]):
    connection = _Conn

    def __init__(self, max_buffered: int, max_request: int | None = None) -> None:
        self.events: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", 0), logging.getLogger("test.listener"),
                         max_buffered=max_buffered, max_request=max_request, backlog=16,
                         max_connections=16, max_per_peer=16, busy_reply=b"busy\n")

    def serve_once(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _expired(self, conn: _Conn) -> None:
        self._close(conn)

    def _note(self, conn: _Conn, what: str, detail: str) -> None:
        self.events.append((what, detail))
        self._release(conn)
        self._close(conn)

    def _request(self, conn: _Conn, request: bytes) -> None:
        assert conn.framer is None and conn.held == 0 and self.buffered == 0
        self._note(conn, "request", request.decode())

    def _ended_early(self, conn: _Conn) -> None:
        self._note(conn, "ended", "")

    def _over_bound(self, conn: _Conn, bound: str) -> None:
        self._note(conn, "bound", bound)

    def _bad_request(self, conn: _Conn, problem: str) -> None:
        self._note(conn, "bad", problem)


def _exchange(server: _Server, *chunks: bytes, close: bool = False) -> list[tuple[str, str]]:
    """Send ``chunks`` (a pause between them, so they arrive as separate reads); serve
    until the server has said something or two seconds passed."""
    with socket.create_connection(server.server_address) as client:
        for chunk in chunks:
            client.sendall(chunk)
            for _ in range(5):
                server.serve_once(0.02)
        if close:
            client.shutdown(socket.SHUT_WR)
        end = time.monotonic() + 2.0
        while not server.events and time.monotonic() < end:
            server.serve_once(0.02)
    return server.events


MakeServer = Callable[..., _Server]


@pytest.fixture
def make_server() -> Iterator[MakeServer]:
    made: list[_Server] = []

    def make(max_buffered: int, max_request: int | None = None) -> _Server:
        made.append(_Server(max_buffered, max_request))
        return made[-1]
    yield make
    for server in made:
        server.server_close()


def test_a_request_in_pieces_is_handed_on_whole(make_server: MakeServer) -> None:
    server = make_server(max_buffered=1000)
    assert _exchange(server, b"hel", b"lo\n") == [("request", "hello\n")]
    assert server.buffered == 0 and not server.conns


def test_the_request_bound_is_checked_before_the_chunk_joins(make_server: MakeServer) -> None:
    server = make_server(max_buffered=1000, max_request=8)
    assert _exchange(server, b"12345", b"6789") == [("bound", "request larger than 8 bytes")]
    assert server.buffered == 0


def test_the_buffered_bound_counts_every_open_request(make_server: MakeServer) -> None:
    server = make_server(max_buffered=6)
    with socket.create_connection(server.server_address) as first:
        first.sendall(b"1234")
        for _ in range(5):
            server.serve_once(0.02)
        assert server.buffered == 4
        assert _exchange(server, b"abc") == [
            ("bound", "open connections would hold more than 6 bytes")]
    assert server.buffered == 4  # the first's bytes are still held; the refused one's not


def test_a_framing_error_and_an_early_end_go_to_their_hooks(make_server: MakeServer) -> None:
    server = make_server(max_buffered=1000)
    assert _exchange(server, b"no!\n") == [("bad", "no ! please")]
    server.events.clear()
    assert _exchange(server, b"half", close=True) == [("ended", "")]
    assert server.buffered == 0
